//! At a broker's start with several clusters: the clusters' ids, the first
//! bucket map, and each database's check that it is the cluster its name
//! says.

use std::collections::HashMap;

use sqlx::PgPool;
use tracing::info;

use super::BUCKETS;
use crate::domain::ClusterId;
use crate::store::placement as sql;

/// On the home cluster: gives each name (home first) its id, creating ids
/// for new names, and writes the first map if there is none (spread over the
/// clusters for a new deployment, all home for one that has queues already).
/// Returns the ids in the order of `names`.
pub async fn setup(home: &PgPool, names: &[String]) -> anyhow::Result<Vec<ClusterId>> {
    let mut tx = home.begin().await?;
    sql::lock_setup(&mut tx).await?;
    let mut known: HashMap<String, i16> = sql::known_clusters(&mut tx).await?.into_iter().collect();
    let mut ids = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let id = id_for(&known, i, name)?;
        if !known.contains_key(name) {
            sql::add_cluster(&mut tx, id, name).await?;
            known.insert(name.clone(), id);
        }
        ids.push(ClusterId(id as u16));
    }
    if sql::mapped_buckets(&mut tx).await? == 0 {
        let has_queues = sql::has_queues(&mut tx).await?;
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
        sql::write_first_map(&mut tx, &clusters).await?;
        info!(
            spread_over = over.len(),
            upgrade = has_queues,
            "placement: first bucket map written"
        );
    }
    tx.commit().await?;
    Ok(ids)
}

/// The id of the `i`th name given (`known`: the ids the placement has):
/// its own if known, 0 for the home cluster (first), else the next free one.
fn id_for(known: &HashMap<String, i16>, i: usize, name: &str) -> anyhow::Result<i16> {
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
    Ok(id)
}

/// On each cluster: checks that the database knows itself as this cluster
/// (recording it the first time).
pub(crate) async fn check_identity(pool: &PgPool, id: ClusterId, name: &str) -> anyhow::Result<()> {
    let (was_id, was_name) = sql::identity(pool, id, name).await?;
    if was_id != id.0 as i16 || was_name != name {
        anyhow::bail!(
            "the database given for cluster {name:?} is cluster {was_name:?} (id {was_id}): check the order and names of --database-url"
        );
    }
    Ok(())
}
