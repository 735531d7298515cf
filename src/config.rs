//! Command line and environment. Every flag has an env twin; `--help` is the
//! reference.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::CliDuration;
use leaseq_server::Config;
use leaseq_server::config::{OtlpConfig, RequestLimits, SecurityConfig};

#[derive(Parser, Debug)]
#[command(
    name = "leaseq",
    version,
    about = "A durable gRPC job queue broker on PostgreSQL"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "LEASEQ_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

// Parsed once per process: the size of `serve`'s arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the broker.
    Serve(ServeArgs),
    /// Apply database migrations and exit (`serve` also applies them);
    /// `migrate status` lists them, `migrate --print` prints their SQL.
    /// Needs DATABASE_URL (or PGHOST), or --data-dir for the embedded
    /// cluster: it never picks a database itself.
    Migrate(crate::cli::migrate::MigrateArgs),
    /// Enqueue one job (payload from --payload or stdin).
    Enqueue(crate::cli::EnqueueArgs),
    /// Consume and print jobs as they arrive, acking each on the stream.
    Tail(crate::cli::TailArgs),
    /// Wait for a job to end (WaitJob) and print its outcome: exit 0 when
    /// it completed (its result printed), 1 when it is dead or was
    /// cancelled, 3 when it is unknown (no live job and no record), 4 past
    /// --timeout.
    Wait(crate::cli::WaitArgs),
    /// Run a command once per job (payload on stdin, job fields in LEASEQ_*
    /// variables): exit 0 acks, anything else nacks with its stderr's tail.
    Work(crate::cli::work::WorkArgs),
    /// Queues over several PostgreSQL clusters (docs/SCALING.md): show the
    /// placement, move a bucket, pin a queue.
    #[command(subcommand)]
    Placement(PlacementCommand),
    /// Load-generate against a running broker (or the raw-SQL baseline).
    Bench(crate::bench::BenchArgs),
    #[command(flatten)]
    Admin(crate::cli::admin::AdminCommand),
    /// Check a broker's health (grpc.health.v1): exit 0 when it is SERVING.
    /// The container image's HEALTHCHECK.
    Health(crate::cli::health::HealthArgs),
    /// Print the SHA-256 of a token (read from stdin) for the --auth-file,
    /// or with --generate make a new random token and print both.
    HashToken(crate::cli::HashTokenArgs),
    /// Print a shell completion script, e.g.
    /// `leaseq completions bash > /etc/bash_completion.d/leaseq`.
    Completions(CompletionsArgs),
}

#[derive(Args, Clone, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Subcommand, Debug)]
pub enum PlacementCommand {
    /// Print each cluster's buckets, the moves under way and the pins.
    Show(PlacementArgs),
    /// Move a bucket to another cluster without losing or duplicating a
    /// job (brokers keep serving; see docs/SCALING.md).
    Move {
        #[command(flatten)]
        db: PlacementArgs,
        /// The bucket (0-1023); or give --queue to move the bucket of that queue.
        #[arg(long, required_unless_present = "queue")]
        bucket: Option<u32>,
        #[arg(long, conflicts_with = "bucket")]
        queue: Option<String>,
        /// The destination cluster's name.
        #[arg(long)]
        to: String,
    },
    /// Pin a queue name, or a prefix ending in `*`, to a cluster (refused
    /// while matching queues have jobs on another cluster).
    Pin {
        #[command(flatten)]
        db: PlacementArgs,
        pattern: String,
        cluster: String,
    },
}

/// Every cluster, as `leaseq serve` is given them.
#[derive(Args, Clone, Debug)]
pub struct PlacementArgs {
    /// NAME=URI, repeated, the home cluster first.
    #[arg(long = "database-url", required = true)]
    pub database_url: Vec<String>,
    /// Output: lines for people, or one JSON document.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: crate::cli::Output,
}

#[derive(Args, Clone, Debug, Default)]
pub struct DbArgs {
    /// PostgreSQL connection: a postgres:// URI or a libpq keyword/value
    /// string; the PG* variables fill what it leaves out. Without it (and
    /// without PGHOST/PGHOSTADDR) leaseq runs its embedded PostgreSQL cluster
    /// from the server binaries installed on this machine. Prefer the
    /// environment variable: command lines are visible to other users.
    /// (`--help` does not print its value: it may hold a password.)
    ///
    /// Several clusters (docs/SCALING.md): repeat it as NAME=URI, the home
    /// cluster (which holds the placement) first, e.g. `--database-url
    /// main=postgres://a/leaseq --database-url b=postgres://b/leaseq`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Vec<String>,
    /// Directory of the embedded cluster (used only without --database-url).
    /// Default: $XDG_DATA_HOME/leaseq/pg, else ~/.local/share/leaseq/pg;
    /// as root /var/lib/leaseq/pg.
    #[arg(long, env = "LEASEQ_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// `leaseq serve`'s flags. Defaults come from [`Config::default`], so the
/// library and the command line cannot disagree; [`ServeArgs::config`]
/// converts the rest into the server's [`Config`].
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "LEASEQ_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub db: DbArgs,
    /// PostgreSQL connections in the pool (plus one LISTEN connection).
    /// Does not grow with the number of streams.
    #[arg(long, env = "LEASEQ_POOL_SIZE", default_value_t = defaults().pool_size)]
    pub pool_size: u32,
    /// Group-commit statements in flight at once per kind (enqueue, ack,
    /// nack, extend): fewer makes larger batches under load.
    #[arg(long, env = "LEASEQ_BATCH_CONCURRENCY", default_value_t = defaults().batch_concurrency as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub batch_concurrency: u16,
    /// How long an ack on a Consume stream that finds nothing else to commit
    /// waits for company: fewer commits at light load for up to this much
    /// ack latency. Unary Ack and AckBatch never wait, nor does an ack that
    /// frees its stream's last credit. 0s: none. At most 1s.
    #[arg(long, env = "LEASEQ_ACK_LINGER", default_value_t = defaults().ack_linger.into(),
          value_parser = parse_ack_linger)]
    pub ack_linger: CliDuration,
    /// Heartbeat interval on idle streams.
    #[arg(long, env = "LEASEQ_HEARTBEAT_INTERVAL", default_value_t = defaults().heartbeat_interval.into())]
    pub heartbeat_interval: CliDuration,
    /// Fallback poll: every queue with streams is checked this often even
    /// without a notification.
    #[arg(long, env = "LEASEQ_POLL_INTERVAL", default_value_t = defaults().poll_interval.into())]
    pub poll_interval: CliDuration,
    /// How often the reaper looks for expired leases and jobs past their ttl.
    /// Leases of this broker's own streams are reaped at their deadline
    /// regardless; this pass catches leases of brokers that died.
    #[arg(long, env = "LEASEQ_REAP_INTERVAL", default_value_t = defaults().reap_interval.into())]
    pub reap_interval: CliDuration,
    /// How often completed jobs kept for their queue's completed_retention
    /// are deleted once older than it (every replica does; a pass deletes in
    /// batches of 10,000 until none is due). Records outlive their retention
    /// by up to this long. 0 = this broker deletes none (leave it to other
    /// replicas).
    #[arg(long, env = "LEASEQ_RETENTION_INTERVAL", default_value_t = defaults().retention_interval.into())]
    pub retention_interval: CliDuration,
    /// The least time a job acked with a result is kept, with its result
    /// (for GetJob and WaitJob), whatever its queue's completed_retention:
    /// the longer of the two applies. Give every replica the same value.
    #[arg(long, env = "LEASEQ_RESULT_RETENTION", default_value_t = defaults().result_retention.into())]
    pub result_retention: CliDuration,
    /// How often the jobs waited on by WaitJob calls on this broker are
    /// read (one statement for all of them, only while any wait is open):
    /// the most a wait learns late of a job that ended on another replica.
    #[arg(long, env = "LEASEQ_WAIT_POLL_INTERVAL", default_value_t = defaults().wait_poll_interval.into())]
    pub wait_poll_interval: CliDuration,
    /// Most WaitJob calls open at once on this broker (RESOURCE_EXHAUSTED
    /// past it).
    #[arg(long, env = "LEASEQ_MAX_WAITERS", default_value_t = defaults().max_waiters)]
    pub max_waiters: usize,
    /// How often the jobs table's dead tuples are checked; it is vacuumed
    /// (by one replica at a time) past 10,000 + 20 % of its live rows, since
    /// autovacuum's default once-a-minute visit is far too slow for a queue
    /// table. 0 = leave it to autovacuum.
    #[arg(long, env = "LEASEQ_VACUUM_INTERVAL", default_value_t = defaults().vacuum_interval.into())]
    pub vacuum_interval: CliDuration,
    /// How often this broker fires due schedules (every replica does; a
    /// schedule's row lock makes one of them fire each tick): a tick's job
    /// is enqueued up to this long after its time. 0 = this broker fires
    /// none (leave it to other replicas).
    #[arg(long, env = "LEASEQ_SCHEDULE_INTERVAL", default_value_t = defaults().schedule_interval.into())]
    pub schedule_interval: CliDuration,
    /// A schedule's tick that no broker fired within this long of its time
    /// (all were down) is missed: the schedule's catch-up policy (none, one,
    /// all up to its limit) decides whether it fires. At most 1h.
    #[arg(long, env = "LEASEQ_SCHEDULE_GRACE", default_value_t = defaults().schedule_grace.into())]
    pub schedule_grace: CliDuration,
    /// How often Postgres is probed for the health service (each probe
    /// waits at most 2s for its answer).
    #[arg(long, env = "LEASEQ_HEALTH_INTERVAL", default_value_t = defaults().health_interval.into())]
    pub health_interval: CliDuration,
    /// PostgreSQL's statement_timeout on the broker's connections (not on
    /// migrations or VACUUM): the server cancels a statement of the
    /// broker's that runs longer, and the broker stops waiting for an
    /// answer 1s after it and closes the connection. 0 = set neither.
    #[arg(long, env = "LEASEQ_PG_STATEMENT_TIMEOUT",
          default_value_t = defaults().pg_statement_timeout.unwrap_or_default().into(),
          value_parser = parse_statement_timeout)]
    pub pg_statement_timeout: CliDuration,
    /// With several --database-url: how often the placement's epoch is read
    /// from the home cluster (the bucket map is re-read when it changed).
    #[arg(long, env = "LEASEQ_PLACEMENT_INTERVAL", default_value_t = defaults().placement_interval.into())]
    pub placement_interval: CliDuration,
    /// With several --database-url: how often each cluster is swept for
    /// stray jobs (jobs of queues placed on another cluster, e.g. from
    /// `leaseq.enqueue()` on the wrong database), which are moved to their
    /// queue's cluster as a bucket move moves them. 0 turns it off.
    #[arg(long, env = "LEASEQ_SWEEP_INTERVAL", default_value_t = defaults().sweep_interval.into())]
    pub sweep_interval: CliDuration,
    /// On SIGTERM/SIGINT, how long in-flight calls may take before exit.
    #[arg(long, env = "LEASEQ_DRAIN_GRACE", default_value_t = defaults().drain_grace.into())]
    pub drain_grace: CliDuration,
    /// Largest job payload accepted, in bytes.
    #[arg(long, env = "LEASEQ_MAX_PAYLOAD_BYTES", default_value_t = defaults().request_limits.max_payload_bytes)]
    pub max_payload_bytes: usize,
    /// Most jobs in one EnqueueBatch (and acks in one AckBatch).
    #[arg(long, env = "LEASEQ_MAX_BATCH_JOBS", default_value_t = defaults().request_limits.max_batch_jobs)]
    pub max_batch_jobs: usize,
    /// Largest gRPC request message, in bytes; beyond it a call fails with
    /// RESOURCE_EXHAUSTED. Must be at least --max-payload-bytes + 1,132,672
    /// (a job's largest headers and last error), so that every job fits in
    /// a message both ways. The default is what gRPC clients receive by
    /// default: raise their limit too if you raise this.
    #[arg(long, env = "LEASEQ_MAX_MESSAGE_BYTES", default_value_t = defaults().request_limits.max_message_bytes)]
    pub max_message_bytes: usize,
    /// Largest job result an ack may carry (AckRequest.result), in bytes;
    /// a larger one is refused RESOURCE_EXHAUSTED and nothing is acked.
    #[arg(long, env = "LEASEQ_MAX_RESULT_BYTES", default_value_t = defaults().request_limits.max_result_bytes)]
    pub max_result_bytes: usize,
    /// HTTP/2 keepalive ping interval.
    #[arg(long, env = "LEASEQ_KEEPALIVE_INTERVAL", default_value_t = defaults().keepalive_interval.into())]
    pub keepalive_interval: CliDuration,
    /// HTTP/2 keepalive ping timeout.
    #[arg(long, env = "LEASEQ_KEEPALIVE_TIMEOUT", default_value_t = defaults().keepalive_timeout.into())]
    pub keepalive_timeout: CliDuration,
    /// Close connections after this age (with GOAWAY) so long-lived streams
    /// rebalance across replicas. Unset = never.
    #[arg(long, env = "LEASEQ_MAX_CONNECTION_AGE")]
    pub max_connection_age: Option<CliDuration>,
    /// Grace given to streams on a connection closed for its age.
    #[arg(long, env = "LEASEQ_MAX_CONNECTION_AGE_GRACE")]
    pub max_connection_age_grace: Option<CliDuration>,
    /// Serve Prometheus metrics at http://ADDR/metrics. Unset = off.
    #[arg(long, env = "LEASEQ_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web console and /metrics at http://ADDR/ (https:// with
    /// --tls-cert: the same certificate). Unset = off. See docs/ADMIN.md.
    #[arg(long, env = "LEASEQ_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// How often the per-queue metric gauges are recomputed (one statistics
    /// query each time, not one per scrape), and the console's charts.
    #[arg(long, env = "LEASEQ_METRICS_INTERVAL", default_value_t = defaults().metrics_interval.into())]
    pub metrics_interval: CliDuration,
    #[command(flatten)]
    pub security: SecurityArgs,
    /// Export spans of every job's enqueue, deliveries and settles (children
    /// of its `traceparent` header) to this OTLP/gRPC collector, e.g.
    /// http://127.0.0.1:4317. Unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
    /// OTEL_EXPORTER_OTLP_ENDPOINT; none of them = tracing off
    /// (OTEL_SDK_DISABLED=true turns it off too). See docs/clients.md.
    #[arg(long, env = "LEASEQ_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// service.name of the exported spans. Unset: OTEL_SERVICE_NAME, else
    /// leaseq.
    #[arg(long, env = "LEASEQ_OTLP_SERVICE_NAME")]
    pub otlp_service_name: Option<String>,
}

fn defaults() -> Config {
    Config::default()
}

/// TLS, authentication and connection limits of `serve` (docs/SECURITY.md).
#[derive(Args, Clone, Debug)]
pub struct SecurityArgs {
    /// Serve TLS with this certificate chain (PEM). Needs --tls-key.
    /// Without it the gRPC port is plaintext.
    #[arg(long, env = "LEASEQ_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM).
    #[arg(long, env = "LEASEQ_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this CA (PEM).
    #[arg(long, env = "LEASEQ_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Bearer tokens and their per-queue grants (JSON, see docs/SECURITY.md).
    /// Without it authentication is OFF: any client may do anything.
    #[arg(long, env = "LEASEQ_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// Most Subscribe streams open on this broker at once, over all
    /// connections; beyond it Subscribe fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "LEASEQ_MAX_STREAMS", default_value_t = defaults().security.max_streams)]
    pub max_streams: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: most calls (unary or
    /// streaming) open at once on one connection. A client over it waits for
    /// a free slot (or gets REFUSED_STREAM if it ignores the setting).
    #[arg(
        long,
        env = "LEASEQ_MAX_STREAMS_PER_CONNECTION",
        default_value_t = defaults().security.max_streams_per_connection
    )]
    pub max_streams_per_connection: u32,
    /// Most calls being processed at once per connection; beyond it a call
    /// fails at once with RESOURCE_EXHAUSTED instead of queueing. Unset = no
    /// limit beyond --max-streams-per-connection.
    #[arg(long, env = "LEASEQ_CONCURRENCY_LIMIT_PER_CONNECTION")]
    pub concurrency_limit_per_connection: Option<usize>,
    /// Most client connections open at once. Calls on a connection past it
    /// fail with RESOURCE_EXHAUSTED (health checks excepted) and it is
    /// closed after 2s.
    #[arg(long, env = "LEASEQ_MAX_CONNECTIONS", default_value_t = defaults().security.max_connections)]
    pub max_connections: usize,
    /// Most bytes of request messages under way at once on one connection
    /// (being received or handled; a Consume stream's settles until their
    /// results are sent). A message past it fails its call with
    /// RESOURCE_EXHAUSTED. At least --max-message-bytes.
    #[arg(
        long,
        env = "LEASEQ_MAX_REQUEST_BYTES_PER_CONNECTION",
        default_value_t = defaults().security.max_request_bytes_per_connection
    )]
    pub max_request_bytes_per_connection: usize,
    /// Most Subscribe and Consume streams open at once on one connection;
    /// beyond it one fails with RESOURCE_EXHAUSTED (open it on another
    /// connection).
    #[arg(
        long,
        env = "LEASEQ_MAX_SUBSCRIPTIONS_PER_CONNECTION",
        default_value_t = defaults().security.max_subscriptions_per_connection
    )]
    pub max_subscriptions_per_connection: usize,
    /// Most credit (max_in_flight) of all the Subscribe and Consume streams
    /// open on one connection, i.e. the deliveries they may hold; a stream
    /// that would pass it fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "LEASEQ_MAX_IN_FLIGHT_PER_CONNECTION",
          default_value_t = defaults().security.max_in_flight_per_connection,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight_per_connection: u32,
}

/// `--ack-linger`: a duration of at most a second (a longer one would hold
/// every stream's credit back that long).
fn parse_ack_linger(s: &str) -> Result<CliDuration, String> {
    let d = crate::duration::parse_duration(s)?;
    if d > std::time::Duration::from_secs(1) {
        return Err(format!("{s}: at most 1s"));
    }
    Ok(CliDuration(d))
}

/// `--pg-statement-timeout`: 0, or what PostgreSQL's statement_timeout
/// takes (whole milliseconds, 1ms to 2^31-1 ms, about 24 days).
fn parse_statement_timeout(s: &str) -> Result<CliDuration, String> {
    let d = crate::duration::parse_duration(s)?;
    if d.is_zero() {
        return Ok(CliDuration(d));
    }
    if d < std::time::Duration::from_millis(1) || d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!(
            "{s}: whole milliseconds (e.g. 500ms, 30s), or 0 for none"
        ));
    }
    if d.as_millis() > i32::MAX as u128 {
        return Err(format!("{s}: at most 24d (PostgreSQL's limit)"));
    }
    Ok(CliDuration(d))
}

impl ServeArgs {
    /// Where spans go: --otlp-endpoint / LEASEQ_OTLP_ENDPOINT, else the
    /// standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
    /// OTEL_EXPORTER_OTLP_ENDPOINT (empty = unset); None when all are unset
    /// or OTEL_SDK_DISABLED is true. `env` reads a variable.
    pub fn otlp(&self, env: impl Fn(&str) -> Option<String>) -> Option<OtlpConfig> {
        let set = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let endpoint = set(self.otlp_endpoint.clone())
            .or_else(|| set(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")))
            .or_else(|| set(env("OTEL_EXPORTER_OTLP_ENDPOINT")))?;
        Some(OtlpConfig {
            endpoint,
            service_name: set(self.otlp_service_name.clone()),
        })
    }

    /// The server's settings these flags describe.
    pub fn config(&self) -> Config {
        let s = &self.security;
        Config {
            pool_size: self.pool_size,
            batch_concurrency: usize::from(self.batch_concurrency),
            ack_linger: self.ack_linger.0,
            heartbeat_interval: self.heartbeat_interval.0,
            poll_interval: self.poll_interval.0,
            reap_interval: self.reap_interval.0,
            retention_interval: self.retention_interval.0,
            result_retention: self.result_retention.0,
            wait_poll_interval: self.wait_poll_interval.0,
            max_waiters: self.max_waiters,
            vacuum_interval: self.vacuum_interval.0,
            schedule_interval: self.schedule_interval.0,
            schedule_grace: self.schedule_grace.0,
            health_interval: self.health_interval.0,
            pg_statement_timeout: Some(self.pg_statement_timeout.0).filter(|d| !d.is_zero()),
            placement_interval: self.placement_interval.0,
            sweep_interval: self.sweep_interval.0,
            drain_grace: self.drain_grace.0,
            request_limits: RequestLimits {
                max_payload_bytes: self.max_payload_bytes,
                max_batch_jobs: self.max_batch_jobs,
                max_message_bytes: self.max_message_bytes,
                max_result_bytes: self.max_result_bytes,
            },
            keepalive_interval: self.keepalive_interval.0,
            keepalive_timeout: self.keepalive_timeout.0,
            max_connection_age: self.max_connection_age.map(|d| d.0),
            max_connection_age_grace: self.max_connection_age_grace.map(|d| d.0),
            metrics_listen: self.metrics_listen,
            http_listen: self.http_listen,
            metrics_interval: self.metrics_interval.0,
            security: SecurityConfig {
                tls_cert: s.tls_cert.clone(),
                tls_key: s.tls_key.clone(),
                tls_client_ca: s.tls_client_ca.clone(),
                auth_file: s.auth_file.clone(),
                max_streams: s.max_streams,
                max_streams_per_connection: s.max_streams_per_connection,
                concurrency_limit_per_connection: s.concurrency_limit_per_connection,
                max_connections: s.max_connections,
                max_request_bytes_per_connection: s.max_request_bytes_per_connection,
                max_subscriptions_per_connection: s.max_subscriptions_per_connection,
                max_in_flight_per_connection: s.max_in_flight_per_connection,
            },
            otlp: self.otlp(|k| std::env::var(k).ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_default_to_the_library_config() {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let args = Serve::try_parse_from(["leaseq"]).unwrap().serve;
        let (mut from_flags, lib) = (args.config(), Config::default());
        // Set by the environment the tests run in, if at all.
        from_flags.otlp = args.otlp(|_| None);
        assert_eq!(args.listen.port(), 50051);
        assert_eq!(format!("{from_flags:?}"), format!("{lib:?}"));
    }

    #[test]
    fn the_ack_linger_is_a_duration_of_at_most_a_second() {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let linger = |v: &str| {
            Serve::try_parse_from(["leaseq", "--ack-linger", v])
                .map(|a| a.serve.config().ack_linger)
        };
        assert_eq!(linger("0s").unwrap(), std::time::Duration::ZERO);
        assert_eq!(
            linger("500us").unwrap(),
            std::time::Duration::from_micros(500)
        );
        assert_eq!(linger("1s").unwrap(), std::time::Duration::from_secs(1));
        let e = linger("2s").unwrap_err().to_string();
        assert!(
            e.contains("--ack-linger") && e.contains("at most 1s"),
            "{e}"
        );
        assert!(linger("soon").is_err());
    }

    #[test]
    fn the_statement_timeout_is_whole_milliseconds_or_none() {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let timeout = |v: &str| {
            Serve::try_parse_from(["leaseq", "--pg-statement-timeout", v])
                .map(|a| a.serve.config().pg_statement_timeout)
        };
        let ms = std::time::Duration::from_millis;
        assert_eq!(timeout("0").unwrap(), None);
        assert_eq!(timeout("0s").unwrap(), None);
        assert_eq!(timeout("1500ms").unwrap(), Some(ms(1500)));
        assert_eq!(timeout("2m").unwrap(), Some(ms(120_000)));
        for bad in ["500us", "1.0005", "30d", "soon"] {
            let e = timeout(bad).unwrap_err().to_string();
            assert!(e.contains("--pg-statement-timeout"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_otlp_endpoint_is_the_flag_else_the_standard_variables() {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse = |argv: &[&str]| Serve::try_parse_from(argv).unwrap().serve;
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let endpoint = |args: &ServeArgs, vars: &'static [(&'static str, &'static str)]| {
            args.otlp(env(vars)).map(|o| o.endpoint)
        };
        let none = parse(&["leaseq"]);
        assert_eq!(endpoint(&none, &[]), None);
        assert_eq!(
            endpoint(&none, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")]).as_deref(),
            Some("http://c:4317")
        );
        let both = &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317"),
        ];
        assert_eq!(endpoint(&none, both).as_deref(), Some("http://t:4317"));
        let flag = parse(&["leaseq", "--otlp-endpoint", "http://f:4317"]);
        assert_eq!(endpoint(&flag, both).as_deref(), Some("http://f:4317"));
        assert_eq!(endpoint(&flag, &[("OTEL_SDK_DISABLED", "true")]), None);
        assert_eq!(
            endpoint(&none, &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            None,
            "empty is unset"
        );
        let named = parse(&[
            "leaseq",
            "--otlp-endpoint",
            "http://f:4317",
            "--otlp-service-name",
            "q1",
        ]);
        assert_eq!(
            named.otlp(|_| None).unwrap().service_name.as_deref(),
            Some("q1")
        );
    }
}
