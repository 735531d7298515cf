//! `--scenario ping`: gRPC health checks (`grpc.health.v1.Health/Check`) at
//! `--rate`, open loop, on the producers' connection. The broker answers
//! them from memory, so their round trip is the gRPC hop alone: client
//! task → HTTP/2 over loopback → the broker's runtime → back. An Enqueue
//! call pays that hop plus the broker's work and PostgreSQL's commit; run
//! next to `latency` at the same rate, it splits the Enqueue call's time
//! (docs/BENCHMARKS.md, "Where the time goes at light load").

use tonic_health::pb::health_client::HealthClient;

use super::harness::Bench;
use super::producer::Call;
use super::summary::Summary;
use super::{BenchArgs, Scenario};

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let mut bench = Bench::connect(args).await?;
    let call = Call::Ping(HealthClient::new(bench.producer_channel()));
    let w = bench.open_loop_of(call, args.rate).await?;
    bench.measure(Scenario::Ping, w).await
}
