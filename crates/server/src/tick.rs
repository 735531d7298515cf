//! The clock of the broker's background loops (maintenance, retention,
//! vacuum, the history sampler, the placement's follow and sweep loops).

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Ticks every `period` until `stop` is cancelled. A pass that overruns
/// delays the next tick rather than bunching ticks up. Used as
/// `while ticks.next().await { pass }`.
pub(crate) struct Ticks {
    interval: Interval,
    stop: CancellationToken,
}

impl Ticks {
    /// The first tick at once.
    pub(crate) fn new(period: Duration, stop: &CancellationToken) -> Ticks {
        Ticks::starting(Instant::now(), period, stop)
    }

    /// The first tick one `period` from now.
    pub(crate) fn after_one(period: Duration, stop: &CancellationToken) -> Ticks {
        Ticks::starting(Instant::now() + period, period, stop)
    }

    fn starting(first: Instant, period: Duration, stop: &CancellationToken) -> Ticks {
        let mut interval = tokio::time::interval_at(first, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticks {
            interval,
            stop: stop.clone(),
        }
    }

    /// Waits for the next tick: true then, false once `stop` is cancelled
    /// (also when both are ready: no pass starts after the stop).
    pub(crate) async fn next(&mut self) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_until_stopped() {
        let stop = CancellationToken::new();
        let start = Instant::now();
        let mut ticks = Ticks::new(Duration::from_secs(2), &stop);
        assert!(ticks.next().await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(ticks.next().await);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        stop.cancel();
        assert!(!ticks.next().await);
        assert!(!ticks.next().await);
    }

    #[tokio::test(start_paused = true)]
    async fn after_one_skips_the_first_tick() {
        let stop = CancellationToken::new();
        let start = Instant::now();
        let mut ticks = Ticks::after_one(Duration::from_secs(3), &stop);
        assert!(ticks.next().await);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_for_a_tick() {
        let stop = CancellationToken::new();
        let mut ticks = Ticks::after_one(Duration::from_secs(3600), &stop);
        let cancel = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            cancel.cancel();
        });
        let start = Instant::now();
        assert!(!ticks.next().await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
