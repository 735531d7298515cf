// A benchmark worker (scripts/bench/sdk-workers.sh): one Worker with a no-op
// handler works N jobs from a queue, then stops. Prints one JSON line: the
// rate from the first delivery (the first handler call) to the last handler
// completion, and the process's CPU over that window from /proc/self/stat
// (every thread). Linux only (/proc).
//
//     cargo build --release -p leaseq-client --example noop_worker
//     target/release/examples/noop_worker ADDR QUEUE N [CREDIT=256]
//
// Not a test: scripts/bench/README.md lists it with the script that runs it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use leaseq_client::{Client, Delivery, Worker};
use tokio::sync::Notify;

/// utime + stime of this process in clock ticks (100 a second on Linux).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    tick(11) + tick(12)
}

#[derive(Default)]
struct Window {
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (addr, queue) = (args[1].clone(), args[2].clone());
    let n: u64 = args[3].parse()?;
    let credit: u32 = args.get(4).map(|c| c.parse()).transpose()?.unwrap_or(256);

    let client = Client::connect(&addr).await?;
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
                    w.first = Some((Instant::now(), cpu_ticks()));
                }
            }
            if d.fetch_add(1, Ordering::SeqCst) + 1 == n {
                w.lock().unwrap().last = Some((Instant::now(), cpu_ticks()));
                f.notify_one();
            }
            Ok::<(), std::convert::Infallible>(())
        }
    };
    Worker::new(client, [queue])
        .concurrency(credit)
        .run(handler, async move { finished.notified().await })
        .await?;

    let w = window.lock().unwrap();
    let jobs = done.load(Ordering::SeqCst);
    // One JSON line, by hand: the client crate has no JSON dependency.
    let mut out =
        format!(r#"{{"sdk": "rust", "jobs": {jobs}, "credit": {credit}, "profile": "none""#);
    if let (Some((t0, c0)), Some((t1, c1))) = (w.first, w.last) {
        let secs = (t1 - t0).as_secs_f64();
        let cpu = (c1 - c0) as f64 / 100.0;
        out += &format!(
            r#", "secs": {secs:.3}, "rate": {:.0}, "cpu_s": {cpu:.2}, "cpu_us_per_job": {:.1}, "cores": {:.2}"#,
            n as f64 / secs,
            cpu / n as f64 * 1e6,
            cpu / secs
        );
    }
    println!("{out}}}");
    Ok(())
}
