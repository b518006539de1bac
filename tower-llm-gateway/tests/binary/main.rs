//! The built `tower-llm-gateway` binary as a process: its command line,
//! deadlines under load, memory under stored streams, circuits shared
//! through Redis, its workers, and the server builder that runs them
//! in-process. Real processes, real threads and real time.

mod cli;
mod deadline;
mod memory;
mod pools;
mod quotas;
mod server_builder;
mod shared_cache;
mod shared_circuits;
mod support;
mod workers;
