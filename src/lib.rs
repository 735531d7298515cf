//! The `leaseq` binary's library half: the command line and what only the
//! binary does. The broker itself is the `leaseq-server` crate, the Rust
//! client `leaseq-client`, the generated API `leaseq-proto`.
//!
//! - [`config`]: the clap arguments of every subcommand; `serve`'s convert
//!   into [`leaseq_server::Config`].
//! - [`cli`]: the client subcommands (`enqueue`, `tail`, `work`, the admin
//!   commands, `hash-token`).
//! - [`bench`]: `leaseq bench`, the load generator and raw-SQL baseline.
//! - [`duration`]: durations on the command line (`90s`, `1h30m`, `2d`).
//! - [`embedded`]: the private PostgreSQL cluster used when no DATABASE_URL.
//! - [`telemetry`], logging: `RUST_LOG` filters, human or JSON lines.

// Tests may be long (a scenario reads top to bottom); the code they test
// may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod bench;
pub mod cli;
pub mod config;
pub mod duration;
pub mod embedded;
pub mod telemetry;

pub use leaseq_proto as pb;
