//! Per-queue concurrency and rate limits, enforced in the lease path across
//! every replica.
//!
//! Unlimited queues are leased by one statement with no queue lock
//! ([`Store::lease`]); it skips queues that have limits and names them, and
//! the dispatcher sends those here. A limited round is one transaction:
//!
//! 1. lock the queues' rows (`for update`, in name order): replicas leasing
//!    the same limited queue take turns;
//! 2. read what the limits allow (`limits.sql`) in a snapshot taken after
//!    the lock, so the previous holder's leases and bucket are seen (not
//!    when no queue of the round has a limit: one ordered by key only);
//! 3. lease at most that many (`lease.sql`, asks trimmed);
//! 4. take the leased jobs out of the rate buckets; commit.
//!
//! The transaction is begun with its `lock_timeout` in the same round trip.
//! The queues' rows are waited for at most [`LOCK_WAIT`]: they are held for
//! a statement's time by other replicas' limited rounds, but an operator's
//! open transaction could hold one for ever, and a round waiting on it
//! holds one of the dispatcher's two lease statements. Past the wait the
//! round leases nothing for those queues and the dispatcher comes back to
//! them a wait later.
//!
//! A queue ordered by key comes here too, with or without limits: its key
//! rule (lease.sql) reads which jobs of a key are live, and two rounds
//! with snapshots taken apart could each lease a job of one key (a job
//! enqueued with a smaller id committing between them). Under the queue's
//! lock each round sees the previous one's leases.
//!
//! A concurrency limit counts unexpired leases, so at no moment do more than
//! `concurrency_limit` consumers hold a job of the queue. A slot that frees
//! (ack, nack, dead letter, reaped lease) wakes every replica's streams on
//! the queue (see `wakes_for` and the ack path). A rate limit is a token
//! bucket: when a round was cut by it, the dispatcher comes back when the
//! next token is due.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::{LeaseRow, Store};
use crate::domain::{Cap, LeaseOutcome, QueueName, Want};
use crate::error::Result;

struct Allowance {
    /// Jobs the round may lease (None = no limit applies).
    n: Option<i64>,
    rate: Option<f64>,
    tokens: Option<f64>,
    at: DateTime<Utc>,
    paused: bool,
    /// Ordered by key: leased here, under the queue's lock, with no limit
    /// of its own (lease.sql's key rule).
    ordered: bool,
    /// Per-key limits or fair shares: leased by the key walk
    /// (`lease_keys.sql`), one statement per queue.
    walks: bool,
}

/// Why a key walk may have left due jobs behind.
#[derive(Default)]
struct Held {
    /// It visited as many keys as it could.
    walk_cut: bool,
    /// A key's rate bucket held jobs back: its next token is due in this
    /// many ms.
    token_ms: Option<i64>,
}

/// Longest wait for the limited queues' rows (see the module docs).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Store {
    /// Leases for queues that have limits (see the module docs).
    pub async fn lease_limited(&self, wants: &[Want]) -> Result<LeaseOutcome> {
        let names: Vec<&str> = wants
            .iter()
            .map(|w| w.queue.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut c = self.conns.acquire().await?;
        let names_ = &names;
        let locked = c
            .bounded(|c| async move {
                // The wait for the rows is bounded from the BEGIN on (one
                // round trip for both).
                let mut tx = sqlx::Connection::begin_with(
                    c,
                    sqlx::AssertSqlSafe(format!(
                        "begin; set local lock_timeout = '{}ms'",
                        LOCK_WAIT.as_millis()
                    )),
                )
                .await?;
                // 1. Lock.
                let Some(locked) = lock_queues(&mut tx, names_).await? else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                // 2. What the limits allow: nothing to read for queues
                // without limits (ordered by key only).
                let allow = if locked.iter().any(|q| q.limited) {
                    allowances(&mut tx, names_).await?
                } else {
                    locked.into_iter().map(Locked::allowance).collect()
                };
                // 3. Lease that much.
                let (asked, trimmed) = trim(wants, &allow);
                let mut out = LeaseOutcome::default();
                let (walking, rest): (Vec<Want>, Vec<Want>) = trimmed
                    .into_iter()
                    .partition(|w| allow.get(w.queue.as_str()).is_some_and(|a| a.walks));
                if !rest.is_empty() {
                    for row in self.lease_rows(&mut *tx, &rest, true).await? {
                        if let LeaseRow::Job(j) = row {
                            out.jobs.push(j);
                        }
                    }
                }
                let mut held = HashMap::new();
                for queue in walking.iter().map(|w| &w.queue).collect::<BTreeSet<_>>() {
                    let asks: Vec<Want> = walking
                        .iter()
                        .filter(|w| &w.queue == queue)
                        .cloned()
                        .collect();
                    let (jobs, h) = self.lease_keys(&mut tx, queue, &asks).await?;
                    out.jobs.extend(jobs);
                    held.insert(queue.as_str().to_owned(), h);
                }
                // 4. Take what was leased out of the rate buckets.
                take_tokens(&mut tx, &allow, &leased_per_queue(&out)).await?;
                tx.commit().await?;
                Ok::<_, crate::error::Error>(Some((allow, asked, out, held)))
            })
            .await?;
        c.done();
        let Some((allow, asked, mut out, held)) = locked else {
            // Nothing leased; the dispatcher comes back after another wait.
            tracing::warn!(queues = ?names, "a limited queue's row stayed locked; its lease round waits");
            return Ok(LeaseOutcome {
                caps: names
                    .iter()
                    .filter_map(|n| QueueName::parse(n))
                    .map(|queue| Cap {
                        queue,
                        unlimited: false,
                        handoff: false,
                        retry_ms: Some(LOCK_WAIT.as_millis() as i64),
                    })
                    .collect(),
                ..LeaseOutcome::default()
            });
        };
        let got = leased_per_queue(&out);
        let caps = caps(&allow, &asked, &got, &held);
        out.caps.extend(caps);
        Ok(out)
    }
}

/// A queue row as locked: the version the lock holds, so the previous
/// holder's changes are in it.
struct Locked {
    name: String,
    /// A concurrency or rate limit: `limits.sql` says what it allows.
    limited: bool,
    paused: bool,
    ordered: bool,
    /// Per-key limits or fair shares: leased by the key walk
    /// (`leaseq.walks_keys`).
    walks: bool,
}

impl Locked {
    /// What a queue without limits allows: no cut.
    fn allowance(self) -> (String, Allowance) {
        (
            self.name,
            Allowance {
                n: None,
                rate: None,
                tokens: None,
                at: Utc::now(),
                paused: self.paused,
                ordered: self.ordered,
                walks: self.walks,
            },
        )
    }
}

/// Locks the queues' rows in name order (the transaction's lock_timeout
/// bounds the wait: [`LOCK_WAIT`]); None when a row stayed locked past it.
async fn lock_queues(tx: &mut sqlx::PgConnection, names: &[&str]) -> Result<Option<Vec<Locked>>> {
    let locked = sqlx::query_as!(
        Locked,
        "select name, paused, ordered_by_key as ordered, \
             (concurrency_limit is not null or rate_limit is not null) as \"limited!\", \
             leaseq.walks_keys(q) as \"walks!\" \
         from leaseq.queues q where name = any($1) order by name for update",
        names as &[&str],
    )
    .fetch_all(&mut *tx)
    .await;
    if let Err(sqlx::Error::Database(e)) = &locked
        && e.code().as_deref() == Some("55P03")
    {
        // lock_not_available: a row held past the wait.
        return Ok(None);
    }
    Ok(Some(locked?))
}

/// What the limits of each queue allow this round (`limits.sql`).
async fn allowances(
    tx: &mut sqlx::PgConnection,
    names: &[&str],
) -> Result<HashMap<String, Allowance>> {
    let mut allow: HashMap<String, Allowance> = HashMap::new();
    for r in sqlx::query_file!("src/store/sql/limits.sql", names as &[&str])
        .fetch_all(&mut *tx)
        .await?
    {
        let slots: Option<i64> = r.slots;
        let tokens: Option<f64> = r.tokens;
        let by_rate = tokens.map(|t| t.floor() as i64);
        let n = match (slots, by_rate) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        allow.insert(
            r.name,
            Allowance {
                n: n.map(|n| n.max(0)),
                rate: r.rate_limit,
                tokens,
                at: r.at,
                paused: r.paused,
                ordered: r.ordered_by_key,
                walks: r.walks_keys,
            },
        );
    }
    Ok(allow)
}

/// The asks cut to what `allow` allows, and how much each queue asked.
fn trim<'w>(
    wants: &'w [Want],
    allow: &HashMap<String, Allowance>,
) -> (HashMap<&'w QueueName, i64>, Vec<Want>) {
    // Each queue's asks are numbered (lo, hi] in delivery order: keep the
    // first `n` of them.
    let mut asked: HashMap<&QueueName, i64> = HashMap::new();
    let mut trimmed = Vec::with_capacity(wants.len());
    for w in wants {
        let lo = *asked.get(&w.queue).unwrap_or(&0);
        asked.insert(&w.queue, lo + i64::from(w.n));
        let cap = allow
            .get(w.queue.as_str())
            .and_then(|a| a.n)
            .unwrap_or(i64::MAX);
        let n = (lo + i64::from(w.n)).min(cap) - lo;
        if n > 0 {
            trimmed.push(Want {
                n: n as i32,
                ..w.clone()
            });
        }
    }
    (asked, trimmed)
}

/// Jobs leased per queue.
fn leased_per_queue(out: &LeaseOutcome) -> HashMap<&str, i64> {
    let mut got: HashMap<&str, i64> = HashMap::new();
    for j in &out.jobs {
        *got.entry(j.queue.as_str()).or_default() += 1;
    }
    got
}

/// Takes the jobs leased (`got`) out of the queues' rate buckets.
async fn take_tokens(
    tx: &mut sqlx::PgConnection,
    allow: &HashMap<String, Allowance>,
    got: &HashMap<&str, i64>,
) -> Result<()> {
    let (mut bq, mut bt, mut ba) = (Vec::new(), Vec::new(), Vec::new());
    for (name, a) in allow {
        if let Some(t) = a.tokens {
            bq.push(name.as_str());
            bt.push(t - *got.get(name.as_str()).unwrap_or(&0) as f64);
            ba.push(a.at);
        }
    }
    if !bq.is_empty() {
        sqlx::query!(
            "update leaseq.queues q set rate_tokens = u.tokens, rate_at = u.at \
             from unnest($1::text[], $2::float8[], $3::timestamptz[]) as u(name, tokens, at) \
             where q.name = u.name",
            &bq as &Vec<&str>,
            &bt,
            &ba,
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// How the limits shaped the round, per limited queue: whether it has
/// limits still, and when a rate limit lets it lease again.
fn caps(
    allow: &HashMap<String, Allowance>,
    asked: &HashMap<&QueueName, i64>,
    got: &HashMap<&str, i64>,
    held: &HashMap<String, Held>,
) -> Vec<Cap> {
    let mut caps = Vec::new();
    for (name, a) in allow {
        let Some(queue) = QueueName::parse(name) else {
            continue;
        };
        let leased = *got.get(name.as_str()).unwrap_or(&0);
        let wanted = *asked.get(&queue).unwrap_or(&0);
        // Cut by the rate limit: it allowed less than was asked and all
        // of that was taken. Come back when the next token is due.
        let retry_ms = match (a.rate, a.tokens) {
            (Some(rate), Some(tokens)) if !a.paused && wanted > leased => {
                let left = tokens - leased as f64;
                (left < 1.0).then(|| ((1.0 - left) / rate * 1000.0).ceil().max(1.0) as i64)
            }
            _ => None,
        };
        // A key walk that stopped at its last visit, or met keys out of
        // tokens, comes back: at once (to visit the next keys), or when the
        // next token is due.
        let walk_ms = held
            .get(name.as_str())
            .filter(|_| wanted > leased)
            .and_then(|h| {
                if h.walk_cut {
                    Some(1)
                } else {
                    h.token_ms.map(|ms| ms.max(1))
                }
            });
        let retry_ms = match (retry_ms, walk_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        caps.push(Cap {
            unlimited: a.n.is_none() && a.rate.is_none() && !a.ordered && !a.walks,
            // Ordered by key only: enqueue.sql hands a job off when its key
            // is free, under the queue row's lock. Never a queue whose keys
            // have limits or fair shares (the walk decides).
            handoff: a.n.is_none() && a.rate.is_none() && !a.walks,
            queue,
            retry_ms,
        });
    }
    caps
}

impl Store {
    /// Leases the asks of one queue whose keys have limits or fair shares
    /// (`lease_keys.sql`), under its row's lock.
    async fn lease_keys(
        &self,
        tx: &mut sqlx::PgConnection,
        queue: &QueueName,
        wants: &[Want],
    ) -> Result<(Vec<crate::domain::Leased>, Held)> {
        let mut lo = Vec::with_capacity(wants.len());
        let mut hi = Vec::with_capacity(wants.len());
        let mut lease = Vec::with_capacity(wants.len());
        let mut slot = Vec::with_capacity(wants.len());
        let mut consumer = Vec::with_capacity(wants.len());
        let mut n = 0;
        for w in wants {
            lo.push(n);
            hi.push(n + w.n);
            n += w.n;
            lease.push(w.lease_ms);
            slot.push(w.slot);
            consumer.push(&*w.consumer);
        }
        // Visit twice as many keys as jobs asked for: keys at their limit
        // give none, and the next round starts after the last key served.
        let visits = (2 * n).clamp(2, MAX_KEY_VISITS);
        let rows = sqlx::query_file!(
            "src/store/sql/lease_keys.sql",
            queue.as_str(),
            &lo,
            &hi,
            &lease as &Vec<Option<i64>>,
            &slot,
            &consumer as &Vec<&str>,
            self.broker_id,
            visits,
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut held = Held::default();
        let mut jobs = Vec::with_capacity(rows.len());
        for r in rows {
            if r.slot.is_some_and(|s| s < 0) {
                held.walk_cut = r.walk_cut.unwrap_or(false);
                held.token_ms = r.token_ms;
                continue;
            }
            jobs.push(leased_row!(self, r));
        }
        Ok((jobs, held))
    }
}

/// Most keys one walk visits (`lease_keys.sql`).
const MAX_KEY_VISITS: i32 = 2048;
