//! `--scenario enqueue`: `--producers` concurrent clients (e.g. 64), each
//! sending single-job Enqueue calls one at a time; nothing consumes. Only
//! the broker's own coalescing can batch these.

use super::harness::Bench;
use super::summary::Summary;
use super::{BenchArgs, Scenario, producer};

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let mut bench = Bench::connect(args).await?;
    let w = bench.start();
    for _ in 0..args.producers {
        let task = producer::singles(bench.shared.clone(), bench.producer_client(), w.deadline);
        bench.spawn(task);
    }
    bench.measure(Scenario::Enqueue, w).await
}
