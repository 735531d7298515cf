//! Queues over several PostgreSQL clusters (docs/SCALING.md).
//!
//! A queue's **bucket** is FNV-1a of its name modulo [`BUCKETS`]; the home
//! cluster's `leaseq.placement` maps buckets to clusters, `placement_pins`
//! override it for chosen queues, and `placement_epoch` says when either
//! changed. [`Clusters`] holds one [`Store`] per cluster and the current
//! [`Map`]; everything that must pick a cluster asks it: by queue (enqueue,
//! lease rounds, queue-scoped admin calls) or by the cluster id carried in a
//! lease token (settles).
//!
//! A broker given one database has one store and a map that sends
//! everything home; no placement table is read ([`Clusters::single`]).
//!
//! [`move_bucket`] moves a bucket between clusters without losing or
//! duplicating a job (the protocol is in docs/SCALING.md).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::domain::{ClusterId, QueueName};
use crate::error::{Error, Result};
use crate::store::Store;

/// The name of the only cluster of a single-database broker.
pub const HOME_NAME: &str = "main";
/// Fixed for the life of a deployment: a queue's bucket never changes.
pub const BUCKETS: u32 = 1024;

/// A queue's bucket: FNV-1a (32-bit) of its name, modulo [`BUCKETS`].
pub fn bucket_of(queue: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in queue.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % BUCKETS
}

/// A cluster name: what `--database-url NAME=URI` may say.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// One placement: where each queue lives, as of `epoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Map {
    pub epoch: i64,
    /// Indexed by bucket.
    pub buckets: Vec<ClusterId>,
    /// Buckets being moved, and where to (enqueues and leases go there).
    pub moving: HashMap<u32, ClusterId>,
    /// (pattern, cluster): a queue name, or a prefix ending in `*`.
    pub pins: Vec<(String, ClusterId)>,
}

impl Map {
    /// Everything on the home cluster.
    pub fn home_only() -> Map {
        Map {
            epoch: 0,
            buckets: vec![ClusterId::HOME; BUCKETS as usize],
            moving: HashMap::new(),
            pins: Vec::new(),
        }
    }

    /// The cluster that takes the queue's new jobs and lease rounds.
    pub fn cluster_of(&self, queue: &str) -> ClusterId {
        if let Some(c) = self.pinned(queue) {
            return c;
        }
        let b = bucket_of(queue);
        self.moving
            .get(&b)
            .copied()
            .unwrap_or(self.buckets[b as usize])
    }

    /// The longest pin matching the queue, if any.
    pub fn pinned(&self, queue: &str) -> Option<ClusterId> {
        self.pins
            .iter()
            .filter(|(p, _)| match p.strip_suffix('*') {
                Some(prefix) => queue.starts_with(prefix),
                None => p == queue,
            })
            .max_by_key(|(p, _)| p.len())
            .map(|(_, c)| *c)
    }
}

/// The clusters of one broker and their current placement. Cheap to clone.
#[derive(Clone)]
pub struct Clusters {
    inner: Arc<Inner>,
}

struct Inner {
    /// Home first.
    stores: Vec<Store>,
    by_id: HashMap<ClusterId, usize>,
    map: RwLock<Arc<Map>>,
}

impl std::fmt::Debug for Clusters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clusters")
            .field("clusters", &self.inner.stores.len())
            .finish()
    }
}

impl Clusters {
    /// One database: everything routes to it.
    pub fn single(store: Store) -> Clusters {
        Clusters::new(vec![store], Map::home_only())
    }

    /// `stores` with home first.
    pub fn new(stores: Vec<Store>, map: Map) -> Clusters {
        let by_id = stores
            .iter()
            .enumerate()
            .map(|(i, s)| (s.cluster, i))
            .collect();
        Clusters {
            inner: Arc::new(Inner {
                stores,
                by_id,
                map: RwLock::new(Arc::new(map)),
            }),
        }
    }

    pub fn is_single(&self) -> bool {
        self.inner.stores.len() == 1
    }

    pub fn home(&self) -> &Store {
        &self.inner.stores[0]
    }

    pub fn all(&self) -> &[Store] {
        &self.inner.stores
    }

    /// The store of a cluster id (from a lease token); None if this broker
    /// has no such cluster.
    pub fn get(&self, id: ClusterId) -> Option<&Store> {
        self.inner.by_id.get(&id).map(|&i| &self.inner.stores[i])
    }

    /// The cluster id that takes the queue's new jobs and lease rounds.
    pub fn cluster_of(&self, queue: &QueueName) -> ClusterId {
        if self.is_single() {
            return self.home().cluster;
        }
        self.map().cluster_of(queue.as_str())
    }

    /// The store of the queue's cluster.
    pub fn store_for(&self, queue: &QueueName) -> Result<&Store> {
        let id = self.cluster_of(queue);
        self.get(id).ok_or(Error::ClusterUnknown(id.0))
    }

    pub fn map(&self) -> Arc<Map> {
        self.inner.map.read().expect("poisoned").clone()
    }

    pub fn set_map(&self, map: Map) {
        *self.inner.map.write().expect("poisoned") = Arc::new(map);
    }

    /// Splits `items` by cluster, keeping their order within each group.
    pub fn group<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        cluster: impl Fn(&T) -> ClusterId,
    ) -> Vec<(ClusterId, Vec<T>)> {
        let mut out: Vec<(ClusterId, Vec<T>)> = Vec::new();
        for item in items {
            let c = cluster(&item);
            match out.iter_mut().find(|(id, _)| *id == c) {
                Some((_, v)) => v.push(item),
                None => out.push((c, vec![item])),
            }
        }
        out
    }
}

/// Advisory lock key held while a broker sets up the placement tables
/// (`lqplace` in ASCII).
const SETUP_LOCK: i64 = 0x6c71706c616365;

/// On the home cluster: gives each name (home first) its id, creating ids
/// for new names, and writes the first map if there is none (spread over the
/// clusters for a new deployment, all home for one that has queues already).
/// Returns the ids in the order of `names`.
pub async fn setup(home: &PgPool, names: &[String]) -> anyhow::Result<Vec<ClusterId>> {
    let mut tx = home.begin().await?;
    sqlx::query!("select pg_advisory_xact_lock($1)", SETUP_LOCK)
        .execute(&mut *tx)
        .await?;
    let known = sqlx::query!("select id, name from leaseq.placement_clusters")
        .fetch_all(&mut *tx)
        .await?;
    let mut known: HashMap<String, i16> = known.into_iter().map(|r| (r.name, r.id)).collect();
    let mut ids = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let id = match known.get(name) {
            Some(&id) => id,
            None if i == 0 => {
                if let Some((other, _)) = known.iter().find(|(_, id)| **id == 0) {
                    anyhow::bail!(
                        "the home cluster (the first --database-url) is {other:?}, not {name:?}"
                    );
                }
                0
            }
            None => known.values().copied().max().unwrap_or(0).max(0) + 1,
        };
        if i == 0 && id != 0 {
            anyhow::bail!(
                "{name:?} is not the home cluster: give the home cluster's URL first (the one holding the placement)"
            );
        }
        if !known.contains_key(name) {
            sqlx::query!(
                "insert into leaseq.placement_clusters (id, name) values ($1, $2)",
                id,
                name,
            )
            .execute(&mut *tx)
            .await?;
            known.insert(name.clone(), id);
        }
        ids.push(ClusterId(id as u16));
    }
    let mapped: i64 = sqlx::query_scalar!(r#"select count(*) as "count!" from leaseq.placement"#)
        .fetch_one(&mut *tx)
        .await?;
    if mapped == 0 {
        let has_queues: bool =
            sqlx::query_scalar!(r#"select exists (select 1 from leaseq.queues) as "exists!""#)
                .fetch_one(&mut *tx)
                .await?;
        // An upgrade keeps every existing queue where its jobs are; a new
        // deployment spreads the buckets.
        let over: Vec<i16> = if has_queues {
            vec![0]
        } else {
            ids.iter().map(|c| c.0 as i16).collect()
        };
        let clusters: Vec<i16> = (0..BUCKETS as usize)
            .map(|b| over[b % over.len()])
            .collect();
        sqlx::query!(
            "insert into leaseq.placement (bucket, cluster) \
             select b - 1, c from unnest($1::int2[]) with ordinality as u(c, b)",
            &clusters,
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "insert into leaseq.placement_epoch (epoch) values (1) \
             on conflict (one) do update set epoch = leaseq.placement_epoch.epoch + 1",
        )
        .execute(&mut *tx)
        .await?;
        info!(
            spread_over = over.len(),
            upgrade = has_queues,
            "placement: first bucket map written"
        );
    }
    tx.commit().await?;
    Ok(ids)
}

/// On each cluster: checks that the database knows itself as this cluster
/// (recording it the first time).
pub async fn check_identity(pool: &PgPool, id: ClusterId, name: &str) -> anyhow::Result<()> {
    sqlx::query!(
        "insert into leaseq.cluster_identity (id, name) values ($1, $2) on conflict (one) do nothing",
        id.0 as i16,
        name,
    )
    .execute(pool)
    .await?;
    let was = sqlx::query!("select id, name from leaseq.cluster_identity")
        .fetch_one(pool)
        .await?;
    let (was_id, was_name) = (was.id, was.name);
    if was_id != id.0 as i16 || was_name != name {
        anyhow::bail!(
            "the database given for cluster {name:?} is cluster {was_name:?} (id {was_id}): check the order and names of --database-url"
        );
    }
    Ok(())
}

/// The current epoch on home.
pub async fn epoch(home: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar!("select epoch from leaseq.placement_epoch")
            .fetch_optional(home)
            .await?
            .unwrap_or(0),
    )
}

/// Reads the whole map from home.
pub async fn load(home: &PgPool) -> Result<Map> {
    let mut tx = home.begin().await?;
    // One snapshot for the epoch and the tables it stands for.
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *tx)
        .await?;
    let epoch: i64 = sqlx::query_scalar!("select epoch from leaseq.placement_epoch")
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(0);
    let rows = sqlx::query!("select bucket, cluster, moving_to from leaseq.placement")
        .fetch_all(&mut *tx)
        .await?;
    let mut map = Map::home_only();
    map.epoch = epoch;
    for r in rows {
        let b: i32 = r.bucket;
        let c: i16 = r.cluster;
        let to: Option<i16> = r.moving_to;
        if let Some(slot) = map.buckets.get_mut(b as usize) {
            *slot = ClusterId(c as u16);
        }
        if let Some(to) = to {
            map.moving.insert(b as u32, ClusterId(to as u16));
        }
    }
    let pins = sqlx::query!("select pattern, cluster from leaseq.placement_pins")
        .fetch_all(&mut *tx)
        .await?;
    map.pins = pins
        .into_iter()
        .map(|r| (r.pattern, ClusterId(r.cluster as u16)))
        .collect();
    tx.commit().await?;
    Ok(map)
}

/// Follows the placement: re-reads the map whenever home's epoch moved, and
/// records the epoch this broker routes by, every `interval` until `stop`.
pub async fn follow(clusters: Clusters, interval: Duration, stop: CancellationToken) {
    let home = clusters.home().clone();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let result = async {
            let now = epoch(&home.pool).await?;
            if now != clusters.map().epoch {
                let map = load(&home.pool).await?;
                info!(
                    epoch = map.epoch,
                    moving = map.moving.len(),
                    "placement changed"
                );
                clusters.set_map(map);
            }
            sqlx::query!(
                "insert into leaseq.placement_brokers (broker, epoch) values ($1, $2) \
                 on conflict (broker) do update set epoch = excluded.epoch, seen_at = now()",
                home.broker_id,
                clusters.map().epoch,
            )
            .execute(&home.pool)
            .await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            warn!(error = %e, "placement: reading the map from the home cluster failed");
        }
    }
    // Gone: a move need not wait for this broker.
    let _ = sqlx::query!(
        "delete from leaseq.placement_brokers where broker = $1",
        home.broker_id,
    )
    .execute(&home.pool)
    .await;
}

/// Pins a queue name (or a prefix ending in `*`) to a cluster. Refused if
/// jobs of matching queues live elsewhere (move them first).
pub async fn pin(clusters: &[(ClusterId, PgPool)], pattern: &str, to: ClusterId) -> Result<()> {
    let prefix = pattern.strip_suffix('*');
    for (id, pool) in clusters.iter().filter(|(id, _)| *id != to) {
        let like = match prefix {
            Some(p) => format!(
                "{}%",
                p.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
            ),
            None => pattern
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_"),
        };
        let elsewhere: bool = sqlx::query_scalar!(
            "select exists (select 1 from leaseq.jobs where queue like $1) \
             or exists (select 1 from leaseq.dead_jobs where queue like $1) as \"elsewhere!\"",
            &like,
        )
        .fetch_one(pool)
        .await?;
        if elsewhere {
            return Err(Error::invalid(
                "pattern",
                format!("queues matching {pattern:?} have jobs on cluster {id}: move them first"),
            ));
        }
    }
    let home = &clusters[0].1;
    let mut tx = home.begin().await?;
    sqlx::query!(
        "insert into leaseq.placement_pins (pattern, cluster) values ($1, $2) \
         on conflict (pattern) do update set cluster = excluded.cluster",
        pattern,
        to.0 as i16,
    )
    .execute(&mut *tx)
    .await?;
    bump_epoch(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

async fn bump_epoch(tx: &mut sqlx::PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar!("update leaseq.placement_epoch set epoch = epoch + 1 returning epoch")
            .fetch_one(tx)
            .await?,
    )
}

/// How [`move_bucket`] paces itself.
#[derive(Clone, Debug)]
pub struct MoveOptions {
    /// Jobs per copy transaction.
    pub batch: i64,
    /// A broker not seen for this long is not waited for.
    pub broker_timeout: Duration,
    /// Waited after the last copy before the move ends, for enqueue
    /// statements that began before brokers followed the announcement.
    pub grace: Duration,
    /// Gives up waiting for brokers or for leases on the source after this.
    pub limit: Duration,
    /// Told what was copied so far after every copy transaction (the
    /// CLI's progress line).
    pub progress: Option<tokio::sync::watch::Sender<Moved>>,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            batch: 500,
            broker_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(2),
            limit: Duration::from_secs(600),
            progress: None,
        }
    }
}

/// What a move did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub queues: usize,
    pub jobs: u64,
    pub dead: u64,
    /// Completed records kept for retention.
    pub completed: u64,
}

/// Moves `bucket` to cluster `to` (docs/SCALING.md, "Moving a bucket"):
/// announce, wait for every live broker to follow, fence the source by
/// pausing the bucket's queues there, copy waiting jobs and dead letters
/// with tombstones, wait for the source's leases to end, finish. Safe to
/// run again after it was interrupted (it resumes). `clusters` is every
/// cluster, home first.
pub async fn move_bucket(
    clusters: &[(ClusterId, PgPool)],
    bucket: u32,
    to: ClusterId,
    opts: &MoveOptions,
) -> anyhow::Result<Moved> {
    anyhow::ensure!(bucket < BUCKETS, "bucket must be below {BUCKETS}");
    let pool_of = |id: ClusterId| {
        clusters
            .iter()
            .find(|(c, _)| *c == id)
            .map(|(_, p)| p.clone())
            .ok_or_else(|| anyhow::anyhow!("cluster {id} is not among the databases given"))
    };
    let home = clusters[0].1.clone();
    let dest = pool_of(to)?;
    let started = tokio::time::Instant::now();

    // 1. Announce (and find the source).
    let mut tx = home.begin().await?;
    let row = sqlx::query!(
        "select cluster, moving_to from leaseq.placement where bucket = $1 for update",
        bucket as i32,
    )
    .fetch_one(&mut *tx)
    .await?;
    let (from, moving): (i16, Option<i16>) = (row.cluster, row.moving_to);
    let from = ClusterId(from as u16);
    if from == to && moving.is_none() {
        return Ok(Moved::default());
    }
    if let Some(m) = moving
        && m != to.0 as i16
    {
        anyhow::bail!("bucket {bucket} is being moved to cluster {m} already");
    }
    let source = pool_of(from)?;
    let pins = sqlx::query!("select pattern, cluster from leaseq.placement_pins")
        .fetch_all(&mut *tx)
        .await?;
    let mut pinned = Map::home_only();
    pinned.pins = pins
        .into_iter()
        .map(|r| (r.pattern, ClusterId(r.cluster as u16)))
        .collect();
    // The bucket's queues on the source (pinned ones stay where pinned).
    let names: Vec<String> = sqlx::query_scalar!("select name from leaseq.queues")
        .fetch_all(&source)
        .await?;
    let queues: Vec<String> = names
        .into_iter()
        .filter(|q| bucket_of(q) == bucket && pinned.pinned(q).is_none())
        .collect();
    // Queue rows (settings) exist on the destination before any job goes
    // there, with the source's settings: a row the destination had already
    // (left by `leaseq.enqueue()` there, say) is replaced, since nothing
    // leases the queue there yet. A resumed move keeps the destination's:
    // the source's rows are fenced (paused) by then.
    copy_queue_rows(&source, &dest, &queues, moving.is_none()).await?;
    let epoch = if moving.is_none() {
        sqlx::query!(
            "update leaseq.placement set moving_to = $2 where bucket = $1",
            bucket as i32,
            to.0 as i16,
        )
        .execute(&mut *tx)
        .await?;
        bump_epoch(&mut tx).await?
    } else {
        sqlx::query_scalar!("select epoch from leaseq.placement_epoch")
            .fetch_one(&mut *tx)
            .await?
    };
    tx.commit().await?;
    info!(bucket, %from, %to, epoch, queues = queues.len(), "bucket move announced");

    // Wait until every live broker routes by the new epoch.
    loop {
        let behind: i64 = sqlx::query_scalar!(
            "select count(*) as \"count!\" from leaseq.placement_brokers \
             where epoch < $1 and seen_at > now() - make_interval(secs => $2)",
            epoch,
            opts.broker_timeout.as_secs_f64(),
        )
        .fetch_one(&home)
        .await?;
        if behind == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < opts.limit,
            "{behind} brokers did not follow epoch {epoch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(opts.grace).await;

    // 2. Fence the source: its lease statements skip paused queues.
    sqlx::query!(
        "update leaseq.queues set paused = true where name = any($1)",
        &queues,
    )
    .execute(&source)
    .await?;

    // 3. Copy, until the source holds nothing of the bucket.
    let mut moved = Moved {
        queues: queues.len(),
        ..Moved::default()
    };
    loop {
        loop {
            let n = copy_batch(&source, &dest, &queues, "jobs", opts.batch).await?;
            moved.jobs += n;
            if let Some(p) = &opts.progress {
                p.send_replace(moved.clone());
            }
            if n > 0 {
                wake(&dest, &queues).await;
            }
            if (n as i64) < opts.batch {
                break;
            }
        }
        loop {
            let n = copy_batch(&source, &dest, &queues, "dead_jobs", opts.batch).await?;
            moved.dead += n;
            if let Some(p) = &opts.progress {
                p.send_replace(moved.clone());
            }
            if (n as i64) < opts.batch {
                break;
            }
        }
        // Completed records kept for the queues' retention: the queue's
        // retention runs where its row is, so they go with it.
        loop {
            let n = copy_batch(&source, &dest, &queues, "completed_jobs", opts.batch).await?;
            moved.completed += n;
            if let Some(p) = &opts.progress {
                p.send_replace(moved.clone());
            }
            if (n as i64) < opts.batch {
                break;
            }
        }
        let left: i64 = sqlx::query_scalar!(
            "select (select count(*) from leaseq.jobs where queue = any($1)) \
                  + (select count(*) from leaseq.dead_jobs where queue = any($1)) \
                  + (select count(*) from leaseq.completed_jobs where queue = any($1)) as \"left!\"",
            &queues,
        )
        .fetch_one(&source)
        .await?;
        if left == 0 {
            // A last look after the grace: an enqueue that began before the
            // brokers followed may commit late.
            tokio::time::sleep(opts.grace).await;
            let late: i64 = sqlx::query_scalar!(
                r#"select count(*) as "count!" from leaseq.jobs where queue = any($1)"#,
                &queues,
            )
            .fetch_one(&source)
            .await?;
            if late == 0 {
                break;
            }
        }
        anyhow::ensure!(
            started.elapsed() < opts.limit,
            "{left} jobs of bucket {bucket} still on cluster {from} (leased ones end first)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 4. Finish.
    let mut tx = home.begin().await?;
    sqlx::query!(
        "update leaseq.placement set cluster = $2, moving_to = null where bucket = $1",
        bucket as i32,
        to.0 as i16,
    )
    .execute(&mut *tx)
    .await?;
    let epoch = bump_epoch(&mut tx).await?;
    tx.commit().await?;
    sqlx::query!("delete from leaseq.queues where name = any($1)", &queues)
        .execute(&source)
        .await?;
    info!(bucket, %from, %to, epoch, jobs = moved.jobs, dead = moved.dead, completed = moved.completed, "bucket moved");
    Ok(moved)
}

/// What one sweep moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Queues that had stray jobs or dead letters.
    pub queues: usize,
    pub jobs: u64,
    pub dead: u64,
}

/// Distinct queues of `table` on a cluster, by a skip scan of the index
/// that leads with the queue (`jobs_ready` for waiting jobs,
/// `dead_jobs_queue`): one index probe per queue, not a scan of the table.
async fn queues_holding(pool: &PgPool, table: &'static str) -> Result<Vec<String>> {
    let filter = if table == "jobs" {
        "and state = 'available'"
    } else {
        ""
    };
    let first = if table == "jobs" {
        "where state = 'available'"
    } else {
        ""
    };
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "with recursive q(queue) as ( \
             (select queue from leaseq.{table} {first} order by queue limit 1) \
             union all \
             select (select t.queue from leaseq.{table} t where t.queue > q.queue {filter} \
                     order by t.queue limit 1) \
             from q where q.queue is not null) \
         select queue from q where queue is not null"
    )))
    .fetch_all(pool)
    .await?)
}

/// Moves **stray** jobs to their queue's cluster (docs/SCALING.md, "Stray
/// jobs"): waiting jobs and dead letters sitting on a cluster that does not
/// hold their queue, left by a broker that enqueued by an old map after a
/// move had ended, or by `leaseq.enqueue()` called on the wrong database.
/// They move exactly as a bucket move copies (row locks on the source,
/// tombstones on the destination), so none is lost or delivered twice, and
/// every broker may sweep at once. Buckets being moved are left to their
/// mover; leased jobs stay where their token says until they are settled
/// (a nacked or expired one is swept by a later pass). A pass stops as soon
/// as the placement changed under it (the next pass uses the new map).
/// `clusters` is every cluster, home first (the map is read from home).
pub async fn sweep(clusters: &[(ClusterId, PgPool)], batch: i64) -> Result<Swept> {
    let mut swept = Swept::default();
    if clusters.len() < 2 {
        return Ok(swept);
    }
    let home = clusters[0].1.clone();
    let map = load(&home).await?;
    let current = || async { Ok::<_, Error>(epoch(&home).await? == map.epoch) };
    for (id, pool) in clusters {
        let mut strays: Vec<(String, ClusterId)> = Vec::new();
        for table in ["jobs", "dead_jobs"] {
            let held = match queues_holding(pool, table).await {
                Ok(q) => q,
                // A cluster that is down is swept when it is back.
                Err(e) if e.is_unavailable() => continue,
                Err(e) => return Err(e),
            };
            for q in held {
                let owner = map.cluster_of(&q);
                let moving = map.pinned(&q).is_none() && map.moving.contains_key(&bucket_of(&q));
                if owner != *id && !moving && !strays.iter().any(|(s, _)| *s == q) {
                    strays.push((q, owner));
                }
            }
        }
        for (q, owner) in strays {
            let Some((_, dest)) = clusters.iter().find(|(c, _)| *c == owner) else {
                continue;
            };
            let queues = [q];
            // The queue's own cluster's settings stand.
            copy_queue_rows(pool, dest, &queues, false).await?;
            let mut any = false;
            for table in ["jobs", "dead_jobs"] {
                loop {
                    // Placement changed: the owner may be another now.
                    if !current().await? {
                        return Ok(swept);
                    }
                    let n = copy_batch(pool, dest, &queues, table, batch).await?;
                    if table == "jobs" {
                        swept.jobs += n;
                        if n > 0 {
                            wake(dest, &queues).await;
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
            if any {
                swept.queues += 1;
                info!(queue = %queues[0], from = %id, to = %owner, "stray jobs moved to their queue's cluster");
            }
        }
    }
    Ok(swept)
}

/// Sweeps every `interval` until `stop` ([`sweep`]).
pub async fn sweep_loop(clusters: Clusters, interval: Duration, stop: CancellationToken) {
    let pools: Vec<(ClusterId, PgPool)> = clusters
        .all()
        .iter()
        .map(|s| (s.cluster, s.pool.clone()))
        .collect();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Not at start: the placement was just read, other brokers start too.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let pass = tokio::select! {
            _ = stop.cancelled() => break,
            r = sweep(&pools, 500) => r,
        };
        if let Err(e) = pass {
            warn!(error = %e, "stray-job sweep failed; retrying at the next interval");
        }
    }
}

/// Creates the queues' rows on `dest` with the source's settings; rows that
/// exist there already are replaced when `replace`, else kept.
async fn copy_queue_rows(
    source: &PgPool,
    dest: &PgPool,
    queues: &[String],
    replace: bool,
) -> Result<()> {
    // As JSON text: one statement whatever the table's columns are (the
    // schema is the same on every cluster).
    let rows: String = sqlx::query_scalar!(
        r#"select coalesce(json_agg(q), '[]')::text as "rows!" from leaseq.queues q where name = any($1)"#,
        queues as &[String],
    )
    .fetch_one(source)
    .await?;
    // $1 is sent as text, as before (`as String`): sqlx maps `json` to
    // serde_json, which leaseq does not use.
    let mut tx = dest.begin().await?;
    if replace {
        sqlx::query!(
            "delete from leaseq.queues where name in \
             (select name from json_populate_recordset(null::leaseq.queues, $1::json))",
            &rows as &String,
        )
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query!(
        "insert into leaseq.queues select * from json_populate_recordset(null::leaseq.queues, $1::json) \
         on conflict (name) do nothing",
        rows as String,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// One copy transaction of up to `batch` rows of `table` (`jobs`: waiting
/// ones only; `dead_jobs`; `completed_jobs`): locked on the source, inserted on the
/// destination with tombstones (skipping ids already tombstoned: a repeated
/// copy), committed there, then deleted on the source. Returns how many.
async fn copy_batch(
    source: &PgPool,
    dest: &PgPool,
    queues: &[String],
    table: &'static str,
    batch: i64,
) -> Result<u64> {
    let waiting = if table == "jobs" {
        "and state = 'available'"
    } else {
        ""
    };
    let mut src = source.begin().await?;
    let (rows, ids): (String, Vec<uuid::Uuid>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "with picked as (select * from leaseq.{table} where queue = any($1) {waiting} \
         order by id limit $2 for update skip locked) \
         select coalesce(json_agg(p), '[]')::text, coalesce(array_agg(p.id), '{{}}') from picked p"
    )))
    .bind(queues)
    .bind(batch)
    .fetch_one(&mut *src)
    .await?;
    if ids.is_empty() {
        src.commit().await?;
        return Ok(0);
    }
    let mut dst = dest.begin().await?;
    // Rows of ids already tombstoned were copied by an earlier pass whose
    // source transaction did not commit: only the delete below is left.
    // Every other row must arrive: the source's copy is deleted next.
    let (fresh, inserted): (Vec<uuid::Uuid>, Vec<uuid::Uuid>) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "with fresh as (insert into leaseq.moved_jobs (id) select unnest($2::uuid[]) \
             on conflict (id) do nothing returning id), \
             ins as (insert into leaseq.{table} select r.* \
             from json_populate_recordset(null::leaseq.{table}, $1::json) r \
             where r.id in (select id from fresh) on conflict do nothing returning id) \
             select coalesce((select array_agg(id) from fresh), '{{}}'), \
                    coalesce((select array_agg(id) from ins), '{{}}')"
        )))
        .bind(&rows)
        .bind(&ids)
        .fetch_one(&mut *dst)
        .await?;
    if inserted.len() < fresh.len() {
        // A live job of the same queue holds the row's dedup key on the
        // destination (an Enqueue routed there during the move checks
        // the source too, so these come from `leaseq.enqueue()` on the
        // wrong database, as stray jobs do). Both were answered as new
        // jobs: the row arrives without its dedup key rather than not at
        // all. Anything else that did not insert fails the copy.
        let missing: Vec<uuid::Uuid> = fresh
            .iter()
            .filter(|id| !inserted.contains(id))
            .copied()
            .collect();
        let kept: Vec<uuid::Uuid> = if table == "jobs" {
            sqlx::query_scalar(
                "insert into leaseq.jobs select r.* from jsonb_array_elements($1::jsonb) e \
                 cross join lateral jsonb_populate_record(null::leaseq.jobs, e - 'dedup_key') r \
                 where r.id = any($2) on conflict do nothing returning id",
            )
            .bind(&rows)
            .bind(&missing)
            .fetch_all(&mut *dst)
            .await?
        } else {
            Vec::new()
        };
        if kept.len() < missing.len() {
            return Err(Error::Internal(
                "a row copied between clusters conflicted with one there: copy aborted",
            ));
        }
        warn!(
            jobs = ?kept,
            "jobs copied between clusters without their dedup key: a live job of their queue holds it there"
        );
    }
    dst.commit().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "delete from leaseq.{table} where id = any($1)"
    )))
    .bind(&ids)
    .execute(&mut *src)
    .await?;
    src.commit().await?;
    // The source no longer has them: the tombstones have done their work.
    sqlx::query!("delete from leaseq.moved_jobs where id = any($1)", &ids)
        .execute(dest)
        .await?;
    Ok(ids.len() as u64)
}

/// Wakes the queues' consumers on every broker (they all LISTEN on `pool`).
async fn wake(pool: &PgPool, queues: &[String]) {
    let r = sqlx::query!(
        "select pg_notify($1, 'placement:0:' || q) from unnest($2::text[]) as q",
        crate::store::WAKE_CHANNEL,
        queues as &[String],
    )
    .execute(pool)
    .await;
    if let Err(e) = r {
        warn!(error = %e, "bucket move: wake-up failed; the fallback poll will find the jobs");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_fnv1a() {
        // FNV-1a 32 of "a" is 0xe40c292c.
        assert_eq!(bucket_of("a"), 0xe40c_292c % BUCKETS);
        assert_eq!(bucket_of(""), 0x811c_9dc5 % BUCKETS);
        assert!((0..10_000).all(|i| bucket_of(&format!("q{i}")) < BUCKETS));
    }

    #[test]
    fn pins_override_buckets_longest_first() {
        let mut m = Map::home_only();
        m.buckets[bucket_of("orders.eu") as usize] = ClusterId(2);
        assert_eq!(m.cluster_of("orders.eu"), ClusterId(2));
        m.pins = vec![
            ("orders.*".into(), ClusterId(1)),
            ("orders.eu".into(), ClusterId(3)),
        ];
        assert_eq!(m.cluster_of("orders.eu"), ClusterId(3));
        assert_eq!(m.cluster_of("orders.us"), ClusterId(1));
        m.moving.insert(bucket_of("mail"), ClusterId(4));
        assert_eq!(m.cluster_of("mail"), ClusterId(4));
    }

    #[test]
    fn cluster_names() {
        assert!(valid_name("eu-1"));
        assert!(!valid_name("Eu"));
        assert!(!valid_name("1eu"));
        assert!(!valid_name(""));
        assert!(!valid_name("postgres://x"));
    }
}
