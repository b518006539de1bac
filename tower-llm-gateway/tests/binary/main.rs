//! The built `tower-llm-gateway` binary as a process: its command line,
//! deadlines under load, memory under stored streams, circuits shared
//! through Redis, and its workers. Real processes and real time.

mod support;

mod cli;
mod deadline;
mod memory;
mod shared_circuits;
mod workers;
