//! `--scenario streams`: `--streams` consumer streams of 4 credits each on
//! one broker (a connection per 100 streams), fed open loop at `--rate`
//! jobs/s: many mostly idle streams, each still served.

use super::harness::Bench;
use super::summary::Summary;
use super::{BenchArgs, Scenario};

/// Credits per stream: a fleet of small workers.
const CREDIT: u32 = 4;

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let mut bench = Bench::connect(args).await?;
    bench.start_consumers(args.streams, CREDIT).await?;
    let w = bench.open_loop(args.rate).await?;
    bench.measure(Scenario::Streams, w).await
}
