//! Admin reads and writes over every cluster (docs/SCALING.md, "Admin
//! calls"): each is asked, and the answers merge. A cluster that does not
//! answer fails the call (UNAVAILABLE) rather than leave a hole in a list
//! that looks complete. With one database each function is one call of its
//! [`crate::store::admin`] counterpart.

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::domain::{JobId, QueueName, QueueRow};
use crate::error::Result;
use crate::placement::Clusters;
use crate::store::admin::{self as sql, Cancelled, JobRow, JobState, PAGE_PAYLOAD_BUDGET};

/// Queue statistics from every cluster, merged by name (a queue has rows on
/// two clusters while its bucket moves: the counts add up, and the settings
/// are those of the cluster it is placed on), in name order.
pub async fn queue_stats(
    clusters: &Clusters,
    names: Option<&[QueueName]>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<QueueRow>> {
    if clusters.is_single() {
        return sql::queue_stats(clusters.home(), names, after, limit).await;
    }
    let mut merged: BTreeMap<String, (bool, QueueRow)> = BTreeMap::new();
    for store in clusters.all() {
        for row in sql::queue_stats(store, names, after, limit).await? {
            let placed = QueueName::parse(&row.name)
                .is_some_and(|q| clusters.cluster_of(&q) == store.cluster);
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
                    base.oldest_age_ms = base.oldest_age_ms.max(other.oldest_age_ms);
                    merged.insert(base.name.clone(), (placed || was_placed, base));
                }
            }
        }
    }
    Ok(merged
        .into_values()
        .map(|(_, r)| r)
        .take(limit.max(0) as usize)
        .collect())
}

/// One queue's statistics, or None when no cluster has it.
pub async fn queue(clusters: &Clusters, name: &QueueName) -> Result<Option<QueueRow>> {
    Ok(
        queue_stats(clusters, Some(std::slice::from_ref(name)), None, 1)
            .await?
            .pop(),
    )
}

pub async fn queue_exists(clusters: &Clusters, name: &QueueName) -> Result<bool> {
    for store in clusters.all() {
        if sql::queue_exists(store, name).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The job from whichever cluster has it.
pub async fn get_job(clusters: &Clusters, id: JobId) -> Result<Option<JobRow>> {
    for store in clusters.all() {
        if let Some(job) = sql::get_job(store, id).await? {
            return Ok(Some(job));
        }
    }
    Ok(None)
}

/// A page of jobs in id order over every cluster (each asked for a page;
/// the merged page keeps the first `limit`, within the payload budget).
pub async fn list_jobs(
    clusters: &Clusters,
    queue: Option<&QueueName>,
    state: Option<JobState>,
    after: Option<Uuid>,
    limit: i64,
    include_payload: bool,
) -> Result<(Vec<JobRow>, bool)> {
    if clusters.is_single() {
        let home = clusters.home();
        return sql::list_jobs(home, queue, state, after, limit, include_payload).await;
    }
    let mut rows = Vec::new();
    let mut more = false;
    for store in clusters.all() {
        let (page, m) = sql::list_jobs(store, queue, state, after, limit, include_payload).await?;
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
    Ok((kept, more))
}

/// Cancels the job on whichever cluster has it.
pub async fn cancel_job(clusters: &Clusters, id: JobId) -> Result<Option<Cancelled>> {
    for store in clusters.all() {
        if let Some(done) = sql::cancel_job(store, id).await? {
            return Ok(Some(done));
        }
    }
    Ok(None)
}

/// Requeues dead letters on every cluster (a moving bucket's may be on
/// either side; a job requeued on the side it left is copied over).
pub async fn requeue_dead(
    clusters: &Clusters,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<(Vec<(QueueName, i64)>, i64)> {
    let mut moved = Vec::new();
    let mut matched = 0;
    for store in clusters.all() {
        let (m, n) = sql::requeue_dead(store, ids, queue).await?;
        moved.extend(m);
        matched += n;
    }
    Ok((moved, matched))
}

pub async fn purge_dead(
    clusters: &Clusters,
    ids: Option<&[JobId]>,
    queue: Option<&QueueName>,
) -> Result<u64> {
    let mut n = 0;
    for store in clusters.all() {
        n += sql::purge_dead(store, ids, queue).await?;
    }
    Ok(n)
}

/// Purges the queue on every cluster; None when none has it.
pub async fn purge_queue(clusters: &Clusters, name: &QueueName) -> Result<Option<sql::Purged>> {
    let mut out: Option<sql::Purged> = None;
    for store in clusters.all() {
        if let Some(p) = sql::purge_queue(store, name).await? {
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
