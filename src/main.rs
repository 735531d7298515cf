//! The `leaseq` binary: parse the command line, set up logging, run.

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use leaseq::config::{Cli, Command, DbArgs};
use leaseq::embedded::{EmbeddedOptions, EmbeddedPostgres};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    leaseq::telemetry::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let (url, embedded) = database(&args.db).await?;
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("binding {}", args.listen))?;
            let shutdown = CancellationToken::new();
            tokio::spawn(on_signal(shutdown.clone()));
            let result = leaseq_server::server::run(args.config(), &url, listener, shutdown).await;
            if let Some(pg) = embedded.filter(EmbeddedPostgres::started_here) {
                info!("stopping embedded PostgreSQL");
                pg.stop().await?;
            }
            result
        }
        Command::Migrate(db) => {
            let (url, embedded) = database(&db).await?;
            let result = async {
                let pool = leaseq_server::store::connect(&url, 1).await?;
                leaseq_server::store::migrate(&pool).await?;
                pool.close().await;
                info!("migrations applied");
                anyhow::Ok(())
            }
            .await;
            if let Some(pg) = embedded.filter(EmbeddedPostgres::started_here) {
                pg.stop().await?;
            }
            result
        }
        Command::Enqueue(args) => leaseq::cli::enqueue(args).await,
        Command::Tail(args) => leaseq::cli::tail(args).await,
        Command::Work(args) => leaseq::cli::work::run(args).await,
        Command::Bench(args) => leaseq::bench::run(args).await,
        Command::Admin(cmd) => std::process::exit(leaseq::cli::admin::run(cmd).await),
        Command::HashToken(args) => leaseq::cli::hash_token(args),
    }
}

/// What to connect to: DATABASE_URL / --database-url (a URI or keyword/value
/// string, read with the PG* variables); else, unless --data-dir /
/// LEASEQ_DATA_DIR asks for the embedded cluster, the PG* variables alone
/// when PGHOST or PGHOSTADDR names a server; else the embedded cluster.
/// The settings are checked here, so a malformed one stops at once.
async fn database(db: &DbArgs) -> anyhow::Result<(String, Option<EmbeddedPostgres>)> {
    use leaseq_server::pgconn;
    let given = db.database_url.as_deref().filter(|u| !u.trim().is_empty());
    let conninfo = match (given, pgconn::server_from_env()) {
        (Some(url), _) => Some((url.to_owned(), "DATABASE_URL / --database-url")),
        (None, Some(var)) if db.data_dir.is_none() => Some((String::new(), var)),
        _ => None,
    };
    if let Some((conninfo, from)) = conninfo {
        let target = pgconn::connect_options(&conninfo).with_context(|| {
            format!("PostgreSQL connection settings ({from} and PG* variables)")
        })?;
        for warning in &target.warnings {
            warn!("{warning}");
        }
        info!(database = %target, via = from, "connecting to PostgreSQL");
        return Ok((conninfo, None));
    }
    let dir = db
        .data_dir
        .clone()
        .unwrap_or_else(EmbeddedOptions::default_dir);
    info!(dir = %dir.display(), "no DATABASE_URL: using the embedded PostgreSQL cluster");
    let pg = EmbeddedPostgres::start(EmbeddedOptions { dir, durable: true }).await?;
    Ok((pg.url("leaseq"), Some(pg)))
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
    shutdown.cancel();
}
