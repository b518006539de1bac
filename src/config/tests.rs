use super::build::tenant_header;
use super::*;
use tower_llm_breaker::BreakerCount;
use tower_llm_core::ChatRequest;
use tower_llm_retry::{Jitter, JitterSpec};

#[test]
fn an_admission_rule_compares_header_bytes_so_utf8_values_match() {
    let rule = AdmitRule {
        header: "x-tenant-region".into(),
        any_of: vec!["zürich".into()],
    };
    let with = |value: &[u8]| {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "x-tenant-region",
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
        let mut req = ChatRequest::new("m", vec![]);
        req.extensions.insert(InboundHeaders(headers));
        rule.admits(&req)
    };
    assert!(with("zürich".as_bytes()));
    // The same word in Latin-1 is other bytes: not admitted.
    assert!(!with(b"z\xfcrich"));
    assert!(!with(b"zurich"));
}

#[test]
fn the_tenant_of_a_request_is_its_header_s_raw_bytes() {
    let with = |value: Option<&[u8]>| {
        let mut headers = http::HeaderMap::new();
        if let Some(value) = value {
            headers.insert(
                TENANT_HEADER,
                http::HeaderValue::from_bytes(value).expect("a header value"),
            );
        }
        let mut req = ChatRequest::new("m", vec![]);
        req.extensions.insert(InboundHeaders(headers));
        tenant_header(&req)
    };
    assert_eq!(
        with(Some("café-lyon".as_bytes())),
        Some("café-lyon".as_bytes().to_vec())
    );
    assert_eq!(with(Some(b"caf\xe9")), Some(b"caf\xe9".to_vec()));
    assert_eq!(with(None), None);
}

const GOOD: &str = r#"
    [[providers]]
    name = "a"
    kind = "openai"
    api_key_env = "A"

    [[providers]]
    name = "b"
    kind = "bedrock"

    [[routes]]
    model = "smart"
    chain = [{ provider = "a", model = "x" }, { provider = "b", model = "y" }]
"#;

fn problems(text: &str) -> Vec<String> {
    Policy::from_toml(text)
        .unwrap_err()
        .problems()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_good_policy_loads_with_defaults_and_round_trips_through_json() {
    let p = Policy::from_toml(GOOD).expect("valid");
    assert_eq!(p.deadline.total_ms(), 30_000);
    assert_eq!(p.retry.attempt_timeout_ms(), 30_000);
    assert_eq!(p.retry.max_attempts, 3);
    assert_eq!(p.retry.jitter, JitterSpec::Fraction(0.2));
    let json = serde_json::to_string(&p).expect("json");
    assert_eq!(Policy::from_json(&json).expect("valid"), p);
    assert!(p.retry_layer().is_ok());
    assert_eq!(p.breaker.consecutive_failures, 5);
}

#[test]
fn breaker_count_and_min_attempt_load_from_the_file() {
    let p = Policy::from_toml(&format!(
        "[retry]\nmin_attempt_ms = 500\n[breaker]\ncount = \"calls\"\n{GOOD}"
    ))
    .expect("valid");
    assert_eq!(p.retry.min_attempt_ms, Some(500));
    assert_eq!(p.min_attempt_ms(), 500);
    assert_eq!(p.breaker.count, BreakerCount::Calls);
    let defaults = Policy::from_toml(GOOD).expect("valid");
    assert_eq!(defaults.min_attempt_ms(), 1_000);
    // A short deadline scales the default down.
    let short = Policy::from_toml(&format!("[deadline]\ntotal_ms = 1200\n{GOOD}")).expect("valid");
    assert_eq!(short.min_attempt_ms(), 300);
    assert_eq!(
        problems(&format!(
            "[deadline]\ntotal_ms = 1000\n[retry]\nmin_attempt_ms = 1000\n{GOOD}"
        )),
        ["retry.min_attempt_ms (1000) leaves no room for a retry within deadline.total_ms (1000)"]
    );
    assert_eq!(defaults.breaker.count, BreakerCount::Attempts);
    assert!(!problems(&format!("[breaker]\ncount = \"tries\"\n{GOOD}")).is_empty());
}

#[test]
fn each_validation_error_is_named() {
    let unknown = GOOD.replace("provider = \"b\"", "provider = \"c\"");
    assert_eq!(
        problems(&unknown),
        ["route \"smart\": unknown provider \"c\""]
    );
    let dup = format!("{GOOD}\n[[providers]]\nname = \"a\"\nkind = \"bedrock\"\n");
    assert_eq!(problems(&dup), ["duplicate provider \"a\""]);
    let dup_route = format!(
        "{GOOD}\n[[routes]]\nmodel = \"smart\"\nchain = [{{ provider = \"a\", model = \"z\" }}]\n"
    );
    assert_eq!(problems(&dup_route), ["duplicate route \"smart\""]);
    let empty = format!("{GOOD}\n[[routes]]\nmodel = \"none\"\nchain = []\n");
    assert_eq!(problems(&empty), ["route \"none\" has an empty chain"]);
    let twice = GOOD.replace(
        "provider = \"b\", model = \"y\"",
        "provider = \"a\", model = \"x\"",
    );
    assert_eq!(problems(&twice), ["route \"smart\": duplicate link a/x"]);
    let zero = format!("[deadline]\ntotal_ms = 0\n{GOOD}");
    assert_eq!(problems(&zero), ["deadline.total_ms must be above 0"]);
    let inverted = format!(
        "[retry]\nmax_attempts = 3\nattempt_timeout_ms = 1000\nbase_ms = 500\nfactor = 2\nmax_ms = 100\njitter = \"full\"\n{GOOD}"
    );
    assert_eq!(
        problems(&inverted),
        ["retry.base_ms (500) is above max_ms (100)"]
    );
    let long_attempt = format!(
        "[deadline]\ntotal_ms = 1000\n[retry]\nmax_attempts = 3\nattempt_timeout_ms = 5000\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 0.1\n{GOOD}"
    );
    assert_eq!(
        problems(&long_attempt),
        ["retry.attempt_timeout_ms (5000) is longer than deadline.total_ms (1000)"]
    );
    let too_many = format!(
        "[retry]\nmax_attempts = 17\nattempt_timeout_ms = 1000\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 0.1\n{GOOD}"
    );
    assert_eq!(
        problems(&too_many),
        ["retry.max_attempts must be 1 to 16, not 17"]
    );
    let no_key = GOOD.replace("api_key_env = \"A\"", "");
    assert_eq!(
        problems(&no_key),
        ["provider \"a\": api_key_env is required for Openai"]
    );
    let azure = GOOD.replace("kind = \"openai\"", "kind = \"azure\"");
    assert_eq!(
        problems(&azure),
        [
            "provider \"a\": base_url (the resource's endpoint, https://NAME.openai.azure.com) is required for azure"
        ]
    );
    let version = GOOD.replace(
        "api_key_env = \"A\"",
        "api_key_env = \"A\"\napi_version = \"2024-10-21\"",
    );
    assert_eq!(
        problems(&version),
        ["provider \"a\": api_version is for azure only"]
    );
    let breaker = format!(
        "[breaker]\nconsecutive_failures = 0\ncooldown_ms = 0\nhalf_open_probes = 1\n{GOOD}"
    );
    assert_eq!(
        problems(&breaker),
        ["breaker.cooldown_ms must be above zero"]
    );
    let bulkhead = GOOD.replace(
        "api_key_env = \"A\"",
        "api_key_env = \"A\"\nmax_concurrency = 0",
    );
    assert_eq!(
        problems(&bulkhead),
        ["provider \"a\": max_concurrency must be above 0"]
    );
}

#[test]
fn syntax_errors_unknown_keys_and_kinds_are_refused_with_their_place() {
    let typo = GOOD.replace("api_key_env", "api_key_envv");
    let err = Policy::from_toml(&typo).unwrap_err().to_string();
    assert!(err.contains("api_key_envv"), "{err}");
    let kind = GOOD.replace("kind = \"bedrock\"", "kind = \"mistral\"");
    let err = Policy::from_toml(&kind).unwrap_err().to_string();
    assert!(err.contains("mistral"), "{err}");
    let err = Policy::from_toml("[[routes]\n").unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    assert!(Policy::from_json("{\"routes\": 7}").is_err());
}

#[test]
fn jitter_names_and_fractions() {
    for (text, jitter) in [
        ("0.5", Jitter::Proportional { fraction: 0.5 }),
        ("\"equal\"", Jitter::Equal),
        ("\"full\"", Jitter::Full),
        ("\"none\"", Jitter::None),
    ] {
        let t = format!(
            "[retry]\nmax_attempts = 2\nattempt_timeout_ms = 100\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = {text}\n{GOOD}"
        );
        let p = Policy::from_toml(&t).expect("valid");
        assert_eq!(p.retry.backoff().expect("backoff").jitter(), jitter);
    }
    let t = format!(
        "[retry]\nmax_attempts = 2\nattempt_timeout_ms = 100\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 1.5\n{GOOD}"
    );
    assert!(Policy::from_toml(&t).is_err());
}

/// Any one key set alone, to a small or a large value, is accepted: a
/// default never contradicts what a user wrote.
#[test]
fn no_single_key_is_refused_because_of_a_default() {
    let keys = [
        ("deadline", "total_ms"),
        ("retry", "attempt_timeout_ms"),
        ("retry", "base_ms"),
        ("retry", "max_ms"),
        ("retry", "min_attempt_ms"),
        ("breaker", "cooldown_ms"),
        ("stream", "first_token_timeout_ms"),
        ("stream", "idle_timeout_ms"),
    ];
    for (section, key) in keys {
        for value in [1_u64, 1_500, 10_000_000] {
            let text = format!("[{section}]\n{key} = {value}\n{GOOD}");
            if let Err(e) = Policy::from_toml(&text) {
                panic!("[{section}] {key} = {value} alone is refused: {e}");
            }
        }
    }
    // The case the issue names, and what the defaults become.
    let p = Policy::from_toml(&format!("[deadline]\ntotal_ms = 1500\n{GOOD}")).expect("valid");
    assert_eq!(p.deadline.total_ms(), 1_500);
    let p = Policy::from_toml(&format!("[retry]\nbase_ms = 5000\n{GOOD}")).expect("valid");
    assert_eq!((p.retry.base_ms(), p.retry.max_ms()), (5_000, 5_000));
    let p = Policy::from_toml(&format!("[retry]\nmax_ms = 50\n{GOOD}")).expect("valid");
    assert_eq!((p.retry.base_ms(), p.retry.max_ms()), (50, 50));
    // A contradiction the user wrote is still refused.
    let both = format!("[deadline]\ntotal_ms = 1500\n[retry]\nattempt_timeout_ms = 5000\n{GOOD}");
    assert_eq!(
        problems(&both),
        ["retry.attempt_timeout_ms (5000) is longer than deadline.total_ms (1500)"]
    );
}

#[test]
fn inbound_headers_never_show_their_values() {
    let mut h = http::HeaderMap::new();
    h.insert(
        "authorization",
        http::HeaderValue::from_static("Bearer sk-secret"),
    );
    let shown = format!("{:?}", InboundHeaders(h));
    assert_eq!(shown, r#"InboundHeaders(["authorization"])"#);
}

#[test]
fn a_policy_without_routes_is_refused() {
    assert_eq!(problems(""), ["the policy has no routes ([[routes]])"]);
    let no_routes = GOOD.split("[[routes]]").next().expect("text");
    assert_eq!(
        problems(no_routes),
        ["the policy has no routes ([[routes]])"]
    );
    // A host's settings are not the library's: refused by `Policy`.
    let server = format!("[server]\nmax_in_flight = 10\n{GOOD}");
    assert!(
        Policy::from_toml(&server)
            .unwrap_err()
            .to_string()
            .contains("unknown field `server`")
    );
}

/// A policy of two providers, one route over both, with `extra` appended.
fn priced(extra: &str) -> Result<Policy, ConfigError> {
    Policy::from_toml(&format!(
        r#"
        [[providers]]
        name = "a"
        kind = "openai"
        api_key_env = "A_KEY"

        [[providers]]
        name = "b"
        kind = "anthropic"
        api_key_env = "B_KEY"

        {extra}
        "#
    ))
}

const ROUTE: &str = r#"
    [[routes]]
    model = "smart"
    max_total_cost = 0.05
    max_output_tokens = 1024
    chain = [{ provider = "a", model = "big" }, { provider = "b", model = "small" }]
"#;

const PRICES: &str = r#"
    [prices.a.big]
    input = 5.0
    output = 15.0
    [prices.b.small]
    input = 0.25
    output = 1.25
    cached_input = 0.03
"#;

#[test]
fn a_price_table_and_a_budget_load_and_resolve() {
    let policy = priced(&format!("{ROUTE}{PRICES}")).expect("loads");
    let r = policy.resolve(&policy.routes[0]).expect("resolves");
    assert_eq!(r.max_total_cost, tower_llm_core::Cost::from_dollars(0.05));
    let small = policy.price("b", "small").expect("priced");
    assert_eq!(small.cached_input, tower_llm_core::Cost::from_dollars(0.03));
    assert!(policy.price("b", "big").is_none());
}

#[test]
fn a_budget_or_quota_needs_every_link_priced_and_an_output_cap() {
    let only_big = "[prices.a.big]\ninput = 5.0\noutput = 15.0\n";
    let e = priced(&format!("{ROUTE}{only_big}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "route \"smart\": max_total_cost needs every link priced: add [prices.b.\"small\"]"
        ),
        "{e}"
    );
    let uncapped = ROUTE.replace("max_output_tokens = 1024\n", "");
    let e = priced(&format!("{uncapped}{PRICES}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_total_cost needs max_output_tokens"), "{e}");
    let quotas = format!(
        "{}\n[quotas]\nwindow_secs = 86400\nmax_cost = 10\n",
        uncapped.replace("max_total_cost = 0.05\n", "")
    );
    let e = priced(&quotas).unwrap_err().to_string();
    assert!(e.contains("[quotas] needs every link priced"), "{e}");
    assert!(e.contains("[quotas] needs max_output_tokens"), "{e}");
}

#[test]
fn a_malformed_price_table_is_refused_with_the_field_s_path() {
    let bad = |table: &str| {
        priced(&format!("{ROUTE}{PRICES}{table}"))
            .unwrap_err()
            .to_string()
    };
    let e = bad("[prices.a.neg]\ninput = -1.0\noutput = 1.0\n");
    assert!(e.contains("prices.a.neg"), "{e}");
    let e = bad("[prices.a.absurd]\ninput = 1.0\noutput = 50000.0\n");
    assert!(e.contains("prices.a.absurd") && e.contains("absurd"), "{e}");
    let e = bad("[prices.a.typo]\ninput = 1.0\noutptu = 1.0\n");
    assert!(e.contains("prices.a.typo"), "{e}");
    let e = bad("[prices.nobody.m]\ninput = 1.0\noutput = 1.0\n");
    assert!(e.contains("prices.nobody: unknown provider"), "{e}");
    let e = bad("[quotas]\nwindow_secs = 0\nmax_cost = 1\n");
    assert!(e.contains("quotas.window_secs = 0"), "{e}");
    let e = priced(&format!("{}{PRICES}", ROUTE.replace("0.05", "0")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_total_cost = 0 would refuse every call"),
        "{e}"
    );
}

#[test]
fn a_pool_is_named_by_chains_and_checked_at_load() {
    let base = r#"
        [[providers]]
        name = "east"
        kind = "openai"
        api_key_env = "E"
        rpm = 60
        [[providers]]
        name = "west"
        kind = "openai"
        api_key_env = "W"
    "#;
    let ok = Policy::from_toml(&format!(
        r#"{base}
        [[pools]]
        name = "gpt4o"
        affinity_header = "x-session-id"
        deployments = [{{ provider = "east", weight = 3 }}, {{ provider = "west", model = "gpt-4o-eu" }}]
        [[routes]]
        model = "smart"
        chain = [{{ provider = "gpt4o", model = "gpt-4o" }}]
        "#
    ))
    .expect("loads");
    let deployments = ok.deployments_of(&ok.routes[0].chain[0]);
    let pairs: Vec<_> = deployments
        .iter()
        .map(|l| (l.provider.as_str(), l.model.as_str()))
        .collect();
    assert_eq!(pairs, [("east", "gpt-4o"), ("west", "gpt-4o-eu")]);
    assert_eq!(
        ok.provider("east").map(|p| p.pace_limits().rpm),
        Some(Some(60))
    );

    let bad = |pools: &str| {
        Policy::from_toml(&format!("{base}\n{pools}"))
            .unwrap_err()
            .to_string()
    };
    let e = bad("[[pools]]\nname = \"east\"\ndeployments = [{ provider = \"west\" }]");
    assert!(
        e.contains("pool \"east\": a provider has the same name"),
        "{e}"
    );
    let e = bad("[[pools]]\nname = \"p\"\ndeployments = []");
    assert!(e.contains("pool \"p\": deployments is empty"), "{e}");
    let e = bad("[[pools]]\nname = \"p\"\ndeployments = [{ provider = \"nobody\" }]");
    assert!(e.contains("pool \"p\": unknown provider \"nobody\""), "{e}");
    let e = bad("[[pools]]\nname = \"p\"\ndeployments = [{ provider = \"east\", weight = 0 }]");
    assert!(e.contains("weight must be at least 1"), "{e}");
    let e = bad(
        "[[pools]]\nname = \"p\"\naffinity_header = \"not a header\"\ndeployments = [{ provider = \"east\" }]",
    );
    assert!(e.contains("is not a header name"), "{e}");
    let e = Policy::from_toml(&base.replace("rpm = 60", "rpm = 0"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rpm and tpm must be above 0"), "{e}");
}

#[test]
fn a_route_holds_budgets_only_with_every_called_link_priced_and_an_output_cap() {
    let route = |extra: &str| {
        format!(
            "[[routes]]\nmodel = \"smart\"\n{extra}\nchain = [{{ provider = \"a\", model = \"big\" }}, {{ provider = \"b\", model = \"small\" }}]\n"
        )
    };
    let holds = |text: &str| {
        let policy = priced(text).expect("loads");
        let r = policy.resolve(&policy.routes[0]).expect("resolves");
        policy.holds_budgets(&policy.routes[0], &r)
    };
    assert!(holds(&format!(
        "{}{PRICES}",
        route("max_output_tokens = 100")
    )));
    assert!(!holds(&format!("{}{PRICES}", route(""))), "no output cap");
    assert!(!holds(&route("max_output_tokens = 100")), "no prices");
    let hedged = route(
        "max_output_tokens = 100\nhedge = { delay_ms = 100 }\nhedge_to = { provider = \"b\", model = \"other\" }",
    );
    assert!(
        !holds(&format!("{hedged}{PRICES}")),
        "an unpriced hedge target"
    );
}
