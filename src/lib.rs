//! leaseq: a durable job queue broker over PostgreSQL, spoken to over gRPC.
//!
//! A map of the modules, from the wire inwards:
//!
//! - [`api`]: the tonic services (queue, admin); thin handlers that validate
//!   and convert.
//! - [`domain`]: parsed request types (`QueueName`, `JobId`, `LeaseToken`, ...)
//!   and every input rule.
//! - [`broker`]: the core the handlers call; owns the group-commit batchers.
//! - [`store`]: every SQL statement (`src/store/sql/`), the [`store::batch`]
//!   group-commit machinery, and [`store::limits`] (per-queue concurrency and
//!   rate limits in the lease path).
//! - [`dispatch`]: Subscribe streams, credits, batch leasing, release on close.
//! - [`notify`]: the one LISTEN connection and its fan-out.
//! - [`maintenance`]: lease reaper, ttl expiry, retention of completed jobs,
//!   and vacuuming the jobs table.
//! - [`metrics`]: Prometheus counters, histograms, gauges and `/metrics`.
//! - [`server`]: wires it all together and shuts it down in order.
//! - [`embedded`]: the private PostgreSQL cluster used when no DATABASE_URL.
//! - [`pgconn`]: DATABASE_URL (libpq's URI and keyword/value forms), the PG*
//!   variables and TLS to PostgreSQL, read into sqlx's connect options.
//! - [`bench`]: `leaseq bench`, the load generator and raw-SQL baseline.
//! - [`client`]: the Rust client library: `Client` and the reconnecting `Worker`.
//! - [`auth`], [`tls`], [`limits`]: bearer tokens and per-queue grants, TLS
//!   and mutual TLS, the broker-wide stream cap (docs/SECURITY.md; not the
//!   per-queue limits, which are in [`store::limits`]).
//! - [`fuzzing`]: bytes → request decoding → validation, for `fuzz/` and tests.
//! - [`config`], [`error`], [`telemetry`], [`cli`]: the rest.

pub mod api;
pub mod auth;
pub mod bench;
pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod dispatch;
pub mod domain;
pub mod embedded;
pub mod error;
pub mod fuzzing;
pub mod limits;
pub mod maintenance;
pub mod metrics;
pub mod notify;
pub mod pgconn;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;

/// Generated protobuf and gRPC code for `leaseq.v1`.
pub mod pb {
    tonic::include_proto!("leaseq.v1");

    /// Encoded descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/leaseq_descriptor.bin"));
}
