//! `--scenario backlog`: enqueue `--backlog` jobs first (EnqueueBatch of
//! 1,000, not measured), then the throughput run on top of them. The fill's
//! jobs carry no send time, so the latency figures cover only jobs enqueued
//! during the measurement (which wait behind what is left of the backlog).

use std::time::Instant;

use super::harness::{Bench, Shared};
use super::summary::Summary;
use super::{BenchArgs, Scenario, stamp, throughput};
use crate::pb;

/// Jobs per EnqueueBatch of the fill.
const FILL_BATCH: u64 = 1000;

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let mut bench = Bench::connect(args).await?;
    fill(&mut bench).await?;
    throughput::measure(bench, Scenario::Backlog).await
}

async fn fill(bench: &mut Bench) -> anyhow::Result<()> {
    let (total, size) = (bench.args.backlog, bench.args.payload_bytes);
    let mut client = bench.producer_client();
    let mut done = 0u64;
    let started = Instant::now();
    while done < total {
        let n = (total - done).min(FILL_BATCH);
        // One queue per batch (a batch is one transaction on one cluster).
        let queue = bench.shared.next_queue().to_owned();
        let jobs = (0..n)
            .map(|_| Shared::job_on(queue.clone(), stamp::unstamped(size)))
            .collect();
        client
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await?;
        done += n;
        if done % 50_000 < FILL_BATCH {
            eprint!("\rbacklog: {done}/{total} jobs");
        }
    }
    eprintln!(
        "\rbacklog: {done} jobs in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
