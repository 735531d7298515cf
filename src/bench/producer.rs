//! Producer loops: closed loops (the next call when the previous one
//! answered) for throughput, and the open-loop generator for latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::harness::Shared;
use super::stamp;
use crate::cli::ClientChannel;
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// A send that starts more than this many µs after its scheduled time
/// counts as late.
pub const LATE_US: u64 = 1_000;

/// The open loop keeps at most this many Enqueue calls in flight; a send
/// due beyond that is skipped and counted as an error (the broker has
/// stopped answering; the run shows it rather than exhausting memory).
const MAX_OPEN_CALLS: u64 = 20_000;

/// Closed loop of EnqueueBatch calls of `batch` jobs, each stamped when
/// built, until the deadline.
pub async fn batches(
    shared: Arc<Shared>,
    mut client: QueueServiceClient<ClientChannel>,
    batch: usize,
    deadline: Instant,
) {
    while !shared.stop.is_cancelled() && Instant::now() < deadline {
        if backlog_full(&shared) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        // One queue per batch: a batch is one transaction on one cluster.
        let queue = shared.next_queue().to_owned();
        let jobs = (0..batch)
            .map(|_| {
                shared.keyed_job_on(
                    queue.clone(),
                    stamp::payload(stamp::now(), shared.payload_bytes),
                )
            })
            .collect();
        let began = Instant::now();
        match client.enqueue_batch(pb::EnqueueBatchRequest { jobs }).await {
            Ok(_) => {
                shared.enqueue_calls.record(began.elapsed());
                let n = batch as u64;
                shared.counters.enqueued.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => shared.counters.error(format_args!("EnqueueBatch: {e}")),
        }
    }
}

/// Whether this run's jobs waiting to be acked are past `--max-backlog`.
fn backlog_full(shared: &Shared) -> bool {
    let c = &shared.counters;
    let waiting = c
        .enqueued
        .load(Ordering::Relaxed)
        .saturating_sub(c.acked.load(Ordering::Relaxed));
    shared.max_backlog > 0 && waiting > shared.max_backlog
}

/// Closed loop of single Enqueue calls, one at a time, until the deadline.
pub async fn singles(
    shared: Arc<Shared>,
    mut client: QueueServiceClient<ClientChannel>,
    deadline: Instant,
) {
    while !shared.stop.is_cancelled() && Instant::now() < deadline {
        let job = shared.new_job(stamp::payload(stamp::now(), shared.payload_bytes));
        let began = Instant::now();
        match client.enqueue(job).await {
            Ok(_) => {
                shared.enqueue_calls.record(began.elapsed());
                shared.counters.enqueued.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => shared.counters.error(format_args!("Enqueue: {e}")),
        }
    }
}

/// What each send of the open loop is.
#[derive(Clone)]
pub enum Call {
    /// An Enqueue of one job stamped with its due time.
    Enqueue(QueueServiceClient<ClientChannel>),
    /// A gRPC health check (`grpc.health.v1.Health/Check`, answered from
    /// memory): the round trip of the gRPC hop alone, the floor under an
    /// Enqueue call's on this machine. Its latency is recorded as a
    /// delivery's would be (from the due time) and as a call's.
    Ping(HealthClient<ClientChannel>),
}

/// The open loop: send k is due at `start + k / rate`, scheduled in advance.
/// A thread of its own sleeps until each due time (the OS timer, finer than
/// the runtime's 1 ms one) and starts the call as a task of its own without
/// waiting for earlier ones, so a slow broker shows as latency, not as a
/// lower send rate (no coordinated omission). Each job carries its due
/// time, not the time it was actually sent; how late each send started is
/// recorded apart, so an overloaded generator shows too.
pub fn open_loop(
    shared: Arc<Shared>,
    call: Call,
    rate: u64,
    start: Instant,
    deadline: Instant,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Handle::current();
    let in_flight = Arc::new(AtomicU64::new(0));
    std::thread::Builder::new()
        .name("bench-open-loop".into())
        .spawn(move || {
            for k in 0u64.. {
                let due = start
                    + Duration::from_nanos(
                        (u128::from(k) * 1_000_000_000 / u128::from(rate)) as u64,
                    );
                if due >= deadline || shared.stop.is_cancelled() {
                    break;
                }
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if in_flight.load(Ordering::Relaxed) >= MAX_OPEN_CALLS {
                    shared.counters.error(format_args!(
                        "open loop: {MAX_OPEN_CALLS} Enqueue calls in flight; skipping sends"
                    ));
                    continue;
                }
                in_flight.fetch_add(1, Ordering::Relaxed);
                let (shared, mut call, in_flight) =
                    (shared.clone(), call.clone(), in_flight.clone());
                runtime.spawn(async move {
                    let began = Instant::now();
                    let measured = shared.measured(stamp::at(due));
                    let late = began.saturating_duration_since(due);
                    if measured {
                        shared.late.record(late);
                        if late > Duration::from_micros(LATE_US) {
                            shared.late_sends.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let answered = match &mut call {
                        Call::Enqueue(client) => {
                            let job = shared
                                .new_job(stamp::payload(stamp::at(due), shared.payload_bytes));
                            client.enqueue(job).await.map(drop)
                        }
                        Call::Ping(client) => {
                            let r = client.check(HealthCheckRequest::default()).await;
                            if measured {
                                shared.latency.record(due.elapsed());
                            }
                            r.map(drop)
                        }
                    };
                    match answered {
                        Ok(()) if !measured => {}
                        Ok(()) => {
                            shared.enqueue_calls.record(began.elapsed());
                            shared.counters.enqueued.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => shared.counters.error(format_args!("open-loop call: {e}")),
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        })?;
    Ok(())
}
