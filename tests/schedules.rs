//! Schedules (issue 34, docs/design/schedules.md) over real gRPC and real
//! PostgreSQL: ticks in a zone, overlap, catch-up after a downtime, pause,
//! run now, validation of every field, and exactly one job per tick across
//! three `leaseq serve` processes killed with SIGKILL.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use leaseq::pb;
use leaseq::pb::admin_service_client::AdminServiceClient;
use tokio::time::{Instant, sleep};
use tonic::Code;

use crate::common::*;

const S10: Duration = Duration::from_secs(10);

fn template(queue: &str) -> pb::JobTemplate {
    pb::JobTemplate {
        queue: queue.into(),
        payload: b"tick".to_vec(),
        headers: [("kind".to_owned(), "report".to_owned())].into(),
        priority: 3,
        max_attempts: 2,
        ttl: Some(dur(Duration::from_secs(3600))),
    }
}

fn schedule(name: &str, cron: &str, queue: &str) -> pb::Schedule {
    pb::Schedule {
        name: name.into(),
        cron: cron.into(),
        time_zone: String::new(),
        job: Some(template(queue)),
        overlap: 0,
        catch_up: 0,
        catch_up_limit: 0,
        paused: false,
    }
}

async fn create(admin: &mut Admin, s: pb::Schedule) -> pb::ScheduleInfo {
    admin
        .create_schedule(pb::CreateScheduleRequest { schedule: Some(s) })
        .await
        .expect("create schedule")
        .into_inner()
}

/// Jobs a schedule enqueued, from the database: tick -> (count, enqueued_at),
/// over the live, dead and completed tables (only live ones here).
async fn ticks(db: &TestDb, schedule: &str) -> BTreeMap<DateTime<Utc>, (usize, DateTime<Utc>)> {
    let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
        "select headers->>'leaseq-schedule-tick', enqueued_at from leaseq.jobs \
         where headers->>'leaseq-schedule' = $1",
    )
    .bind(schedule)
    .fetch_all(&db.pool)
    .await
    .expect("ticks");
    let mut out = BTreeMap::new();
    for (tick, at) in rows {
        let t = DateTime::parse_from_rfc3339(&tick)
            .expect("tick header is RFC 3339")
            .with_timezone(&Utc);
        let e = out.entry(t).or_insert((0, at));
        e.0 += 1;
    }
    out
}

fn ts_of(t: &prost_types::Timestamp) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(t.seconds, t.nanos as u32).unwrap()
}

fn assert_every_second(ticks: &BTreeMap<DateTime<Utc>, (usize, DateTime<Utc>)>, what: &str) {
    let doubled: Vec<_> = ticks.iter().filter(|(_, (n, _))| *n != 1).collect();
    assert!(
        doubled.is_empty(),
        "{what}: ticks enqueued more than once: {doubled:?}"
    );
    let keys: Vec<_> = ticks.keys().copied().collect();
    for w in keys.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_milliseconds(),
            1000,
            "{what}: a tick missed between {} and {}",
            w[0],
            w[1]
        );
    }
}

/// A cron every second, in a zone whose offset has half hours: it fires in
/// the two minutes named in Asia/Kolkata's clock (UTC+05:30), whose UTC
/// minutes are 30 apart from them, so a zone not applied fires nothing. Each
/// job carries the template and the schedule's headers, one per second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_fire_every_second_in_the_schedules_zone() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut admin = admin(&broker).await;
    let kolkata = Utc::now() + chrono::Duration::minutes(330);
    let (m1, m2) = (kolkata.minute(), (kolkata.minute() + 1) % 60);
    let mut s = schedule("kolkata", &format!("* {m1},{m2} * * * *"), "reports");
    s.time_zone = "Asia/Kolkata".into();
    let info = create(&mut admin, s).await;
    let sched = info.schedule.unwrap();
    assert_eq!(sched.time_zone, "Asia/Kolkata");
    assert_eq!(
        sched.catch_up,
        pb::CatchUpPolicy::One as i32,
        "default catch-up"
    );
    assert_eq!(
        sched.overlap,
        pb::OverlapPolicy::Allow as i32,
        "default overlap"
    );
    eventually(S10, "three ticks", || async {
        ticks(&db, "kolkata").await.len() >= 3
    })
    .await;
    let t = ticks(&db, "kolkata").await;
    assert_every_second(&t, "kolkata");
    for (tick, (_, enqueued)) in &t {
        assert_eq!(tick.timestamp_subsec_millis(), 0, "ticks fall on seconds");
        let late = (*enqueued - *tick).num_milliseconds();
        assert!(
            (0..2500).contains(&late),
            "enqueued {late} ms after its tick"
        );
    }
    // The job is the template's, with the schedule's headers added.
    let job = sqlx::query_as::<_, (String, i32, Option<i32>, String, Vec<u8>)>(
        "select queue, priority, max_attempts, headers::text, payload from leaseq.jobs limit 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let headers: serde_json::Value = serde_json::from_str(&job.3).unwrap();
    assert_eq!((job.0.as_str(), job.1, job.2), ("reports", 3, Some(2)));
    assert_eq!(headers["kind"], "report");
    assert_eq!(headers["leaseq-schedule"], "kolkata");
    assert_eq!(job.4, b"tick");
    let got = admin
        .get_schedule(pb::GetScheduleRequest {
            name: "kolkata".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.last_job_id.is_empty());
    assert!(ts_of(got.next_run_at.as_ref().unwrap()) > *t.keys().last().unwrap());
    broker.stop().await;
}

/// Overlap skip: while the last run's job waits, ticks enqueue nothing; once
/// it is acked, the next tick enqueues. Allow, beside it, enqueues every tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_waits_for_the_last_runs_job() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut admin = admin(&broker).await;
    let mut skip = schedule("skip", "* * * * * *", "skipq");
    skip.overlap = pb::OverlapPolicy::Skip as i32;
    create(&mut admin, skip).await;
    create(&mut admin, schedule("allow", "* * * * * *", "allowq")).await;
    eventually(S10, "allow enqueues four", || async {
        ticks(&db, "allow").await.len() >= 4
    })
    .await;
    assert_eq!(
        ticks(&db, "skip").await.len(),
        1,
        "skip enqueued while its job waits"
    );
    // Take and ack the skip schedule's job: the next tick enqueues again.
    let mut client = broker.client().await;
    let mut s = subscribe(&mut client, &["skipq"], 1, None).await;
    let d = next_delivery(&mut s, S10).await;
    client
        .ack(pb::AckRequest {
            job_id: job_of(&d).id.clone(),
            lease_token: d.lease_token.clone(),
            enqueue: Vec::new(),
            result: Vec::new(),
        })
        .await
        .unwrap();
    let d2 = next_delivery(&mut s, S10).await;
    assert_ne!(job_of(&d2).id, job_of(&d).id);
    broker.stop().await;
}

/// After every broker was down for ~4 s (grace 1 s): catch-up none fires
/// no missed tick, one the latest, all the latest catch_up_limit (2); ticks
/// within the grace fire in every case, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_after_a_downtime_fires_none_one_or_all_up_to_the_limit() {
    let db = TestDb::new().await;
    let grace = Duration::from_secs(1);
    let broker = TestBroker::on(&db)
        .config(|c| c.schedule_grace = grace)
        .start()
        .await;
    let mut admin = admin(&broker).await;
    for (name, policy) in [
        ("none", pb::CatchUpPolicy::None),
        ("one", pb::CatchUpPolicy::One),
        ("all", pb::CatchUpPolicy::All),
    ] {
        let mut s = schedule(name, "* * * * * *", "cq");
        s.catch_up = policy as i32;
        s.catch_up_limit = 2;
        create(&mut admin, s).await;
    }
    eventually(S10, "a first tick each", || async {
        ticks(&db, "none").await.len()
            + ticks(&db, "one").await.len()
            + ticks(&db, "all").await.len()
            >= 3
            && !ticks(&db, "none").await.is_empty()
            && !ticks(&db, "one").await.is_empty()
            && !ticks(&db, "all").await.is_empty()
    })
    .await;
    broker.stop().await;
    let before: Vec<_> = [
        ticks(&db, "none").await,
        ticks(&db, "one").await,
        ticks(&db, "all").await,
    ]
    .into_iter()
    .map(|t| t.keys().copied().max().unwrap())
    .collect();
    sleep(Duration::from_secs(4)).await;
    let broker = TestBroker::on(&db)
        .config(|c| c.schedule_grace = grace)
        .start()
        .await;
    // The first pass after the restart, and a tick or two more.
    sleep(Duration::from_millis(2500)).await;
    broker.stop().await;
    for ((name, missed_wanted), last_before) in [("none", 0), ("one", 1), ("all", 2)]
        .into_iter()
        .zip(before)
    {
        let t = ticks(&db, name).await;
        let after: Vec<_> = t.iter().filter(|(k, _)| **k > last_before).collect();
        let missed: Vec<_> = after
            .iter()
            .filter(|(tick, (_, at))| **tick < *at - chrono::Duration::from_std(grace).unwrap())
            .collect();
        assert_eq!(
            missed.len(),
            missed_wanted,
            "{name}: missed ticks fired: {missed:?}"
        );
        assert!(t.values().all(|(n, _)| *n == 1), "{name}: a tick twice");
        // The missed ones fired are the latest before the on-time ones.
        let on_time: Vec<_> = after.iter().skip(missed.len()).map(|(k, _)| **k).collect();
        assert!(
            !on_time.is_empty(),
            "{name}: nothing on time after the restart"
        );
        if let Some((last_missed, _)) = missed.last() {
            assert_eq!(
                (on_time[0] - **last_missed).num_milliseconds(),
                1000,
                "{name}"
            );
        }
        // And the downtime left a gap (the ticks not caught up).
        assert!(
            after.len() < 8,
            "{name}: {} ticks after the restart",
            after.len()
        );
    }
}

/// Pause stops the ticks (and resume does not catch up the paused ones);
/// RunSchedule enqueues at once even while paused, recorded as its tick,
/// leaving the next tick where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_run_now() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut admin = admin(&broker).await;
    let mut s = schedule("hourly", "0 * * * *", "pq");
    s.paused = true;
    let info = create(&mut admin, s).await;
    assert!(info.schedule.as_ref().unwrap().paused);
    let next = info.next_run_at;
    let run = admin
        .run_schedule(pb::RunScheduleRequest {
            name: "hourly".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let t = ticks(&db, "hourly").await;
    assert_eq!(t.len(), 1);
    let tick = ts_of(run.tick_at.as_ref().unwrap());
    assert_eq!(
        t.keys().next().unwrap().timestamp_millis(),
        tick.timestamp_millis(),
        "the job's tick header is the run's time"
    );
    let got = admin
        .get_schedule(pb::GetScheduleRequest {
            name: "hourly".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.last_job_id, run.job_id);
    assert_eq!(got.next_run_at, next, "run now leaves the next tick");

    // A paused every-second schedule fires nothing; resumed, it fires from
    // then on.
    let mut fast = schedule("fast", "* * * * * *", "pq");
    fast.paused = true;
    create(&mut admin, fast).await;
    sleep(Duration::from_millis(2500)).await;
    assert!(
        ticks(&db, "fast").await.is_empty(),
        "a paused schedule fired"
    );
    let resumed_at = Utc::now();
    admin
        .resume_schedule(pb::ResumeScheduleRequest {
            name: "fast".into(),
        })
        .await
        .unwrap();
    eventually(S10, "ticks after resume", || async {
        ticks(&db, "fast").await.len() >= 2
    })
    .await;
    let first = *ticks(&db, "fast").await.keys().next().unwrap();
    assert!(
        first > resumed_at - chrono::Duration::seconds(1),
        "paused ticks caught up: {first}"
    );
    let paused = admin
        .pause_schedule(pb::PauseScheduleRequest {
            name: "fast".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(paused.schedule.unwrap().paused);
    let n = ticks(&db, "fast").await.len();
    sleep(Duration::from_millis(2000)).await;
    assert_eq!(ticks(&db, "fast").await.len(), n, "fired after pause");

    // Update: a new template queue and cron take effect.
    let up = admin
        .update_schedule(pb::UpdateScheduleRequest {
            name: "fast".into(),
            cron: Some("*/2 * * * * *".into()),
            job: Some(template("other")),
            paused: Some(false),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(up.schedule.as_ref().unwrap().cron, "*/2 * * * * *");
    eventually(S10, "a tick into the new queue", || async {
        db.count("select count(*) from leaseq.jobs where queue = 'other'")
            .await
            >= 1
    })
    .await;
    let even = ticks(&db, "fast").await;
    let last = even.keys().last().unwrap();
    assert_eq!(last.timestamp() % 2, 0, "the new cron: even seconds");
    admin
        .delete_schedule(pb::DeleteScheduleRequest {
            name: "fast".into(),
        })
        .await
        .unwrap();
    let e = admin
        .get_schedule(pb::GetScheduleRequest {
            name: "fast".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    broker.stop().await;
}

/// Every input checked: the status names the field, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_is_validated() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut admin = admin(&broker).await;
    let ok = || schedule("ok", "* * * * *", "q");
    type Edit = fn(&mut pb::Schedule);
    let cases: Vec<(&str, Edit, Code, &str)> = vec![
        (
            "empty name",
            |s| s.name.clear(),
            Code::InvalidArgument,
            "schedule.name",
        ),
        (
            "long name",
            |s| s.name = "n".repeat(129),
            Code::InvalidArgument,
            "schedule.name",
        ),
        (
            "bad name",
            |s| s.name = "-x".into(),
            Code::InvalidArgument,
            "schedule.name",
        ),
        (
            "empty cron",
            |s| s.cron.clear(),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "bad cron",
            |s| s.cron = "61 * * * *".into(),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "words",
            |s| s.cron = "every day".into(),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "years",
            |s| s.cron = "0 0 0 1 1 * 2030".into(),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "long cron",
            |s| s.cron = format!("* * * * * {}", "*".repeat(300)),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "never",
            |s| s.cron = "0 0 30 2 *".into(),
            Code::InvalidArgument,
            "schedule.cron",
        ),
        (
            "zone",
            |s| s.time_zone = "Mars/Olympus".into(),
            Code::InvalidArgument,
            "schedule.time_zone",
        ),
        (
            "no job",
            |s| s.job = None,
            Code::InvalidArgument,
            "schedule.job",
        ),
        (
            "queue",
            |s| s.job.as_mut().unwrap().queue = "bad queue".into(),
            Code::InvalidArgument,
            "schedule.job.queue",
        ),
        (
            "max_attempts",
            |s| s.job.as_mut().unwrap().max_attempts = -1,
            Code::InvalidArgument,
            "schedule.job.max_attempts",
        ),
        (
            "ttl",
            |s| {
                s.job.as_mut().unwrap().ttl = Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                })
            },
            Code::InvalidArgument,
            "schedule.job.ttl",
        ),
        (
            "reserved header",
            |s| {
                s.job
                    .as_mut()
                    .unwrap()
                    .headers
                    .insert("leaseq-schedule-tick".into(), "x".into());
            },
            Code::InvalidArgument,
            "schedule.job.headers",
        ),
        (
            "too many headers",
            |s| {
                for i in 0..63 {
                    s.job
                        .as_mut()
                        .unwrap()
                        .headers
                        .insert(format!("h{i}"), "v".into());
                }
            },
            Code::InvalidArgument,
            "schedule.job.headers",
        ),
        (
            "payload",
            |s| s.job.as_mut().unwrap().payload = vec![0; 2 << 20],
            Code::ResourceExhausted,
            "schedule.job.payload",
        ),
        (
            "overlap",
            |s| s.overlap = 9,
            Code::InvalidArgument,
            "schedule.overlap",
        ),
        (
            "catch_up",
            |s| s.catch_up = 9,
            Code::InvalidArgument,
            "schedule.catch_up",
        ),
        (
            "catch_up_limit",
            |s| s.catch_up_limit = 1001,
            Code::InvalidArgument,
            "schedule.catch_up_limit",
        ),
    ];
    for (what, edit, code, field) in cases {
        let mut s = ok();
        edit(&mut s);
        let e = admin
            .create_schedule(pb::CreateScheduleRequest { schedule: Some(s) })
            .await
            .expect_err(what);
        assert_eq!(e.code(), code, "{what}: {}", e.message());
        assert!(
            e.message().starts_with(&format!("{field}:")),
            "{what}: {}",
            e.message()
        );
    }
    let e = admin
        .create_schedule(pb::CreateScheduleRequest { schedule: None })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        db.count("select count(*) from leaseq.schedules").await,
        0,
        "nothing created"
    );

    create(&mut admin, ok()).await;
    let e = admin
        .create_schedule(pb::CreateScheduleRequest {
            schedule: Some(ok()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    // Update validates its own fields, and changes nothing on a refusal.
    let bad_updates: Vec<(pb::UpdateScheduleRequest, &str)> = vec![
        (
            pb::UpdateScheduleRequest {
                name: "ok".into(),
                cron: Some("x".into()),
                ..Default::default()
            },
            "cron",
        ),
        (
            pb::UpdateScheduleRequest {
                name: "ok".into(),
                time_zone: Some("Nowhere".into()),
                ..Default::default()
            },
            "time_zone",
        ),
        (
            pb::UpdateScheduleRequest {
                name: "ok".into(),
                catch_up_limit: Some(0xffff),
                ..Default::default()
            },
            "catch_up_limit",
        ),
        (
            pb::UpdateScheduleRequest {
                name: "ok".into(),
                job: Some(pb::JobTemplate::default()),
                ..Default::default()
            },
            "job.queue",
        ),
        (
            pb::UpdateScheduleRequest {
                name: "".into(),
                ..Default::default()
            },
            "name",
        ),
    ];
    for (u, field) in bad_updates {
        let e = admin.update_schedule(u).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {}", e.message());
        assert!(
            e.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            e.message()
        );
    }
    let got = admin
        .get_schedule(pb::GetScheduleRequest { name: "ok".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.schedule.unwrap().cron, "* * * * *");
    // Unknown names.
    let missing = "nope".to_owned();
    let codes = [
        admin
            .get_schedule(pb::GetScheduleRequest {
                name: missing.clone(),
            })
            .await
            .unwrap_err()
            .code(),
        admin
            .update_schedule(pb::UpdateScheduleRequest {
                name: missing.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code(),
        admin
            .pause_schedule(pb::PauseScheduleRequest {
                name: missing.clone(),
            })
            .await
            .unwrap_err()
            .code(),
        admin
            .resume_schedule(pb::ResumeScheduleRequest {
                name: missing.clone(),
            })
            .await
            .unwrap_err()
            .code(),
        admin
            .delete_schedule(pb::DeleteScheduleRequest {
                name: missing.clone(),
            })
            .await
            .unwrap_err()
            .code(),
        admin
            .run_schedule(pb::RunScheduleRequest {
                name: missing.clone(),
            })
            .await
            .unwrap_err()
            .code(),
    ];
    assert!(codes.iter().all(|c| *c == Code::NotFound), "{codes:?}");
    let e = admin
        .list_schedules(pb::ListSchedulesRequest {
            page_size: 1001,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // Pages.
    for i in 0..3 {
        create(&mut admin, schedule(&format!("p{i}"), "@daily", "q")).await;
    }
    let p1 = admin
        .list_schedules(pb::ListSchedulesRequest {
            page_size: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p1.schedules.len(), 3);
    let p2 = admin
        .list_schedules(pb::ListSchedulesRequest {
            page_size: 3,
            page_token: p1.next_page_token,
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = p1
        .schedules
        .iter()
        .chain(&p2.schedules)
        .map(|s| s.schedule.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(names, ["ok", "p0", "p1", "p2"]);
    assert!(p2.next_page_token.is_empty());
    broker.stop().await;
}

/// The Done-when of issue 34: three `leaseq serve` processes on one
/// database, a schedule every second, and kill -9 of each replica in turn
/// (restarted at once); every tick from the first to the last is enqueued
/// exactly once (read from the jobs' `leaseq-schedule-tick` headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_and_kill_9_miss_and_double_no_tick() {
    let db = TestDb::new().await;
    let addrs: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let mut reps = Vec::new();
    for &a in &addrs {
        reps.push(BinaryBroker::on(&db).addr(a).start().await);
    }
    let mut admin = AdminServiceClient::connect(format!("http://{}", addrs[0]))
        .await
        .unwrap();
    create(&mut admin, schedule("every-second", "* * * * * *", "k9")).await;
    eventually(S10, "the first tick", || async {
        !ticks(&db, "every-second").await.is_empty()
    })
    .await;
    let start = Instant::now();
    for round in 0..6 {
        let victim = round % 3;
        sleep(Duration::from_millis(1300)).await;
        reps[victim].signal(libc::SIGKILL);
        let exit = reps[victim].wait(S10).await;
        assert!(!exit.success(), "killed: {exit:?}");
        reps[victim] = BinaryBroker::on(&db).addr(addrs[victim]).start().await;
    }
    sleep(Duration::from_millis(1500)).await;
    // Stop the ticks, then read them.
    let mut admin = AdminServiceClient::connect(format!("http://{}", addrs[1]))
        .await
        .unwrap();
    admin
        .delete_schedule(pb::DeleteScheduleRequest {
            name: "every-second".into(),
        })
        .await
        .unwrap();
    let elapsed = start.elapsed();
    let t = ticks(&db, "every-second").await;
    assert_every_second(&t, "three replicas, kill -9");
    assert!(
        t.len() as u64 >= elapsed.as_secs(),
        "{} ticks in {elapsed:?}",
        t.len()
    );
    let records = db.count("select count(*) from leaseq.schedule_ticks").await;
    assert_eq!(records, t.len() as i64, "a tick record per job");
    for mut r in reps {
        r.signal(libc::SIGTERM);
        r.wait(S10).await;
    }
}
