//! A deterministic simulation of the broker's decisions (issue 32), in the
//! manner of FoundationDB's simulator and TigerBeetle's VOPR: the real
//! decision code, driven by a seeded scheduler, with a checker after every
//! step; a failing seed replays exactly.
//!
//! What is real here, and what is a model:
//! - **Real**: the dispatcher ([`Machine`] over `Core`: streams, credit,
//!   lease rounds, hand-off offers, the sweep of lost hand-overs, lease
//!   checks at deadlines, stream close and drain), the hand-off book
//!   ([`Offers`]) and the enqueue path's claims ([`Claims`], reported once
//!   whatever happens), a Consume stream's ack accounting
//!   ([`Held::acks_arrive`]: what an arriving ack tells the dispatcher),
//!   the settle paths' result matching (`settle::ack_results`,
//!   `nack_results`, `extend_results`) and wake-ups (`settle::wakes_for`).
//! - **Models**: the database (`db.rs`, each statement applied at the
//!   instant it commits, with its `.sql` file's semantics), the clients
//!   (producers; consumers on Consume or Subscribe streams that ack, nack,
//!   extend, let leases run out, change a Consume stream's credit, close
//!   and half-close), the network, and
//!   the task shell that carries the machine's effects out (as
//!   `dispatch/mod.rs` does, effect by effect).
//!
//! The scheduler interleaves client messages, statement completions
//! (success, failure before the commit, failure after it, cancellation by a
//! client's deadline, delays up to seconds), the dispatcher's wake-ups and
//! timers (polls, deadlines, sweeps), the maintenance reaper, stream closes
//! and half-closes, broker crashes (kill -9) and drains. See `check.rs` for
//! what is asserted after every step.
//!
//! Runs: `cargo test -p leaseq-server --lib sim::` runs `LEASEQ_SIM_SEEDS`
//! seeds (default below, about 30 s of the suite); `LEASEQ_SIM_SEED=N`
//! replays one seed with its trace printed; `LEASEQ_SIM_SECONDS` lengthens
//! each run (a soak). A failure prints its seed and the trace of its last
//! steps. docs/RELIABILITY.md has what it found.

mod check;
mod db;
mod world;

#[cfg(test)]
mod tests {
    use super::world::{Outcome, run};

    fn env(name: &str) -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.parse().ok())
    }

    /// Seeds per test of the suite's run, and each run's seconds of
    /// activity: four tests (nextest runs them at once), from fixed seeds,
    /// so a new failure is a new bug, not a new seed.
    const SEEDS: u64 = 250;
    const SECONDS: u64 = 3;

    /// Runs `n` seeds from `first` (the environment may say otherwise).
    fn seeds(first: u64) {
        let seconds = env("LEASEQ_SIM_SECONDS").unwrap_or(SECONDS);
        if let Some(seed) = env("LEASEQ_SIM_SEED") {
            if first != 0 {
                return;
            }
            let out = run(seed, seconds, true);
            assert!(out.anomalies.is_empty(), "seed {seed}: {out}");
            eprintln!("seed {seed}: {out}");
            return;
        }
        let n = env("LEASEQ_SIM_SEEDS").unwrap_or(SEEDS);
        let first = env("LEASEQ_SIM_FIRST").unwrap_or(1) + first * n;
        let mut total = Outcome::default();
        for seed in first..first + n {
            let t = std::time::Instant::now();
            let out = run(seed, seconds, false);
            if env("LEASEQ_SIM_TIMES").is_some() {
                eprintln!("seed {seed}: {:?} {} steps", t.elapsed(), out.steps);
            }
            if !out.anomalies.is_empty() {
                panic!(
                    "seed {seed} broke an invariant (replay: LEASEQ_SIM_SEED={seed} \
                     LEASEQ_SIM_SECONDS={seconds} cargo test -p leaseq-server --lib \
                     sim::tests::seeds_0 -- --nocapture): {out}"
                );
            }
            total.add(&out);
        }
        eprintln!("SIM {n} seeds of {seconds} s from {first}: {total}");
    }

    #[test]
    fn seeds_0() {
        seeds(0);
    }

    #[test]
    fn seeds_1() {
        seeds(1);
    }

    #[test]
    fn seeds_2() {
        seeds(2);
    }

    #[test]
    fn seeds_3() {
        seeds(3);
    }
}
