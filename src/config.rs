//! Command line and environment. Every flag has an env twin; `--help` is the
//! reference.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the broker.
    Serve(ServeArgs),
    /// Apply database migrations and exit (`serve` also applies them).
    Migrate(DbArgs),
    /// Enqueue one job (payload from --payload or stdin).
    Enqueue(crate::cli::EnqueueArgs),
    /// Subscribe and print jobs as they arrive, acking each.
    Tail(crate::cli::TailArgs),
    /// Run a command once per job (payload on stdin, job fields in LEASEQ_*
    /// variables): exit 0 acks, anything else nacks with its stderr's tail.
    Work(crate::cli::work::WorkArgs),
    /// Load-generate against a running broker (or the raw-SQL baseline).
    Bench(crate::bench::BenchArgs),
    #[command(flatten)]
    Admin(crate::cli::admin::AdminCommand),
    /// Print the SHA-256 of a token (read from stdin) for the --auth-file,
    /// or with --generate make a new random token and print both.
    HashToken(crate::cli::HashTokenArgs),
}

#[derive(Args, Clone, Debug, Default)]
pub struct DbArgs {
    /// PostgreSQL connection URL. Without it leaseq runs its embedded
    /// PostgreSQL cluster from the server binaries installed on this machine.
    /// Prefer the environment variable: command lines are visible to other
    /// users. (`--help` does not print its value: it may hold a password.)
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory of the embedded cluster (used only without --database-url).
    /// Default: $XDG_DATA_HOME/leaseq/pg, else ~/.local/share/leaseq/pg;
    /// as root /var/lib/leaseq/pg.
    #[arg(long, env = "LEASEQ_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address the gRPC server listens on.
    #[arg(long, env = "LEASEQ_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub db: DbArgs,
    /// PostgreSQL connections in the pool (plus one LISTEN connection).
    /// Does not grow with the number of streams.
    #[arg(long, env = "LEASEQ_POOL_SIZE", default_value_t = 10)]
    pub pool_size: u32,
    /// Heartbeat interval on idle Subscribe streams.
    #[arg(long, env = "LEASEQ_HEARTBEAT_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Fallback poll: every queue with streams is checked this often even
    /// without a notification.
    #[arg(long, env = "LEASEQ_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How often the reaper looks for expired leases and jobs past their ttl.
    /// Leases of this broker's own streams are reaped at their deadline
    /// regardless; this pass catches leases of brokers that died.
    #[arg(long, env = "LEASEQ_REAP_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub reap_interval: Duration,
    /// How often completed jobs kept for their queue's completed_retention
    /// are deleted once older than it (every replica does; a pass deletes in
    /// batches of 10,000 until none is due). Records outlive their retention
    /// by up to this long. 0 = this broker deletes none (leave it to other
    /// replicas).
    #[arg(long, env = "LEASEQ_RETENTION_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub retention_interval: Duration,
    /// How often the jobs table's dead tuples are checked; it is vacuumed
    /// (by one replica at a time) past 10,000 + 20 % of its live rows, since
    /// autovacuum's default once-a-minute visit is far too slow for a queue
    /// table. 0 = leave it to autovacuum.
    #[arg(long, env = "LEASEQ_VACUUM_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub vacuum_interval: Duration,
    /// How often Postgres is probed for the health service.
    #[arg(long, env = "LEASEQ_HEALTH_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub health_interval: Duration,
    /// On SIGTERM/SIGINT, how long in-flight calls may take before exit.
    #[arg(long, env = "LEASEQ_DRAIN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub drain_grace: Duration,
    /// Largest job payload accepted, in bytes.
    #[arg(long, env = "LEASEQ_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// Most jobs in one EnqueueBatch.
    #[arg(long, env = "LEASEQ_MAX_BATCH_JOBS", default_value_t = 1000)]
    pub max_batch_jobs: usize,
    /// Largest gRPC request message, in bytes.
    #[arg(long, env = "LEASEQ_MAX_MESSAGE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// HTTP/2 keepalive ping interval.
    #[arg(long, env = "LEASEQ_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    #[arg(long, env = "LEASEQ_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,
    /// Close connections after this age (with GOAWAY) so long-lived streams
    /// rebalance across replicas. Unset = never.
    #[arg(long, env = "LEASEQ_MAX_CONNECTION_AGE", value_parser = parse_duration)]
    pub max_connection_age: Option<Duration>,
    /// Grace given to streams on a connection closed for its age.
    #[arg(long, env = "LEASEQ_MAX_CONNECTION_AGE_GRACE", value_parser = parse_duration)]
    pub max_connection_age_grace: Option<Duration>,
    /// Serve Prometheus metrics at http://ADDR/metrics. Unset = off.
    #[arg(long, env = "LEASEQ_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// How often the per-queue metric gauges are recomputed (one statistics
    /// query each time, not one per scrape).
    #[arg(long, env = "LEASEQ_METRICS_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub metrics_interval: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
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
    #[arg(long, env = "LEASEQ_MAX_STREAMS", default_value_t = 10_000)]
    pub max_streams: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: most calls (unary or
    /// streaming) open at once on one connection. A client over it waits for
    /// a free slot (or gets REFUSED_STREAM if it ignores the setting).
    #[arg(
        long,
        env = "LEASEQ_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 2000
    )]
    pub max_streams_per_connection: u32,
    /// Most calls being processed at once per connection; beyond it a call
    /// fails at once with RESOURCE_EXHAUSTED instead of queueing. Unset = no
    /// limit beyond --max-streams-per-connection.
    #[arg(long, env = "LEASEQ_CONCURRENCY_LIMIT_PER_CONNECTION")]
    pub concurrency_limit_per_connection: Option<usize>,
}

impl ServeArgs {
    /// Defaults, as `leaseq serve` with no flags and no environment.
    pub fn defaults() -> ServeArgs {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let mut args = Only::parse_from(["leaseq"]).serve;
        // Ignore the environment for library callers (tests).
        args.db = DbArgs::default();
        args
    }
}

/// Parses `250ms`, `15s`, `2m`, `1h`, or plain seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 250ms, 15s, 2m, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unit must be ms, s, m or h")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} must be a non-negative duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn defaults_parse() {
        let d = ServeArgs::defaults();
        assert_eq!(d.listen.port(), 50051);
        assert_eq!(d.heartbeat_interval, Duration::from_secs(15));
    }
}
