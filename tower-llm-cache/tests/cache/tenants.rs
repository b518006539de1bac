//! Tenants: opaque bytes, never sharing an answer.

use tower::Layer;

use super::*;

/// The tenant a server found for a request, as raw bytes.
#[derive(Debug, Clone)]
struct TenantId(Vec<u8>);

#[tokio::test(start_paused = true)]
async fn each_tenant_gets_its_own_answer_whatever_bytes_name_it() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0))
        .with_tenant(|r: &ChatRequest| r.extensions.get::<TenantId>().map(|t| t.0.clone()))
        .layer(provider.service());
    let tenants: [Option<&[u8]>; 5] = [
        Some("café-lyon".as_bytes()),
        // "café" in UTF-8 and in Latin-1: two names.
        Some("café".as_bytes()),
        Some(b"caf\xe9"),
        // The empty name is a name, not the unnamed tenant.
        Some(b""),
        None,
    ];
    let as_tenant = |tenant: Option<&[u8]>| {
        let mut req = ask();
        if let Some(t) = tenant {
            req.extensions.insert(TenantId(t.to_vec()));
        }
        req
    };
    for (n, tenant) in tenants.iter().enumerate() {
        let res = call(&svc, as_tenant(*tenant)).await.expect("answers");
        assert_eq!(
            seen(&res),
            (format!("answer {n}").as_str(), MISS),
            "{tenant:?}"
        );
    }
    assert_eq!(provider.calls(), 5);
    advance(secs(7)).await;
    for (n, tenant) in tenants.iter().enumerate() {
        let res = call(&svc, as_tenant(*tenant)).await.expect("hit");
        assert_eq!(
            seen(&res),
            (format!("answer {n}").as_str(), hit(secs(7))),
            "{tenant:?}"
        );
    }
    assert_eq!(provider.calls(), 5);
}
