//! A reserve on Redis: the script runs on a task of its own, and the
//! caller waits for its reply, for the store to be declared down, or for
//! the reserve timeout, whichever comes first.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tower_llm_core::{Cost, Tenant};
use tower_llm_cost::{Ask, Exhausted, Limits, QuotaHold, QuotaRefusal};

use crate::inner::{Fail, Inner, Job, MAX_AMOUNT, classify};
use crate::scripts::Reserved;

type Reply = Result<Reserved, Fail>;

/// Why a reserve stopped waiting for its reply.
enum GaveUp {
    /// The store was declared down (a connection error, or the probe got
    /// no PONG within the op timeout).
    Down,
    /// The reserve timeout passed.
    Late,
}

impl Inner {
    /// A reserve on Redis, or in-process at the local share when Redis
    /// is down (or declared down while this call waits), or when the
    /// reply does not come within the reserve timeout.
    pub(crate) async fn reserve(
        self: Arc<Self>,
        tenant: Tenant,
        ask: Ask,
    ) -> Result<QuotaHold, QuotaRefusal> {
        let deadline = Instant::now() + self.reserve_timeout;
        let mut up = self.up.subscribe();
        if !*up.borrow_and_update() {
            return self.local_reserve(&tenant, ask);
        }
        let id = self.next_id();
        let limits = self.config.limits_of(tenant.as_bytes());
        // The script runs on a task of its own: if this future is dropped
        // (or stops waiting) before the reply, the task still sees the
        // reply and releases what was held.
        let (tx, rx) = oneshot::channel();
        self.runtime.spawn(
            self.clone()
                .reserve_task(tenant.clone(), id, ask, limits, tx),
        );
        let mut pending = Pending {
            rx,
            seen: false,
            inner: self.clone(),
            tenant: tenant.clone(),
            id,
        };
        let gave_up = tokio::select! {
            biased;
            reply = &mut pending.rx => {
                pending.seen = true;
                return match reply {
                    Ok(reply) => self.answer(tenant, id, ask, &limits, reply),
                    // The task is gone (the runtime shuts down).
                    Err(_) => self.local_reserve(&tenant, ask),
                };
            }
            _ = up.wait_for(|up| !*up) => GaveUp::Down,
            () = tokio::time::sleep_until(deadline) => GaveUp::Late,
        };
        // A reply that came meanwhile is used; after `close` the task
        // sees none is awaited, and releases a late hold itself.
        pending.rx.close();
        if let Ok(reply) = pending.rx.try_recv() {
            pending.seen = true;
            return self.answer(tenant, id, ask, &limits, reply);
        }
        if matches!(gave_up, GaveUp::Late) && self.is_up() {
            self.count_late();
        }
        self.local_reserve(&tenant, ask)
    }

    /// Runs the script, tells the caller (if it still waits), and cleans
    /// up: a hold nobody saw is released, a reserve without a reply
    /// forgotten, a connection error declares Redis down.
    async fn reserve_task(
        self: Arc<Self>,
        tenant: Tenant,
        id: u64,
        ask: Ask,
        limits: Limits,
        tx: oneshot::Sender<Reply>,
    ) {
        let reply = self.call_reserve(&tenant, id, ask, &limits).await;
        match &reply {
            Err(Fail::Down(error)) => {
                self.forget(tenant.clone(), id);
                self.set_down(error);
            }
            Err(Fail::Late) => self.forget(tenant.clone(), id),
            Ok(_) | Err(Fail::Refused(_)) => {}
        }
        if let Err(Ok(r)) = tx.send(reply) {
            self.release(tenant, &r, id);
        }
    }

    /// The script, its reply awaited from when it is handed to the
    /// connection: at the op timeout the probe is asked whether Redis
    /// answers; past the reserve timeout (at least the op timeout) the
    /// reply is [`Fail::Late`].
    async fn call_reserve(&self, tenant: &Tenant, id: u64, ask: Ask, limits: &Limits) -> Reply {
        let limit = |l: Option<u64>| l.map(|l| l.min(MAX_AMOUNT).to_string()).unwrap_or_default();
        let mut call = self.scripts.reserve.key(self.base(tenant));
        call.key(self.tenants_key())
            .key(self.base(&Self::overflow()))
            .arg(self.config.window_secs)
            .arg(self.config.hold_secs.saturating_mul(1000))
            .arg(id)
            .arg(ask.cost.nanos().min(MAX_AMOUNT))
            .arg(ask.tokens.min(MAX_AMOUNT))
            .arg(limit(limits.max_cost.map(Cost::nanos)))
            .arg(limit(limits.max_tokens))
            .arg(if self.config.shadow { "1" } else { "0" })
            .arg(self.named(tenant))
            .arg(tenant.as_bytes())
            .arg(self.config.max_tenants);
        let mut conn = self.conn.clone();
        let sent = Instant::now();
        let op_timeout = self.redis.op_timeout();
        let reply = call.invoke_async::<Vec<i64>>(&mut conn);
        tokio::pin!(reply);
        // A command in flight: the probe checks Redis answers (paced), so
        // a frozen server is found about one op timeout after it froze.
        self.kick_probe();
        let reply = tokio::select! {
            biased;
            reply = &mut reply => reply,
            () = tokio::time::sleep_until(sent + op_timeout) => {
                // Late: slow is not down. The probe tells; meanwhile wait.
                self.kick_probe();
                let last = sent + self.reserve_timeout.max(op_timeout);
                match tokio::time::timeout_at(last, &mut reply).await {
                    Ok(reply) => reply,
                    Err(_) => return Err(Fail::Late),
                }
            }
        };
        let reply = classify(reply)?;
        Reserved::parse(&reply).ok_or_else(|| Fail::Refused(format!("malformed reply {reply:?}")))
    }

    /// The caller's answer from the script's reply.
    fn answer(
        &self,
        tenant: Tenant,
        id: u64,
        ask: Ask,
        limits: &Limits,
        reply: Reply,
    ) -> Result<QuotaHold, QuotaRefusal> {
        let r = match reply {
            Ok(r) => r,
            // Declared down by the task (and the hold forgotten).
            Err(Fail::Down(_)) => return self.local_reserve(&tenant, ask),
            Err(Fail::Late) => {
                if self.is_up() {
                    self.count_late();
                }
                return self.local_reserve(&tenant, ask);
            }
            Err(Fail::Refused(error)) => {
                tracing::warn!(
                    prefix = %self.redis.prefix(),
                    error,
                    "quota store: reserve script failed; this call is counted in-process"
                );
                return self.local_reserve(&tenant, ask);
            }
        };
        let refusal = match r.exhausted {
            0 => None,
            e => {
                let used = Ask {
                    cost: Cost::from_nanos(r.used.0),
                    tokens: r.used.1,
                };
                Some(QuotaRefusal {
                    exhausted: if e == 1 {
                        Exhausted::Cost
                    } else {
                        Exhausted::Tokens
                    },
                    left: limits.left(used),
                    resets_in: Duration::from_millis(r.resets_in_ms),
                })
            }
        };
        // Past `max_tenants`, the hold is the overflow tenant's: its
        // settle (or release) lands in the keys it was taken in.
        let tenant = if r.overflow { Self::overflow() } else { tenant };
        let hold = QuotaHold::new(tenant, r.window, id, ask);
        match (r.held, refusal) {
            (true, None) => Ok(hold),
            (true, Some(refusal)) => Ok(hold.over_limit(refusal)),
            (false, Some(refusal)) => Err(refusal),
            // Refused without a reason: never sent by the script.
            (false, None) => Err(QuotaRefusal {
                exhausted: Exhausted::Cost,
                left: Ask::default(),
                resets_in: Duration::from_millis(r.resets_in_ms),
            }),
        }
    }

    /// A reserve waited the reserve timeout while Redis was not declared
    /// down: this call counts in-process; counted, and logged at powers
    /// of two.
    fn count_late(&self) {
        let n = self.late.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                prefix = %self.redis.prefix(),
                late = n,
                reserve_timeout = ?self.reserve_timeout,
                local_share = self.share.get(),
                "quota store: a reserve got no reply within the reserve timeout while Redis answers PING; that call is counted in-process at the local share, the store stays shared"
            );
        }
    }

    /// Releases a hold Redis gave that nobody will use (in the overflow
    /// tenant's keys if it was taken there).
    fn release(&self, tenant: Tenant, r: &Reserved, id: u64) {
        if r.held {
            self.enqueue(Job::Settle {
                tenant: if r.overflow { Self::overflow() } else { tenant },
                window: r.window,
                id,
                spent: Ask::default(),
            });
        }
    }

    /// Queues the release of a hold that may have been taken unseen.
    fn forget(&self, tenant: Tenant, id: u64) {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let (window, _) = self.config.window_at(unix);
        self.enqueue(Job::Forget { tenant, window, id });
    }
}

/// The caller's end of a reserve's reply. Dropped unseen (the reserve
/// future dropped): a reply already sent is released, and the task
/// releases one that comes later.
struct Pending {
    rx: oneshot::Receiver<Reply>,
    /// The reply was taken: nothing to release.
    seen: bool,
    inner: Arc<Inner>,
    tenant: Tenant,
    id: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.seen {
            return;
        }
        self.rx.close();
        if let Ok(Ok(r)) = self.rx.try_recv() {
            self.inner.release(self.tenant.clone(), &r, self.id);
        }
    }
}
