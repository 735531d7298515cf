//! Admin reads and writes over every cluster (docs/SCALING.md, "Admin
//! calls"): every cluster is asked at once, and the answers merge.
//!
//! When a cluster does not answer (an outage, or no answer within
//! [`FANOUT_TIMEOUT`]):
//! - a **read** over everything (queue statistics, job listings, the
//!   console's in-flight table) answers from the clusters that did, in a
//!   [`Partial`] that names the missing ones, which the API passes on
//!   (`unavailable_clusters` in list responses, the
//!   `leaseq-unavailable-clusters` metadata on every response);
//! - a read that looks for one thing (GetJob, whether a queue exists)
//!   answers when a cluster that answered has it, and otherwise fails with
//!   UNAVAILABLE naming the missing clusters (it cannot say "not found");
//! - a **write** over every cluster (purges, dead-letter requeues) is done
//!   on the clusters that answer and then fails with UNAVAILABLE naming the
//!   others, unless what it was asked for was all found (ids); CancelJob
//!   succeeds where the job was found.
//!
//! Every cluster down is the outage error itself, as with one database. With
//! one database each function is one call of its [`crate::store::admin`]
//! counterpart, without a timeout, exactly as before.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::domain::{JobId, QueueName, QueueRow};
use crate::error::{Error, Result};
use crate::placement::Clusters;
use crate::store::Store;
use crate::store::admin::{self as sql, Cancelled, JobFilter, JobRow, PAGE_PAYLOAD_BUDGET};

/// How long a fan-out waits for one cluster before it counts as missing.
pub const FANOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// The gRPC metadata key naming the clusters a response lacks
/// (comma-separated cluster names); absent when every cluster answered.
pub const UNAVAILABLE_CLUSTERS_HEADER: &str = "leaseq-unavailable-clusters";

/// The merged answer of the clusters that answered, and the names of those
/// that did not (empty: the answer is complete).
#[derive(Clone, Debug, Default)]
pub struct Partial<T> {
    pub value: T,
    pub missing: Vec<String>,
}

impl<T> Partial<T> {
    fn complete(value: T) -> Partial<T> {
        Partial {
            value,
            missing: Vec::new(),
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Partial<U> {
        Partial {
            value: f(self.value),
            missing: self.missing,
        }
    }

    /// UNAVAILABLE naming the missing clusters, if any.
    pub fn missing_error(&self) -> Option<Error> {
        missing_error(&self.missing)
    }
}

fn missing_error(missing: &[String]) -> Option<Error> {
    (!missing.is_empty()).then(|| Error::ClusterUnavailable {
        clusters: missing.join(","),
        source: None,
    })
}

/// Asks every cluster at once (several clusters only); the answers in
/// cluster order. A cluster whose last health probe failed is not asked
/// (it would hold the answer for the pool's acquire timeout): it answers
/// UNAVAILABLE at once, as does one that takes longer than
/// [`FANOUT_TIMEOUT`].
async fn ask<'a, T, F, Fut>(clusters: &'a Clusters, f: F) -> Vec<(&'a Store, Result<T>)>
where
    F: Fn(&'a Store) -> Fut,
    Fut: Future<Output = Result<T>> + 'a,
{
    let runs = clusters.all().iter().map(|store| {
        let fut = f(store);
        async move {
            if store.metrics().clusters.is_down(store.cluster_name()) {
                let r = Err(Error::ClusterUnavailable {
                    clusters: store.cluster_name().to_string(),
                    source: None,
                });
                return (store, r);
            }
            let r = match tokio::time::timeout(FANOUT_TIMEOUT, fut).await {
                Ok(r) => r.map_err(|e| e.on_cluster(store.cluster_name())),
                Err(_) => Err(Error::ClusterUnavailable {
                    clusters: store.cluster_name().to_string(),
                    source: None,
                }),
            };
            (store, r)
        }
    });
    futures_util::future::join_all(runs).await
}

/// The answers of the clusters that answered and the names of those that
/// are unavailable. Any other error is returned; so is an outage of every
/// cluster (naming them all).
#[allow(clippy::type_complexity)]
fn split<T>(answers: Vec<(&Store, Result<T>)>) -> Result<(Vec<(&Store, T)>, Vec<String>)> {
    let mut ok = Vec::new();
    let mut missing = Vec::new();
    for (store, r) in answers {
        match r {
            Ok(v) => ok.push((store, v)),
            Err(e) if e.is_unavailable() => missing.push(store.cluster_name().to_string()),
            Err(e) => return Err(e),
        }
    }
    if ok.is_empty()
        && let Some(e) = missing_error(&missing)
    {
        return Err(e);
    }
    Ok((ok, missing))
}

/// Queue statistics from every cluster, merged by name (a queue has rows on
/// two clusters while its bucket moves: the counts add up, and the settings
/// are those of the cluster it is placed on), in name order.
pub async fn queue_stats(
    clusters: &Clusters,
    names: Option<&[QueueName]>,
    after: Option<&str>,
    limit: i64,
) -> Result<Partial<Vec<QueueRow>>> {
    Ok(queue_page(clusters, names, after, limit)
        .await?
        .map(|(rows, _)| rows))
}

/// [`queue_stats`], and the name to continue after when the page was full
/// (None: the last page). A page may hold fewer than `limit` rows and still
/// not be the last, when queues of a missing cluster were left out of it.
pub async fn queue_page(
    clusters: &Clusters,
    names: Option<&[QueueName]>,
    after: Option<&str>,
    limit: i64,
) -> Result<Partial<(Vec<QueueRow>, Option<String>)>> {
    if clusters.is_single() {
        let rows = sql::queue_stats(clusters.home(), names, after, limit).await?;
        let next = match rows.last() {
            Some(last) if rows.len() as i64 == limit => Some(last.name.clone()),
            _ => None,
        };
        return Ok(Partial::complete((rows, next)));
    }
    let (answers, missing) = split(
        ask(clusters, |store| {
            sql::queue_stats(store, names, after, limit)
        })
        .await,
    )?;
    let mut merged: BTreeMap<String, (bool, QueueRow)> = BTreeMap::new();
    for (store, rows) in answers {
        for row in rows {
            let placed = QueueName::parse(&row.name)
                .is_some_and(|q| clusters.cluster_of(&q) == store.cluster());
            match merged.remove(&row.name) {
                None => {
                    merged.insert(row.name.clone(), (placed, row));
                }
                Some((was_placed, was)) => {
                    let (mut base, other) = if placed && !was_placed {
                        (row, was)
                    } else {
                        (was, row)
                    };
                    base.available += other.available;
                    base.scheduled += other.scheduled;
                    base.leased += other.leased;
                    base.leased_here += other.leased_here;
                    base.dead += other.dead;
                    base.consumers += other.consumers;
                    // Two clusters hold a queue's jobs only while its
                    // bucket moves: a key with jobs on both sides then
                    // counts twice (docs/design/keys.md).
                    base.keys_waiting += other.keys_waiting;
                    base.keys_waiting_capped |= other.keys_waiting_capped;
                    base.keys_leased += other.keys_leased;
                    base.oldest_age_ms = base.oldest_age_ms.max(other.oldest_age_ms);
                    merged.insert(base.name.clone(), (placed || was_placed, base));
                }
            }
        }
    }
    // A queue placed on a cluster that did not answer is left out, not
    // shown with the figures and settings of another cluster's leftovers
    // (a stray row, the source side of a move): it is missing with its
    // cluster.
    let missing_ids: Vec<_> = clusters
        .all()
        .iter()
        .filter(|s| missing.iter().any(|m| **m == **s.cluster_name()))
        .map(|s| s.cluster())
        .collect();
    let page: Vec<QueueRow> = merged
        .into_values()
        .map(|(_, r)| r)
        .take(limit.max(0) as usize)
        .collect();
    let next = match page.last() {
        Some(last) if page.len() as i64 == limit => Some(last.name.clone()),
        _ => None,
    };
    let rows = page
        .into_iter()
        .filter(|r| {
            missing_ids.is_empty()
                || !QueueName::parse(&r.name)
                    .is_some_and(|q| missing_ids.contains(&clusters.cluster_of(&q)))
        })
        .collect();
    Ok(Partial {
        value: (rows, next),
        missing,
    })
}

/// One queue's statistics (from the clusters that answer), or None when no
/// cluster has it. A queue found on no cluster that answered, with some
/// missing, is UNAVAILABLE naming them.
pub async fn queue(clusters: &Clusters, name: &QueueName) -> Result<Partial<Option<QueueRow>>> {
    let found = queue_stats(clusters, Some(std::slice::from_ref(name)), None, 1).await?;
    if found.value.is_empty()
        && let Some(e) = found.missing_error()
    {
        return Err(e);
    }
    Ok(found.map(|mut rows| rows.pop()))
}

/// Whether some cluster has the queue; UNAVAILABLE (naming the missing
/// clusters) when none that answered has it and some did not answer.
pub async fn queue_exists(clusters: &Clusters, name: &QueueName) -> Result<bool> {
    if clusters.is_single() {
        return sql::queue_exists(clusters.home(), name).await;
    }
    let (answers, missing) = split(ask(clusters, |store| sql::queue_exists(store, name)).await)?;
    if answers.iter().any(|(_, found)| *found) {
        return Ok(true);
    }
    match missing_error(&missing) {
        Some(e) => Err(e),
        None => Ok(false),
    }
}

/// The job from whichever cluster has it; UNAVAILABLE (naming the missing
/// clusters) when none that answered has it and some did not answer.
pub async fn get_job(clusters: &Clusters, id: JobId) -> Result<Option<JobRow>> {
    if clusters.is_single() {
        return sql::get_job(clusters.home(), id).await;
    }
    let (answers, missing) = split(ask(clusters, |store| sql::get_job(store, id)).await)?;
    if let Some(job) = answers.into_iter().find_map(|(_, j)| j) {
        return Ok(Some(job));
    }
    match missing_error(&missing) {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// A page of jobs in id order over every cluster that answers (each asked
/// for a page; the merged page keeps the first `limit`, within the payload
/// budget: the same cuts each cluster applied to its own page, so the merged
/// page never passes a row a cluster left out).
pub async fn list_jobs(
    clusters: &Clusters,
    filter: &JobFilter,
    after: Option<Uuid>,
    limit: i64,
    include_payload: bool,
) -> Result<Partial<(Vec<JobRow>, bool)>> {
    if clusters.is_single() {
        let home = clusters.home();
        return Ok(Partial::complete(
            sql::list_jobs(home, filter, after, limit, include_payload).await?,
        ));
    }
    let (answers, missing) = split(
        ask(clusters, |store| {
            sql::list_jobs(store, filter, after, limit, include_payload)
        })
        .await,
    )?;
    let mut rows = Vec::new();
    let mut more = false;
    for (_, (page, m)) in answers {
        more |= m;
        rows.extend(page);
    }
    rows.sort_by_key(|r| r.id);
    let mut bytes = 0i64;
    let mut kept = Vec::new();
    for r in rows {
        if kept.len() as i64 == limit || bytes >= PAGE_PAYLOAD_BUDGET {
            more = true;
            break;
        }
        bytes += r.payload.len() as i64;
        kept.push(r);
    }
    Ok(Partial {
        value: (kept, more),
        missing,
    })
}

/// Per consumer name, how many jobs of the queue it holds, over every
/// cluster that answers (the console's in-flight table).
pub async fn in_flight(
    clusters: &Clusters,
    queue: &QueueName,
) -> Result<Partial<Vec<(String, i64)>>> {
    if clusters.is_single() {
        return Ok(Partial::complete(
            sql::in_flight(clusters.home(), queue).await?,
        ));
    }
    let (answers, missing) = split(ask(clusters, |store| sql::in_flight(store, queue)).await)?;
    let mut merged: BTreeMap<String, i64> = BTreeMap::new();
    for (_, rows) in answers {
        for (consumer, n) in rows {
            *merged.entry(consumer).or_default() += n;
        }
    }
    Ok(Partial {
        value: merged.into_iter().collect(),
        missing,
    })
}

/// Cancels the job on whichever cluster has it (asked at once: a job is on
/// one cluster, or on two for an instant of a bucket move, where only one
/// delete finds it). UNAVAILABLE naming the missing clusters when no
/// cluster that answered had it.
pub async fn cancel_job(clusters: &Clusters, id: JobId) -> Result<Option<Cancelled>> {
    if clusters.is_single() {
        return sql::cancel_job(clusters.home(), id).await;
    }
    let (answers, missing) = split(ask(clusters, |store| sql::cancel_job(store, id)).await)?;
    let mut done: Option<Cancelled> = None;
    for (_, c) in answers {
        done = match (done, c) {
            // Prefer the one that was leased: its stream gets its credit back.
            (Some(d), Some(c)) if d.lease.is_none() => Some(c),
            (d, c) => d.or(c),
        };
    }
    match (done, missing_error(&missing)) {
        (Some(d), _) => Ok(Some(d)),
        (None, Some(e)) => Err(e),
        (None, None) => Ok(None),
    }
}

/// The failed attempts of job `id` on every cluster that answers (a job
/// moved between clusters has the ones of its time on each), oldest first,
/// the latest `limit`.
pub async fn attempt_errors(
    clusters: &Clusters,
    id: JobId,
    limit: i64,
) -> Result<Vec<sql::AttemptError>> {
    if clusters.is_single() {
        return sql::attempt_errors(clusters.home(), id, limit).await;
    }
    let (answers, _missing) =
        split(ask(clusters, |store| sql::attempt_errors(store, id, limit)).await)?;
    let mut all: Vec<sql::AttemptError> = answers.into_iter().flat_map(|(_, e)| e).collect();
    all.sort_by_key(|e| e.at);
    let skip = all.len().saturating_sub(limit.max(0) as usize);
    Ok(all.split_off(skip))
}

/// Requeues dead letters on every cluster (a moving bucket's may be on
/// either side; a job requeued on the side it left is copied over). With a
/// cluster missing: an error naming it, unless every id asked for was found.
pub async fn requeue_dead(
    clusters: &Clusters,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<(Vec<(QueueName, i64)>, i64)> {
    if clusters.is_single() {
        return sql::requeue_dead(clusters.home(), ids, queue).await;
    }
    let (answers, missing) =
        split(ask(clusters, |store| sql::requeue_dead(store, ids, queue)).await)?;
    let mut moved: HashMap<QueueName, i64> = HashMap::new();
    let mut matched = 0;
    for (_, (m, n)) in answers {
        for (q, k) in m {
            *moved.entry(q).or_default() += k;
        }
        matched += n;
    }
    let all_found = ids.is_some_and(|ids| matched as usize >= ids.len());
    if !all_found && let Some(e) = missing_error(&missing) {
        return Err(e);
    }
    Ok((moved.into_iter().collect(), matched))
}

/// Deletes dead letters on every cluster. With a cluster missing: an error
/// naming it, unless every id asked for was deleted.
pub async fn purge_dead(
    clusters: &Clusters,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<u64> {
    if clusters.is_single() {
        return sql::purge_dead(clusters.home(), ids, queue).await;
    }
    let (answers, missing) =
        split(ask(clusters, |store| sql::purge_dead(store, ids, queue)).await)?;
    let n: u64 = answers.iter().map(|(_, n)| n).sum();
    let all_found = ids.is_some_and(|ids| n as usize >= ids.len());
    if !all_found && let Some(e) = missing_error(&missing) {
        return Err(e);
    }
    Ok(n)
}

/// Purges the queue on every cluster; None when none has it. With a cluster
/// missing: purged on the others, then an error naming it (a purge may be
/// repeated).
pub async fn purge_queue(clusters: &Clusters, name: &QueueName) -> Result<Option<sql::Purged>> {
    if clusters.is_single() {
        return sql::purge_queue(clusters.home(), name).await;
    }
    let (answers, missing) = split(ask(clusters, |store| sql::purge_queue(store, name)).await)?;
    if let Some(e) = missing_error(&missing) {
        return Err(e);
    }
    let mut out: Option<sql::Purged> = None;
    for (_, p) in answers {
        if let Some(p) = p {
            out = Some(match out {
                None => p,
                Some(o) => sql::Purged {
                    waiting: o.waiting + p.waiting,
                    completed: o.completed + p.completed,
                },
            });
        }
    }
    Ok(out)
}

/// A page of a queue's keys over every cluster that answers (a queue's jobs
/// are on two clusters only while its bucket moves: a key's counts then add
/// up). Each cluster is asked for a page; the merged page keeps the first
/// `limit` by the order asked. Merged pages of several clusters are in byte
/// order (a key is compared in Rust, not by the database's collation): with
/// a collation other than C, a key may then show on two pages or on none
/// while the move lasts.
pub async fn list_keys(
    clusters: &Clusters,
    queue: &QueueName,
    order: sql::KeyOrder,
    after: Option<&str>,
    limit: i64,
) -> Result<Partial<(Vec<sql::KeyRow>, bool)>> {
    if clusters.is_single() {
        return Ok(Partial::complete(
            sql::list_keys(clusters.home(), queue, order, after, limit).await?,
        ));
    }
    let (answers, missing) = split(
        ask(clusters, |store| {
            sql::list_keys(store, queue, order, after, limit)
        })
        .await,
    )?;
    let mut more = false;
    let with_rows: Vec<_> = answers
        .into_iter()
        .filter_map(|(_, (rows, m))| {
            more |= m;
            (!rows.is_empty()).then_some(rows)
        })
        .collect();
    if with_rows.len() <= 1 {
        let rows = with_rows.into_iter().next().unwrap_or_default();
        return Ok(Partial {
            value: (rows, more),
            missing,
        });
    }
    let mut merged: BTreeMap<String, sql::KeyRow> = BTreeMap::new();
    for row in with_rows.into_iter().flatten() {
        match merged.get_mut(&row.key) {
            None => {
                merged.insert(row.key.clone(), row);
            }
            Some(m) => {
                m.waiting += row.waiting;
                m.leased += row.leased;
                m.oldest_age_ms = m.oldest_age_ms.max(row.oldest_age_ms);
            }
        }
    }
    let mut rows: Vec<sql::KeyRow> = merged.into_values().collect();
    if order == sql::KeyOrder::Waiting {
        rows.sort_by(|a, b| b.waiting.cmp(&a.waiting).then_with(|| a.key.cmp(&b.key)));
    }
    if rows.len() as i64 > limit {
        rows.truncate(limit.max(0) as usize);
        more = order == sql::KeyOrder::Key;
    }
    Ok(Partial {
        value: (rows, more),
        missing,
    })
}
