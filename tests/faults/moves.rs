//! A bucket move killed mid-copy under load, with dedup keys: three
//! private clusters and two brokers over them (tests/scaling.rs's
//! harness), consumers and producers on a queue of the moving bucket and
//! on queues that stay, one producer enqueueing with dedup keys that
//! repeat, and a backlog on the source; `leaseq placement move` (the real
//! binary) is killed with SIGKILL once it has copied some of the backlog
//! and not all of it, the cluster left half moved (announced, the source
//! fenced) for a second under load, then the same command run again to
//! completion. No job may be lost, delivered after its Ack or settled
//! twice, and every dedup answer must name the one live job of its key
//! (case 3 of issue 32 answered `duplicate: false` during a move, and the
//! job of the key was then dropped).

use std::time::Duration;

use leaseq::pb;
use leaseq_server::placement::{self, bucket_of};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

use crate::common::history::History;
use crate::common::load::lazy_client;
use crate::scaling::{Run, Three, over_three, queues_on};

/// Enqueues `kp{n}` on `queue` with dedup key `key{n % 40}`, through the
/// brokers in turn, one every 10 ms until `stop`: a key comes back every
/// 0.4 s, while its last job may still be live.
async fn keyed_producer(
    h: History,
    addrs: Vec<std::net::SocketAddr>,
    queue: String,
    stop: CancellationToken,
) {
    let clients: Vec<_> = addrs.iter().map(|a| lazy_client(*a)).collect();
    let mut n = 0usize;
    while !stop.is_cancelled() {
        let (payload, key) = (format!("kp{n:05}"), format!("key{}", n % 40));
        let mut c = clients[n % clients.len()].clone();
        let sent = h.now();
        let r = timeout(
            Duration::from_secs(10),
            c.enqueue(pb::EnqueueRequest {
                dedup_key: key.clone(),
                ..crate::common::job(&queue, &payload)
            }),
        )
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("enqueue timed out")))
        .map(|r| {
            let r = r.into_inner();
            (r.job_id, r.duplicate)
        });
        h.enqueue_keyed(&key, &payload, sent, &r);
        n += 1;
        sleep(Duration::from_millis(10)).await;
    }
}

/// Jobs of `queue` on cluster `k` whose payload starts with `prefix`.
async fn count_prefixed(three: &Three, k: usize, queue: &str, prefix: &str) -> i64 {
    sqlx::query_scalar(
        "select count(*) from leaseq.jobs
         where queue = $1 and substring(payload from 1 for length($2)) = convert_to($2, 'UTF8')",
    )
    .bind(queue)
    .bind(prefix)
    .fetch_one(&three.pools[k])
    .await
    .expect("count")
}

/// `leaseq placement move --queue Q --to b` over the three clusters.
fn move_command(three: &Three, queue: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"));
    cmd.args([
        "placement",
        "move",
        "--queue",
        queue,
        "--to",
        "b",
        "-o",
        "json",
    ]);
    for (pg, name) in three.pgs.iter().zip(["a", "b", "c"]) {
        cmd.arg("--database-url").arg(format!("{name}={}", pg.url));
    }
    cmd.env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bucket_move_killed_mid_copy_under_load() {
    let three = Three::start().await;
    let dbs = three.databases();
    let b0 = over_three(&dbs).start().await;
    let b1 = over_three(&dbs).start().await;
    let addrs = vec![b0.addr, b1.addr];
    let moving = queues_on(0, 1, "km");
    let stay: Vec<String> = (1..3).flat_map(|k| queues_on(k, 1, "km")).collect();
    let all: Vec<String> = moving.iter().chain(&stay).cloned().collect();
    let q = moving[0].clone();
    let bucket = bucket_of(&q);

    let h = History::new();
    // The backlog moved by the second run is consumed after the faults:
    // on a loaded machine that takes longer than the default bound.
    h.set_bounds(crate::common::history::Bounds {
        settle: Duration::from_secs(30),
        ..Default::default()
    });
    let mut run = Run::start(&h, &addrs, &all, 200);
    run.watch(&three, &all);
    let stop = run.producers_stop();
    run.produce(keyed_producer(h.clone(), addrs.clone(), q.clone(), stop));
    sleep(Duration::from_secs(2)).await;
    // A backlog on the source, for the copy to carry in two batches (the
    // command copies 500 jobs per transaction). (Four made the backlog
    // outlast the settle bound on a loaded machine.)
    let mut c = lazy_client(b0.addr);
    for chunk in 0..2 {
        let payloads: Vec<String> = (0..500)
            .map(|i| format!("backlog{:05}", chunk * 500 + i))
            .collect();
        let jobs = payloads.iter().map(|p| crate::common::job(&q, p)).collect();
        let resp = c
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .expect("backlog")
            .into_inner();
        for (p, r) in payloads.iter().zip(resp.results) {
            h.enqueue_ok(p, &r.job_id);
        }
    }

    // Killed once some of the backlog is on the destination and some is
    // still on the source.
    let mut mover = move_command(&three, &q).spawn().expect("spawn the move");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (copied, left) = loop {
        if let Some(exit) = mover.try_wait().expect("the move's status") {
            panic!("the move ended ({exit}) before it could be killed mid-copy");
        }
        // Both counts at once, and often: the window between the two copy
        // transactions is short (a loaded machine's poll once missed it:
        // "the move ended before it could be killed mid-copy").
        let (copied, left) = tokio::join!(
            count_prefixed(&three, 1, &q, "backlog"),
            count_prefixed(&three, 0, &q, "backlog")
        );
        if copied > 0 && left > 0 {
            break (copied, left);
        }
        assert!(Instant::now() < deadline, "the copy never began");
        sleep(Duration::from_millis(1)).await;
    };
    let fault = h.fault_excusing_nothing("placement move killed mid-copy", None);
    mover.start_kill().expect("SIGKILL the move");
    let exit = mover.wait().await.expect("the move's exit");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit.signal(), Some(libc::SIGKILL), "{exit:?}");
    let moving_to: Option<i16> =
        sqlx::query_scalar("select moving_to from leaseq.placement where bucket = $1")
            .bind(bucket as i32)
            .fetch_one(&three.pools[0])
            .await
            .unwrap();
    assert_eq!(moving_to, Some(1), "the killed move is still under way");
    // Half moved, under load, for a second.
    sleep(Duration::from_secs(1)).await;

    let out = timeout(Duration::from_secs(90), move_command(&three, &q).output())
        .await
        .expect("the move again ends")
        .expect("run the move again");
    assert!(
        out.status.success(),
        "the move again: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let moved: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    h.healed(fault);
    eprintln!(
        "FAULTS bucket-move-killed: killed with {copied} backlog jobs on the destination and \
         {left} on the source; the move again: {moved}"
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(three.live(0, &moving).await, 0, "the source keeps jobs");
    let map = placement::load(&three.pools[0]).await.unwrap();
    assert_eq!(map.cluster_of(&q), leaseq_server::ClusterId(1));
    assert!(map.moving.is_empty());

    let report = run
        .finish("bucket-move-killed", &three, b1.addr, &all)
        .await;
    assert!(report.dedup_answers > 0, "no dedup answer checked");
    assert!(
        report.dedup_duplicates > 0,
        "no Enqueue found a live job of its key"
    );
    assert_eq!(report.dead, 0, "jobs dead-lettered");
    b0.stop().await;
    b1.stop().await;
}
