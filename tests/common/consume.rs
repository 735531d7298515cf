//! A Consume stream as the tests drive it: the request side is a channel
//! the test sends on (dropping it half-closes), the response side is read
//! with bounded waits. Deliveries that arrive while a test waits for settle
//! results (and results that arrive while it waits for deliveries) are kept
//! in order for the next call that asks for them, so nothing read is lost.

use std::collections::VecDeque;
use std::time::Duration;

use leaseq::pb;
use leaseq::pb::consume_response::Kind;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Code, Status, Streaming};

use super::{Client, dur};

/// The first message of a stream: the subscription (as Subscribe's),
/// accepting packed `Deliveries` (as the SDKs do; [`Consumer`] unpacks them).
pub fn opening(
    queues: &[&str],
    max_in_flight: u32,
    lease: Option<Duration>,
    confirm_settles: bool,
) -> pb::ConsumeRequest {
    pb::ConsumeRequest {
        subscribe: Some(pb::SubscribeRequest {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            consumer: "test".into(),
            max_in_flight,
            lease: lease.map(dur),
            accept: vec![pb::features::DELIVERIES.to_owned()],
        }),
        confirm_settles,
        ..Default::default()
    }
}

pub fn ack_of(d: &pb::Delivery) -> pb::AckRequest {
    pb::AckRequest {
        job_id: d.job.as_ref().expect("job").id.clone(),
        lease_token: d.lease_token.clone(),
        enqueue: Vec::new(),
        result: Vec::new(),
    }
}

pub fn nack_of(
    d: &pb::Delivery,
    error: &str,
    retry_after: Option<Duration>,
    dead_letter: bool,
) -> pb::NackRequest {
    pb::NackRequest {
        job_id: d.job.as_ref().expect("job").id.clone(),
        lease_token: d.lease_token.clone(),
        error: error.to_owned(),
        retry_after: retry_after.map(dur),
        dead_letter,
    }
}

pub fn extend_of(d: &pb::Delivery, lease: Duration) -> pb::ExtendLeaseRequest {
    pb::ExtendLeaseRequest {
        job_id: d.job.as_ref().expect("job").id.clone(),
        lease_token: d.lease_token.clone(),
        lease: Some(dur(lease)),
    }
}

/// A settle result as the Status the unary call would have returned.
pub fn status_of(r: &pb::SettleResult) -> Result<(), Status> {
    if r.code == 0 {
        Ok(())
    } else {
        Err(Status::new(Code::from(r.code), r.message.clone()))
    }
}

/// How a stream ended, and what it carried on the way.
#[derive(Debug)]
pub struct Ended {
    /// `Ok` for a clean end (OK status).
    pub status: Result<(), Status>,
    pub deliveries: Vec<pb::Delivery>,
    pub results: Vec<pb::SettleResult>,
}

pub struct Consumer {
    rx: Streaming<pb::ConsumeResponse>,
    /// None once half-closed.
    tx: Option<mpsc::Sender<pb::ConsumeRequest>>,
    deliveries: VecDeque<pb::Delivery>,
    results: VecDeque<pb::SettleResult>,
    /// `Cancelled` messages (a held job was cancelled).
    cancels: VecDeque<pb::Cancelled>,
    /// Set once the response ended (with its status).
    ended: Option<Result<(), Status>>,
}

impl Consumer {
    /// Sends `first` and starts the call; the call's own status when the
    /// broker refuses it before answering.
    pub async fn start(client: &mut Client, first: pb::ConsumeRequest) -> Result<Consumer, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.expect("receiver alive");
        Self::start_with(client, Some(tx), rx).await
    }

    /// Starts a call whose request stream is `rx` (`tx` is kept for later
    /// messages; None: the requests end when `rx`'s senders are gone).
    pub async fn start_with(
        client: &mut Client,
        tx: Option<mpsc::Sender<pb::ConsumeRequest>>,
        rx: mpsc::Receiver<pb::ConsumeRequest>,
    ) -> Result<Consumer, Status> {
        let resp = client
            .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Consumer {
            rx: resp,
            tx,
            deliveries: VecDeque::new(),
            results: VecDeque::new(),
            cancels: VecDeque::new(),
            ended: None,
        })
    }

    /// Opens a stream and waits for its first heartbeat (the stream is
    /// then registered with the dispatcher).
    pub async fn open(
        client: &mut Client,
        queues: &[&str],
        max_in_flight: u32,
        lease: Option<Duration>,
        confirm_settles: bool,
    ) -> Consumer {
        let mut c = Self::start(
            client,
            opening(queues, max_in_flight, lease, confirm_settles),
        )
        .await
        .expect("consume");
        let first = tokio::time::timeout(Duration::from_secs(5), c.rx.message())
            .await
            .expect("first message within 5s")
            .expect("stream ok")
            .expect("stream open");
        assert!(
            matches!(first.kind, Some(Kind::Heartbeat(_))),
            "the first message is a heartbeat: {first:?}"
        );
        c
    }

    /// Sends one request; false once the request side is closed.
    pub async fn send(&self, req: pb::ConsumeRequest) -> bool {
        match &self.tx {
            Some(tx) => tx.send(req).await.is_ok(),
            None => false,
        }
    }

    pub async fn ack(&self, d: &pb::Delivery) {
        self.send(pb::ConsumeRequest {
            acks: vec![ack_of(d)],
            ..Default::default()
        })
        .await;
    }

    pub async fn nack(
        &self,
        d: &pb::Delivery,
        error: &str,
        retry_after: Option<Duration>,
        dead_letter: bool,
    ) {
        self.send(pb::ConsumeRequest {
            nacks: vec![nack_of(d, error, retry_after, dead_letter)],
            ..Default::default()
        })
        .await;
    }

    pub async fn extend(&self, d: &pb::Delivery, lease: Duration) {
        self.send(pb::ConsumeRequest {
            extends: vec![extend_of(d, lease)],
            ..Default::default()
        })
        .await;
    }

    /// Changes the stream's credit.
    pub async fn credit(&self, max_in_flight: u32) {
        self.send(pb::ConsumeRequest {
            max_in_flight,
            ..Default::default()
        })
        .await;
    }

    /// Half-closes: no more requests.
    pub fn half_close(&mut self) {
        self.tx = None;
    }

    /// Reads the first response: Ok if it is the heartbeat that opens every
    /// stream; the stream's status if it failed; UNKNOWN for anything else.
    pub async fn opened(&mut self, limit: Duration) -> Result<(), Status> {
        match tokio::time::timeout(limit, self.rx.message()).await {
            Ok(Ok(Some(pb::ConsumeResponse {
                kind: Some(Kind::Heartbeat(_)),
            }))) => Ok(()),
            Ok(Ok(Some(m))) => Err(Status::unknown(format!(
                "first message not a heartbeat: {m:?}"
            ))),
            Ok(Ok(None)) => Err(Status::unknown("stream opened, then ended at once")),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(Status::unknown(format!(
                "stream opened, no message within {limit:?}"
            ))),
        }
    }

    /// Reads one response, sorting it into the buffers. False on timeout.
    /// Panics when the stream ends (use [`Consumer::end`] to expect that).
    async fn read(&mut self, deadline: Instant) -> bool {
        if let Some(status) = &self.ended {
            panic!("the stream already ended: {status:?}");
        }
        let Ok(msg) = tokio::time::timeout_at(deadline, self.rx.message()).await else {
            return false;
        };
        match msg {
            Ok(Some(m)) => match m.kind {
                Some(Kind::Delivery(d)) => self.deliveries.push_back(d),
                Some(Kind::Deliveries(d)) => self.deliveries.extend(d.deliveries),
                Some(Kind::Settled(r)) => self.results.extend(r.results),
                Some(Kind::Cancelled(c)) => self.cancels.push_back(c),
                Some(Kind::Heartbeat(_)) | None => {}
            },
            Ok(None) => panic!("the stream ended (OK) while more was expected"),
            Err(s) => panic!("the stream failed while more was expected: {s:?}"),
        }
        true
    }

    /// The next delivery within `limit`, or None.
    pub async fn try_next_delivery(&mut self, limit: Duration) -> Option<pb::Delivery> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(d) = self.deliveries.pop_front() {
                return Some(d);
            }
            if !self.read(deadline).await {
                return None;
            }
        }
    }

    /// The next delivery; panics after `limit`.
    /// The next `Cancelled` message within `limit`, if any.
    pub async fn try_next_cancel(&mut self, limit: Duration) -> Option<pb::Cancelled> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(c) = self.cancels.pop_front() {
                return Some(c);
            }
            if !self.read(deadline).await {
                return None;
            }
        }
    }

    pub async fn next_delivery(&mut self, limit: Duration) -> pb::Delivery {
        self.try_next_delivery(limit)
            .await
            .unwrap_or_else(|| panic!("no delivery within {limit:?}"))
    }

    /// `n` deliveries, each within `limit`.
    pub async fn take(&mut self, n: usize, limit: Duration) -> Vec<pb::Delivery> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.next_delivery(limit).await);
        }
        out
    }

    /// Asserts nothing is delivered for `window`.
    pub async fn assert_quiet(&mut self, window: Duration, why: &str) {
        if let Some(d) = self.try_next_delivery(window).await {
            let j = d.job.as_ref().expect("job");
            panic!(
                "{why}: unexpected delivery of {:?} (attempt {})",
                String::from_utf8_lossy(&j.payload),
                j.attempt
            );
        }
    }

    /// The next `n` settle results (deliveries meanwhile are kept); panics
    /// when they do not all arrive within `limit`.
    pub async fn results(&mut self, n: usize, limit: Duration) -> Vec<pb::SettleResult> {
        let deadline = Instant::now() + limit;
        while self.results.len() < n {
            assert!(
                self.read(deadline).await,
                "{} of {n} settle results within {limit:?}: {:?}",
                self.results.len(),
                self.results
            );
        }
        self.results.drain(..n).collect()
    }

    /// The next settle result.
    pub async fn result(&mut self, limit: Duration) -> pb::SettleResult {
        self.results(1, limit).await.remove(0)
    }

    /// Asserts no settle result arrives for `window` (deliveries are kept).
    pub async fn assert_no_results(&mut self, window: Duration, why: &str) {
        let deadline = Instant::now() + window;
        while self.results.is_empty() && self.read(deadline).await {}
        assert!(self.results.is_empty(), "{why}: {:?}", self.results);
    }

    /// Reads until the stream ends (within `limit`, else panics); returns
    /// its status and everything it carried that was not taken yet.
    pub async fn end(&mut self, limit: Duration) -> Ended {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.ended.take() {
                break s;
            }
            let msg = tokio::time::timeout_at(deadline, self.rx.message())
                .await
                .unwrap_or_else(|_| panic!("the stream did not end within {limit:?}"));
            match msg {
                Ok(Some(m)) => match m.kind {
                    Some(Kind::Delivery(d)) => self.deliveries.push_back(d),
                    Some(Kind::Deliveries(d)) => self.deliveries.extend(d.deliveries),
                    Some(Kind::Settled(r)) => self.results.extend(r.results),
                    Some(Kind::Cancelled(c)) => self.cancels.push_back(c),
                    Some(Kind::Heartbeat(_)) | None => {}
                },
                Ok(None) => break Ok(()),
                Err(s) => break Err(s),
            }
        };
        self.ended = Some(status.clone());
        Ended {
            status,
            deliveries: self.deliveries.drain(..).collect(),
            results: self.results.drain(..).collect(),
        }
    }
}
