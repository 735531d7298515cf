//! Send times carried in payloads: the first 8 bytes are a time in µs since
//! the Unix epoch (little endian).
//!
//! Times are read from the monotonic clock and converted to wall-clock µs
//! through one anchor taken when the bench starts, so an NTP step during a
//! run cannot skew a latency, and an instant scheduled in advance (the open
//! loop's send times) converts exactly. Stamps older than the anchor (jobs
//! left in a reused `--queue` by an earlier run) and zero stamps (the
//! backlog fill's payloads) read as "not stamped".

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The monotonic instant and wall-clock µs of the bench's start.
fn anchor() -> (Instant, u64) {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    *ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        (Instant::now(), wall)
    })
}

/// Takes the anchor now (otherwise it is taken at the first use).
pub fn init() {
    anchor();
}

/// `at` in µs since the epoch (instants before the anchor count as it).
pub fn at(at: Instant) -> u64 {
    let (base, base_us) = anchor();
    base_us + at.saturating_duration_since(base).as_micros() as u64
}

pub fn now() -> u64 {
    at(Instant::now())
}

/// A payload of `size` bytes (at least 8) carrying `stamp`.
pub fn payload(stamp: u64, size: usize) -> Vec<u8> {
    let mut p = stamp.to_le_bytes().to_vec();
    p.resize(size.max(8), b'x');
    p
}

/// A payload that carries no send time.
pub fn unstamped(size: usize) -> Vec<u8> {
    vec![0; size.max(8)]
}

/// The send time a payload carries, if it was stamped by this run.
pub fn read(p: &[u8]) -> Option<u64> {
    let stamp = u64::from_le_bytes(p.get(..8)?.try_into().ok()?);
    (stamp >= anchor().1).then_some(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_round_trip_and_old_ones_are_ignored() {
        init();
        let t0 = Instant::now();
        let s = at(t0 + Duration::from_millis(5));
        assert_eq!(s - at(t0), 5_000, "scheduled instants convert exactly");
        assert!(now() >= at(t0));
        assert_eq!(read(&payload(s, 64)), Some(s));
        assert_eq!(payload(s, 3).len(), 8);
        assert_eq!(read(&unstamped(64)), None);
        assert_eq!(read(&payload(anchor().1 - 1, 64)), None);
        assert_eq!(read(&[1, 2, 3]), None);
    }
}
