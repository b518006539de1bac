//! The worker: runs queued settles against Redis while it answers; while
//! it does not, keeps them queued and pings with backoff; when it is
//! back, pushes what was spent in-process, then shares again.
//!
//! A write that got no reply within [`Inner::write_timeout`] is late, not
//! lost: it is kept and run again (each counts once), the probe is asked
//! whether Redis answers, and only a connection error (or the probe)
//! declares Redis down.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tower_llm_core::Tenant;
use tower_llm_redis::ShutdownSignal;

use crate::inner::{Fail, Inner, Job, amount};

/// Jobs run together (concurrently, on the one multiplexed connection).
const BATCH: usize = 256;

pub(crate) async fn run(
    inner: Arc<Inner>,
    mut rx: mpsc::Receiver<Job>,
    mut shutdown: ShutdownSignal,
) {
    // Jobs that got no answer: run again (each counts once) before
    // anything else, when Redis is back or after a pause.
    let mut retry: Vec<Job> = Vec::new();
    let mut batch: Vec<Job> = Vec::with_capacity(BATCH);
    let mut backoff = inner.redis.backoff();
    loop {
        if !inner.is_up() {
            tokio::select! {
                () = shutdown.stopped() => return,
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
            let mut conn = inner.conn.clone();
            if !tower_llm_redis::ping(&mut conn, inner.redis.op_timeout()).await {
                continue;
            }
            // Catch up before sharing again: reserves that see Redis
            // then see what was spent meanwhile.
            if catch_up(&inner, &mut retry).await.is_ok() {
                backoff.reset();
                inner.set_up();
            }
            continue;
        }
        if !retry.is_empty() || inner.has_unpushed() {
            match catch_up(&inner, &mut retry).await {
                Ok(()) => backoff.reset(),
                Err(Outcome::Down(error)) => inner.set_down(&error),
                // Slow, not down (the probe tells): try again after a
                // pause, unless it is time to stop.
                Err(Outcome::Late) => {
                    inner.kick_probe();
                    tokio::select! {
                        () = shutdown.stopped() => {
                            drain(&inner, &mut rx, retry).await;
                            return;
                        }
                        () = tokio::time::sleep(backoff.next_wait()) => {}
                    }
                }
            }
            continue;
        }
        tokio::select! {
            () = shutdown.stopped() => {
                drain(&inner, &mut rx, retry).await;
                return;
            }
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return;
                }
                let (failed, outcome) = run_batch(&inner, std::mem::take(&mut batch)).await;
                retry = failed;
                match outcome {
                    Err(Outcome::Down(error)) => inner.set_down(&error),
                    Err(Outcome::Late) => inner.kick_probe(),
                    Ok(()) => {}
                }
            }
            () = inner.wake.notified() => {}
        }
    }
}

/// Why some jobs are left to run again.
enum Outcome {
    /// A connection error: Redis is down.
    Down(String),
    /// No reply in time (and no connection error).
    Late,
}

/// Runs the jobs left over, then pushes the spend counted in-process;
/// `Ok` if all of it landed (what did not stays in `retry`).
async fn catch_up(inner: &Arc<Inner>, retry: &mut Vec<Job>) -> Result<(), Outcome> {
    let mut jobs = std::mem::take(retry);
    jobs.extend(inner.take_unpushed());
    let mut worst = Ok(());
    for chunk in chunks(jobs) {
        let (failed, outcome) = run_batch(inner, chunk).await;
        retry.extend(failed);
        worst = worse(worst, outcome);
    }
    worst
}

/// A connection error outweighs a late reply.
fn worse(a: Result<(), Outcome>, b: Result<(), Outcome>) -> Result<(), Outcome> {
    match (a, b) {
        (Err(Outcome::Down(e)), _) | (_, Err(Outcome::Down(e))) => Err(Outcome::Down(e)),
        (Err(Outcome::Late), _) | (_, Err(Outcome::Late)) => Err(Outcome::Late),
        (Ok(()), Ok(())) => Ok(()),
    }
}

fn chunks(mut jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut out = Vec::new();
    while jobs.len() > BATCH {
        let rest = jobs.split_off(BATCH);
        out.push(jobs);
        jobs = rest;
    }
    if !jobs.is_empty() {
        out.push(jobs);
    }
    out
}

/// The store is dropped: runs what is queued, best effort, for one command
/// timeout at most (only if Redis answers).
async fn drain(inner: &Arc<Inner>, rx: &mut mpsc::Receiver<Job>, mut jobs: Vec<Job>) {
    if !inner.is_up() {
        return;
    }
    while let Ok(job) = rx.try_recv() {
        jobs.push(job);
    }
    jobs.extend(inner.take_unpushed());
    let all = async {
        for chunk in chunks(jobs) {
            let _ = run_batch(inner, chunk).await;
        }
    };
    let _ = tokio::time::timeout(inner.redis.op_timeout(), all).await;
}

/// Runs `jobs` concurrently; the ones that got no answer, and why.
async fn run_batch(inner: &Arc<Inner>, jobs: Vec<Job>) -> (Vec<Job>, Result<(), Outcome>) {
    let mut set = JoinSet::new();
    for job in jobs {
        let inner = inner.clone();
        set.spawn(async move {
            let done = run_job(&inner, &job).await;
            (job, done)
        });
    }
    let mut failed = Vec::new();
    let mut outcome = Ok(());
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((_, Ok(()))) => {}
            Ok((job, Err(Fail::Down(error)))) => {
                tracing::debug!(error, "quota store: settle got no answer");
                failed.push(job);
                outcome = worse(outcome, Err(Outcome::Down(error)));
            }
            Ok((job, Err(Fail::Late))) => {
                tracing::debug!("quota store: settle got no answer in time; run again");
                failed.push(job);
                outcome = worse(outcome, Err(Outcome::Late));
            }
            Ok((job, Err(Fail::Refused(error)))) => {
                tracing::warn!(
                    prefix = %inner.redis.prefix(),
                    error,
                    job = ?job,
                    "quota store: settle script failed"
                );
            }
            // A panic in a job (none expected): it is lost.
            Err(_) => {}
        }
    }
    (failed, outcome)
}

async fn run_job(inner: &Inner, job: &Job) -> Result<(), Fail> {
    let window_secs = inner.config().window_secs;
    let timeout = inner.write_timeout();
    let settle =
        |tenant: &Tenant, window: u64, id: u64, cost: u64, tokens: u64, mode: &'static str| {
            let mut call = inner.scripts.settle.key(inner.base(tenant));
            call.arg(window)
                .arg(window_secs)
                .arg(id)
                .arg(amount(cost))
                .arg(amount(tokens))
                .arg(mode);
            if mode == "p" {
                // A push counts where a reserve of the tenant would.
                call.key(inner.tenants_key())
                    .key(inner.base(&Inner::overflow()))
                    .arg(inner.named(tenant))
                    .arg(tenant.as_bytes())
                    .arg(inner.config().max_tenants);
            }
            call
        };
    match job {
        Job::Settle {
            tenant,
            window,
            id,
            spent,
        } => {
            let call = settle(tenant, *window, *id, spent.cost.nanos(), spent.tokens, "h");
            inner.invoke::<i64>(&call, timeout).await.map(drop)
        }
        Job::Push {
            tenant,
            window,
            id,
            spent,
        } => {
            let call = settle(tenant, *window, *id, spent.cost.nanos(), spent.tokens, "p");
            inner.invoke::<i64>(&call, timeout).await.map(drop)
        }
        Job::Forget { tenant, window, id } => {
            // The hold, if taken, may be the overflow tenant's (a tenant
            // past `max_tenants`; never a named one).
            let overflow = Inner::overflow();
            let mut tenants = vec![tenant];
            if !inner.config().is_named(tenant.as_bytes()) && *tenant != overflow {
                tenants.push(&overflow);
            }
            for t in tenants {
                for w in [window.saturating_sub(1), *window, window.saturating_add(1)] {
                    let call = settle(t, w, *id, 0, 0, "h");
                    inner.invoke::<i64>(&call, timeout).await?;
                }
            }
            Ok(())
        }
    }
}
