//! The broker's settings, apart from any command line: a plain struct with
//! defaults that [`crate::server`] takes. The `leaseq` binary's clap
//! arguments convert into it; tests and embedders build it directly:
//!
//! ```
//! let mut cfg = leaseq_server::Config::default();
//! cfg.pool_size = 4;
//! cfg.poll_interval = std::time::Duration::from_secs(60);
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// PostgreSQL's `statement_timeout` on the broker's connections unless
/// [`Config::pg_statement_timeout`] says otherwise (`--pg-statement-timeout`).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything `leaseq serve` can be told, but where to listen and which
/// database (the caller binds the listener and resolves the database).
#[derive(Clone, Debug)]
pub struct Config {
    /// PostgreSQL connections in the pool (plus one LISTEN connection).
    /// Does not grow with the number of streams.
    pub pool_size: u32,
    /// Group-commit statements in flight at once per kind (enqueue, ack,
    /// nack, extend). Fewer means larger batches (less PostgreSQL work per
    /// job) under load; more lets more commits overlap. An idle broker runs
    /// each call's statement at once either way. Enqueues start a second
    /// statement beside a running one only once 100 rows wait.
    pub batch_concurrency: usize,
    /// How long an ack sent on a Consume stream that finds its batcher idle
    /// waits for others to share its commit. The sender does not wait on it
    /// (its result comes back on the stream), so at light load this trades
    /// up to this much ack latency for fewer commits; under load batches
    /// form anyway. Zero: every ack commits at once. Unary Ack and AckBatch
    /// calls never wait, nor does an ack that frees a stream's last credit
    /// (that would hold back the stream's next delivery).
    pub ack_linger: Duration,
    /// Heartbeat interval on idle streams.
    pub heartbeat_interval: Duration,
    /// Fallback poll: every queue with streams is checked this often even
    /// without a notification.
    pub poll_interval: Duration,
    /// How often the reaper looks for expired leases and jobs past their
    /// ttl. Leases of this broker's own streams are reaped at their deadline
    /// regardless; this pass catches leases of brokers that died.
    pub reap_interval: Duration,
    /// How often completed records past their queue's retention are
    /// deleted. Zero: this broker deletes none (other replicas may).
    pub retention_interval: Duration,
    /// The least time a job acked with a result (`AckRequest.result`) is
    /// kept, with its result, whatever its queue's completed retention
    /// (the longer of the two applies). Read by the retention loop: give
    /// every replica the same value.
    pub result_retention: Duration,
    /// How often the jobs waited on by WaitJob calls on this broker are
    /// read (one statement per cluster for all of them, only while any
    /// wait is open): how late a wait learns of an end on another replica.
    pub wait_poll_interval: Duration,
    /// Most WaitJob calls open at once on this broker; past it a call
    /// fails RESOURCE_EXHAUSTED.
    pub max_waiters: usize,
    /// How often the jobs table's dead tuples are checked (it is vacuumed
    /// past 10,000 + 20 % of its live rows). Zero: leave it to autovacuum.
    pub vacuum_interval: Duration,
    /// How often this broker fires due schedules (docs/design/schedules.md):
    /// a tick's job is enqueued up to this long after its time. Zero: this
    /// broker fires none (other replicas do).
    pub schedule_interval: Duration,
    /// A tick no broker fired within this long of its time is missed: its
    /// schedule's catch-up policy decides whether it fires.
    pub schedule_grace: Duration,
    /// How often PostgreSQL is probed for the health service (each probe
    /// waits at most 2 s for its answer).
    pub health_interval: Duration,
    /// PostgreSQL's `statement_timeout` on the broker's connections: a
    /// statement of the broker's running longer is cancelled by the server
    /// (UNAVAILABLE to the caller), and the broker gives up waiting for an
    /// answer 1 s after it (the connection is then closed: the server may
    /// be unreachable). Migrations and VACUUM run without it. None: neither
    /// is set (the server's or role's setting applies). docs/DEPLOYMENT.md.
    pub pg_statement_timeout: Option<Duration>,
    /// With several clusters: how often the home cluster's placement epoch
    /// is read (the map is re-read when it moved). Unused with one database.
    pub placement_interval: Duration,
    /// With several clusters: how often each cluster is swept for stray
    /// jobs (`placement::sweep`). Zero: never. Unused with one database.
    pub sweep_interval: Duration,
    /// On shutdown, how long in-flight calls may take before the broker
    /// stops anyway.
    pub drain_grace: Duration,
    /// Sizes of requests: payloads, batches, messages.
    pub request_limits: RequestLimits,
    /// HTTP/2 keepalive ping interval and timeout.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Close connections after this age (with GOAWAY) so long-lived streams
    /// rebalance across replicas. None: never.
    pub max_connection_age: Option<Duration>,
    /// Grace given to calls on a connection closed for its age.
    pub max_connection_age_grace: Option<Duration>,
    /// Serve Prometheus metrics at http://ADDR/metrics. None: off.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web console and `/metrics` at http://ADDR/ (https:// when
    /// the broker has TLS). None: off.
    pub http_listen: Option<SocketAddr>,
    /// How often the per-queue metric gauges (and the console's charts) are
    /// recomputed.
    pub metrics_interval: Duration,
    pub security: SecurityConfig,
    /// Export spans of the jobs' enqueues, deliveries and settles over
    /// OTLP/gRPC ([`crate::telemetry`]). None: off.
    pub otlp: Option<OtlpConfig>,
}

/// How large requests may be (not to be confused with the per-queue
/// concurrency and rate limits, which are queue settings in the database, or
/// the stream cap in [`SecurityConfig::max_streams`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Largest job payload accepted, in bytes.
    pub max_payload_bytes: usize,
    /// Most jobs in one EnqueueBatch (and acks in one AckBatch).
    pub max_batch_jobs: usize,
    /// Largest gRPC request message, in bytes (and the least every response
    /// message may be: a delivery of the largest job fits). At least
    /// `max_payload_bytes` + [`crate::request_limit::DELIVERY_OVERHEAD`].
    pub max_message_bytes: usize,
    /// Largest job result (`AckRequest.result`) accepted, in bytes.
    pub max_result_bytes: usize,
}

/// TLS, authentication and connection caps (docs/SECURITY.md).
#[derive(Clone, Debug)]
pub struct SecurityConfig {
    /// Serve TLS with this certificate chain and key (PEM). None: plaintext.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this CA.
    pub tls_client_ca: Option<PathBuf>,
    /// Bearer tokens and their grants. None: authentication is off.
    pub auth_file: Option<PathBuf>,
    /// Most streams open on this broker at once, over all connections.
    pub max_streams: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls open at once on one
    /// connection.
    pub max_streams_per_connection: u32,
    /// Calls processed at once per connection; beyond it a call fails with
    /// RESOURCE_EXHAUSTED at once. None: no limit beyond the one above.
    pub concurrency_limit_per_connection: Option<usize>,
    /// Client connections open at once; calls on one past it fail with
    /// RESOURCE_EXHAUSTED and it is closed ([`crate::conn_limit`]).
    pub max_connections: usize,
    /// Bytes of request messages under way at once on one connection
    /// (being received, handled, or a Consume stream's settles until
    /// answered); a message past it fails its call with RESOURCE_EXHAUSTED.
    /// At least `max_message_bytes`.
    pub max_request_bytes_per_connection: usize,
    /// Subscribe and Consume streams open at once on one connection.
    pub max_subscriptions_per_connection: usize,
    /// Total credit (max_in_flight) of the Subscribe and Consume streams
    /// open on one connection: the deliveries they may hold.
    pub max_in_flight_per_connection: u32,
}

/// Where and as what the broker exports its spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The collector's OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`
    /// (`https://` for TLS, verified against the system's roots and the CA
    /// in `OTEL_EXPORTER_OTLP_CERTIFICATE` if set).
    pub endpoint: String,
    /// `service.name` of the spans. None: `OTEL_SERVICE_NAME`, else `leaseq`.
    pub service_name: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pool_size: 10,
            batch_concurrency: 2,
            ack_linger: Duration::from_millis(12),
            heartbeat_interval: Duration::from_secs(15),
            poll_interval: Duration::from_secs(10),
            reap_interval: Duration::from_secs(5),
            retention_interval: Duration::from_secs(10),
            result_retention: Duration::from_secs(24 * 60 * 60),
            wait_poll_interval: Duration::from_millis(100),
            max_waiters: 10_000,
            vacuum_interval: Duration::from_secs(2),
            schedule_interval: Duration::from_secs(1),
            schedule_grace: Duration::from_secs(10),
            health_interval: Duration::from_secs(2),
            pg_statement_timeout: Some(DEFAULT_STATEMENT_TIMEOUT),
            placement_interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(30),
            drain_grace: Duration::from_secs(30),
            request_limits: RequestLimits::default(),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: None,
            max_connection_age_grace: None,
            metrics_listen: None,
            http_listen: None,
            metrics_interval: Duration::from_secs(5),
            security: SecurityConfig::default(),
            otlp: None,
        }
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_payload_bytes: 1024 * 1024,
            max_batch_jobs: 1000,
            // gRPC's usual limit: what clients accept by default.
            max_message_bytes: 4 * 1024 * 1024,
            max_result_bytes: 64 * 1024,
        }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            auth_file: None,
            max_streams: 10_000,
            max_streams_per_connection: 256,
            concurrency_limit_per_connection: None,
            max_connections: 1000,
            max_request_bytes_per_connection: 16 * 1024 * 1024,
            max_subscriptions_per_connection: 100,
            max_in_flight_per_connection: 20_000,
        }
    }
}
