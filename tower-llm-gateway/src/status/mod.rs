//! `GET /status`: one server-rendered HTML page for operators.
//!
//! Per route, its chain; per link: the circuit's state (closed, open until
//! a time, half-open), the provider's last probe, attempts, failures (by
//! class) and failovers over the last 1, 5 and 15 minutes, and the p50 and
//! p99 latency (unary answers) and time to first token (streams) of each
//! of the last 15 minutes as inline SVG sparklines. A banner shows a
//! policy reload that failed. No script framework, no external asset; the
//! page refreshes itself every 5 s.
//!
//! The numbers come from the attempt records of each finished call: the
//! same records the call's metrics are recorded from, read once more, in
//! fifteen one-minute slots per link (bounded: at most [`MAX_LINKS`](board::MAX_LINKS)
//! links, a fixed-size histogram per slot). Every string from
//! configuration, a provider or an error is HTML-escaped.

mod board;
mod page;

pub(crate) use board::StatusBoard;
pub(crate) use page::page;
