//! What the local circuits share with the background tasks: the settings,
//! the ops they queue, whether Redis is up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tower_llm_breaker::BreakerConfig;
use tower_llm_redis::RedisSettings;

/// The settings every script and task reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The server, the prefix, the command timeout, the backoff.
    pub(crate) redis: RedisSettings,
    pub(crate) channel: String,
    pub(crate) breaker: BreakerConfig,
    pub(crate) resync_every: Duration,
    pub(crate) key_ttl: Duration,
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

/// Shared by every entry and the background tasks.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) settings: Settings,
    /// Commands answer.
    cmd_up: AtomicBool,
    /// The pub/sub subscription is live.
    sub_up: AtomicBool,
    /// Reports dropped because the queue was full.
    pub(crate) dropped: AtomicU64,
}

impl Link {
    pub(crate) fn new(settings: Settings) -> Self {
        Link {
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
                prefix = %self.settings.redis.prefix(),
                "shared breaker store down: each replica breaks on its own until it is back"
            );
        } else if !before && now {
            tracing::info!(prefix = %self.settings.redis.prefix(), "shared breaker store up");
        }
    }
}
