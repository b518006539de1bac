//! Helpers shared by the provider tests.

#![allow(dead_code, unreachable_pub)]

use http::HeaderMap;

/// The bytes of a fixture in `tests/fixtures`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A `.headers` fixture (one `Name: value` per line) as a header map.
pub fn headers(name: &str) -> HeaderMap {
    let text = String::from_utf8(fixture(name)).expect("utf-8");
    let mut map = HeaderMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
    }
    map
}
