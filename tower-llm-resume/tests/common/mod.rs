//! Scripted streaming services for the tests.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use tokio::time::Sleep;
use tower::service_fn;
use tower::util::BoxCloneSyncService;
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatStream, Failure, FailureClass, ToolCallDelta, Usage,
};

pub type Item = Result<ChatChunk, Failure>;

/// A text chunk of the first choice.
pub fn text(t: &str) -> Item {
    Ok(ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    })
}

/// A failure of `class` (ends a stream, or fails a call).
pub fn fail(class: FailureClass) -> Failure {
    Failure::new(class)
}

/// A connection that broke off mid-stream.
pub fn cut() -> Item {
    Err(fail(FailureClass::Transient))
}

pub fn usage(prompt: u32, completion: u32) -> Item {
    Ok(ChatChunk {
        usage: Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_input_tokens: 0,
        }),
        ..ChatChunk::default()
    })
}

pub fn tool_fragment() -> Item {
    Ok(ChatChunk {
        tool_call: Some(ToolCallDelta {
            index: 0,
            id: Some("call_1".into()),
            name: Some("lookup".into()),
            arguments: "{\"q\":".into(),
        }),
        ..ChatChunk::default()
    })
}

/// One scripted answer of the service.
pub enum Play {
    /// A stream of items, each after its delay in milliseconds.
    Stream(Vec<(u64, Item)>),
    /// The call fails before any stream.
    Fail(Failure),
}

/// A stream playing `items` at once.
pub fn now(items: Vec<Item>) -> Play {
    Play::Stream(items.into_iter().map(|i| (0, i)).collect())
}

/// A provider that answers each call with the next play, per provider
/// name, and keeps the requests it saw.
#[derive(Clone, Default)]
pub struct Script {
    plays: Arc<Mutex<HashMap<&'static str, VecDeque<Play>>>>,
    seen: Arc<Mutex<Vec<(&'static str, ChatRequest)>>>,
}

pub type StreamService = BoxCloneSyncService<ChatRequest, ChatStream, Failure>;

impl Script {
    pub fn new() -> Self {
        Script::default()
    }

    /// Queues `play` for `provider`.
    pub fn then(&self, provider: &'static str, play: Play) -> &Self {
        self.plays
            .lock()
            .expect("not poisoned")
            .entry(provider)
            .or_default()
            .push_back(play);
        self
    }

    /// The requests `provider` received.
    pub fn seen(&self, provider: &str) -> Vec<ChatRequest> {
        self.seen
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|(p, _)| *p == provider)
            .map(|(_, r)| r.clone())
            .collect()
    }

    pub fn calls(&self, provider: &str) -> usize {
        self.seen(provider).len()
    }

    /// The service of `provider` (its streams named after it).
    pub fn service(&self, provider: &'static str) -> StreamService {
        let script = self.clone();
        BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            script
                .seen
                .lock()
                .expect("not poisoned")
                .push((provider, req.clone()));
            let play = script
                .plays
                .lock()
                .expect("not poisoned")
                .get_mut(provider)
                .and_then(VecDeque::pop_front);
            let model = req.model.to_string();
            async move {
                match play {
                    Some(Play::Stream(items)) => Ok(ChatStream::new(
                        provider,
                        model,
                        Timed {
                            items: items
                                .into_iter()
                                .map(|(ms, i)| (Duration::from_millis(ms), i))
                                .collect(),
                            sleep: None,
                        },
                    )),
                    Some(Play::Fail(f)) => Err(f),
                    None => Err(Failure::new(FailureClass::InvalidResponse)
                        .with_message("the script has no more plays")),
                }
            }
        }))
    }
}

/// Items played after their delays.
struct Timed {
    items: VecDeque<(Duration, Item)>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Stream for Timed {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
                return Poll::Ready(self.items.pop_front().map(|(_, i)| i));
            }
            match self.items.front() {
                None => return Poll::Ready(None),
                Some((d, _)) if d.is_zero() => {
                    return Poll::Ready(self.items.pop_front().map(|(_, i)| i));
                }
                Some((d, _)) => {
                    let d = *d;
                    self.sleep = Some(Box::pin(tokio::time::sleep(d)));
                }
            }
        }
    }
}

/// Every item of `stream`, in order.
pub async fn drain(mut stream: ChatStream) -> Vec<Item> {
    let mut out = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        out.push(item);
    }
    out
}

/// The first choice's text of `items`, and their terminal failure.
pub fn joined(items: &[Item]) -> (String, Option<FailureClass>) {
    let mut text = String::new();
    let mut failed = None;
    for item in items {
        match item {
            Ok(c) if c.index == 0 => text.push_str(c.text.as_deref().unwrap_or("")),
            Ok(_) => {}
            Err(f) => failed = Some(f.class()),
        }
    }
    (text, failed)
}

/// The answer's words `w0 `, `w1 `, ... `w{n-1} `.
pub fn words(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("w{i} ")).collect()
}

/// Tokens of `got` seen more than once, and tokens of `want` never seen.
pub fn duplicated_and_missing(got: &str, want: &[String]) -> (usize, usize) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for w in got.split_whitespace() {
        *count.entry(w).or_default() += 1;
    }
    let duplicated = count.values().map(|c| c.saturating_sub(1)).sum();
    let missing = want
        .iter()
        .filter(|w| !count.contains_key(w.trim_end()))
        .count();
    (duplicated, missing)
}
