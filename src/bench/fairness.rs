//! `--scenario fairness` (issue 33, fair shares across keys): tenant A
//! enqueues `--backlog` jobs (key `tenant-a`); once `--consumers` Consume
//! streams (credit `--max-in-flight`, acks on the stream) have A's jobs
//! flowing, tenant B enqueues 10 jobs (key `tenant-b`) in one EnqueueBatch.
//! The run reports how many of A's jobs were delivered from the moment B's
//! batch was sent to B's last delivery (`a_before_b`), that time
//! (`b_wait_ms`), and A's rate before B came. With `--fair-by-key` the
//! queue serves its keys in turn; without, it is the control (B waits
//! behind A's whole backlog, up to `--duration`).

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::BenchArgs;
use super::summary::{Fairness, Summary, round};
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;

/// Tenant B's jobs.
const B_JOBS: usize = 10;
/// Jobs per EnqueueBatch of A's fill.
const FILL_BATCH: u64 = 1000;

pub async fn run(args: &BenchArgs) -> anyhow::Result<Summary> {
    let addr = args.addr.split(',').next().unwrap_or(&args.addr);
    let channel = crate::cli::connect(addr, &args.security).await?;
    let queue = args
        .queue
        .clone()
        .unwrap_or_else(|| format!("bench-fair-{}", uuid::Uuid::new_v4().simple()));
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel.clone());
    admin
        .update_queue(pb::UpdateQueueRequest {
            queue: queue.clone(),
            create: true,
            fair_by_key: Some(args.fair_by_key),
            ..Default::default()
        })
        .await?;
    let mut client = QueueServiceClient::new(channel.clone());
    let job = |key: &str| pb::EnqueueRequest {
        queue: queue.clone(),
        payload: vec![b'x'; args.payload_bytes],
        key: key.to_owned(),
        ..Default::default()
    };
    let mut done = 0;
    while done < args.backlog {
        let n = (args.backlog - done).min(FILL_BATCH);
        let jobs = (0..n).map(|_| job("tenant-a")).collect();
        client
            .enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await?;
        done += n;
    }
    eprintln!("fairness: {done} jobs of tenant-a enqueued");

    // Every delivery's key and arrival.
    let (seen, mut deliveries) = mpsc::unbounded_channel::<(bool, Instant)>();
    let mut consumers = tokio::task::JoinSet::new();
    for i in 0..args.consumers {
        consumers.spawn(consume(
            QueueServiceClient::new(crate::cli::connect(addr, &args.security).await?),
            pb::SubscribeRequest {
                queues: vec![queue.clone()],
                consumer: format!("bench-fair-{i}"),
                max_in_flight: args.max_in_flight,
                ..Default::default()
            },
            seen.clone(),
        ));
    }
    drop(seen);
    let limit = Instant::now() + Duration::from_secs(args.duration);
    let (warm, a_rate) = warm_up(&mut deliveries, limit).await?;
    let sent = Instant::now();
    client
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: (0..B_JOBS).map(|_| job("tenant-b")).collect(),
        })
        .await?;
    let committed = Instant::now();
    let (a_before_b, a_after_commit, b_seen, last_b) =
        until_b(&mut deliveries, sent, committed, limit).await;
    consumers.abort_all();
    let b_wait_ms = last_b
        .filter(|_| b_seen == B_JOBS as u64)
        .map(|t| round(t.duration_since(sent).as_secs_f64() * 1000.0, 3));
    Ok(Summary {
        scenario: "Fairness",
        delivered: warm + a_before_b + b_seen,
        fairness: Some(Fairness {
            fair_by_key: args.fair_by_key,
            backlog: args.backlog,
            b_jobs: B_JOBS as u64,
            b_delivered: b_seen,
            a_before_b,
            b_wait_ms,
            a_after_commit,
            b_enqueue_ms: round(committed.duration_since(sent).as_secs_f64() * 1000.0, 3),
            a_jobs_per_s_before: round(a_rate, 1),
        }),
        ..Summary::default()
    })
}

/// A's jobs flowing: a second of their deliveries. Returns how many, and
/// their rate.
async fn warm_up(
    deliveries: &mut mpsc::UnboundedReceiver<(bool, Instant)>,
    limit: Instant,
) -> anyhow::Result<(u64, f64)> {
    let mut warm = 0u64;
    let from = Instant::now();
    let mut first_a = None;
    while let Ok(Some((is_b, at))) = tokio::time::timeout_at(limit.into(), deliveries.recv()).await
    {
        anyhow::ensure!(!is_b, "a tenant-b delivery before tenant-b enqueued");
        let first = *first_a.get_or_insert(at);
        warm += 1;
        if at.duration_since(first) >= Duration::from_secs(1) {
            break;
        }
    }
    Ok((warm, warm as f64 / from.elapsed().as_secs_f64()))
}

/// Reads deliveries until B's all arrived (or `limit`): A's delivered
/// after `sent`, A's delivered after `committed` (B's batch answered), B's
/// seen, and B's last arrival.
async fn until_b(
    deliveries: &mut mpsc::UnboundedReceiver<(bool, Instant)>,
    sent: Instant,
    committed: Instant,
    limit: Instant,
) -> (u64, u64, u64, Option<Instant>) {
    let (mut a_before_b, mut a_after_commit, mut b_seen, mut last_b) = (0u64, 0u64, 0u64, None);
    while b_seen < B_JOBS as u64 {
        let Ok(Some((is_b, at))) = tokio::time::timeout_at(limit.into(), deliveries.recv()).await
        else {
            break;
        };
        if at < sent {
            continue;
        }
        if is_b {
            b_seen += 1;
            last_b = Some(at);
        } else {
            a_before_b += 1;
            if at >= committed {
                a_after_commit += 1;
            }
        }
    }
    (a_before_b, a_after_commit, b_seen, last_b)
}

/// One Consume stream acking every delivery on the stream, reporting each
/// (its key is tenant-b's, when it arrived) to `seen`.
async fn consume(
    mut client: QueueServiceClient<crate::cli::ClientChannel>,
    sub: pb::SubscribeRequest,
    seen: mpsc::UnboundedSender<(bool, Instant)>,
) -> anyhow::Result<()> {
    let (requests, rx) = mpsc::unbounded_channel();
    requests.send(pb::ConsumeRequest {
        subscribe: Some(sub),
        ..Default::default()
    })?;
    let mut responses = client
        .consume(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(msg) = responses.message().await? {
        let batch = match msg.kind {
            Some(pb::consume_response::Kind::Delivery(d)) => vec![d],
            Some(pb::consume_response::Kind::Deliveries(d)) => d.deliveries,
            _ => continue,
        };
        let now = Instant::now();
        let mut acks = Vec::with_capacity(batch.len());
        for d in batch {
            let job = d.job.unwrap_or_default();
            let _ = seen.send((job.key == "tenant-b", now));
            acks.push(pb::AckRequest {
                job_id: job.id,
                lease_token: d.lease_token,
                enqueue: Vec::new(),
                result: Vec::new(),
            });
        }
        requests.send(pb::ConsumeRequest {
            acks,
            ..Default::default()
        })?;
    }
    Ok(())
}
