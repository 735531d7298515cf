//! What the simulation asserts, and what one run adds up to.
//!
//! After every step (`World::check_step`) and at the end of a run
//! (`World::check_end`):
//! - **one current lease per job**: no job is held by two clients with
//!   unexpired leases, and no client holds a lease the database no longer
//!   has while it is unexpired (revoked under its feet: released by a
//!   sweep, a close it did not ask for) — but for a drained or crashed
//!   broker's streams, named as such;
//! - **credit is never created**: a stream's client never holds more jobs
//!   than the most credit the stream has had (lowering a Consume stream's
//!   credit takes nothing back), and at the end each stream's credit is
//!   the last its client set, all of it free;
//! - **an ack answered OK is never followed by a delivery of that job**;
//! - **a valid ack is never refused**: an ack of a lease that was current
//!   when sent and had not run out when its statement ran is answered OK;
//! - **settle results match by (op, job, token)**: each result the client
//!   gets is OK exactly when the statement applied that (job, token);
//! - **no delivery after its lease was released**: what a client reads
//!   from its stream is its current lease;
//! - **a half-closed stream ends OK only once its jobs are back**: no
//!   lease taken for it (by a round or a hand-off, even one still under
//!   way at the half-close) is current then, but those acked on it and
//!   those released apart before the half-close (`World::check_finished`);
//! - **no stream starved while jobs wait**: a stream with free credit and
//!   a deliverable job of an unlimited queue it serves gets one within a
//!   bound (faults aside), and at the end every job committed is acked or
//!   dead-lettered, with no lease left, and every half-closed stream has
//!   ended.

use std::fmt;

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub enqueued: u64,
    pub deliveries: u64,
    pub acked: u64,
    pub dead: u64,
    pub redelivered: u64,
    pub statements: u64,
    pub failed_statements: u64,
    pub cancelled_calls: u64,
    pub faults: u64,
    pub steps: u64,
    /// Each anomaly found, with the trace of the steps before it.
    pub anomalies: Vec<String>,
}

impl Outcome {
    pub fn add(&mut self, o: &Outcome) {
        self.enqueued += o.enqueued;
        self.deliveries += o.deliveries;
        self.acked += o.acked;
        self.dead += o.dead;
        self.redelivered += o.redelivered;
        self.statements += o.statements;
        self.failed_statements += o.failed_statements;
        self.cancelled_calls += o.cancelled_calls;
        self.faults += o.faults;
        self.steps += o.steps;
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "jobs={} deliveries={} acked={} dead={} redelivered={} statements={} \
             failed_statements={} cancelled_calls={} faults={} steps={} anomalies={}",
            self.enqueued,
            self.deliveries,
            self.acked,
            self.dead,
            self.redelivered,
            self.statements,
            self.failed_statements,
            self.cancelled_calls,
            self.faults,
            self.steps,
            self.anomalies.len()
        )?;
        for a in &self.anomalies {
            write!(f, "\n{a}")?;
        }
        Ok(())
    }
}
