//! Cost budgets and tenant quotas for LLM calls.
//!
//! (Work in progress: the layer lands next.)

mod memory;
mod quota;

pub use memory::MemoryQuota;
pub use quota::{
    Ask, Exhausted, InvalidQuota, Limits, QuotaConfig, QuotaHold, QuotaRefusal, QuotaStore, Reserve,
};
