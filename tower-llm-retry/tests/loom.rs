//! Loom models of the retry budget (shared by the retry and hedge layers):
//! concurrent withdrawals never take more than the budget allows, whatever
//! the interleaving (up to two preemptions).
//!
//! ```text
//! RUSTFLAGS="--cfg tower_llm_loom" cargo test -p tower-llm-retry --test loom --release
//! ```
#![cfg(tower_llm_loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use tower_llm_retry::{Budget, RetryBudget};

/// Explores every interleaving with up to two preemptions (loom's
/// advice: most concurrency bugs need no more), which keeps a run to
/// seconds.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// Two threads race for the last allowed withdrawal: exactly one gets it
/// (a check-then-take budget lets both through).
#[test]
fn concurrent_withdrawals_never_exceed_the_allowance() {
    model(|| {
        // 100 %, no floor: each deposit allows one withdrawal.
        let budget = Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 1.0).expect("valid"));
        budget.deposit();
        let granted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (budget, granted) = (budget.clone(), granted.clone());
                loom::thread::spawn(move || {
                    if budget.withdraw() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("joined");
        }
        assert_eq!(granted.load(Ordering::SeqCst), 1);
    });
}

/// A deposit racing with withdrawals: never more taken than deposited.
#[test]
fn a_racing_deposit_never_lets_more_through_than_it_allows() {
    model(|| {
        let budget = Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 1.0).expect("valid"));
        budget.deposit();
        let granted = Arc::new(AtomicUsize::new(0));
        let depositor = {
            let budget = budget.clone();
            loom::thread::spawn(move || budget.deposit())
        };
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let (budget, granted) = (budget.clone(), granted.clone());
                loom::thread::spawn(move || {
                    if budget.withdraw() {
                        granted.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        depositor.join().expect("joined");
        for t in takers {
            t.join().expect("joined");
        }
        let granted = granted.load(Ordering::SeqCst);
        assert!((1..=2).contains(&granted), "{granted}");
        assert_eq!(budget.allowance(), (2, granted as u64));
    });
}
