//! Background upkeep every broker runs: the lease reaper and ttl expiry.
//!
//! All replicas run it; statements skip rows another replica holds and check
//! the lease token under a row lock, so running it twice is harmless. The
//! dispatcher reaps its own streams' leases at their deadline; this loop
//! catches the rest (leases of a broker that crashed).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::dispatch::{Dispatcher, wakes_for};
use crate::domain::{JobId, LeaseToken};
use crate::error::Result;
use crate::store::{FailReq, Store, Wake};

/// Most rows one maintenance statement touches.
const BATCH: i64 = 1000;

/// Ends expired leases: the job is retried at once (or dead-lettered on its
/// last attempt, or when its ttl passed). Wakes the queues that got jobs back.
pub async fn reap(
    store: &Store,
    expired: Vec<(JobId, LeaseToken)>,
    wake: impl Fn(Vec<Wake>),
) -> Result<usize> {
    if expired.is_empty() {
        return Ok(0);
    }
    let reqs: Vec<FailReq> = expired
        .into_iter()
        .map(|(id, token)| FailReq {
            id,
            token,
            error: "lease expired".to_owned(),
            retry_after_ms: Some(0),
            dead_letter: false,
            refund: false,
        })
        .collect();
    let done = store.fail(&reqs).await?;
    let dead = done.iter().filter(|f| f.death.is_some()).count();
    store
        .metrics
        .on_settled(&store.metrics.lease_expired, done.len(), done.len(), dead);
    let wakes = wakes_for(&done);
    store.notify_wake(&store.pool, &wakes).await?;
    wake(wakes);
    Ok(done.len())
}

/// Runs the reaper and ttl expiry every `interval` until `shutdown`.
pub async fn run(
    store: Store,
    dispatcher: Dispatcher,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pass(&store, &dispatcher).await {
            warn!(error = %e, "maintenance pass failed");
        }
    }
}

async fn pass(store: &Store, dispatcher: &Dispatcher) -> Result<()> {
    loop {
        let expired = store.expired_leases(None, BATCH).await?;
        let n = expired.len() as i64;
        let reaped = reap(store, expired, |w| dispatcher.wake(w)).await?;
        if reaped > 0 {
            debug!(reaped, "expired leases reaped");
        }
        if n < BATCH {
            break;
        }
    }
    loop {
        let n = store.expire_ttl(BATCH).await?;
        store.metrics.dead_lettered.add(n as usize);
        if n > 0 {
            debug!(expired = n, "jobs past their ttl dead-lettered");
        }
        if (n as i64) < BATCH {
            break;
        }
    }
    Ok(())
}
