//! [`Consumer`]: the Consume stream as a Rust stream of [`Delivery`], for
//! code that wants to drive its own loop instead of a
//! [`Worker`](crate::Worker)'s handlers. Settles travel on the same stream.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::session::{Acker, Event, Session, SettleBase, Settler};
use crate::stats::WorkerStats;
use crate::{Client, Delivery, Nack, pb, pb_duration};

/// How to open a [`Consumer`].
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    queues: Vec<String>,
    credit: u32,
    lease: Option<Duration>,
    consumer: String,
}

impl ConsumeOptions {
    /// The stream of `queues`, with credit 16 and each queue's lease.
    pub fn new(queues: impl IntoIterator<Item = impl Into<String>>) -> ConsumeOptions {
        ConsumeOptions {
            queues: queues.into_iter().map(Into::into).collect(),
            credit: crate::DEFAULT_CONCURRENCY,
            lease: None,
            consumer: String::new(),
        }
    }

    /// How many delivered and unsettled jobs the stream may hold (1 to
    /// 10,000).
    pub fn credit(mut self, n: u32) -> ConsumeOptions {
        self.credit = n;
        self
    }

    /// The lease of each delivery (1 s to 12 h); default the queue's.
    pub fn lease(mut self, lease: Duration) -> ConsumeOptions {
        self.lease = Some(lease);
        self
    }

    /// The consumer name shown in admin views.
    pub fn consumer(mut self, name: impl Into<String>) -> ConsumeOptions {
        self.consumer = name.into();
        self
    }
}

/// An open Consume stream: [`next`](Consumer::next) gives its deliveries,
/// [`settler`](Consumer::settler) settles them on it. A task reads the
/// stream, so settles are answered whether or not `next` is being awaited.
/// Dropping the consumer closes the stream; the broker then releases every
/// job not settled. No reconnection: a [`Worker`](crate::Worker) does that.
///
/// ```no_run
/// use leaseq_client::{Client, ConsumeOptions};
///
/// # async fn demo(client: Client) -> Result<(), tonic::Status> {
/// let mut jobs = client.consume(ConsumeOptions::new(["emails"]).credit(64)).await?;
/// let settle = jobs.settler();
/// while let Some(job) = jobs.next().await {
///     let job = job?;
///     // ... work ...
///     settle.ack(&job).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct Consumer {
    deliveries: mpsc::UnboundedReceiver<Result<Delivery, Status>>,
    settler: ConsumerSettler,
    stop: CancellationToken,
}

/// Settles the jobs of one [`Consumer`] (cheap to clone; share it with the
/// tasks that work its jobs).
#[derive(Clone)]
pub struct ConsumerSettler(Arc<Settler>);

impl Client {
    /// Opens a Consume stream (see [`Consumer`]).
    pub async fn consume(&self, options: ConsumeOptions) -> Result<Consumer, Status> {
        let base = SettleBase {
            client: self.clone(),
            acker: Acker::spawn(self.clone()),
            stats: Arc::new(WorkerStats::default()),
        };
        let sub = pb::SubscribeRequest {
            queues: options.queues,
            consumer: options.consumer,
            max_in_flight: options.credit,
            lease: options.lease.map(pb_duration),
            accept: vec![leaseq_proto::features::DELIVERIES.to_owned()],
        };
        let mut session = Session::consume(self, sub, base).await?;
        // The first message (a heartbeat) says the stream is registered.
        session.next().await?;
        let settler = ConsumerSettler(session.settler());
        let (tx, deliveries) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(read(session, tx, stop.clone()));
        Ok(Consumer {
            deliveries,
            settler,
            stop,
        })
    }
}

/// Reads the stream until it ends, the consumer is dropped or nobody reads.
async fn read(
    mut session: Session,
    tx: mpsc::UnboundedSender<Result<Delivery, Status>>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => break,
            next = session.next() => next,
        };
        match next {
            Ok(Some(Event::Deliveries(ds))) => {
                for d in ds.into_iter().filter_map(Delivery::from_pb) {
                    if tx.send(Ok(d)).is_err() {
                        session.end();
                        return;
                    }
                }
            }
            // Nothing runs here to stop: the caller's settle is refused.
            Ok(Some(Event::Activity | Event::Cancelled(_))) => {}
            Ok(None) => break,
            Err(status) => {
                let _ = tx.send(Err(status));
                break;
            }
        }
    }
    session.close(Duration::from_secs(10)).await;
}

impl Consumer {
    /// The next delivery; None once the stream ended (a drain, or the
    /// broker gone: open a new one), `Err` with the status it failed with.
    pub async fn next(&mut self) -> Option<Result<Delivery, Status>> {
        self.deliveries.recv().await
    }

    /// What settles this stream's jobs.
    pub fn settler(&self) -> ConsumerSettler {
        self.settler.clone()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ConsumerSettler {
    /// Acks `job` (on the stream; by a unary call once it is gone).
    /// `FAILED_PRECONDITION`: its lease is no longer current.
    pub async fn ack(&self, job: &Delivery) -> Result<(), Status> {
        self.0
            .ack((&job.id, &job.lease_token), &[], &[])
            .await
            .map(drop)
    }

    /// Acks `job` with follow-up jobs, enqueued in the ack's transaction
    /// (they exist if and only if the ack committed); their ids, in order.
    /// `UNIMPLEMENTED`, with nothing sent, when the broker did not list
    /// `"ack.enqueue"` in the stream's first message (an older broker
    /// would ack and drop them).
    pub async fn ack_with(
        &self,
        job: &Delivery,
        follow_ups: impl IntoIterator<Item = crate::Job>,
    ) -> Result<Vec<String>, Status> {
        if !self.0.supports(leaseq_proto::features::ACK_ENQUEUE) {
            return Err(Status::unimplemented(
                "ack.enqueue: the broker did not list \"ack.enqueue\" in its first heartbeat: \
                 it cannot enqueue follow-up jobs with an ack",
            ));
        }
        let reqs: Vec<_> = follow_ups.into_iter().map(crate::Job::into_pb).collect();
        self.0.ack((&job.id, &job.lease_token), &reqs, &[]).await
    }

    /// Fails `job`; returns whether it went to the dead letters.
    pub async fn nack(&self, job: &Delivery, error: &str, options: &Nack) -> Result<bool, Status> {
        self.0
            .nack((&job.id, &job.lease_token), error, options)
            .await
    }

    /// Keeps `job` leased for `lease` more.
    pub async fn extend(&self, job: &Delivery, lease: Duration) -> Result<(), Status> {
        self.0.extend((&job.id, &job.lease_token), lease).await
    }
}
