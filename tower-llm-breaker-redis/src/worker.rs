//! The background tasks: one writes to Redis from the queue (and resyncs),
//! one listens to the channel. Nothing here is ever awaited by a call.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower_llm_breaker::{BreakerStore, CircuitState, TransitionReason};
use tower_llm_redis::{Backoff, ShutdownSignal, Subscriber};

use crate::entry::{Entry, Job, Tickets};
use crate::fleet::{Fleet, FleetState, Reply, fleet_of_fields, parse_message, parse_reply};
use crate::inner::Inner;
use crate::link::{Link, Op};
use crate::scripts::Scripts;

/// Adopts a newer shared state into the local circuit.
pub(crate) fn adopt(inner: &Inner, entry: &Arc<Entry>, fleet: &Fleet) {
    if fleet.state == FleetState::Failing {
        entry.dirty.store(true, Ordering::Release);
        return;
    }
    let seen = entry
        .generation
        .fetch_max(fleet.generation, Ordering::AcqRel);
    if fleet.generation <= seen {
        return;
    }
    let Some(circuit) = inner.local.find(&entry.key) else {
        return;
    };
    *entry.tickets() = Tickets::default();
    let transition = match fleet.state {
        FleetState::Open => {
            entry.dirty.store(false, Ordering::Release);
            if fleet.rest > Duration::ZERO {
                schedule_reserve(entry, fleet.rest);
            }
            // Already half-open here with the shared cooldown over: keep
            // the local probes.
            let half_open_over = fleet.rest.is_zero() && circuit.state() == CircuitState::HalfOpen;
            if half_open_over {
                None
            } else {
                circuit.adopt_open(fleet.rest, fleet.reopens, fleet.reason)
            }
        }
        FleetState::Closed => {
            entry.dirty.store(false, Ordering::Release);
            circuit.adopt_closed(fleet.reason)
        }
        FleetState::Isolated => circuit.adopt_isolated(),
        FleetState::Failing => None,
    };
    if let Some(t) = transition {
        tracing::info!(
            provider = t.key.provider(),
            model = t.key.model(),
            from = t.from.as_metric_label(),
            to = t.to.as_metric_label(),
            reason = t.reason.as_metric_label(),
            "circuit state adopted from the shared store"
        );
        if let Some(observer) = &inner.observer {
            observer(&t);
        }
    }
}

/// Asks for one probe token when the shared cooldown ends: every replica
/// that knows the circuit does, so with `half_open_probes` above 1 the
/// tokens spread over several replicas; one that runs out while calls
/// wait asks for more ([`Entry::kick`]).
fn schedule_reserve(entry: &Arc<Entry>, after: Duration) {
    entry.reserving.store(true, Ordering::Release);
    let entry = entry.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        if !entry.send_always(Op::Reserve { want: 1 }) {
            entry.reserving.store(false, Ordering::Release);
        }
    });
}

/// After a read: adopt a newer shared state, or push what this replica
/// decided alone (while Redis was away) if the shared state lags.
fn reconcile(inner: &Inner, entry: &Arc<Entry>, fleet: &Fleet) -> Option<Op> {
    if fleet.generation > entry.generation.load(Ordering::Acquire) {
        adopt(inner, entry, fleet);
        return None;
    }
    let circuit = inner.local.find(&entry.key)?;
    let local = circuit.snapshot();
    match (local.state, fleet.state) {
        (CircuitState::Isolated, FleetState::Isolated) => None,
        (CircuitState::Isolated, _) => Some(Op::Isolate),
        (CircuitState::Open, FleetState::Closed) if local.retry_after.is_some() => Some(Op::Trip {
            reason: "consecutive_failures",
        }),
        (CircuitState::HalfOpen, FleetState::Closed) => {
            // A forgotten (expired) key reads closed.
            circuit.adopt_closed(TransitionReason::ProbesSucceeded);
            None
        }
        // Closed here since the shared open was adopted (by hand, or by
        // probes admitted while Redis was away).
        (CircuitState::Closed, FleetState::Open | FleetState::Isolated) => {
            Some(Op::Close { reason: "resync" })
        }
        _ => None,
    }
}

/// The writer: runs the queue's ops one at a time, each bounded by the op
/// timeout; an error or timeout marks Redis down (local rules at once);
/// while down, pings with backoff; when back, resyncs every circuit.
pub(crate) async fn writer(
    inner: Weak<Inner>,
    link: Arc<Link>,
    mut conn: ConnectionManager,
    mut rx: mpsc::Receiver<Job>,
    mut shutdown: ShutdownSignal,
    mut resync: mpsc::Receiver<()>,
) {
    let scripts = Scripts::new();
    let args = link.settings.script_args();
    let mut backoff = link.settings.redis.backoff();
    let mut retry_at = Instant::now();
    let mut tick = tokio::time::interval(link.settings.resync_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut up = false;
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            job = rx.recv() => {
                let Some(job) = job else { return };
                let Some(inner) = inner.upgrade() else { return };
                if !up {
                    release_reserving(&job);
                    continue;
                }
                if run(&inner, &mut conn, &scripts, &args, &job).await.is_err() {
                    release_reserving(&job);
                    up = false;
                    retry_at = went_down(&link, &mut backoff);
                }
            }
            _ = tokio::time::sleep_until(retry_at), if !up => {
                if tower_llm_redis::ping(&mut conn, link.settings.redis.op_timeout()).await {
                    up = true;
                    link.set_cmd_up(true);
                    let Some(inner) = inner.upgrade() else { return };
                    if resync_all(&inner, &mut conn, &scripts, &args).await.is_err() {
                        up = false;
                        link.set_cmd_up(false);
                    }
                }
                if !up {
                    retry_at = Instant::now() + backoff.next_wait();
                }
            }
            Some(()) = resync.recv() => {
                // The subscription came back: messages may have been missed.
                if up {
                    let Some(inner) = inner.upgrade() else { return };
                    if resync_all(&inner, &mut conn, &scripts, &args).await.is_err() {
                        up = false;
                        retry_at = went_down(&link, &mut backoff);
                    }
                }
            }
            _ = tick.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                if up && resync_all(&inner, &mut conn, &scripts, &args).await.is_err() {
                    up = false;
                    retry_at = went_down(&link, &mut backoff);
                }
            }
        }
    }
}

/// Redis stopped answering: local rules at once; the first ping after
/// the shortest wait. When to ping.
fn went_down(link: &Link, backoff: &mut Backoff) -> Instant {
    link.set_cmd_up(false);
    backoff.reset();
    Instant::now() + backoff.next_wait()
}

fn release_reserving(job: &Job) {
    if matches!(job.op, Op::Reserve { .. }) {
        job.entry.reserving.store(false, Ordering::Release);
    }
}

#[derive(Debug)]
struct Down;

/// Runs one op and applies its reply.
async fn run(
    inner: &Inner,
    conn: &mut ConnectionManager,
    scripts: &Scripts,
    args: &[String],
    job: &Job,
) -> Result<(), Down> {
    let entry = &job.entry;
    let link = &entry.link;
    let (script, extra): (&redis::Script, Vec<String>) = match &job.op {
        Op::Failure { successes } => (&scripts.failure, vec![successes.to_string()]),
        Op::Success { successes, reset } => (
            &scripts.success,
            vec![successes.to_string(), if *reset { "1" } else { "0" }.into()],
        ),
        Op::Trip { reason } => (&scripts.trip, vec![(*reason).to_owned()]),
        Op::Reserve { want } => (
            &scripts.reserve,
            vec![want.to_string(), link.settings.replica.clone()],
        ),
        Op::Probe { token, result } => (
            &scripts.probe,
            vec![token.clone(), result.as_str().to_owned()],
        ),
        Op::Close { reason } => (&scripts.close, vec![(*reason).to_owned()]),
        Op::Isolate => (&scripts.isolate, Vec::new()),
        Op::Sync => (&scripts.read, Vec::new()),
    };
    let reply = invoke(
        conn,
        script,
        entry,
        &link.settings.channel,
        args,
        &extra,
        link,
    )
    .await?;
    let Some(reply) = parse_reply(&reply) else {
        tracing::warn!(reply = ?reply, "shared breaker store: unexpected script reply");
        return Ok(());
    };
    match (&job.op, reply) {
        (Op::Sync, Reply::State(fleet)) => {
            if let Some(op) = reconcile(inner, entry, &fleet) {
                let next = Job {
                    entry: entry.clone(),
                    op,
                };
                Box::pin(run(inner, conn, scripts, args, &next)).await?;
            }
        }
        (
            Op::Reserve { .. },
            Reply::Reserved {
                generation,
                cooldown,
                tokens,
            },
        ) => {
            // Tokens of a half-open period already over (a newer open was
            // adopted meanwhile) are void: Redis dropped them with it.
            if generation >= entry.generation.load(Ordering::Acquire) {
                let mut tickets = entry.tickets();
                tickets.free.extend(tokens);
                tickets.expires = Some(Instant::now() + cooldown);
            }
            entry.reserving.store(false, Ordering::Release);
        }
        (Op::Reserve { .. }, Reply::State(fleet)) => {
            entry.reserving.store(false, Ordering::Release);
            adopt(inner, entry, &fleet);
            // Still cooling down here: ask again when it ends.
            if fleet.state == FleetState::Open && !fleet.rest.is_zero() {
                schedule_reserve(entry, fleet.rest);
            }
        }
        (Op::Reserve { .. }, _) => entry.reserving.store(false, Ordering::Release),
        (_, Reply::State(fleet)) => adopt(inner, entry, &fleet),
        (_, Reply::Counted | Reply::Nothing | Reply::Reserved { .. }) => {}
    }
    Ok(())
}

async fn invoke(
    conn: &mut ConnectionManager,
    script: &redis::Script,
    entry: &Entry,
    channel: &str,
    args: &[String],
    extra: &[String],
    link: &Link,
) -> Result<Vec<String>, Down> {
    let mut call = script.key(&entry.hash_key);
    call.key(&entry.probes_key).arg(channel).arg(&entry.id);
    for a in args.iter().chain(extra) {
        call.arg(a);
    }
    match tokio::time::timeout(link.settings.redis.op_timeout(), call.invoke_async(conn)).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(e)) if !is_connection_error(&e) => {
            // The server answered with an error: a bug, not an outage.
            tracing::warn!(error = %e, "shared breaker store: script failed");
            Ok(vec!["N".to_owned()])
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "shared breaker store: command failed");
            Err(Down)
        }
        Err(_) => Err(Down),
    }
}

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

/// Reads every circuit's shared state and reconciles (one pipelined round
/// trip per 256 circuits); flushes pending successes first.
async fn resync_all(
    inner: &Inner,
    conn: &mut ConnectionManager,
    scripts: &Scripts,
    args: &[String],
) -> Result<(), Down> {
    let entries = inner.entries();
    for entry in &entries {
        let successes = entry.successes.swap(0, Ordering::AcqRel);
        if successes > 0 {
            let job = Job {
                entry: entry.clone(),
                op: Op::Success {
                    successes,
                    reset: entry.dirty.swap(false, Ordering::AcqRel),
                },
            };
            run(inner, conn, scripts, args, &job).await?;
        }
    }
    let timeout = inner.link().settings.redis.op_timeout();
    for chunk in entries.chunks(256) {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for entry in chunk {
            pipe.cmd("HMGET")
                .arg(&entry.hash_key)
                .arg(&["st", "until", "re", "gen", "why"]);
        }
        let replies = match tokio::time::timeout(
            timeout,
            pipe.query_async::<Vec<redis::Value>>(conn),
        )
        .await
        {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) if !is_connection_error(&e) => {
                tracing::warn!(error = %e, "shared breaker store: resync failed");
                return Ok(());
            }
            Ok(Err(_)) | Err(_) => return Err(Down),
        };
        let mut replies = replies.into_iter();
        let now = replies
            .next()
            .and_then(|v| redis::from_redis_value::<(u64, u64)>(v).ok())
            .map(|(secs, micros)| secs * 1000 + micros / 1000);
        let Some(now) = now else { return Ok(()) };
        for (entry, reply) in chunk.iter().zip(replies) {
            let fields = redis::from_redis_value::<Vec<Option<String>>>(reply).unwrap_or_default();
            let Some(fleet) = fleet_of_fields(&fields, now) else {
                continue;
            };
            if let Some(op) = reconcile(inner, entry, &fleet) {
                let job = Job {
                    entry: entry.clone(),
                    op,
                };
                run(inner, conn, scripts, args, &job).await?;
            }
        }
    }
    Ok(())
}

/// The channel's side of the store (run by [`tower_llm_redis::listen`]):
/// adopts every message at once, and asks the writer to resync each time
/// the subscription is back (messages may have been missed).
pub(crate) struct Listener {
    pub(crate) inner: Weak<Inner>,
    pub(crate) link: Arc<Link>,
    pub(crate) resync: mpsc::Sender<()>,
}

impl Subscriber for Listener {
    fn on_subscribed(&mut self) {
        self.link.set_sub_up(true);
        let _ = self.resync.try_send(());
    }

    fn on_message(&mut self, payload: &[u8]) -> ControlFlow<()> {
        let Some(inner) = self.inner.upgrade() else {
            return ControlFlow::Break(());
        };
        if let Some((id, fleet)) = std::str::from_utf8(payload).ok().and_then(parse_message) {
            if let Some(entry) = inner.entry(id) {
                adopt(&inner, &entry, &fleet);
            }
        }
        ControlFlow::Continue(())
    }

    fn on_unsubscribed(&mut self) {
        self.link.set_sub_up(false);
    }
}
