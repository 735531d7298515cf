//! Every broker with several clusters follows the placement: it re-reads
//! the map whenever home's epoch moved, and records on home the epoch it
//! routes by (a bucket move waits until every live broker has followed).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Clusters, epoch, load};
use crate::error::Error;
use crate::store::placement as sql;
use crate::tick::Ticks;

/// Follows the placement: re-reads the map whenever home's epoch moved, and
/// records the epoch this broker routes by, every `interval` until `stop`.
pub(crate) async fn follow(clusters: Clusters, interval: Duration, stop: CancellationToken) {
    let home = clusters.home().clone();
    let mut ticks = Ticks::new(interval, &stop);
    while ticks.next().await {
        let result = async {
            let now = epoch(home.pool()).await?;
            if now != clusters.map().epoch {
                let map = load(home.pool()).await?;
                info!(
                    epoch = map.epoch,
                    moving = map.moving.len(),
                    "placement changed"
                );
                clusters.set_map(map);
            }
            sql::report_epoch(home.pool(), home.broker_id(), clusters.map().epoch).await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            warn!(error = %e, "placement: reading the map from the home cluster failed");
        }
    }
    // Gone: a move need not wait for this broker.
    let _ = sql::forget_broker(home.pool(), home.broker_id()).await;
}
