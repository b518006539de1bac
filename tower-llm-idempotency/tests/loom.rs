//! Loom model of the idempotency layer's single flight: however calls with
//! one key race, exactly one leads; the others wait for it (or, with
//! another request, are refused); and once the leader gives the key up,
//! exactly one of the next callers leads.
//!
//! ```text
//! RUSTFLAGS="--cfg tower_llm_loom" cargo test -p tower-llm-idempotency --test loom
//! ```
#![cfg(tower_llm_loom)]

use std::sync::Arc;

use tower_llm_idempotency::{Begin, Fingerprint, MemoryStore};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// What a racer saw: led (and the lease), waited, or was refused.
fn outcome(b: Begin) -> (u8, Option<tower_llm_idempotency::Lease>) {
    match b {
        Begin::Lead(lease) => (0, Some(lease)),
        Begin::Busy(_) => (1, None),
        Begin::Mismatch => (2, None),
        Begin::Replay(_) => (3, None),
    }
}

#[test]
fn exactly_one_leader_per_key_and_one_more_after_a_release() {
    model(|| {
        let store = Arc::new(MemoryStore::new(1 << 20));
        let key: Arc<str> = Arc::from("k");
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                loom::thread::spawn(move || outcome(store.begin_now(key, Fingerprint([7; 32]))))
            })
            .collect();
        let seen: Vec<_> = racers
            .into_iter()
            .map(|t| t.join().expect("joined"))
            .collect();
        let leaders: Vec<_> = seen.iter().filter_map(|(_, lease)| *lease).collect();
        assert_eq!(leaders.len(), 1, "{seen:?}");
        assert!(
            seen.iter().all(|(o, _)| *o <= 1),
            "only lead or wait: {seen:?}"
        );
        // The leader gives the key up: of two new racers, one leads.
        store.release_now(&key, leaders[0]);
        let again: Vec<_> = (0..2)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                loom::thread::spawn(move || outcome(store.begin_now(key, Fingerprint([7; 32]))))
            })
            .collect();
        let led = again
            .into_iter()
            .map(|t| t.join().expect("joined"))
            .filter(|(o, _)| *o == 0)
            .count();
        assert_eq!(led, 1);
    });
}

#[test]
fn another_request_with_the_key_is_refused_never_led() {
    model(|| {
        let store = Arc::new(MemoryStore::new(1 << 20));
        let racers: Vec<_> = [1u8, 2]
            .into_iter()
            .map(|fp| {
                let store = store.clone();
                loom::thread::spawn(move || {
                    outcome(store.begin_now(Arc::from("k"), Fingerprint([fp; 32]))).0
                })
            })
            .collect();
        let mut seen: Vec<_> = racers
            .into_iter()
            .map(|t| t.join().expect("joined"))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 2], "one leads, the other request is refused");
    });
}
