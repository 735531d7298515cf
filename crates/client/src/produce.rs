//! [`Client::enqueue`](crate::Client::enqueue)'s transport: one Produce
//! stream per client (shared by its clones), opened on the first enqueue,
//! each job a request with an id and each answer matched to its caller by
//! it. A unary Enqueue costs a new HTTP/2 stream and its headers both ways;
//! a message on an open stream costs neither.
//!
//! When the stream breaks (the broker restarted, drained, the connection
//! dropped), the jobs waiting for an answer get its status (UNAVAILABLE for
//! a drain or a lost connection: they may or may not be enqueued, as with a
//! unary call whose answer was lost), and the next enqueue opens a new
//! stream. A broker from before Produce answers UNIMPLEMENTED: nothing was
//! enqueued, so the waiting jobs are sent again with the unary Enqueue, as
//! every later one is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status};

use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;
use crate::{ClientChannel, Enqueued};

type Answer = oneshot::Sender<Result<pb::ProduceResponse, Status>>;

#[derive(Default)]
pub(crate) struct Producer {
    state: Mutex<State>,
    /// Set at the first answer on a stream: the broker has Produce, so the
    /// caller need not keep a copy of each job for a fallback to Enqueue.
    confirmed: AtomicBool,
}

#[derive(Default)]
enum State {
    /// No stream open: the next enqueue opens one.
    #[default]
    Idle,
    Open(Arc<Stream>),
    /// The broker has no Produce: unary Enqueue from now on.
    Unsupported,
}

/// Dropped with the last client's producer: the request side then ends,
/// the broker answers what was sent and ends the call, and its task ends.
struct Stream {
    requests: mpsc::UnboundedSender<pb::ProduceRequest>,
    /// Shared with the stream's task (which holds no sender).
    waiting: Arc<Mutex<Waiting>>,
}

#[derive(Default)]
struct Waiting {
    next_id: u64,
    answers: HashMap<u64, Answer>,
    /// Set (with every waiting job answered) when the stream ended: no
    /// job may wait on it after that.
    ended: bool,
}

/// What became of one job sent on the stream.
pub(crate) enum Sent {
    Answered(Result<Enqueued, Status>),
    /// The broker has no Produce: send it with Enqueue (the job, unless it
    /// was sent and lost with the stream).
    Unsupported(Option<Box<pb::EnqueueRequest>>),
}

impl Producer {
    /// Whether a broker has answered on a stream (see `confirmed`).
    pub(crate) fn confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Relaxed)
    }

    /// Sends `job` on the stream (opening one if needed) and waits for its
    /// answer.
    pub(crate) async fn enqueue(
        self: &Arc<Self>,
        queue: &QueueServiceClient<ClientChannel>,
        job: pb::EnqueueRequest,
    ) -> Sent {
        let mut job = Some(job);
        // A stream that ended between our look and our send: once more on
        // a new one.
        for _ in 0..3 {
            let stream = match self.stream(queue) {
                Some(s) => s,
                None => return Sent::Unsupported(job.take().map(Box::new)),
            };
            let (tx, rx) = oneshot::channel();
            {
                let mut w = stream.waiting.lock().expect("poisoned");
                if w.ended {
                    continue;
                }
                w.next_id += 1;
                let id = w.next_id;
                let req = pb::ProduceRequest {
                    id,
                    job: job.take(),
                };
                if let Err(e) = stream.requests.send(req) {
                    // The stream's task is gone; it ends `waiting` too.
                    job = e.0.job;
                    continue;
                }
                w.answers.insert(id, tx);
            }
            return match rx.await {
                Ok(Ok(r)) if r.code == 0 => Sent::Answered(Ok(r
                    .enqueued
                    .map(Enqueued::from)
                    .unwrap_or_else(|| Enqueued::from(pb::EnqueueResponse::default())))),
                Ok(Ok(r)) => Sent::Answered(Err(Status::new(Code::from(r.code), r.message))),
                Ok(Err(s)) if s.code() == Code::Unimplemented => Sent::Unsupported(None),
                Ok(Err(s)) => Sent::Answered(Err(s)),
                Err(_) => Sent::Answered(Err(Status::unavailable(
                    "the Produce stream ended before answering",
                ))),
            };
        }
        Sent::Answered(Err(Status::unavailable(
            "the Produce stream kept ending before the job was sent",
        )))
    }

    /// The open stream, or a new one; None when the broker has no Produce.
    fn stream(self: &Arc<Self>, queue: &QueueServiceClient<ClientChannel>) -> Option<Arc<Stream>> {
        let mut state = self.state.lock().expect("poisoned");
        match &*state {
            State::Open(s) => return Some(s.clone()),
            State::Unsupported => return None,
            State::Idle => {}
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = Arc::new(Stream {
            requests: tx,
            waiting: Arc::default(),
        });
        *state = State::Open(stream.clone());
        tokio::spawn(run(
            Arc::downgrade(self),
            Arc::downgrade(&stream),
            stream.waiting.clone(),
            queue.clone(),
            UnboundedReceiverStream::new(rx),
        ));
        Some(stream)
    }
}

/// The stream's task: opens the call, hands each answer to its job, and
/// when the call ends gives every job still waiting the status it ended
/// with.
async fn run(
    producer: Weak<Producer>,
    stream: Weak<Stream>,
    waiting: Arc<Mutex<Waiting>>,
    mut queue: QueueServiceClient<ClientChannel>,
    requests: UnboundedReceiverStream<pb::ProduceRequest>,
) {
    let ended = match queue.produce(requests).await {
        Err(status) => status,
        Ok(resp) => {
            let mut answers = resp.into_inner();
            let mut confirmed = false;
            loop {
                match answers.message().await {
                    Ok(Some(r)) => {
                        if !confirmed {
                            confirmed = true;
                            if let Some(p) = producer.upgrade() {
                                p.confirmed.store(true, Ordering::Relaxed);
                            }
                        }
                        let tx = waiting.lock().expect("poisoned").answers.remove(&r.id);
                        if let Some(tx) = tx {
                            let _ = tx.send(Ok(r));
                        }
                    }
                    Ok(None) => break Status::unavailable("the Produce stream ended"),
                    Err(status) => break status,
                }
            }
        }
    };
    if let Some(producer) = producer.upgrade() {
        let mut state = producer.state.lock().expect("poisoned");
        if matches!(&*state, State::Open(s) if std::ptr::eq(Arc::as_ptr(s), stream.as_ptr())) {
            *state = if ended.code() == Code::Unimplemented {
                State::Unsupported
            } else {
                State::Idle
            };
        }
    }
    let waiting = {
        let mut w = waiting.lock().expect("poisoned");
        w.ended = true;
        std::mem::take(&mut w.answers)
    };
    for (_, tx) in waiting {
        let _ = tx.send(Err(ended.clone()));
    }
}
