//! The maintenance sweeps over leaseq.jobs keep their plans when the table
//! is planned empty. After a VACUUM or ANALYZE of a drained queue table the
//! planner believes it holds no rows, and every plan costs about the same;
//! planned so, the ttl sweep once read every waiting job through
//! jobs_ready, and ran for minutes under a steady stream of enqueues
//! (docs/BENCHMARKS.md, "Plans made on an empty table").
//! `Store::expire_ttl`, `Store::expired_leases`, `Store::unheard_leases`,
//! `Store::check_leases` and `Store::next_due` run with
//! `SWEEP_PLANNER_SETTINGS`; the lease statement with the hot connections'
//! settings. The ack statement's generic plan read all of
//! jobs_pkey for every call when planned so; it now probes the key per id.

use leaseq_server::store::SWEEP_PLANNER_SETTINGS;
use sqlx::Row;

use crate::common::*;

/// The generic plan (what a connection caches after five runs) of `sql`
/// with `params`, in a transaction with `settings`, on an empty, vacuumed
/// and analysed leaseq.jobs.
async fn generic_plan(
    db: &TestDb,
    settings: &'static str,
    sql: &str,
    types: &str,
    args: &str,
) -> String {
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("vacuum analyze leaseq.jobs")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    sqlx::raw_sql("set local plan_cache_mode = force_generic_plan")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql(settings).execute(&mut *tx).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "prepare sweep{types} as {sql}"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("explain execute sweep{args}")))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    // A prepared statement outlives the transaction.
    sqlx::raw_sql("deallocate sweep")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_sweeps_scan_their_partial_index_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    let sweeps = [
        (
            include_str!("../crates/server/src/store/sql/expire_ttl.sql"),
            "(bigint)",
            "(1000)",
            "jobs_ttl",
        ),
        (
            include_str!("../crates/server/src/store/sql/expired_leases.sql"),
            "(uuid[], bigint)",
            "(null, 1000)",
            "jobs_lease_expiry",
        ),
        (
            include_str!("../crates/server/src/store/sql/unheard_leases.sql"),
            "(uuid, bigint)",
            "(gen_random_uuid(), 1000)",
            "jobs_lease_expiry",
        ),
    ];
    for (sql, types, args, index) in sweeps {
        let plan = generic_plan(&db, SWEEP_PLANNER_SETTINGS, sql, types, args).await;
        assert!(
            plan.contains(&format!("Index Scan using {index} on jobs")),
            "the sweep should read {index}:\n{plan}"
        );
        every_jobs_scan_is_bounded(&plan).unwrap();
        for bad in ["Seq Scan on jobs", "jobs_ready", "Sort"] {
            assert!(!plan.contains(bad), "{bad} in the sweep's plan:\n{plan}");
        }
    }
    // What the settings prevent, on this PostgreSQL: without them the ttl
    // sweep's plan reads the table another way.
    let plain = generic_plan(&db, "select 1", sweeps[0].0, sweeps[0].1, sweeps[0].2).await;
    assert!(
        !plain.contains("Index Scan using jobs_ttl on jobs"),
        "the planner now finds jobs_ttl by itself; the settings may be unneeded:\n{plain}"
    );
}

/// Every scan of leaseq.jobs in `plan` has an index or TID condition: no
/// scan reads the whole table or a whole index.
fn every_jobs_scan_is_bounded(plan: &str) -> Result<(), String> {
    every_scan_is_bounded(plan, "jobs")
}

/// Every scan of leaseq.`table` in `plan` has an index or TID condition.
fn every_scan_is_bounded(plan: &str, table: &str) -> Result<(), String> {
    let lines: Vec<&str> = plan.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.contains(&format!(" on {table} ")) && line.contains("Scan") {
            let cond = lines
                .get(i + 1)
                .is_some_and(|next| next.contains("Index Cond") || next.contains("TID Cond"));
            if !cond {
                return Err(format!("unbounded scan `{}` in:\n{plan}", line.trim()));
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_ack_statement_probes_the_key_per_id_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    let z = "'{00000000-0000-0000-0000-000000000000}'";
    // The hot connections' settings (store::open): generic plans, no
    // sequential scans.
    let plan = generic_plan(
        &db,
        "set local enable_seqscan = off",
        include_str!("../crates/server/src/store/sql/ack.sql"),
        "(uuid[], uuid[], bytea[])",
        &format!("({z}, {z}, '{{}}')"),
    )
    .await;
    every_jobs_scan_is_bounded(&plan).unwrap();
    assert!(plan.contains("Index Cond: (id = i.id)"), "{plan}");
}

#[tokio::test]
async fn the_other_settle_statements_probe_the_key_per_id_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    let z = "'{00000000-0000-0000-0000-000000000000}'";
    let settles = [
        (
            include_str!("../crates/server/src/store/sql/fail.sql"),
            "(uuid[], uuid[], text[], int8[], bool[], bool[])",
            format!("({z}, {z}, '{{x}}', '{{1}}', '{{f}}', '{{f}}')"),
        ),
        (
            include_str!("../crates/server/src/store/sql/extend.sql"),
            "(uuid[], uuid[], int8[])",
            format!("({z}, {z}, '{{1000}}')"),
        ),
    ];
    for (sql, types, args) in settles {
        let plan = generic_plan(&db, "set local enable_seqscan = off", sql, types, &args).await;
        every_jobs_scan_is_bounded(&plan).unwrap();
        assert!(plan.contains("Index Cond: (id = i.id)"), "{plan}");
    }
}

/// The dispatcher's other statements over leaseq.jobs, planned generic on
/// an empty, analysed table with the settings they run with, still reach
/// jobs through an index condition: the lease statements (hot connections;
/// lease_one.sql, a round of one want, too) through the queue's ready jobs, the key walk (lease_keys.sql: its lock
/// and update once hash-joined a whole scan of the table, at every round),
/// the lease check by key, the next-due lookup by queue. Before, the lease check's plan read all of jobs (or,
/// with these settings, all of jobs_pkey) and the next-due lookup's every
/// job of the queue.
#[tokio::test]
async fn the_dispatchers_statements_read_jobs_by_index_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    let z = "'{00000000-0000-0000-0000-000000000000}'";
    let statements = [
        (
            "set local enable_seqscan = off",
            include_str!("../crates/server/src/store/sql/lease.sql"),
            "(text[], int4[], int4[], int8[], int4[], text[], uuid, bool)",
            "('{q}', '{0}', '{1}', '{1000}', '{0}', '{c}', \
             '00000000-0000-0000-0000-000000000000', false)"
                .to_owned(),
        ),
        (
            "set local enable_seqscan = off",
            include_str!("../crates/server/src/store/sql/lease_one.sql"),
            "(text, int8, int8, int4, text, uuid)",
            "('q', 256, 1000, 0, 'c', '00000000-0000-0000-0000-000000000000')".to_owned(),
        ),
        (
            "set local enable_seqscan = off",
            include_str!("../crates/server/src/store/sql/lease_keys.sql"),
            "(text, int4[], int4[], int8[], int4[], text[], uuid, int4)",
            "('q', '{0}', '{64}', '{1000}', '{0}', '{c}', \
             '00000000-0000-0000-0000-000000000000', 128)"
                .to_owned(),
        ),
        (
            SWEEP_PLANNER_SETTINGS,
            include_str!("../crates/server/src/store/sql/lease_status.sql"),
            "(uuid[], uuid[])",
            format!("({z}, {z})"),
        ),
        (
            SWEEP_PLANNER_SETTINGS,
            include_str!("../crates/server/src/store/sql/next_due.sql"),
            "(text[])",
            "('{q}')".to_owned(),
        ),
    ];
    let mut bad = Vec::new();
    for (settings, sql, types, args) in statements {
        let plan = generic_plan(&db, settings, sql, types, &args).await;
        if let Err(e) = every_jobs_scan_is_bounded(&plan) {
            bad.push(format!("{}:\n{e}", sql.lines().next().unwrap_or_default()));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}

/// The retention sweep deletes the completed records it picked by ctid.
/// With the default settings its generic plan made on an empty, analysed
/// completed_jobs reached them by a sequential scan of the whole table,
/// filtered on ctid, for every batch: with a day of records kept, a pass
/// read every one of them. It runs in a sweep transaction now: one range
/// of completed_jobs_queue per queue, then a Tid Scan.
#[tokio::test]
async fn the_retention_sweep_deletes_by_tid_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    sqlx::raw_sql("vacuum analyze leaseq.completed_jobs")
        .execute(&db.pool)
        .await
        .unwrap();
    let sql = include_str!("../crates/server/src/store/sql/expire_completed.sql");
    let types = "(bigint, bigint)";
    let args = "(1000, 86400000)";
    let plan = generic_plan(&db, SWEEP_PLANNER_SETTINGS, sql, types, args).await;
    every_scan_is_bounded(&plan, "completed_jobs").unwrap();
    assert!(plan.contains("Tid Scan on completed_jobs"), "{plan}");
    // One range per queue for records without a result, one for those
    // with one, each to its own cutoff: neither reads the other's rows
    // (a filter on `result` would) nor sorts them.
    assert_eq!(
        plan.matches("Index Scan using completed_jobs_queue")
            .count(),
        2,
        "{plan}"
    );
    assert!(!plan.contains("Filter: (result IS"), "{plan}");
    assert!(!plan.contains("Sort"), "{plan}");
    // What the settings prevent, on this PostgreSQL.
    let plain = generic_plan(&db, "select 1", sql, types, args).await;
    assert!(
        every_scan_is_bounded(&plain, "completed_jobs").is_err(),
        "the planner now keeps the Tid Scan by itself; the settings may be unneeded:\n{plain}"
    );
}

/// The lines of `plan` under `CTE name`: its header and the lines indented
/// deeper than it that follow.
fn cte(plan: &str, name: &str) -> String {
    let lines: Vec<&str> = plan.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == format!("CTE {name}"))
        .unwrap_or_else(|| panic!("no CTE {name} in:\n{plan}"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let depth = indent(lines[start]);
    let mut out = vec![lines[start]];
    out.extend(
        lines[start + 1..]
            .iter()
            .take_while(|l| indent(l) > depth)
            .copied(),
    );
    out.join("\n")
}

/// The key count of the queue statistics (`keys_waiting`) walks a queue's
/// keys one probe of jobs_key each; planned on an empty table without the
/// sweeps' settings, each probe read the queue's jobs_ready whole and
/// sorted it (27 s for 10,000 keys, found by
/// keys_admin::keys_waiting_stops_at_its_cap_and_says_so). ListKeys' page
/// by key reads jobs_key in key order likewise.
#[tokio::test]
async fn the_key_counts_probe_jobs_key_even_when_planned_on_an_empty_table() {
    let db = TestDb::new().await;
    let stats = include_str!("../crates/server/src/store/sql/admin_queue_stats.sql");
    let types = "(text[], text, bigint, uuid, bigint)";
    let args = "(array['q'], null, 10, gen_random_uuid(), 10000)";
    let plan = generic_plan(&db, SWEEP_PLANNER_SETTINGS, stats, types, args).await;
    let walk = cte(&plan, "waiting_keys");
    // (An index-only scan since jobs_key holds no leased rows: the probe's
    // `state <> 'leased'` is its predicate.)
    assert!(
        walk.contains("Index Scan using jobs_key on jobs")
            || walk.contains("Index Only Scan using jobs_key on jobs"),
        "the key count should probe jobs_key:\n{plan}"
    );
    every_jobs_scan_is_bounded(&walk).unwrap();
    for bad in ["Seq Scan on jobs", "jobs_ready", "Sort"] {
        assert!(
            !walk.contains(bad),
            "{bad} in the key count's plan:\n{plan}"
        );
    }
    let plain = generic_plan(&db, "select 1", stats, types, args).await;
    assert!(
        cte(&plain, "waiting_keys").contains("Sort"),
        "the planner now probes jobs_key by itself; the settings may be unneeded:\n{plain}"
    );

    // As store::admin::list_keys: jobs_key (not leased) merged with
    // jobs_key_leased.
    let page = "select j.key, count(*) filter (where j.state = 'available') \
        from ((select e.key, e.state from leaseq.jobs e \
               where e.queue = $1 and e.key is not null and e.state <> 'leased' \
                 and ($2::text is null or e.key > $2) order by e.key) \
              union all \
              (select e.key, e.state from leaseq.jobs e \
               where e.queue = $1 and e.key is not null and e.state = 'leased' \
                 and ($2::text is null or e.key > $2) order by e.key)) j \
        group by j.key order by j.key limit $3";
    let plan = generic_plan(
        &db,
        SWEEP_PLANNER_SETTINGS,
        page,
        "(text, text, bigint)",
        "('q', 'k', 10)",
    )
    .await;
    assert!(plan.contains("using jobs_key on jobs"), "{plan}");
    assert!(plan.contains("using jobs_key_leased on jobs"), "{plan}");
    every_jobs_scan_is_bounded(&plan).unwrap();
    // A Merge Append of the two (its `Sort Key` line), no Sort node.
    assert!(!plan.contains("Sort  ("), "{plan}");
}

/// The key walk's probes (lease_keys.sql) start their index scan at the key
/// after the cursor: `key >` is an index condition. With the cursor read as
/// a join column it was a filter, and the wrap-around probe read a busy
/// key's whole range of jobs_key every round.
#[tokio::test]
async fn the_key_walk_starts_each_probe_at_its_key() {
    let db = TestDb::new().await;
    let plan = generic_plan(
        &db,
        "set local enable_seqscan = off",
        include_str!("../crates/server/src/store/sql/lease_keys.sql"),
        "(text, int4[], int4[], int8[], int4[], text[], uuid, int4)",
        "('q', '{0}', '{64}', '{1000}', '{0}', '{c}', \
         '00000000-0000-0000-0000-000000000000', 128)",
    )
    .await;
    // After the cursor: `key > cursor`; from the first key up to the
    // cursor: `key > ''` (or the last key) and `key <= cursor`.
    let bounds: [(&str, &[&str]); 2] = [
        ("walk_after", &["key >"]),
        ("walk_before", &["key >", "key <="]),
    ];
    for (walk, bounds) in bounds {
        let part = cte(&plan, walk);
        let probes: Vec<&str> = part
            .lines()
            .filter(|l| l.contains("Index Cond") && l.contains("queue ="))
            .collect();
        assert!(!probes.is_empty(), "{walk}:\n{plan}");
        for p in probes {
            for b in bounds {
                assert!(p.contains(b), "{walk}: probe without `{b}`: `{p}`:\n{plan}");
            }
        }
    }
}
