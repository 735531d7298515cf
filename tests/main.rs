//! The integration suite as one test binary (`[[test]] name = "suite"` in
//! Cargo.toml, `autotests = false`): one link instead of one per file. Each
//! file below is a module and keeps its own subject; `common` is the shared harness (PostgreSQL, brokers,
//! admin clients, snapshots, fault load). Run one file's tests with a filter:
//! `cargo nextest run -E 'test(/^lb::/)'` or `cargo test --test suite lb::`.

mod common;

mod admin;
mod admin_cli;
mod client;
mod clients;
mod embedded_pg;
mod faults;
mod fuzz_decode;
mod lb;
mod limits;
mod metrics;
mod process;
mod security;
mod semantics;
mod sql_enqueue;
mod validation;
mod work;
