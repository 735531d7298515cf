//! `--scenario latency`: Enqueue at `--rate` jobs/s, open loop (send times
//! scheduled in advance, calls not waiting for each other), to
//! `--consumers` streams settling as `--ack` says. Reports enqueue →
//! delivery latency from each job's scheduled send time, the Enqueue call's
//! own round trip, and how far behind schedule the sends were.

use super::harness::Bench;
use super::summary::Summary;
use super::{BenchArgs, Scenario};

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let mut bench = Bench::connect(args).await?;
    bench
        .start_consumers(args.consumers, args.max_in_flight)
        .await?;
    let w = bench.open_loop(args.rate).await?;
    bench.measure(Scenario::Latency, w).await
}
