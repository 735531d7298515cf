//! Group commit: concurrent callers share one statement.
//!
//! Callers queue their requests. Up to `concurrency` statements run at once;
//! while they do, new requests pile up, and whoever frees a statement slot
//! takes everything queued (up to `max_rows`) as the next batch. So batch
//! size adapts to load with no timer and no added latency when idle: at light
//! load a caller finds a free slot and runs its own one-request batch
//! itself, in its own task, with no hand-over to another task on the way
//! (each such hop cost a thread wake-up on an idle machine; see
//! docs/BENCHMARKS.md). A batch holding other callers' requests runs in a
//! task of its own, so a caller that goes away (a cancelled RPC) cannot take
//! other callers' statement down with it. Each caller is answered only after
//! the statement holding its row has committed.
//!
//! **A statement, once started, runs to its end**, whatever becomes of its
//! caller: a call dropped while its own batch runs in its task (a client's
//! deadline, a reset stream) leaves the rest of that batch's work to a task
//! of its own ([`Detach`]). Dropped halfway, the work after the statement
//! (the enqueue path reporting its hand-off claims to the dispatcher, a
//! settle giving a stream its credit back) never happened: a stream whose
//! one credit an abandoned Enqueue had claimed received nothing ever again.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::error::{Error, Result};

type Reply<R> = oneshot::Sender<Result<R>>;
type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Exec<Req, Resp> = dyn Fn(Vec<Req>) -> BoxFut<Result<Vec<Result<Resp>>>> + Send + Sync;

/// A handle to a batcher. Cheap to clone.
pub struct Batcher<Req, Resp> {
    inner: Arc<Inner<Req, Resp>>,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Batcher {
            inner: self.inner.clone(),
        }
    }
}

struct Queued<Req, Resp> {
    /// Which call queued it (so a caller can tell a batch of its own).
    call: u64,
    req: Req,
    reply: Reply<Resp>,
}

struct Inner<Req, Resp> {
    name: &'static str,
    max_rows: usize,
    weight: fn(&Req) -> usize,
    exec: Box<Exec<Req, Resp>>,
    /// Requests waiting for a statement slot.
    queue: Mutex<VecDeque<Queued<Req, Resp>>>,
    /// One permit per statement that may run at once (this batcher's share
    /// of the database connections).
    slots: Arc<Semaphore>,
    /// How many statements may run at once (the permits of `slots`).
    concurrency: usize,
    /// With a statement running, another starts only once this many rows
    /// wait (0: whenever a slot is free). See [`Batcher::with_spill`].
    spill_rows: usize,
    next_call: AtomicU64,
    /// How long a request that finds the batcher idle waits for company
    /// when its caller asked to linger (see [`Batcher::call_lingering`]).
    linger: std::time::Duration,
    /// A lingering request holds a slot: others queue behind it.
    lingering: std::sync::atomic::AtomicBool,
    /// When the last lingering call came (nanoseconds since `epoch`;
    /// `u64::MAX`: none yet).
    last_call: AtomicU64,
    epoch: tokio::time::Instant,
}

impl<Req, Resp> Batcher<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    /// `weight` is how many rows a request adds to a batch (an EnqueueBatch
    /// request carries many); a batch stops growing at `max_rows`. `exec`
    /// runs one batch and returns one result per request, in order.
    pub fn new<F, Fut>(
        name: &'static str,
        max_rows: usize,
        concurrency: usize,
        weight: fn(&Req) -> usize,
        exec: F,
    ) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<Resp>>>> + Send + 'static,
    {
        Batcher {
            inner: Arc::new(Inner {
                name,
                max_rows: max_rows.max(1),
                weight,
                exec: Box::new(move |reqs| Box::pin(exec(reqs))),
                queue: Mutex::new(VecDeque::new()),
                slots: Arc::new(Semaphore::new(concurrency.max(1))),
                concurrency: concurrency.max(1),
                spill_rows: 0,
                next_call: AtomicU64::new(0),
                linger: std::time::Duration::ZERO,
                lingering: std::sync::atomic::AtomicBool::new(false),
                last_call: AtomicU64::new(u64::MAX),
                epoch: tokio::time::Instant::now(),
            }),
        }
    }

    /// Sets the linger of [`Batcher::call_lingering`] (zero: none).
    pub fn with_linger(mut self, linger: std::time::Duration) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("set before the batcher is shared")
            .linger = linger;
        self
    }

    /// Sets how many rows must wait before a second statement runs beside
    /// one already running (0, the default: as soon as a slot is free).
    /// Small requests then share the running statement's successor instead
    /// of paying a commit of their own: on a 2-core machine two commits of
    /// a few rows each cost more than one of twice as many, while large
    /// batches gain from overlapping (docs/BENCHMARKS.md, "Enqueue
    /// statements in flight").
    pub fn with_spill(mut self, rows: usize) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("set before the batcher is shared")
            .spill_rows = rows;
        self
    }

    /// Like [`Batcher::call`], for a caller that does not wait on the
    /// answer to go on: a request that finds the batcher idle holds a slot
    /// for the linger, so that requests arriving meanwhile share its
    /// statement (one commit for several at light load). Only while such
    /// calls come less than two lingers apart: sparser ones would wait for
    /// nobody, and run at once.
    pub async fn call_lingering(&self, req: Req) -> Result<Resp> {
        let linger = self.inner.linger;
        let now = self.inner.epoch.elapsed().as_nanos() as u64;
        let last = self.inner.last_call.swap(now, Ordering::Relaxed);
        if linger.is_zero()
            || last == u64::MAX
            || now.saturating_sub(last) >= 2 * linger.as_nanos() as u64
        {
            return self.call(req).await;
        }
        let (_, rx, _) = self.inner.queue_up(req);
        if !self.inner.lingering.load(Ordering::Acquire)
            && let Ok(slot) = self.inner.slots.clone().try_acquire_owned()
            && !self.inner.lingering.swap(true, Ordering::AcqRel)
        {
            let slot = Slot {
                inner: self.inner.clone(),
                permit: Some(slot),
            };
            let inner = self.inner.clone();
            tokio::spawn(async move {
                tokio::time::sleep(linger).await;
                inner.lingering.store(false, Ordering::Release);
                let batch = inner.take_batch();
                if !batch.is_empty() {
                    inner.run(batch).await;
                }
                // Dropping the slot runs whatever queued meanwhile.
                drop(slot);
            });
        }
        // Otherwise a lingering request or a running statement takes ours
        // (a slot taken while another lingered is given back by its drop,
        // which runs what is queued).
        rx.await.map_err(|_| Error::Internal("batch dropped"))?
    }

    /// Queues one request and waits for its result.
    pub async fn call(&self, req: Req) -> Result<Resp> {
        let (call, rx, waiting) = self.inner.queue_up(req);
        if self.inner.may_start(waiting)
            && let Ok(slot) = self.inner.slots.clone().try_acquire_owned()
        {
            let mut slot = Slot {
                inner: self.inner.clone(),
                permit: Some(slot),
            };
            let batch = self.inner.take_batch();
            if batch.len() == 1 && batch[0].call == call {
                // Our own request alone: run it here, no task hop; should
                // this call be dropped meanwhile, it runs on in a task (and
                // gives the slot back when done).
                let inner = self.inner.clone();
                let permit = slot.permit.take();
                Detach::new(async move {
                    inner.run(batch).await;
                    drop(Slot { inner, permit });
                })
                .await;
            } else if !batch.is_empty() {
                let inner = self.inner.clone();
                let permit = slot.permit.take();
                tokio::spawn(async move {
                    inner.run(batch).await;
                    drop(Slot { inner, permit });
                });
            }
            // Dropping `slot` hands it to whatever queued meanwhile.
        }
        // Otherwise a statement is running for each slot (or one is, and too
        // few rows wait to start another), and whichever ends first takes
        // ours: a running statement's slot, given back, runs what queued.
        rx.await.map_err(|_| Error::Internal("batch dropped"))?
    }
}

impl<Req, Resp> Inner<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    /// Queues a request: its call number, where its result will come, and
    /// the rows now waiting (counted up to `spill_rows` only).
    fn queue_up(&self, req: Req) -> (u64, oneshot::Receiver<Result<Resp>>, usize) {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let mut queue = self.queue.lock().expect("poisoned");
        queue.push_back(Queued { call, req, reply });
        let mut waiting = 0;
        if self.spill_rows > 0 {
            for q in queue.iter() {
                waiting += (self.weight)(&q.req);
                if waiting >= self.spill_rows {
                    break;
                }
            }
        }
        (call, rx, waiting)
    }

    /// Whether a caller whose request left `waiting` rows queued may start
    /// a statement: always when none runs, and beside a running one only
    /// once enough rows wait. Sound against a lost wake-up: the running
    /// statement we saw gives its slot back after our request was queued,
    /// and then runs what is queued.
    fn may_start(&self, waiting: usize) -> bool {
        self.spill_rows == 0
            || waiting >= self.spill_rows
            || self.slots.available_permits() == self.concurrency
    }

    /// Takes the queued requests, up to `max_rows` rows (at least one).
    fn take_batch(&self) -> Vec<Queued<Req, Resp>> {
        let mut queue = self.queue.lock().expect("poisoned");
        let mut rows = 0;
        let mut batch = Vec::new();
        while let Some(next) = queue.front() {
            let w = (self.weight)(&next.req);
            if !batch.is_empty() && rows + w > self.max_rows {
                break;
            }
            rows += w;
            batch.push(queue.pop_front().expect("front exists"));
        }
        batch
    }

    async fn run(&self, batch: Vec<Queued<Req, Resp>>) {
        tracing::trace!(batcher = self.name, requests = batch.len(), "batch");
        let (reqs, replies): (Vec<Req>, Vec<Reply<Resp>>) =
            batch.into_iter().map(|q| (q.req, q.reply)).unzip();
        match (self.exec)(reqs).await {
            Ok(results) => {
                debug_assert_eq!(results.len(), replies.len());
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A future that is not cancelled by its caller's drop: dropped before it
/// finished, it goes on in a task of its own. The batcher runs a caller's
/// own batch in the caller's task (no task hop at light load) through it,
/// so that a statement and what follows it (reports to the dispatcher,
/// credit, wake-ups) always run to the end.
struct Detach(Option<BoxFut<()>>);

impl Detach {
    fn new(f: impl Future<Output = ()> + Send + 'static) -> Detach {
        Detach(Some(Box::pin(f)))
    }
}

impl Future for Detach {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let Some(f) = self.0.as_mut() else {
            return std::task::Poll::Ready(());
        };
        let r = f.as_mut().poll(cx);
        if r.is_ready() {
            self.0 = None;
        }
        r
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        // Outside a runtime (it is shutting down) there is nowhere to go on.
        if let Some(f) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(f);
        }
    }
}

/// A statement slot. When it is given back (dropped, also when the future
/// running it is cancelled), requests queued meanwhile get a statement: the
/// caller that could not get a slot relies on this.
struct Slot<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    inner: Arc<Inner<Req, Resp>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl<Req, Resp> Drop for Slot<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        drop(permit);
        let queued = !self.inner.queue.lock().expect("poisoned").is_empty();
        if !queued {
            return;
        }
        // Give it back first, then take it again: a caller that queued after
        // we looked either saw the slot free or is seen here.
        if let Ok(permit) = self.inner.slots.clone().try_acquire_owned() {
            let batch = self.inner.take_batch();
            if batch.is_empty() {
                return;
            }
            let inner = self.inner.clone();
            tokio::spawn(async move {
                inner.run(batch).await;
                drop(Slot {
                    inner,
                    permit: Some(permit),
                });
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// Lingering calls a moment apart share one statement; a lingering call
    /// with no call in the last two lingers runs at once, as do calls that
    /// do not linger.
    #[tokio::test(start_paused = true)]
    async fn lingering_calls_share_a_statement() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let b: Batcher<u32, u32> = Batcher::new(
            "test",
            100,
            2,
            |_| 1,
            move |reqs: Vec<u32>| {
                seen.lock().unwrap().push(reqs.clone());
                async move { Ok(reqs.into_iter().map(|r| Ok(r + 1)).collect()) }
            },
        )
        .with_linger(Duration::from_millis(50));
        // The first call has no recent company: it runs at once, alone (on
        // the paused clock, no time passes).
        let started = tokio::time::Instant::now();
        assert_eq!(b.call_lingering(0).await.unwrap(), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.call_lingering(1).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = tokio::spawn({
            let b = b.clone();
            async move { b.call_lingering(2).await }
        });
        assert_eq!(first.await.unwrap().unwrap(), 2);
        assert_eq!(second.await.unwrap().unwrap(), 3);
        assert_eq!(*batches.lock().unwrap(), [vec![0], vec![1, 2]]);
        // The first lingered from its start: the second, 10 ms later, joined it.
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        // A plain call does not wait for company.
        let started = tokio::time::Instant::now();
        assert_eq!(b.call(3).await.unwrap(), 4);
        assert_eq!(started.elapsed(), Duration::ZERO);
        // A lingering call long after the last one runs at once.
        tokio::time::sleep(Duration::from_millis(120)).await;
        let started = tokio::time::Instant::now();
        assert_eq!(b.call_lingering(4).await.unwrap(), 5);
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(
            *batches.lock().unwrap(),
            [vec![0], vec![1, 2], vec![3], vec![4]]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_call_is_answered_and_concurrent_calls_share_batches() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = batches.clone();
        let b: Batcher<u32, u32> = Batcher::new(
            "test",
            100,
            2,
            |_| 1,
            move |reqs: Vec<u32>| {
                counted.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(reqs.into_iter().map(|r| Ok(r * 2)).collect())
                }
            },
        );
        let calls: Vec<_> = (0..500)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.call(i).await) })
            })
            .collect();
        for c in calls {
            let (i, r) = c.await.unwrap();
            assert_eq!(r.unwrap(), i * 2);
        }
        let n = batches.load(Ordering::Relaxed);
        assert!(
            n < 500,
            "{n} statements for 500 concurrent calls: nothing was batched"
        );
    }

    #[tokio::test]
    async fn a_lone_call_runs_in_its_own_task_and_errors_reach_every_caller() {
        let b: Batcher<u32, u32> = Batcher::new(
            "test",
            10,
            1,
            |_| 1,
            |_reqs: Vec<u32>| async { Err(Error::Internal("boom")) },
        );
        assert!(matches!(b.call(1).await, Err(Error::Internal("boom"))));
        // The slot came back: the next call is served too.
        assert!(matches!(b.call(2).await, Err(Error::Internal("boom"))));
    }

    /// A call dropped while its own batch runs in its task (a client's
    /// deadline): the batch runs to its end all the same, and the slot
    /// comes back after it, not before.
    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_mid_statement_lets_its_statement_finish() {
        let finished = Arc::new(AtomicUsize::new(0));
        let counted = finished.clone();
        let b: Batcher<u32, u32> = Batcher::new(
            "test",
            10,
            1,
            |_| 1,
            move |reqs: Vec<u32>| {
                let counted = counted.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    counted.fetch_add(reqs.len(), Ordering::SeqCst);
                    Ok(reqs.into_iter().map(Ok).collect())
                }
            },
        );
        let r = tokio::time::timeout(Duration::from_millis(10), b.call(1)).await;
        assert!(r.is_err(), "the caller gave up mid-statement");
        assert_eq!(finished.load(Ordering::SeqCst), 0);
        // The next call waits for the slot the abandoned statement holds.
        let started = tokio::time::Instant::now();
        assert_eq!(b.call(2).await.unwrap(), 2);
        assert_eq!(finished.load(Ordering::SeqCst), 2, "both statements ran");
        assert_eq!(started.elapsed(), Duration::from_millis(90));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_caller_does_not_strand_the_others() {
        let b: Batcher<u32, u32> = Batcher::new(
            "test",
            10,
            1,
            |_| 1,
            |reqs: Vec<u32>| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(reqs.into_iter().map(Ok).collect())
            },
        );
        // The first caller takes the only slot, then is cancelled mid-statement.
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.call(1).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = {
            let b = b.clone();
            tokio::spawn(async move { b.call(2).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        first.abort();
        let r = tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .expect("the queued call is served after the slot is dropped")
            .unwrap();
        assert_eq!(r.unwrap(), 2);
    }

    /// With a spill of 3 rows: small requests queue behind the running
    /// statement and share the next one; a request that brings the rows
    /// waiting to 3 starts a second statement at once.
    #[tokio::test(start_paused = true)]
    async fn small_requests_wait_for_the_running_statement_until_the_spill() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let b: Batcher<Vec<u32>, usize> = Batcher::new(
            "test",
            100,
            2,
            |r: &Vec<u32>| r.len(),
            move |reqs: Vec<Vec<u32>>| {
                seen.lock().unwrap().push(reqs.concat());
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(reqs.into_iter().map(|r| Ok(r.len())).collect())
                }
            },
        )
        .with_spill(3);
        let call = |rows: Vec<u32>| {
            let b = b.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                b.call(rows).await.unwrap();
                started.elapsed()
            })
        };
        let tick = || tokio::time::sleep(Duration::from_millis(1));
        // One row runs at once; two more, one at a time, wait for it (with
        // spill 0 the first of them would take the free slot).
        let first = call(vec![1]);
        tick().await;
        let (second, third) = (call(vec![2]), call(vec![3]));
        assert_eq!(first.await.unwrap(), Duration::from_millis(50));
        assert!(second.await.unwrap() > Duration::from_millis(50));
        third.await.unwrap();
        assert_eq!(*batches.lock().unwrap(), [vec![1], vec![2, 3]]);
        // Beside a running statement, three rows waiting start another.
        let running = call(vec![4]);
        tick().await;
        let big = call(vec![5, 6, 7]);
        assert_eq!(big.await.unwrap(), Duration::from_millis(50));
        running.await.unwrap();
        assert_eq!(
            *batches.lock().unwrap(),
            [vec![1], vec![2, 3], vec![4], vec![5, 6, 7]]
        );
    }

    #[tokio::test]
    async fn batches_stop_at_max_rows() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let b: Batcher<Vec<u32>, usize> = Batcher::new(
            "test",
            5,
            1,
            |r: &Vec<u32>| r.len(),
            move |reqs: Vec<Vec<u32>>| {
                let rows: usize = reqs.iter().map(Vec::len).sum();
                seen.lock().unwrap().push(rows);
                async move { Ok(reqs.into_iter().map(|r| Ok(r.len())).collect()) }
            },
        );
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move { b.call(vec![0; 3]).await })
            })
            .collect();
        for c in calls {
            assert_eq!(c.await.unwrap().unwrap(), 3);
        }
        // 3-row requests, at most 5 rows a batch: one request per batch
        // (a request is never split).
        assert!(sizes.lock().unwrap().iter().all(|&n| n <= 5 || n == 3));
    }
}
