//! WaitJob (issue 34): callers waiting for jobs to end.
//!
//! A job may end on any replica (an ack, a dead letter by a reaper, a ttl
//! expiry), and nothing on the hot path tells the other replicas: the ack
//! statement's NOTIFY goes to the broker that leased the job only, and a
//! broadcast per ack would cost every ack a NOTIFY for the rare job someone
//! waits on. So each broker reads the state of every job waited on it in
//! one statement per cluster (`wait_status.sql`, four primary-key probes
//! per job) every `--wait-poll-interval` (100 ms), only while someone
//! waits: the latency of an end on another replica is at most that
//! interval plus the statement. An end this broker settled itself (an ack,
//! a nack to the dead letters, a cancel) pokes the poll at once.
//!
//! [`Waits`] is the registry: at most `--max-waiters` waits per broker
//! (RESOURCE_EXHAUSTED past it). Each wait holds an [`mpsc`] sender; its
//! [`WaitStream`] (the response) ends when the poll sends the outcome and
//! drops the sender, at the wait's timeout, or when the client goes (the
//! stream is dropped, and with it its [`Registration`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::warn;
use uuid::Uuid;

use crate::pb;
use crate::placement::Clusters;
use crate::store::WaitRow;

/// The default of `--max-waiters`.
pub const DEFAULT_MAX_WAITERS: usize = 10_000;

/// Messages one wait may have queued for a client that reads slowly: its
/// state changes are dropped past it (the outcome never is).
const WAIT_CHANNEL: usize = 16;

type Reply = Result<pb::WaitJobResponse, Status>;

/// Every wait open on this broker, by job. Shared by the WaitJob handler
/// (registers), the poll task (answers) and the settle path (pokes).
pub struct Waits {
    inner: Mutex<Inner>,
    /// Wakes the poll task: the first wait registered (it sleeps while
    /// none is open), or a job ended on this broker (poll at once).
    poke: Notify,
    /// `--max-waiters`; set once by the server at start.
    max: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    by_job: HashMap<Uuid, Vec<Waiter>>,
    open: usize,
    next: u64,
}

struct Waiter {
    id: u64,
    tx: mpsc::Sender<Reply>,
    /// Send live states too (`WaitJobRequest.changes`).
    changes: bool,
    /// The last live state sent (or seen at the start).
    last: Option<pb::WaitState>,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            inner: Mutex::default(),
            poke: Notify::new(),
            max: AtomicUsize::new(DEFAULT_MAX_WAITERS),
        }
    }
}

/// A wait's place in [`Waits`]; dropping it (the response stream dropped)
/// removes the wait.
pub struct Registration {
    waits: Arc<Waits>,
    job: Uuid,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.waits.remove(self.job, self.id);
    }
}

impl Waits {
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Polls at once if anyone waits (a job ended on this broker).
    pub fn poke(&self) {
        if self.inner.lock().expect("waits").open > 0 {
            self.poke.notify_one();
        }
    }

    /// Registers a wait for `job`, whose state was `last` when the wait
    /// started. RESOURCE_EXHAUSTED past `--max-waiters`.
    pub fn register(
        self: &Arc<Self>,
        job: Uuid,
        changes: bool,
        last: Option<pb::WaitState>,
    ) -> Result<(Registration, mpsc::Receiver<Reply>), Status> {
        let (tx, rx) = mpsc::channel(WAIT_CHANNEL);
        let mut inner = self.inner.lock().expect("waits");
        let max = self.max.load(Ordering::Relaxed);
        if inner.open >= max {
            return Err(Status::resource_exhausted(format!(
                "max-waiters: this broker holds {max} WaitJob calls at once; retry later or on another replica"
            )));
        }
        inner.next += 1;
        let id = inner.next;
        inner.by_job.entry(job).or_default().push(Waiter {
            id,
            tx,
            changes,
            last,
        });
        inner.open += 1;
        if inner.open == 1 {
            self.poke.notify_one();
        }
        drop(inner);
        let reg = Registration {
            waits: self.clone(),
            job,
            id,
        };
        Ok((reg, rx))
    }

    fn remove(&self, job: Uuid, id: u64) {
        let mut inner = self.inner.lock().expect("waits");
        let Some(list) = inner.by_job.get_mut(&job) else {
            return;
        };
        let before = list.len();
        list.retain(|w| w.id != id);
        let gone = before - list.len();
        if list.is_empty() {
            inner.by_job.remove(&job);
        }
        inner.open -= gone;
    }

    fn jobs(&self) -> Vec<Uuid> {
        self.inner
            .lock()
            .expect("waits")
            .by_job
            .keys()
            .copied()
            .collect()
    }

    /// Waits currently open (a gauge for tests and metrics).
    pub fn open(&self) -> usize {
        self.inner.lock().expect("waits").open
    }

    /// Answers the waits of the jobs in `rows`: an outcome ends every wait
    /// of its job (the senders are dropped, so the streams end OK after
    /// it); a live state changed since a wait's last is sent to those that
    /// asked for changes.
    fn answer(&self, rows: Vec<WaitRow>) {
        let mut inner = self.inner.lock().expect("waits");
        for row in rows {
            let reply = response(&row);
            let state = reply.state();
            if is_final(state) {
                let Some(list) = inner.by_job.remove(&row.id) else {
                    continue;
                };
                inner.open -= list.len();
                for w in list {
                    if let Err(mpsc::error::TrySendError::Full(r)) =
                        w.tx.try_send(Ok(reply.clone()))
                    {
                        // A client that does not read: the outcome still
                        // waits for it, off the lock.
                        tokio::spawn(async move { w.tx.send(r).await });
                    }
                }
            } else if let Some(list) = inner.by_job.get_mut(&row.id) {
                for w in list.iter_mut().filter(|w| w.last != Some(state)) {
                    w.last = Some(state);
                    if w.changes {
                        let _ = w.tx.try_send(Ok(reply.clone()));
                    }
                }
            }
        }
    }
}

/// The state of `ids` on every cluster, merged: a job is on one cluster
/// (the one of its queue), so the first row that found it wins; a job no
/// cluster has is UNKNOWN. Fails if any cluster failed.
pub async fn status(clusters: &Clusters, ids: &[Uuid]) -> crate::error::Result<Vec<WaitRow>> {
    let all =
        futures_util::future::join_all(clusters.all().iter().map(|s| s.wait_status(ids))).await;
    let mut found: HashMap<Uuid, WaitRow> = HashMap::with_capacity(ids.len());
    for rows in all {
        for row in rows? {
            if row.state.is_some() || !found.contains_key(&row.id) {
                found.insert(row.id, row);
            }
        }
    }
    Ok(found.into_values().collect())
}

/// What a row says, as the message a waiter gets.
pub fn response(row: &WaitRow) -> pb::WaitJobResponse {
    let state = match row.state.as_deref() {
        Some("available") => pb::WaitState::Available,
        Some("scheduled") => pb::WaitState::Scheduled,
        Some("leased") => pb::WaitState::Leased,
        Some("completed") => pb::WaitState::Completed,
        Some("dead") => pb::WaitState::Dead,
        Some("cancelled") => pb::WaitState::Cancelled,
        _ => pb::WaitState::Unknown,
    };
    pb::WaitJobResponse {
        job_id: row.id.to_string(),
        state: state as i32,
        result: row.result.clone().unwrap_or_default(),
        last_error: row.last_error.clone().unwrap_or_default(),
        dead_reason: row.dead_reason.clone().unwrap_or_default(),
        finished_at: row
            .finished_at
            .map(|t| std::time::SystemTime::from(t).into()),
    }
}

/// Whether the state ends the wait.
pub fn is_final(s: pb::WaitState) -> bool {
    matches!(
        s,
        pb::WaitState::Completed
            | pb::WaitState::Dead
            | pb::WaitState::Cancelled
            | pb::WaitState::Unknown
    )
}

/// The poll task: while any wait is open, reads every waited job's state
/// every `interval` (or at once when poked) and answers the waits. Ends at
/// shutdown.
pub async fn poll_loop(
    waits: Arc<Waits>,
    clusters: Clusters,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        // Asleep while nobody waits: the first registration pokes.
        while waits.open() == 0 {
            tokio::select! {
                () = waits.poke.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = waits.poke.notified() => {}
            () = shutdown.cancelled() => return,
        }
        let jobs = waits.jobs();
        if jobs.is_empty() {
            continue;
        }
        match status(&clusters, &jobs).await {
            Ok(rows) => waits.answer(rows),
            // The waits stay open; the next pass tries again.
            Err(e) => warn!(error = %e, waits = jobs.len(), "reading waited jobs failed"),
        }
    }
}

/// A WaitJob response: the messages the poll sends, then the end of the
/// stream (OK) once it dropped the sender after an outcome, or
/// DEADLINE_EXCEEDED at the wait's timeout. Holds the wait's
/// [`Registration`]: dropping the stream (the client went) ends the wait.
pub struct WaitStream {
    first: Option<pb::WaitJobResponse>,
    rx: Option<mpsc::Receiver<Reply>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _reg: Option<Registration>,
}

impl WaitStream {
    /// A wait answered at once: `first` is the outcome (the job had ended).
    pub fn answered(first: pb::WaitJobResponse) -> WaitStream {
        WaitStream {
            first: Some(first),
            rx: None,
            deadline: Box::pin(tokio::time::sleep(Duration::ZERO)),
            _reg: None,
        }
    }

    /// A wait registered: `first` (the job's live state, with `changes`),
    /// then what the poll sends, until `timeout`.
    pub fn open(
        first: Option<pb::WaitJobResponse>,
        reg: Registration,
        rx: mpsc::Receiver<Reply>,
        timeout: Duration,
    ) -> WaitStream {
        WaitStream {
            first,
            rx: Some(rx),
            deadline: Box::pin(tokio::time::sleep(timeout)),
            _reg: Some(reg),
        }
    }
}

impl futures_util::Stream for WaitStream {
    type Item = Reply;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(m)) => return Poll::Ready(Some(m)),
            Poll::Ready(None) => {
                self.rx = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.rx = None;
            self._reg = None;
            return Poll::Ready(Some(Err(Status::deadline_exceeded(
                "timeout: the job did not end within the wait's timeout",
            ))));
        }
        Poll::Pending
    }
}
