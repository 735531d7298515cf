//! `leaseq migrate`: apply the migrations (the default), `migrate status`
//! (each migration: applied, pending, or changed / missing, which stop a
//! broker from starting), and `migrate --print` (the SQL of the pending
//! ones, with the bookkeeping rows sqlx would write, for a database
//! administrator who applies it by hand).
//!
//! Unlike `serve`, `migrate` never picks a database itself: it needs
//! DATABASE_URL (or PGHOST), or --data-dir for the embedded cluster
//! (`main.rs`, `database`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde_json::json;
use sqlx::PgPool;

use super::output::{self, Output};
use crate::config::DbArgs;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub cmd: Option<MigrateCmd>,
    #[command(flatten)]
    pub db: DbArgs,
    /// Print the SQL of the migrations the database has not applied (each
    /// in a transaction, with the row that records it) instead of applying
    /// them.
    #[arg(long, conflicts_with = "output")]
    pub print: bool,
    /// With --print: every migration, for an empty database, without
    /// connecting to one.
    #[arg(long, requires = "print")]
    pub all: bool,
    /// Output (of applying or of status): lines for people, or JSON.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Subcommand, Debug)]
pub enum MigrateCmd {
    /// Each migration this binary has and whether the database applied it.
    /// Exit 1 when one was changed or is missing (a broker would not
    /// start).
    Status(MigrateStatusArgs),
}

#[derive(Args, Debug)]
pub struct MigrateStatusArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

/// A row of sqlx's bookkeeping table.
struct Applied {
    description: String,
    installed_on: DateTime<Utc>,
    success: bool,
    checksum: Vec<u8>,
}

/// What the database applied, by version (none when the table is not there).
async fn applied(pool: &PgPool) -> anyhow::Result<BTreeMap<i64, Applied>> {
    let exists: bool =
        sqlx::query_scalar("select to_regclass('leaseq._sqlx_migrations') is not null")
            .fetch_one(pool)
            .await?;
    if !exists {
        return Ok(BTreeMap::new());
    }
    type Row = (i64, String, DateTime<Utc>, bool, Vec<u8>);
    let rows: Vec<Row> = sqlx::query_as(
        "select version, description, installed_on, success, checksum
           from leaseq._sqlx_migrations order by version",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(v, description, installed_on, success, checksum)| {
            (
                v,
                Applied {
                    description,
                    installed_on,
                    success,
                    checksum,
                },
            )
        })
        .collect())
}

fn migrations() -> impl Iterator<Item = &'static sqlx::migrate::Migration> {
    leaseq_server::store::MIGRATOR.iter()
}

/// `migrate status`. Err when a migration was changed or is missing.
pub async fn status(pool: &PgPool, out: Output) -> anyhow::Result<()> {
    let applied = applied(pool).await?;
    let mut rows = Vec::new();
    for m in migrations() {
        let (state, at) = match applied.get(&m.version) {
            None => ("pending", None),
            Some(a) if !a.success => ("failed", Some(a.installed_on)),
            Some(a) if a.checksum != *m.checksum => ("changed", Some(a.installed_on)),
            Some(a) => ("applied", Some(a.installed_on)),
        };
        rows.push((m.version, m.description.to_string(), state, at));
    }
    for (v, a) in &applied {
        if !migrations().any(|m| m.version == *v) {
            rows.push((*v, a.description.clone(), "missing", Some(a.installed_on)));
        }
    }
    rows.sort_by_key(|r| r.0);
    match out {
        Output::Json => output::print_json(&serde_json::Value::Array(
            rows.iter()
                .map(|(v, d, s, at)| {
                    json!({
                        "version": v,
                        "description": d,
                        "state": s,
                        "installed_on": at.map(|t| t.to_rfc3339()),
                    })
                })
                .collect(),
        )),
        Output::Table => output::print_table(
            &["VERSION", "DESCRIPTION", "STATE", "INSTALLED"],
            rows.iter().map(|(v, d, s, at)| {
                vec![
                    v.to_string(),
                    d.clone(),
                    s.to_string(),
                    at.map_or("-".into(), |t| t.to_rfc3339()),
                ]
            }),
        ),
    }
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| matches!(r.2, "changed" | "missing" | "failed"))
        .map(|r| format!("{} ({})", r.0, r.2))
        .collect();
    anyhow::ensure!(
        bad.is_empty(),
        "a broker will not start on this database: migration {}",
        bad.join(", ")
    );
    Ok(())
}

/// `migrate --print`: the SQL of the migrations `pool` has not applied
/// (every one without a pool), as psql can run it.
pub async fn print(pool: Option<&PgPool>) -> anyhow::Result<()> {
    let applied = match pool {
        Some(pool) => applied(pool).await?,
        None => BTreeMap::new(),
    };
    let pending: Vec<_> = migrations()
        .filter(|m| !applied.contains_key(&m.version))
        .collect();
    println!(
        "-- leaseq {}: {} migration(s) {}",
        env!("CARGO_PKG_VERSION"),
        pending.len(),
        if pool.is_some() {
            "this database has not applied"
        } else {
            "(every one, for an empty database)"
        }
    );
    println!(
        "-- Apply with psql -v ON_ERROR_STOP=1 -f FILE; `leaseq migrate status` then lists them as applied."
    );
    println!("set search_path = leaseq, public;");
    println!("create schema if not exists leaseq;");
    println!(
        "create table if not exists leaseq._sqlx_migrations (\n    version bigint primary key,\n    description text not null,\n    installed_on timestamptz not null default now(),\n    success boolean not null,\n    checksum bytea not null,\n    execution_time bigint not null\n);"
    );
    for m in pending {
        let checksum: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
        println!("\n-- {} {}", m.version, m.description);
        if !m.no_tx {
            println!("begin;");
        }
        println!("{}", m.sql.as_str().trim_end());
        println!(
            "insert into leaseq._sqlx_migrations (version, description, success, checksum, execution_time)\n    values ({}, '{}', true, '\\x{checksum}', 0);",
            m.version,
            m.description.replace('\'', "''")
        );
        if !m.no_tx {
            println!("commit;");
        }
    }
    Ok(())
}

/// `migrate`: applies what is pending and says what it applied.
pub async fn apply(pool: &PgPool, out: Output) -> anyhow::Result<()> {
    let before = applied(pool).await?;
    leaseq_server::store::migrate(pool).await?;
    let now: Vec<i64> = migrations()
        .map(|m| m.version)
        .filter(|v| !before.contains_key(v))
        .collect();
    let latest = migrations().map(|m| m.version).max();
    match out {
        Output::Json => output::print_json(&json!({"applied": now, "latest": latest})),
        Output::Table if now.is_empty() => println!(
            "up to date: every migration applied (latest {})",
            latest.unwrap_or_default()
        ),
        Output::Table => println!(
            "applied {} migration(s): {}",
            now.len(),
            now.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    Ok(())
}
