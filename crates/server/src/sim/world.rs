//! One simulated deployment: a broker (the real dispatcher machine, and
//! after a crash or a drain its next incarnation), the model database,
//! producers and consumers, and a seeded scheduler over all of them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;
use uuid::Uuid;

pub use super::check::Outcome;
use super::db::{Db, Insert, Ms, QueueConf, State, consumer};
use crate::api::consume::Held;
use crate::dispatch::sim_seam::{
    CLOSED_BEFORE_SETTLING, Core, Effects, Input, Machine, Release, Round, UNHEARD_AFTER,
};
use crate::dispatch::{Claims, Offers, StreamId};
use crate::domain::{AckReq, ExtendReq, JobId, LeaseToken, QueueName, Subscription};
use crate::domain::{FailReq, FastMap, FastSet, HandoffTo, Leased, Wake};
use crate::error::Error;
use crate::settle::{ack_results, extend_results, nack_results, wakes_for};

/// Runs one seed for `seconds` of activity (then until everything is
/// settled); `trace`: print every step.
pub fn run(seed: u64, seconds: u64, print: bool) -> Outcome {
    let mut w = World::new(seed, seconds, print, print);
    w.run();
    if !w.out.anomalies.is_empty() && !w.tracing {
        // Again, traced: the same seed takes the same steps.
        let mut again = World::new(seed, seconds, false, true);
        again.run();
        return again.out;
    }
    w.out
}

/// A line of the run's trace, formatted only when the run is traced (a
/// failing seed is run again traced, so untraced runs pay nothing).
macro_rules! say {
    ($w:expr, $line:expr) => {
        if $w.tracing {
            let line = $line;
            $w.log(line);
        }
    };
}

const DEFAULT_LEASE_MS: i64 = 2000;
/// The maintenance reaper's interval (`--reap-interval`, shortened).
const REAP_MS: Ms = 1000;
/// How long a run may take to settle everything after the activity ends.
const SETTLE_MS: Ms = 60_000;

#[derive(Clone, Debug)]
struct ConsumerCfg {
    queues: Vec<QueueName>,
    credit: u32,
    lease_ms: i64,
    /// Consume (settles on the stream) or Subscribe (unary settles).
    consume: bool,
    /// How long a handler takes, ms.
    work: (u64, u64),
}

#[derive(Debug)]
struct Cfg {
    active_ms: Ms,
    poll_ms: u64,
    linger_ms: u64,
    /// A statement fails before it commits.
    p_fail: f64,
    /// A statement commits, then its caller sees an error.
    p_lost: f64,
    /// A client's deadline drops a unary call while its statement runs.
    p_cancel: f64,
    /// A statement is slow (100 ms to 2 s).
    p_slow: f64,
    /// The batcher runs a dropped call's statement to its end (the real
    /// one does); false: the statement's future is dropped with its call.
    detach: bool,
    queues: Vec<QueueName>,
    consumers: Vec<ConsumerCfg>,
    /// A job (or a few) every this many ms, on average.
    produce_ms: u64,
    crash_at: Option<Ms>,
    drain_at: Option<Ms>,
    /// SIGSTOP for `.1` ms, then SIGCONT.
    freeze_at: Option<(Ms, Ms)>,
}

/// What happens next.
#[derive(Debug, Clone)]
enum Ev {
    /// The dispatcher task runs: its inbox, then its step.
    Dispatch,
    /// A statement commits (or fails).
    Op(u64),
    /// The caller of a unary statement gives up (its deadline).
    Cancel(u64),
    /// A consumer reads what waits on its stream.
    Read(usize),
    /// A consumer's handler for one job is done.
    Work(usize, JobId, LeaseToken),
    Produce,
    Open(usize),
    Close(usize),
    HalfClose(usize),
    Reaper,
    Crash,
    Drain,
    Restart,
    Freeze,
    /// An operator's CancelJob of a live job.
    CancelJob,
    /// A Consume client changes its stream's credit.
    Credit(usize),
}

/// What waits in a stream's channel.
#[allow(clippy::large_enum_variant)]
enum Out {
    /// A delivery with the instant past which it is not sent.
    Job(Leased, Ms),
    /// A held job was cancelled (`Cancelled`).
    Cancelled(JobId, LeaseToken),
}

/// The dispatcher's end of a stream: its channel.
struct Outlet {
    chan: VecDeque<Out>,
    consumer: usize,
    /// Capacity: the channel a stream gets (credit + 1; Consume: the most
    /// credit + 1).
    capacity: usize,
    released: bool,
}

/// One incarnation of the broker process.
struct Broker {
    life: u32,
    id: Uuid,
    machine: Machine,
    offers: Offers,
    /// The dispatcher task's queue (the claims' reports land here too).
    inbox: Arc<Mutex<VecDeque<Input>>>,
    outlets: BTreeMap<StreamId, Outlet>,
    next_stream: StreamId,
    dispatch_at: Option<Ms>,
    timer_at: Option<Ms>,
    draining: bool,
    dead: bool,
    /// SIGSTOP: the dispatcher runs, and the process writes, only after.
    frozen_until: Option<Ms>,
}

struct Hold {
    token: LeaseToken,
    expires: Ms,
}

struct CStream {
    sid: StreamId,
    life: u32,
    credit: u32,
    /// The most credit the stream has had: what it may hold (lowering the
    /// credit takes nothing back, nor the jobs a round under way leases).
    cap: u32,
    /// A Consume stream's ack accounting (the real one).
    held: Option<Arc<Held>>,
    holding: BTreeMap<JobId, Hold>,
    half_closed: bool,
    /// Settles sent on the stream and not answered yet.
    pending: usize,
    /// Its broker drains or died: its leases may go without the client
    /// letting go (named exemption).
    revocable: bool,
}

struct Consumer {
    cfg: ConsumerCfg,
    stream: Option<CStream>,
    /// Tokens this consumer ever held per job (for stale settles).
    seen: BTreeMap<JobId, Vec<LeaseToken>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Commit,
    /// Fails before its commit: nothing changed.
    Fail,
    /// Commits, then its caller sees an error (the connection broke).
    Lost,
}

/// Who sent a settle, and what the checker must know of it.
#[derive(Clone, Debug)]
struct Origin {
    c: usize,
    sid: StreamId,
    life: u32,
    on_stream: bool,
    /// The lease was current and unexpired in the database when sent, and
    /// its stream not revocable.
    valid: bool,
    /// The lease's expiry as the client knew it.
    expires: Ms,
}

enum OpKind {
    Enqueue {
        jobs: Vec<Insert>,
        to: Vec<Option<HandoffTo>>,
        /// The job's index → its claim's (local claims only).
        index: Vec<Option<usize>>,
        claims: Option<Claims>,
    },
    Ack(Vec<(AckReq, Origin)>),
    Nack(Vec<(FailReq, Origin)>),
    Extend(Vec<(ExtendReq, Origin)>),
    Round(Round),
    Check(Vec<(JobId, LeaseToken)>),
    Reap {
        expired: Vec<(JobId, LeaseToken)>,
        checked: Vec<(JobId, LeaseToken)>,
        alive: Vec<(JobId, i64)>,
    },
    Release(Release, u32),
    Sweep,
    Due(Vec<QueueName>),
    Reaper,
    /// settle.rs: acked keys of queues ordered by key looked up again
    /// after their acks committed.
    Recheck(Vec<(QueueName, u32)>),
}

struct Op {
    life: u32,
    kind: OpKind,
    fate: Fate,
    /// The unary caller gave up (its result goes nowhere).
    caller_gone: bool,
    /// Its broker incarnation died with it in flight: only its effect on
    /// the database may happen.
    orphan: bool,
    /// May other requests of its kind still join it (its statement has
    /// not started)?
    open: bool,
    unary: bool,
}

struct World {
    cfg: Cfg,
    rng: ChaCha8Rng,
    /// Draws for keys only (see `World::new`).
    krng: ChaCha8Rng,
    /// Draws for the fair queue's keys only.
    frng: ChaCha8Rng,
    /// Draws for Consume clients changing their credit only (None: they
    /// keep it, as runs did before the changes existed).
    crng: Option<ChaCha8Rng>,
    db: Db,
    now: Ms,
    epoch: Instant,
    events: BTreeMap<(Ms, u64), Ev>,
    seq: u64,
    broker: Broker,
    consumers: Vec<Consumer>,
    ops: BTreeMap<u64, Op>,
    next_op: u64,
    next_job: u128,
    out: Outcome,
    trace: VecDeque<String>,
    /// Keep the trace (and `print`: print it as it goes).
    tracing: bool,
    print: bool,
    /// Jobs whose ack was answered OK.
    ack_ok: BTreeSet<JobId>,
    /// Jobs whose Enqueue was answered OK.
    enq_ok: BTreeSet<JobId>,
    /// Jobs CancelJob deleted (gone by design, not lost).
    cancelled: BTreeSet<JobId>,
    /// The stream each lease the dispatcher heard of was taken for (a
    /// round's slot, a hand-off's claim): what a half-close must give back
    /// before its stream ends OK.
    leased_for: FastMap<(JobId, LeaseToken), StreamId>,
    /// Half-closed streams of this incarnation waiting for their end (from
    /// when the dispatcher heard of it).
    finishing: BTreeSet<StreamId>,
    /// Those of them whose release (the one that ends them) is under way;
    /// the others end after a drain's release (`Task::finish_drain`).
    finish_sent: BTreeSet<StreamId>,
    /// Leases a half-closed stream's end may leave current: acked on the
    /// stream (left to the ack, which may have failed), or released apart
    /// before the half-close (sent too late, a lost hand-over; that release
    /// may still be under way, or have given up).
    excused: FastSet<(JobId, LeaseToken)>,
    /// (consumer, queue) → since when it has free credit and a job waits.
    stall: BTreeMap<(usize, QueueName), Ms>,
    /// The last fault (crash, drain, slow statement, failure): the stall
    /// check waits a bound after it.
    last_fault: Ms,
    ending: bool,
}

fn q(s: &str) -> QueueName {
    QueueName::parse(s).expect("queue name")
}

impl World {
    fn new(seed: u64, seconds: u64, print: bool, tracing: bool) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let limited = rng.random_bool(0.3);
        let mut queues = vec![q("a"), q("b")];
        let mut confs = BTreeMap::new();
        for name in &queues {
            confs.insert(
                name.clone(),
                QueueConf {
                    concurrency_limit: None,
                    max_attempts: 5,
                    backoff_ms: 100,
                    key_n: None,
                    walk_n: None,
                },
            );
        }
        if limited {
            queues.push(q("lim"));
            confs.insert(
                q("lim"),
                QueueConf {
                    concurrency_limit: Some(2),
                    max_attempts: 5,
                    backoff_ms: 100,
                    key_n: None,
                    walk_n: None,
                },
            );
        }
        let n = rng.random_range(1..=3);
        let consumers: Vec<ConsumerCfg> = (0..n)
            .map(|_| {
                let mut qs: Vec<QueueName> = queues
                    .iter()
                    .filter(|_| rng.random_bool(0.6))
                    .cloned()
                    .collect();
                if qs.is_empty() {
                    qs.push(queues[rng.random_range(0..queues.len())].clone());
                }
                ConsumerCfg {
                    queues: qs,
                    credit: [1, 1, 2, 4, 8, 16][rng.random_range(0..6)],
                    // MIN_LEASE (1 s) and up.
                    lease_ms: [1000, 1500, 2000, 3000][rng.random_range(0..4)],
                    consume: rng.random_bool(0.7),
                    work: [(0, 5), (1, 50), (20, 400)][rng.random_range(0..3)],
                }
            })
            .collect();
        // A queue ordered by key (issue 33) in some runs, its jobs spread
        // over a few keys. Drawn from an RNG of its own, so that runs
        // without it go exactly as before it existed.
        let mut krng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b65_7973);
        let mut consumers = consumers;
        if krng.random_bool(0.4) {
            queues.push(q("ord"));
            confs.insert(
                q("ord"),
                QueueConf {
                    concurrency_limit: None,
                    max_attempts: 5,
                    backoff_ms: 100,
                    key_n: Some(krng.random_range(1..=2)),
                    walk_n: None,
                },
            );
            for c in &mut consumers {
                if krng.random_bool(0.6) {
                    c.queues.push(q("ord"));
                }
            }
        }
        // A queue fair by key with a per-key limit and no order (the key
        // walk, lease_keys.sql) in some runs: its own RNG again, so that
        // runs without it go exactly as before it existed.
        let mut frng = ChaCha8Rng::seed_from_u64(seed ^ 0x6661_6972);
        if frng.random_bool(0.4) {
            queues.push(q("fair"));
            confs.insert(
                q("fair"),
                QueueConf {
                    concurrency_limit: None,
                    max_attempts: 5,
                    backoff_ms: 100,
                    key_n: None,
                    walk_n: Some(frng.random_range(1..=2)),
                },
            );
            for c in &mut consumers {
                if frng.random_bool(0.6) {
                    c.queues.push(q("fair"));
                }
            }
        }
        // Jobs go only to queues someone consumes.
        queues.retain(|name| {
            consumers
                .iter()
                .any(|c: &ConsumerCfg| c.queues.contains(name))
        });
        // Consume clients change their credit mid-stream (`max_in_flight`
        // on a later message) in some runs: its own RNG again.
        let mut crng = ChaCha8Rng::seed_from_u64(seed ^ 0x6372_6564);
        let crng = crng.random_bool(0.5).then_some(crng);
        let active_ms = seconds * 1000;
        let cfg = Cfg {
            active_ms,
            poll_ms: [300, 1000, 3000, 10_000][rng.random_range(0..4)],
            linger_ms: [0, 12, 200, 1000][rng.random_range(0..4)],
            p_fail: [0.0, 0.01, 0.05][rng.random_range(0..3)],
            p_lost: [0.0, 0.0, 0.01][rng.random_range(0..3)],
            p_cancel: [0.0, 0.02, 0.1][rng.random_range(0..3)],
            p_slow: [0.0, 0.01, 0.05][rng.random_range(0..3)],
            detach: rng.random_bool(0.8),
            queues,
            consumers,
            produce_ms: [5, 20, 100][rng.random_range(0..3)],
            crash_at: rng
                .random_bool(0.15)
                .then(|| rng.random_range(0..active_ms.max(1))),
            drain_at: rng
                .random_bool(0.15)
                .then(|| rng.random_range(0..active_ms.max(1))),
            freeze_at: rng.random_bool(0.2).then(|| {
                (
                    rng.random_range(0..active_ms.max(1)),
                    rng.random_range(500..4000),
                )
            }),
        };
        let epoch = Instant::now();
        let broker = Broker::start(1, &cfg, epoch, 0);
        let consumers = cfg
            .consumers
            .iter()
            .map(|c| Consumer {
                cfg: c.clone(),
                stream: None,
                seen: BTreeMap::new(),
            })
            .collect();
        let mut w = World {
            rng,
            krng,
            frng,
            crng,
            db: Db::new(confs),
            now: 0,
            epoch,
            events: BTreeMap::new(),
            seq: 0,
            broker,
            consumers,
            ops: BTreeMap::new(),
            next_op: 0,
            next_job: 0,
            out: Outcome::default(),
            trace: VecDeque::new(),
            tracing,
            print,
            ack_ok: BTreeSet::new(),
            enq_ok: BTreeSet::new(),
            cancelled: BTreeSet::new(),
            leased_for: FastMap::default(),
            finishing: BTreeSet::new(),
            finish_sent: BTreeSet::new(),
            excused: FastSet::default(),
            stall: BTreeMap::new(),
            last_fault: 0,
            ending: false,
            cfg,
        };
        w.log(format!("config {:?}", w.cfg));
        for c in 0..w.consumers.len() {
            let at = w.rng.random_range(0..200);
            w.at(at, Ev::Open(c));
        }
        w.at(1, Ev::Produce);
        w.at(REAP_MS, Ev::Reaper);
        if w.rng.random_bool(0.5) {
            let t = w.rng.random_range(100..1000);
            w.at(t, Ev::CancelJob);
        }
        if let Some(t) = w.cfg.crash_at {
            w.at(t, Ev::Crash);
        }
        if let Some(t) = w.cfg.drain_at {
            w.at(t, Ev::Drain);
        }
        if let Some((t, _)) = w.cfg.freeze_at {
            w.at(t, Ev::Freeze);
        }
        w.wake_dispatcher();
        w
    }

    fn inst(&self, ms: Ms) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    fn ms(&self, t: Instant) -> Ms {
        t.saturating_duration_since(self.epoch).as_millis() as Ms
    }

    fn at(&mut self, t: Ms, ev: Ev) {
        self.seq += 1;
        self.events.insert((t, self.seq), ev);
    }

    fn after(&mut self, d: Ms, ev: Ev) {
        self.at(self.now + d, ev);
    }

    fn log(&mut self, line: String) {
        let line = format!("{:>6} ms g{} {line}", self.now, self.broker.life);
        if self.print {
            eprintln!("{line}");
        }
        self.trace.push_back(line);
        if self.trace.len() > 400 {
            self.trace.pop_front();
        }
    }

    fn anomaly(&mut self, what: String) {
        say!(self, format!("ANOMALY {what}"));
        if self.out.anomalies.len() < 5 {
            let trace: Vec<&String> = self.trace.iter().collect();
            let tail = trace[trace.len().saturating_sub(60)..]
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ");
            self.out
                .anomalies
                .push(format!("ANOMALY at {} ms: {what}\n  {tail}", self.now));
        }
    }

    fn run(&mut self) {
        let limit = self.cfg.active_ms + SETTLE_MS;
        while let Some(((t, seq), ev)) = self.events.pop_first() {
            if t > limit {
                self.events.insert((t, seq), ev);
                break;
            }
            self.now = t;
            self.db.now = t;
            if !self.ending && t >= self.cfg.active_ms {
                // The faults end too: from here on, everything must settle
                // within the bound.
                self.ending = true;
                self.cfg.p_fail = 0.0;
                self.cfg.p_lost = 0.0;
                self.cfg.p_cancel = 0.0;
                self.cfg.p_slow = 0.0;
                say!(self, "activity and faults end: settle everything".into());
            }
            self.out.steps += 1;
            self.step(ev);
            self.check_step();
            if !self.out.anomalies.is_empty() {
                return;
            }
            if self.ending && self.quiet() {
                break;
            }
        }
        self.check_end();
    }

    /// Nothing left to do: every job settled, nothing in flight.
    /// Leases the dispatcher still counts (an ack that committed but whose
    /// answer was lost is one until its deadline's check) are waited for:
    /// the credit audit at the end wants none.
    fn quiet(&self) -> bool {
        self.db.jobs.is_empty()
            && self.ops.values().all(|o| matches!(o.kind, OpKind::Reaper))
            && self.broker.inbox.lock().unwrap().is_empty()
            && self.broker.outlets.values().all(|o| o.chan.is_empty())
            && self.broker.outlets.keys().all(|sid| {
                self.broker
                    .machine
                    .core()
                    .view(*sid)
                    .is_none_or(|(_, held, _, reserved, _)| held == 0 && reserved == 0)
            })
    }

    // ---- the scheduler's steps

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Dispatch => self.dispatch(),
            Ev::Op(id) => self.complete(id),
            Ev::Cancel(id) => self.cancel(id),
            Ev::Read(c) => self.read(c),
            Ev::Work(c, id, token) => self.work(c, id, token),
            Ev::Produce => self.produce(),
            Ev::Open(c) => self.open(c),
            Ev::Close(c) => self.close(c),
            Ev::HalfClose(c) => self.half_close(c),
            Ev::Credit(c) => self.change_credit(c),
            Ev::Reaper => {
                if !self.broker.dead {
                    self.op(OpKind::Reaper, false);
                }
                self.after(REAP_MS, Ev::Reaper);
            }
            Ev::Crash => self.crash(),
            Ev::CancelJob => self.cancel_job(),
            Ev::Freeze => {
                let d = self.cfg.freeze_at.map_or(0, |(_, d)| d);
                if !self.broker.dead {
                    self.out.faults += 1;
                    self.last_fault = self.now + d;
                    say!(self, format!("FREEZE (SIGSTOP) for {d} ms"));
                    self.broker.frozen_until = Some(self.now + d);
                }
            }
            Ev::Drain => {
                if !self.broker.dead && !self.broker.draining {
                    self.out.faults += 1;
                    self.last_fault = self.now;
                    say!(self, "DRAIN begins".into());
                    self.broker.draining = true;
                    for c in &mut self.consumers {
                        if let Some(s) = &mut c.stream
                            && s.life == self.broker.life
                        {
                            s.revocable = true;
                        }
                    }
                    self.input(Input::Drain);
                }
            }
            Ev::Restart => self.restart(),
        }
    }

    fn input(&mut self, input: Input) {
        self.broker.inbox.lock().unwrap().push_back(input);
        self.wake_dispatcher();
    }

    fn wake_dispatcher(&mut self) {
        if self.broker.dead {
            return;
        }
        if self.broker.dispatch_at.is_none_or(|t| t > self.now) {
            self.broker.dispatch_at = Some(self.now);
            self.at(self.now, Ev::Dispatch);
        }
    }

    /// The dispatcher task: every message queued, then its step.
    fn dispatch(&mut self) {
        if self.broker.dead || self.broker.dispatch_at.is_some_and(|t| t > self.now) {
            return;
        }
        if let Some(t) = self.broker.frozen_until
            && t > self.now
        {
            // Frozen: everything waits (statements' answers in the socket,
            // messages in the inbox) until the process runs again.
            self.broker.dispatch_at = Some(t);
            self.at(t, Ev::Dispatch);
            return;
        }
        self.broker.dispatch_at = None;
        let now = self.inst(self.now);
        // Wake-ups taken in: the book hears of them after the step
        // (`dispatch::Task::run`).
        let mut woken = Vec::new();
        loop {
            let next = self.broker.inbox.lock().unwrap().pop_front();
            let Some(input) = next else { break };
            if let Input::Wake(w) = &input {
                woken.extend(w.iter().cloned());
            }
            say!(self, format!("dispatcher <- {}", brief(&input)));
            self.note_leases(&input);
            let mut fx = Effects::default();
            self.broker.machine.input(input, now, &mut fx);
            self.apply(fx);
            if self.tracing {
                let views: Vec<String> = self
                    .broker
                    .outlets
                    .keys()
                    .map(|sid| format!("s{sid} {:?}", self.broker.machine.core().view(*sid)))
                    .collect();
                say!(self, format!("  views {views:?}"));
            }
        }
        let mut fx = Effects::default();
        self.broker.machine.step(now, &mut fx);
        self.broker.offers.woken(&woken);
        self.apply(fx);
        if !self.broker.inbox.lock().unwrap().is_empty() {
            self.wake_dispatcher();
        }
        let t = self.ms(self.broker.machine.next_timer()).max(self.now + 1);
        if self
            .broker
            .timer_at
            .is_none_or(|at| at <= self.now || t < at)
        {
            self.broker.timer_at = Some(t);
            self.broker.dispatch_at = Some(t);
            self.at(t, Ev::Dispatch);
        }
    }

    /// Carries the machine's effects out, as the dispatcher task does.
    fn apply(&mut self, mut fx: Effects) {
        loop {
            for sid in fx.refused.drain(..) {
                self.broker.outlets.remove(&sid);
                self.stream_ended(sid, "refused: draining");
            }
            for sid in fx.closed.drain(..) {
                // Flagged before the release runs: what waits is dropped.
                if let Some(o) = self.broker.outlets.get_mut(&sid) {
                    o.released = true;
                    o.chan.clear();
                }
                self.broker.outlets.remove(&sid);
            }
            fx.ended.clear();
            let mut gone = Vec::new();
            for (sid, job, send_by) in fx.deliver.drain(..) {
                let send_by = self.ms(send_by);
                let sent = match self.broker.outlets.get_mut(&sid) {
                    Some(o) if !o.released && o.chan.len() < o.capacity => {
                        o.chan.push_back(Out::Job(job.clone(), send_by));
                        Some(o.consumer)
                    }
                    _ => None,
                };
                match sent {
                    Some(c) => {
                        say!(
                            self,
                            format!(
                                "push {} attempt {} tok {} -> s{sid}",
                                jid(job.id),
                                job.attempt,
                                tok(job.token)
                            )
                        );
                        let d = self.rng.random_range(0..3);
                        self.after(d, Ev::Read(c));
                    }
                    None => {
                        if !gone.contains(&sid) {
                            gone.push(sid);
                        }
                    }
                }
            }
            for (sid, id, token) in fx.cancel.drain(..) {
                // `Push::Cancelled`, after the job's delivery (a full
                // channel drops it, as `try_send` does).
                if let Some(o) = self.broker.outlets.get_mut(&sid)
                    && !o.released
                    && o.chan.len() < o.capacity
                {
                    o.chan.push_back(Out::Cancelled(id, token));
                    let c = o.consumer;
                    say!(
                        self,
                        format!("push cancel of {} tok {} -> s{sid}", jid(id), tok(token))
                    );
                    let d = self.rng.random_range(0..3);
                    self.after(d, Ev::Read(c));
                }
            }
            for r in fx.release.drain(..) {
                if let Some(sid) = r.finish {
                    self.finish_sent.insert(sid);
                } else {
                    // Released apart from any half-close (its stream still
                    // open, or dropped): it may commit after that stream
                    // ended. What a half-closed stream gave back must come
                    // with its end.
                    for lease in r.leases.iter().chain(&r.undelivered) {
                        let of = self.leased_for.get(lease);
                        if of.is_none_or(|sid| !self.finishing.contains(sid)) {
                            self.excused.insert(*lease);
                        }
                    }
                }
                self.op(OpKind::Release(r, 0), false);
            }
            for chunk in fx.check.chunks(5000) {
                self.op(OpKind::Check(chunk.to_vec()), false);
            }
            fx.check.clear();
            for round in fx.rounds.drain(..) {
                self.op(OpKind::Round(round), false);
            }
            if std::mem::take(&mut fx.sweep) {
                self.op(OpKind::Sweep, false);
            }
            if !fx.due.is_empty() {
                let due = std::mem::take(&mut fx.due);
                self.op(OpKind::Due(due), false);
            }
            fx.publish.clear();
            if let Some(d) = fx.drained.take() {
                say!(
                    self,
                    format!(
                        "drained: releasing {} leases, ending {} streams",
                        d.leases.len(),
                        d.streams.len()
                    )
                );
                for o in self.broker.outlets.values_mut() {
                    o.released = true;
                    o.chan.clear();
                }
                let r = Release {
                    leases: d.leases,
                    why: "broker shut down before the job was settled",
                    refund: true,
                    undelivered: Vec::new(),
                    finish: None,
                };
                self.op(OpKind::Release(r, 0), false);
                // The streams end (UNAVAILABLE) once it is released; the
                // process then exits and a new one starts.
                let d = self.latency();
                self.after(d, Ev::Restart);
            }
            if gone.is_empty() {
                return;
            }
            let now = self.inst(self.now);
            for sid in gone {
                say!(self, format!("s{sid} gone: closed"));
                self.broker.machine.input(Input::Closed(sid), now, &mut fx);
            }
        }
    }

    // ---- statements

    fn latency(&mut self) -> Ms {
        if self.rng.random_bool(self.cfg.p_slow) {
            self.last_fault = self.now;
            self.rng.random_range(100..2000)
        } else {
            self.rng.random_range(1..6)
        }
    }

    fn fate(&mut self) -> Fate {
        let x: f64 = self.rng.random();
        if x < self.cfg.p_fail {
            Fate::Fail
        } else if x < self.cfg.p_fail + self.cfg.p_lost {
            Fate::Lost
        } else {
            Fate::Commit
        }
    }

    /// Starts a statement; unary ones may be cancelled by their caller.
    fn op(&mut self, kind: OpKind, unary: bool) -> u64 {
        self.next_op += 1;
        let id = self.next_op;
        let fate = self.fate();
        let d = self.latency();
        self.out.statements += 1;
        self.ops.insert(
            id,
            Op {
                life: self.broker.life,
                kind,
                fate,
                caller_gone: false,
                orphan: false,
                open: true,
                unary,
            },
        );
        self.after(d, Ev::Op(id));
        if unary && self.rng.random_bool(self.cfg.p_cancel) {
            let c = self.rng.random_range(0..=d);
            self.after(c, Ev::Cancel(id));
        }
        id
    }

    /// A settle joins a statement of its kind that has not started, if one
    /// is pending (group commit), else starts its own.
    fn settle_op(&mut self, kind: OpKind, unary: bool) {
        let join = self.rng.random_bool(0.3);
        if join {
            let life = self.broker.life;
            let target = self.ops.iter_mut().rev().find(|(_, o)| {
                o.open
                    && o.life == life
                    && !o.caller_gone
                    && o.unary == unary
                    && matches!(
                        (&o.kind, &kind),
                        (OpKind::Ack(_), OpKind::Ack(_))
                            | (OpKind::Nack(_), OpKind::Nack(_))
                            | (OpKind::Extend(_), OpKind::Extend(_))
                    )
            });
            if let Some((_, o)) = target {
                match (&mut o.kind, kind) {
                    (OpKind::Ack(a), OpKind::Ack(b)) => a.extend(b),
                    (OpKind::Nack(a), OpKind::Nack(b)) => a.extend(b),
                    (OpKind::Extend(a), OpKind::Extend(b)) => a.extend(b),
                    _ => unreachable!("matched above"),
                }
                return;
            }
        }
        self.op(kind, unary);
    }

    fn cancel(&mut self, id: u64) {
        let detach = self.cfg.detach;
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        op.caller_gone = true;
        self.out.cancelled_calls += 1;
        say!(
            self,
            format!("op {id} cancelled by its caller (detach {detach})")
        );
        if detach {
            // The statement runs to its end; only the answer is lost.
            return;
        }
        // The call's future is dropped mid-statement: it may have
        // committed (PostgreSQL had it) or not; nothing after it runs.
        let mut op = self.ops.remove(&id).expect("found");
        if self.rng.random_bool(0.5) {
            op.orphan = true;
            let d = self.rng.random_range(0..5);
            let id2 = {
                self.next_op += 1;
                self.next_op
            };
            self.ops.insert(id2, op);
            self.after(d, Ev::Op(id2));
        }
        // Dropped here: an Enqueue's claims are reported unused.
    }

    fn err() -> Error {
        Error::Unavailable(Arc::new(sqlx::Error::PoolTimedOut))
    }

    fn complete(&mut self, id: u64) {
        let Some(mut op) = self.ops.remove(&id) else {
            return;
        };
        op.open = false;
        let stale = op.life != self.broker.life || op.orphan;
        if op.fate == Fate::Fail {
            self.out.failed_statements += 1;
        }
        let fate = op.fate;
        let applies = fate != Fate::Fail;
        // The broker hears of the outcome only if it is alive, the same
        // incarnation, and the statement answered.
        let hears = !stale && fate == Fate::Commit;
        match op.kind {
            OpKind::Enqueue {
                jobs,
                to,
                index,
                mut claims,
            } => {
                let (handed, wakes) = if applies {
                    let broker = self.broker_of(op.life);
                    self.db.enqueue(&jobs, &to, broker, DEFAULT_LEASE_MS)
                } else {
                    (Vec::new(), Vec::new())
                };
                if applies {
                    self.out.enqueued += jobs.len() as u64;
                }
                say!(
                    self,
                    format!(
                        "enqueue {} jobs {:?}: {} handed, fate {fate:?}{}",
                        jobs.len(),
                        jobs.iter().map(|j| jid(j.id)).collect::<Vec<_>>(),
                        handed.len(),
                        if op.caller_gone { ", caller gone" } else { "" }
                    )
                );
                if hears {
                    let local: Vec<Leased> = handed
                        .into_iter()
                        .filter_map(|mut j| {
                            let i = index[j.slot as usize]?;
                            j.slot = i as i32;
                            Some(j)
                        })
                        .collect();
                    if let Some(c) = claims.as_mut() {
                        c.report(local);
                    }
                    self.wake(wakes);
                    if !op.caller_gone {
                        self.enq_ok.extend(jobs.iter().map(|j| j.id));
                    }
                }
                // Otherwise (failed, lost, or its broker gone) the claims
                // are dropped here: reported unused.
                drop(claims);
                self.wake_dispatcher();
            }
            OpKind::Ack(reqs) => {
                let all: Vec<AckReq> = reqs.iter().map(|(r, _)| r.clone()).collect();
                let done = if applies {
                    self.db.ack(&all)
                } else {
                    Vec::new()
                };
                say!(
                    self,
                    format!(
                        "ack {:?}: done {:?} fate {fate:?}",
                        all.iter()
                            .map(|r| (jid(r.job_id), tok(r.token)))
                            .collect::<Vec<_>>(),
                        done.iter().map(|s| jid(s.id)).collect::<Vec<_>>()
                    )
                );
                let results = ack_results(&all, &done);
                if hears {
                    self.settled(done.iter().map(|s| (s.broker, s.id, s.token)).collect());
                    let freed: Vec<Wake> = done
                        .iter()
                        .filter_map(|s| s.slot_freed.clone())
                        .map(|queue| Wake { queue, delay_ms: 0 })
                        .collect();
                    self.wake(freed);
                    let recheck: Vec<(QueueName, u32)> = done
                        .iter()
                        .filter_map(|s| {
                            let key = s.recheck_key.as_ref()?.parse().ok()?;
                            Some((q(&s.queue), key))
                        })
                        .collect();
                    if !recheck.is_empty() {
                        self.op(OpKind::Recheck(recheck), false);
                    }
                }
                for ((req, origin), r) in reqs.into_iter().zip(results) {
                    let applied = done
                        .iter()
                        .any(|s| s.id == req.job_id && s.token == req.token);
                    let answer = if hears { Some(r.is_ok()) } else { None };
                    self.answered(
                        "ack",
                        &origin,
                        req.job_id,
                        req.token,
                        applied,
                        answer,
                        op.caller_gone,
                    );
                }
            }
            OpKind::Nack(reqs) => {
                let all: Vec<FailReq> = reqs.iter().map(|(r, _)| r.clone()).collect();
                let done = if applies {
                    self.db.fail(&all)
                } else {
                    Vec::new()
                };
                say!(
                    self,
                    format!(
                        "nack {:?}: done {:?} fate {fate:?}",
                        all.iter()
                            .map(|r| (jid(r.id), tok(r.token)))
                            .collect::<Vec<_>>(),
                        done.iter().map(|s| jid(s.id)).collect::<Vec<_>>()
                    )
                );
                let results = nack_results(&all, &done);
                if hears {
                    self.wake(wakes_for(&done));
                    self.settled(done.iter().map(|f| (f.broker, f.id, f.token)).collect());
                }
                for ((req, origin), r) in reqs.into_iter().zip(results) {
                    let applied = done.iter().any(|f| f.id == req.id && f.token == req.token);
                    let answer = if hears { Some(r.is_ok()) } else { None };
                    self.answered(
                        "nack",
                        &origin,
                        req.id,
                        req.token,
                        applied,
                        answer,
                        op.caller_gone,
                    );
                }
            }
            OpKind::Extend(reqs) => {
                let all: Vec<ExtendReq> = reqs.iter().map(|(r, _)| *r).collect();
                let done = if applies {
                    self.db.extend(&all)
                } else {
                    Vec::new()
                };
                say!(
                    self,
                    format!(
                        "extend {:?}: done {:?} fate {fate:?}",
                        all.iter()
                            .map(|r| (jid(r.job_id), tok(r.token)))
                            .collect::<Vec<_>>(),
                        done.iter().map(|s| jid(s.id)).collect::<Vec<_>>()
                    )
                );
                let results = extend_results(&all, &done);
                if hears {
                    let me = self.broker.id;
                    for e in done.iter().filter(|e| e.broker == Some(me)) {
                        let input = Input::Extended(e.id, e.lease_ms);
                        self.input(input);
                    }
                }
                for ((req, origin), r) in reqs.into_iter().zip(results) {
                    let applied = done
                        .iter()
                        .any(|e| e.id == req.job_id && e.token == req.token);
                    let answer = if hears { Some(r.is_ok()) } else { None };
                    let until = self.now + req.lease_ms as u64;
                    if answer == Some(true)
                        && !op.caller_gone
                        && let Some(s) = self.stream_of(&origin)
                        && let Some(h) = s.holding.get_mut(&req.job_id)
                        && h.token == req.token
                    {
                        h.expires = h.expires.max(until);
                    }
                    self.answered(
                        "extend",
                        &origin,
                        req.job_id,
                        req.token,
                        applied,
                        answer,
                        op.caller_gone,
                    );
                }
            }
            OpKind::Round(round) => {
                let limited = !round.limited.is_empty();
                let outcome = if applies {
                    let broker = self.broker_of(op.life);
                    Some(
                        self.db
                            .lease(&round.wants, limited, broker, DEFAULT_LEASE_MS),
                    )
                } else {
                    None
                };
                say!(
                    self,
                    format!(
                        "round {:?}: leased {:?} fate {fate:?}",
                        round
                            .wants
                            .iter()
                            .map(|w| (w.queue.as_str().to_owned(), w.n, w.slot))
                            .collect::<Vec<_>>(),
                        outcome.as_ref().map(|o| o
                            .jobs
                            .iter()
                            .map(|j| jid(j.id))
                            .collect::<Vec<_>>())
                    )
                );
                if !stale {
                    let result = match (fate, outcome) {
                        (Fate::Commit, Some(o)) => Ok(o),
                        _ => Err(Self::err()),
                    };
                    self.input(Input::Leased(round, result));
                }
            }
            OpKind::Check(leases) => {
                if stale {
                    return;
                }
                if fate == Fate::Commit {
                    let (expired, alive) = self.db.check_leases(&leases);
                    self.op(
                        OpKind::Reap {
                            expired,
                            checked: leases,
                            alive,
                        },
                        false,
                    );
                } else {
                    let alive = leases.iter().map(|(id, _)| (*id, 1000)).collect();
                    self.input(Input::LeaseChecked {
                        checked: leases,
                        alive,
                    });
                }
            }
            OpKind::Reap {
                expired,
                checked,
                alive,
            } => {
                let reqs = fails(&expired, "lease expired", false);
                let done = if applies {
                    self.db.fail(&reqs)
                } else {
                    Vec::new()
                };
                if stale {
                    return;
                }
                if fate == Fate::Commit {
                    self.wake(wakes_for(&done));
                    self.settled(done.iter().map(|f| (f.broker, f.id, f.token)).collect());
                    self.input(Input::LeaseChecked { checked, alive });
                } else {
                    let alive = checked.iter().map(|(id, _)| (*id, 1000)).collect();
                    self.input(Input::LeaseChecked { checked, alive });
                }
            }
            OpKind::Release(r, attempt) => {
                let reqs = r.requests();
                let done = if applies {
                    self.db.fail(&reqs)
                } else {
                    Vec::new()
                };
                say!(
                    self,
                    format!(
                        "release {:?} ({}): done {} fate {fate:?}",
                        r.leases
                            .iter()
                            .map(|(id, t)| (jid(*id), tok(*t)))
                            .collect::<Vec<_>>(),
                        r.why,
                        done.len()
                    )
                );
                if stale {
                    return;
                }
                // Nothing to release: no statement, nothing to fail.
                let committed =
                    fate == Fate::Commit || (r.leases.is_empty() && r.undelivered.is_empty());
                if !committed && attempt < 4 {
                    // settle::release tries again, 200 ms << attempt later;
                    // a half-closed stream's client waits for the end.
                    let id = self.op(OpKind::Release(r, attempt + 1), false);
                    self.postpone(id, 200 << attempt);
                    return;
                }
                if fate == Fate::Commit {
                    self.wake(wakes_for(&done));
                    self.settled(done.iter().map(|f| (f.broker, f.id, f.token)).collect());
                }
                // A half-closed stream ends OK once its release committed,
                // UNAVAILABLE when it gave up (the leases run out then).
                let mut ends: Vec<StreamId> = r.finish.into_iter().collect();
                if r.why.starts_with("broker shut down") {
                    // Half-closed streams still waiting for their end end
                    // after the drain's release (`Task::finish_drain`).
                    ends.extend(self.finishing.difference(&self.finish_sent));
                }
                for sid in ends {
                    if committed {
                        self.check_finished(sid);
                        self.finished(sid);
                    } else {
                        self.finishing.remove(&sid);
                        self.finish_sent.remove(&sid);
                        self.stream_ended(sid, "UNAVAILABLE: its release failed");
                    }
                }
                if r.why.starts_with("broker shut down") {
                    // The drain's streams end with UNAVAILABLE now.
                    let sids: Vec<StreamId> = self.broker.outlets.keys().copied().collect();
                    for sid in sids {
                        self.stream_ended(sid, "UNAVAILABLE: drained");
                    }
                }
            }
            OpKind::Sweep => {
                if stale {
                    return;
                }
                let r = if fate == Fate::Commit {
                    Ok(self
                        .db
                        .unheard(self.broker.id, UNHEARD_AFTER.as_millis() as Ms))
                } else {
                    Err(Self::err())
                };
                if let Ok(l) = &r {
                    say!(
                        self,
                        format!(
                            "sweep lists {:?}",
                            l.iter()
                                .map(|(id, t)| (jid(*id), tok(*t)))
                                .collect::<Vec<_>>()
                        )
                    );
                }
                self.input(Input::Unheard(r));
            }
            OpKind::Recheck(pairs) => {
                if stale {
                    return;
                }
                // Failed: every queue is woken (settle.rs).
                let mut queues: Vec<QueueName> = pairs
                    .iter()
                    .filter(|(queue, key)| fate != Fate::Commit || self.db.key_waits(queue, *key))
                    .map(|(queue, _)| queue.clone())
                    .collect();
                queues.dedup();
                say!(self, format!("recheck {pairs:?}: wake {queues:?}"));
                self.wake(
                    queues
                        .into_iter()
                        .map(|queue| Wake { queue, delay_ms: 0 })
                        .collect(),
                );
            }
            OpKind::Due(queues) => {
                if stale {
                    return;
                }
                let r = if fate == Fate::Commit {
                    Ok(self.db.next_due(&queues))
                } else {
                    Err(Self::err())
                };
                self.input(Input::DueKnown(r));
            }
            OpKind::Reaper => {
                let expired = self.db.expired();
                let reqs = fails(&expired, "lease expired", false);
                let done = if applies {
                    self.db.fail(&reqs)
                } else {
                    Vec::new()
                };
                if !done.is_empty() {
                    say!(
                        self,
                        format!(
                            "reaper: {:?}",
                            done.iter().map(|f| jid(f.id)).collect::<Vec<_>>()
                        )
                    );
                }
                if hears {
                    self.wake(wakes_for(&done));
                    self.settled(done.iter().map(|f| (f.broker, f.id, f.token)).collect());
                }
            }
        }
    }

    /// The broker id an incarnation leases under.
    fn broker_of(&self, life: u32) -> Uuid {
        Uuid::from_u128(0xb0b0_0000_0000_0000_0000_0000_0000_0000 | u128::from(life))
    }

    /// `Settle::return_credit`: our own leases' credit returns in-process.
    fn settled(&mut self, done: Vec<(Option<Uuid>, JobId, LeaseToken)>) {
        let me = self.broker.id;
        let local: Vec<(JobId, LeaseToken)> = done
            .into_iter()
            .filter(|(b, _, _)| b.is_none_or(|b| b == me))
            .map(|(_, id, t)| (id, t))
            .collect();
        if !local.is_empty() {
            self.input(Input::Settled(local));
        }
    }

    /// `Settle::wake`, in this process (no other replica here): as
    /// `dispatch::Inbox::wake`, no hand-off on these queues until the
    /// dispatcher has taken the wake-up in (`Offers::waking`).
    fn wake(&mut self, wakes: Vec<Wake>) {
        if !wakes.is_empty() {
            self.broker.offers.waking(&wakes);
            self.input(Input::Wake(wakes));
        }
    }

    // ---- clients

    fn produce(&mut self) {
        if self.ending {
            return;
        }
        if !self.broker.dead && !self.broker.draining {
            let n = self.rng.random_range(1..=3);
            let mut jobs: Vec<Insert> = Vec::new();
            for _ in 0..n {
                self.next_job += 1;
                let queue =
                    self.cfg.queues[self.rng.random_range(0..self.cfg.queues.len())].clone();
                // A queue with a concurrency limit (2) drains at two jobs a
                // linger: it takes a fifth of its share, or its backlog
                // outlasts the settle bound whatever the broker does.
                if queue.as_str() == "lim" && self.rng.random_bool(0.8) {
                    continue;
                }
                // So does the fair queue's busy key (half its jobs, one or
                // two at a time): with jobs every 5 ms for 6 s, its backlog
                // outlasted the bound (seed 400500 of a soak, the jobs
                // still going out one at a time).
                if queue.as_str() == "fair" && self.frng.random_bool(0.8) {
                    continue;
                }
                let key = match queue.as_str() {
                    "ord" => Some(self.krng.random_range(0..5)),
                    // A busy key (half the jobs) and more keys than a walk
                    // visits (MAX_KEY_VISITS): cut walks and their 1 ms
                    // retries happen, and the busy key's backlog must not
                    // hold the others back.
                    "fair" => Some(if self.frng.random_bool(0.5) {
                        0
                    } else {
                        self.frng.random_range(1..8)
                    }),
                    _ => None,
                };
                jobs.push(Insert {
                    id: JobId(Uuid::from_u128((1u128 << 100) | self.next_job)),
                    key,
                    queue,
                    priority: self.rng.random_range(0..3),
                    delay_ms: if self.rng.random_bool(0.2) {
                        self.rng.random_range(10..1000)
                    } else {
                        0
                    },
                });
            }
            if !jobs.is_empty() {
                self.enqueue(jobs);
            }
        }
        let d = self.rng.random_range(1..=2 * self.cfg.produce_ms);
        self.after(d, Ev::Produce);
    }

    /// The enqueue path (`broker::enqueue`): claims for jobs due now, one
    /// statement, the claims reported once.
    fn enqueue(&mut self, jobs: Vec<Insert>) {
        let offers = self.broker.offers.clone();
        // broker::enqueue: only the first job of a key in a statement.
        let mut keyed = std::collections::HashSet::new();
        let claims: Vec<Option<crate::dispatch::Claim>> = jobs
            .iter()
            .map(|j| {
                let first_of_key = j.key.is_none_or(|k| keyed.insert((j.queue.clone(), k)));
                (j.delay_ms == 0 && first_of_key)
                    .then(|| offers.claim(&j.queue, false))
                    .flatten()
            })
            .collect();
        let to = claims
            .iter()
            .map(|c| c.as_ref().map(|c| c.to.clone()))
            .collect();
        let mut index = Vec::new();
        let mut used = Vec::new();
        for c in claims {
            match c {
                Some(c) => {
                    index.push(Some(used.len()));
                    used.push(c);
                }
                None => index.push(None),
            }
        }
        let inbox = self.broker.inbox.clone();
        let claims = Claims::new(used, move |h| {
            inbox.lock().unwrap().push_back(Input::Handed(h));
        });
        self.op(
            OpKind::Enqueue {
                jobs,
                to,
                index,
                claims: Some(claims),
            },
            true,
        );
    }

    fn open(&mut self, c: usize) {
        if self.consumers[c].stream.is_some() {
            return;
        }
        if self.broker.dead || self.broker.draining {
            self.after(100, Ev::Open(c));
            return;
        }
        let cfg = self.consumers[c].cfg.clone();
        self.broker.next_stream += 1;
        let sid = self.broker.next_stream;
        let capacity = if cfg.consume {
            10_001
        } else {
            cfg.credit as usize + 1
        };
        self.broker.outlets.insert(
            sid,
            Outlet {
                chan: VecDeque::new(),
                consumer: c,
                capacity,
                released: false,
            },
        );
        self.consumers[c].stream = Some(CStream {
            sid,
            life: self.broker.life,
            credit: cfg.credit,
            cap: cfg.credit,
            held: cfg.consume.then(|| {
                Arc::new(Held::new(crate::api::consume::may_linger(
                    Some(cfg.lease_ms),
                    Duration::from_millis(self.cfg.linger_ms),
                )))
            }),
            holding: BTreeMap::new(),
            half_closed: false,
            pending: 0,
            revocable: false,
        });
        say!(
            self,
            format!(
                "c{c} opens s{sid} on {:?} credit {} lease {} {}",
                cfg.queues.iter().map(|q| q.as_str()).collect::<Vec<_>>(),
                cfg.credit,
                cfg.lease_ms,
                if cfg.consume { "Consume" } else { "Subscribe" }
            )
        );
        self.input(Input::Open {
            id: sid,
            sub: Subscription {
                queues: cfg.queues.clone(),
                consumer: "sim".into(),
                max_in_flight: cfg.credit,
                lease_ms: Some(cfg.lease_ms),
                // A read drains what waits at once (`Ev::Read`), as a
                // `Deliveries` pack does; the dispatcher does not see it.
                batched: true,
            },
        });
        if cfg.consume
            && let Some(crng) = self.crng.as_mut()
        {
            let t = crng.random_range(100..1500);
            self.after(t, Ev::Credit(c));
        }
        if !self.ending {
            let life = self.rng.random_range(500..6000);
            if cfg.consume && self.rng.random_bool(0.5) {
                self.after(life, Ev::HalfClose(c));
            } else {
                self.after(life, Ev::Close(c));
            }
        }
    }

    /// The client drops its stream (a reset, a crash of the consumer).
    fn close(&mut self, c: usize) {
        if self.ending {
            return;
        }
        let Some(s) = self.consumers[c].stream.take() else {
            return;
        };
        if s.half_closed {
            // Already ending its own way.
            self.consumers[c].stream = Some(s);
            return;
        }
        say!(self, format!("c{c} drops s{}", s.sid));
        if s.life == self.broker.life {
            self.input(Input::Closed(s.sid));
        }
        let d = self.rng.random_range(10..300);
        self.after(d, Ev::Open(c));
    }

    /// A Consume client sends its stream a new credit (1 to 16), as the
    /// reader applies it (`api::consume`: the stream's credit for its acks,
    /// the dispatcher's for new jobs); again a while later.
    fn change_credit(&mut self, c: usize) {
        let (life, now, active) = (self.broker.life, self.now, self.cfg.active_ms);
        let Some(crng) = self.crng.as_mut() else {
            return;
        };
        let credit = [1, 2, 4, 8, 16][crng.random_range(0..5)];
        let again = crng.random_range(200..1500);
        let Some(s) = self.consumers[c].stream.as_mut() else {
            return;
        };
        if s.held.is_none() || s.half_closed || s.life != life || self.broker.dead {
            return;
        }
        let (sid, before) = (s.sid, s.credit);
        s.credit = credit;
        s.cap = s.cap.max(credit);
        say!(
            self,
            format!("c{c} sets s{sid}'s credit {before} -> {credit}")
        );
        self.input(Input::Credit(sid, credit));
        if now < active {
            self.after(again, Ev::Credit(c));
        }
    }

    /// A Consume client half-closes: no new jobs; the settles it sent are
    /// finished, then its unsettled jobs released and the stream ends OK.
    fn half_close(&mut self, c: usize) {
        let life = self.broker.life;
        let Some(s) = self.consumers[c].stream.as_mut() else {
            return;
        };
        if s.half_closed || s.life != life {
            return;
        }
        s.half_closed = true;
        // The client settles nothing more.
        s.holding.clear();
        let (sid, pending) = (s.sid, s.pending);
        say!(
            self,
            format!("c{c} half-closes s{sid} ({pending} settles pending)")
        );
        self.input(Input::Credit(sid, 0));
        if pending == 0 {
            self.input(Input::Finish(sid));
        }
    }

    /// Records which stream each lease the dispatcher hears of was taken
    /// for, and which streams it heard half-close (see `check_finished`).
    fn note_leases(&mut self, input: &Input) {
        match input {
            Input::Leased(round, Ok(o)) => {
                for j in &o.jobs {
                    let sid = round.slots[j.slot as usize];
                    self.leased_for.insert((j.id, j.token), sid);
                }
            }
            Input::Handed(h) => {
                for j in &h.leased {
                    let sid = h.claims[j.slot as usize].stream;
                    self.leased_for.insert((j.id, j.token), sid);
                }
            }
            // From here on what the stream gives back comes with its end.
            Input::Finish(sid) => {
                self.finishing.insert(*sid);
            }
            _ => {}
        }
    }

    /// A half-closed stream ends OK: every lease taken for it is over by
    /// now (settled, released, run out), but those excused (see
    /// `World::excused`). A lease round or hand-off still under way when
    /// the client half-closed leased jobs for it too: released only after
    /// the end, the client saw OK while one of its jobs was still leased.
    fn check_finished(&mut self, sid: StreamId) {
        let now = self.now;
        let mut mine: Vec<(JobId, LeaseToken)> = self
            .leased_for
            .iter()
            .filter(|(_, s)| **s == sid)
            .map(|(l, _)| *l)
            .collect();
        mine.sort_by_key(|(id, _)| *id);
        for lease in mine {
            self.leased_for.remove(&lease);
            let (id, token) = lease;
            let current = self.db.jobs.get(&id).is_some_and(|r| {
                r.state == State::Leased && r.token == Some(token) && r.expires > now
            });
            if current && !self.excused.contains(&lease) {
                self.anomaly(format!(
                    "s{sid} ended OK after its half-close while {} (tok {}) was still \
                     leased for it",
                    jid(id),
                    tok(token)
                ));
            }
        }
    }

    /// The release after a half-close is over: the stream ends OK.
    fn finished(&mut self, sid: StreamId) {
        self.finishing.remove(&sid);
        self.finish_sent.remove(&sid);
        self.stream_ended(sid, "OK after half-close");
    }

    /// The broker ended a stream: its client lets go and opens another.
    fn stream_ended(&mut self, sid: StreamId, how: &str) {
        let life = self.broker.life;
        for c in 0..self.consumers.len() {
            if self.consumers[c]
                .stream
                .as_ref()
                .is_some_and(|s| s.sid == sid && s.life == life)
            {
                say!(self, format!("c{c}: s{sid} ended ({how})"));
                self.consumers[c].stream = None;
                let d = self.rng.random_range(10..300);
                self.after(d, Ev::Open(c));
            }
        }
    }

    fn stream_of(&mut self, o: &Origin) -> Option<&mut CStream> {
        self.consumers[o.c]
            .stream
            .as_mut()
            .filter(|s| s.sid == o.sid && s.life == o.life)
    }

    /// The consumer reads what waits on its stream.
    /// An operator cancels a live job (leased or not), as `CancelJob`
    /// does: the row goes; the stream holding its lease hears of it.
    fn cancel_job(&mut self) {
        if self.now < self.cfg.active_ms {
            let t = self.rng.random_range(200..1500);
            self.after(t, Ev::CancelJob);
        }
        let mut ids: Vec<JobId> = self.db.jobs.keys().copied().collect();
        ids.sort_unstable();
        if ids.is_empty() || self.broker.dead {
            return;
        }
        let id = ids[self.rng.random_range(0..ids.len())];
        let row = self.db.cancel(id).expect("listed");
        self.cancelled.insert(id);
        say!(self, format!("CancelJob {} ({:?})", jid(id), row.state));
        let queue = row.queue.clone();
        if let (State::Leased, Some(token)) = (row.state, row.token)
            && row.broker.is_none_or(|b| b == self.broker.id)
        {
            self.input(Input::Cancelled(vec![(id, token)]));
        }
        // AdminApi::cancel_job then wakes the queue (a key's next job may
        // go).
        self.wake(vec![Wake { queue, delay_ms: 0 }]);
    }

    /// Consumer `c` reads a `Cancelled` on stream `sid`: its handler stops
    /// and nothing is settled. It must name a lease the consumer holds (or
    /// held: it may have been settled meanwhile), of a job cancelled.
    fn told_cancelled(&mut self, c: usize, sid: StreamId, id: JobId, token: LeaseToken) {
        say!(
            self,
            format!(
                "c{c} told {} tok {} was cancelled on s{sid}",
                jid(id),
                tok(token)
            )
        );
        if !self.cancelled.contains(&id) {
            self.anomaly(format!(
                "{} announced cancelled on s{sid}, never cancelled",
                jid(id)
            ));
        }
        let seen = self.consumers[c]
            .seen
            .get(&id)
            .is_some_and(|ts| ts.contains(&token));
        if !seen {
            self.anomaly(format!(
                "{} tok {} announced cancelled to c{c}, which never got that lease",
                jid(id),
                tok(token)
            ));
        }
        if let Some(s) = self.consumers[c].stream.as_mut() {
            if s.holding.get(&id).is_some_and(|h| h.token == token) {
                s.holding.remove(&id);
            }
            // `ConsumeStream`: a cancel counts as the job's settle.
            if let Some(held) = &s.held {
                held.cancelled();
            }
        }
    }

    fn read(&mut self, c: usize) {
        let life = self.broker.life;
        let Some(sid) = self.consumers[c]
            .stream
            .as_ref()
            .filter(|s| s.life == life)
            .map(|s| s.sid)
        else {
            return;
        };
        if self.broker.frozen_until.is_some_and(|t| t > self.now) {
            // A frozen process writes nothing to its sockets.
            let t = self.broker.frozen_until.expect("frozen");
            self.at(t, Ev::Read(c));
            return;
        }
        let items: Vec<Out> = match self.broker.outlets.get_mut(&sid) {
            Some(o) => o.chan.drain(..).collect(),
            None => return,
        };
        // Cancels read with their deliveries: those deliveries went out
        // before the cancel, as the channel keeps their order.
        let told: Vec<(JobId, LeaseToken)> = items
            .iter()
            .filter_map(|i| match i {
                Out::Cancelled(id, token) => Some((*id, *token)),
                Out::Job(..) => None,
            })
            .collect();
        for item in items {
            let (job, send_by) = match item {
                Out::Job(job, send_by) => (job, send_by),
                Out::Cancelled(id, token) => {
                    self.told_cancelled(c, sid, id, token);
                    continue;
                }
            };
            if told.contains(&(job.id, job.token)) {
                // The handler never starts: its cancel is right behind.
                say!(
                    self,
                    format!("c{c} gets {} and its cancel together", jid(job.id))
                );
                self.consumers[c]
                    .seen
                    .entry(job.id)
                    .or_default()
                    .push(job.token);
                if let Some(held) = self.consumers[c]
                    .stream
                    .as_ref()
                    .and_then(|s| s.held.clone())
                {
                    held.delivered(1);
                }
                continue;
            }
            if self.now >= send_by {
                // `DeliveryStream`: too late to be of use, not sent.
                say!(self, format!("s{sid}: {} not sent (too late)", jid(job.id)));
                self.input(Input::Unsent(sid, job.id, job.token));
                continue;
            }
            self.received(c, sid, job);
        }
    }

    fn received(&mut self, c: usize, sid: StreamId, job: Leased) {
        self.out.deliveries += 1;
        if job.attempt > 1 {
            self.out.redelivered += 1;
        }
        let expires =
            (job.lease_expires_at.timestamp_millis() - super::db::ts(0).timestamp_millis()) as Ms;
        say!(
            self,
            format!(
                "c{c} gets {} attempt {} tok {} on s{sid} (lease to {expires})",
                jid(job.id),
                job.attempt,
                tok(job.token)
            )
        );
        // Keys: at most key_n of a key leased, and none leased while
        // key_n jobs of its key enqueued before it (a smaller id, inserted
        // before this lease began) were live: such a job is live still
        // (nothing brings a job back), so it is counted now.
        if let Some(row) = self.db.jobs.get(&job.id)
            && row.token == Some(job.token)
            && let (Some(n), Some(key)) = (
                self.db.queues.get(&row.queue).and_then(|c| c.key_n),
                row.key,
            )
        {
            let began = expires.saturating_sub(job.lease_ms as Ms);
            let (ahead, leased) = self.db.keys_around(job.id, &row.queue, key, began);
            if ahead >= n || leased + 1 > n {
                self.anomaly(format!(
                    "{} of key {key} delivered with {ahead} earlier jobs of its key live \
                     and {leased} more leased (key_concurrency {n})",
                    jid(job.id)
                ));
            }
        }
        // A key limit without order (the walk): at most walk_n of a key
        // with an unexpired lease, this one included.
        if let Some(row) = self.db.jobs.get(&job.id)
            && row.token == Some(job.token)
            && let (Some(n), Some(key)) = (
                self.db.queues.get(&row.queue).and_then(|c| c.walk_n),
                row.key,
            )
        {
            let leases = self.db.key_leases(&row.queue, key);
            if leases > n {
                self.anomaly(format!(
                    "{} of key {key} delivered with {leases} unexpired leases of its key \
                     (key_concurrency {n})",
                    jid(job.id)
                ));
            }
        }
        if self.ack_ok.contains(&job.id) {
            self.anomaly(format!(
                "{} delivered (attempt {}) after its ack was answered OK",
                jid(job.id),
                job.attempt
            ));
        }
        let current = self
            .db
            .jobs
            .get(&job.id)
            .is_some_and(|r| r.state == State::Leased && r.token == Some(job.token));
        let s = self.consumers[c].stream.as_ref().expect("reading it");
        let (revocable, half_closed) = (s.revocable, s.half_closed);
        // A job cancelled after its push: its `Cancelled` follows on the
        // stream (the dispatcher has not taken the cancel in yet), as it
        // would on a real one where the client reads the delivery first.
        let cancel_behind = !current && self.cancelled.contains(&job.id);
        if !current && expires > self.now && !revocable && !cancel_behind {
            self.anomaly(format!(
                "{} received on s{sid} after its lease {} was released (not expired)",
                jid(job.id),
                tok(job.token)
            ));
        }
        if expires <= self.now && !revocable {
            self.anomaly(format!(
                "{} received on s{sid} after its lease {} ran out (at {expires})",
                jid(job.id),
                tok(job.token)
            ));
        }
        if half_closed {
            // Sent before the half-close was read: the client ignores it
            // (but got it: a cancel of it may follow, seed 576 of seeds_2).
            self.consumers[c]
                .seen
                .entry(job.id)
                .or_default()
                .push(job.token);
            return;
        }
        // One current lease per job.
        let mut overlaps = Vec::new();
        for (o, other) in self.consumers.iter().enumerate() {
            if o == c {
                continue;
            }
            if let Some(os) = &other.stream
                && !os.revocable
                && let Some(h) = os.holding.get(&job.id)
                && h.expires > self.now
            {
                overlaps.push(format!(
                    "{} held by c{o} (tok {}, lease to {}) and delivered to c{c} (tok {})",
                    jid(job.id),
                    tok(h.token),
                    h.expires,
                    tok(job.token)
                ));
            }
        }
        for what in overlaps {
            self.anomaly(what);
        }
        let me = &mut self.consumers[c];
        me.seen.entry(job.id).or_default().push(job.token);
        let s = me.stream.as_mut().expect("reading it");
        if let Some(held) = &s.held {
            held.delivered(1);
        }
        s.holding.insert(
            job.id,
            Hold {
                token: job.token,
                expires,
            },
        );
        let now = self.now;
        let live = s.holding.values().filter(|h| h.expires > now).count();
        let (credit, cap) = (s.credit, s.cap);
        // Once the activity ends, handlers are quick: whatever waits must
        // drain within the bound, whatever the load was.
        let (lo, hi) = if self.ending { (0, 2) } else { me.cfg.work };
        if live as u32 > cap {
            self.anomaly(format!(
                "c{c} holds {live} live leases on s{sid}, credit {credit} (at most {cap} so far)"
            ));
        }
        let d = self.rng.random_range(lo..=hi);
        self.after(d, Ev::Work(c, job.id, job.token));
    }

    /// A handler finished with a job: the consumer settles it.
    fn work(&mut self, c: usize, id: JobId, token: LeaseToken) {
        let now = self.now;
        let Some(s) = self.consumers[c].stream.as_ref() else {
            return;
        };
        if s.half_closed || s.holding.get(&id).is_none_or(|h| h.token != token) {
            return;
        }
        let expires = s.holding[&id].expires;
        let lease_ms = self.consumers[c].cfg.lease_ms;
        let roll: f64 = if self.ending { 0.0 } else { self.rng.random() };
        // Now and then, a settle with an old token of the job too (a
        // stale one must fail alone, whatever shares its statement).
        if !self.ending && self.rng.random_bool(0.05) {
            let old = self.consumers[c].seen[&id]
                .iter()
                .copied()
                .find(|t| *t != token);
            if let Some(old) = old {
                self.send(c, id, old, Settle::Nack(Some(0)));
            }
        }
        if roll < 0.78 {
            self.send(c, id, token, Settle::Ack);
        } else if roll < 0.86 {
            let retry = [Some(0), Some(50), None][self.rng.random_range(0..3)];
            self.send(c, id, token, Settle::Nack(retry));
        } else if roll < 0.93 {
            // A long handler: extends its lease, then works on.
            self.send(c, id, token, Settle::Extend(lease_ms));
            let d = self.rng.random_range(10..=(lease_ms as u64).max(11));
            self.after(d, Ev::Work(c, id, token));
        } else if expires > now {
            // Gives up on it silently: the lease runs out.
            say!(self, format!("c{c} lets {} run out", jid(id)));
            if let Some(s) = self.consumers[c].stream.as_mut() {
                s.holding.remove(&id);
                // Still counted until it runs out: keep it as held.
                s.holding.insert(id, Hold { token, expires });
            }
        }
    }

    fn send(&mut self, c: usize, id: JobId, token: LeaseToken, what: Settle) {
        let now = self.now;
        let life = self.broker.life;
        let consume = self.consumers[c].cfg.consume;
        let Some(s) = self.consumers[c].stream.as_mut() else {
            return;
        };
        let hold = s.holding.get(&id).filter(|h| h.token == token);
        let expires = hold.map_or(0, |h| h.expires);
        let current =
            self.db.jobs.get(&id).is_some_and(|r| {
                r.state == State::Leased && r.token == Some(token) && r.expires > now
            });
        let origin = Origin {
            c,
            sid: s.sid,
            life: s.life,
            on_stream: consume,
            valid: current && hold.is_some() && !s.revocable && s.life == life,
            expires,
        };
        let lost_broker = s.life != life || self.broker.dead;
        if !matches!(what, Settle::Extend(_)) && hold.is_some() {
            // Settled: the client lets go of it.
            s.holding.remove(&id);
        }
        let held = s.held.clone();
        let credit = s.credit;
        if consume && !lost_broker {
            s.pending += 1;
        }
        say!(
            self,
            format!(
                "c{c} sends {what:?} {} tok {} ({})",
                jid(id),
                tok(token),
                if consume { "on its stream" } else { "unary" }
            )
        );
        if lost_broker {
            return;
        }
        match what {
            Settle::Ack => {
                let mut linger = false;
                if let Some(held) = held {
                    let plan = held.acks_arrive(credit, vec![(id, token)]);
                    linger = plan.linger;
                    if let Some(input) = plan.tell {
                        self.input(input);
                    }
                }
                if consume {
                    // Left to its ack by the stream's release.
                    self.excused.insert((id, token));
                }
                let kind = OpKind::Ack(vec![(AckReq::new(id, token), origin)]);
                if linger && self.cfg.linger_ms > 0 {
                    // Waits for company (`Batcher::call_lingering`).
                    let id = self.op(kind, false);
                    let d = self.rng.random_range(0..=self.cfg.linger_ms);
                    self.postpone(id, d);
                } else {
                    self.settle_op(kind, !consume);
                }
            }
            Settle::Nack(retry) => {
                let req = FailReq {
                    id,
                    token,
                    error: "nacked".into(),
                    retry_after_ms: retry,
                    dead_letter: false,
                    refund: false,
                };
                self.settle_op(OpKind::Nack(vec![(req, origin)]), !consume);
            }
            Settle::Extend(lease_ms) => {
                let req = ExtendReq {
                    job_id: id,
                    token,
                    lease_ms,
                };
                self.settle_op(OpKind::Extend(vec![(req, origin)]), !consume);
            }
        }
    }

    /// A statement starts later (it lingers for company).
    fn postpone(&mut self, id: u64, d: Ms) {
        let at = self
            .events
            .iter()
            .find(|(_, e)| matches!(e, Ev::Op(x) if *x == id))
            .map(|(k, _)| *k);
        if let Some(k) = at {
            self.events.remove(&k);
            self.at(k.0 + d, Ev::Op(id));
        }
    }

    /// A settle's answer reaches its client (unless it gave up); checks it
    /// against what the statement really did.
    #[allow(clippy::too_many_arguments)]
    fn answered(
        &mut self,
        op: &str,
        origin: &Origin,
        id: JobId,
        token: LeaseToken,
        applied: bool,
        answer: Option<bool>,
        caller_gone: bool,
    ) {
        let current = self.broker.life;
        let mut finish = None;
        if origin.on_stream
            && let Some(s) = self.stream_of(origin)
        {
            if op == "ack"
                && let Some(held) = &s.held
            {
                held.acks_answered(1);
            }
            s.pending = s.pending.saturating_sub(1);
            if s.half_closed && s.pending == 0 && origin.life == current {
                finish = Some(s.sid);
            }
        }
        if let Some(sid) = finish {
            self.input(Input::Finish(sid));
        }
        let Some(ok) = answer else { return };
        if caller_gone {
            return;
        }
        if ok != applied {
            self.anomaly(format!(
                "{op} of {} tok {} answered {} but the statement {} it",
                jid(id),
                tok(token),
                if ok { "OK" } else { "refused" },
                if applied { "applied" } else { "did not apply" }
            ));
        }
        if ok && op == "ack" {
            self.ack_ok.insert(id);
            self.out.acked += 1;
        }
        // A valid settle refused: the lease was current when sent, had
        // not run out by now, and nothing the client did let it go (nor
        // an operator: a job cancelled meanwhile is gone).
        let still_open = self.stream_of(origin).is_some();
        if !ok
            && op != "extend"
            && !self.cancelled.contains(&id)
            && origin.valid
            && origin.expires > self.now
            && still_open
            && origin.life == self.broker.life
            && !self.stream_of(origin).is_some_and(|s| s.revocable)
        {
            self.anomaly(format!(
                "a valid {op} of {} tok {} (lease to {}) was refused",
                jid(id),
                tok(token),
                origin.expires
            ));
        }
    }

    // ---- faults

    fn crash(&mut self) {
        if self.broker.dead {
            return;
        }
        self.out.faults += 1;
        self.last_fault = self.now;
        say!(self, "CRASH (kill -9)".into());
        self.broker.dead = true;
        let life = self.broker.life;
        // In-flight statements: committed or not, nothing after them runs.
        let ids: Vec<u64> = self.ops.keys().copied().collect();
        for id in ids {
            let commit = self.rng.random_bool(0.5);
            if let Some(op) = self.ops.get_mut(&id)
                && op.life == life
            {
                op.orphan = true;
                if !commit {
                    op.fate = Fate::Fail;
                }
            }
        }
        for c in &mut self.consumers {
            if c.stream.as_ref().is_some_and(|s| s.life == life) {
                c.stream = None;
            }
        }
        let d = self.rng.random_range(50..500);
        self.after(d, Ev::Restart);
    }

    fn restart(&mut self) {
        let life = self.broker.life + 1;
        say!(self, format!("broker restarts as g{life}"));
        // Stream ids start again.
        self.leased_for.clear();
        self.finishing.clear();
        self.finish_sent.clear();
        self.broker = Broker::start(life, &self.cfg, self.epoch, self.now);
        self.broker.id = self.broker_of(life);
        for c in 0..self.consumers.len() {
            if self.consumers[c]
                .stream
                .as_ref()
                .is_some_and(|s| s.life < life)
            {
                self.consumers[c].stream = None;
            }
            if self.consumers[c].stream.is_none() {
                let d = self.rng.random_range(0..100);
                self.after(d, Ev::Open(c));
            }
        }
        self.wake_dispatcher();
    }

    // ---- the checker

    fn check_step(&mut self) {
        if self.broker.dead || self.broker.draining {
            self.stall.clear();
            return;
        }
        let bound = self.cfg.poll_ms + 6000 + 3000;
        let recent_fault = self.now < self.last_fault + bound;
        let now = self.now;
        let mut starving = Vec::new();
        // Whether a queue has a job ready is the same for every stream of
        // a step: asked once.
        let mut ready_of: BTreeMap<QueueName, bool> = BTreeMap::new();
        for (c, con) in self.consumers.iter().enumerate() {
            let Some(s) = &con.stream else { continue };
            if s.half_closed || s.life != self.broker.life {
                continue;
            }
            let waiting = self.broker.outlets.get(&s.sid).map_or(0, |o| o.chan.len());
            let live = s.holding.values().filter(|h| h.expires > now).count() + waiting;
            let free = (s.credit as usize).saturating_sub(live) > 0 && s.pending == 0;
            for queue in &con.cfg.queues {
                if self
                    .db
                    .queues
                    .get(queue)
                    .is_some_and(|c| c.concurrency_limit.is_some())
                {
                    continue;
                }
                let ready = free
                    && *ready_of
                        .entry(queue.clone())
                        .or_insert_with(|| self.db.has_ready(queue));
                let key = (c, queue.clone());
                if !ready {
                    self.stall.remove(&key);
                    continue;
                }
                let since = *self.stall.entry(key).or_insert(now);
                if now - since > bound && !recent_fault {
                    starving.push((c, s.sid, queue.clone(), since));
                }
            }
        }
        if let Some((c, sid, queue, since)) = starving.pop() {
            let view = self.broker.machine.core().view(sid);
            self.anomaly(format!(
                "c{c}'s s{sid} has free credit and {} has deliverable jobs, nothing delivered \
                 since {since} ms (dispatcher's view of the stream: max, held, acking, \
                 reserved, offered = {view:?})",
                queue.as_str()
            ));
        }
    }

    fn check_end(&mut self) {
        if !self.out.anomalies.is_empty() {
            return;
        }
        self.out.dead = self.db.dead.len() as u64;
        if !self.db.jobs.is_empty() {
            let left: Vec<String> = self
                .db
                .jobs
                .iter()
                .take(10)
                .map(|(id, r)| {
                    format!(
                        "{} {} {:?} run_at {} attempt {} tok {} expires {}",
                        jid(*id),
                        r.queue.as_str(),
                        r.state,
                        r.run_at,
                        r.attempt,
                        r.token.map(tok).unwrap_or_default(),
                        r.expires
                    )
                })
                .collect();
            let streams: Vec<String> = self
                .consumers
                .iter()
                .enumerate()
                .filter_map(|(c, con)| {
                    let s = con.stream.as_ref()?;
                    Some(format!(
                        "c{c} s{} {:?} holding {} view {:?}",
                        s.sid,
                        con.cfg
                            .queues
                            .iter()
                            .map(|q| q.as_str())
                            .collect::<Vec<_>>(),
                        s.holding.len(),
                        self.broker.machine.core().view(s.sid)
                    ))
                })
                .collect();
            self.anomaly(format!(
                "{} jobs never settled, {SETTLE_MS} ms after the activity ended: {left:?}; streams {streams:?}",
                self.db.jobs.len()
            ));
            return;
        }
        // Every half-close ended: a stream whose release waited for a round
        // or a claim that never came back would keep its jobs leased and
        // its client waiting.
        let unended: Vec<String> = (self.consumers.iter().enumerate())
            .filter_map(|(c, con)| {
                let s = con.stream.as_ref()?;
                (s.half_closed && s.life == self.broker.life && !self.broker.dead)
                    .then(|| format!("c{c}'s s{}", s.sid))
            })
            .collect();
        if !unended.is_empty() {
            self.anomaly(format!("half-closed streams never ended: {unended:?}"));
            return;
        }
        // Credit audit: with nothing in flight, every open stream holds no
        // lease, and offers all its credit, every unit of it claimable.
        let mut audit = Vec::new();
        // No wake-up left keeping a queue from hand-off (each one taken in
        // is heard by the book after its step).
        let waking = self.broker.offers.waking_queues();
        if !self.broker.dead && !waking.is_empty() {
            audit.push(format!(
                "wake-ups never taken in keep {waking:?} from hand-off"
            ));
        }
        for (c, con) in self.consumers.iter().enumerate() {
            let Some(s) = &con.stream else { continue };
            if s.life != self.broker.life || s.half_closed {
                continue;
            }
            let view = self.broker.machine.core().view(s.sid);
            let unclaimed = self.broker.offers.unclaimed(s.sid);
            let max = s.credit as i32;
            // A stream serving a queue with limits never offers (its jobs
            // are never handed off); one ordered by key does (the enqueue
            // statement checks the key).
            let limited = con.cfg.queues.iter().any(|q| {
                self.db
                    .queues
                    .get(q)
                    .is_some_and(|c| c.concurrency_limit.is_some() || c.walk_n.is_some())
            });
            let offer = if limited { 0 } else { max };
            if view != Some((max, 0, 0, 0, offer)) || unclaimed != offer {
                audit.push(format!(
                    "c{c}'s s{}: (max, held, acking, reserved, offered) = {view:?}, \
                     claimable {unclaimed}, want ({max}, 0, 0, 0, {offer}) and {offer}",
                    s.sid
                ));
            }
        }
        if !audit.is_empty() {
            self.anomaly(format!("credit lost or created at the end: {audit:?}"));
            return;
        }
        let lost: Vec<String> = self
            .enq_ok
            .iter()
            .filter(|id| {
                !self.db.done.contains(id)
                    && !self.db.dead.contains_key(id)
                    && !self.cancelled.contains(id)
            })
            .map(|id| jid(*id))
            .collect();
        if !lost.is_empty() {
            self.anomaly(format!("jobs answered OK and gone: {lost:?}"));
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Settle {
    Ack,
    Nack(Option<i64>),
    Extend(i64),
}

fn fails(leases: &[(JobId, LeaseToken)], why: &str, refund: bool) -> Vec<FailReq> {
    (leases.iter())
        .map(|l| FailReq::ended(*l, why, refund))
        .collect()
}

impl Broker {
    fn start(life: u32, cfg: &Cfg, epoch: Instant, now: Ms) -> Broker {
        let offers = Offers::default();
        let at = epoch + Duration::from_millis(now);
        let mut core = Core::new(Duration::from_millis(cfg.poll_ms), offers.clone(), at);
        // One cluster: offers are published (to nobody here) and the sweep
        // of lost hand-overs runs at every poll, as in production.
        core.publish_offers(at);
        Broker {
            life,
            id: Uuid::from_u128(0xb0b0_0000_0000_0000_0000_0000_0000_0000 | u128::from(life)),
            machine: Machine::new(core),
            offers,
            inbox: Arc::new(Mutex::new(VecDeque::new())),
            outlets: BTreeMap::new(),
            next_stream: 0,
            dispatch_at: None,
            timer_at: None,
            draining: false,
            dead: false,
            frozen_until: None,
        }
    }
}

fn jid(id: JobId) -> String {
    format!("j{}", id.0.as_u128() & 0xffff_ffff)
}

fn tok(t: LeaseToken) -> String {
    format!("t{}", t.0.as_u128() & 0xffff_ffff)
}

fn brief(i: &Input) -> String {
    match i {
        Input::Open { id, .. } => format!("Open s{id}"),
        Input::Leased(r, Ok(o)) => format!(
            "Leased ({} wants) {:?}",
            r.wants.len(),
            o.jobs.iter().map(|j| jid(j.id)).collect::<Vec<_>>()
        ),
        Input::Leased(_, Err(_)) => "Leased: error".into(),
        Input::Handed(h) => format!(
            "Handed {} claims, {:?}",
            h.claims.len(),
            h.leased.iter().map(|j| jid(j.id)).collect::<Vec<_>>()
        ),
        Input::Settled(l) => format!(
            "Settled {:?}",
            l.iter()
                .map(|(id, t)| (jid(*id), tok(*t)))
                .collect::<Vec<_>>()
        ),
        Input::Acking(l) => format!(
            "Acking {:?}",
            l.iter()
                .map(|(id, t)| (jid(*id), tok(*t)))
                .collect::<Vec<_>>()
        ),
        Input::Unheard(Ok(l)) => format!("Unheard {} listed", l.len()),
        Input::LeaseChecked { checked, alive } => {
            format!(
                "LeaseChecked {} checked, {} alive",
                checked.len(),
                alive.len()
            )
        }
        other => {
            let s = format!("{other:?}");
            s.chars().take(100).collect()
        }
    }
}

#[allow(dead_code)]
fn unused() -> &'static str {
    let _ = consumer;
    CLOSED_BEFORE_SETTLING
}
