//! Tenant quotas shared between replicas through Redis: exact while Redis
//! answers, and a stated rule while it does not.
//!
//! [`RedisQuota`] is a [`QuotaStore`](tower_llm_cost::QuotaStore) for
//! `tower-llm-cost`: every replica using the same Redis (and prefix)
//! counts every tenant's spend and open holds in one place, so while
//! Redis answers the fleet together never passes a tenant's limits.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_llm_core::{Cost, Tenant};
//! use tower_llm_cost::{Ask, Limits, QuotaConfig, QuotaStore};
//! use tower_llm_cost_redis::RedisQuota;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Limits { max_cost: Cost::from_dollars(10.0), max_tokens: Some(2_000_000) };
//! let config = QuotaConfig::new(Duration::from_secs(86_400), limits);
//! let quota = RedisQuota::builder("redis://127.0.0.1:6379", config)?
//!     .with_replicas(4) // while Redis is down, each replica allows a quarter
//!     .build()?;
//! let acme = Tenant::new(&b"acme"[..]);
//! let ask = Ask { cost: Cost::from_dollars(0.05).unwrap_or_default(), tokens: 4_000 };
//! match quota.reserve(&acme, ask).await {
//!     Ok(hold) => {
//!         // ... the call; then what it really cost:
//!         quota.settle(hold, Ask { cost: Cost::from_nanos(12_500_000), tokens: 1_800 });
//!     }
//!     Err(refusal) => println!("refused: {refusal}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Each tenant's window is two Redis keys, and each step is one Lua
//! script, atomic on the server:
//!
//! - **reserve**: reads the server's clock (`TIME`), so replicas' clocks
//!   do not matter: the window index and hold expiries are the server's.
//!   It picks the keys the tenant counts in (its own, or past
//!   `max_tenants` the overflow tenant's: below), drops the window's
//!   expired holds, adds up what is spent and held,
//!   checks the ask against the tenant's limits (a limit not set is not
//!   checked) and, if it fits, adds the hold, all at once. It answers the
//!   window index (the hold carries it: [`QuotaHold::window`](tower_llm_cost::QuotaHold::window))
//!   or the refusal: which limit, what is left, when the window ends. In
//!   shadow mode it always holds, and marks a hold past a limit
//!   ([`QuotaHold::over_limit`](tower_llm_cost::QuotaHold::over_limit)).
//! - **settle**: releases the hold if it is still there and adds what was
//!   spent to the hold's window, even when the hold expired meanwhile
//!   (and only once, however often the settle is run). It is queued to a
//!   background worker: [`settle`](tower_llm_cost::QuotaStore::settle)
//!   never waits.
//!
//! A reserve runs its script on a task of its own: if the reserve future
//! is dropped (or stops waiting) before the reply, the task still sees
//! the reply and queues the release of what was held. A reserve that got
//! no reply at all queues a release of its hold id in the windows around
//! this replica's clock (on the same connection, so it runs after the
//! script if the script runs at all); failing that, the hold expires
//! after `hold_secs`.
//!
//! Hold ids are unique per replica (a random 63-bit base of the process
//! plus a counter).
//!
//! # Tenants past `max_tenants`
//!
//! Tenant ids come from clients, so the tenants of a window are bounded,
//! as [`MemoryQuota`](tower_llm_cost::MemoryQuota) bounds them: each
//! window has a set of the tenant ids counted apart in it (a Redis set,
//! exact; kept and expiring with the window's keys). The reserve script
//! adds the tenant to it unless it is not there yet, is not named in
//! [`QuotaConfig::tenants`](tower_llm_cost::QuotaConfig::tenants), and the
//! set holds [`max_tenants`](tower_llm_cost::QuotaConfig::max_tenants) ids
//! already: then the tenant is counted together with every other such
//! tenant, as the tenant [`OVERFLOW_TENANT`](tower_llm_cost::OVERFLOW_TENANT),
//! under the default limits, and the hold names that tenant (its settle,
//! or its release, lands there). A named tenant is always counted apart
//! (and, as in `MemoryQuota`, takes a place in the set: a window's set
//! holds at most `max_tenants` plus the named tenants); a tenant counted
//! apart stays so for the rest of the window, and a refused reserve
//! counts its tenant in too. The check and the add are in the same
//! script as the hold: exact and atomic across replicas, never more than
//! `max_tenants` tenants counted apart (named ones aside), O(1) per call
//! (`SISMEMBER`, `SCARD`, `SADD`). Spend counted in-process while Redis
//! was down is pushed to the keys a reserve of its tenant would count in
//! at that moment (the inner `MemoryQuota` bounds its tenants itself,
//! with the same `max_tenants`; which tenants it counted apart may differ
//! from Redis's). [`RedisQuota::shared_usage`] of a tenant counted
//! together reads nothing: read the overflow tenant's.
//!
//! # What is exact, and what is not
//!
//! Exact while Redis answers: concurrent reserves from any number of
//! replicas can never together hold or spend past a limit, because every
//! open hold is counted by the script that admits the next one; a settle
//! counts once; the tenants counted apart in a window are exactly the
//! first `max_tenants` (and the named ones), across replicas. A slow reply is still Redis answering: a reserve waits
//! for it (up to the reserve timeout, below) and stays exact. Amounts are
//! nano-dollars and tokens, counted by Redis as integers; the comparison
//! runs in Lua's doubles, exact up to 2^53 (about 9 million dollars, or
//! 9·10^15 tokens, per tenant and window); larger amounts are cut to it.
//!
//! Not exact: a reserve whose reply has not come within the reserve
//! timeout is counted in-process at the local share, that call alone
//! (below); an attempt may spend more than it held (the store counts
//! at most what was held, as `MemoryQuota` does); a hold nobody settles
//! (a replica that crashed) counts until `hold_secs`; a settle dropped
//! from a full queue (65,536 by default; [`RedisQuota::dropped_settles`],
//! logged) never counts its spend and its hold counts until `hold_secs`;
//! settles still queued when the store is dropped are run for one op
//! timeout at most, the rest lost the same way. Each replica reads the
//! limits from its own [`QuotaConfig`](tower_llm_cost::QuotaConfig):
//! give every replica the same one (with a `max_tenants` of its own, a
//! replica counts new tenants apart up to its own bound). The keys of one
//! window are derived in the scripts from the tenant's base key
//! (`KEYS[1]`), and a reserve touches the window's set of tenants and the
//! overflow tenant's keys too: use a standalone Redis (or one primary),
//! not a cluster.
//!
//! # When Redis is down
//!
//! Slow is not down. Redis counts as down on an error on the connection
//! (refused, reset, closed), or when it does not answer a `PING` within
//! the **op timeout** (250 ms by default;
//! [`RedisQuotaBuilder::with_op_timeout`]). The `PING`s are the
//! **probe**'s, a background task with a connection of its own (so they
//! never wait behind this replica's commands), never the request path's:
//! while reserves are in flight it pings, one at a time and at most one
//! every quarter of the op timeout, and again when a reserve's reply has
//! not come within the op timeout (measured from when the script is
//! handed to the connection).
//!
//! A reserve waits for whichever comes first:
//!
//! - its reply: used, exact, however late;
//! - Redis declared down (by the probe, or an error on the connection):
//!   the call is counted in-process at the local share at once. A frozen
//!   server (`SIGSTOP`, a partition) is found about 1¼ op timeouts after
//!   a reserve is sent (the first `PING` after it froze gets no answer),
//!   and no reserve waits longer than that for it;
//! - the **reserve timeout** (2 s by default;
//!   [`RedisQuotaBuilder::with_reserve_timeout`]) with Redis still
//!   answering `PING`: this call alone is counted in-process at the local
//!   share, the store stays shared, and
//!   [`RedisQuota::late_reserves`] (the
//!   `ai_router_quota_shared_store_late` counter,
//!   [`RedisQuota::register_late_metric`]) counts it, logged (warn) at
//!   the 1st, 2nd, 4th, 8th… A call never waits longer than the reserve
//!   timeout (a caller's deadline, shorter, drops the reserve sooner).
//!
//! Either way, a hold Redis gives later is released in the background,
//! and the spend of a call counted in-process is pushed to Redis once
//! settled (below). Settles are the worker's: a reply later than the
//! reserve timeout (at least the op timeout) makes the worker run the
//! settle again later (it counts once) and ask the probe; only the probe
//! or a connection error makes Redis down.
//!
//! What "slow" covers: this replica's own load (its tasks waiting to
//! run, the queue on its one connection), and a server that answers
//! `PING` but holds scripts back (`CLIENT PAUSE … WRITE`, what the tests
//! use). A server that answers nothing for an op timeout (a long script,
//! `DEBUG SLEEP`, `SIGSTOP`) cannot be told from a dead one in that time,
//! and counts as down: raise the op timeout if such stalls are expected.
//!
//! While Redis is down, the store counts at once, for every call, in an
//! in-process [`MemoryQuota`](tower_llm_cost::MemoryQuota) whose limits
//! are the config's × the **local share** `s`
//! ([`RedisQuotaBuilder::with_local_share`], 0 < s ≤ 1, default 1;
//! [`with_replicas(n)`](RedisQuotaBuilder::with_replicas) sets 1/n).
//! Logged once when it starts (warn) and once when it ends (info);
//! [`RedisQuota::is_shared`] and the `ai_router_quota_shared_store_up`
//! gauge ([`RedisQuota::register_metrics`]) read `false` / 0 meanwhile.
//!
//! **The bound**: with N replicas each holding share s, while Redis is
//! down the fleet may spend up to N·s·limit in a window on top of what
//! Redis counted for it (with s = 1/N, one limit more at most); calls
//! past the reserve timeout count against the same in-process share.
//! With Redis up, concurrent calls can never overspend beyond their open
//! holds, which are counted: exact.
//!
//! The worker pings Redis with backoff (25 ms doubling to 2 s). When it
//! answers, the worker first pushes the spend settled in-process, each
//! amount added to the spent of the window it was in, and only then
//! shares again, so the first reserves back in Redis see it. Best effort:
//! at most 65,536 tenant-windows of it wait (more is counted in-process
//! only, and logged), and a Redis that lost its data (a restart without
//! persistence) lost what it counted before too. Then the settles queued
//! during the outage run: holds taken in Redis before it and settled
//! during it (until they run, those holds count in full, which errs on
//! the safe side; if the queue fills, they are lost as above and their
//! holds expire after `hold_secs`). Holds taken in-process are settled
//! in-process even after Redis is back, and their spend pushed moments
//! later. What a replica spent in-process counts against its share for
//! the rest of the window, across outages.
//!
//! # Keys
//!
//! `{prefix}{t<hex of the tenant id>}:<window>:h` (a hash: spent, held,
//! one field per open hold) and `…:z` (a sorted set of hold expiries);
//! `{prefix}tenants:<window>`, the set of the tenant ids (raw bytes)
//! counted apart in the window; the prefix defaults to
//! `tower-llm:quota:`. Tenant ids are opaque bytes: hex keeps any id apart
//! from any other. All expire one window after their window ends.
//!
//! **The bound**: a window has at most `1 + 2·(max_tenants + named + 1)`
//! keys (its set, two per tenant counted apart, two for the overflow
//! tenant), whatever ids clients send; a window's keys live until the end
//! of the next one, so at most twice that at once. With the default
//! `max_tenants` (100,000) and ids of at most 256 bytes (what the gateway
//! accepts), a window's set holds at most 25.6 MB of ids (plus Redis's
//! overhead per member).
//!
//! The URL handling, the reconnection backoff and the probe's connection
//! are [`tower_llm_redis`]'s, shared with every Redis-backed store of
//! tower-llm; the connection of reserves and settles is made from its
//! client, connecting within the op timeout but with no response timeout
//! of its own (each caller bounds its wait, as above).
//!
//! # Feature flags
//!
//! None.

mod builder;
mod error;
mod inner;
mod local;
mod probe;
mod reserve;
mod scripts;
mod store;
mod worker;

pub use builder::RedisQuotaBuilder;
pub use error::RedisQuotaError;
pub use store::{RedisQuota, Usage};
