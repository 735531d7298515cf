//! The model database: `leaseq.jobs` as the broker's statements see it, one
//! statement at a time. Each function is one statement's effect, applied
//! at the instant the simulation commits it, with the semantics of its
//! `.sql` file (named on each): fencing by lease token, `skip locked`
//! leasing in delivery order, retries, dead letters, refunds, the limited
//! path's concurrency limit. The statements' SQL itself is tested against
//! PostgreSQL by the integration suite; this model is what the simulation's
//! broker runs against, so that its decisions can be interleaved at will.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::domain::{
    AckReq, ClusterId, ExtendReq, Failed, FastMap, JobId, LeaseToken, QueueName, Settled,
};
use crate::domain::{Cap, Due, Extended, FailReq, HandoffTo, LeaseOutcome, Leased, Wake, Want};

/// Database time: milliseconds since the simulation began.
pub type Ms = u64;

/// A queue's settings, as the model knows them.
#[derive(Clone, Debug, Default)]
pub struct QueueConf {
    pub concurrency_limit: Option<i64>,
    pub max_attempts: i32,
    /// Nack without retry_after: retried after this long.
    pub backoff_ms: i64,
    /// `ordered_by_key` with this `key_concurrency` (lease.sql).
    pub key_n: Option<i64>,
    /// `fair_by_key` with this `key_concurrency` and no order: leased by
    /// the key walk (lease_keys.sql).
    pub walk_n: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Available,
    Leased,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub queue: QueueName,
    pub state: State,
    pub priority: i32,
    pub run_at: Ms,
    pub enqueued: Ms,
    pub attempt: i32,
    pub token: Option<LeaseToken>,
    pub expires: Ms,
    /// Which incarnation of the broker leased it (`lease_broker`).
    pub broker: Option<Uuid>,
    pub key: Option<u32>,
}

/// A job to insert (what `NewJob` carries that matters here).
#[derive(Clone, Debug)]
pub struct Insert {
    pub id: JobId,
    pub queue: QueueName,
    pub priority: i32,
    pub delay_ms: Ms,
    pub key: Option<u32>,
}

#[derive(Default)]
pub struct Db {
    pub now: Ms,
    /// Every live job (read freely; changed only through `put` / `take`,
    /// which keep the indexes below).
    /// By id: a hash map, looked up at every step of the checker (a
    /// BTreeMap's key comparisons were the simulation's largest cost);
    /// nothing iterates it but `World::cancel_job`, which sorts the ids.
    pub jobs: FastMap<JobId, Row>,
    /// Available jobs per queue in delivery order (`jobs_ready`).
    ready_idx: BTreeMap<QueueName, BTreeSet<(i32, Ms, JobId)>>,
    /// Available jobs per queue by run_at.
    due_idx: BTreeMap<QueueName, BTreeSet<(Ms, JobId)>>,
    /// Leased jobs.
    leased_idx: BTreeSet<JobId>,
    /// Live keyed jobs per (queue, key), in id order (`jobs_key`).
    key_idx: BTreeMap<(QueueName, u32), BTreeSet<JobId>>,
    /// Live unkeyed jobs of queues ordered by key.
    unkeyed: BTreeMap<QueueName, BTreeSet<JobId>>,
    pub dead: BTreeMap<JobId, String>,
    pub done: BTreeSet<JobId>,
    pub queues: BTreeMap<QueueName, QueueConf>,
    /// The key walk's cursor per queue (`queues.fair_cursor`).
    fair_cursor: BTreeMap<QueueName, u32>,
    next_token: u128,
}

/// The most keys one walk visits (store/limits.rs `MAX_KEY_VISITS`, scaled
/// down to the model's few keys so that cuts happen).
const MAX_KEY_VISITS: usize = 4;

/// The database's clock as a timestamp (the broker's `DateTime`s).
pub fn ts(ms: Ms) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms as i64)
        .single()
        .expect("in range")
}

impl Db {
    fn index(&mut self, id: JobId) {
        let Some(r) = self.jobs.get(&id) else { return };
        match r.state {
            State::Available => {
                let q = r.queue.clone();
                let (p, at) = (-r.priority, r.run_at);
                self.ready_idx
                    .entry(q.clone())
                    .or_default()
                    .insert((p, at, id));
                self.due_idx.entry(q).or_default().insert((at, id));
            }
            State::Leased => {
                self.leased_idx.insert(id);
            }
        }
    }

    fn unindex(&mut self, id: JobId) {
        let Some(r) = self.jobs.get(&id) else { return };
        let (q, p, at) = (r.queue.clone(), -r.priority, r.run_at);
        if let Some(s) = self.ready_idx.get_mut(&q) {
            s.remove(&(p, at, id));
        }
        if let Some(s) = self.due_idx.get_mut(&q) {
            s.remove(&(at, id));
        }
        self.leased_idx.remove(&id);
    }

    fn put(&mut self, id: JobId, row: Row) {
        self.unindex(id);
        if let Some(k) = row.key {
            self.key_idx
                .entry((row.queue.clone(), k))
                .or_default()
                .insert(id);
        } else if self.conf(&row.queue).key_n.is_some() {
            self.unkeyed
                .entry(row.queue.clone())
                .or_default()
                .insert(id);
        }
        self.jobs.insert(id, row);
        self.index(id);
    }

    fn take(&mut self, id: JobId) -> Option<Row> {
        self.unindex(id);
        let row = self.jobs.remove(&id)?;
        if let Some(k) = row.key {
            let slot = (row.queue.clone(), k);
            if let Some(s) = self.key_idx.get_mut(&slot) {
                s.remove(&id);
                if s.is_empty() {
                    self.key_idx.remove(&slot);
                }
            }
        } else if let Some(s) = self.unkeyed.get_mut(&row.queue) {
            s.remove(&id);
        }
        Some(row)
    }

    /// Changes a row in place, keeping the indexes.
    fn change(&mut self, id: JobId, f: impl FnOnce(&mut Row)) {
        self.unindex(id);
        if let Some(r) = self.jobs.get_mut(&id) {
            f(r);
        }
        self.index(id);
    }

    /// Whether `queue` has a job deliverable now (in a queue ordered by
    /// key: one its key does not hold back).
    pub fn has_ready(&self, queue: &QueueName) -> bool {
        // The checker asks this of every stream at every step: one pass
        // over each key's jobs, stopping at the answer (the simulation's
        // own CPU was mostly here).
        if let Some(n) = self.conf(queue).walk_n {
            return self
                .key_idx
                .range((queue.clone(), 0)..=(queue.clone(), u32::MAX))
                .any(|(_, ids)| self.key_has_room_and_due(ids, n));
        }
        if self.conf(queue).key_n.is_none() {
            return self
                .due_idx
                .get(queue)
                .and_then(|s| s.first())
                .is_some_and(|(at, _)| *at <= self.now);
        }
        self.candidates_iter(queue).any(|id| self.key_allows(*id))
    }

    /// Whether one key's jobs (`ids`) have one due while fewer than `n`
    /// hold a live lease (`key_leases(..) < n`).
    fn key_has_room_and_due(&self, ids: &BTreeSet<JobId>, n: i64) -> bool {
        let (mut due, mut leased) = (false, 0);
        for id in ids {
            let r = &self.jobs[id];
            if r.state == State::Available && r.run_at <= self.now {
                due = true;
            } else if r.state == State::Leased && r.expires > self.now {
                leased += 1;
                if leased >= n {
                    return false;
                }
            }
        }
        due
    }

    /// lease.sql's key rule: a keyed job of a queue ordered by key may be
    /// leased only while fewer than `key_n` jobs of its key are live and
    /// enqueued before it (a smaller id, whatever their state) or leased.
    pub fn key_allows(&self, id: JobId) -> bool {
        let Some(r) = self.jobs.get(&id) else {
            return false;
        };
        let (Some(n), Some(key)) = (self.conf(&r.queue).key_n, r.key) else {
            return true;
        };
        let Some(ids) = self.key_idx.get(&(r.queue.clone(), key)) else {
            return true;
        };
        let ahead = ids.range(..id).take(n as usize).count() as i64;
        let leased_after = ids
            .range(id..)
            .filter(|e| **e != id && self.jobs[e].state == State::Leased)
            .take(n as usize)
            .count() as i64;
        ahead + leased_after < n
    }

    /// Whether a job of `key` in `queue` is live and not leased (ack.sql's
    /// probe of jobs_key for `waits`, and `Store::keys_waiting`).
    pub fn key_waits(&self, queue: &QueueName, key: u32) -> bool {
        self.key_idx
            .get(&(queue.clone(), key))
            .is_some_and(|ids| ids.iter().any(|id| self.jobs[id].state != State::Leased))
    }

    /// A key's unexpired leases (lease_keys.sql's count for a key limit
    /// without order).
    pub fn key_leases(&self, queue: &QueueName, key: u32) -> i64 {
        self.key_idx
            .get(&(queue.clone(), key))
            .into_iter()
            .flatten()
            .filter(|id| {
                let r = &self.jobs[*id];
                r.state == State::Leased && r.expires > self.now
            })
            .count() as i64
    }

    /// lease_keys.sql: the key walk of a round asking `n` jobs. Visits the
    /// keys with a job not leased, in key order after the queue's cursor
    /// and wrapping, at most `2n` (clamped to [2, MAX_KEY_VISITS]); takes
    /// of each what its limit allows (its due jobs in id order), hands them
    /// out in turns (every key's first job before any key's second, the
    /// keys of a turn in the walk's order), moves the cursor to the last
    /// key served. Returns the jobs in order and whether the walk was cut
    /// (it visited as many keys as it may). Jobs without a key are not
    /// modelled: the simulation's fair queue gives every job a key.
    fn walk(&mut self, queue: &QueueName, n: usize) -> (Vec<JobId>, bool) {
        let limit = self.conf(queue).walk_n.unwrap_or(1);
        let visits = (2 * n).clamp(2, MAX_KEY_VISITS);
        let cursor = self.fair_cursor.get(queue).copied();
        let waiting: Vec<u32> = self
            .key_idx
            .range((queue.clone(), 0)..=(queue.clone(), u32::MAX))
            .filter(|(_, ids)| ids.iter().any(|id| self.jobs[id].state != State::Leased))
            .map(|((_, key), _)| *key)
            .collect();
        let (after, before): (Vec<u32>, Vec<u32>) =
            waiting.iter().partition(|k| cursor.is_none_or(|c| **k > c));
        let visited: Vec<u32> = after.into_iter().chain(before).take(visits).collect();
        let cut = visited.len() >= visits;
        let now = self.now;
        let per_key: Vec<(u32, Vec<JobId>)> = visited
            .iter()
            .map(|key| {
                let allow = (limit - self.key_leases(queue, *key)).max(0) as usize;
                let jobs = self.key_idx[&(queue.clone(), *key)]
                    .iter()
                    .filter(|id| {
                        let r = &self.jobs[*id];
                        r.state == State::Available && r.run_at <= now
                    })
                    .take(allow.min(n))
                    .copied()
                    .collect();
                (*key, jobs)
            })
            .collect();
        let mut out = Vec::new();
        let mut last = None;
        'turns: for turn in 0.. {
            let mut any = false;
            for (key, jobs) in &per_key {
                if let Some(id) = jobs.get(turn) {
                    any = true;
                    if out.len() == n {
                        break 'turns;
                    }
                    out.push(*id);
                    last = Some(*key);
                }
            }
            if !any {
                break;
            }
        }
        if let Some(key) = last {
            self.fair_cursor.insert(queue.clone(), key);
        }
        (out, cut)
    }

    /// leaseq.key_free_for_handoff: a keyed job of a queue ordered by key
    /// is handed off only while fewer than `key_n` jobs of its key are live
    /// (the statement is atomic here, as the queue row's lock makes it).
    fn key_free(&self, j: &Insert) -> bool {
        let (Some(n), Some(key)) = (self.conf(&j.queue).key_n, j.key) else {
            return true;
        };
        self.key_idx
            .get(&(j.queue.clone(), key))
            .is_none_or(|ids| (ids.len() as i64) < n)
    }

    /// Jobs of `key` in `queue` around `id`: those enqueued before it
    /// (smaller id) and inserted by `began`, live; and the others leased.
    pub fn keys_around(&self, id: JobId, queue: &QueueName, key: u32, began: Ms) -> (i64, i64) {
        let ids = self.key_idx.get(&(queue.clone(), key));
        let mine = ids
            .into_iter()
            .flatten()
            .filter(|e| **e != id)
            .map(|e| (e, &self.jobs[e]));
        let (mut ahead, mut leased) = (0, 0);
        for (e_id, e) in mine {
            if *e_id < id && e.enqueued <= began {
                ahead += 1;
            }
            if e.state == State::Leased {
                leased += 1;
            }
        }
        (ahead, leased)
    }

    /// Leased on the locked path (store/limits.rs): limited or ordered.
    /// The same queues' settles wake their consumers at once (ack.sql /
    /// fail.sql's `slot_freed`).
    fn locked_path(&self, q: &QueueName) -> bool {
        let c = self.conf(q);
        c.concurrency_limit.is_some() || c.key_n.is_some() || c.walk_n.is_some()
    }

    pub fn new(queues: BTreeMap<QueueName, QueueConf>) -> Db {
        Db {
            queues,
            ..Db::default()
        }
    }

    fn conf(&self, q: &QueueName) -> QueueConf {
        self.queues.get(q).cloned().unwrap_or(QueueConf {
            concurrency_limit: None,
            max_attempts: 5,
            backoff_ms: 200,
            key_n: None,
            walk_n: None,
        })
    }

    /// No hand-off: a concurrency limit, or keys that the walk serves.
    fn limited(&self, q: &QueueName) -> bool {
        let c = self.conf(q);
        c.concurrency_limit.is_some() || c.walk_n.is_some()
    }

    /// `gen_random_uuid()`, made deterministic.
    fn token(&mut self) -> LeaseToken {
        self.next_token += 1;
        LeaseToken(
            Uuid::from_u128(0x5eed_0000_0000_0000_0000_0000_0000_0000 | self.next_token),
            ClusterId::HOME,
        )
    }

    fn leased(&self, id: JobId, slot: i32, lease_ms: i64) -> Leased {
        let r = &self.jobs[&id];
        Leased {
            slot,
            lease_ms,
            id,
            queue: r.queue.as_str().to_owned(),
            payload: Vec::new(),
            headers: Default::default(),
            priority: r.priority,
            attempt: r.attempt,
            enqueued_at: ts(r.enqueued),
            run_at: ts(r.run_at),
            last_error: None,
            token: r.token.expect("leased"),
            lease_expires_at: ts(r.expires),
            key: None,
        }
    }

    /// enqueue.sql: jobs inserted, those with a claim (due now, queue
    /// without limits) inserted leased to the claiming stream. Returns the
    /// handed jobs (`slot`: the job's index) and the wake-ups.
    pub fn enqueue(
        &mut self,
        jobs: &[Insert],
        claims: &[Option<HandoffTo>],
        broker: Uuid,
        default_lease_ms: i64,
    ) -> (Vec<Leased>, Vec<Wake>) {
        let mut handed = Vec::new();
        let mut wakes: BTreeMap<QueueName, i64> = BTreeMap::new();
        for (i, j) in jobs.iter().enumerate() {
            let claim = claims[i]
                .as_ref()
                .filter(|_| j.delay_ms == 0 && !self.limited(&j.queue) && self.key_free(j));
            let mut row = Row {
                queue: j.queue.clone(),
                state: State::Available,
                priority: j.priority,
                run_at: self.now + j.delay_ms,
                enqueued: self.now,
                attempt: 0,
                token: None,
                expires: 0,
                broker: None,
                key: j.key,
            };
            match claim {
                Some(c) => {
                    let lease_ms = c.lease_ms.unwrap_or(default_lease_ms);
                    row.state = State::Leased;
                    row.attempt = 1;
                    row.token = Some(self.token());
                    row.expires = self.now + lease_ms as u64;
                    row.broker = Some(broker);
                    self.put(j.id, row);
                    handed.push(self.leased(j.id, i as i32, lease_ms));
                }
                None => {
                    self.put(j.id, row);
                    let e = wakes.entry(j.queue.clone()).or_insert(j.delay_ms as i64);
                    *e = (*e).min(j.delay_ms as i64);
                }
            }
        }
        let wakes = wakes
            .into_iter()
            .map(|(queue, delay_ms)| Wake { queue, delay_ms })
            .collect();
        (handed, wakes)
    }

    /// Up to `n` jobs of `queue` deliverable now, in delivery order.
    fn ready(&self, queue: &QueueName, n: usize) -> Vec<JobId> {
        if self.conf(queue).key_n.is_none() {
            return self
                .ready_idx
                .get(queue)
                .into_iter()
                .flatten()
                .filter(|(_, at, _)| *at <= self.now)
                .take(n)
                .map(|(_, _, id)| *id)
                .collect();
        }
        // Ordered by key: the same answer as filtering the whole line by
        // `key_allows`, from the candidates only (the unkeyed jobs and the
        // first key_n of each key), so a held-back backlog costs nothing.
        let mut line: Vec<(i32, Ms, JobId)> = self
            .candidates(queue)
            .into_iter()
            .filter(|id| self.key_allows(*id))
            .map(|id| {
                let r = &self.jobs[&id];
                (-r.priority, r.run_at, id)
            })
            .collect();
        line.sort_unstable();
        line.into_iter().take(n).map(|(_, _, id)| id).collect()
    }

    /// An ordered queue's jobs that may be leasable now: available and
    /// due, unkeyed or among the first key_n of their key.
    fn candidates(&self, queue: &QueueName) -> Vec<JobId> {
        self.candidates_iter(queue).copied().collect()
    }

    fn candidates_iter<'a>(&'a self, queue: &QueueName) -> impl Iterator<Item = &'a JobId> + 'a {
        let n = self.conf(queue).key_n.unwrap_or(1) as usize;
        let due = |id: &&JobId| {
            self.jobs
                .get(id)
                .is_some_and(|r| r.state == State::Available && r.run_at <= self.now)
        };
        let keyed = self
            .key_idx
            .range((queue.clone(), 0)..=(queue.clone(), u32::MAX))
            .flat_map(move |(_, ids)| ids.iter().take(n))
            .filter(due);
        let unkeyed = self.unkeyed.get(queue).into_iter().flatten().filter(due);
        keyed.chain(unkeyed)
    }

    /// lease.sql (`limited`: through store/limits.rs, whose concurrency
    /// limit trims the asks; otherwise limited queues come back as
    /// markers). Each want takes the next `n` jobs of its queue in order.
    pub fn lease(
        &mut self,
        wants: &[Want],
        limited: bool,
        broker: Uuid,
        default_lease_ms: i64,
    ) -> LeaseOutcome {
        let mut out = LeaseOutcome::default();
        // Each queue's jobs in line for this statement's wants.
        let mut taken: BTreeMap<QueueName, VecDeque<JobId>> = BTreeMap::new();
        let mut allowed: BTreeMap<QueueName, i64> = BTreeMap::new();
        let mut cut: BTreeSet<QueueName> = BTreeSet::new();
        for w in wants {
            let conf = self.conf(&w.queue);
            if self.locked_path(&w.queue) && !limited {
                if !out.limited.contains(&w.queue) {
                    out.limited.push(w.queue.clone());
                }
                continue;
            }
            if !taken.contains_key(&w.queue) {
                let asked: i32 = wants
                    .iter()
                    .filter(|x| x.queue == w.queue)
                    .map(|x| x.n)
                    .sum();
                let line = if conf.walk_n.is_some() {
                    let (line, was_cut) = self.walk(&w.queue, asked.max(0) as usize);
                    if was_cut {
                        cut.insert(w.queue.clone());
                    }
                    line
                } else {
                    self.ready(&w.queue, asked.max(0) as usize)
                };
                taken.insert(w.queue.clone(), line.into());
                if let Some(limit) = conf.concurrency_limit {
                    let busy = self
                        .leased_idx
                        .iter()
                        .map(|id| &self.jobs[id])
                        .filter(|r| r.queue == w.queue && r.expires > self.now)
                        .count() as i64;
                    allowed.insert(w.queue.clone(), (limit - busy).max(0));
                }
            }
            let lease_ms = w.lease_ms.unwrap_or(default_lease_ms);
            for _ in 0..w.n {
                if let Some(a) = allowed.get_mut(&w.queue) {
                    if *a == 0 {
                        break;
                    }
                    *a -= 1;
                }
                let Some(id) = taken.get_mut(&w.queue).expect("listed").pop_front() else {
                    break;
                };
                let token = self.token();
                let now = self.now;
                self.change(id, |r| {
                    r.state = State::Leased;
                    r.attempt += 1;
                    r.token = Some(token);
                    r.expires = now + lease_ms as u64;
                    r.broker = Some(broker);
                });
                out.jobs.push(self.leased(id, w.slot, lease_ms));
            }
        }
        if limited {
            let mut queues: Vec<&QueueName> = wants.iter().map(|w| &w.queue).collect();
            queues.sort();
            queues.dedup();
            // store/limits.rs `caps`: a walk that was cut, and did not fill
            // its asks, comes back in 1 ms.
            let got = |q: &QueueName| out.jobs.iter().filter(|j| j.queue == q.as_str()).count();
            let asked = |q: &QueueName| -> usize {
                wants
                    .iter()
                    .filter(|w| &w.queue == q)
                    .map(|w| w.n.max(0) as usize)
                    .sum()
            };
            out.caps = queues
                .into_iter()
                .map(|q| Cap {
                    queue: q.clone(),
                    unlimited: !self.locked_path(q),
                    handoff: !self.limited(q),
                    retry_ms: (cut.contains(q) && asked(q) > got(q)).then_some(1),
                })
                .collect();
        }
        out
    }

    /// The current lease of `id`, if `token` is it.
    fn holds(&self, id: JobId, token: LeaseToken) -> bool {
        self.jobs
            .get(&id)
            .is_some_and(|r| r.state == State::Leased && r.token == Some(token))
    }

    /// CancelJob (admin.rs `cancel_job`): deletes a live job whatever its
    /// state; returns its row (its lease, if leased).
    pub fn cancel(&mut self, id: JobId) -> Option<Row> {
        self.take(id)
    }

    /// ack.sql: completes jobs whose token is current (expired or not).
    pub fn ack(&mut self, reqs: &[AckReq]) -> Vec<Settled> {
        let mut out = Vec::new();
        for r in reqs {
            if !self.holds(r.job_id, r.token) {
                continue;
            }
            let row = self.take(r.job_id).expect("held");
            self.done.insert(r.job_id);
            // A queue ordered by key and nothing else wakes only when
            // another job of the key waits, and names the key to look
            // again otherwise; a job without a key wakes nobody.
            let c = self.conf(&row.queue);
            let by_key = c.key_n.is_some() && c.concurrency_limit.is_none() && c.walk_n.is_none();
            let (slot_freed, recheck_key) = if !by_key {
                (
                    self.locked_path(&row.queue).then(|| row.queue.clone()),
                    None,
                )
            } else {
                match row.key {
                    None => (None, None),
                    Some(k) if self.key_waits(&row.queue, k) => (Some(row.queue.clone()), None),
                    Some(k) => (None, Some(k.to_string())),
                }
            };
            out.push(Settled {
                id: r.job_id,
                token: r.token,
                broker: row.broker,
                slot_freed,
                queue: row.queue.as_str().to_owned(),
                recheck_key,
            });
        }
        out
    }

    /// fail.sql: nack, release, reap. Retried (after `retry_after_ms`, or
    /// the queue's backoff) or dead-lettered (asked, or the last attempt
    /// unless refunded); a refund gives the attempt back.
    pub fn fail(&mut self, reqs: &[FailReq]) -> Vec<Failed> {
        let mut out = Vec::new();
        for r in reqs {
            if !self.holds(r.id, r.token) {
                continue;
            }
            let conf = {
                let q = self.jobs[&r.id].queue.clone();
                self.conf(&q)
            };
            let now = self.now;
            let row = self.jobs[&r.id].clone();
            let death = if r.dead_letter {
                Some("nacked")
            } else if !r.refund && row.attempt >= conf.max_attempts {
                Some("max_attempts")
            } else {
                None
            };
            let retry_ms = r.retry_after_ms.unwrap_or(conf.backoff_ms);
            let (queue, broker) = (row.queue.clone(), row.broker);
            match death {
                Some(reason) => {
                    self.take(r.id);
                    self.dead.insert(r.id, reason.to_owned());
                }
                None => self.change(r.id, |row| {
                    row.state = State::Available;
                    row.token = None;
                    row.broker = None;
                    if r.refund {
                        row.attempt = (row.attempt - 1).max(0);
                    } else {
                        row.run_at = now + retry_ms as u64;
                    }
                }),
            }
            out.push(Failed {
                id: r.id,
                token: r.token,
                slot_freed: self.locked_path(&queue),
                queue,
                broker,
                death: death.map(str::to_owned),
                retry_ms,
            });
        }
        out
    }

    /// extend.sql: only the current token, and only before its lease ran
    /// out.
    pub fn extend(&mut self, reqs: &[ExtendReq]) -> Vec<Extended> {
        let mut out = Vec::new();
        for r in reqs {
            let now = self.now;
            let Some(row) = self.jobs.get_mut(&r.job_id) else {
                continue;
            };
            if row.token != Some(r.token) || row.state != State::Leased || row.expires <= now {
                continue;
            }
            row.expires = now + r.lease_ms as u64;
            out.push(Extended {
                id: r.job_id,
                token: r.token,
                lease_expires_at: ts(row.expires),
                broker: row.broker,
                lease_ms: r.lease_ms,
            });
        }
        out
    }

    /// expired_leases.sql + lease_status.sql in one snapshot
    /// (`Store::check_leases`): among these jobs, the expired leases (with
    /// their current token), and the given leases still current (ms left).
    pub fn check_leases(&self, leases: &[(JobId, LeaseToken)]) -> Checked {
        let mut expired = Vec::new();
        let mut alive = Vec::new();
        for (id, token) in leases {
            let Some(r) = self.jobs.get(id) else { continue };
            if r.state != State::Leased {
                continue;
            }
            if r.expires <= self.now {
                if !expired.iter().any(|(e, _)| e == id) {
                    expired.push((*id, r.token.expect("leased")));
                }
            } else if r.token == Some(*token) {
                alive.push((*id, (r.expires - self.now) as i64));
            }
        }
        (expired, alive)
    }

    /// The maintenance reaper's expired_leases.sql over the whole table.
    pub fn expired(&self) -> Vec<(JobId, LeaseToken)> {
        self.leased_idx
            .iter()
            .map(|id| (id, &self.jobs[id]))
            .filter(|(_, r)| r.expires <= self.now)
            .map(|(id, r)| (*id, r.token.expect("leased")))
            .collect()
    }

    /// unheard_leases.sql: live leases of `broker` on jobs enqueued more
    /// than `older` ms ago.
    pub fn unheard(&self, broker: Uuid, older: Ms) -> Vec<(JobId, LeaseToken)> {
        self.leased_idx
            .iter()
            .map(|id| (id, &self.jobs[id]))
            .filter(|(_, r)| {
                r.expires > self.now && r.broker == Some(broker) && r.enqueued + older < self.now
            })
            .map(|(id, r)| (*id, r.token.expect("leased")))
            .collect()
    }

    /// next_due.sql.
    pub fn next_due(&self, queues: &[QueueName]) -> Vec<Due> {
        queues
            .iter()
            .map(|q| {
                let from = (self.now + 1, JobId(Uuid::nil()));
                let due_ms = self
                    .due_idx
                    .get(q)
                    .into_iter()
                    .flat_map(|s| s.range(from..))
                    .map(|(_, id)| &self.jobs[id])
                    .find(|r| r.run_at > self.now && r.run_at > r.enqueued)
                    .map(|r| (r.run_at - self.now) as i64);
                Due {
                    queue: q.clone(),
                    due_ms,
                    ready: self.has_ready(q),
                }
            })
            .collect()
    }
}

/// A lease check's answer: the expired leases (with their current
/// token), and the live ones (ms left).
pub type Checked = (Vec<(JobId, LeaseToken)>, Vec<(JobId, i64)>);

/// A consumer name for wants and claims.
pub fn consumer() -> Arc<str> {
    "sim".into()
}
