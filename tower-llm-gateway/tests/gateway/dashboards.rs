//! The Grafana dashboard and the Prometheus alert rules of `dashboards/`
//! against what the gateway really serves: a gateway driven over loopback
//! (virtual time) through a retry, a failover, an open circuit, a hedge, a
//! cache hit, an idempotent replay, a pool move, a deadline, priced calls,
//! health probes and three shared stores (on a Redis that is not there),
//! then every metric name in every PromQL expression of both files must be
//! a series on its `/metrics`.

use std::collections::BTreeSet;
use std::time::Duration;

use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::*;

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

/// A loopback port nothing listens on: a Redis there refuses every
/// connection, so each shared store is configured, down, and says so.
fn refused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// The upstreams besides the harness's own two (`flaky` is the harness's
/// primary, `ok` its backup).
struct Upstreams {
    down: MockServer,
    limited: MockServer,
    slow: MockServer,
    hang: MockServer,
}

/// Routes, one per behaviour: `smart` (retry, then cache), `failover`
/// (a dead primary: failover, then its circuit opens), `hedged`, `pooled`
/// (a pool whose deployments are both rate limited: a move, then the
/// `ok` link), `late` (an upstream that never answers: the deadline),
/// `plain` (idempotency). Every link is priced and quotas, circuits and
/// pools are shared through a Redis that refuses connections. The pool's
/// deployments have an `rpm`: without one the pacing store never asks
/// Redis, and its up gauge keeps the 1 it starts with.
fn fleet(flaky: &MockServer, ok: &MockServer, up: &Upstreams, redis: &str) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 2
        attempt_timeout_ms = 2000
        base_ms = 100
        factor = 2
        max_ms = 100
        jitter = "none"
        [breaker]
        consecutive_failures = 2
        cooldown_ms = 600000
        [breaker_shared]
        redis = "{redis}"
        [idempotency]
        ttl_ms = 60000
        [quotas]
        window_secs = 86400
        max_tokens = 5000000
        [quotas_shared]
        redis = "{redis}"
        [pools_shared]
        redis = "{redis}"
        [[providers]]
        name = "flaky"
        kind = "openai"
        base_url = "{flaky}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "ok"
        kind = "openai"
        base_url = "{ok}/v1"
        api_key_env = "UNUSED"
        health_url = "{ok}/health"
        [[providers]]
        name = "down"
        kind = "openai"
        base_url = "{down}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "limited-east"
        kind = "openai"
        base_url = "{limited}/v1"
        api_key_env = "UNUSED"
        rpm = 600
        [[providers]]
        name = "limited-west"
        kind = "openai"
        base_url = "{limited}/v1"
        api_key_env = "UNUSED"
        rpm = 600
        [[providers]]
        name = "slow"
        kind = "openai"
        base_url = "{slow}/v1"
        api_key_env = "UNUSED"
        [[providers]]
        name = "hang"
        kind = "openai"
        base_url = "{hang}/v1"
        api_key_env = "UNUSED"
        [[pools]]
        name = "limited"
        deployments = [{{ provider = "limited-east" }}, {{ provider = "limited-west" }}]
        [prices]
        flaky = {{ m = {{ input = 1.0, output = 2.0 }} }}
        ok = {{ m = {{ input = 1.0, output = 2.0 }} }}
        down = {{ m = {{ input = 1.0, output = 2.0 }} }}
        slow = {{ m = {{ input = 1.0, output = 2.0 }} }}
        limited = {{ m = {{ input = 1.0, output = 2.0 }} }}
        hang = {{ m = {{ input = 1.0, output = 2.0 }} }}
        [[routes]]
        model = "smart"
        max_output_tokens = 100
        cache = {{ ttl_ms = 60000 }}
        chain = [{{ provider = "flaky", model = "m" }}, {{ provider = "ok", model = "m" }}]
        [[routes]]
        model = "failover"
        max_output_tokens = 100
        chain = [{{ provider = "down", model = "m" }}, {{ provider = "ok", model = "m" }}]
        [[routes]]
        model = "hedged"
        max_output_tokens = 100
        hedge = {{ delay_ms = 100, min_useful_ms = 500 }}
        chain = [{{ provider = "slow", model = "m" }}]
        [[routes]]
        model = "pooled"
        max_output_tokens = 100
        chain = [{{ provider = "limited", model = "m" }}, {{ provider = "ok", model = "m" }}]
        [[routes]]
        model = "late"
        max_output_tokens = 100
        chain = [{{ provider = "hang", model = "m" }}]
        [[routes]]
        model = "plain"
        max_output_tokens = 100
        chain = [{{ provider = "ok", model = "m" }}]
        "#,
        flaky = flaky.url(),
        ok = ok.url(),
        down = up.down.url(),
        limited = up.limited.url(),
        slow = up.slow.url(),
        hang = up.hang.url(),
    )
}

fn ask(route: &str) -> String {
    format!(r#"{{"model": "{route}", "messages": [{{"role": "user", "content": "Hello"}}]}}"#)
}

/// A gateway (over [`fleet`]) driven through one call of each behaviour
/// the dashboard shows, and its `/metrics` afterwards.
async fn scrape_after_traffic() -> String {
    let limited = Reply::openai_error(429, "rate_limit_exceeded", "slow down")
        .with_header("retry-after", "30");
    let up = Upstreams {
        down: MockServer::start(down()).await.expect("down"),
        limited: MockServer::start(limited).await.expect("limited"),
        slow: MockServer::start(Reply::openai_text("fast"))
            .await
            .expect("slow"),
        hang: MockServer::start(Reply::Hang).await.expect("hang"),
    };
    up.slow
        .push(Reply::openai_text("slow").after(Duration::from_secs(1)));
    let redis = format!("redis://127.0.0.1:{}", refused_port());
    let h = start_text(
        Reply::openai_text("ok"),
        Reply::openai_text("ok"),
        |f, o| fleet(f, o, &up, &redis),
    )
    .await;
    h.primary.push(down());
    let send = |route: &'static str, headers: &'static [(&'static str, &'static str)]| {
        let h = &h;
        async move {
            h.send("POST", "/v1/chat/completions", &ask(route), headers)
                .await
        }
    };

    let retried = send("smart", &[]).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.header("x-llm-attempts"), "2");
    assert_eq!(retried.header("x-llm-cache"), "miss");
    let cached = send("smart", &[]).await;
    assert_eq!(cached.header("x-llm-cache"), "hit");
    for _ in 0..2 {
        let failed_over = send("failover", &[]).await;
        assert_eq!(failed_over.status, 200, "{}", failed_over.body);
        assert_eq!(failed_over.header("x-llm-provider"), "ok");
    }
    let hedged = send("hedged", &[]).await;
    assert_eq!(hedged.header("x-llm-hedged"), "true");
    let pooled = send("pooled", &[]).await;
    assert_eq!(pooled.header("x-llm-provider"), "ok");
    let late = send("late", &[]).await;
    assert_eq!(late.status, 504, "{}", late.body);
    assert_eq!(late.json()["error"]["code"], "deadline_exceeded");
    let key = &[("idempotency-key", "order-42")];
    assert_eq!(send("plain", key).await.status, 200);
    let replayed = send("plain", key).await;
    assert_eq!(replayed.header("idempotent-replayed"), "true");
    h.gateway.probe_once().await;

    let metrics = h.send("GET", "/metrics", "", &[]).await;
    assert_eq!(metrics.status, 200);
    metrics.body
}

/// The value of the sample of `name` whose labels include `labels`.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            series_name(l) == name
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().expect("a number"))
}

/// The series name of one sample line of the text format.
fn series_name(line: &str) -> &str {
    line.split(['{', ' ']).next().unwrap_or_default()
}

/// The names of the series `scrape` holds: a counter's `_total`, a
/// histogram's `_bucket`, `_sum` and `_count`, a gauge's own name. Only
/// these can be selected in PromQL, so a dashboard naming a histogram
/// family bare (`ai_router_latency_ms`) or a counter without `_total`
/// (`ai_router_calls`) is reported too: it would draw nothing.
fn served(scrape: &str) -> BTreeSet<&str> {
    scrape
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(series_name)
        .collect()
}

/// The names in `named` that `scrape` does not serve.
fn unserved(named: &BTreeSet<String>, scrape: &str) -> Vec<String> {
    let served = served(scrape);
    named
        .iter()
        .filter(|n| !served.contains(n.as_str()))
        .cloned()
        .collect()
}

/// PromQL words that are not metric names (when not followed by `(`,
/// which makes a word a function).
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
];

/// The keywords whose parenthesised list holds label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression (with Grafana's `$variables`)
/// selects: every identifier except functions and aggregations (a word
/// before `(`, `by` or `without`), keywords, label names (inside `{…}`
/// and in `by (…)`-style lists), string literals, durations (`[…]`,
/// `offset 5m`), numbers and variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let b = expr.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    // The index just past the string literal opening at `from`.
    let past_string = |from: usize| {
        let mut i = from + 1;
        while i < b.len() && b[i] != b[from] {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    };
    // The index just past the first `close` at or after `from`, outside
    // string literals (a label matcher's value may hold `}`).
    let past = |from: usize, close: u8| {
        let mut i = from;
        while i < b.len() {
            match b[i] {
                b'"' | b'\'' | b'`' => i = past_string(i),
                c if c == close => return i + 1,
                _ => i += 1,
            }
        }
        b.len()
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => i = past_string(i),
            b'{' => i = past(i + 1, b'}'),
            b'[' => i = past(i + 1, b']'),
            b'$' if b.get(i + 1) == Some(&b'{') => i = past(i + 2, b'}'),
            b'$' => {
                i += 1;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == b'.' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let name = &expr[start..i];
                let rest = expr[i..].trim_start();
                let modified = ["by", "without"].iter().any(|m| {
                    rest.strip_prefix(m)
                        .is_some_and(|r| r.trim_start().starts_with('('))
                });
                let call = rest.starts_with('(');
                if call && LABEL_LISTS.contains(&name) {
                    i = past(expr.len() - rest.len() + 1, b')');
                } else if !call && !modified && !KEYWORDS.contains(&name) {
                    names.insert(name.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The metric names of a Grafana variable's query: `label_values(selector,
/// label)` names the selector's metric, not the label.
fn variable_metric_names(query: &str) -> BTreeSet<String> {
    match query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .and_then(|q| q.rsplit_once(','))
    {
        Some((selector, _label)) => metric_names(selector),
        None => metric_names(query),
    }
}

fn dashboard() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dashboards/tower-llm-gateway.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

fn rules_text() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dashboards/tower-llm-gateway.rules.yml"
    );
    std::fs::read_to_string(path).expect("the alert rules")
}

/// Every panel of the dashboard, those inside rows included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    fn walk<'a>(list: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every PromQL expression of the dashboard: its panels' targets, then
/// its query variables (the query itself).
fn dashboard_queries(dashboard: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let targets = panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_owned())
        .collect();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = &v["query"];
            query["query"]
                .as_str()
                .or(query.as_str())
                .expect("a variable's query")
                .to_owned()
        })
        .collect();
    (targets, variables)
}

/// Each alert's name and `expr`, from the rules file: a block scalar
/// (`expr: |`, its lines indented deeper) or one line.
fn alert_exprs(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut alert = None;
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert:") {
            alert = Some(name.trim().to_owned());
        } else if let Some(value) = trimmed.strip_prefix("expr:") {
            let value = value.trim();
            let expr = if ["|", "|-", ">", ">-"].contains(&value) {
                let indent = line.len() - trimmed.len();
                lines[n + 1..]
                    .iter()
                    .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                value.trim_matches(['"', '\'']).to_owned()
            };
            let name = alert.take().expect("an expr belongs to an alert");
            out.push((name, expr));
        }
    }
    out
}

/// Every metric name the dashboard and the alert rules select.
fn named_metrics() -> BTreeSet<String> {
    let (targets, variables) = dashboard_queries(&dashboard());
    let mut names: BTreeSet<String> = targets.iter().flat_map(|e| metric_names(e)).collect();
    names.extend(variables.iter().flat_map(|q| variable_metric_names(q)));
    names.extend(
        alert_exprs(&rules_text())
            .iter()
            .flat_map(|(_, e)| metric_names(e)),
    );
    names
}

#[tokio::test(start_paused = true)]
async fn every_metric_the_dashboard_and_the_alert_rules_name_is_served_on_metrics() {
    let scrape = scrape_after_traffic().await;
    // The traffic did what the panels and alerts read.
    let value = |name: &str, labels: &[(&str, &str)]| sample(&scrape, name, labels);
    assert_eq!(
        value(
            "ai_router_retries_total",
            &[("provider", "flaky"), ("reason", "5xx")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            "ai_router_failovers_total",
            &[("from", "down"), ("to", "ok")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value("llm_circuit_state", &[("provider", "down"), ("model", "m")]),
        Some(1.0),
        "the dead link's circuit is open"
    );
    assert_eq!(
        value("ai_router_hedges_total", &[("outcome", "won")]),
        Some(1.0)
    );
    assert_eq!(
        value("ai_router_cache_total", &[("status", "hit")]),
        Some(1.0)
    );
    assert_eq!(value("ai_router_idempotent_replays_total", &[]), Some(1.0));
    assert_eq!(value("ai_router_deadline_exceeded_total", &[]), Some(1.0));
    for deployment in ["limited-east", "limited-west"] {
        assert_eq!(
            value(
                "ai_router_pool_moves_total",
                &[("provider", deployment), ("reason", "rate_limited")]
            ),
            Some(1.0)
        );
    }
    assert_eq!(value("provider_up", &[("provider", "ok")]), Some(1.0));
    for store in [
        "llm_breaker_shared_store_up",
        "ai_router_quota_shared_store_up",
        "ai_router_pool_shared_store_up",
    ] {
        assert_eq!(value(store, &[]), Some(0.0), "{store}: Redis refuses");
    }

    let named = named_metrics();
    assert_eq!(unserved(&named, &scrape), Vec::<String>::new(), "{scrape}");
    // And the reader found them all (the list of what the files name).
    let expected: BTreeSet<String> = [
        "ai_router_attempts_per_call_bucket",
        "ai_router_attempts_per_call_count",
        "ai_router_attempts_per_call_sum",
        "ai_router_cache_total",
        "ai_router_calls_total",
        "ai_router_cost_total",
        "ai_router_deadline_exceeded_total",
        "ai_router_failovers_total",
        "ai_router_hedges_total",
        "ai_router_idempotent_replays_total",
        "ai_router_latency_ms_bucket",
        "ai_router_pool_moves_total",
        "ai_router_pool_shared_store_up",
        "ai_router_quota_shared_store_dropped_total",
        "ai_router_quota_shared_store_late_total",
        "ai_router_quota_shared_store_up",
        "ai_router_retries_total",
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_token_usage_sum",
        "llm_breaker_shared_store_dropped_total",
        "llm_breaker_shared_store_up",
        "llm_circuit_state",
        "provider_up",
    ]
    .map(String::from)
    .into();
    assert_eq!(named, expected);
}

#[test]
fn a_metric_name_the_gateway_does_not_serve_is_reported() {
    let scrape = "# TYPE ai_router_calls_total counter\n\
        ai_router_calls_total{outcome=\"succeeded\",otel_scope_name=\"tower-llm\"} 3\n\
        # TYPE ai_router_latency_ms histogram\n\
        ai_router_latency_ms_bucket{le=\"5\"} 1\n\
        ai_router_latency_ms_sum 2\n\
        ai_router_latency_ms_count 1\n";
    let named = metric_names(
        "sum(rate(ai_router_calls_total[5m])) + sum(rate(ai_router_bogus_total[5m])) \
         + sum(rate(ai_router_calls[5m])) + ai_router_latency_ms \
         + histogram_quantile(0.5, sum by (le) (rate(ai_router_latency_ms_bucket[5m])))",
    );
    assert_eq!(
        unserved(&named, scrape),
        [
            "ai_router_bogus_total",
            "ai_router_calls",
            "ai_router_latency_ms"
        ]
    );
}

#[test]
fn the_promql_reader_skips_functions_keywords_labels_strings_and_variables() {
    let names = metric_names(
        r#"sum by (provider, le) (rate(a_total{job=~"$job", outcome!="x{y}"}[$__rate_interval]))
           / on (job) group_left (model) max without (instance) (b:rule offset 5m)
           > bool 1e3 or vector(0) and ${c_var} unless count(d_gauge == 0) * 3600"#,
    );
    assert_eq!(
        names,
        ["a_total", "b:rule", "d_gauge"].map(String::from).into()
    );
    assert_eq!(
        variable_metric_names(r#"label_values(e_total{job=~"$job"}, instance)"#),
        ["e_total"].map(String::from).into()
    );
}

#[test]
fn the_alert_rules_reader_finds_every_alert_and_its_whole_expression() {
    let rules = alert_exprs(&rules_text());
    let names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "TowerLlmCircuitOpen",
            "TowerLlmFallbackShareHigh",
            "TowerLlmRetryAmplification",
            "TowerLlmBreakerSharedStoreDown",
            "TowerLlmQuotaSharedStoreDown",
            "TowerLlmPoolSharedStoreDown",
            "TowerLlmDeadlinesExceeded",
            "TowerLlmErrorRatioHigh",
        ]
    );
    assert_eq!(rules.len(), rules_text().matches("\n        expr:").count());
    assert_eq!(
        rules[1].1,
        "sum by (job) (rate(ai_router_failovers_total[5m])) \
         / sum by (job) (rate(ai_router_calls_total[5m])) > 0.1"
    );
}

#[test]
fn every_panel_and_variable_queries_the_datasource_variable() {
    let dashboard = dashboard();
    assert_eq!(dashboard["schemaVersion"], 39);
    let prometheus = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let names: Vec<&str> = variables
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["datasource", "job", "instance", "provider", "model"]
    );
    assert_eq!(variables[0]["type"], "datasource");
    assert_eq!(variables[0]["query"], "prometheus");
    for variable in &variables[1..] {
        assert_eq!(variable["datasource"], prometheus, "{variable}");
    }
    let mut queried = 0;
    for panel in panels(&dashboard) {
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"], prometheus, "{}", panel["title"]);
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            assert_eq!(target["datasource"], prometheus, "{}", panel["title"]);
            queried += 1;
        }
    }
    assert_eq!(queried, dashboard_queries(&dashboard).0.len());
}
