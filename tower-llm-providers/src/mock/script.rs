//! The script a double plays, shared by its clones.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};

use super::reply::{Recorded, Reply};

#[derive(Debug)]
pub(super) struct Script {
    pub(super) replies: VecDeque<Reply>,
    pub(super) fallback: Reply,
    pub(super) received: Vec<Recorded>,
    /// Keep only the last request (for load tests: bounded memory).
    pub(super) keep_last_only: bool,
    pub(super) aborted: Arc<AtomicUsize>,
}

impl Script {
    pub(super) fn next(&mut self) -> Reply {
        self.replies
            .pop_front()
            .unwrap_or_else(|| self.fallback.clone())
    }
}

pub(super) type Shared = Arc<Mutex<Script>>;

pub(super) fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Script> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A request or response body, read whole (a body that fails reads as
/// empty).
pub(super) async fn collect<B: http_body::Body>(body: B) -> bytes::Bytes {
    use http_body_util::BodyExt;
    body.collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}
