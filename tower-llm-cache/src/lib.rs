//! A response cache for LLM calls (work in progress).

mod control;
mod store;

pub use control::CacheControl;
pub use store::{CacheEntry, CacheStore, MemoryCache, StoreError};
