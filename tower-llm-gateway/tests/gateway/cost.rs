//! Cost budgets and tenant quotas through the gateway: `x-llm-cost` is
//! each answer's usage at its link's price, exactly (a 503 costs nothing),
//! and so are `ai_router_cost_total` and the status page's spend;
//! `x-llm-max-cost` lowers a call's budget (never raises it) and skips a
//! link whose worst case it cannot cover, unsent; a budget no link fits is
//! a 402; `[quotas]` refuses a spent tenant with a 429 (other tenants,
//! whatever the bytes of their id, still pass; shadow mode refuses
//! nothing); a stream's cost reaches the metrics when it ends; a reload
//! keeps an unchanged quota's spend and starts a changed one afresh.
//!
//! The mocks' usage: an OpenAI answer 10 prompt and 5 completion tokens,
//! an Anthropic answer 10 input and 5 output tokens, an OpenAI stream 10
//! prompt tokens and one completion token per piece. `HELLO`'s input
//! bound is 29 tokens (16 for the request, 8 for its message, 5 bytes of
//! text); every route here caps output at 100 tokens.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower_llm::Cost;
use tower_llm_gateway::GatewayConfig;
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::{Answer, HELLO, HELLO_STREAM, Harness, start_text};

/// The gateway's retry, deadline and breaker settings, the two mock
/// providers (`primary`: OpenAI, `backup`: Anthropic), then `rest`
/// (prices, quotas and routes).
fn policy(primary: &MockServer, backup: &MockServer, rest: &str) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 3
        attempt_timeout_ms = 2000
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        [breaker]
        consecutive_failures = 5
        cooldown_ms = 30000
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "UNUSED"
        {rest}
        "#,
        primary.url(),
        backup.url()
    )
}

/// The primary's model at $2.50 in and $10 out per million tokens; the
/// backup's at $3 in and $15 out.
const PRICES: &str = r#"
    [prices.primary]
    gpt-4o-mini = { input = 2.5, output = 10.0 }
    [prices.backup]
    claude-x = { input = 3.0, output = 15.0 }
"#;

/// 10 × $2.50 + 5 × $10, per million: the primary's unary answer.
const PRIMARY_ANSWER: Cost = Cost::from_nanos(10 * 2_500 + 5 * 10_000);
/// 10 × $3 + 5 × $15, per million: the backup's unary answer.
const BACKUP_ANSWER: Cost = Cost::from_nanos(10 * 3_000 + 5 * 15_000);

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "down")
}

/// The line of `metrics` for `ai_router_cost_total` of `provider` and
/// `model`, if any.
fn cost_line<'a>(metrics: &'a str, provider: &str, model: &str) -> Option<&'a str> {
    metrics.lines().find(|l| {
        l.starts_with("ai_router_cost_total{")
            && l.contains(&format!("provider=\"{provider}\""))
            && l.contains(&format!("model=\"{model}\""))
    })
}

/// The value of `ai_router_cost_total` for `provider` and `model`.
fn cost_metric(metrics: &str, provider: &str, model: &str) -> f64 {
    let line = cost_line(metrics, provider, model)
        .unwrap_or_else(|| panic!("no ai_router_cost_total of {provider}/{model} in {metrics}"));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not a number: {line}"))
}

/// Sends `body` to the chat endpoint with raw header bytes (values a
/// `&str` cannot hold).
async fn send_raw(h: &Harness, body: &'static str, headers: &[(&str, &[u8])]) -> Answer {
    let mut req = http::Request::post(format!("{}/v1/chat/completions", h.url))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(
            *name,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    let req = req
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request");
    let res = h.client.request(req).await.expect("an answer");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `HELLO` for `route`.
fn hello(route: &str) -> String {
    HELLO.replace("\"smart\"", &format!("\"{route}\""))
}

#[tokio::test(start_paused = true)]
async fn a_priced_answer_costs_its_usage_at_its_price_in_the_header_the_metrics_and_the_page() {
    let h = start_text(
        Reply::openai_text("priced"),
        Reply::anthropic_text("unpriced"),
        |p, b| {
            policy(
                p,
                b,
                &format!(
                    r#"{PRICES}
                    [[routes]]
                    model = "smart"
                    chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
                    [[routes]]
                    model = "plain"
                    chain = [{{ provider = "backup", model = "claude-free" }}]
                    "#
                ),
            )
        },
    )
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(PRIMARY_ANSWER, Cost::from_nanos(75_000));
    // 75,000 nano-dollars: nine decimals, trailing zeros trimmed.
    assert_eq!(a.header("x-llm-cost"), "0.000075");
    assert_eq!(a.header("x-llm-provider"), "primary");
    // The unpriced route's answer carries no cost.
    let free = h
        .send("POST", "/v1/chat/completions", &hello("plain"), &[])
        .await;
    assert_eq!(free.status, 200, "{}", free.body);
    assert!(
        free.headers.get("x-llm-cost").is_none(),
        "{:?}",
        free.headers
    );

    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    assert_eq!(
        cost_metric(&metrics, "primary", "gpt-4o-mini"),
        PRIMARY_ANSWER.dollars()
    );
    assert!(
        cost_line(&metrics, "backup", "claude-free").is_none(),
        "{metrics}"
    );

    let page = h.send("GET", "/status", "", &[]).await;
    assert_eq!(page.status, 200);
    let html = &page.body;
    assert!(html.contains("<th>spend since start</th>"), "{html}");
    assert!(
        html.contains("<td class=\"num\">$0.000075</td>"),
        "the priced link's spend: {html}"
    );
    assert!(
        html.contains("<td class=\"num\">not priced</td>"),
        "the unpriced link: {html}"
    );
    assert_eq!(html.matches("not priced").count(), 1, "{html}");
}

#[tokio::test(start_paused = true)]
async fn a_failover_from_a_503_costs_only_the_answer_of_the_second_link() {
    let h = start_text(down(), Reply::anthropic_text("backup"), |p, b| {
        policy(
            p,
            b,
            &format!(
                r#"{PRICES}
                [[routes]]
                model = "smart"
                chain = [{{ provider = "primary", model = "gpt-4o-mini", max_attempts = 1 }}, {{ provider = "backup", model = "claude-x" }}]
                "#
            ),
        )
    })
    .await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 1);
    assert_eq!(BACKUP_ANSWER, Cost::from_nanos(105_000));
    assert_eq!(a.header("x-llm-cost"), "0.000105");
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    assert_eq!(
        cost_metric(&metrics, "backup", "claude-x"),
        BACKUP_ANSWER.dollars()
    );
    // The 503 charged nothing.
    // The 503 charged nothing: no spend on the primary's counter, and a
    // priced link with nothing spent on the page.
    assert_eq!(
        cost_line(&metrics, "primary", "gpt-4o-mini"),
        None,
        "{metrics}"
    );
    let html = h.send("GET", "/status", "", &[]).await.body;
    assert!(html.contains("<td class=\"num\">$0.000000</td>"), "{html}");
    assert!(html.contains("<td class=\"num\">$0.000105</td>"), "{html}");
}

/// An expensive primary ($10 in, $30 out: a worst case of 29 × 10 +
/// 100 × 30 = 3,290 micro-dollars for `HELLO`) and a cheap backup ($1 in,
/// $2 out: 29 + 200 = 229 micro-dollars), on routes `roomy` (a budget of
/// $0.01: the primary fits), `tight` ($0.001: it does not) and `plain`
/// (its link unpriced, no budget).
fn budgets(p: &MockServer, b: &MockServer) -> String {
    policy(
        p,
        b,
        r#"
        [prices.primary]
        gpt-4o-mini = { input = 10.0, output = 30.0 }
        [prices.backup]
        claude-x = { input = 1.0, output = 2.0 }
        [[routes]]
        model = "roomy"
        max_total_cost = 0.01
        max_output_tokens = 100
        chain = [{ provider = "primary", model = "gpt-4o-mini" }, { provider = "backup", model = "claude-x" }]
        [[routes]]
        model = "tight"
        max_total_cost = 0.001
        max_output_tokens = 100
        chain = [{ provider = "primary", model = "gpt-4o-mini" }, { provider = "backup", model = "claude-x" }]
        [[routes]]
        model = "plain"
        chain = [{ provider = "backup", model = "claude-free" }]
        "#,
    )
}

/// The backup's answer at $1 in and $2 out: 10 + 5 × 2 micro-dollars.
const CHEAP_ANSWER: &str = "0.00002";

#[tokio::test(start_paused = true)]
async fn x_llm_max_cost_lowers_the_budget_and_skips_a_link_it_cannot_cover_unsent() {
    let h = start_text(
        Reply::openai_text("dear"),
        Reply::anthropic_text("cheap"),
        budgets,
    )
    .await;
    let roomy = hello("roomy");
    // Without the header the route's budget covers the primary.
    let a = h.chat(&roomy).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "primary");
    // 10 × $10 + 5 × $30, per million.
    assert_eq!(a.header("x-llm-cost"), "0.00025");
    assert_eq!(h.primary.received().len(), 1);

    // $0.001: below the primary's worst case, above the backup's.
    let a = h
        .send(
            "POST",
            "/v1/chat/completions",
            &roomy,
            &[("x-llm-max-cost", "0.001")],
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    // The primary's refusal is an attempt of the call, sent nowhere.
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(a.header("x-llm-cost"), CHEAP_ANSWER);
    assert_eq!(h.primary.received().len(), 1, "the primary was not sent");
    assert_eq!(h.backup.received().len(), 1);
    // The cap was written into what the backup received.
    let sent: serde_json::Value =
        serde_json::from_slice(&h.backup.received()[0].body).expect("json");
    assert_eq!(sent["max_tokens"], 100);

    // A header above the route's budget does not raise it.
    for header in [None, Some("0.01"), Some("1000")] {
        let headers: Vec<(&str, &str)> = header.iter().map(|v| ("x-llm-max-cost", *v)).collect();
        let a = h
            .send("POST", "/v1/chat/completions", &hello("tight"), &headers)
            .await;
        assert_eq!(a.status, 200, "{header:?}: {}", a.body);
        assert_eq!(a.header("x-llm-provider"), "backup", "{header:?}");
        assert_eq!(a.header("x-llm-cost"), CHEAP_ANSWER, "{header:?}");
        assert_eq!(h.primary.received().len(), 1, "{header:?}");
    }
    assert_eq!(h.backup.received().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn x_llm_max_cost_not_an_amount_or_on_an_unpriced_route_is_a_400_without_a_call() {
    let h = start_text(
        Reply::openai_text("dear"),
        Reply::anthropic_text("cheap"),
        budgets,
    )
    .await;
    let values: [&[u8]; 8] = [
        b"abc",
        b"-1",
        b"",
        b"NaN",
        b"inf",
        b"1e300",
        b"0.0\xe9",
        "0,5 €".as_bytes(),
    ];
    for value in values {
        let body = roomy_with_header(&h, value).await;
        assert_eq!(body.status, 400, "{value:?}: {}", body.body);
        let json = body.json();
        assert_eq!(json["error"]["code"], "invalid_max_cost", "{value:?}");
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(
            json["error"]["message"],
            "the x-llm-max-cost header is not an amount of dollars (like 0.05)"
        );
    }
    // A valid amount on a route with an unpriced link.
    let a = h
        .send(
            "POST",
            "/v1/chat/completions",
            &hello("plain"),
            &[("x-llm-max-cost", "0.5")],
        )
        .await;
    assert_eq!(a.status, 400, "{}", a.body);
    let json = a.json();
    assert_eq!(json["error"]["code"], "invalid_max_cost");
    assert_eq!(
        json["error"]["message"],
        "this route cannot hold a call to a budget: not every link it may call is priced ([prices]), or it has no max_output_tokens"
    );
    assert_eq!(h.primary.received().len(), 0);
    assert_eq!(h.backup.received().len(), 0);
    // The same route without the header answers.
    let a = h
        .send("POST", "/v1/chat/completions", &hello("plain"), &[])
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
}

/// `roomy`'s `HELLO` with `x-llm-max-cost: value`.
async fn roomy_with_header(h: &Harness, value: &[u8]) -> Answer {
    const ROOMY: &str = r#"{"model": "roomy", "messages": [{"role": "user", "content": "Hello"}]}"#;
    send_raw(h, ROOMY, &[("x-llm-max-cost", value)]).await
}

#[tokio::test(start_paused = true)]
async fn a_budget_no_link_fits_is_a_402_saying_what_is_left_without_a_call() {
    let h = start_text(
        Reply::openai_text("dear"),
        Reply::anthropic_text("cheap"),
        budgets,
    )
    .await;
    // $0.0002: below both links' worst cases.
    let a = h
        .send(
            "POST",
            "/v1/chat/completions",
            &hello("roomy"),
            &[("x-llm-max-cost", "0.0002")],
        )
        .await;
    assert_eq!(a.status, 402, "{}", a.body);
    // Both links refused unsent: two attempts, nothing spent.
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(a.header("x-llm-cost"), "0");
    assert_eq!(a.header("content-type"), "application/json");
    assert!(a.headers.get("retry-after").is_none(), "{:?}", a.headers);
    let json = a.json();
    assert_eq!(json["error"]["type"], "budget_exceeded");
    assert_eq!(json["error"]["code"], "cost_budget_exhausted");
    // The backup's worst case: 29 × $1 + 100 × $2, per million.
    assert_eq!(
        json["error"]["message"],
        "this attempt may cost up to 0.000229 dollars; 0.0002 of the call's budget of 0.0002 is left"
    );
    assert_eq!(h.primary.received().len(), 0);
    assert_eq!(h.backup.received().len(), 0);
}

/// One link (the primary at $1 in, $2 out: a worst case of 229
/// micro-dollars for `HELLO`, an answer of 20) under `[quotas]` of 240
/// micro-dollars a day: a tenant's first call passes, its second (20 spent
/// + 229 held) does not.
fn quotas(p: &MockServer, b: &MockServer, quotas: &str) -> String {
    policy(
        p,
        b,
        &format!(
            r#"
            [prices.primary]
            gpt-4o-mini = {{ input = 1.0, output = 2.0 }}
            [quotas]
            window_secs = 86400
            {quotas}
            [[routes]]
            model = "smart"
            max_output_tokens = 100
            chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
            "#
        ),
    )
}

const TINY: &str = "max_cost = 0.00024";

fn assert_refused(a: &Answer, what: &str) {
    assert_eq!(a.status, 429, "{what}: {}", a.body);
    let json = a.json();
    assert_eq!(json["error"]["type"], "quota_exceeded", "{what}");
    assert_eq!(json["error"]["code"], "tenant_quota_exhausted", "{what}");
    let message = json["error"]["message"].as_str().expect("a message");
    // 240 - 20 micro-dollars.
    assert!(
        message.starts_with("0.00022 dollars left of the tenant's quota; it resets in "),
        "{what}: {message}"
    );
    // Never sent: nothing spent.
    assert_eq!(a.header("x-llm-cost"), "0", "{what}");
    assert_eq!(a.header("x-llm-attempts"), "1", "{what}");
}

#[tokio::test(start_paused = true)]
async fn a_tenant_over_its_quota_is_refused_with_a_429_and_other_tenants_still_pass() {
    let h = start_text(Reply::openai_text("ok"), down(), |p, b| quotas(p, b, TINY)).await;
    let a = send_raw(&h, HELLO, &[("x-tenant-id", b"acme")]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-cost"), "0.00002");
    assert_refused(
        &send_raw(&h, HELLO, &[("x-tenant-id", b"acme")]).await,
        "acme",
    );
    assert_eq!(
        h.primary.received().len(),
        1,
        "the refused call was not sent"
    );

    // Other tenants: ASCII, Latin-1 (not UTF-8), the same in UTF-8.
    let others: [&[u8]; 3] = [b"globex", b"caf\xe9", "café".as_bytes()];
    for (n, tenant) in others.into_iter().enumerate() {
        let a = send_raw(&h, HELLO, &[("x-tenant-id", tenant)]).await;
        assert_eq!(a.status, 200, "{tenant:?}: {}", a.body);
        assert_eq!(h.primary.received().len(), 2 + n);
    }
    // Each is spent now, on its own.
    for tenant in others {
        assert_refused(
            &send_raw(&h, HELLO, &[("x-tenant-id", tenant)]).await,
            &format!("{tenant:?}"),
        );
    }
    // No header: the empty tenant, whose quota an empty header spends too.
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_refused(&send_raw(&h, HELLO, &[("x-tenant-id", b"")]).await, "empty");
    assert_refused(&h.chat(HELLO).await, "none");
    assert_eq!(h.primary.received().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_quota_refusal_says_when_to_retry_in_retry_after() {
    let h = start_text(Reply::openai_text("ok"), down(), |p, b| quotas(p, b, TINY)).await;
    assert_eq!(h.chat(HELLO).await.status, 200);
    let a = h.chat(HELLO).await;
    assert_refused(&a, "none");
    // The message's whole seconds, rounded up in the header.
    let message = a.json()["error"]["message"]
        .as_str()
        .expect("a message")
        .to_owned();
    let resets_in: u64 = message
        .rsplit("resets in ")
        .next()
        .and_then(|s| s.strip_suffix(" s"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no reset time in {message}"));
    let retry_after: u64 = a
        .header("retry-after")
        .parse()
        .unwrap_or_else(|_| panic!("no Retry-After in {:?}", a.headers));
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    assert!(
        retry_after == resets_in || retry_after == resets_in + 1,
        "{retry_after} for {message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tenant_id_over_256_bytes_is_a_400_without_a_call() {
    let h = start_text(Reply::openai_text("ok"), down(), |p, b| quotas(p, b, TINY)).await;
    let long = vec![b'x'; 257];
    let a = send_raw(&h, HELLO, &[("x-tenant-id", &long)]).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("invalid_tenant"), "{}", a.body);
    assert_eq!(h.primary.received().len(), 0);
    let a = send_raw(&h, HELLO, &[("x-tenant-id", &long[..256])]).await;
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test(start_paused = true)]
async fn a_quota_in_shadow_mode_refuses_nothing() {
    let h = start_text(Reply::openai_text("ok"), down(), |p, b| {
        quotas(p, b, &format!("{TINY}\nshadow = true"))
    })
    .await;
    for n in 1..=4 {
        let a = send_raw(&h, HELLO, &[("x-tenant-id", b"acme")]).await;
        assert_eq!(a.status, 200, "call {n}: {}", a.body);
        assert_eq!(a.header("x-llm-cost"), "0.00002");
    }
    assert_eq!(h.primary.received().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_priced_stream_reaches_the_metrics_when_it_ends_and_carries_no_cost_header() {
    let h = start_text(
        Reply::openai_stream(&["Hel", "lo"]),
        Reply::anthropic_text("unused"),
        |p, b| {
            policy(
                p,
                b,
                &format!(
                    r#"{PRICES}
                    [[routes]]
                    model = "smart"
                    chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
                    "#
                ),
            )
        },
    )
    .await;
    let a = h.chat(HELLO_STREAM).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("content-type"), "text/event-stream");
    assert!(a.headers.get("x-llm-cost").is_none(), "{:?}", a.headers);
    assert!(a.body.contains("data: [DONE]"), "{}", a.body);
    // 10 prompt tokens at $2.50 and 2 completion tokens at $10, per
    // million.
    let streamed = Cost::from_nanos(10 * 2_500 + 2 * 10_000);
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    assert_eq!(
        cost_metric(&metrics, "primary", "gpt-4o-mini"),
        streamed.dollars()
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_an_unchanged_quotas_spend_and_a_changed_one_starts_afresh() {
    let h = start_text(Reply::openai_text("ok"), down(), |p, b| quotas(p, b, TINY)).await;
    let acme: &[(&str, &[u8])] = &[("x-tenant-id", b"acme")];
    assert_eq!(send_raw(&h, HELLO, acme).await.status, 200);
    assert_refused(&send_raw(&h, HELLO, acme).await, "before reload");

    // Another deadline, the same [quotas]: still spent.
    let same = quotas(&h.primary, &h.backup, TINY).replace("total_ms = 2000", "total_ms = 3000");
    h.gateway
        .reload(GatewayConfig::from_toml(&same).expect("policy"))
        .expect("reloaded");
    assert_eq!(h.gateway.policy().deadline.total_ms, Some(3000));
    assert_refused(&send_raw(&h, HELLO, acme).await, "after the same quotas");

    // Changed [quotas] (a longer hold): counted afresh.
    let changed = quotas(&h.primary, &h.backup, &format!("{TINY}\nhold_secs = 600"));
    h.gateway
        .reload(GatewayConfig::from_toml(&changed).expect("policy"))
        .expect("reloaded");
    assert_eq!(send_raw(&h, HELLO, acme).await.status, 200);
    assert_refused(&send_raw(&h, HELLO, acme).await, "after changed quotas");
    assert_eq!(h.primary.received().len(), 2);
}
