//! The latency floor of a gRPC broker on PostgreSQL: a benchmark anchor, not
//! a broker.
//!
//! It answers `leaseq bench --scenario latency` (Enqueue, and Consume with
//! acks on the stream) doing only what any durable queue on gRPC and
//! PostgreSQL must do for a job at light load, and nothing leaseq adds:
//!
//! - Enqueue: one single-row insert into a table with a primary key, its own
//!   durable commit, then the job pushed to a Consume stream (round robin)
//!   and the call answered; EnqueueBatch, for the flat-out run (`leaseq
//!   bench --duration N`), the same with one multi-row insert per call;
//! - acks: the acked rows deleted in one statement per 12 ms (leaseq's ack
//!   linger, its default read from `leaseq_server::Config`), each ack
//!   confirmed after that commit; `FLOOR_ACKS=none`
//!   confirms them at once with no database work.
//!
//! `FLOOR_RUNTIME=current` runs it on one thread. `FLOOR_NOTIFY=1` is the
//! floor across replicas: the insert also sends the job in a NOTIFY (one
//! statement, one commit), and every floor broker so started LISTENs and
//! pushes what it hears to its own streams; Enqueue pushes nothing itself.
//!
//! No leases, tokens, queues, validation, flow control or recovery. Its
//! latency, next to leaseq's in the same sitting, is what the machine charges
//! for the hops (docs/BENCHMARKS.md, "A floor broker").
//!
//!   cargo build --release --example floor_broker
//!   DATABASE_URL=... FLOOR_LISTEN=127.0.0.1:50063 target/release/examples/floor_broker

use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use leaseq_proto as pb;
use pb::queue_service_server::{QueueService, QueueServiceServer};
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

type Out = mpsc::Sender<Result<pb::ConsumeResponse, Status>>;

struct Floor {
    pool: sqlx::PgPool,
    streams: Mutex<Vec<Out>>,
    next: AtomicUsize,
    acks_in_db: bool,
    notify: bool,
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// The answer to every call the latency and flat-out scenarios do not make.
fn enqueue_and_consume_only() -> Status {
    Status::unimplemented("floor broker: Enqueue, EnqueueBatch and Consume only")
}

impl Floor {
    /// The next open stream in turn.
    fn pick(&self) -> Option<Out> {
        let mut streams = self.streams.lock().expect("poisoned");
        streams.retain(|s| !s.is_closed());
        if streams.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % streams.len();
        Some(streams[i].clone())
    }

    /// Pushes a job to the next stream, if one is open.
    async fn push(&self, job: pb::Job) {
        let Some(out) = self.pick() else { return };
        let delivery = pb::Delivery {
            job: Some(job),
            lease_token: "floor".into(),
            lease_expires_at: None,
        };
        let msg = pb::ConsumeResponse {
            kind: Some(pb::consume_response::Kind::Delivery(delivery)),
        };
        let _ = out.send(Ok(msg)).await;
    }

    /// A job inserted as `id`: pushed to the next stream (unless the
    /// listener pushes it, `FLOOR_NOTIFY=1`) and answered.
    async fn accepted(&self, id: i64, job: pb::EnqueueRequest) -> pb::EnqueueResponse {
        let job_id = id.to_string();
        if !self.notify {
            self.push(pb::Job {
                id: job_id.clone(),
                queue: job.queue,
                payload: job.payload,
                attempt: 1,
                ..Default::default()
            })
            .await;
        }
        pb::EnqueueResponse {
            job_id,
            duplicate: false,
            replaced: false,
        }
    }

    /// `FLOOR_NOTIFY=1`: pushes every job heard on the channel.
    async fn listen(self: std::sync::Arc<Self>, url: String) -> anyhow::Result<()> {
        let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
        listener.listen("floor_jobs").await?;
        loop {
            let n = listener.recv().await?;
            let Some((id, payload)) = n.payload().split_once(':') else {
                continue;
            };
            let Ok(payload) = hex::decode(payload) else {
                continue;
            };
            self.push(pb::Job {
                id: id.to_owned(),
                payload,
                attempt: 1,
                ..Default::default()
            })
            .await;
        }
    }

    /// Reads a stream's acks; every ack linger (leaseq's default, 12 ms)
    /// deletes what came in one statement and confirms it.
    async fn settle(
        pool: sqlx::PgPool,
        acks_in_db: bool,
        mut input: Streaming<pb::ConsumeRequest>,
        out: Out,
    ) {
        let linger = leaseq_server::Config::default().ack_linger;
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<pb::AckRequest>>();
        let writer = tokio::spawn(async move {
            while let Some(mut acks) = rx.recv().await {
                if acks_in_db {
                    tokio::time::sleep(linger).await;
                }
                while let Ok(more) = rx.try_recv() {
                    acks.extend(more);
                }
                if acks_in_db {
                    let ids: Vec<i64> = acks.iter().filter_map(|a| a.job_id.parse().ok()).collect();
                    if let Err(e) = sqlx::query("delete from floor_jobs where id = any($1)")
                        .bind(&ids)
                        .execute(&pool)
                        .await
                    {
                        let _ = out.send(Err(internal(e))).await;
                        return;
                    }
                }
                let results = acks
                    .into_iter()
                    .map(|a| pb::SettleResult {
                        job_id: a.job_id,
                        op: pb::SettleOp::Ack as i32,
                        ..Default::default()
                    })
                    .collect();
                let msg = pb::ConsumeResponse {
                    kind: Some(pb::consume_response::Kind::Settled(pb::SettleResults {
                        results,
                    })),
                };
                if out.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        while let Ok(Some(req)) = input.message().await {
            if !req.acks.is_empty() && tx.send(req.acks).is_err() {
                break;
            }
        }
        drop(tx);
        let _ = writer.await;
    }
}

#[tonic::async_trait]
impl QueueService for Floor {
    async fn enqueue(
        &self,
        request: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        let job = request.into_inner();
        let sql = if self.notify {
            "with j as (insert into floor_jobs (queue, payload) values ($1, $2) returning id), \
             n as (select pg_notify('floor_jobs', id || ':' || encode($2, 'hex')) from j) \
             select id from j, n"
        } else {
            "insert into floor_jobs (queue, payload) values ($1, $2) returning id"
        };
        let id: i64 = sqlx::query_scalar(sql)
            .bind(&job.queue)
            .bind(&job.payload)
            .fetch_one(&self.pool)
            .await
            .map_err(internal)?;
        Ok(Response::new(self.accepted(id, job).await))
    }

    async fn report_progress(
        &self,
        _: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressResponse>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    type ProduceStream = Boxed<pb::ProduceResponse>;

    async fn produce(
        &self,
        _: Request<Streaming<pb::ProduceRequest>>,
    ) -> Result<Response<Self::ProduceStream>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    type WaitJobStream = Boxed<pb::WaitJobResponse>;

    async fn wait_job(
        &self,
        _: Request<pb::WaitJobRequest>,
    ) -> Result<Response<Self::WaitJobStream>, Status> {
        Err(Status::unimplemented("not part of the floor"))
    }

    type ConsumeStream = Boxed<pb::ConsumeResponse>;

    async fn consume(
        &self,
        request: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let mut input = request.into_inner();
        match input.message().await? {
            Some(first) if first.subscribe.is_some() => {}
            _ => return Err(Status::invalid_argument("subscribe: required")),
        }
        let (out, rx) = mpsc::channel(1024);
        // The first response tells the client the stream is registered.
        out.send(Ok(pb::ConsumeResponse {
            kind: Some(pb::consume_response::Kind::Heartbeat(
                pb::Heartbeat::default(),
            )),
        }))
        .await
        .map_err(internal)?;
        self.streams.lock().expect("poisoned").push(out.clone());
        tokio::spawn(Self::settle(self.pool.clone(), self.acks_in_db, input, out));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// Flat out (`leaseq bench --duration N`): one multi-row insert and its
    /// commit per call, then each job pushed as Enqueue pushes it.
    async fn enqueue_batch(
        &self,
        request: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        if self.notify {
            return Err(enqueue_and_consume_only());
        }
        let jobs = request.into_inner().jobs;
        let queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
        let payloads: Vec<&[u8]> = jobs.iter().map(|j| j.payload.as_slice()).collect();
        let ids: Vec<i64> = sqlx::query_scalar(
            "insert into floor_jobs (queue, payload) \
             select * from unnest($1::text[], $2::bytea[]) returning id",
        )
        .bind(&queues)
        .bind(&payloads)
        .fetch_all(&self.pool)
        .await
        .map_err(internal)?;
        let mut results = Vec::with_capacity(jobs.len());
        for (job, id) in jobs.into_iter().zip(ids) {
            results.push(self.accepted(id, job).await);
        }
        Ok(Response::new(pb::EnqueueBatchResponse { results }))
    }

    type SubscribeStream = Boxed<pb::SubscribeResponse>;

    async fn subscribe(
        &self,
        _: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Err(enqueue_and_consume_only())
    }

    async fn ack(&self, _: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        Err(enqueue_and_consume_only())
    }

    async fn ack_batch(
        &self,
        _: Request<pb::AckBatchRequest>,
    ) -> Result<Response<pb::AckBatchResponse>, Status> {
        Err(enqueue_and_consume_only())
    }

    async fn nack(
        &self,
        _: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        Err(enqueue_and_consume_only())
    }

    async fn extend_lease(
        &self,
        _: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        Err(enqueue_and_consume_only())
    }
}

fn main() -> anyhow::Result<()> {
    // FLOOR_RUNTIME=current: one thread for everything (tokio's
    // current-thread runtime); else tokio's default, a worker per core.
    let runtime = if std::env::var("FLOOR_RUNTIME").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let listen = std::env::var("FLOOR_LISTEN").unwrap_or_else(|_| "127.0.0.1:50063".into());
    let acks_in_db = std::env::var("FLOOR_ACKS").as_deref() != Ok("none");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await?;
    sqlx::query(
        "create table if not exists floor_jobs \
         (id bigint generated always as identity primary key, queue text not null, payload bytea not null)",
    )
    .execute(&pool)
    .await?;
    let notify = std::env::var("FLOOR_NOTIFY").as_deref() == Ok("1");
    let floor = std::sync::Arc::new(Floor {
        pool,
        streams: Mutex::new(Vec::new()),
        next: AtomicUsize::new(0),
        acks_in_db,
        notify,
    });
    if notify {
        let f = floor.clone();
        tokio::spawn(async move {
            if let Err(e) = f.listen(url).await {
                eprintln!("listener: {e}");
                std::process::exit(1);
            }
        });
    }
    eprintln!("floor broker on {listen} (acks in the database: {acks_in_db}, notify: {notify})");
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(QueueServiceServer::from_arc(floor))
        .serve(listen.parse()?)
        .await?;
    Ok(())
}
