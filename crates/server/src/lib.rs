//! leaseq-server: the broker as a library. The `leaseq` binary parses its
//! command line into a [`Config`] and calls [`server::run`]; tests do the
//! same without the parser.
//!
//! A map of the modules, from the wire inwards:
//!
//! - [`api`]: the tonic services (queue, admin); thin handlers that validate
//!   and convert.
//! - [`domain`]: parsed request types (`QueueName`, `JobId`, `LeaseToken`, ...)
//!   and every input rule.
//! - [`broker`]: the core the handlers call; owns the group-commit batchers.
//! - [`settle`]: ending leases (ack, nack, release, expiry) and waking
//!   queues: the statements, the credit, the NOTIFYs, the metrics.
//! - [`store`]: every SQL statement (`src/store/sql/`), the [`store::batch`]
//!   group-commit machinery, and [`store::limits`] (per-queue concurrency and
//!   rate limits in the lease path).
//! - [`dispatch`]: Subscribe streams, credits, batch leasing, release on close.
//! - [`notify`]: the one LISTEN connection and its fan-out.
//! - [`pgconn`]: DATABASE_URL (libpq's URI and keyword/value forms), the PG*
//!   variables and TLS to PostgreSQL, read into sqlx's connect options;
//!   [`pgsock`]: TCP keepalive and user timeout on those connections.
//! - [`placement`]: queues over several PostgreSQL clusters: buckets, the
//!   bucket → cluster map with its epoch, pins, and bucket moves
//!   (docs/SCALING.md).
//! - [`fanout`]: admin reads and writes over every cluster, merged.
//! - [`maintenance`]: lease reaper, ttl expiry, retention of completed jobs,
//!   and vacuuming the jobs table.
//! - [`metrics`]: Prometheus counters, histograms and gauges
//!   (`prometheus-client`).
//! - [`history`]: every broker's per-queue rates, and the queues' depth,
//!   written to PostgreSQL for the console (the deployment's, not one
//!   broker's).
//! - [`console`]: the web console and `/metrics` over HTTP (axum), its
//!   sessions (in PostgreSQL), CSRF checks and JSON API over the
//!   AdminService.
//! - [`server`]: wires it all together and shuts it down in order.
//! - [`auth`], [`tls`], [`stream_limit`]: bearer tokens and per-queue grants,
//!   TLS and mutual TLS, the broker-wide stream cap (docs/SECURITY.md).
//! - [`conn_limit`], [`request_limit`]: the connection cap, each
//!   connection's budgets (request bytes, stream credit), and the message
//!   size limit (docs/SECURITY.md, "Limits").
//! - [`telemetry`]: spans of the jobs' enqueues, deliveries and settles,
//!   exported over OTLP (off by default).
//! - [`config`]: [`Config`], the settings; [`error`]: errors and their one
//!   mapping to gRPC status codes.
//! - [`fuzzing`]: bytes → request decoding → validation, for `fuzz/` and tests.
//! - `tick`: the clock of every background loop (an interval that ends at
//!   shutdown).

// Tests may be long (a scenario reads top to bottom); the code they test
// may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod api;
pub mod auth;
pub mod broker;
pub mod config;
pub mod conn_limit;
pub mod console;
pub mod dispatch;
pub mod domain;
pub mod error;
pub mod fanout;
pub mod fuzzing;
pub mod history;
pub mod maintenance;
pub mod metrics;
pub mod notify;
pub mod pgconn;
pub mod pgsock;
pub mod placement;
pub mod request_limit;
pub mod server;
pub mod settle;
#[cfg(test)]
mod sim;
pub mod store;
pub mod stream_limit;
pub mod telemetry;
mod tick;
pub mod tls;

pub use config::Config;
/// The generated API (`leaseq.v1`), re-exported from `leaseq-proto`.
pub use leaseq_proto as pb;
