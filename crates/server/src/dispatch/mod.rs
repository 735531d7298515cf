//! Push delivery: streams, credits, batch leasing, hand-off, release on close.
//!
//! One dispatcher task per broker process owns every stream of that process
//! (Subscribe and Consume) and all credit accounting; everything else talks
//! to it through [`Msg`]s. Its decisions live in [`core`] (no I/O, unit
//! tested with a paused clock); this module is the task that feeds it and
//! carries out what it decides. Its loop:
//!
//! 1. takes every queued message (streams opening and closing, credit
//!    changes, wake-ups from this process and from LISTEN, settled and
//!    extended leases, finished lease rounds, hand-offs);
//! 2. fires timers: delayed jobs coming due, local lease deadlines (credit
//!    comes back when a lease expires), the slow fallback poll;
//! 3. brings hand-off offers up to date: a stream whose queues are all
//!    drained offers its free credit to the enqueue path, which then inserts
//!    a new job already leased to it ([`offers`]); over one cluster, the
//!    offer also goes to the other replicas, whose enqueue paths do the same
//!    ([`remote`]);
//! 4. starts lease rounds: for every stream with free credit and every ready
//!    queue it serves, it asks for exactly that many jobs, and leases for all
//!    of them in **one statement** (`lease.sql`). The credit asked for is
//!    reserved while the statement runs, and each leased job goes straight
//!    into its stream: nothing is leased that cannot be sent at once.
//!
//! Credit returns when a job is acked / nacked (here, or on another replica:
//! see `notify`), or when its lease deadline passes and the database
//! confirms the lease is over. A closed stream's unsettled jobs are released
//! at once.

mod core;
mod machine;
pub mod offers;
pub mod remote;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tonic::Status;
use tracing::{debug, info, trace, warn};

pub(crate) use offers::Claims;
pub use offers::{Claim, Offers};
pub use stream::{DeliveryStream, Event, SubscriptionStream};

pub(crate) use self::core::Handoff;
use self::core::{Core, Publish, Round};
pub(crate) use self::machine::Input;
use self::machine::{Drained, Effects, Machine, Release};
#[cfg(test)]
pub(crate) mod sim_seam {
    //! What the simulation (`crate::sim`) drives: the dispatcher's own types.
    pub(crate) use super::core::{Core, Round, UNHEARD_AFTER};
    pub(crate) use super::machine::{CLOSED_BEFORE_SETTLING, Effects, Input, Machine, Release};
}
use crate::domain::{
    FastMap, JobId, LeaseOutcome, LeaseToken, Leased, MAX_IN_FLIGHT, QueueName, Subscription, Wake,
};
use crate::pb;
use crate::placement::Clusters;
use crate::settle::{Local, Notifiers, Settle};
use crate::store::Store;

pub use crate::domain::StreamId;

#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Idle streams get a heartbeat this often.
    pub heartbeat_interval: Duration,
    /// Every queue with streams is looked at this often even without a
    /// wake-up (covers notifications lost while LISTEN reconnected).
    pub poll_interval: Duration,
    /// Lease statements at once: at most `MAX_ROUNDS_IN_FLIGHT` (4), and
    /// at most half the hot path's connections, so that settles and
    /// enqueues always find one ([`DispatchConfig::rounds_for_pool`]).
    pub max_rounds_in_flight: usize,
}

impl DispatchConfig {
    /// The lease statements at once a broker of `pool_size` connections
    /// runs: half its hot connections, 1 to `MAX_ROUNDS_IN_FLIGHT` (4 with
    /// the default pool of 10, 1 with a pool of 4).
    pub fn rounds_for_pool(pool_size: u32) -> usize {
        (crate::store::hot_connections(pool_size) as usize / 2).clamp(1, core::MAX_ROUNDS_IN_FLIGHT)
    }
}

/// What the dispatcher task hears: the machine's inputs, and the few that
/// carry something of the task's own (a stream's channel, a waiter).
pub(crate) enum Msg {
    Open {
        id: StreamId,
        sub: Subscription,
        tx: Outlet,
    },
    /// Closed by its client (Consume half-close): the sender hears when
    /// the stream's unsettled jobs are released.
    Finish(StreamId, oneshot::Sender<bool>),
    Credit(StreamId, u32),
    Drain(oneshot::Sender<()>),
    /// Jobs made available by this process (`Inbox::wake`): once taken
    /// in, the hand-off book hears it ([`Offers::woken`]).
    LocalWake(Vec<Wake>),
    In(Input),
}

/// Handle to the dispatcher task. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    /// Unbounded: senders include Drop guards, which cannot wait. Volume is
    /// bounded by the request rate the server accepts.
    tx: mpsc::UnboundedSender<Msg>,
    next_id: Arc<AtomicU64>,
    heartbeat_interval: Duration,
    offers: Offers,
    settle: Settle,
}

/// The settle path's way into the dispatcher (see [`crate::settle::Local`]).
/// Weak, like the task's own sender: the task ends once every
/// [`Dispatcher`] handle and stream is gone.
struct Inbox(mpsc::WeakUnboundedSender<Msg>, Offers);

impl Inbox {
    fn send(&self, msg: Msg) {
        if let Some(tx) = self.0.upgrade() {
            let _ = tx.send(msg);
        }
    }
}

impl Local for Inbox {
    /// No hand-off on these queues until the task took the wake-ups in
    /// ([`Offers::waking`]); a task that is gone takes nothing in.
    fn wake(&self, wakes: Vec<Wake>) {
        self.1.waking(&wakes);
        let Some(tx) = self.0.upgrade() else {
            self.1.woken(&wakes);
            return;
        };
        if let Err(mpsc::error::SendError(Msg::LocalWake(wakes))) = tx.send(Msg::LocalWake(wakes)) {
            self.1.woken(&wakes);
        }
    }

    fn settled(&self, leases: Vec<(JobId, LeaseToken)>) {
        self.send(Msg::In(Input::Settled(leases)));
    }

    fn cancelled(&self, leases: Vec<(JobId, LeaseToken)>) {
        self.send(Msg::In(Input::Cancelled(leases)));
    }
}

impl Dispatcher {
    /// Spawns the dispatcher task; it ends when every handle (and every
    /// stream it feeds) is dropped.
    pub fn spawn(clusters: Clusters, notifiers: Notifiers, cfg: DispatchConfig) -> Dispatcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let offers = Offers::default();
        let settle = Settle::new(
            clusters.clone(),
            Arc::new(Inbox(tx.downgrade(), offers.clone())),
            notifiers,
        );
        let store = clusters.home().clone();
        let mut core = Core::new(cfg.poll_interval, offers.clone(), Instant::now());
        core.set_max_rounds(cfg.max_rounds_in_flight);
        if clusters.is_single() {
            // Hand-off across replicas (remote.rs): over several clusters a
            // queue's jobs may move between them, so it stays local there.
            core.publish_offers(Instant::now());
            offers.hear_remote();
        } else {
            let clusters = clusters.clone();
            core.set_placement(Box::new(move |q| clusters.cluster_of(q)));
        }
        let task = Task {
            machine: Machine::new(core),
            finishing: FastMap::default(),
            store,
            clusters,
            settle: settle.clone(),
            me: Arc::new(Inbox(tx.downgrade(), offers.clone())),
            offers: offers.clone(),
            woken: Vec::new(),
            txs: FastMap::default(),
            drained: None,
        };
        tokio::spawn(task.run(rx));
        Dispatcher {
            tx,
            next_id: Default::default(),
            heartbeat_interval: cfg.heartbeat_interval,
            offers,
            settle,
        }
    }

    /// The settle path, bound to this dispatcher.
    pub fn settle(&self) -> &Settle {
        &self.settle
    }

    /// Credit idle streams offer to new jobs (the enqueue path claims it).
    pub fn offers(&self) -> &Offers {
        &self.offers
    }

    /// Registers a Subscribe stream; jobs are pushed into the returned stream.
    pub fn subscribe(&self, sub: Subscription) -> SubscriptionStream {
        // Capacity = credit (+1 for the final status): a delivery never waits.
        let capacity = sub.max_in_flight as usize + 1;
        SubscriptionStream::new(self.open(sub, capacity).1)
    }

    /// Registers a stream whose credit may change later (Consume): returns
    /// its id (for [`Dispatcher::set_credit`]) and its deliveries.
    pub fn open_consumer(&self, sub: Subscription) -> (StreamId, DeliveryStream) {
        self.open(sub, MAX_IN_FLIGHT as usize + 1)
    }

    fn open(&self, sub: Subscription, capacity: usize) -> (StreamId, DeliveryStream) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(capacity);
        let released = Arc::new(AtomicBool::new(false));
        let batched = sub.batched;
        let tx = Outlet {
            tx,
            released: released.clone(),
        };
        let _ = self.tx.send(Msg::Open { id, sub, tx });
        let stream =
            DeliveryStream::new(rx, released, self.heartbeat_interval, id, self.tx.clone())
                .batched(batched);
        (id, stream)
    }

    /// A Consume stream's credit becomes `max_in_flight`.
    pub fn set_credit(&self, id: StreamId, max_in_flight: u32) {
        let _ = self.tx.send(Msg::Credit(id, max_in_flight));
    }

    /// Ends a stream now: its unsettled jobs are released and its
    /// deliveries end (without error). Returns once the release is over:
    /// whether it committed (false: the database could not be reached, or
    /// the dispatcher is gone; the leases then run out).
    pub async fn finish(&self, id: StreamId) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Finish(id, tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Jobs became available (delay 0) or will at `delay_ms`.
    pub fn wake(&self, wakes: Vec<Wake>) {
        if !wakes.is_empty() {
            let _ = self.tx.send(Msg::In(Input::Wake(wakes)));
        }
    }

    /// Look at every queue (e.g. after LISTEN reconnected).
    pub fn wake_all(&self) {
        let _ = self.tx.send(Msg::In(Input::WakeAll));
    }

    /// These leases were settled: their streams get the credit back.
    pub fn settled(&self, leases: Vec<(JobId, LeaseToken)>) {
        if !leases.is_empty() {
            let _ = self.tx.send(Msg::In(Input::Settled(leases)));
        }
    }

    /// These leases' jobs were cancelled: their streams get the credit
    /// back and tell their clients.
    pub fn cancelled(&self, leases: Vec<(JobId, LeaseToken)>) {
        if !leases.is_empty() {
            let _ = self.tx.send(Msg::In(Input::Cancelled(leases)));
        }
    }

    /// Tells the dispatcher something a stream's reader decided it must hear
    /// (`api::consume::Held::acks_arrive`).
    pub(crate) fn tell(&self, input: Input) {
        let _ = self.tx.send(Msg::In(input));
    }

    /// A lease held by one of our streams was extended by `lease_ms` from now.
    pub fn extended(&self, id: JobId, lease_ms: i64) {
        let _ = self.tx.send(Msg::In(Input::Extended(id, lease_ms)));
    }

    /// What the enqueue path did with its claims (every claim is reported).
    pub(crate) fn handed(&self, handoff: Handoff) {
        if !handoff.claims.is_empty() {
            let _ = self.tx.send(Msg::In(Input::Handed(handoff)));
        }
    }

    /// Another replica inserted a job leased to one of our streams.
    pub(crate) fn remote_handed(&self, stream: StreamId, job: Leased) {
        let _ = self
            .tx
            .send(Msg::In(Input::RemoteHanded(vec![(stream, job)])));
    }

    /// Stops delivering, releases every unsettled job (giving the attempt
    /// back) and ends every stream with UNAVAILABLE. Returns when done.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Drain(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The dispatcher's end of one stream's deliveries.
pub(crate) struct Outlet {
    tx: mpsc::Sender<stream::Item>,
    /// Set before the stream's jobs are released (its close, a drain): the
    /// deliveries still waiting in the channel for the client to read are
    /// then dropped, never sent (`DeliveryStream`). Sent after the release,
    /// they would reach a client whose leases are over, and whose jobs may
    /// already be another consumer's.
    released: Arc<AtomicBool>,
}

impl Outlet {
    /// Whether the item went into the channel (false: the client is gone).
    fn try_send(&self, item: stream::Item) -> bool {
        self.tx.try_send(item).is_ok()
    }

    /// Nothing waiting may go out any more: the jobs are about to be released.
    fn release(&self) {
        self.released.store(true, Ordering::Release);
    }
}

/// The dispatcher task: the [`Machine`], and everything that does I/O.
struct Task {
    machine: Machine,
    /// The home cluster's store: metrics.
    store: Store,
    /// Every cluster: lease rounds and lease checks go to the queue's or
    /// the lease's cluster.
    clusters: Clusters,
    settle: Settle,
    /// Our own inbox, for background tasks to report back. Weak: the task
    /// ends when every handle and stream is dropped.
    me: Arc<Inbox>,
    /// The hand-off book, and the local wake-ups taken in since the last
    /// step (the book hears of them after it: [`Offers::woken`]).
    offers: Offers,
    woken: Vec<Wake>,
    /// Where each stream's deliveries go.
    txs: FastMap<StreamId, Outlet>,
    /// Clients that half-closed their streams, waiting for the release.
    finishing: FastMap<StreamId, oneshot::Sender<bool>>,
    /// Who waits for the drain to finish (it runs once no round is in flight).
    drained: Option<oneshot::Sender<()>>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let timer = self.machine.next_timer();
            tokio::select! {
                biased;
                msg = rx.recv() => {
                    let Some(msg) = msg else { return };
                    self.handle(msg);
                    while let Ok(msg) = rx.try_recv() {
                        self.handle(msg);
                    }
                }
                _ = sleep_until(timer) => {}
            }
            let mut fx = Effects::default();
            self.machine.step(Instant::now(), &mut fx);
            // The step withdrew the offers on queues just woken: hand-off
            // may look at them again (it finds none until they drain).
            self.offers.woken(&std::mem::take(&mut self.woken));
            if let Some(drained) = self.apply(fx) {
                self.finish_drain(drained).await;
                if let Some(done) = self.drained.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        let input = match msg {
            Msg::Open { id, sub, tx } => {
                debug!(stream = id, queues = ?sub.queues, consumer = %sub.consumer, "stream opened");
                (self.store.metrics().streams).opened(
                    id,
                    &sub.consumer,
                    &sub.queues,
                    sub.max_in_flight,
                );
                self.txs.insert(id, tx);
                Input::Open { id, sub }
            }
            Msg::Finish(id, done) => {
                self.finishing.insert(id, done);
                Input::Finish(id)
            }
            Msg::Credit(id, n) => {
                self.store.metrics().streams.credit(id, n);
                Input::Credit(id, n)
            }
            Msg::Drain(done) => {
                self.drained = Some(done);
                Input::Drain
            }
            Msg::LocalWake(wakes) => {
                // Heard by the book after the step that withdraws offers.
                self.woken.extend(wakes.iter().cloned());
                Input::Wake(wakes)
            }
            Msg::In(input) => input,
        };
        let mut fx = Effects::default();
        self.machine.input(input, Instant::now(), &mut fx);
        // A drain ends from the loop, never from a message.
        debug_assert!(fx.drained.is_none());
        self.apply(fx);
    }

    /// Carries out what the machine decided; a drain's end is returned,
    /// for the loop to await.
    fn apply(&mut self, mut fx: Effects) -> Option<Drained> {
        loop {
            for id in fx.refused.drain(..) {
                if let Some(out) = self.txs.remove(&id) {
                    out.try_send(Err(Status::unavailable("broker is shutting down")));
                }
                self.store.metrics().streams.closed(id);
            }
            for id in fx.closed.drain(..) {
                if let Some(out) = self.txs.remove(&id) {
                    out.release();
                }
            }
            for id in fx.ended.drain(..) {
                self.store.metrics().streams.closed(id);
            }
            (self.store.metrics()).on_leased(fx.deliver.iter().map(|(_, j, _)| j));
            let mut gone: Vec<StreamId> = Vec::new();
            for (sid, job, send_by) in fx.deliver.drain(..) {
                let out = stream::Outgoing {
                    lease: (job.id, job.token),
                    send_by,
                    delivery: delivery(job),
                };
                let sent = (self.txs.get(&sid))
                    .is_some_and(|tx| tx.try_send(Ok(stream::Push::Deliver(out))));
                if !sent && !gone.contains(&sid) {
                    // The client is gone: the stream is closed and this job
                    // released with its other unsettled ones.
                    gone.push(sid);
                }
            }
            for (sid, id, token) in fx.cancel.drain(..) {
                // At most once: a full channel (the client reads nothing)
                // drops it; the client's ack is then refused, as without it.
                if let Some(tx) = self.txs.get(&sid) {
                    tx.try_send(Ok(stream::Push::Cancelled(pb::Cancelled {
                        job_id: id.to_string(),
                        lease_token: token.to_string(),
                    })));
                }
            }
            for r in fx.release.drain(..) {
                self.release(r);
            }
            for chunk in fx.check.chunks(5000) {
                let (clusters, settle, me) =
                    (self.clusters.clone(), self.settle.clone(), self.me.clone());
                tokio::spawn(check_leases(clusters, settle, me, chunk.to_vec()));
            }
            fx.check.clear();
            for round in fx.rounds.drain(..) {
                self.start_round(round);
            }
            if std::mem::take(&mut fx.sweep) {
                let (store, me) = (self.store.clone(), self.me.clone());
                tokio::spawn(async move {
                    let older = core::UNHEARD_AFTER.as_millis() as i64;
                    me.send(Msg::In(Input::Unheard(store.unheard_leases(older).await)));
                });
            }
            if !fx.due.is_empty() {
                let (clusters, me) = (self.clusters.clone(), self.me.clone());
                let due = std::mem::take(&mut fx.due);
                tokio::spawn(async move {
                    me.send(Msg::In(Input::DueKnown(next_due(&clusters, due).await)));
                });
            }
            self.publish(std::mem::take(&mut fx.publish));
            if gone.is_empty() {
                return fx.drained.take();
            }
            let drained = fx.drained.take();
            let now = Instant::now();
            for sid in gone {
                self.machine.input(Input::Closed(sid), now, &mut fx);
            }
            fx.drained = drained;
        }
    }

    /// Runs a lease round's statement in a task of its own; its result
    /// comes back as an input. Each round's size and time are logged at
    /// debug (what docs/BENCHMARKS.md, "One stream's drain", measured).
    fn start_round(&self, round: Round) {
        trace!("lease round started");
        let (clusters, me) = (self.clusters.clone(), self.me.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let result = lease_everywhere(&clusters, &round).await;
            debug!(
                asked = round.wants.iter().map(|w| i64::from(w.n)).sum::<i64>(),
                leased = result.as_ref().map_or(0, |o| o.jobs.len()),
                us = started.elapsed().as_micros() as u64,
                "lease round finished"
            );
            me.send(Msg::In(Input::Leased(round, result)));
        });
    }

    /// Tells the other replicas what our idle streams offer now.
    fn publish(&self, offers: Vec<Publish>) {
        if offers.is_empty() {
            return;
        }
        let broker = self.store.broker_id();
        let notes = offers
            .into_iter()
            .filter_map(|p| {
                crate::channels::OfferNote {
                    broker,
                    stream: p.stream,
                    credit: p.credit,
                    lease_ms: p.lease_ms,
                    consumer: p.consumer.to_string(),
                    queues: p.queues.iter().map(|q| q.as_str().to_owned()).collect(),
                }
                .encode()
            })
            .collect();
        self.settle.publish_offers(notes);
    }

    /// Makes leases available again at once, in a task of its own; a client
    /// that half-closed its stream hears when it is over.
    fn release(&mut self, r: Release) {
        let done = r.finish.and_then(|id| self.finishing.remove(&id));
        let settle = self.settle.clone();
        tokio::spawn(async move {
            let released = settle.release_all(r.requests()).await;
            if let Some(done) = done {
                let _ = done.send(released);
            }
        });
    }

    /// Releases every unsettled job (giving the attempt back) and ends every
    /// stream with UNAVAILABLE.
    async fn finish_drain(&mut self, drained: Drained) {
        for out in self.txs.values() {
            out.release();
        }
        let n = drained.leases.len();
        let released = (self.settle)
            .release(drained.leases, machine::SHUT_DOWN, true)
            .await;
        for id in drained.streams {
            self.store.metrics().streams.closed(id);
            if let Some(tx) = self.txs.remove(&id) {
                tx.try_send(Err(Status::unavailable(
                    "broker is shutting down; reconnect",
                )));
            }
        }
        // Half-closed streams still waiting for their end (a round or claim
        // was under way for them): their leases went with the drain's.
        for (_, done) in self.finishing.drain() {
            let _ = done.send(released);
        }
        info!(released = n, "dispatcher drained");
    }
}

/// Leases what a round asks for on each queue's cluster: one round per
/// cluster, all at once. Jobs leased on one cluster are delivered even if
/// another failed (its queues are looked at again after a wake-up, a
/// reconnect of its LISTEN connection, or the fallback poll).
async fn lease_everywhere(
    clusters: &Clusters,
    round: &Round,
) -> crate::error::Result<LeaseOutcome> {
    if clusters.is_single() {
        return lease(clusters.home(), round.wants.clone(), &round.limited).await;
    }
    let mut runs = Vec::new();
    for (c, wants) in clusters.group(round.wants.iter().cloned(), |w| {
        clusters.cluster_of(&w.queue)
    }) {
        let Some(store) = clusters.get(c) else {
            warn!(cluster = %c, "queues placed on a cluster this broker does not know");
            continue;
        };
        runs.push(lease(store, wants, &round.limited));
    }
    let mut out = LeaseOutcome::default();
    let mut failed = None;
    for r in futures_util::future::join_all(runs).await {
        match r {
            Ok(o) => {
                out.jobs.extend(o.jobs);
                out.limited.extend(o.limited);
                out.caps.extend(o.caps);
            }
            Err(e) => {
                warn!(error = %e, "lease statement failed on one cluster");
                failed = failed.or(Some(e));
            }
        }
    }
    match failed {
        Some(e) if out.jobs.is_empty() => Err(e),
        _ => Ok(out),
    }
}

/// When each queue's next delayed job is due, and whether one is ready now,
/// asked of its cluster.
async fn next_due(
    clusters: &Clusters,
    queues: Vec<QueueName>,
) -> crate::error::Result<Vec<crate::domain::Due>> {
    let mut out = Vec::new();
    for (c, queues) in clusters.group(queues, |q| clusters.cluster_of(q)) {
        if let Some(store) = clusters.get(c) {
            out.extend(store.next_due(&queues).await?);
        }
    }
    Ok(out)
}

/// Leases what a round asks for: unlimited queues in one statement, queues
/// with limits in a transaction that takes turns with other replicas
/// (`store::limits`), both at once.
async fn lease(
    store: &Store,
    wants: Vec<crate::domain::Want>,
    limited: &[QueueName],
) -> crate::error::Result<LeaseOutcome> {
    let (slow, fast): (Vec<_>, Vec<_>) =
        wants.into_iter().partition(|w| limited.contains(&w.queue));
    let (a, b) = tokio::join!(
        async {
            if fast.is_empty() {
                Ok(LeaseOutcome::default())
            } else {
                store.lease(&fast).await
            }
        },
        async {
            if slow.is_empty() {
                Ok(LeaseOutcome::default())
            } else {
                store.lease_limited(&slow).await
            }
        }
    );
    // Jobs leased by one half are delivered even if the other failed.
    match (a, b) {
        (Ok(mut a), Ok(b)) => {
            a.jobs.extend(b.jobs);
            a.limited.extend(b.limited);
            a.caps.extend(b.caps);
            Ok(a)
        }
        (Ok(a), Err(e)) | (Err(e), Ok(a)) if !a.jobs.is_empty() => {
            warn!(error = %e, "half of a lease round failed");
            Ok(a)
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

pub(crate) fn delivery(job: Leased) -> pb::Delivery {
    pb::Delivery {
        job: Some(pb::Job {
            id: job.id.to_string(),
            queue: job.queue,
            payload: job.payload,
            headers: job.headers,
            priority: job.priority,
            attempt: job.attempt,
            enqueued_at: Some(std::time::SystemTime::from(job.enqueued_at).into()),
            last_error: job.last_error.unwrap_or_default(),
            key: job.key.unwrap_or_default(),
        }),
        lease_token: job.token.to_string(),
        lease_expires_at: Some(std::time::SystemTime::from(job.lease_expires_at).into()),
    }
}

/// Reaps those of `leases` that are past expiry and reports which are still
/// alive (and for how long) back to the dispatcher; each on its cluster.
async fn check_leases(
    clusters: Clusters,
    settle: Settle,
    me: Arc<Inbox>,
    leases: Vec<(JobId, LeaseToken)>,
) {
    let checked = leases.clone();
    let mut alive = Vec::new();
    for (c, leases) in clusters.group(leases, |l| l.1.1) {
        let ids: Vec<JobId> = leases.iter().map(|l| l.0).collect();
        let Some(store) = clusters.get(c) else {
            continue; // no such cluster: nothing to keep alive
        };
        let result = async {
            let (expired, alive) = store.check_leases(&leases).await?;
            settle.reap(expired).await?;
            Ok::<_, crate::error::Error>(alive)
        }
        .await;
        match result {
            Ok(a) => alive.extend(a),
            Err(e) => {
                warn!(error = %e, cluster = %store.cluster_name(), "lease check failed; retrying in 1s");
                // Treat them as alive for another second.
                alive.extend(ids.iter().map(|id| (*id, 1000)));
            }
        }
    }
    me.send(Msg::In(Input::LeaseChecked { checked, alive }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local wake-up not yet taken in by the dispatcher task keeps its
    /// queue's jobs from being handed off: the offer there was made when
    /// the queue looked drained, and a job enqueued now would overtake the
    /// one just made available (CI, 2026-11-28: the Node client's cancel
    /// test saw the second of two jobs first, credit 1). Here the task
    /// never runs, so the wake-up stays on its way.
    #[test]
    fn no_hand_off_on_a_queue_whose_wake_up_is_on_its_way() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let offers = Offers::default();
        let inbox = Inbox(tx.downgrade(), offers.clone());
        let q = |s: &str| crate::domain::QueueName::parse(s).unwrap();
        offers.open(1, &[q("a"), q("b")], None, "c".into());
        offers.adjust(1, |_| 2);
        let wake = |name: &str, delay_ms| Wake {
            queue: q(name),
            delay_ms,
        };
        inbox.wake(vec![wake("a", 0), wake("b", 5_000)]);
        assert_eq!(
            offers.claim(&q("a"), false),
            None,
            "a's wake-up is on its way"
        );
        assert!(
            offers.claim(&q("b"), false).is_some(),
            "b's job is not due: hand-off may go on"
        );
        // The task takes it in (and its step withdraws the offer): a's
        // claims are the offers' business again.
        let Some(Msg::LocalWake(w)) = rx.try_recv().ok() else {
            panic!("the wake-up went to the task");
        };
        offers.woken(&w);
        assert!(offers.claim(&q("a"), false).is_some());
        // Sent to a task that is gone: nothing waits for it.
        drop(rx);
        drop(tx);
        inbox.wake(vec![wake("a", 0)]);
        offers.adjust(1, |_| 1);
        assert!(offers.claim(&q("a"), false).is_some());
    }
}
