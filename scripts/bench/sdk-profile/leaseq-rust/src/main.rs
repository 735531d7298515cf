//! leaseq-rust-bench: the Rust SDK (leaseq-client) in the runs of
//! scripts/bench/sdk-rabbitmq.sh that crates/client/examples/noop_worker.rs
//! does not cover (issue 36). Each prints one JSON line. Linux only (/proc).
//!
//!   leaseq-rust-bench producer ADDR QUEUE N SECS [BYTES=100]
//!       sequential single `Client::enqueue` calls (each awaited, no
//!       batching) of BYTES-byte jobs until N are enqueued or SECS have
//!       passed: the rate and the process's CPU per job (one enqueue
//!       before the measured window: the connection's setup)
//!   leaseq-rust-bench worker ADDR QUEUE N CONCURRENCY SLEEP_MS [CREDIT]
//!       one Worker (CONCURRENCY handlers at once, CREDIT its stream's
//!       credit, `Worker::prefetch`; default the concurrency) whose handler
//!       sleeps SLEEP_MS (`tokio::time::sleep`) works N jobs: the rate from
//!       the first handler call to the last handler completion, and the
//!       process's CPU over that window (as noop_worker.rs measures)
//!   leaseq-rust-bench ceiling CONCURRENCY SLEEP_MS SECS
//!       no leaseq: CONCURRENCY tasks each sleeping SLEEP_MS
//!       (`tokio::time::sleep`) in a loop for SECS, the runtime's own
//!       ceiling for the sleeping handler above
//!       (scripts/bench/sleep-ceiling.sh)
//!
//! Not a test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leaseq_client::{Client, Delivery, Job, Worker};
use tokio::sync::Notify;

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// utime + stime of this process (every thread), in seconds.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// `"secs": .., "rate": .., "cpu_s": .., "cpu_us_per_job": .., "cores": ..`
fn figures(n: u64, secs: f64, cpu: f64) -> String {
    format!(
        r#""secs": {secs:.3}, "rate": {:.0}, "cpu_s": {cpu:.2}, "cpu_us_per_job": {:.1}, "cores": {:.2}"#,
        n as f64 / secs,
        cpu / n.max(1) as f64 * 1e6,
        cpu / secs
    )
}

async fn producer(
    addr: &str,
    queue: &str,
    n: u64,
    secs: f64,
    bytes: usize,
) -> Result<String, BoxErr> {
    let client = Client::connect(addr).await?;
    let payload = vec![b'x'; bytes];
    // One before the window, as every producer of the script does.
    client.enqueue(Job::new(queue, payload.clone())).await?;
    let (t0, c0) = (Instant::now(), cpu_s());
    let deadline = t0 + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    while sent < n && Instant::now() < deadline {
        client.enqueue(Job::new(queue, payload.clone())).await?;
        sent += 1;
    }
    let (t1, c1) = (Instant::now(), cpu_s());
    Ok(format!(
        r#"{{"sdk": "rust", "sent": {sent}, "bytes": {bytes}, {}}}"#,
        figures(sent, (t1 - t0).as_secs_f64(), c1 - c0)
    ))
}

#[derive(Default)]
struct Window {
    first: Option<(Instant, f64)>,
    last: Option<(Instant, f64)>,
}

async fn worker(
    addr: &str,
    queue: &str,
    n: u64,
    concurrency: u32,
    sleep_ms: f64,
    credit: u32,
) -> Result<String, BoxErr> {
    let client = Client::connect(addr).await?;
    let pause = Duration::from_secs_f64(sleep_ms / 1000.0);
    let done = Arc::new(AtomicU64::new(0));
    let window = Arc::new(Mutex::new(Window::default()));
    let finished = Arc::new(Notify::new());
    let (d, w, f) = (done.clone(), window.clone(), finished.clone());
    let handler = move |_job: Delivery| {
        let (d, w, f) = (d.clone(), w.clone(), f.clone());
        async move {
            {
                let mut w = w.lock().unwrap();
                if w.first.is_none() {
                    w.first = Some((Instant::now(), cpu_s()));
                }
            }
            tokio::time::sleep(pause).await;
            if d.fetch_add(1, Ordering::SeqCst) + 1 == n {
                w.lock().unwrap().last = Some((Instant::now(), cpu_s()));
                f.notify_one();
            }
            Ok::<(), std::convert::Infallible>(())
        }
    };
    Worker::new(client, [queue.to_string()])
        .concurrency(concurrency)
        .prefetch(credit)
        .lease(Duration::from_secs(60))
        .run(handler, async move { finished.notified().await })
        .await?;
    let w = window.lock().unwrap();
    let jobs = done.load(Ordering::SeqCst);
    let mut out = format!(
        r#"{{"sdk": "rust", "jobs": {jobs}, "credit": {credit}, "concurrency": {concurrency}, "sleep_ms": {sleep_ms}"#
    );
    if let (Some((t0, c0)), Some((t1, c1))) = (w.first, w.last) {
        out += ", ";
        out += &figures(n, (t1 - t0).as_secs_f64(), c1 - c0);
    }
    out += "}";
    Ok(out)
}

/// `concurrency` tasks sleeping `sleep_ms` in a loop for `secs`: sleeps
/// done a second, and that over the ideal (concurrency / sleep time).
async fn ceiling(concurrency: u32, sleep_ms: f64, secs: f64) -> String {
    let done = Arc::new(AtomicU64::new(0));
    let pause = Duration::from_secs_f64(sleep_ms / 1000.0);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let (c0, mut tasks) = (cpu_s(), Vec::new());
    for _ in 0..concurrency {
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                tokio::time::sleep(pause).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let (secs, n) = (start.elapsed().as_secs_f64(), done.load(Ordering::Relaxed));
    let ideal = f64::from(concurrency) * 1000.0 / sleep_ms;
    format!(
        r#"{{"lang": "rust", "sleep": "tokio::time::sleep", "concurrency": {concurrency}, "sleep_ms": {sleep_ms}, "rate": {:.0}, "ideal": {ideal:.0}, "of_ideal": {:.3}, "cpu_s": {:.2}}}"#,
        n as f64 / secs,
        n as f64 / secs / ideal,
        cpu_s() - c0
    )
}

#[tokio::main]
async fn main() -> Result<(), BoxErr> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: leaseq-rust-bench producer ADDR QUEUE N SECS [BYTES] | worker ADDR QUEUE N CONCURRENCY SLEEP_MS [CREDIT] | ceiling CONCURRENCY SLEEP_MS SECS";
    if args.len() == 5 && args[1] == "ceiling" {
        let line = ceiling(args[2].parse()?, args[3].parse()?, args[4].parse()?).await;
        println!("{line}");
        return Ok(());
    }
    if args.len() < 6 {
        return Err(usage.into());
    }
    let (addr, queue) = (args[2].as_str(), args[3].as_str());
    let n: u64 = args[4].parse()?;
    let line = match args[1].as_str() {
        "producer" => {
            let bytes = args.get(6).map(|b| b.parse()).transpose()?.unwrap_or(100);
            producer(addr, queue, n, args[5].parse()?, bytes).await?
        }
        "worker" if args.len() > 6 => {
            let concurrency: u32 = args[5].parse()?;
            let credit = args
                .get(7)
                .map(|c| c.parse())
                .transpose()?
                .unwrap_or(concurrency);
            worker(addr, queue, n, concurrency, args[6].parse()?, credit).await?
        }
        _ => return Err(usage.into()),
    };
    println!("{line}");
    Ok(())
}
