//! `Cache-Control` read from anything a client can send: arbitrary bytes
//! never panic and come back as directives or as "ignored"; lists built
//! from the known directives (any case, spacing, quoting, unknown
//! directives between them) read back exactly.
//!
//! 10,000 cases by default; `FUZZ_CASES=1000000` for the long run.

use std::time::Duration;

use proptest::prelude::*;
use tower_llm_cache::CacheControl;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(10_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One directive as written, and what it sets.
#[derive(Debug, Clone)]
enum Directive {
    NoCache,
    NoStore,
    MaxAge(u32),
    StaleIfError(u32),
    Unknown(String),
}

fn directive() -> impl Strategy<Value = Directive> {
    prop_oneof![
        Just(Directive::NoCache),
        Just(Directive::NoStore),
        (0u32..100_000).prop_map(Directive::MaxAge),
        (0u32..100_000).prop_map(Directive::StaleIfError),
        "[a-z][a-z-]{0,10}(=[0-9a-z]{1,5})?"
            .prop_filter("not one of ours", |s| {
                let name = s.split('=').next().unwrap_or_default();
                !["no-cache", "no-store", "max-age", "stale-if-error"].contains(&name)
            })
            .prop_map(Directive::Unknown),
    ]
}

fn written(d: &Directive, upper: bool, quoted: bool, space: &str) -> String {
    let name = |n: &str| {
        if upper {
            n.to_ascii_uppercase()
        } else {
            n.to_owned()
        }
    };
    let value = |v: u32| {
        if quoted {
            format!("\"{v}\"")
        } else {
            v.to_string()
        }
    };
    match d {
        Directive::NoCache => name("no-cache"),
        Directive::NoStore => name("no-store"),
        Directive::MaxAge(v) => format!("{}{space}={space}{}", name("max-age"), value(*v)),
        Directive::StaleIfError(v) => {
            format!("{}{space}={space}{}", name("stale-if-error"), value(*v))
        }
        Directive::Unknown(s) => s.clone(),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = CacheControl::parse(&bytes);
        if let Ok(value) = http::HeaderValue::from_bytes(&bytes) {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::CACHE_CONTROL, value);
            let _ = CacheControl::from_headers(&headers);
        }
    }

    #[test]
    fn lists_of_known_directives_read_back_exactly(
        list in proptest::collection::vec(directive(), 0..8),
        upper in any::<bool>(),
        quoted in any::<bool>(),
        space in prop_oneof![Just(""), Just(" "), Just("\t")],
    ) {
        let text = list
            .iter()
            .map(|d| written(d, upper, quoted, space))
            .collect::<Vec<_>>()
            .join(&format!("{space},{space}"));
        let mut want = CacheControl::default();
        let mut contradictory = false;
        for d in &list {
            match d {
                Directive::NoCache => want.no_cache = true,
                Directive::NoStore => want.no_store = true,
                Directive::MaxAge(v) => {
                    let v = Duration::from_secs(u64::from(*v));
                    contradictory |= want.max_age.is_some_and(|o| o != v);
                    want.max_age = Some(v);
                }
                Directive::StaleIfError(v) => {
                    let v = Duration::from_secs(u64::from(*v));
                    contradictory |= want.stale_if_error.is_some_and(|o| o != v);
                    want.stale_if_error = Some(v);
                }
                Directive::Unknown(_) => {}
            }
        }
        let got = CacheControl::parse(text.as_bytes());
        if contradictory {
            prop_assert_eq!(got, None, "{}", text);
        } else {
            prop_assert_eq!(got, Some(want), "{}", text);
        }
    }
}
