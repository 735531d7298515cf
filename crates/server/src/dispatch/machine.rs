//! The dispatcher as a state machine: what happened goes in ([`Input`], and
//! the clock), what to do comes out ([`Effects`]). It wraps [`Core`] with
//! the order in which the dispatcher task asks it things, so that the task
//! (`mod.rs`) only carries effects out (statements, sends on streams,
//! NOTIFYs, metrics) and feeds their results back as inputs; and so that
//! the deterministic simulation (`crate::sim`) drives the very same
//! decisions with a model database and a seeded scheduler.

use tokio::time::Instant;
use tracing::{debug, warn};

use super::StreamId;
use super::core::{Core, Delivered, Finished, Handoff, Publish, Round};
use crate::domain::{Due, FailReq, LeaseOutcome, Leased, Wake};
use crate::domain::{JobId, LeaseToken, QueueName, Subscription};

/// What happened, as the dispatcher hears of it.
#[derive(Debug)]
pub(crate) enum Input {
    /// A stream opens (its channel is the task's).
    Open {
        id: StreamId,
        sub: Subscription,
    },
    /// Its client is gone (dropped, reset, or a delivery could not be sent).
    Closed(StreamId),
    /// Closed by its client (Consume half-close); the release that follows
    /// is marked so the task can tell the client when it is over.
    Finish(StreamId),
    Credit(StreamId, u32),
    Wake(Vec<Wake>),
    WakeAll,
    /// Leases that ended (acked / nacked here or elsewhere). Carries the
    /// token: a job may already be leased again, to another of our streams.
    Settled(Vec<(JobId, LeaseToken)>),
    /// Leases whose jobs were cancelled (`CancelJob`, here or elsewhere):
    /// as `Settled`, and the streams holding them tell their clients.
    Cancelled(Vec<(JobId, LeaseToken)>),
    /// Leases acked on their Consume stream, the acks not committed yet
    /// (their credit comes back; the leases stay held: `Core::acking`).
    Acking(Vec<(JobId, LeaseToken)>),
    Extended(JobId, i64),
    LeaseChecked {
        checked: Vec<(JobId, LeaseToken)>,
        alive: Vec<(JobId, i64)>,
    },
    /// A lease round finished.
    Leased(Round, crate::error::Result<LeaseOutcome>),
    /// Our live leases on jobs enqueued a while ago (lost hand-overs?).
    Unheard(crate::error::Result<Vec<(JobId, LeaseToken)>>),
    /// The enqueue path used (or returned) hand-off claims.
    Handed(Handoff),
    /// Another replica inserted jobs leased to these streams of ours.
    RemoteHanded(Vec<(StreamId, Leased)>),
    /// When the next delayed job of these queues is due, and whether one
    /// is ready now.
    DueKnown(crate::error::Result<Vec<Due>>),
    /// A delivery was not sent: its lease was too far gone when it came to
    /// leave the stream's channel (`Core::assign` says why).
    Unsent(StreamId, JobId, LeaseToken),
    /// Stop delivering; finish once no lease round is in flight.
    Drain,
}

/// Leases to make available again at once (fail.sql, retry 0).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Release {
    pub leases: Vec<(JobId, LeaseToken)>,
    pub why: &'static str,
    /// The broker, not the consumer, let go: the attempt is given back.
    pub refund: bool,
    /// Jobs leased for a half-closed stream after it closed, never
    /// delivered: released in the same statement, as
    /// [`CLOSED_BEFORE_DELIVERY`] with the attempt given back.
    pub undelivered: Vec<(JobId, LeaseToken)>,
    /// The stream whose client half-closed it, waiting for this release.
    pub finish: Option<StreamId>,
}

impl Release {
    /// What to set each job to: `fail.sql`'s requests, retry at once.
    pub fn requests(&self) -> Vec<FailReq> {
        (self.leases.iter())
            .map(|l| FailReq::ended(*l, self.why, self.refund))
            .chain(
                (self.undelivered.iter()).map(|l| FailReq::ended(*l, CLOSED_BEFORE_DELIVERY, true)),
            )
            .collect()
    }
}

/// The end of a drain: release every lease our streams hold (attempt
/// given back), then end every stream with UNAVAILABLE.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    pub leases: Vec<(JobId, LeaseToken)>,
    pub streams: Vec<StreamId>,
}

/// What to do, in this order: the task carries it out.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Streams refused (a drain has begun): end them with UNAVAILABLE.
    pub refused: Vec<StreamId>,
    /// Streams closed: flag their outlets (nothing waiting goes out any
    /// more) and drop them, before the releases below run.
    pub closed: Vec<StreamId>,
    /// Leased jobs to push into their streams' channels, each with the
    /// instant past which it is not sent ([`Input::Unsent`]). One that
    /// cannot be pushed (the client is gone) comes back as
    /// [`Input::Closed`].
    pub deliver: Vec<(StreamId, Leased, Instant)>,
    /// Cancelled jobs to tell their streams of (after their deliveries).
    pub cancel: Vec<(StreamId, JobId, LeaseToken)>,
    pub release: Vec<Release>,
    /// Leases to look at in the database (`check_leases`: reap the expired,
    /// report the live), back as [`Input::LeaseChecked`].
    pub check: Vec<(JobId, LeaseToken)>,
    /// Lease statements to run, back as [`Input::Leased`].
    pub rounds: Vec<Round>,
    /// List our live leases on jobs enqueued a while ago, back as
    /// [`Input::Unheard`].
    pub sweep: bool,
    /// Ask when these queues' next jobs are due, back as [`Input::DueKnown`].
    pub due: Vec<QueueName>,
    /// Offers to publish to the other replicas.
    pub publish: Vec<Publish>,
    /// Streams that ended for good (metrics).
    pub ended: Vec<StreamId>,
    /// The drain is over: carry it out, then report the drain done.
    pub drained: Option<Drained>,
}

impl Effects {
    fn release(&mut self, leases: Vec<(JobId, LeaseToken)>, why: &'static str, refund: bool) {
        if !leases.is_empty() {
            self.release.push(Release {
                leases,
                why,
                refund,
                undelivered: Vec::new(),
                finish: None,
            });
        }
    }

    /// A half-closed stream's leases go back; then it ends.
    fn finished(&mut self, f: Finished) {
        self.release.push(Release {
            leases: f.unsettled,
            why: CLOSED_BEFORE_SETTLING,
            refund: false,
            undelivered: f.undelivered,
            finish: Some(f.id),
        });
    }
}

/// The dispatcher's state and decisions (see the module docs).
pub(crate) struct Machine {
    core: Core,
    /// A drain was asked for and has not been carried out yet.
    drain_asked: bool,
}

/// Why a released job was let go (its `last_error` unless refunded).
pub(crate) const CLOSED_BEFORE_SETTLING: &str = "consumer stream closed before settling";
pub(crate) const CLOSED_BEFORE_DELIVERY: &str = "stream closed before delivery";
pub(crate) const NEVER_HEARD_OF: &str = "handed over, never heard of";
pub(crate) const SHUT_DOWN: &str = "broker shut down before the job was settled";
pub(crate) const NOT_SENT_IN_TIME: &str = "lease too far gone before it could be sent";

impl Machine {
    pub fn new(core: Core) -> Machine {
        Machine {
            core,
            drain_asked: false,
        }
    }

    /// When the task must look again at the latest.
    pub fn next_timer(&self) -> Instant {
        self.core.next_timer()
    }

    #[cfg(test)]
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Takes one input; its effects are added to `fx`.
    pub fn input(&mut self, input: Input, now: Instant, fx: &mut Effects) {
        match input {
            Input::Open { id, sub } => {
                if self.core.is_draining() {
                    fx.refused.push(id);
                    return;
                }
                self.core.open(id, sub);
            }
            Input::Closed(id) => self.close(id, false, fx),
            Input::Finish(id) => self.close(id, true, fx),
            Input::Credit(id, n) => self.core.set_credit(id, n),
            Input::Wake(wakes) => self.core.wake(wakes, now),
            Input::WakeAll => {
                let verify = self.core.wake_all(now);
                fx.check.extend(verify);
            }
            Input::Settled(leases) => self.core.settled(leases),
            Input::Cancelled(leases) => fx.cancel.extend(self.core.cancelled(leases)),
            Input::Acking(leases) => self.core.acking(leases),
            Input::Extended(id, lease_ms) => self.core.extended(id, lease_ms, now),
            Input::LeaseChecked { checked, alive } => self.core.lease_checked(checked, alive, now),
            Input::Leased(round, result) => {
                if let Err(e) = &result {
                    warn!(error = %e, "lease statement failed; retrying in 1s");
                }
                let delivered = self.core.finish_round(round, result, now);
                self.deliver(delivered, fx);
            }
            Input::Handed(handoff) => {
                let delivered = self.core.handed(handoff, now);
                self.deliver(delivered, fx);
            }
            Input::RemoteHanded(jobs) => {
                let delivered = self.core.remote_handed(jobs, now);
                self.deliver(delivered, fx);
            }
            Input::Unheard(Ok(leases)) => self.core.unheard(leases),
            Input::Unheard(Err(e)) => {
                warn!(error = %e, "lost hand-over check failed; the next poll retries")
            }
            Input::DueKnown(Ok(rows)) => self.core.due_known(rows, now),
            Input::DueKnown(Err(e)) => {
                warn!(error = %e, "next-due query failed; the fallback poll covers it")
            }
            Input::Unsent(sid, id, token) => {
                if self.core.unsent(sid, id, token) {
                    fx.release(vec![(id, token)], NOT_SENT_IN_TIME, true);
                }
            }
            Input::Drain => {
                // Carried out by `step` once no lease statement is in flight.
                self.core.begin_drain();
                self.drain_asked = true;
            }
        }
        for f in self.core.take_finished() {
            fx.finished(f);
        }
    }

    /// What the clock and the state ask for now: timers that fired, offers
    /// to reconcile and publish, lease rounds, the sweep for lost
    /// hand-overs, due-time questions, and the end of a drain.
    pub fn step(&mut self, now: Instant, fx: &mut Effects) {
        fx.ended.extend(self.core.take_ended());
        let checks = self.core.fire_timers(now);
        fx.check.extend(checks.expired);
        fx.check.extend(checks.verify);
        if self.core.is_draining() {
            fx.publish.extend(self.core.withdrawals());
            if self.core.rounds_in_flight() == 0 && std::mem::take(&mut self.drain_asked) {
                let leases = self.core.unsettled();
                let streams = self.core.take_streams();
                fx.ended.extend(self.core.take_ended());
                fx.drained = Some(Drained {
                    leases,
                    streams: streams.into_iter().map(|(id, _, _)| id).collect(),
                });
            }
            return;
        }
        let lost = self.core.take_unheard(now);
        if !lost.is_empty() {
            warn!(
                jobs = lost.len(),
                "releasing jobs handed to this broker whose hand-over never arrived"
            );
            fx.release(lost, NEVER_HEARD_OF, true);
        }
        fx.publish.extend(self.core.reconcile_offers(now));
        while let Some(round) = self.core.plan_round(now) {
            fx.rounds.push(round);
        }
        fx.sweep |= self.core.take_sweep();
        fx.due.extend(self.core.due_checks());
    }

    /// Jobs leased go to their streams; what nobody can take is released.
    /// Once a drain has begun nothing more is pushed: jobs a round or a
    /// hand-off leased meanwhile stay in flight and are released by the
    /// drain, attempt given back, without reaching a consumer.
    fn deliver(&mut self, delivered: Delivered, fx: &mut Effects) {
        if !self.core.is_draining() {
            for (sid, job) in delivered.jobs {
                // None: ended meanwhile (an in-order hold outlived it).
                if let Some(until) = self.core.send_by(sid, job.id) {
                    fx.deliver.push((sid, job, until));
                }
            }
        }
        fx.release(delivered.orphans, CLOSED_BEFORE_DELIVERY, true);
    }

    /// Forgets a stream: its outlet is closed, then its unsettled jobs
    /// released (`finish`: its client half-closed and waits to hear when;
    /// see `Core::close`).
    fn close(&mut self, id: StreamId, finish: bool, fx: &mut Effects) {
        let leases = self.core.close(id, finish);
        debug!(
            stream = id,
            unsettled = leases.len(),
            finish,
            "stream closed"
        );
        fx.closed.push(id);
        fx.release(leases, CLOSED_BEFORE_SETTLING, false);
    }
}
