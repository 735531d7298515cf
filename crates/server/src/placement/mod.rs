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
//! This file is the map and the routing; the rest, one concern a file
//! (their statements are in [`crate::store::placement`]):
//!
//! - `setup`: cluster ids and the first map, at start ([`setup`],
//!   [`check_identity`]);
//! - `follow`: the background loop that re-reads the map when its epoch
//!   moves ([`follow`]);
//! - `moves`: the operator's commands, [`pin`] and [`move_bucket`], which
//!   moves a bucket between clusters without losing or duplicating a job
//!   (the protocol is in docs/SCALING.md);
//! - `sweep`: moving stray jobs to their queue's cluster ([`sweep`],
//!   [`sweep_loop`]).
//!
//! Work over several clusters runs in the calling task, one future per
//! cluster joined with `futures_util::future::join_all` (the broker's
//! settles and leases, the admin fan-out): a cluster that is slow or down
//! delays no other.

mod follow;
mod moves;
mod setup;
mod sweep;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use sqlx::PgPool;

use crate::domain::{ClusterId, QueueName};
use crate::error::{Error, Result};
use crate::store::Store;
use crate::store::placement as sql;

pub(crate) use follow::follow;
pub use moves::{MoveOptions, Moved, move_bucket, pin};
pub(crate) use setup::check_identity;
pub use setup::setup;
pub(crate) use sweep::sweep_loop;
pub use sweep::{Swept, sweep};

/// Fixed for the life of a deployment: a queue's bucket never changes.
pub(crate) const BUCKETS: u32 = 1024;

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
    pub(crate) fn home_only() -> Map {
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
    pub(crate) fn pinned(&self, queue: &str) -> Option<ClusterId> {
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
pub(crate) struct Clusters {
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
    pub(crate) fn single(store: Store) -> Clusters {
        Clusters::new(vec![store], Map::home_only())
    }

    /// `stores` with home first.
    pub(crate) fn new(stores: Vec<Store>, map: Map) -> Clusters {
        let by_id = stores
            .iter()
            .enumerate()
            .map(|(i, s)| (s.cluster(), i))
            .collect();
        Clusters {
            inner: Arc::new(Inner {
                stores,
                by_id,
                map: RwLock::new(Arc::new(map)),
            }),
        }
    }

    pub(crate) fn is_single(&self) -> bool {
        self.inner.stores.len() == 1
    }

    pub(crate) fn home(&self) -> &Store {
        &self.inner.stores[0]
    }

    pub(crate) fn all(&self) -> &[Store] {
        &self.inner.stores
    }

    /// The store of a cluster id (from a lease token); None if this broker
    /// has no such cluster.
    pub(crate) fn get(&self, id: ClusterId) -> Option<&Store> {
        self.inner.by_id.get(&id).map(|&i| &self.inner.stores[i])
    }

    /// The cluster id that takes the queue's new jobs and lease rounds.
    pub(crate) fn cluster_of(&self, queue: &QueueName) -> ClusterId {
        if self.is_single() {
            return self.home().cluster();
        }
        self.map().cluster_of(queue.as_str())
    }

    /// The store of the queue's cluster.
    pub(crate) fn store_for(&self, queue: &QueueName) -> Result<&Store> {
        let id = self.cluster_of(queue);
        self.get(id).ok_or(Error::ClusterUnknown(id.0))
    }

    pub(crate) fn map(&self) -> Arc<Map> {
        self.inner.map.read().expect("poisoned").clone()
    }

    pub(crate) fn set_map(&self, map: Map) {
        *self.inner.map.write().expect("poisoned") = Arc::new(map);
    }

    /// Splits `items` by cluster, keeping their order within each group.
    pub(crate) fn group<T>(
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

/// The current epoch on home.
pub(crate) async fn epoch(home: &PgPool) -> Result<i64> {
    Ok(sql::epoch(home).await?.unwrap_or(0))
}

/// Reads the whole map from home.
pub async fn load(home: &PgPool) -> Result<Map> {
    let (epoch, buckets, pins) = sql::read_map(home).await?;
    let mut map = Map::home_only();
    map.epoch = epoch.unwrap_or(0);
    for (b, c, to) in buckets {
        if let Some(slot) = map.buckets.get_mut(b as usize) {
            *slot = ClusterId(c as u16);
        }
        if let Some(to) = to {
            map.moving.insert(b as u32, ClusterId(to as u16));
        }
    }
    map.pins = pins;
    Ok(map)
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
