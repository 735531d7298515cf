//! Consumer loops: one stream each, settling every job as soon as it is
//! delivered, as `--ack` says:
//!
//! - `stream`: a Consume stream; acks go on the same stream. Whatever was
//!   delivered while the previous request was being sent goes in the next
//!   request, so acks coalesce by themselves under load and go one by one
//!   at light load. The stream asks for `confirm_settles`: the broker
//!   answers each ack request with one small SettleResults response, and the
//!   acked count is the count it confirmed (failures count as errors).
//! - `batch`: a Subscribe stream and AckBatch calls, coalesced the same way
//!   (one call in flight per consumer).
//! - `unary`: a Subscribe stream and one Ack call per job, each in its own
//!   task.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::AckMode;
use super::harness::Shared;
use crate::cli::ClientChannel;
use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;

/// Most acks in one ConsumeRequest or AckBatch call (the broker's default
/// limit per message).
const MAX_ACKS_PER_MESSAGE: usize = 1000;

/// Runs consumer `i` until aborted at the end of the run. A stream that
/// cannot open stops the run; one that ends during it counts as an error.
/// `accept`: read packed `Deliveries`.
pub async fn run(
    shared: Arc<Shared>,
    channel: ClientChannel,
    i: usize,
    credit: u32,
    ack: AckMode,
    accept: bool,
) {
    let client = QueueServiceClient::new(channel);
    let sub = pb::SubscribeRequest {
        queues: shared.queues.clone(),
        consumer: format!("bench-{i}"),
        max_in_flight: credit,
        lease: None,
        accept: if accept {
            vec![crate::pb::features::DELIVERIES.to_owned()]
        } else {
            Vec::new()
        },
    };
    let mut ready = Ready {
        shared: &shared,
        signalled: false,
    };
    let result = match ack {
        AckMode::Stream => consume(&shared, client, sub, &mut ready).await,
        AckMode::Batch | AckMode::Unary => subscribe(&shared, client, sub, ack, &mut ready).await,
    };
    let why = match result {
        Ok(()) => "the broker ended the stream".to_owned(),
        Err(e) => format!("{e:#}"),
    };
    if ready.signalled {
        shared.counters.error(format_args!("consumer {i}: {why}"));
    } else {
        shared.consumer_failed_to_open(format!("consumer {i} ({ack:?} acks): {why}"));
    }
}

/// Tells the harness, once, that the stream is registered.
struct Ready<'a> {
    shared: &'a Shared,
    signalled: bool,
}

impl Ready<'_> {
    fn signal(&mut self) {
        if !self.signalled {
            self.signalled = true;
            self.shared.consumer_ready();
        }
    }
}

/// `--ack stream`: Consume, with the acks on the stream.
async fn consume(
    shared: &Arc<Shared>,
    mut client: QueueServiceClient<ClientChannel>,
    sub: pb::SubscribeRequest,
    ready: &mut Ready<'_>,
) -> anyhow::Result<()> {
    // Room for one request: the next waits until the previous was taken.
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(pb::ConsumeRequest {
            subscribe: Some(sub),
            confirm_settles: true,
            ..Default::default()
        })
        .await?;
    let mut responses = client.consume(ReceiverStream::new(rx)).await?.into_inner();
    let (acks, finished) = mpsc::unbounded_channel();
    let sender = send_acks(requests, finished);
    tokio::pin!(sender);
    let reader = async {
        while let Some(msg) = responses.message().await? {
            ready.signal();
            let batch = match msg.kind {
                Some(pb::consume_response::Kind::Delivery(d)) => vec![d],
                Some(pb::consume_response::Kind::Deliveries(d)) => d.deliveries,
                Some(pb::consume_response::Kind::Settled(s)) => {
                    shared.on_settled(&s.results);
                    continue;
                }
                Some(
                    pb::consume_response::Kind::Heartbeat(_)
                    | pb::consume_response::Kind::Cancelled(_),
                )
                | None => continue,
            };
            for d in batch {
                let job = d.job.unwrap_or_default();
                shared.on_delivery(&job);
                let _ = acks.send(pb::AckRequest {
                    job_id: job.id,
                    lease_token: d.lease_token,
                    enqueue: Vec::new(),
                    result: Vec::new(),
                });
            }
        }
        anyhow::Ok(())
    };
    // The sender never finishes first (see `send_acks`).
    tokio::select! {
        r = reader => r,
        () = &mut sender => Ok(()),
    }
}

/// Sends finished jobs' acks on the stream: everything that finished while
/// the previous request waited for room goes in the next one.
async fn send_acks(
    requests: mpsc::Sender<pb::ConsumeRequest>,
    mut finished: mpsc::UnboundedReceiver<pb::AckRequest>,
) {
    while let Some(acks) = next_batch(&mut finished).await {
        let msg = pb::ConsumeRequest {
            acks,
            ..Default::default()
        };
        if requests.send(msg).await.is_err() {
            break;
        }
    }
    // The call ended: its response stream says why.
    std::future::pending().await
}

/// Waits for one item, then takes whatever else is already there (up to
/// the per-message limit). None once every sender is gone.
async fn next_batch<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let mut batch = vec![first];
    while batch.len() < MAX_ACKS_PER_MESSAGE {
        match rx.try_recv() {
            Ok(a) => batch.push(a),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// `--ack batch` and `--ack unary`: Subscribe, and acks as separate calls.
async fn subscribe(
    shared: &Arc<Shared>,
    mut client: QueueServiceClient<ClientChannel>,
    sub: pb::SubscribeRequest,
    ack: AckMode,
    ready: &mut Ready<'_>,
) -> anyhow::Result<()> {
    let mut stream = client.subscribe(sub).await?.into_inner();
    let batches = (ack == AckMode::Batch).then(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(ack_batches(client.clone(), rx, shared.clone()));
        tx
    });
    while let Some(msg) = stream.message().await? {
        ready.signal();
        let batch = match msg.kind {
            Some(pb::subscribe_response::Kind::Delivery(d)) => vec![d],
            Some(pb::subscribe_response::Kind::Deliveries(d)) => d.deliveries,
            _ => continue,
        };
        for d in batch {
            let job = d.job.unwrap_or_default();
            shared.on_delivery(&job);
            let ack = pb::AckRequest {
                job_id: job.id,
                lease_token: d.lease_token,
                enqueue: Vec::new(),
                result: Vec::new(),
            };
            if let Some(batches) = &batches {
                let _ = batches.send(ack);
                continue;
            }
            let (mut client, shared) = (client.clone(), shared.clone());
            tokio::spawn(async move {
                match client.ack(ack).await {
                    Ok(_) => shared.counters.acked.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        shared.counters.error(format_args!("Ack: {e}"));
                        0
                    }
                };
            });
        }
    }
    Ok(())
}

/// Acks a consumer's finished jobs with AckBatch: whatever piled up while the
/// previous call ran goes in the next one (group commit on the client side).
/// Ends when its consumer does (the channel closes).
async fn ack_batches(
    mut client: QueueServiceClient<ClientChannel>,
    mut finished: mpsc::UnboundedReceiver<pb::AckRequest>,
    shared: Arc<Shared>,
) {
    while let Some(acks) = next_batch(&mut finished).await {
        match client.ack_batch(pb::AckBatchRequest { acks }).await {
            Ok(r) => {
                let mut ok = 0;
                for r in r.into_inner().results {
                    if r.code == 0 {
                        ok += 1;
                    } else {
                        shared.counters.error(format_args!(
                            "AckBatch entry {}: code {}: {}",
                            r.job_id, r.code, r.message
                        ));
                    }
                }
                shared.counters.acked.fetch_add(ok, Ordering::Relaxed);
            }
            Err(e) => shared.counters.error(format_args!("AckBatch: {e}")),
        }
    }
}
