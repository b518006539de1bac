//! What the local circuits share with the background tasks: the queue to
//! Redis, whether Redis is up, and the settings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tower_llm_breaker::BreakerConfig;

use crate::entry::Entry;

/// The settings every script and task reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) channel: String,
    pub(crate) breaker: BreakerConfig,
    pub(crate) op_timeout: Duration,
    pub(crate) resync_every: Duration,
    pub(crate) key_ttl: Duration,
    pub(crate) max_backoff: Duration,
    /// This store's name in probe tokens.
    pub(crate) replica: String,
}

impl Settings {
    /// `ARGV[3..=11]` of every script (see `scripts.rs`).
    pub(crate) fn script_args(&self) -> Vec<String> {
        let b = &self.breaker;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).to_string();
        let (ratio, min_calls, window) = match b.failure_ratio {
            Some(r) => (r.ratio, r.min_calls, r.window),
            None => (0.0, 0, Duration::ZERO),
        };
        vec![
            ms(self.key_ttl),
            b.consecutive_failures.to_string(),
            ratio.to_string(),
            min_calls.to_string(),
            ms(window),
            ms(b.cooldown),
            b.cooldown_growth.to_string(),
            ms(b.max_cooldown.max(b.cooldown)),
            b.half_open_probes.max(1).to_string(),
        ]
    }
}

/// How a probe ended, for Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeResult {
    Ok,
    Fail,
    Release,
}

impl ProbeResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Ok => "ok",
            ProbeResult::Fail => "fail",
            ProbeResult::Release => "release",
        }
    }
}

/// One write (or read) for the worker.
#[derive(Debug)]
pub(crate) enum Op {
    Failure {
        successes: u32,
    },
    /// `reset`: also reset the shared consecutive count.
    Success {
        successes: u32,
        reset: bool,
    },
    Trip {
        reason: &'static str,
    },
    /// Reserve up to `want` probe tokens.
    Reserve {
        want: u32,
    },
    Probe {
        token: String,
        result: ProbeResult,
    },
    Close {
        reason: &'static str,
    },
    Isolate,
    /// Read the shared state and reconcile (a new circuit, a resync).
    Sync,
}

/// An op and the circuit it is about.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) entry: Arc<Entry>,
    pub(crate) op: Op,
}

/// Shared by every entry and the background tasks.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) tx: mpsc::Sender<Job>,
    pub(crate) settings: Settings,
    /// Commands answer.
    cmd_up: AtomicBool,
    /// The pub/sub subscription is live.
    sub_up: AtomicBool,
    /// Reports dropped because the queue was full.
    pub(crate) dropped: AtomicU64,
}

impl Link {
    pub(crate) fn new(tx: mpsc::Sender<Job>, settings: Settings) -> Self {
        Link {
            tx,
            settings,
            cmd_up: AtomicBool::new(false),
            sub_up: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        }
    }

    /// Redis answers commands and the subscription is live: shared rules
    /// apply. Otherwise each replica breaks on its own.
    pub(crate) fn is_up(&self) -> bool {
        self.cmd_up.load(Ordering::Acquire) && self.sub_up.load(Ordering::Acquire)
    }

    /// Queues `op` unless Redis is down (then local rules apply and the
    /// resync reconciles later). Never waits: a full queue drops the op
    /// and counts it. `false` if not queued.
    pub(crate) fn send(&self, entry: &Arc<Entry>, op: Op) -> bool {
        if !self.is_up() {
            return false;
        }
        let job = Job {
            entry: entry.clone(),
            op,
        };
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Queues `op` whether or not Redis is up (a read or a reservation that
    /// the worker itself schedules).
    pub(crate) fn send_always(&self, entry: &Arc<Entry>, op: Op) -> bool {
        let job = Job {
            entry: entry.clone(),
            op,
        };
        self.tx.try_send(job).is_ok()
    }

    pub(crate) fn set_cmd_up(&self, up: bool) {
        let before = self.is_up();
        self.cmd_up.store(up, Ordering::Release);
        self.log_change(before);
    }

    pub(crate) fn set_sub_up(&self, up: bool) {
        let before = self.is_up();
        self.sub_up.store(up, Ordering::Release);
        self.log_change(before);
    }

    /// Logs once per change between shared and local-only.
    fn log_change(&self, before: bool) {
        let now = self.is_up();
        if before && !now {
            tracing::warn!(
                prefix = %self.settings.prefix,
                "shared breaker store down: each replica breaks on its own until it is back"
            );
        } else if !before && now {
            tracing::info!(prefix = %self.settings.prefix, "shared breaker store up");
        }
    }
}
