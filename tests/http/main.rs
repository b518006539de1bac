//! The layers over real loopback HTTP (hyper servers the tests start):
//! deadlines, hedges, rate limits, retries, the whole stack, streams, and
//! the examples run once. One test binary for all of them.

#[path = "../common/mod.rs"]
mod common;

mod deadline;
mod examples;
mod hedge;
mod rate_limits;
mod retry;
mod stack;
mod streams;
