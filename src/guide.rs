//! Guides and reference, one module per topic: how each layer behaves, the
//! providers, streaming, telemetry, sharing state between replicas, the
//! gateway and its policy file.
//!
//! Each module's page is a file of the repository's `docs/` directory,
//! included here so that its Rust examples compile as doctests
//! (`cargo test --doc`). The measurements behind the figures quoted here,
//! with the commands that produce them, are in the repository's
//! `benches/README.md`.
//!
//! | module | what |
//! |---|---|
//! | [`layers`](crate::guide::layers) | the stack and its order; deadline, idempotency, fallback, hedge, retry and circuit breaker layers |
//! | [`call`](crate::guide::call) | the per-call carrier, the failure classes and the attempt log |
//! | [`providers`](crate::guide::providers) | OpenAI, Anthropic and Bedrock: wire formats, error classification, content filters, secrets, test doubles |
//! | [`streaming`](crate::guide::streaming) | the commit point, timeouts, truncation, wire formats |
//! | [`recovery`](crate::guide::recovery) | streams that break after the first token: continuing them, complete-or-fail, and the default |
//! | [`cache`](crate::guide::cache) | the response cache: keys, freshness, `Cache-Control`, the stale-safe rung, memory |
//! | [`telemetry`](crate::guide::telemetry) | metrics, spans, trace propagation, wiring an SDK |
//! | [`pools`](crate::guide::pools) | one model over several keys and deployments: choice, moves, pacing under rate limits |
//! | [`cost`](crate::guide::cost) | prices, one call's budget, tenant quotas (in process or on Redis), what each attempt is charged |
//! | [`redis`](crate::guide::redis) | circuits and idempotent answers shared between replicas |
//! | [`gateway`](crate::guide::gateway) | the gateway: running it, endpoints, errors, behaviour, server limits |
//! | [`policy_file`](crate::guide::policy_file) | the policy file: every key, named policies, chains |
//! | [`reliability`](crate::guide::reliability) | fuzzing, model checks, the chaos soak and the chaos run |
//! | [`workspace`](crate::guide::workspace) | the crates, the examples, the tests and CI |

#[doc = include_str!("../docs/layers.md")]
pub mod layers {}

#[doc = include_str!("../docs/call.md")]
pub mod call {}

#[doc = include_str!("../docs/providers.md")]
pub mod providers {}

#[doc = include_str!("../docs/streaming.md")]
pub mod streaming {}

#[doc = include_str!("../docs/recovery.md")]
pub mod recovery {}

#[doc = include_str!("../docs/cache.md")]
pub mod cache {}

#[doc = include_str!("../docs/telemetry.md")]
pub mod telemetry {}

#[doc = include_str!("../docs/pools.md")]
pub mod pools {}

#[doc = include_str!("../docs/cost.md")]
pub mod cost {}

#[doc = include_str!("../docs/redis.md")]
pub mod redis {}

#[doc = include_str!("../docs/gateway.md")]
pub mod gateway {}

#[doc = include_str!("../docs/policy-file.md")]
pub mod policy_file {}

#[doc = include_str!("../docs/reliability.md")]
pub mod reliability {}

#[doc = include_str!("../docs/workspace.md")]
pub mod workspace {}
