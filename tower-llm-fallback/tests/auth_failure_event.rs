//! The sev-1 event on auth failures, in its own test binary: tracing's
//! callsite interest is process-wide, and a test with a thread-local
//! subscriber must not race other tests for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::ServiceExt;

mod common;
use common::*;

/// Captures the `severity` field of every event.
#[derive(Default, Clone)]
struct Severities(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Severities {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Visit<'a>(&'a Mutex<Vec<String>>, &'a tracing::Level);
        impl tracing::field::Visit for Visit<'_> {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "severity" {
                    self.0
                        .lock()
                        .expect("lock")
                        .push(format!("{} {value}", self.1));
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        event.record(&mut Visit(&self.0, event.metadata().level()));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(start_paused = true)]
async fn seed_ac5_an_auth_failure_logs_sev_1() {
    let seen = Severities::default();
    let _guard = tracing::subscriber::set_default(seen.clone());
    tracing::callsite::rebuild_interest_cache();
    let primary = Provider::new("bedrock", &[now(401)]);
    let backup = Provider::new("anthropic", &[now(200)]);
    let (svc, _) = chain(Duration::from_secs(30), &primary, &[&backup]);
    let err = svc.oneshot(req()).await.expect_err("auth");
    assert!(err.is_auth());
    assert_eq!(*seen.0.lock().expect("lock"), ["ERROR sev-1"]);

    // Other terminal failures are not paged.
    seen.0.lock().expect("lock").clear();
    let primary = Provider::new("bedrock", &[now(400)]);
    let (svc, _) = chain(Duration::from_secs(30), &primary, &[&backup]);
    let _ = svc.oneshot(req()).await;
    assert!(seen.0.lock().expect("lock").is_empty());
}
