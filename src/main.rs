//! The `leaseq` binary: parse the command line, set up logging, run.

// Tests may be long (a scenario reads top to bottom); the code they test
// may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

use anyhow::Context;
use clap::{CommandFactory, Parser};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use leaseq::cli::{self, print_json};
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
        Command::Migrate(args) => return migrate(args).await,
        Command::Bench(args) => return leaseq::bench::run(args).await,
        Command::Placement(cmd) => return placement(cmd).await,
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
        Command::Wait(args) => cli::wait(args).await,
        Command::Work(args) => cli::work::run(args).await,
        Command::Admin(cmd) => cli::admin::run(cmd).await,
        Command::HashToken(args) => cli::hash_token(args),
        Command::Health(args) => cli::health::run(args).await,
    };
    std::process::exit(cli::report(client))
}

/// `leaseq serve`: the broker, until SIGTERM / SIGINT and its drain.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.db.database_url.len() > 1 {
        return serve_clusters(args).await;
    }
    let (url, embedded) = database(&args.db, Embedded::ByDefault).await?;
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

/// `leaseq serve` over several clusters (docs/SCALING.md): every
/// --database-url is NAME=URI, the home cluster first; no embedded cluster.
async fn serve_clusters(args: ServeArgs) -> anyhow::Result<()> {
    let databases = named_databases(&args.db.database_url)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signal(shutdown.clone()));
    leaseq_server::server::run_clusters(args.config(), &databases, listener, shutdown).await
}

/// Reads `NAME=URI` values (checked like a single DATABASE_URL).
fn named_databases(values: &[String]) -> anyhow::Result<Vec<leaseq_server::server::Database>> {
    use leaseq_server::placement::valid_name;
    let mut out: Vec<leaseq_server::server::Database> = Vec::new();
    for v in values {
        let Some((name, url)) = v.split_once('=').filter(|(n, _)| valid_name(n)) else {
            anyhow::bail!(
                "with several --database-url each must be NAME=URI (NAME: lowercase letters, digits, - and _, starting with a letter)"
            );
        };
        anyhow::ensure!(
            !out.iter().any(|d| d.name == name),
            "cluster {name:?} is given twice"
        );
        let target = leaseq_server::pgconn::connect_options(url)
            .with_context(|| format!("--database-url of cluster {name}"))?;
        for warning in &target.warnings {
            warn!("{warning}");
        }
        info!(cluster = name, database = %target, "connecting to PostgreSQL");
        out.push(leaseq_server::server::Database {
            name: name.to_owned(),
            url: url.to_owned(),
        });
    }
    Ok(out)
}

/// `leaseq placement ...`: connects to every cluster (home first) and shows
/// or changes the placement (`-o json`: one JSON document; a move shows
/// what it copied on a terminal).
async fn placement(cmd: leaseq::config::PlacementCommand) -> anyhow::Result<()> {
    use leaseq::config::PlacementCommand as P;
    use leaseq_server::ClusterId;
    use leaseq_server::placement as pl;
    let args = match &cmd {
        P::Show(db) | P::Move { db, .. } | P::Pin { db, .. } => db.clone(),
    };
    let dbs = named_databases(&args.database_url)?;
    let mut pools = Vec::new();
    for db in &dbs {
        let pool = leaseq_server::store::connect(&db.url, 2)
            .await
            .with_context(|| format!("connecting to cluster {}", db.name))?;
        leaseq_server::store::migrate(&pool).await?;
        pools.push(pool);
    }
    let names: Vec<String> = dbs.iter().map(|d| d.name.clone()).collect();
    let ids = pl::setup(&pools[0], &names).await?;
    let id_of = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .map(|i| ids[i])
            .ok_or_else(|| anyhow::anyhow!("no --database-url names cluster {name:?}"))
    };
    let placed: Vec<(ClusterId, sqlx::PgPool)> = ids.iter().copied().zip(pools).collect();
    let json = args.output == leaseq::cli::Output::Json;
    match cmd {
        P::Show(_) => {
            let map = pl::load(&placed[0].1).await?;
            show_placement(&map, &names, &ids, json);
        }
        P::Move {
            bucket, queue, to, ..
        } => move_bucket(&placed, bucket, queue, &to, &id_of, json).await?,
        P::Pin {
            pattern, cluster, ..
        } => {
            pl::pin(&placed, &pattern, id_of(&cluster)?).await?;
            if json {
                print_json(&serde_json::json!({"pattern": pattern, "cluster": cluster}));
            } else {
                println!("{pattern} pinned to {cluster}");
            }
        }
    }
    Ok(())
}

/// `leaseq placement show`: the clusters (`names`, their `ids`) and their
/// buckets, the moves under way and the pins.
fn show_placement(
    map: &leaseq_server::placement::Map,
    names: &[String],
    ids: &[leaseq_server::ClusterId],
    json: bool,
) {
    let name_of = |id: &leaseq_server::ClusterId| {
        ids.iter()
            .position(|i| i == id)
            .map_or_else(|| format!("id {id}"), |i| names[i].clone())
    };
    let count = |id: &leaseq_server::ClusterId| map.buckets.iter().filter(|c| *c == id).count();
    if json {
        print_json(&serde_json::json!({
            "epoch": map.epoch,
            "clusters": names.iter().zip(ids).map(|(name, id)| serde_json::json!({
                "name": name, "id": id.0, "buckets": count(id),
            })).collect::<Vec<_>>(),
            "moving": map.moving.iter().map(|(b, to)| serde_json::json!({
                "bucket": b, "to": name_of(to),
            })).collect::<Vec<_>>(),
            "pins": map.pins.iter().map(|(p, c)| serde_json::json!({
                "pattern": p, "cluster": name_of(c),
            })).collect::<Vec<_>>(),
        }));
        return;
    }
    println!("epoch {}", map.epoch);
    for (name, id) in names.iter().zip(ids) {
        println!("cluster {name} (id {id}): {} buckets", count(id));
    }
    for (b, to) in &map.moving {
        println!("bucket {b}: moving to cluster id {to}");
    }
    for (p, c) in &map.pins {
        println!("pin {p} -> cluster id {c}");
    }
}

/// `leaseq placement move`: the bucket given, or the queue's, to cluster
/// `to` (`id_of` finds its id), showing what it copied on a terminal.
async fn move_bucket(
    placed: &[(leaseq_server::ClusterId, sqlx::PgPool)],
    bucket: Option<u32>,
    queue: Option<String>,
    to: &str,
    id_of: &dyn Fn(&str) -> anyhow::Result<leaseq_server::ClusterId>,
    json: bool,
) -> anyhow::Result<()> {
    use leaseq_server::placement as pl;
    let bucket = match (bucket, queue) {
        (Some(b), _) => b,
        (None, Some(q)) => pl::bucket_of(&q),
        (None, None) => anyhow::bail!("give --bucket or --queue"),
    };
    // What has been copied so far, on a terminal.
    let (progress, mut copied) = tokio::sync::watch::channel(pl::Moved::default());
    let spinner = leaseq::cli::interactive::spinner(&format!("moving bucket {bucket} to {to}"));
    let shown = spinner.clone();
    let show = tokio::spawn(async move {
        while copied.changed().await.is_ok() {
            let m = copied.borrow_and_update().clone();
            shown.set_message(format!(
                "moving bucket {bucket}: {} jobs, {} dead letters, {} completed copied",
                m.jobs, m.dead, m.completed
            ));
        }
    });
    let opts = pl::MoveOptions {
        progress: Some(progress),
        ..pl::MoveOptions::default()
    };
    let moved = pl::move_bucket(placed, bucket, id_of(to)?, &opts).await;
    drop(opts);
    let _ = show.await;
    spinner.finish_and_clear();
    let moved = moved?;
    if json {
        print_json(&serde_json::json!({
            "bucket": bucket, "to": to, "queues": moved.queues,
            "jobs": moved.jobs, "dead": moved.dead, "completed": moved.completed,
        }));
    } else {
        println!(
            "bucket {bucket} moved to {to}: {} queues, {} jobs, {} dead letters",
            moved.queues, moved.jobs, moved.dead
        );
    }
    Ok(())
}

/// `leaseq migrate [status] [--print]` (src/cli/migrate.rs), on the
/// database named: never on the embedded cluster unless --data-dir asks.
async fn migrate(args: leaseq::cli::migrate::MigrateArgs) -> anyhow::Result<()> {
    use leaseq::cli::migrate::{self as m, MigrateCmd};
    if args.print && args.all {
        return m::print(None).await;
    }
    let (db, output) = match &args.cmd {
        Some(MigrateCmd::Status(s)) => (&s.db, s.output),
        None => (&args.db, args.output),
    };
    let (url, embedded) = database(db, Embedded::OnlyWithDataDir).await?;
    let result = async {
        let pool = leaseq_server::store::connect(&url, 1).await?;
        let r = match &args.cmd {
            Some(MigrateCmd::Status(_)) => m::status(&pool, output).await,
            None if args.print => m::print(Some(&pool)).await,
            None => m::apply(&pool, output).await,
        };
        pool.close().await;
        r
    }
    .await;
    if let Some(pg) = embedded.filter(EmbeddedPostgres::started_here) {
        pg.stop().await?;
    }
    result
}

/// When [`database`] may start the embedded cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Embedded {
    /// Without any database setting (`serve`: the development default).
    ByDefault,
    /// Only when --data-dir / LEASEQ_DATA_DIR names its directory
    /// (`migrate`, which must not change a database nobody named).
    OnlyWithDataDir,
}

/// What to connect to: DATABASE_URL / --database-url (a URI or keyword/value
/// string, read with the PG* variables); else, unless --data-dir /
/// LEASEQ_DATA_DIR asks for the embedded cluster, the PG* variables alone
/// when PGHOST or PGHOSTADDR names a server; else the embedded cluster.
/// The settings are checked here, so a malformed one stops at once.
async fn database(
    db: &DbArgs,
    embedded: Embedded,
) -> anyhow::Result<(String, Option<EmbeddedPostgres>)> {
    use leaseq_server::pgconn;
    anyhow::ensure!(
        db.database_url.len() <= 1,
        "this command takes one --database-url"
    );
    let given = db
        .database_url
        .first()
        .map(String::as_str)
        .filter(|u| !u.trim().is_empty());
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
    anyhow::ensure!(
        embedded == Embedded::ByDefault || db.data_dir.is_some(),
        "which database? Set DATABASE_URL (or --database-url, or PGHOST), or --data-dir for the embedded cluster"
    );
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
