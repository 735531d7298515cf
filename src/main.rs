//! The `leaseq` binary: parse the command line, set up logging, run.

use anyhow::Context;
use clap::{CommandFactory, Parser};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use leaseq::cli;
use leaseq::config::{Cli, Command, DbArgs, ServeArgs};
use leaseq::embedded::{EmbeddedOptions, EmbeddedPostgres};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let parsed = Cli::parse();
    leaseq::telemetry::init(parsed.log_format);
    // The client commands exit with the codes of `leaseq::cli::exit`; the
    // others with 0, or 1 and their error.
    let client = match parsed.command {
        Command::Serve(args) => return serve(args).await,
        Command::Migrate(db) => return migrate(&db).await,
        Command::Bench(args) => return leaseq::bench::run(args).await,
        Command::Completions(args) => {
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut Cli::command(), "leaseq", &mut script);
            // Written here, not by clap_complete, which panics on a closed
            // pipe (`leaseq completions bash | head`).
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            return Ok(());
        }
        Command::Enqueue(args) => cli::enqueue(args).await,
        Command::Tail(args) => cli::tail(args).await,
        Command::Work(args) => cli::work::run(args).await,
        Command::Admin(cmd) => cli::admin::run(cmd).await,
        Command::HashToken(args) => cli::hash_token(args),
    };
    std::process::exit(cli::report(client))
}

/// `leaseq serve`: the broker, until SIGTERM / SIGINT and its drain.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
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

/// `leaseq migrate`: apply the migrations and exit.
async fn migrate(db: &DbArgs) -> anyhow::Result<()> {
    let (url, embedded) = database(db).await?;
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
