//! Moving **stray** jobs to their queue's cluster (docs/SCALING.md, "Stray
//! jobs"): waiting jobs and dead letters sitting on a cluster that does not
//! hold their queue, left by a broker that enqueued by an old map after a
//! move had ended, or by `leaseq.enqueue()` called on the wrong database.

use std::ops::ControlFlow;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Clusters, Map, bucket_of, epoch, load};
use crate::domain::ClusterId;
use crate::error::Result;
use crate::store::placement::{self as sql, Table};
use crate::tick::Ticks;

/// What one sweep moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Queues that had stray jobs or dead letters.
    pub queues: usize,
    pub jobs: u64,
    pub dead: u64,
}

/// Moves stray jobs to their queue's cluster. They move exactly as a bucket
/// move copies (row locks on the source, tombstones on the destination),
/// so none is lost or delivered twice, and every broker may sweep at once.
/// Buckets being moved are left to their mover; leased jobs stay where
/// their token says until they are settled (a nacked or expired one is
/// swept by a later pass). A pass stops as soon as the placement changed
/// under it (the next pass uses the new map). `clusters` is every cluster,
/// home first (the map is read from home).
pub async fn sweep(clusters: &[(ClusterId, PgPool)], batch: i64) -> Result<Swept> {
    let mut swept = Swept::default();
    if clusters.len() < 2 {
        return Ok(swept);
    }
    let home = &clusters[0].1;
    let map = load(home).await?;
    for (id, pool) in clusters {
        for (q, owner) in strays_on(pool, *id, &map).await? {
            let Some((_, dest)) = clusters.iter().find(|(c, _)| *c == owner) else {
                continue;
            };
            let queues = [q];
            // The queue's own cluster's settings stand.
            sql::copy_queue_rows(pool, dest, &queues, false).await?;
            let moved =
                copy_strays(home, map.epoch, pool, dest, &queues, batch, &mut swept).await?;
            let ControlFlow::Continue(any) = moved else {
                return Ok(swept);
            };
            if any {
                swept.queues += 1;
                info!(queue = %queues[0], from = %id, to = %owner, "stray jobs moved to their queue's cluster");
            }
        }
    }
    Ok(swept)
}

/// The queues with waiting jobs or dead letters on cluster `id` that `map`
/// places on another cluster, with that cluster. A cluster that does not
/// answer has none (it is swept when it is back).
async fn strays_on(pool: &PgPool, id: ClusterId, map: &Map) -> Result<Vec<(String, ClusterId)>> {
    let mut strays: Vec<(String, ClusterId)> = Vec::new();
    for table in [Table::Jobs, Table::DeadJobs] {
        let held = match sql::queues_holding(pool, table).await {
            Ok(q) => q,
            // A cluster that is down is swept when it is back.
            Err(e) if e.is_unavailable() => continue,
            Err(e) => return Err(e),
        };
        for q in held {
            let owner = map.cluster_of(&q);
            let moving = map.pinned(&q).is_none() && map.moving.contains_key(&bucket_of(&q));
            if owner != id && !moving && !strays.iter().any(|(s, _)| *s == q) {
                strays.push((q, owner));
            }
        }
    }
    Ok(strays)
}

/// Copies one queue's waiting jobs and dead letters from `pool` to `dest`
/// in batches, counting them in `swept`; whether any moved. Breaks as soon
/// as home's epoch is no longer `epoch_read` (the map the pass read).
async fn copy_strays(
    home: &PgPool,
    epoch_read: i64,
    pool: &PgPool,
    dest: &PgPool,
    queues: &[String],
    batch: i64,
    swept: &mut Swept,
) -> Result<ControlFlow<(), bool>> {
    let mut any = false;
    for table in [Table::Jobs, Table::DeadJobs] {
        loop {
            // Placement changed: the owner may be another now.
            if epoch(home).await? != epoch_read {
                return Ok(ControlFlow::Break(()));
            }
            let n = sql::copy_batch(pool, dest, queues, table, batch).await?;
            if table == Table::Jobs {
                swept.jobs += n;
                if n > 0 {
                    sql::wake(dest, queues).await;
                }
            } else {
                swept.dead += n;
            }
            any |= n > 0;
            if (n as i64) < batch {
                break;
            }
        }
    }
    Ok(ControlFlow::Continue(any))
}

/// Sweeps every `interval` until `stop` ([`sweep`]).
pub(crate) async fn sweep_loop(clusters: Clusters, interval: Duration, stop: CancellationToken) {
    let pools: Vec<(ClusterId, PgPool)> = clusters
        .all()
        .iter()
        .map(|s| (s.cluster(), s.pool().clone()))
        .collect();
    // Not at start: the placement was just read, other brokers start too.
    let mut ticks = Ticks::after_one(interval, &stop);
    while ticks.next().await {
        let pass = tokio::select! {
            _ = stop.cancelled() => break,
            r = sweep(&pools, 500) => r,
        };
        if let Err(e) = pass {
            warn!(error = %e, "stray-job sweep failed; retrying at the next interval");
        }
    }
}
