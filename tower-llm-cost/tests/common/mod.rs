//! Prices, requests and a scripted provider shared by the cost tests.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::service_fn;
use tower::util::BoxCloneSyncService;
use tower_llm_core::{
    ChatRequest, ChatResponse, Classified, Cost, Failure, FailureClass, Message, Price, Usage,
};

pub type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// `n` nano-dollars.
pub const fn nanos(n: u64) -> Cost {
    Cost::from_nanos(n)
}

/// `input` and `output` dollars per million tokens: with whole dollars,
/// one token costs `input * 1_000` (resp. `output * 1_000`) nano-dollars.
pub fn price(input: u64, output: u64) -> Price {
    Price::new(
        Cost::from_nanos(input * 1_000_000_000),
        Cost::from_nanos(output * 1_000_000_000),
        None,
    )
    .expect("price")
}

/// $10 in, $30 out per million: 10,000 and 30,000 nano-dollars a token.
pub fn expensive() -> Price {
    price(10, 30)
}

/// $1 in, $2 out per million: 1,000 and 2,000 nano-dollars a token.
pub fn cheap() -> Price {
    price(1, 2)
}

/// The input bound of [`req`]: 16 (request) + 8 (one message) + 5 bytes.
pub const INPUT: u64 = 29;

/// The output cap the tests' cost layers use.
pub const CAP: u32 = 100;

/// `(INPUT, CAP)` tokens at `input`/`output` dollars per million, in
/// nano-dollars: an attempt's worst case.
pub const fn worst(input: u64, output: u64) -> u64 {
    INPUT * input * 1_000 + CAP as u64 * output * 1_000
}

/// The input estimate alone at `input` dollars per million.
pub const fn input_only(input: u64) -> u64 {
    INPUT * input * 1_000
}

/// A request whose input bound is [`INPUT`] tokens.
pub fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hello")])
}

pub fn usage(prompt: u32, completion: u32) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_input_tokens: 0,
    }
}

/// The usage every scripted answer reports unless told otherwise: 20 in,
/// 10 out (40,000 nano-dollars at the cheap price, 500,000 at the
/// expensive one).
pub fn usual() -> Usage {
    usage(20, 10)
}

/// A failure with an HTTP status (no `http` crate needed: the status is
/// converted from its number).
pub fn status_failure(class: FailureClass, status: u16) -> Failure {
    let mut c = Classified::new(class);
    c.http_status = Some(status.try_into().expect("a status code"));
    Failure::from_classified(c)
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Step {
    /// After `after`, answer `text` with `usage`.
    Answer {
        after: Duration,
        usage: Usage,
        text: &'static str,
    },
    /// Fail at once with this status (503 → transient, 429 → rate limited).
    Status(u16),
    /// Never answer.
    Hang,
}

pub fn ok(usage: Usage) -> Step {
    Step::Answer {
        after: Duration::ZERO,
        usage,
        text: "an answer",
    }
}

pub fn ok_after(ms: u64, usage: Usage) -> Step {
    Step::Answer {
        after: Duration::from_millis(ms),
        usage,
        text: "an answer",
    }
}

/// A provider that plays its steps in order (the last repeats), counts
/// its calls and remembers the `max_tokens` each request carried.
#[derive(Clone)]
pub struct Provider {
    pub name: &'static str,
    steps: Arc<Mutex<VecDeque<Step>>>,
    seen: Arc<Mutex<Vec<Option<u32>>>>,
}

impl Provider {
    pub fn new(name: &'static str, steps: &[Step]) -> Self {
        Provider {
            name,
            steps: Arc::new(Mutex::new(steps.iter().cloned().collect())),
            seen: Arc::default(),
        }
    }

    pub fn calls(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    /// The `max_tokens` of each request the provider received.
    pub fn max_tokens_seen(&self) -> Vec<Option<u32>> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn service(&self) -> Svc {
        let p = self.clone();
        BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            p.seen.lock().expect("lock").push(req.max_tokens);
            let step = {
                let mut steps = p.steps.lock().expect("lock");
                if steps.len() > 1 {
                    steps.pop_front().expect("step")
                } else {
                    steps.front().cloned().expect("step")
                }
            };
            let n = p.calls() - 1;
            let name = p.name;
            async move {
                match step {
                    Step::Answer { after, usage, text } => {
                        tokio::time::sleep(after).await;
                        Ok(ChatResponse::builder(req.model.to_string())
                            .id(n.to_string())
                            .provider(name)
                            .text(text)
                            .usage(usage)
                            .build())
                    }
                    Step::Status(status) => {
                        let class = match status {
                            429 => FailureClass::RateLimited,
                            400 => FailureClass::BadRequest,
                            _ => FailureClass::Transient,
                        };
                        Err(status_failure(class, status))
                    }
                    Step::Hang => std::future::pending().await,
                }
            }
        }))
    }
}
