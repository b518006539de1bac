//! [`Pool`]: deployments of one model behind one link.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::ServiceExt as _;
use tower_llm_core::layer::{AttemptLogExt as _, MetricsExt as _};
use tower_llm_core::telemetry::Metrics;
use tower_llm_core::{AttemptLog, ChatRequest, Deadline, Failure, FailureClass, Link, LlmRequest};
use tower_llm_retry::{RandomSource, SplitMix64};
use tower_service::Service;

use crate::load::{DeploymentLoad, LoadSnapshot};
use crate::pacer::Pacer;

/// A request a pool can send to any of its deployments: it can be copied
/// and told which model the deployment knows it by.
pub trait PoolRequest: LlmRequest + Clone + Send + 'static {
    /// Sends the request as `model`.
    fn set_model(&mut self, model: &Arc<str>);

    /// The model the request asks for, when it says.
    fn model(&self) -> Option<Arc<str>> {
        None
    }

    /// The tokens it will use, as far as it can tell before it is sent
    /// (for pacing): an upper bound of its input and its output cap (its
    /// input alone without one: the rest is taken when it settles).
    /// `None` when it cannot say.
    fn estimated_tokens(&self) -> Option<u64> {
        None
    }
}

impl PoolRequest for ChatRequest {
    fn set_model(&mut self, model: &Arc<str>) {
        self.model = model.clone();
    }

    fn model(&self) -> Option<Arc<str>> {
        Some(self.model.clone())
    }

    fn estimated_tokens(&self) -> Option<u64> {
        // Without an output cap, the input: what is used past it is taken
        // when the call settles.
        let input = tower_llm_core::input_tokens_bound(&self.messages, &self.tools);
        Some(input + self.max_tokens.map_or(0, u64::from))
    }
}

/// One deployment of a pool: a name (its provider's name: the breaker key,
/// the attempt record's provider, the metrics' label), the model it serves
/// the pool's model as (when it differs), a weight, its pacing, and the
/// service that calls it.
pub struct Deployment<S> {
    name: Arc<str>,
    model: Option<Arc<str>>,
    weight: u32,
    pacer: Option<Arc<Pacer>>,
    load: Option<Arc<DeploymentLoad>>,
    service: S,
}

impl<S> fmt::Debug for Deployment<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deployment")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("weight", &self.weight)
            .field("pacer", &self.pacer)
            .finish_non_exhaustive()
    }
}

impl<S> Deployment<S> {
    /// The deployment `name` (its provider's name), called through
    /// `service`, of weight 1, unpaced.
    pub fn new(name: impl Into<Arc<str>>, service: S) -> Self {
        Deployment {
            name: name.into(),
            model: None,
            weight: 1,
            pacer: None,
            load: None,
            service,
        }
    }

    /// Tracks this deployment's load in `load` (share one among the pools
    /// that send to the same deployment).
    #[must_use]
    pub fn with_load(mut self, load: Arc<DeploymentLoad>) -> Self {
        self.load = Some(load);
        self
    }

    /// Sends the pool's requests to this deployment as `model` (an Azure
    /// deployment name, a regional model id).
    #[must_use]
    pub fn with_model(mut self, model: impl Into<Arc<str>>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Chosen `weight` times as often as a deployment of weight 1 (at
    /// least 1).
    #[must_use]
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    /// Paced by `pacer` (share it with whatever observes the deployment's
    /// rate-limit headers). A shared pacer ([`Pacer::with_shared`]) also
    /// takes from the fleet's buckets, awaited after this replica's have
    /// room; what a request did not use goes back to both.
    #[must_use]
    pub fn with_pacer(mut self, pacer: Arc<Pacer>) -> Self {
        self.pacer = Some(pacer);
        self
    }
}

/// The most deployments a pool uses (those past it are ignored; the
/// policy refuses more).
pub const MAX_DEPLOYMENTS: usize = 64;

/// The calls a pool lets wait for room, by default.
const DEFAULT_MAX_WAITING: usize = 256;

/// How a pool picks a deployment.
pub(crate) struct Member<S> {
    pub(crate) name: Arc<str>,
    pub(crate) model: Option<Arc<str>>,
    pub(crate) weight: u32,
    pub(crate) pacer: Option<Arc<Pacer>>,
    pub(crate) service: S,
    pub(crate) load: Arc<DeploymentLoad>,
}

/// A key a request is kept on one deployment by (sticky affinity): the
/// same key goes to the same deployment while it can take calls, so a
/// provider's prompt cache stays warm.
pub type AffinityFn<R> = Arc<dyn Fn(&R) -> Option<u64> + Send + Sync>;

/// Deployments of one model behind one link.
///
/// Each call goes to one deployment, chosen by power of two choices: two
/// deployments drawn at random (by weight) among those that can take the
/// call now, and the one with the lower load score wins (moving average
/// of latency × (calls in flight + 1) × a penalty for recent failures,
/// over its weight). With [`with_affinity`](Self::with_affinity), a
/// request's key picks its deployment instead (rendezvous hashing by
/// weight), while that deployment can take calls.
///
/// A deployment's own fault moves the call to another deployment at
/// once, within the same attempt: a 429, a 5xx or connection failure, an
/// open circuit, the account's quota, or its pacing. The call fails only
/// when no deployment can take it, with the last fault (a 429 whose
/// `retry_after` is the soonest any deployment has room, when every one
/// is paced). Anything else (a bad request, a timeout of the attempt) is
/// the call's own and returns at once.
///
/// The deployment that served (or failed last) names the attempt's
/// record (`provider`), and is the [`Link`] its service sees (its
/// circuit breaker keys on it).
pub struct Pool<S, R = ChatRequest> {
    members: Arc<[Member<S>]>,
    random: Arc<dyn RandomSource>,
    affinity: Option<AffinityFn<R>>,
    metrics: Metrics,
    queue: Arc<Queue<R>>,
}

/// How urgent a call is, when every deployment is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Priority {
    /// Waits for room, like a normal call.
    High,
    /// Waits for room within its deadline and the pool's queue.
    #[default]
    Normal,
    /// Background work: never waits; it fails (and fails over) at once
    /// when no deployment has room, so it is shed before the others.
    Low,
}

/// How a pool tells a call's [`Priority`].
pub type PriorityFn<R> = Arc<dyn Fn(&R) -> Priority + Send + Sync>;

/// The calls waiting for room in a pool: at most `max`, each at most
/// `max_wait` and never past its deadline.
pub(crate) struct Queue<R> {
    max: usize,
    max_wait: std::time::Duration,
    waiting: std::sync::atomic::AtomicUsize,
    priority: Option<PriorityFn<R>>,
    /// Whose turn it is to wait for room: tokio's mutex is fair, so
    /// waiters take their turns in order of arrival.
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// A place in a pool's queue, given back when dropped, and the instant
/// past which its call waits no more (`max_wait` after it came in).
pub(crate) struct Waiting<'a, R>(&'a Queue<R>, Instant);

impl<R> Drop for Waiting<'_, R> {
    fn drop(&mut self) {
        self.0
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl<R: LlmRequest> Queue<R> {
    /// A place to wait until `at` for `req`, if it may wait that long.
    fn admit(&self, req: &R, at: Instant, now: Instant) -> Option<Waiting<'_, R>> {
        use std::sync::atomic::Ordering;
        let wait = at.saturating_duration_since(now);
        if wait > self.max_wait
            || self
                .priority
                .as_ref()
                .is_some_and(|p| p(req) == Priority::Low)
            || Deadline::of(req).is_some_and(|d| d.remaining() <= wait)
        {
            return None;
        }
        let mut n = self.waiting.load(Ordering::Acquire);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .waiting
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Waiting(self, now + self.max_wait)),
                Err(seen) => n = seen,
            }
        }
    }
}

impl<S, R> Clone for Pool<S, R> {
    fn clone(&self) -> Self {
        Pool {
            members: self.members.clone(),
            random: self.random.clone(),
            affinity: self.affinity.clone(),
            metrics: self.metrics.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl<S, R> fmt::Debug for Pool<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.members.iter().map(|m| &m.name))
            .finish()
    }
}

/// What a pool says of each deployment (for a status page).
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentStatus {
    /// The deployment's name.
    pub name: Arc<str>,
    /// Its weight.
    pub weight: u32,
    /// Its load.
    pub load: LoadSnapshot,
    /// No call goes to it before this (a 429's `Retry-After`).
    pub cooling_for: Option<std::time::Duration>,
    /// Its pacer's buckets, when it is paced.
    pub pacing: Option<crate::PaceSnapshot>,
}

impl<S, R> Pool<S, R> {
    /// A pool of `deployments` (at least one).
    ///
    /// # Panics
    ///
    /// Never; an empty list makes a pool that refuses every call.
    pub fn new(deployments: Vec<Deployment<S>>) -> Self {
        let members: Vec<Member<S>> = deployments
            .into_iter()
            .map(|d| Member {
                name: d.name,
                model: d.model,
                weight: d.weight,
                pacer: d.pacer,
                service: d.service,
                load: d.load.unwrap_or_default(),
            })
            .collect();
        Pool {
            members: members.into(),
            random: Arc::new(SplitMix64::from_entropy()),
            affinity: None,
            metrics: Metrics::disabled(),
            queue: Arc::new(Queue {
                max: DEFAULT_MAX_WAITING,
                max_wait: crate::MAX_HEADER_WAIT,
                waiting: std::sync::atomic::AtomicUsize::new(0),
                priority: None,
                turn: Arc::default(),
            }),
        }
    }

    /// When every deployment is paced, at most `max_waiting` calls wait
    /// for room (default 256), each at most `max_wait` (default 60 s) and
    /// never past its deadline; the others fail at once (rate limited,
    /// with the time to the soonest room), and a fallback layer fails them
    /// over. Waiters take their turns in order of arrival: one at a time
    /// waits for the soonest room and takes it.
    #[must_use]
    pub fn with_queue(mut self, max_waiting: usize, max_wait: std::time::Duration) -> Self {
        self.queue = Arc::new(Queue {
            max: max_waiting,
            max_wait,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            priority: self.queue.priority.clone(),
            turn: Arc::default(),
        });
        self
    }

    /// Adaptive concurrency on every deployment: each takes at most as
    /// many calls at once as its limit, which its own faults cut (by 30 %)
    /// and its successes raise (additively), up to `max`
    /// ([`DeploymentLoad::adaptive`]). A deployment at its limit is
    /// skipped; when all are, the call fails as rate limited and fails
    /// over.
    #[must_use]
    pub fn with_adaptive_concurrency(self, max: u32) -> Self {
        for m in self.members.iter() {
            m.load.adaptive(max);
        }
        self
    }

    /// Tells each call's [`Priority`]: a low one never waits for room.
    #[must_use]
    pub fn with_priority(
        mut self,
        priority: impl Fn(&R) -> Priority + Send + Sync + 'static,
    ) -> Self {
        self.queue = Arc::new(Queue {
            max: self.queue.max,
            max_wait: self.queue.max_wait,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            priority: Some(Arc::new(priority)),
            turn: Arc::default(),
        });
        self
    }

    /// Counts the calls moved from one deployment to another
    /// (`ai_router_pool_moves_total{provider,reason}`) on `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Draws at random from `random` (seeded in tests).
    #[must_use]
    pub fn with_random(mut self, random: Arc<dyn RandomSource>) -> Self {
        self.random = random;
        self
    }

    /// Keeps requests with the same key on the same deployment.
    #[must_use]
    pub fn with_affinity(
        mut self,
        key: impl Fn(&R) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.affinity = Some(Arc::new(key));
        self
    }

    /// Each deployment's load, now.
    pub fn status(&self) -> Vec<DeploymentStatus> {
        self.status_handle().deployments()
    }

    /// A handle that reads this pool's loads (whatever its service type),
    /// for a status page.
    pub fn status_handle(&self) -> PoolStatus {
        PoolStatus {
            members: self
                .members
                .iter()
                .map(|m| (m.name.clone(), m.weight, m.load.clone(), m.pacer.clone()))
                .collect(),
        }
    }
}

/// Reads a pool's loads ([`Pool::status_handle`]); cheap to clone.
#[derive(Clone)]
pub struct PoolStatus {
    members: Arc<[Watched]>,
}

/// A deployment as a status handle sees it: name, weight, load, pacer.
type Watched = (Arc<str>, u32, Arc<DeploymentLoad>, Option<Arc<Pacer>>);

impl fmt::Debug for PoolStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.deployments()).finish()
    }
}

impl PoolStatus {
    /// Each deployment's load, now.
    pub fn deployments(&self) -> Vec<DeploymentStatus> {
        let now = Instant::now();
        self.members
            .iter()
            .map(|(name, weight, load, pacer)| DeploymentStatus {
                name: name.clone(),
                weight: *weight,
                load: load.snapshot(),
                cooling_for: load.cooling(now).map(|t| t - now),
                pacing: pacer.as_ref().map(|p| p.snapshot()),
            })
            .collect()
    }

    /// Each deployment's pacer, by name.
    pub fn pacers(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Pacer>)> {
        self.members
            .iter()
            .filter_map(|(name, _, _, pacer)| Some((name, pacer.as_ref()?)))
    }
}

/// `true` for a fault of the deployment (not of the call): another
/// deployment of the pool may serve.
fn moves_on(failure: &Failure) -> bool {
    matches!(
        failure.class(),
        FailureClass::RateLimited
            | FailureClass::Transient
            | FailureClass::CircuitOpen
            | FailureClass::QuotaExhausted
    )
}

/// The pool's future.
pub type PoolFuture<Res> = Pin<Box<dyn Future<Output = Result<Res, Failure>> + Send>>;

impl<S, R, Res> Service<R> for Pool<S, R>
where
    S: Service<R, Response = Res, Error = Failure> + Clone + Send + Sync + 'static,
    S::Future: Send,
    R: PoolRequest,
    Res: PoolAnswer + Send + 'static,
{
    type Response = Res;
    type Error = Failure;
    type Future = PoolFuture<Res>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        // Each deployment is made ready when the call is sent to it.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: R) -> Self::Future {
        let pool = self.clone();
        Box::pin(async move { pool.send(req).await })
    }
}

impl<S, R, Res> Pool<S, R>
where
    S: Service<R, Response = Res, Error = Failure> + Clone + Send + Sync + 'static,
    S::Future: Send,
    R: PoolRequest,
    Res: PoolAnswer,
{
    async fn send(self, req: R) -> Result<Res, Failure> {
        let n = self.members.len().min(MAX_DEPLOYMENTS);
        // Deployments called in this attempt (a bit each: no allocation).
        let mut tried: u64 = 0;
        // A place in the queue and the turn to wait, while it waits.
        let mut slot: Option<Waiting<'_, R>> = None;
        let mut turn: Option<tokio::sync::OwnedMutexGuard<()>> = None;
        let mut last: Option<Failure> = None;
        let record = AttemptLog::of(&req).and_then(|log| Some((log.clone(), log.in_flight()?)));
        let key = self.affinity.as_ref().and_then(|f| f(&req));
        let tokens = req.estimated_tokens();
        loop {
            let now = Instant::now();
            // Who can take the call now, and when the soonest paced one can.
            let mut open_at = [0usize; MAX_DEPLOYMENTS];
            let mut open_n = 0;
            let mut soonest: Option<Instant> = None;
            for (i, m) in self.members.iter().enumerate().take(n) {
                if tried & (1 << i) != 0 {
                    continue;
                }
                match m.load.cooling(now) {
                    Some(until) => soonest = Some(soonest.map_or(until, |s| s.min(until))),
                    // At its adaptive concurrency limit: skipped, not waited for.
                    None if m.load.full() => {}
                    None => {
                        open_at[open_n] = i;
                        open_n += 1;
                    }
                }
            }
            let Some(i) = self.pick(&open_at[..open_n], key) else {
                // Nothing can take the call now: wait for the soonest room
                // (within the call's deadline and the pool's queue), then
                // choose again; else fail with the last fault.
                if let Some(at) = soonest {
                    if slot.is_none() {
                        slot = self.queue.admit(&req, at, now);
                    }
                    if let Some(Waiting(_, until)) = &slot {
                        // Never past `max_wait` from coming in, nor the
                        // deadline.
                        let until = Deadline::of(&req).map_or(*until, |d| d.instant().min(*until));
                        if turn.is_none() {
                            // One waiter at a time waits for room, in
                            // order of arrival.
                            let lock = self.queue.turn.clone().lock_owned();
                            turn = tokio::time::timeout_at(until, lock).await.ok();
                            if turn.is_some() {
                                continue;
                            }
                        } else if until > at {
                            tokio::time::sleep_until(at).await;
                            continue;
                        }
                    }
                }
                return Err(last.unwrap_or_else(|| paced(soonest, now)));
            };
            let m = &self.members[i];
            let ticket = match &m.pacer {
                None => None,
                // Shared: this replica's buckets first (the provider's
                // headers), then the fleet's; else no await.
                Some(pacer) => match if pacer.is_shared() {
                    pacer.take(tokens.unwrap_or(0)).await
                } else {
                    pacer.try_take(tokens.unwrap_or(0))
                } {
                    Ok(ticket) => Some(ticket),
                    Err(room_at) => {
                        // No room here (or in the fleet's buckets) before
                        // `room_at`: not open till then.
                        self.metrics.record_pool_move(&m.name, "paced");
                        let now = Instant::now();
                        m.load
                            .cool_until(room_at.max(now + std::time::Duration::from_millis(1)));
                        continue;
                    }
                },
            };
            tried |= 1 << i;
            // Its turn is over once a deployment has taken it.
            drop(turn.take());
            drop(slot.take());
            let mut copy = req.clone();
            if let Some(model) = &m.model {
                copy.set_model(model);
            }
            // The deployment is the link its service sees (its circuit
            // keys on it); position and what follows are the link's.
            let outer = Link::of(&req);
            let model = outer
                .map(|l| l.model_arc().clone())
                .or_else(|| req.model())
                .unwrap_or_else(|| Arc::from(""));
            Link::new(m.name.clone(), model)
                .with_position(outer.map_or(0, Link::position))
                .with_alternates_after(outer.is_some_and(Link::has_alternates_after))
                .store(&mut copy);
            if let Some((log, index)) = &record {
                log.finish(*index, |r| r.provider = m.name.clone());
            }
            let started = Instant::now();
            let in_flight = m.load.start();
            let result = m.service.clone().oneshot(copy).await;
            drop(in_flight);
            let failed = result.as_ref().is_err_and(moves_on);
            m.load.record(started.elapsed(), failed);
            if let Some(ticket) = ticket {
                // Until usage is read back, what was taken stays taken;
                // a shared ticket gives back to the fleet's buckets too.
                // Usage unknown (a stream, a failure without an answer):
                // what was taken stays taken.
                let taken = ticket.tokens();
                ticket.settle(ticket_tokens(&result).unwrap_or(taken));
            }
            match result {
                Ok(answer) => return Ok(answer),
                Err(failure)
                    if moves_on(&failure)
                        && Deadline::of(&req)
                            .is_none_or(|d| d.remaining() > std::time::Duration::ZERO) =>
                {
                    if let (FailureClass::RateLimited, Some(wait)) =
                        (failure.class(), failure.retry_after())
                    {
                        // A lying Retry-After cannot take a deployment out
                        // for longer than the pacer's cap.
                        let wait = wait.min(crate::MAX_HEADER_WAIT);
                        m.load.cool_until(Instant::now() + wait);
                        if let Some(pacer) = &m.pacer {
                            pacer.hold_off(wait);
                        }
                    }
                    self.metrics
                        .record_pool_move(&m.name, failure.class().as_metric_label());
                    last = Some(failure);
                }
                Err(failure) => return Err(failure),
            }
        }
    }

    /// The deployment for a call among `open`: by affinity when there is
    /// a key, else the better of two drawn by weight.
    fn pick(&self, open: &[usize], key: Option<u64>) -> Option<usize> {
        match open {
            [] => None,
            [only] => Some(*only),
            _ => Some(match key {
                Some(key) => self.rendezvous(open, key),
                None => self.two_choices(open),
            }),
        }
    }

    fn draw(&self, open: &[usize], skip: Option<usize>) -> usize {
        let total: u64 = open
            .iter()
            .filter(|i| Some(**i) != skip)
            .map(|i| u64::from(self.members[*i].weight))
            .sum();
        let mut at = (self.random.next_fraction() * total as f64) as u64;
        for i in open.iter().filter(|i| Some(**i) != skip) {
            let w = u64::from(self.members[*i].weight);
            if at < w {
                return *i;
            }
            at -= w;
        }
        open.iter()
            .copied()
            .rfind(|i| Some(*i) != skip)
            .unwrap_or(open[0])
    }

    fn two_choices(&self, open: &[usize]) -> usize {
        let a = self.draw(open, None);
        let b = self.draw(open, Some(a));
        // A deployment not yet measured counts as the pool's mean.
        let (sum, count) = self
            .members
            .iter()
            .filter_map(|m| m.load.latency())
            .fold((0.0, 0u32), |(s, n), l| (s + l, n + 1));
        let prior = if count == 0 {
            0.0
        } else {
            sum / f64::from(count)
        };
        let now = Instant::now();
        let score = |i: usize| self.members[i].load.score(prior, now);
        if score(b) < score(a) { b } else { a }
    }

    /// Weighted rendezvous hashing: the deployment with the highest
    /// `-ln(hash) / weight`-style score for `key`.
    fn rendezvous(&self, open: &[usize], key: u64) -> usize {
        let mut best = open[0];
        let mut best_score = f64::MIN;
        for &i in open {
            let m = &self.members[i];
            let h = mix(key ^ hash_name(&m.name));
            // A fraction in (0, 1].
            let u = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let score = f64::from(m.weight) / -u.ln();
            if score > best_score {
                best_score = score;
                best = i;
            }
        }
        best
    }
}

/// What a settled ticket used: the answer's usage (a failure used
/// nothing a provider counts; a stream's usage is not known yet, so the
/// whole ticket stays taken).
fn ticket_tokens<Res: PoolAnswer>(result: &Result<Res, Failure>) -> Option<u64> {
    match result {
        Ok(answer) => answer.used_tokens(),
        Err(failure) if failure.http_status().is_some() => Some(0),
        Err(_) => None,
    }
}

/// An answer a pool can read its token usage from, to give back to its
/// deployment's pacer what the request did not use.
pub trait PoolAnswer {
    /// The tokens the call used, when known now.
    fn used_tokens(&self) -> Option<u64> {
        None
    }
}

impl PoolAnswer for tower_llm_core::ChatResponse {
    fn used_tokens(&self) -> Option<u64> {
        let total = self.usage.total_tokens();
        (total > 0).then_some(u64::from(total))
    }
}

/// A stream's usage comes at its end: what was taken stays taken.
impl PoolAnswer for tower_llm_core::ChatStream {}

/// The failure of a call no deployment could take now: rate limited,
/// with the soonest time any has room.
fn paced(soonest: Option<Instant>, now: Instant) -> Failure {
    let mut f = Failure::new(FailureClass::RateLimited)
        .with_message("every deployment of the pool is paced or cooling down");
    if let Some(at) = soonest {
        f = f.with_retry_after(at.saturating_duration_since(now));
    }
    f
}

fn hash_name(name: &str) -> u64 {
    // FNV-1a: stable across processes (replicas agree on the choice).
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
