//! `--scenario throughput`: `--producers` closed loops of EnqueueBatch
//! (`--batch` jobs each) and `--consumers` streams of `--max-in-flight`
//! credits settling as `--ack` says, flat out for `--duration`.

use super::harness::Bench;
use super::summary::Summary;
use super::{BenchArgs, Scenario, producer};

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let bench = Bench::connect(args).await?;
    measure(bench, Scenario::Throughput).await
}

/// The throughput run on a connected bench (also `backlog`'s, after its fill).
pub async fn measure(mut bench: Bench, scenario: Scenario) -> anyhow::Result<Summary> {
    let args = bench.args.clone();
    bench
        .start_consumers(args.consumers, args.max_in_flight)
        .await?;
    let w = bench.start();
    for _ in 0..args.producers {
        let task = producer::batches(
            bench.shared.clone(),
            bench.producer_client(),
            args.batch.max(1),
            w.deadline,
        );
        bench.spawn(task);
    }
    let mut summary = bench.measure(scenario, w).await?;
    summary.batch = Some(args.batch.max(1));
    Ok(summary)
}
