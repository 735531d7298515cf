//! Push delivery: streams, credits, batch leasing, release on close.
//!
//! One dispatcher task per broker process owns every Subscribe stream of that
//! process and all credit accounting, so there are no locks: everything else
//! talks to it through [`Msg`]s. Its loop:
//!
//! 1. takes every queued message (subscribe / close, wake-ups from enqueues in
//!    this process and from LISTEN, settled jobs, extended leases);
//! 2. fires timers: delayed jobs coming due, local lease deadlines (credit
//!    comes back when a lease expires), the slow fallback poll;
//! 3. starts a lease round: for every stream with free credit and every ready
//!    queue it serves, it asks for exactly that many jobs, and leases for all
//!    of them in **one statement** (`lease.sql`). The credit asked for is
//!    reserved while the statement runs, and each leased job goes straight
//!    into its stream: nothing is leased that cannot be sent at once. Up to
//!    [`MAX_ROUNDS_IN_FLIGHT`] statements run at once, so credit returned
//!    while one runs is used by the next without waiting for it.
//!
//! Fairness: a stream's credit is split across its ready queues, starting at a
//! rotating offset; streams are visited from a rotating offset too. A queue
//! that returns fewer jobs than asked is "drained" until woken again.
//!
//! Credit returns when a job is acked / nacked (here, or on another replica:
//! see `notify`), or when its lease deadline passes and the database confirms
//! the lease is over. A closed stream's unsettled jobs are released at once.

mod stream;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tonic::Status;
use tracing::{debug, info, warn};

pub use stream::SubscriptionStream;

use crate::domain::{JobId, LeaseToken, QueueName, Subscription};
use crate::pb;
use crate::store::{FailReq, LeaseOutcome, Leased, Store, Wake, Want};

pub type StreamId = u64;

/// Most jobs one lease statement asks for.
const MAX_ROUND_JOBS: i32 = 2000;
/// Lease statements running at once.
const MAX_ROUNDS_IN_FLIGHT: usize = 2;

#[derive(Clone, Debug)]
pub struct DispatchConfig {
    /// Idle streams get a heartbeat this often.
    pub heartbeat_interval: Duration,
    /// Every queue with streams is looked at this often even without a
    /// wake-up (covers notifications lost while LISTEN reconnected).
    pub poll_interval: Duration,
}

pub(crate) enum Msg {
    Subscribe {
        id: StreamId,
        sub: Subscription,
        tx: mpsc::Sender<stream::Item>,
    },
    Closed(StreamId),
    Wake(Vec<Wake>),
    WakeAll,
    /// Leases that ended (acked / nacked here or elsewhere). Carries the
    /// token: a job may already be leased again, to another of our streams.
    Settled(Vec<(JobId, LeaseToken)>),
    Extended(JobId, i64),
    LeaseChecked {
        checked: Vec<(JobId, LeaseToken)>,
        alive: Vec<(JobId, i64)>,
    },
    /// A lease round finished.
    Leased(Round, crate::error::Result<LeaseOutcome>),
    Drain(oneshot::Sender<()>),
}

/// Handle to the dispatcher task. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    /// Unbounded: senders include Drop guards, which cannot wait. Volume is
    /// bounded by the request rate the server accepts.
    tx: mpsc::UnboundedSender<Msg>,
    next_id: std::sync::Arc<std::sync::atomic::AtomicU64>,
    heartbeat_interval: Duration,
}

impl Dispatcher {
    /// Spawns the dispatcher task; it runs until every handle is dropped.
    pub fn spawn(store: Store, cfg: DispatchConfig) -> Dispatcher {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = State {
            store,
            me: tx.clone(),
            streams: HashMap::new(),
            queues: HashMap::new(),
            owner: HashMap::new(),
            deadlines: BinaryHeap::new(),
            poll_interval: cfg.poll_interval,
            next_poll: Instant::now() + cfg.poll_interval,
            retry_at: None,
            draining: false,
            drained: None,
            rounds_in_flight: 0,
            round_offset: 0,
        };
        tokio::spawn(state.run(rx));
        Dispatcher {
            tx,
            next_id: Default::default(),
            heartbeat_interval: cfg.heartbeat_interval,
        }
    }

    /// Registers a stream; jobs are pushed into the returned stream.
    pub fn subscribe(&self, sub: Subscription) -> SubscriptionStream {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Capacity = credit (+1 for the final status): a delivery never waits.
        let (tx, rx) = mpsc::channel(sub.max_in_flight as usize + 1);
        let _ = self.tx.send(Msg::Subscribe { id, sub, tx });
        SubscriptionStream::new(rx, self.heartbeat_interval, id, self.tx.clone())
    }

    /// Jobs became available (delay 0) or will at `delay_ms`.
    pub fn wake(&self, wakes: Vec<Wake>) {
        if !wakes.is_empty() {
            let _ = self.tx.send(Msg::Wake(wakes));
        }
    }

    /// Look at every queue (e.g. after LISTEN reconnected).
    pub fn wake_all(&self) {
        let _ = self.tx.send(Msg::WakeAll);
    }

    /// These leases were settled: their streams get the credit back.
    pub fn settled(&self, leases: Vec<(JobId, LeaseToken)>) {
        if !leases.is_empty() {
            let _ = self.tx.send(Msg::Settled(leases));
        }
    }

    /// A lease held by one of our streams was extended by `lease_ms` from now.
    pub fn extended(&self, id: JobId, lease_ms: i64) {
        let _ = self.tx.send(Msg::Extended(id, lease_ms));
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

struct Inflight {
    token: LeaseToken,
    deadline: Instant,
    /// A lease check with the database is under way for this job.
    checking: bool,
}

struct StreamState {
    sub: Subscription,
    tx: mpsc::Sender<stream::Item>,
    inflight: HashMap<JobId, Inflight>,
    /// Rotating start among this stream's queues (fairness across queues).
    rr: usize,
    /// Credit asked for by lease statements still running.
    reserved: i32,
}

/// One lease statement under way: what it asked for, for whom.
pub(crate) struct Round {
    wants: Vec<Want>,
    /// Slot number → stream.
    slots: Vec<StreamId>,
    /// Each queue's `seq` when the round was planned.
    seqs: HashMap<QueueName, u64>,
}

impl Round {
    /// Leases what the round asks for: unlimited queues in one statement,
    /// queues with limits in a transaction that takes turns with other
    /// replicas (`store::limits`), both at once.
    async fn lease(
        &self,
        store: &Store,
        limited: &[QueueName],
    ) -> crate::error::Result<LeaseOutcome> {
        let (slow, fast): (Vec<Want>, Vec<Want>) = self
            .wants
            .iter()
            .cloned()
            .partition(|w| limited.contains(&w.queue));
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
}

impl StreamState {
    fn credit(&self) -> i32 {
        self.sub.max_in_flight as i32 - self.inflight.len() as i32 - self.reserved
    }
}

#[derive(Default)]
struct QueueState {
    /// Streams of this process subscribed to the queue.
    streams: Vec<StreamId>,
    /// The queue may have deliverable jobs.
    ready: bool,
    /// When its next delayed job is due, if known.
    due: Option<Instant>,
    /// Ask the database when its next delayed job is due.
    check_due: bool,
    /// Bumped by every wake-up and every full round: a round that comes back
    /// short marks the queue drained only if nothing happened since it was
    /// planned (otherwise a wake-up could be lost between two rounds).
    seq: u64,
    /// The queue has a concurrency or rate limit: lease it through
    /// `Store::lease_limited`. Learnt from lease rounds.
    limited: bool,
    /// Its rate limit cut the last round: look again then.
    limit_due: Option<Instant>,
}

struct State {
    store: Store,
    /// Our own inbox, for background tasks to report back.
    me: mpsc::UnboundedSender<Msg>,
    streams: HashMap<StreamId, StreamState>,
    queues: HashMap<QueueName, QueueState>,
    /// Which stream holds each job leased by this process.
    owner: HashMap<JobId, StreamId>,
    /// Local lease deadlines, earliest first (stale entries are skipped).
    deadlines: BinaryHeap<Reverse<(Instant, JobId)>>,
    poll_interval: Duration,
    next_poll: Instant,
    /// After a failed lease statement, do not try again before this.
    retry_at: Option<Instant>,
    draining: bool,
    /// Who waits for the drain to finish (it runs once no round is in flight).
    drained: Option<oneshot::Sender<()>>,
    rounds_in_flight: usize,
    round_offset: usize,
}

impl State {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let timer = self.next_timer();
            tokio::select! {
                biased;
                msg = rx.recv() => {
                    let Some(msg) = msg else { return };
                    self.handle(msg).await;
                    while let Ok(msg) = rx.try_recv() {
                        self.handle(msg).await;
                    }
                }
                _ = sleep_until(timer) => {}
            }
            self.fire_timers();
            if self.draining {
                if self.rounds_in_flight == 0
                    && let Some(done) = self.drained.take()
                {
                    self.drain().await;
                    let _ = done.send(());
                }
            } else {
                self.start_rounds();
                self.refresh_due().await;
            }
        }
    }

    fn next_timer(&self) -> Instant {
        let mut t = self.next_poll;
        if let Some(r) = self.retry_at {
            t = t.min(r);
        }
        for q in self.queues.values() {
            for d in [q.due, q.limit_due].into_iter().flatten() {
                t = t.min(d);
            }
        }
        if let Some(Reverse((d, _))) = self.deadlines.peek() {
            t = t.min(*d);
        }
        t
    }

    async fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Subscribe { id, sub, tx } => {
                if self.draining {
                    let _ = tx.try_send(Err(Status::unavailable("broker is shutting down")));
                    return;
                }
                debug!(stream = id, queues = ?sub.queues, consumer = %sub.consumer, "stream opened");
                self.store
                    .metrics
                    .streams
                    .opened(&sub.queues, sub.max_in_flight);
                for q in &sub.queues {
                    let qs = self.queues.entry(q.clone()).or_default();
                    qs.streams.push(id);
                    qs.ready = true;
                    qs.seq += 1;
                    qs.check_due = true;
                }
                self.streams.insert(
                    id,
                    StreamState {
                        sub,
                        tx,
                        inflight: HashMap::new(),
                        rr: 0,
                        reserved: 0,
                    },
                );
            }
            Msg::Closed(id) => self.close_stream(id),
            Msg::Wake(wakes) => {
                let now = Instant::now();
                for w in wakes {
                    if let Some(q) = self.queues.get_mut(&w.queue) {
                        if w.delay_ms <= 0 {
                            q.ready = true;
                            q.seq += 1;
                        } else {
                            let at = now + Duration::from_millis(w.delay_ms as u64);
                            q.due = Some(q.due.map_or(at, |d| d.min(at)));
                        }
                    }
                }
            }
            Msg::WakeAll => {
                for q in self.queues.values_mut() {
                    q.ready = true;
                    q.seq += 1;
                    q.check_due = true;
                }
                self.verify_all_leases();
            }
            Msg::Settled(leases) => {
                for (id, token) in leases {
                    self.forget(id, token);
                }
            }
            Msg::Extended(id, lease_ms) => {
                if let Some(stream) = self.owner.get(&id).and_then(|s| self.streams.get_mut(s))
                    && let Some(f) = stream.inflight.get_mut(&id)
                {
                    f.deadline = Instant::now() + Duration::from_millis(lease_ms as u64);
                    self.deadlines.push(Reverse((f.deadline, id)));
                }
            }
            Msg::LeaseChecked { checked, alive } => {
                let alive: HashMap<JobId, i64> = alive.into_iter().collect();
                let now = Instant::now();
                for (id, token) in checked {
                    match alive.get(&id) {
                        Some(ms) => {
                            if let Some(stream) =
                                self.owner.get(&id).and_then(|s| self.streams.get_mut(s))
                                && let Some(f) = stream.inflight.get_mut(&id)
                                && f.token == token
                            {
                                f.checking = false;
                                f.deadline = now + Duration::from_millis(*ms as u64);
                                self.deadlines.push(Reverse((f.deadline, id)));
                            }
                        }
                        // The lease is over (expired and reaped, or settled):
                        // the stream gets its credit back.
                        None => self.forget(id, token),
                    }
                }
            }
            Msg::Drain(done) => {
                // Runs from the loop once no lease statement is in flight.
                self.draining = true;
                self.drained = Some(done);
            }
            Msg::Leased(round, result) => self.finish_round(round, result),
        }
    }

    /// Removes a lease from its stream's in-flight set (its credit returns),
    /// if it is still the lease that stream holds: the job may have been
    /// leased again since, to this or another stream.
    fn forget(&mut self, id: JobId, token: LeaseToken) {
        let Some(sid) = self.owner.get(&id).copied() else {
            return;
        };
        if let Some(stream) = self.streams.get_mut(&sid)
            && stream.inflight.get(&id).is_some_and(|f| f.token == token)
        {
            stream.inflight.remove(&id);
            self.owner.remove(&id);
        }
    }

    /// Asks the database about every lease our streams hold (after LISTEN
    /// reconnected, and at each fallback poll): settle notifications lost
    /// meanwhile would otherwise keep their credit until the lease expires.
    fn verify_all_leases(&mut self) {
        let mut all: Vec<(JobId, LeaseToken)> = Vec::new();
        for stream in self.streams.values_mut() {
            for (id, f) in stream.inflight.iter_mut() {
                if !f.checking {
                    f.checking = true;
                    all.push((*id, f.token));
                }
            }
        }
        for chunk in all.chunks(5000) {
            let store = self.store.clone();
            let me = self.me.clone();
            tokio::spawn(check_leases(store, me, chunk.to_vec()));
        }
    }

    fn close_stream(&mut self, id: StreamId) {
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        let (queues, credit) = (&stream.sub.queues, stream.sub.max_in_flight);
        self.store.metrics.streams.closed(queues, credit);
        for q in &stream.sub.queues {
            if let Some(qs) = self.queues.get_mut(q) {
                qs.streams.retain(|s| *s != id);
                if qs.streams.is_empty() {
                    self.queues.remove(q);
                }
            }
        }
        let leases: Vec<(JobId, LeaseToken)> = stream
            .inflight
            .iter()
            .map(|(id, f)| (*id, f.token))
            .collect();
        for (job, _) in &leases {
            if self.owner.get(job) == Some(&id) {
                self.owner.remove(job);
            }
        }
        debug!(stream = id, unsettled = leases.len(), "stream closed");
        if !leases.is_empty() {
            let store = self.store.clone();
            let me = self.me.clone();
            tokio::spawn(async move {
                release(
                    &store,
                    &me,
                    leases,
                    "consumer stream closed before settling",
                    false,
                )
                .await;
            });
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        if self.retry_at.is_some_and(|r| r <= now) {
            self.retry_at = None;
        }
        if self.next_poll <= now {
            self.next_poll = now + self.poll_interval;
            for q in self.queues.values_mut() {
                q.ready = true;
                q.seq += 1;
                q.check_due = true;
            }
            self.verify_all_leases();
        }
        for q in self.queues.values_mut() {
            if q.due.is_some_and(|d| d <= now) {
                q.due = None;
                q.ready = true;
                q.seq += 1;
                q.check_due = true;
            }
            if q.limit_due.is_some_and(|d| d <= now) {
                q.limit_due = None;
                q.ready = true;
                q.seq += 1;
            }
        }
        // Local lease deadlines: ask the database whether those leases are
        // really over (another replica may have extended them) and reap them.
        let mut expired: Vec<(JobId, LeaseToken)> = Vec::new();
        while let Some(Reverse((at, _))) = self.deadlines.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, id))) = self.deadlines.pop() else {
                break;
            };
            if let Some(stream) = self.owner.get(&id).and_then(|s| self.streams.get_mut(s))
                && let Some(f) = stream.inflight.get_mut(&id)
                && f.deadline == at
                && !f.checking
            {
                f.checking = true;
                expired.push((id, f.token));
            }
        }
        if !expired.is_empty() {
            let store = self.store.clone();
            let me = self.me.clone();
            tokio::spawn(check_leases(store, me, expired));
        }
    }

    /// Starts lease statements while there is credit, ready queues and room.
    fn start_rounds(&mut self) {
        while self.retry_at.is_none() && self.rounds_in_flight < MAX_ROUNDS_IN_FLIGHT {
            let (wants, slots) = self.plan_round();
            if wants.is_empty() {
                return;
            }
            let mut seqs = HashMap::new();
            let mut limited = Vec::new();
            for w in &wants {
                if let Some(stream) = self.streams.get_mut(&slots[w.slot as usize]) {
                    stream.reserved += w.n;
                }
                if let Some(q) = self.queues.get(&w.queue)
                    && seqs.insert(w.queue.clone(), q.seq).is_none()
                    && q.limited
                {
                    limited.push(w.queue.clone());
                }
            }
            let round = Round { wants, slots, seqs };
            self.rounds_in_flight += 1;
            let store = self.store.clone();
            let me = self.me.clone();
            tokio::spawn(async move {
                let result = round.lease(&store, &limited).await;
                let _ = me.send(Msg::Leased(round, result));
            });
        }
    }

    fn finish_round(&mut self, round: Round, result: crate::error::Result<LeaseOutcome>) {
        self.rounds_in_flight -= 1;
        for w in &round.wants {
            if let Some(stream) = self.streams.get_mut(&round.slots[w.slot as usize]) {
                stream.reserved -= w.n;
            }
        }
        let LeaseOutcome {
            jobs: leased,
            limited,
            caps,
        } = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                warn!(error = %e, "lease statement failed; retrying in 1s");
                self.retry_at = Some(Instant::now() + Duration::from_secs(1));
                return;
            }
        };
        // Queues whose limits changed since we last looked go to the other
        // path at once (the bumped seq keeps them ready below).
        for q in limited {
            if let Some(qs) = self.queues.get_mut(&q) {
                qs.limited = true;
                qs.ready = true;
                qs.seq += 1;
            }
        }
        let now = Instant::now();
        for cap in caps {
            if let Some(qs) = self.queues.get_mut(&cap.queue) {
                if cap.unlimited {
                    qs.limited = false;
                    qs.ready = true;
                    qs.seq += 1;
                }
                if let Some(ms) = cap.retry_ms {
                    let at = now + Duration::from_millis(ms as u64);
                    qs.limit_due = Some(qs.limit_due.map_or(at, |d| d.min(at)));
                }
            }
        }
        let mut asked: HashMap<&QueueName, i32> = HashMap::new();
        for w in &round.wants {
            *asked.entry(&w.queue).or_default() += w.n;
        }
        let mut got: HashMap<&str, i32> = HashMap::new();
        for job in &leased {
            *got.entry(job.queue.as_str()).or_default() += 1;
        }
        for (q, n) in asked {
            let Some(qs) = self.queues.get_mut(q) else {
                continue;
            };
            if got.get(q.as_str()).copied().unwrap_or(0) >= n {
                // Full: there may be more.
                qs.ready = true;
                qs.seq += 1;
            } else if round.seqs.get(q) == Some(&qs.seq) {
                // Short, and nothing woke the queue since: it is drained.
                qs.ready = false;
            }
        }
        self.store.metrics.on_leased(&leased);
        self.deliver(leased, &round.slots);
    }

    /// Decides what each stream with free credit asks of each ready queue.
    fn plan_round(&mut self) -> (Vec<Want>, Vec<StreamId>) {
        let mut wants = Vec::new();
        let mut slots = Vec::new();
        let mut ids: Vec<StreamId> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        if ids.is_empty() {
            return (wants, slots);
        }
        self.round_offset = self.round_offset.wrapping_add(1);
        let start = self.round_offset % ids.len();
        ids.rotate_left(start);
        let mut total = 0;
        for sid in ids {
            let Some(stream) = self.streams.get_mut(&sid) else {
                continue;
            };
            let credit = stream.credit();
            if credit <= 0 {
                continue;
            }
            let ready: Vec<&QueueName> = stream
                .sub
                .queues
                .iter()
                .filter(|q| self.queues.get(*q).is_some_and(|qs| qs.ready))
                .collect();
            if ready.is_empty() {
                continue;
            }
            let k = ready.len() as i32;
            let first = stream.rr % ready.len();
            stream.rr = stream.rr.wrapping_add(1);
            let slot = slots.len() as i32;
            slots.push(sid);
            for i in 0..ready.len() {
                let q = ready[(first + i) % ready.len()];
                let n = credit / k + i32::from((i as i32) < credit % k);
                if n > 0 {
                    wants.push(Want {
                        queue: q.clone(),
                        n,
                        lease_ms: stream.sub.lease_ms,
                        slot,
                        consumer: stream.sub.consumer.clone(),
                    });
                }
            }
            total += credit;
            if total >= MAX_ROUND_JOBS {
                break;
            }
        }
        (wants, slots)
    }

    fn deliver(&mut self, leased: Vec<Leased>, slots: &[StreamId]) {
        let now = Instant::now();
        let mut gone: Vec<StreamId> = Vec::new();
        let mut orphans: Vec<(JobId, LeaseToken)> = Vec::new();
        for job in leased {
            let sid = slots[job.slot as usize];
            if !self.streams.contains_key(&sid) {
                // The stream closed while the statement ran: the consumer
                // never saw this job, so it goes back with its attempt.
                orphans.push((job.id, job.token));
                continue;
            }
            let id = job.id;
            // The job was leased again, so any earlier lease of it by one of
            // our streams is over (it expired): that stream's credit returns.
            if let Some(prev) = self.owner.get(&id).copied()
                && let Some(s) = self.streams.get_mut(&prev)
            {
                s.inflight.remove(&id);
            }
            let Some(stream) = self.streams.get_mut(&sid) else {
                continue;
            };
            let deadline = now + Duration::from_millis(job.lease_ms as u64);
            stream.inflight.insert(
                id,
                Inflight {
                    token: job.token,
                    deadline,
                    checking: false,
                },
            );
            self.owner.insert(id, sid);
            self.deadlines.push(Reverse((deadline, id)));
            if stream.tx.try_send(Ok(delivery(job))).is_err() {
                // The client is gone: the stream is closed below and this
                // job released with its other unsettled ones.
                gone.push(sid);
            }
        }
        for sid in gone {
            self.close_stream(sid);
        }
        if !orphans.is_empty() {
            let store = self.store.clone();
            let me = self.me.clone();
            tokio::spawn(async move {
                release(&store, &me, orphans, "stream closed before delivery", true).await;
            });
        }
    }

    async fn refresh_due(&mut self) {
        let queues: Vec<QueueName> = self
            .queues
            .iter_mut()
            .filter(|(_, q)| q.check_due)
            .map(|(name, q)| {
                q.check_due = false;
                name.clone()
            })
            .collect();
        if queues.is_empty() {
            return;
        }
        match self.store.next_due(&queues).await {
            Ok(rows) => {
                let now = Instant::now();
                for (name, due) in rows {
                    if let (Some(q), Some(ms)) = (self.queues.get_mut(&name), due) {
                        let at = now + Duration::from_millis(ms.max(0) as u64);
                        q.due = Some(q.due.map_or(at, |d| d.min(at)));
                    }
                }
            }
            Err(e) => warn!(error = %e, "next-due query failed; the fallback poll covers it"),
        }
    }

    async fn drain(&mut self) {
        self.draining = true;
        let mut leases = Vec::new();
        for stream in self.streams.values() {
            leases.extend(stream.inflight.iter().map(|(id, f)| (*id, f.token)));
        }
        let n = leases.len();
        release(
            &self.store,
            &self.me,
            leases,
            "broker shut down before the job was settled",
            true,
        )
        .await;
        for (_, stream) in self.streams.drain() {
            let (queues, credit) = (&stream.sub.queues, stream.sub.max_in_flight);
            self.store.metrics.streams.closed(queues, credit);
            let _ = stream.tx.try_send(Err(Status::unavailable(
                "broker is shutting down; reconnect",
            )));
        }
        self.owner.clear();
        self.queues.clear();
        info!(released = n, "dispatcher drained");
    }
}

fn delivery(job: Leased) -> pb::SubscribeResponse {
    pb::SubscribeResponse {
        kind: Some(pb::subscribe_response::Kind::Delivery(pb::Delivery {
            job: Some(pb::Job {
                id: job.id.to_string(),
                queue: job.queue,
                payload: job.payload,
                headers: job.headers,
                priority: job.priority,
                attempt: job.attempt,
                enqueued_at: Some(std::time::SystemTime::from(job.enqueued_at).into()),
                last_error: job.last_error.unwrap_or_default(),
            }),
            lease_token: job.token.to_string(),
            lease_expires_at: Some(std::time::SystemTime::from(job.lease_expires_at).into()),
        })),
    }
}

/// Makes leases available again at once (`fail.sql` with retry 0), waking
/// this process's dispatcher and other replicas. Retries while the database
/// is unreachable; if it stays down the leases simply expire.
async fn release(
    store: &Store,
    me: &mpsc::UnboundedSender<Msg>,
    leases: Vec<(JobId, LeaseToken)>,
    why: &str,
    refund: bool,
) {
    if leases.is_empty() {
        return;
    }
    let reqs: Vec<FailReq> = leases
        .into_iter()
        .map(|(id, token)| FailReq {
            id,
            token,
            error: why.to_owned(),
            retry_after_ms: Some(0),
            dead_letter: false,
            refund,
        })
        .collect();
    for attempt in 0..5u32 {
        match store.fail(&reqs).await {
            Ok(done) => {
                let dead = done.iter().filter(|f| f.death.is_some()).count();
                store.metrics.dead_lettered.add(dead);
                let wakes = wakes_for(&done);
                if let Err(e) = store.notify_wake(&store.pool, &wakes).await {
                    warn!(error = %e, "wake notification failed");
                }
                let _ = me.send(Msg::Wake(wakes));
                return;
            }
            Err(e) => {
                warn!(error = %e, attempt, "releasing leases failed; retrying");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}

/// One wake per queue that got a job back (coalesced), and an immediate one
/// per queue with a concurrency limit (a slot freed, whatever became of the
/// job).
pub(crate) fn wakes_for(done: &[crate::store::Failed]) -> Vec<Wake> {
    let mut min: HashMap<&QueueName, i64> = HashMap::new();
    for f in done {
        let ms = if f.slot_freed {
            0
        } else if f.death.is_none() {
            f.retry_ms
        } else {
            continue;
        };
        let e = min.entry(&f.queue).or_insert(ms);
        *e = (*e).min(ms);
    }
    min.into_iter()
        .map(|(q, ms)| Wake {
            queue: q.clone(),
            delay_ms: ms,
        })
        .collect()
}

/// Reaps those of `leases` that are past expiry and reports which are still
/// alive (and for how long) back to the dispatcher.
async fn check_leases(
    store: Store,
    me: mpsc::UnboundedSender<Msg>,
    leases: Vec<(JobId, LeaseToken)>,
) {
    let ids: Vec<JobId> = leases.iter().map(|l| l.0).collect();
    let checked = leases.clone();
    let result = async {
        let expired = store.expired_leases(Some(&ids), ids.len() as i64).await?;
        crate::maintenance::reap(&store, expired, |w| {
            let _ = me.send(Msg::Wake(w));
        })
        .await?;
        store.lease_status(&leases).await
    }
    .await;
    let alive = match result {
        Ok(alive) => alive,
        Err(e) => {
            warn!(error = %e, "lease check failed; retrying in 1s");
            // Treat them as alive for another second.
            ids.iter().map(|id| (*id, 1000)).collect()
        }
    };
    let _ = me.send(Msg::LeaseChecked { checked, alive });
}
