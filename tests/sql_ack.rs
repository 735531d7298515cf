//! `leaseq.ack(job_id, lease_token)` and `leaseq.nack(...)`: settling a job
//! in SQL, inside the consumer's own transaction on the job's database, so
//! that the job's effect and its ack commit or roll back together (issue
//! 34, exactly-once effects). Fenced by the lease token; a token that is
//! not current raises SQLSTATE 55000 and the effect rolls back; the stream
//! that held the lease gets its credit back through the leasing broker's
//! settle channel (the fallback poll is an hour here and the leases a
//! minute, so nothing else could give it back in time). The last test kills
//! the consumer (a `psql` child holding the transaction, and its gRPC
//! stream) between every two steps and shows each effect applied once.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::common::consume::{Consumer, ack_of, status_of};
use crate::common::*;
use leaseq::pb;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tonic::Code;
use uuid::Uuid;

const S5: Duration = Duration::from_secs(5);
const LONG_LEASE: Duration = Duration::from_secs(60);

/// A broker whose fallback poll never fires during a test.
async fn broker_without_poll(db: &TestDb) -> TestBroker {
    TestBroker::on(db)
        .config(|c| c.poll_interval = Duration::from_secs(3600))
        .start()
        .await
}

/// The consumer's own table: no unique key, so an effect applied twice
/// shows as two rows.
async fn effects_table(db: &TestDb) {
    sqlx::query("create table effects (job uuid not null, note text not null)")
        .execute(&db.pool)
        .await
        .unwrap();
}

async fn effects_of(db: &TestDb, job: &str) -> i64 {
    sqlx::query_scalar("select count(*) from effects where job = $1::uuid")
        .bind(job)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn enqueue_sql(db: &TestDb, queue: &str, payload: &str) -> String {
    let id: Uuid = sqlx::query_scalar("select leaseq.enqueue($1, convert_to($2, 'UTF8'))")
        .bind(queue)
        .bind(payload)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    id.to_string()
}

/// The SQLSTATE and message of a database error.
fn db_error(e: sqlx::Error) -> (String, String) {
    let d = e.as_database_error().expect("a database error");
    (
        d.code().expect("a SQLSTATE").into_owned(),
        d.message().to_owned(),
    )
}

/// Runs `select leaseq.ack(...)` with the effect insert in one
/// transaction; commits when the ack succeeded, rolls back otherwise.
async fn effect_and_ack(db: &TestDb, job: &str, token: &str) -> Result<(), (String, String)> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("insert into effects (job, note) values ($1::uuid, 'done')")
        .bind(job)
        .execute(&mut *tx)
        .await
        .unwrap();
    let r = sqlx::query("select leaseq.ack($1::uuid, $2)")
        .bind(job)
        .bind(token)
        .execute(&mut *tx)
        .await;
    match r {
        Ok(_) => {
            tx.commit().await.unwrap();
            Ok(())
        }
        Err(e) => {
            tx.rollback().await.unwrap();
            Err(db_error(e))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_current_token_commits_with_the_effect_and_the_stream_gets_its_credit_back() {
    let db = TestDb::new().await;
    effects_table(&db).await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    // Credit 1: the second job is delivered only once the first's lease is
    // forgotten by the stream.
    let mut c = Consumer::open(&mut client, &["work"], 1, Some(LONG_LEASE), true).await;
    let first = enqueue(&mut client, "work", "a").await;
    let second = enqueue(&mut client, "work", "b").await;
    let d = c.next_delivery(S5).await;
    assert_eq!(id_of(&d), first);
    c.assert_quiet(Duration::from_millis(400), "credit 1 is in use")
        .await;

    effect_and_ack(&db, &first, &d.lease_token)
        .await
        .expect("acked in SQL");
    assert_eq!(effects_of(&db, &first).await, 1);
    assert!(db.live_row(&first).await.is_none(), "the acked job is gone");
    // Promptly: the settle notice, not the lease (a minute) or the poll (an
    // hour), gave the credit back.
    let d2 = c.next_delivery(Duration::from_secs(3)).await;
    assert_eq!(id_of(&d2), second);

    // The stream's own ack of the job acked in SQL is refused: nothing is
    // acked twice.
    assert!(
        c.send(pb::ConsumeRequest {
            acks: vec![ack_of(&d)],
            ..Default::default()
        })
        .await
    );
    let r = c.result(S5).await;
    assert_eq!(status_of(&r).unwrap_err().code(), Code::FailedPrecondition);
    // A second SQL ack with the same token raises, and its effect rolls back.
    let (code, msg) = effect_and_ack(&db, &first, &d.lease_token)
        .await
        .unwrap_err();
    assert_eq!(code, "55000", "{msg}");
    assert!(msg.starts_with("lease_token:"), "{msg}");
    assert_eq!(effects_of(&db, &first).await, 1);

    c.ack(&d2).await;
    assert!(status_of(&c.result(S5).await).is_ok());
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_raises_55000_and_the_effect_rolls_back() {
    let db = TestDb::new().await;
    effects_table(&db).await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    let mut c = Consumer::open(&mut client, &["stale"], 1, Some(LONG_LEASE), true).await;
    let id = enqueue(&mut client, "stale", "x").await;
    let old = c.next_delivery(S5).await;
    // Nacked for a retry at once: redelivered under a new token.
    c.nack(&old, "again", Some(Duration::ZERO), false).await;
    let new = c.next_delivery(S5).await;
    assert_eq!(id_of(&new), id);
    assert_ne!(new.lease_token, old.lease_token);

    let (code, msg) = effect_and_ack(&db, &id, &old.lease_token)
        .await
        .unwrap_err();
    assert_eq!(code, "55000", "{msg}");
    assert!(msg.starts_with("lease_token:"), "{msg}");
    let (code, _) = {
        let mut tx = db.pool.begin().await.unwrap();
        let r = sqlx::query("select leaseq.nack($1::uuid, $2, 'x')")
            .bind(&id)
            .bind(&old.lease_token)
            .execute(&mut *tx)
            .await
            .unwrap_err();
        db_error(r)
    };
    assert_eq!(code, "55000");
    assert_eq!(effects_of(&db, &id).await, 0, "the effect rolled back");
    // The job is still leased under the new token, which still acks.
    let (state, attempt, token) = db.live_row(&id).await.expect("still live");
    assert_eq!((state.as_str(), attempt), ("leased", 2));
    assert_eq!(token.unwrap().to_string(), new.lease_token);

    // Malformed arguments: 22023, naming the argument. A token naming
    // another cluster than this database (cluster 0, the home) is refused.
    for (token, want) in [
        ("", "lease_token: is required"),
        ("not-a-token", "lease_token: is not a lease token"),
        (
            &format!("{}.0", new.lease_token) as &str,
            "lease_token: is not a lease token",
        ),
        (
            &format!("{}.01", new.lease_token),
            "lease_token: is not a lease token",
        ),
        (
            &format!("{}.3", new.lease_token),
            "lease_token: names cluster 3",
        ),
    ] {
        let e = sqlx::query("select leaseq.ack($1::uuid, $2)")
            .bind(&id)
            .bind(token)
            .execute(&db.pool)
            .await
            .unwrap_err();
        let (code, msg) = db_error(e);
        assert_eq!(code, "22023", "{token:?}: {msg}");
        assert!(msg.starts_with(want), "{token:?}: {msg}");
    }
    let e = sqlx::query("select leaseq.ack(null, $1)")
        .bind(&new.lease_token)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(db_error(e).0, "22023");
    for (args, want) in [
        ("error => repeat('e', 65537)", "error:"),
        ("retry_after => interval '-1 s'", "retry_after:"),
        ("retry_after => interval '3661 days'", "retry_after:"),
    ] {
        let sql = format!("select leaseq.nack($1::uuid, $2, {args})");
        let e = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&id)
            .bind(&new.lease_token)
            .execute(&db.pool)
            .await
            .unwrap_err();
        let (code, msg) = db_error(e);
        assert_eq!(code, "22023", "{args}: {msg}");
        assert!(msg.starts_with(want), "{args}: {msg}");
    }
    assert_eq!(db.live_row(&id).await.unwrap().0, "leased");

    effect_and_ack(&db, &id, &new.lease_token)
        .await
        .expect("the current token acks");
    assert_eq!(effects_of(&db, &id).await, 1);
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_ack_leaves_the_job_leased_until_its_lease_ends() {
    let db = TestDb::new().await;
    effects_table(&db).await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    let lease = Duration::from_secs(2);
    let mut c = Consumer::open(&mut client, &["undo"], 1, Some(lease), true).await;
    let id = enqueue(&mut client, "undo", "x").await;
    let d = c.next_delivery(S5).await;

    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("insert into effects (job, note) values ($1::uuid, 'lost')")
        .bind(&id)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("select leaseq.ack($1::uuid, $2)")
        .bind(&id)
        .bind(&d.lease_token)
        .execute(&mut *tx)
        .await
        .expect("the ack itself succeeds");
    tx.rollback().await.unwrap();

    assert_eq!(effects_of(&db, &id).await, 0);
    let (state, _, token) = db.live_row(&id).await.expect("the job is still there");
    assert_eq!(state, "leased");
    assert_eq!(token.unwrap().to_string(), d.lease_token);
    // No credit came back: nothing was said.
    c.assert_quiet(
        Duration::from_millis(500),
        "the rolled-back ack told nobody",
    )
    .await;
    // Redelivered once the lease ran out, to the same stream.
    let again = c.next_delivery(Duration::from_secs(10)).await;
    assert_eq!(id_of(&again), id);
    assert_eq!(job_of(&again).attempt, 2);
    effect_and_ack(&db, &id, &again.lease_token)
        .await
        .expect("acked");
    assert_eq!(effects_of(&db, &id).await, 1);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_nack_retries_and_dead_letters_as_the_brokers_nack() {
    let db = TestDb::new().await;
    let broker = broker_without_poll(&db).await;
    let mut client = broker.client().await;
    let mut c = Consumer::open(&mut client, &["retry"], 1, Some(LONG_LEASE), true).await;
    let id: Uuid =
        sqlx::query_scalar("select leaseq.enqueue('retry', 'x'::bytea, max_attempts => 2)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let id = id.to_string();
    let d = c.next_delivery(S5).await;
    let dead: bool = sqlx::query_scalar("select leaseq.nack($1::uuid, $2, 'boom', interval '0')")
        .bind(&id)
        .bind(&d.lease_token)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!dead);
    // The credit came back and the queue was woken: redelivered at once,
    // with the error kept and the attempt counted.
    let d2 = c.next_delivery(Duration::from_secs(3)).await;
    assert_eq!(id_of(&d2), id);
    assert_eq!(job_of(&d2).attempt, 2);
    assert_eq!(job_of(&d2).last_error, "boom");
    let errors: i64 =
        sqlx::query_scalar("select count(*) from leaseq.job_errors where job_id = $1::uuid")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(errors, 1, "the failed attempt is recorded, as for a Nack");
    // The last attempt: dead-lettered.
    let dead: bool = sqlx::query_scalar("select leaseq.nack($1::uuid, $2, 'boom again')")
        .bind(&id)
        .bind(&d2.lease_token)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(dead);
    assert_eq!(
        db.dead_row(&id).await,
        Some(("max_attempts".to_owned(), 2, Some("boom again".to_owned())))
    );

    // dead_letter => true: reason `nacked`, whatever the attempts left.
    let id = enqueue(&mut client, "retry", "y").await;
    let d = c.next_delivery(Duration::from_secs(3)).await;
    let dead: bool =
        sqlx::query_scalar("select leaseq.nack($1::uuid, $2, 'poison', dead_letter => true)")
            .bind(&id)
            .bind(&d.lease_token)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(dead);
    assert_eq!(db.dead_row(&id).await.unwrap().0, "nacked");

    // No retry_after: the queue's backoff (base 1 s by default, jitter 50
    // to 100 %): not redelivered at once.
    let id = enqueue(&mut client, "retry", "z").await;
    let d = c.next_delivery(Duration::from_secs(3)).await;
    let dead: bool = sqlx::query_scalar("select leaseq.nack($1::uuid, $2)")
        .bind(&id)
        .bind(&d.lease_token)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!dead);
    let (base, wait_ms): (i64, f64) = sqlx::query_as(
        "select q.backoff_base_ms, (extract(epoch from (j.run_at - now())) * 1000)::float8 \
         from leaseq.jobs j join leaseq.queues q on q.name = j.queue where j.id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        wait_ms > base as f64 * 0.5 - 100.0 && wait_ms <= base as f64,
        "backoff {wait_ms} ms for base {base} ms"
    );
    // Woken when due (the wake-up carried the delay).
    let d = c.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(id_of(&d), id);
    assert_eq!(job_of(&d).last_error, "");
    c.ack(&d).await;
    let _ = c.result(S5).await;
    broker.stop().await;
}

// --- kill -9 of the consumer between every two steps -----------------------

/// The directory holding `psql` (as the fault suite finds `pg_ctl`).
fn psql() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("LEASEQ_PG_BIN").filter(|d| !d.is_empty()) {
        candidates.push(d.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versioned.sort_by_key(|v| std::cmp::Reverse(v.0));
    candidates.extend(versioned.into_iter().map(|v| v.1));
    candidates
        .into_iter()
        .map(|d| d.join("psql"))
        .find(|p| p.is_file())
        .expect("psql not found (set LEASEQ_PG_BIN)")
}

/// A consumer's database session: a `psql` child fed statements on its
/// stdin, each followed by an `\echo` marker read back from its stdout, so
/// a step returns once PostgreSQL has run it. SIGKILL of the child is what
/// a consumer's crash does to its transaction: the server sees the
/// connection drop and rolls it back.
struct Psql {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    step: u32,
}

impl Psql {
    fn start(url: &str) -> Psql {
        let mut child = Command::new(psql())
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("psql");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Psql {
            child,
            stdin,
            stdout,
            step: 0,
        }
    }

    /// Runs `sql` and waits until psql has printed its marker after it.
    async fn run(&mut self, sql: &str) {
        self.step += 1;
        let marker = format!("step-{}-done", self.step);
        self.stdin
            .write_all(format!("{sql}\n\\echo {marker}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        let read = async {
            let mut line = String::new();
            loop {
                line.clear();
                let n = self.stdout.read_line(&mut line).await.unwrap();
                assert!(n > 0, "psql ended before {marker} (after {sql:?})");
                if line.trim_end() == marker {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .unwrap_or_else(|_| panic!("psql did not run {sql:?} within 10 s"));
    }

    /// SIGKILL, by its own PID, and reaped.
    async fn kill9(mut self) {
        self.child.start_kill().expect("SIGKILL psql");
        self.child.wait().await.expect("reaped");
    }
}

/// The consumer's steps; it is killed after `killed_after` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// The delivery reached the consumer.
    Delivered,
    /// `begin` and the effect's insert ran in its transaction.
    Effect,
    /// `select leaseq.ack(...)` ran in it.
    Acked,
    /// `commit` returned.
    Committed,
}

/// One consumer: takes the next delivery of `queue` on a new Consume
/// stream (credit 1), then does the steps in its own psql session up to
/// `killed_after` (all of them with None). Then, when killed, its psql is
/// SIGKILLed and its stream dropped at that moment. Returns the job id.
async fn consumer(
    broker: &TestBroker,
    db: &TestDb,
    queue: &str,
    who: &str,
    killed_after: Option<Step>,
) -> String {
    let mut client = broker.client().await;
    let mut c = Consumer::open(&mut client, &[queue], 1, Some(LONG_LEASE), true).await;
    let mut sql = Psql::start(&db.url);
    let d = c.next_delivery(Duration::from_secs(10)).await;
    let id = id_of(&d);
    let mut done = Step::Delivered;
    let steps = [
        (
            Step::Effect,
            format!("begin; insert into effects (job, note) values ('{id}', '{who}');"),
        ),
        (
            Step::Acked,
            format!("select leaseq.ack('{id}', '{}');", d.lease_token),
        ),
        (Step::Committed, "commit;".to_owned()),
    ];
    for (step, stmt) in steps {
        if killed_after == Some(done) {
            break;
        }
        sql.run(&stmt).await;
        done = step;
    }
    if killed_after.is_some() {
        sql.kill9().await;
        drop(c);
    } else {
        drop(sql.stdin);
        let status = tokio::time::timeout(S5, sql.child.wait())
            .await
            .expect("psql exits at the end of its input")
            .unwrap();
        assert!(status.success(), "psql: {status}");
        drop(c);
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_every_two_steps_applies_each_effect_once() {
    let db = TestDb::new().await;
    effects_table(&db).await;
    let broker = broker_without_poll(&db).await;
    // A retaining queue: each ack leaves one completed record, so an ack
    // applied twice would show.
    let mut a = admin(&broker).await;
    let mut client = broker.client().await;
    let _ = enqueue(&mut client, "effects", "warm-up").await;
    a.update_queue(pb::UpdateQueueRequest {
        queue: "effects".into(),
        completed_retention: Some(dur(Duration::from_secs(3600))),
        ..Default::default()
    })
    .await
    .expect("retention on");
    // The warm-up job, acked normally.
    {
        let mut s = subscribe(&mut client, &["effects"], 1, None).await;
        let d = next_delivery(&mut s, S5).await;
        ack(&mut client, &d).await.expect("ack");
    }

    let kills = [Step::Delivered, Step::Effect, Step::Acked, Step::Committed];
    let mut jobs = Vec::new();
    for (i, kill) in kills.into_iter().enumerate() {
        let want = enqueue_sql(&db, "effects", &format!("job-{i}")).await;
        let got = consumer(&broker, &db, "effects", "first", Some(kill)).await;
        assert_eq!(got, want);
        if kill < Step::Committed {
            // Not committed: the effect is not there, the job is still
            // live, and a second consumer gets it (the dropped stream's
            // lease is released once its transaction's lock is gone).
            assert_eq!(effects_of(&db, &got).await, 0, "killed after {kill:?}");
            let again = consumer(&broker, &db, "effects", "second", None).await;
            assert_eq!(again, got, "killed after {kill:?}: the same job again");
        } else {
            assert_eq!(effects_of(&db, &got).await, 1, "killed after {kill:?}");
        }
        jobs.push((kill, got));
    }
    // Every job: one effect, gone from the queue, acked once.
    for (kill, id) in &jobs {
        assert_eq!(effects_of(&db, id).await, 1, "killed after {kill:?}");
        assert!(db.live_row(id).await.is_none(), "killed after {kill:?}");
        assert!(db.dead_row(id).await.is_none(), "killed after {kill:?}");
        let completed: i64 =
            sqlx::query_scalar("select count(*) from leaseq.completed_jobs where id = $1::uuid")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(completed, 1, "killed after {kill:?}");
    }
    let total: i64 = sqlx::query_scalar("select count(*) from effects")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(total, kills.len() as i64);
    // Nothing left to deliver, and no stream holds anything.
    assert_eq!(db.live_jobs().await, 0);
    broker.stop().await;
}
