//! Redis URLs in logs.

/// `url` with its user-info part (`user:password@`) replaced by `***@`,
/// for logs and error messages; a URL without one is returned as it is.
///
/// ```
/// use tower_llm_redis::redact_url;
///
/// assert_eq!(redact_url("redis://:hunter2@10.0.0.7:6379/0"), "redis://***@10.0.0.7:6379/0");
/// assert_eq!(redact_url("redis://10.0.0.7"), "redis://10.0.0.7");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn only_the_user_info_goes() {
        assert_eq!(
            redact_url("redis://user:p@ss@host:1/2"),
            "redis://***@host:1/2"
        );
        assert_eq!(redact_url("rediss://host/0?a=b@c"), "rediss://host/0?a=b@c");
        assert_eq!(redact_url("host:6379"), "host:6379");
    }
}
