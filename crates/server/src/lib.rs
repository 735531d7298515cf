//! leaseq-server: the broker as a library. The `leaseq` binary parses its
//! command line into a [`Config`] and calls [`server::run`]; tests do the
//! same without the parser.
//!
//! A map of the modules, from the wire inwards:
//!
//! - `api`: the tonic services (queue, admin); thin handlers that validate
//!   and convert.
//! - `domain`: parsed request types (`QueueName`, `JobId`, `LeaseToken`, ...)
//!   and every input rule.
//! - `broker`: the core the handlers call; owns the group-commit batchers.
//! - `settle`: ending leases (ack, nack, release, expiry) and waking
//!   queues: the statements, the credit, the NOTIFYs, the metrics.
//! - `channels`: every NOTIFY channel the brokers use and every payload's
//!   format, in one table (the SQL senders are checked against it).
//! - [`store`]: every SQL statement (`src/store/sql/`), the `store::batch`
//!   group-commit machinery, and `store::limits` (per-queue concurrency and
//!   rate limits in the lease path).
//! - `dispatch`: Subscribe streams, credits, batch leasing, release on close.
//! - `notify`: the one LISTEN connection and its fan-out.
//! - [`pgconn`]: DATABASE_URL (libpq's URI and keyword/value forms), the PG*
//!   variables and TLS to PostgreSQL, read into sqlx's connect options;
//!   `pgsock`: TCP keepalive and user timeout on those connections.
//! - [`placement`]: queues over several PostgreSQL clusters: buckets, the
//!   bucket → cluster map with its epoch, pins, and bucket moves
//!   (docs/SCALING.md).
//! - `fanout`: admin reads and writes over every cluster, merged.
//! - `schedule`: cron schedules (croner, chrono-tz): every broker's loop
//!   fires due ticks, exactly one job per tick (docs/design/schedules.md).
//! - `maintenance`: lease reaper, ttl expiry, retention of completed jobs,
//!   and vacuuming the jobs table.
//! - `metrics`: Prometheus counters, histograms and gauges
//!   (`prometheus-client`).
//! - `history`: every broker's per-queue rates, and the queues' depth,
//!   written to PostgreSQL for the console (the deployment's, not one
//!   broker's).
//! - `console`: the web console and `/metrics` over HTTP (axum), its
//!   sessions (in PostgreSQL), CSRF checks and JSON API over the
//!   AdminService.
//! - [`server`]: wires it all together and shuts it down in order.
//! - `auth`, `tls`, `stream_limit`: bearer tokens and per-queue grants,
//!   TLS and mutual TLS, the broker-wide stream cap (docs/SECURITY.md).
//! - `conn_limit`, `request_limit`: the connection cap, each
//!   connection's budgets (request bytes, stream credit), and the message
//!   size limit (docs/SECURITY.md, "Limits").
//! - `telemetry`: spans of the jobs' enqueues, deliveries and settles,
//!   exported over OTLP (off by default).
//! - [`config`]: [`Config`], the settings; `error`: errors and their one
//!   mapping to gRPC status codes.
//! - [`fuzzing`]: bytes → request decoding → validation, for `fuzz/` and tests.
//! - `tick`: the clock of every background loop (an interval that ends at
//!   shutdown).
//! - `waits`: WaitJob's registry of waits and the poll that answers them.

// Tests may be long (a scenario reads top to bottom); the code they test
// may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

// Private unless another crate needs it: the binary (`src/`), the test
// suite (`tests/`) or `fuzz/`. What they need is re-exported below, or is in
// one of the few public modules; everything else is `pub(crate)` at most, so
// the compiler reports what nothing uses.
//
// The modules depend on one another without a circle (tests/house.rs checks
// it): from the bottom, `error`, `pgconn`, `config` and `domain`, then
// `channels` and `metrics`, then `store`, `placement`, `waits`, `settle`, `dispatch`,
// `broker`, the services, and `server`, which wires everything.
mod api;
mod auth;
mod broker;
mod channels;
pub mod config;
mod conn_limit;
mod console;
mod dispatch;
mod domain;
mod error;
mod fanout;
pub mod fuzzing;
mod history;
mod maintenance;
mod metrics;
mod notify;
pub mod pgconn;
mod pgsock;
/// Several PostgreSQL clusters (docs/SCALING.md): the binary's `cluster`
/// commands and the scaling tests call it.
pub mod placement;
mod request_limit;
mod schedule;
pub mod server;
mod settle;
#[cfg(test)]
mod sim;
pub mod store;
mod stream_limit;
mod telemetry;
mod tick;
mod tls;
mod waits;

/// The response header naming the broker process serving a stream (the
/// load-balancer tests read it).
pub use api::queue::BROKER_HEADER;
/// Bearer tokens, as `leaseq hash-token` makes them and the token file
/// holds them.
pub use auth::{generate_token, hash_token};
pub use config::Config;
/// The connection cap's fixed limits (the connection-limit tests are
/// written against them).
pub use conn_limit::{MAX_REFUSING, REFUSED_LIFETIME};
/// Which cluster holds a lease, and the ids a `store::Store`'s statements
/// take (the binary's cluster commands and the tests).
pub use domain::{ClusterId, JobId, LeaseToken};
/// The generated API (`leaseq.v1`), re-exported from `leaseq-proto`.
pub use leaseq_proto as pb;
