//! The history checker (tests/common/history.rs) checked: a history with
//! one planted anomaly of every kind it knows is reported with each of them
//! (and with nothing else), the duplicates and refusals each exemption
//! explains are not, an exemption that names another broker excuses
//! nothing, and a clean history is reported clean; likewise for the rules
//! on job keys in queues ordered by key. The histories run on a
//! manual clock: local time is set, and the database clock is the wall
//! clock `W` at local time 0 plus local time.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::history::{Bounds, Delivered, History, Op, Report};
use leaseq::pb;
use tonic::{Code, Status};

/// The database clock at local time 0, µs since the epoch.
const W: i64 = 1_800_000_000_000_000;

fn at(secs: f64) -> Duration {
    Duration::from_secs_f64(secs)
}

/// A planted history and the helpers that write it.
struct Plant {
    h: History,
}

impl Plant {
    fn new() -> Plant {
        let h = History::manual(W);
        h.set_bounds(Bounds {
            settle: Duration::from_secs(15),
            stall: Duration::from_secs(5),
        });
        Plant { h }
    }

    fn enqueue(&self, t: f64, payload: &str) {
        self.h.set_now(at(t));
        self.h.enqueue_ok(payload, payload);
    }

    /// As [`Plant::enqueue`], with the job key `key` into `queue`.
    fn enqueue_key(&self, t: f64, payload: &str, (queue, key): (&str, &str)) {
        self.h.job_key(payload, queue, key);
        self.enqueue(t, payload);
    }

    /// Attempt `attempt` of job `id`, with the job key `key`, received at
    /// `t` on broker 0, leased a millisecond before for `lease` s.
    fn deliver_key(
        &self,
        stream: u64,
        (id, key, attempt): (&str, &str, i32),
        t: f64,
        lease: f64,
    ) -> Delivered {
        let token = format!("{id}-{attempt}");
        self.deliver_job(stream, 0, (id, key, attempt), &token, (t, t - 0.001, lease))
    }

    /// Job `id` (its payload too) received at local `t` under `token`,
    /// leased at `start` (database time, seconds after W) for `lease` s.
    fn deliver_lease(
        &self,
        stream: u64,
        broker: usize,
        id: &str,
        token: &str,
        (t, start, lease): (f64, f64, f64),
    ) -> Delivered {
        self.deliver_job(stream, broker, (id, "", 1), token, (t, start, lease))
    }

    /// As [`Plant::deliver_lease`], attempt `attempt` of job `id` naming
    /// the job key `key` (empty: none).
    fn deliver_job(
        &self,
        stream: u64,
        broker: usize,
        (id, key, attempt): (&str, &str, i32),
        token: &str,
        (t, start, lease): (f64, f64, f64),
    ) -> Delivered {
        self.h.set_now(at(t));
        let expires = W + ((start + lease) * 1e6) as i64;
        let d = pb::Delivery {
            job: Some(pb::Job {
                id: id.into(),
                payload: id.as_bytes().to_vec(),
                attempt,
                key: key.into(),
                ..Default::default()
            }),
            lease_token: token.into(),
            lease_expires_at: Some(prost_types::Timestamp {
                seconds: expires.div_euclid(1_000_000),
                nanos: (expires.rem_euclid(1_000_000) * 1000) as i32,
            }),
        };
        self.h.delivered(stream, broker, at(lease), &d)
    }

    /// Leased a millisecond before it was received, for 2 s.
    fn deliver(&self, stream: u64, broker: usize, id: &str, token: &str, t: f64) -> Delivered {
        self.deliver_lease(stream, broker, id, token, (t, t - 0.001, 2.0))
    }

    /// A settle sent at `sent`, answered at `answered` with `r`.
    fn settle(&self, op: Op, d: &Delivered, sent: f64, answered: f64, r: Result<(), Code>) {
        self.h.set_now(at(sent));
        let s = self.h.sent(op, d, d.broker);
        self.h.set_now(at(answered));
        self.h
            .answered(s, &r.map_err(|c| Status::new(c, "planted")));
    }

    fn ack(&self, d: &Delivered, sent: f64) {
        self.settle(Op::Ack, d, sent, sent + 0.05, Ok(()));
    }

    /// An Ack of `d` carrying the follow-ups `payloads`, sent at `sent`
    /// and answered 50 ms later with `r` (OK: the follow-up ids).
    fn ack_with(&self, d: &Delivered, sent: f64, payloads: &[&str], r: Result<&[&str], Code>) {
        self.h.set_now(at(sent));
        let fu = payloads.iter().map(|p| p.to_string()).collect();
        let s = self.h.sent_ack_with(d, d.broker, fu);
        self.h.set_now(at(sent + 0.05));
        let r = r
            .map(|ids| ids.iter().map(|i| i.to_string()).collect())
            .map_err(|c| Status::new(c, "planted"));
        self.h.acked(s, &r);
    }

    /// Job `id` with payload `payload` (a follow-up's), received at `t` on
    /// broker 0 under token `{id}-{attempt}`, leased a millisecond before
    /// for 2 s; then acked 0.1 s later.
    fn deliver_acked(&self, stream: u64, (id, payload, attempt): (&str, &str, i32), t: f64) {
        self.h.set_now(at(t));
        let d = self
            .h
            .delivered(stream, 0, at(2.0), &delivery(id, payload, attempt, t, &[]));
        self.ack(&d, t + 0.1);
    }

    /// The job `id` of the tick `tick` (seconds after W) of `schedule`,
    /// received at `t` (attempt 1), then acked 0.1 s later.
    fn tick(&self, stream: u64, schedule: &str, (id, tick): (&str, f64), t: f64) {
        self.h.set_now(at(t));
        let us = W + (tick * 1e6) as i64;
        let header = chrono::DateTime::from_timestamp_micros(us)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let headers = [
            ("leaseq-schedule", schedule),
            ("leaseq-schedule-tick", header.as_str()),
        ];
        let payload = format!("tick:{schedule}");
        let d = self
            .h
            .delivered(stream, 0, at(2.0), &delivery(id, &payload, 1, t, &headers));
        self.ack(&d, t + 0.1);
    }

    fn refused(&self, op: Op, d: &Delivered, sent: f64) {
        self.settle(op, d, sent, sent + 0.05, Err(Code::FailedPrecondition));
    }

    fn keyed(&self, key: &str, payload: &str, sent: f64, r: Result<(&str, bool), Code>) {
        self.h.set_now(at(sent + 0.05));
        self.h.enqueue_keyed(
            key,
            payload,
            at(sent),
            &r.map(|(id, dup)| (id.to_owned(), dup))
                .map_err(|c| Status::new(c, "planted")),
        );
    }

    fn check(&self) -> Report {
        self.h.check(&HashSet::new(), &HashSet::new())
    }
}

/// A delivery of attempt `attempt` of job `id` with `payload` and
/// `headers`, leased at `t` - 1 ms for 2 s, under token `{id}-{attempt}`.
fn delivery(
    id: &str,
    payload: &str,
    attempt: i32,
    t: f64,
    headers: &[(&str, &str)],
) -> pb::Delivery {
    let expires = W + ((t - 0.001 + 2.0) * 1e6) as i64;
    pb::Delivery {
        job: Some(pb::Job {
            id: id.into(),
            payload: payload.as_bytes().to_vec(),
            attempt,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }),
        lease_token: format!("{id}-{attempt}"),
        lease_expires_at: Some(prost_types::Timestamp {
            seconds: expires.div_euclid(1_000_000),
            nanos: (expires.rem_euclid(1_000_000) * 1000) as i32,
        }),
    }
}

/// The names (job ids, or stream numbers) each kind of anomaly mentions,
/// out of `names`.
fn found(r: &Report, names: &[&str]) -> Vec<(&'static str, Vec<String>)> {
    r.kinds()
        .iter()
        .map(|(kind, list)| {
            let mut hit: Vec<String> = names
                .iter()
                .filter(|n| {
                    list.iter().any(|e| {
                        e.split_whitespace().next().map(|w| w.trim_end_matches(':')) == Some(n)
                    })
                })
                .map(|n| n.to_string())
                .collect();
            hit.sort();
            (*kind, hit)
        })
        .collect()
}

#[test]
fn checker_finds_every_planted_anomaly() {
    let p = Plant::new();
    let h = &p.h;
    let s1 = h.stream_opened(0);
    let s2 = h.stream_opened(0);
    let s_b1 = h.stream_opened(1);
    let s_cut = h.stream_opened(0);
    let s_dropped = h.stream_opened(0);
    let s_gone = h.stream_opened(0);
    let stalled = h.consumer_stream(2, 2, false);
    let excused = h.consumer_stream(3, 1, false);
    let full = h.consumer_stream(4, 1, false);
    let jobs = [
        "lost",
        "overlap",
        "after-ack",
        "twice",
        "same",
        "refused",
        "refused-nack",
        "refused-extend",
        "stale-nack",
        "stale-extend",
        "late-expiry",
        "late-release",
        "late-settle",
        "other-drain",
        "other-drain-refused",
        // Explained: none of these is an anomaly.
        "expired",
        "nacked",
        "cut",
        "drained",
        "refused-expired",
        "refused-dropped",
        "refused-drained",
        "refused-in-flight",
        "refused-retry",
        "extended",
    ];
    for id in jobs {
        p.enqueue(0.0, id);
    }

    // Never acked OK: its one Ack was refused after its lease ran out
    // (explained: no refused-valid).
    let a = p.deliver(s1, 0, "lost", "l1", 1.0);
    p.refused(Op::Ack, &a, 3.5);

    // Leased again while the first lease was current, nothing released it.
    p.deliver(s1, 0, "overlap", "o1", 1.0);
    let b = p.deliver(s2, 0, "overlap", "o2", 1.5);
    p.ack(&b, 1.6);

    // Leased again after an Ack returned OK.
    let a = p.deliver(s1, 0, "after-ack", "a1", 1.0);
    p.ack(&a, 1.1);
    p.deliver(s2, 0, "after-ack", "a2", 4.0);

    // Acked OK twice (after-ack too).
    let a = p.deliver(s1, 0, "twice", "t1", 1.0);
    p.ack(&a, 1.1);
    let b = p.deliver(s2, 0, "twice", "t2", 4.0);
    p.ack(&b, 4.1);

    // One token delivered twice.
    let a = p.deliver(s1, 0, "same", "s1", 1.0);
    p.deliver(s2, 0, "same", "s1", 1.2);
    p.ack(&a, 1.3);

    // Refused while current (answered long before the lease's end, nothing
    // released it), each settle; the job comes back after its expiry.
    for (id, op) in [
        ("refused", Op::Ack),
        ("refused-nack", Op::Nack),
        ("refused-extend", Op::Extend),
    ] {
        let a = p.deliver(s1, 0, id, &format!("{id}1"), 1.0);
        p.refused(op, &a, 1.1);
        let b = p.deliver(s2, 0, id, &format!("{id}2"), 3.5);
        p.ack(&b, 3.6);
    }

    // Answered OK though the job had been leased again (after an expiry)
    // and delivered before the settle was sent.
    let a = p.deliver(s1, 0, "stale-nack", "sn1", 1.0);
    let b = p.deliver(s2, 0, "stale-nack", "sn2", 3.5);
    p.settle(Op::Nack, &a, 3.6, 3.7, Ok(()));
    p.ack(&b, 3.8);
    let a = p.deliver(s1, 0, "stale-extend", "se1", 1.0);
    let b = p.deliver(s2, 0, "stale-extend", "se2", 3.5);
    h.set_now(at(3.6));
    let sent = h.sent(Op::Extend, &a, 0);
    h.set_now(at(3.7));
    // The extension (2 s more) makes the two leases overlap as well.
    h.extended(sent, &Ok(W + 5_600_000));
    p.ack(&b, 3.8);

    // Received half a second after its lease ran out (its Ack accepted:
    // nobody else had it).
    let a = p.deliver_lease(s1, 0, "late-expiry", "le1", (3.0, 0.5, 2.0));
    p.ack(&a, 3.1);

    // Received on a stream the client had dropped, after the job had been
    // leased again elsewhere (the second lease is explained by the drop).
    h.set_now(at(1.2));
    h.stream_dropped(s_cut);
    p.deliver_lease(s_cut, 0, "late-release", "lr1", (1.6, 0.999, 2.0));
    let b = p.deliver(s2, 0, "late-release", "lr2", 1.5);
    p.ack(&b, 1.7);

    // Settled 19 s after the faults ended (bound 15 s).
    h.set_now(at(10.0));
    h.faults_over();
    let a = p.deliver(s1, 0, "late-settle", "ls1", 29.0);
    p.ack(&a, 29.1);

    // A drain of broker 1 explains nothing of broker 0's streams: a
    // second lease and a refusal are anomalies.
    h.set_now(at(1.05));
    h.drain(1);
    p.deliver(s1, 0, "other-drain", "od1", 1.0);
    let b = p.deliver(s2, 0, "other-drain", "od2", 1.5);
    p.ack(&b, 1.6);
    let a = p.deliver(s1, 0, "other-drain-refused", "odr1", 1.0);
    p.refused(Op::Ack, &a, 1.2);
    let b = p.deliver(s2, 0, "other-drain-refused", "odr2", 3.5);
    p.ack(&b, 3.6);

    // --- explained
    // The second lease began after the first expired.
    p.deliver(s1, 0, "expired", "e1", 1.0);
    let b = p.deliver(s2, 0, "expired", "e2", 3.5);
    p.ack(&b, 3.6);
    // The first was nacked before the second was received.
    let a = p.deliver(s1, 0, "nacked", "n1", 1.0);
    p.settle(Op::Nack, &a, 1.1, 1.2, Ok(()));
    let b = p.deliver(s2, 0, "nacked", "n2", 1.3);
    p.ack(&b, 1.4);
    // Its stream was dropped before.
    p.deliver(s_dropped, 0, "cut", "c1", 1.0);
    h.set_now(at(1.1));
    h.stream_dropped(s_dropped);
    let b = p.deliver(s2, 0, "cut", "c2", 1.3);
    p.ack(&b, 1.4);
    // Its broker (1) was draining.
    p.deliver(s_b1, 1, "drained", "d1", 1.0);
    let b = p.deliver(s2, 0, "drained", "d2", 1.3);
    p.ack(&b, 1.4);
    // Refused after the lease's end; after its stream was dropped; after
    // its broker began to drain; after an Ack of it with no answer.
    let a = p.deliver(s1, 0, "refused-expired", "re1", 1.0);
    p.refused(Op::Extend, &a, 3.1);
    let b = p.deliver(s2, 0, "refused-expired", "re2", 3.5);
    p.ack(&b, 3.6);
    let a = p.deliver(s_gone, 0, "refused-dropped", "rd1", 1.0);
    h.set_now(at(1.05));
    h.stream_dropped(s_gone);
    p.refused(Op::Ack, &a, 1.1);
    let b = p.deliver(s2, 0, "refused-dropped", "rd2", 1.3);
    p.ack(&b, 1.4);
    let a = p.deliver(s_b1, 1, "refused-drained", "rr1", 1.0);
    p.refused(Op::Ack, &a, 1.1);
    let b = p.deliver(s2, 0, "refused-drained", "rr2", 1.3);
    p.ack(&b, 1.4);
    // Sent before its broker began to drain, answered after: the drain
    // may have released the lease first.
    let a = p.deliver(s_b1, 1, "refused-in-flight", "rf1", 0.9);
    p.settle(Op::Ack, &a, 1.0, 1.1, Err(Code::FailedPrecondition));
    let b = p.deliver(s2, 0, "refused-in-flight", "rf2", 1.3);
    p.ack(&b, 1.4);
    let a = p.deliver(s1, 0, "refused-retry", "rt1", 1.0);
    p.settle(Op::Ack, &a, 1.1, 1.2, Err(Code::DeadlineExceeded));
    p.refused(Op::Ack, &a, 1.3);
    // Extended past the second lease's start? No: extended, then acked.
    let a = p.deliver(s1, 0, "extended", "x1", 1.0);
    h.set_now(at(1.5));
    let sent = h.sent(Op::Extend, &a, 0);
    h.set_now(at(1.6));
    h.extended(sent, &Ok(W + 4_500_000));
    p.ack(&a, 4.0);

    // Delivered and acked, never enqueued.
    let a = p.deliver(s1, 0, "ghost", "g1", 1.0);
    p.ack(&a, 1.1);

    // A fault on broker 7 that no Ack on it followed.
    h.set_now(at(5.0));
    let f = h.fault("planted", Some(7));
    h.set_now(at(5.5));
    h.healed(f);
    // A client's cut of its own stream on broker 8: nothing to recover from.
    h.client_cut(8);

    // Dedup: a second job created while the first of its key was live;
    // a duplicate naming a job acked before; one naming a job no Enqueue
    // of the key created; and a consistent key.
    p.keyed("K1", "k1a", 1.0, Ok(("X", false)));
    p.keyed("K1", "k1b", 1.2, Ok(("Y", false)));
    p.keyed("K2", "k2a", 1.0, Ok(("Z", false)));
    p.keyed("K2", "k2b", 2.0, Ok(("Z", true)));
    p.keyed("K3", "k3a", 1.0, Ok(("V", false)));
    p.keyed("K3", "k3b", 1.2, Ok(("Q", true)));
    p.keyed("K4", "k4a", 1.0, Ok(("U", false)));
    p.keyed("K4", "k4b", 1.2, Ok(("U", true)));
    p.keyed("K4", "k4c", 3.0, Ok(("T", false)));
    for (payload, id, t) in [
        ("k1a", "X", 1.8),
        ("k1b", "Y", 1.8),
        ("k2a", "Z", 1.3),
        ("k3a", "V", 1.3),
        ("k4a", "U", 1.3),
        ("k4c", "T", 3.3),
    ] {
        h.set_now(at(t));
        let d = pb::Delivery {
            job: Some(pb::Job {
                id: id.into(),
                payload: payload.as_bytes().to_vec(),
                attempt: 1,
                ..Default::default()
            }),
            lease_token: format!("{id}-token"),
            lease_expires_at: Some(prost_types::Timestamp {
                seconds: (W + ((t + 2.0) * 1e6) as i64) / 1_000_000,
                nanos: 0,
            }),
        };
        let d = h.delivered(s1, 0, at(2.0), &d);
        p.ack(&d, t + 0.1);
    }
    // Q (named by k3b) is delivered and acked too, so nothing is lost.
    h.set_now(at(1.4));
    let q = pb::Delivery {
        job: Some(pb::Job {
            id: "Q".into(),
            payload: b"k3b".to_vec(),
            attempt: 1,
            ..Default::default()
        }),
        lease_token: "Q-token".into(),
        lease_expires_at: Some(prost_types::Timestamp {
            seconds: (W + 3_400_000) / 1_000_000,
            nanos: 0,
        }),
    };
    let q = h.delivered(s1, 0, at(2.0), &q);
    p.ack(&q, 1.5);

    // Job keys: in a queue ordered by key (one at a time), the later job
    // of a key leased while the earlier one was leased and unsettled.
    h.ordered_by_key("ord", 1);
    for id in ["key-early", "key-late"] {
        p.enqueue_key(0.0, id, ("ord", "K"));
    }
    let a = p.deliver_key(s1, ("key-early", "K", 1), 1.0, 2.0);
    let b = p.deliver_key(s2, ("key-late", "K", 1), 1.5, 2.0);
    p.ack(&a, 1.6);
    p.ack(&b, 1.7);
    // A per-key limit without order (one at a time): two of a key leased
    // at once is an anomaly; the later job leased first is not.
    h.key_concurrency("lim", 1);
    for id in ["lim-early", "lim-late", "lim-last"] {
        p.enqueue_key(0.0, id, ("lim", "L"));
    }
    let a = p.deliver_key(s1, ("lim-early", "L", 1), 1.0, 2.0);
    let b = p.deliver_key(s2, ("lim-late", "L", 1), 1.5, 2.0);
    p.ack(&a, 1.6);
    p.ack(&b, 1.7);
    let c = p.deliver_key(s2, ("lim-last", "L", 1), 0.2, 0.3);
    p.ack(&c, 0.4);

    // A stream with credit that receives once, then nothing for 9 s while
    // jobs wait; one whose gap is a fault of its broker; one whose credit
    // is full (its one job held for 30 s).
    p.enqueue(0.0, "st1");
    p.enqueue(0.0, "ex1");
    p.enqueue(0.0, "ex2");
    p.enqueue(0.0, "fu1");
    let a = p.deliver(stalled, 2, "st1", "st1", 0.5);
    p.ack(&a, 0.6);
    let a = p.deliver(excused, 3, "ex1", "ex1", 1.0);
    p.ack(&a, 1.1);
    let full_d = p.deliver_lease(full, 4, "fu1", "fu1", (0.5, 0.499, 30.0));
    h.set_now(at(2.0));
    let f = h.fault("planted freeze", Some(3));
    h.set_now(at(9.0));
    h.healed(f);
    let a = p.deliver(excused, 3, "ex2", "ex2", 9.5);
    p.ack(&a, 9.6);
    for i in 0..=100 {
        h.set_now(at(f64::from(i) / 10.0));
        h.ready(Some(3));
    }
    p.ack(&full_d, 11.0);
    // What a consumer saw in the database at its stream's OK end.
    h.half_close_left(s1, vec!["half-left".into()]);

    let r = p.check();
    let mut names: Vec<&str> = jobs.to_vec();
    names.extend([
        "half-left",
        "ghost",
        "planted",
        "key",
        "stream",
        "key-early",
        "key-late",
        "lim-early",
        "lim-late",
        "lim-last",
    ]);
    let got = found(&r, &names);
    let want: Vec<(&str, Vec<&str>)> = vec![
        ("lost", vec!["lost"]),
        ("acked twice", vec!["twice"]),
        (
            "lease overlap",
            vec!["other-drain", "overlap", "stale-extend"],
        ),
        ("redelivered after ack", vec!["after-ack", "twice"]),
        ("delivered but never enqueued", vec!["ghost"]),
        ("one lease token delivered twice", vec!["same"]),
        (
            "valid settle refused",
            vec![
                "other-drain-refused",
                "refused",
                "refused-extend",
                "refused-nack",
            ],
        ),
        (
            "stale settle answered OK",
            vec!["stale-extend", "stale-nack"],
        ),
        (
            "delivered after its lease expired or was released",
            vec!["late-expiry", "late-release"],
        ),
        ("settled too late after the faults", vec!["late-settle"]),
        ("fault never recovered from", vec!["planted"]),
        ("dedup answer inconsistent", vec!["key"]),
        ("stream stalled while jobs waited", vec!["stream"]),
        ("key order broken", vec!["key-late"]),
        (
            "more than key_concurrency of a key leased at once",
            vec!["key-late", "lim-late"],
        ),
        ("follow-up missing though its Ack committed", vec![]),
        ("follow-up exists though its Ack did not commit", vec![]),
        ("follow-up with more than one job", vec![]),
        ("follow-up ids answered wrong", vec![]),
        ("schedule tick with more than one job", vec![]),
        ("schedule tick missed", vec![]),
        ("schedule job of no tick", vec![]),
        (
            "half-closed stream ended OK with a job still leased for it",
            vec!["half-left"],
        ),
    ];
    let want: Vec<(&str, Vec<String>)> = want
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(got, want, "{r:#?}");
    // One entry per planted instance: the refusals' op, the dedup keys,
    // the stalled stream.
    let count: Vec<usize> = r.kinds().iter().map(|k| k.1.len()).collect();
    assert_eq!(
        count,
        [
            1, 1, 3, 2, 1, 1, 4, 2, 2, 1, 1, 3, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 1
        ],
        "{r:#?}"
    );
    assert!(r.refused_valid.iter().any(|e| e.contains(": nack of")));
    assert!(r.refused_valid.iter().any(|e| e.contains(": extend of")));
    for key in ["key K1:", "key K2:", "key K3:"] {
        assert!(
            r.dedup_inconsistent.iter().any(|e| e.starts_with(key)),
            "{key} {:#?}",
            r.dedup_inconsistent
        );
    }
    assert!(
        r.stalls[0].starts_with(&format!("stream {stalled} ")),
        "{:#?}",
        r.stalls
    );
    // Explained duplicates: nack (nacked); closed (cut, drained,
    // late-release, refused-dropped, refused-drained, refused-in-flight);
    // the rest expiry.
    assert_eq!(r.dup_nack, 1, "{r:#?}");
    assert_eq!(r.dup_closed, 6, "{r:#?}");
    // With its story: the delivery and the refused Ack.
    assert!(
        r.lost[0].contains("delivered attempt 1 token l1")
            && r.lost[0].contains("ack of token l1 sent to broker 0: Refused"),
        "{r:#?}"
    );
    assert_eq!(r.anomalies().len(), 16, "{:#?}", r.anomalies());
}

/// A clean history: duplicates of every explanation, settles refused for a
/// reason, an extended lease, a dedup key used twice, streams that stall
/// only while a fault of their broker lasts.
#[test]
fn checker_reports_a_clean_history_clean() {
    let p = Plant::new();
    let h = &p.h;
    let s1 = h.consumer_stream(0, 4, false);
    let s2 = h.consumer_stream(1, 4, true);
    for id in ["a", "b", "c", "d", "e"] {
        p.enqueue(0.0, id);
    }
    let a = p.deliver(s1, 0, "a", "a1", 0.2);
    p.settle(Op::Nack, &a, 0.3, 0.35, Ok(()));
    let a = p.deliver(s2, 1, "a", "a2", 0.4);
    p.ack(&a, 0.5);
    p.deliver(s1, 0, "b", "b1", 0.2);
    let b = p.deliver(s2, 1, "b", "b2", 2.5);
    p.ack(&b, 2.6);
    let c = p.deliver(s1, 0, "c", "c1", 0.3);
    h.set_now(at(1.0));
    let sent = h.sent(Op::Extend, &c, 0);
    h.set_now(at(1.1));
    h.extended(sent, &Ok(W + 3_000_000));
    p.ack(&c, 2.8);
    let d = p.deliver(s2, 1, "d", "d1", 0.3);
    p.refused(Op::Ack, &d, 2.5);
    let d = p.deliver(s1, 0, "d", "d2", 2.6);
    p.ack(&d, 2.7);
    p.keyed("K", "k", 3.0, Ok(("k", false)));
    p.keyed("K", "k-again", 3.1, Ok(("k", true)));
    let k = p.deliver(s1, 0, "k", "k1", 3.2);
    p.ack(&k, 3.3);
    // Jobs wait while broker 1 is frozen (its stream s2 receives nothing),
    // none otherwise.
    h.set_now(at(3.0));
    let f = h.fault("frozen", Some(1));
    h.set_now(at(3.5));
    h.healed(f);
    // Its first Ack after the fault.
    let e = p.deliver(s2, 1, "e", "e1", 4.0);
    p.ack(&e, 4.1);
    for i in 0..=60 {
        h.set_now(at(f64::from(i) / 10.0));
        h.ready(Some(i64::from(i > 32 && i < 36)));
    }
    h.set_now(at(6.0));
    h.faults_over();
    let r = p.check();
    assert!(r.anomalies().is_empty(), "{:#?}", r.anomalies());
    assert_eq!(r.duplicates, 3, "{r:#?}");
    assert_eq!((r.dup_expiry, r.dup_nack), (2, 1), "{r:#?}");
    assert_eq!((r.extends, r.ack_stale), (1, 1), "{r:#?}");
    assert_eq!((r.dedup_answers, r.dedup_duplicates), (2, 1), "{r:#?}");
}

/// The one exemption for a late delivery is narrow: a broker frozen by
/// SIGSTOP while the lease was live, and the delivery received within a
/// second of its SIGCONT (`frozen_late`, counted, not an anomaly). The same
/// lateness on another broker, or later after the SIGCONT, stays an
/// anomaly.
#[test]
fn late_deliveries_from_a_frozen_broker_are_counted_apart_and_only_those() {
    let p = Plant::new();
    let h = &p.h;
    let (s0, s1) = (h.stream_opened(0), h.stream_opened(1));
    for job in ["frozen", "other-broker", "much-later"] {
        p.enqueue(0.5, job);
    }
    h.set_now(at(1.0));
    let f = h.fault("SIGSTOP 3 s", Some(1));
    h.set_now(at(4.0));
    h.healed(f);
    // Each leased at 1.0 for 2 s (database time), received after 3.0.
    let late = [
        p.deliver_lease(s1, 1, "frozen", "t1", (4.03, 1.0, 2.0)),
        p.deliver_lease(s0, 0, "other-broker", "t2", (4.03, 1.0, 2.0)),
        p.deliver_lease(s1, 1, "much-later", "t3", (5.5, 1.0, 2.0)),
    ];
    for d in &late {
        p.ack(d, 5.6);
    }
    let r = p.check();
    assert_eq!(r.frozen_late.len(), 1, "{r:#?}");
    assert!(r.frozen_late[0].starts_with("frozen "), "{r:#?}");
    let mut anomalies: Vec<&str> = r
        .delivered_released
        .iter()
        .map(|e| e.split(' ').next().unwrap())
        .collect();
    anomalies.sort();
    assert_eq!(anomalies, ["much-later", "other-broker"], "{r:#?}");
}

/// A delivery that crossed its stream's half-close on the wire (received
/// after the client half-closed, its job released and leased again
/// meanwhile) is counted apart: the client ignores it. The same after a
/// cut (dropped, not half-closed) is an anomaly still.
#[test]
fn a_delivery_crossing_a_half_close_is_counted_apart_and_only_that() {
    let p = Plant::new();
    let h = &p.h;
    let (closed, cut, other) = (h.stream_opened(0), h.stream_opened(0), h.stream_opened(0));
    for job in ["crossed", "after-cut"] {
        p.enqueue(0.5, job);
    }
    h.set_now(at(1.2));
    h.stream_half_closed(closed);
    h.stream_dropped(cut);
    // Leased at 1.1 for 2 s; released at the close and leased again at
    // 1.3; the first lease's delivery arrives at 1.4.
    for (s, job) in [(closed, "crossed"), (cut, "after-cut")] {
        p.deliver_lease(s, 0, job, &format!("{job}-1"), (1.4, 1.1, 2.0));
        let b = p.deliver_lease(other, 0, job, &format!("{job}-2"), (1.35, 1.3, 2.0));
        p.ack(&b, 1.5);
    }
    let r = p.check();
    assert_eq!(r.after_half_close.len(), 1, "{r:#?}");
    assert!(r.after_half_close[0].starts_with("crossed "), "{r:#?}");
    let anomalies: Vec<&str> = r
        .delivered_released
        .iter()
        .map(|e| e.split(' ').next().unwrap())
        .collect();
    assert_eq!(anomalies, ["after-cut"], "{r:#?}");
}

/// A history of keyed jobs in two queues ordered by key ("q1", one of a key
/// at a time; "q2", two), on one stream. Every key of it is in order but
/// for those planted when `broken`. Returns it, and the ids in the dead
/// letters at its end.
fn keyed_history(broken: bool) -> (Plant, HashSet<String>) {
    let p = Plant::new();
    let h = &p.h;
    let s = h.stream_opened(0);
    h.ordered_by_key("q1", 1);
    h.ordered_by_key("q2", 2);
    let mut dead = HashSet::new();
    let q1 = |key| ("q1", key);

    // In order: a1 nacked keeps its place (a2 waits for its retry, acked);
    // a2 and a3 enqueued while a1 was live.
    p.enqueue_key(0.0, "a1", q1("A"));
    p.enqueue_key(0.1, "a2", q1("A"));
    p.enqueue_key(0.2, "a3", q1("A"));
    let d = p.deliver_key(s, ("a1", "A", 1), 1.0, 2.0);
    p.settle(Op::Nack, &d, 1.1, 1.15, Ok(()));
    let d = p.deliver_key(s, ("a1", "A", 2), 1.2, 2.0);
    p.ack(&d, 1.3);
    let d = p.deliver_key(s, ("a2", "A", 1), 1.4, 2.0);
    p.ack(&d, 1.5);
    let d = p.deliver_key(s, ("a3", "A", 1), 1.6, 2.0);
    p.ack(&d, 1.7);

    // d1 nacked into the dead letters lets d2 go.
    p.enqueue_key(0.0, "d1", q1("D"));
    p.enqueue_key(0.0, "d2", q1("D"));
    let d = p.deliver_key(s, ("d1", "D", 1), 1.0, 2.0);
    p.settle(Op::Nack, &d, 1.1, 1.15, Ok(()));
    dead.insert("d1".to_owned());
    let d = p.deliver_key(s, ("d2", "D", 1), 1.3, 2.0);
    p.ack(&d, 1.4);

    // e1 dead-lettered by the broker, unseen (its last lease ran out at
    // 1.5): e2 goes.
    p.enqueue_key(0.0, "e1", q1("E"));
    p.enqueue_key(0.0, "e2", q1("E"));
    p.deliver_key(s, ("e1", "E", 1), 1.0, 0.5);
    dead.insert("e1".to_owned());
    let d = p.deliver_key(s, ("e2", "E", 1), 2.0, 2.0);
    p.ack(&d, 2.1);

    // g1's Ack lost its answer (it may have committed): g2 goes.
    p.enqueue_key(0.0, "g1", q1("G"));
    p.enqueue_key(0.0, "g2", q1("G"));
    let d = p.deliver_key(s, ("g1", "G", 1), 1.0, 2.0);
    p.settle(Op::Ack, &d, 1.1, 1.2, Err(Code::DeadlineExceeded));
    let d = p.deliver_key(s, ("g2", "G", 1), 1.3, 2.0);
    p.ack(&d, 1.4);

    // h1 (the smaller id) committed after h2 was leased: no earlier job
    // then; it goes after h2's Ack.
    p.enqueue_key(0.0, "h2", q1("H"));
    let d = p.deliver_key(s, ("h2", "H", 1), 0.5, 2.0);
    p.enqueue_key(1.0, "h1", q1("H"));
    p.ack(&d, 1.5);
    let d = p.deliver_key(s, ("h1", "H", 1), 1.6, 2.0);
    p.ack(&d, 1.7);

    // Two of a key at once in q2; the third after one is acked.
    for id in ["p1", "p2", "p3"] {
        p.enqueue_key(0.0, id, ("q2", "P"));
    }
    let d1 = p.deliver_key(s, ("p1", "P", 1), 1.0, 2.0);
    let d2 = p.deliver_key(s, ("p2", "P", 1), 1.1, 2.0);
    p.ack(&d1, 1.15);
    let d3 = p.deliver_key(s, ("p3", "P", 1), 1.2, 2.0);
    p.ack(&d2, 1.3);
    p.ack(&d3, 1.4);

    // A job without a key in an ordered queue is held to nothing.
    p.enqueue(0.0, "u1");
    let d = p.deliver(s, 0, "u1", "u1", 1.0);
    p.ack(&d, 1.1);

    if !broken {
        return (p, dead);
    }
    // b2 leased while b1 was leased, unsettled: out of order and two at once.
    p.enqueue_key(0.0, "b1", q1("B"));
    p.enqueue_key(0.0, "b2", q1("B"));
    let d1 = p.deliver_key(s, ("b1", "B", 1), 1.0, 2.0);
    let d2 = p.deliver_key(s, ("b2", "B", 1), 1.5, 2.0);
    p.ack(&d1, 1.6);
    p.ack(&d2, 1.7);

    // c1 nacked (a retry) lost its place to c2: out of order, never two
    // at once.
    p.enqueue_key(0.0, "c1", q1("C"));
    p.enqueue_key(0.0, "c2", q1("C"));
    let d = p.deliver_key(s, ("c1", "C", 1), 1.0, 2.0);
    p.settle(Op::Nack, &d, 1.1, 1.15, Ok(()));
    let d = p.deliver_key(s, ("c2", "C", 1), 1.3, 2.0);
    p.ack(&d, 1.4);
    let d = p.deliver_key(s, ("c1", "C", 2), 1.5, 2.0);
    p.ack(&d, 1.6);

    // f1 ends in the dead letters, but was leased again after f2 had gone:
    // live when f2 was leased.
    p.enqueue_key(0.0, "f1", q1("F"));
    p.enqueue_key(0.0, "f2", q1("F"));
    p.deliver_key(s, ("f1", "F", 1), 1.0, 0.5);
    let d = p.deliver_key(s, ("f2", "F", 1), 2.0, 2.0);
    p.ack(&d, 2.1);
    p.deliver_key(s, ("f1", "F", 2), 2.5, 0.5);
    dead.insert("f1".to_owned());

    // k1 (the smaller id) committed after k2 was leased, then leased while
    // k2 still held its lease: in order, but two of the key at once.
    p.enqueue_key(0.0, "k2", q1("K"));
    let d2 = p.deliver_key(s, ("k2", "K", 1), 0.5, 2.0);
    p.enqueue_key(1.0, "k1", q1("K"));
    let d1 = p.deliver_key(s, ("k1", "K", 1), 1.2, 2.0);
    p.ack(&d1, 1.3);
    p.ack(&d2, 1.5);

    // Three of a key at once in q2, whose limit is two.
    for id in ["m1", "m2", "m3"] {
        p.enqueue_key(0.0, id, ("q2", "M"));
    }
    let ds = [
        p.deliver_key(s, ("m1", "M", 1), 1.0, 2.0),
        p.deliver_key(s, ("m2", "M", 1), 1.1, 2.0),
        p.deliver_key(s, ("m3", "M", 1), 1.2, 2.0),
    ];
    for d in &ds {
        p.ack(d, 1.3);
    }

    // Delivered naming another key than its Enqueue sent.
    p.enqueue_key(0.0, "x1", q1("X"));
    let d = p.deliver_key(s, ("x1", "Y", 1), 1.0, 2.0);
    p.ack(&d, 1.1);
    (p, dead)
}

/// The first word of each entry, sorted: the job each names.
fn named(list: &[String]) -> Vec<&str> {
    let mut v: Vec<&str> = list
        .iter()
        .map(|e| e.split_whitespace().next().unwrap_or(""))
        .collect();
    v.sort();
    v
}

/// The key rules find what was planted, and nothing else: a job leased
/// while an earlier job of its key was leased (b2), or waiting for its
/// retry (c2), or dead-lettered only after a lease that began later (f2);
/// more than key_concurrency of a key leased at once (b2; m3 in a queue of
/// two; k1, whose smaller id committed after k2 was leased); a delivery
/// naming another key (x1). The in-order keys planted beside them (a retry
/// keeping its place, dead letters seen and unseen, an Ack whose answer was
/// lost, a smaller id committed late, two at once where two are allowed)
/// are not reported.
#[test]
fn checker_finds_keys_out_of_order_and_over_their_limit() {
    let (p, dead) = keyed_history(true);
    let r = p.h.check(&dead, &HashSet::new());
    assert_eq!(
        named(&r.key_order),
        ["b2", "c2", "f2", "m3", "x1"],
        "{:#?}",
        r.key_order
    );
    assert_eq!(
        named(&r.key_over_limit),
        ["b2", "k1", "m3"],
        "{:#?}",
        r.key_over_limit
    );
    // The other kinds find nothing.
    let others: Vec<&str> = r
        .kinds()
        .iter()
        .filter(|(kind, list)| !kind.contains("key") && !list.is_empty())
        .map(|(kind, _)| *kind)
        .collect();
    assert!(others.is_empty(), "{others:?}: {r:#?}");
    let behind = r.key_order.iter().filter(|e| e.contains("earlier job(s)"));
    assert_eq!(behind.count(), 4, "{:#?}", r.key_order);
    assert!(
        r.key_order
            .iter()
            .any(|e| e.contains("delivered with key \"Y\", enqueued with key \"X\"")),
        "{:#?}",
        r.key_order
    );
    assert_eq!(r.key_peak, 3, "{r:#?}");
}

/// The same history without the planted breaks: no anomaly; every keyed
/// delivery checked, two of a key at once at most, and jobs enqueued
/// behind a live job of their key counted.
#[test]
fn checker_reports_keys_in_order_clean() {
    let (p, dead) = keyed_history(false);
    let r = p.h.check(&dead, &HashSet::new());
    assert!(r.anomalies().is_empty(), "{:#?}", r.anomalies());
    // a1 twice, a2, a3, d1, d2, e1, e2, g1, g2, h1, h2, p1, p2, p3.
    assert_eq!(r.keyed, 15, "{r:#?}");
    assert_eq!(r.key_peak, 2, "{r:#?}");
    // a2 and a3, enqueued while a1 was live (h1 is behind nothing: h2
    // comes after it by id).
    assert_eq!(r.key_behind, 2, "{r:#?}");
}

/// A history of Acks carrying follow-up jobs (`AckRequest.enqueue`) and of
/// schedules' ticks, on one stream. Every follow-up exists iff its Ack
/// committed, once, under the id answered, and every tick has one job, but
/// for those planted when `broken`. Returns it, and the ids in the dead
/// letters at its end.
fn follow_up_history(broken: bool) -> (Plant, HashSet<String>) {
    let p = Plant::new();
    let h = &p.h;
    let s = h.stream_opened(0);
    let mut dead = HashSet::new();
    let (deadline, refused, unavailable) = (
        Code::DeadlineExceeded,
        Code::FailedPrecondition,
        Code::Unavailable,
    );
    for id in ["ok", "refused", "unknown-gone", "unknown-again", "dead-fu"] {
        p.enqueue(0.0, id);
    }

    // Answered OK with two ids: both delivered under them.
    let d = p.deliver(s, 0, "ok", "ok-1", 1.0);
    p.ack_with(&d, 1.1, &["ok>1", "ok>2"], Ok(&["O1", "O2"]));
    p.deliver_acked(s, ("O1", "ok>1", 1), 1.3);
    p.deliver_acked(s, ("O2", "ok>2", 1), 1.4);
    // Refused (after its lease's end): no follow-up; the job is leased
    // again and acked.
    let d = p.deliver(s, 0, "refused", "refused-1", 1.0);
    p.ack_with(&d, 3.5, &["refused>1"], Err(refused));
    let d = p.deliver(s, 0, "refused", "refused-2", 3.6);
    p.ack(&d, 3.7);
    // No answer, and the job is gone: it committed, its follow-up exists.
    let d = p.deliver(s, 0, "unknown-gone", "ug-1", 1.0);
    p.ack_with(&d, 1.1, &["unknown-gone>1"], Err(deadline));
    p.deliver_acked(s, ("U1", "unknown-gone>1", 1), 1.5);
    // No answer, and the job leased again after its lease ran out: it did
    // not commit, no follow-up.
    let d = p.deliver(s, 0, "unknown-again", "ua-1", 1.0);
    p.ack_with(&d, 1.1, &["unknown-again>1"], Err(unavailable));
    let d = p.deliver(s, 0, "unknown-again", "ua-2", 3.5);
    p.ack(&d, 3.6);
    // Answered OK; its follow-up, never delivered, is in the dead letters.
    let d = p.deliver(s, 0, "dead-fu", "df-1", 1.0);
    p.ack_with(&d, 1.1, &["dead-fu>1"], Ok(&["DF1"]));
    dead.insert("DF1".to_owned());

    // A schedule every second from W + 10 s, stopped after W + 13 s: each
    // tick has its job, the third received late (a catch-up).
    h.schedule_started("sched", W + 10_000_000);
    p.tick(s, "sched", ("T10", 10.0), 10.2);
    p.tick(s, "sched", ("T11", 11.0), 11.2);
    p.tick(s, "sched", ("T12", 12.0), 15.0);
    p.tick(s, "sched", ("T13", 13.0), 13.2);
    h.schedule_stopped("sched", W + 13_000_000, W + 13_500_000);

    if !broken {
        return (p, dead);
    }
    for id in [
        "fu-missing",
        "fu-missing-unknown",
        "fu-refused",
        "fu-unknown-later",
        "fu-dup",
        "fu-count",
        "fu-wrong-id",
        "fu-partial",
        "fu-both",
    ] {
        p.enqueue(0.0, id);
    }
    // Answered OK, its follow-up nowhere.
    let d = p.deliver(s, 0, "fu-missing", "fm-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-missing>1"], Ok(&["M1"]));
    // No answer, the job gone (it committed), its follow-up nowhere.
    let d = p.deliver(s, 0, "fu-missing-unknown", "fmu-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-missing-unknown>1"], Err(deadline));
    // Refused, yet its follow-up delivered.
    let d = p.deliver(s, 0, "fu-refused", "fr-1", 1.0);
    p.ack_with(&d, 3.5, &["fu-refused>1"], Err(refused));
    let d = p.deliver(s, 0, "fu-refused", "fr-2", 3.6);
    p.ack(&d, 3.7);
    p.deliver_acked(s, ("FR1", "fu-refused>1", 1), 4.0);
    // No answer, the job leased again later (it did not commit), yet its
    // follow-up delivered.
    let d = p.deliver(s, 0, "fu-unknown-later", "ful-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-unknown-later>1"], Err(unavailable));
    let d = p.deliver(s, 0, "fu-unknown-later", "ful-2", 3.5);
    p.ack(&d, 3.6);
    p.deliver_acked(s, ("FUL1", "fu-unknown-later>1", 1), 1.5);
    // One follow-up, two jobs.
    let d = p.deliver(s, 0, "fu-dup", "fd-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-dup>1"], Err(deadline));
    p.deliver_acked(s, ("FD1", "fu-dup>1", 1), 1.5);
    p.deliver_acked(s, ("FD2", "fu-dup>1", 1), 1.6);
    // Two follow-ups, one id answered.
    let d = p.deliver(s, 0, "fu-count", "fc-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-count>1", "fu-count>2"], Ok(&["C1"]));
    p.deliver_acked(s, ("C1", "fu-count>1", 1), 1.5);
    p.deliver_acked(s, ("C2", "fu-count>2", 1), 1.6);
    // The id answered is not the job delivered.
    let d = p.deliver(s, 0, "fu-wrong-id", "fw-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-wrong-id>1"], Ok(&["W1"]));
    p.deliver_acked(s, ("W2", "fu-wrong-id>1", 1), 1.5);
    // Two Acks of one lease, neither answered: either may have committed,
    // but not half of one's follow-ups.
    let d = p.deliver(s, 0, "fu-partial", "fp-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-partial>a1", "fu-partial>a2"], Err(deadline));
    p.ack_with(&d, 1.2, &["fu-partial>b1"], Err(deadline));
    p.deliver_acked(s, ("PA1", "fu-partial>a1", 1), 1.5);
    // Two Acks of one lease, neither answered, the follow-ups of both
    // delivered: both applied.
    let d = p.deliver(s, 0, "fu-both", "fb-1", 1.0);
    p.ack_with(&d, 1.1, &["fu-both>a1"], Err(deadline));
    p.ack_with(&d, 1.2, &["fu-both>b1"], Err(deadline));
    p.deliver_acked(s, ("BA1", "fu-both>a1", 1), 1.5);
    p.deliver_acked(s, ("BB1", "fu-both>b1", 1), 1.6);

    // Tick 11 with two jobs.
    h.schedule_started("sched-doubled", W + 10_000_000);
    p.tick(s, "sched-doubled", ("DB10", 10.0), 10.2);
    p.tick(s, "sched-doubled", ("DB11a", 11.0), 11.2);
    p.tick(s, "sched-doubled", ("DB11b", 11.0), 11.3);
    p.tick(s, "sched-doubled", ("DB12", 12.0), 12.2);
    h.schedule_stopped("sched-doubled", W + 12_000_000, W + 12_500_000);
    // Tick 11 without a job.
    h.schedule_started("sched-missed", W + 10_000_000);
    p.tick(s, "sched-missed", ("MS10", 10.0), 10.2);
    p.tick(s, "sched-missed", ("MS12", 12.0), 12.2);
    h.schedule_stopped("sched-missed", W + 12_000_000, W + 12_500_000);
    // A job of no tick (10.5 s), and one after the delete.
    h.schedule_started("sched-extra", W + 10_000_000);
    p.tick(s, "sched-extra", ("EX10", 10.0), 10.2);
    p.tick(s, "sched-extra", ("EX10h", 10.5), 10.7);
    p.tick(s, "sched-extra", ("EX11", 11.0), 11.2);
    p.tick(s, "sched-extra", ("EX14", 14.0), 14.2);
    h.schedule_stopped("sched-extra", W + 11_000_000, W + 11_500_000);
    (p, dead)
}

/// The follow-up and schedule rules find what was planted, and nothing
/// else: a follow-up missing though its Ack was answered OK, or had no
/// answer and its job is gone, or beside another follow-up of an Ack
/// whose commit is not known; one that exists though its Ack was refused,
/// or had no answer and its job was leased again, and those of two
/// unanswered Acks of one lease both existing; one with two jobs; ids
/// answered for fewer follow-ups than sent, or naming another job than
/// the one delivered; a tick with two jobs, a tick with none, and jobs of
/// times that are no tick. The consistent Acks and ticks planted beside
/// them are not reported.
#[test]
fn checker_finds_follow_ups_and_ticks_broken() {
    let (p, dead) = follow_up_history(true);
    let r = p.h.check(&dead, &HashSet::new());
    let names = [
        "ok",
        "refused",
        "unknown-gone",
        "unknown-again",
        "dead-fu",
        "fu-missing",
        "fu-missing-unknown",
        "fu-refused",
        "fu-unknown-later",
        "fu-dup",
        "fu-count",
        "fu-wrong-id",
        "fu-partial",
        "fu-both",
        "sched",
        "sched-doubled",
        "sched-missed",
        "sched-extra",
    ];
    let got: Vec<(&str, Vec<String>)> = found(&r, &names)
        .into_iter()
        .filter(|(_, hit)| !hit.is_empty())
        .collect();
    let want: Vec<(&str, Vec<&str>)> = vec![
        (
            "follow-up missing though its Ack committed",
            vec!["fu-missing", "fu-missing-unknown", "fu-partial"],
        ),
        (
            "follow-up exists though its Ack did not commit",
            vec!["fu-both", "fu-refused", "fu-unknown-later"],
        ),
        ("follow-up with more than one job", vec!["fu-dup"]),
        (
            "follow-up ids answered wrong",
            vec!["fu-count", "fu-wrong-id"],
        ),
        (
            "schedule tick with more than one job",
            vec!["sched-doubled"],
        ),
        ("schedule tick missed", vec!["sched-missed"]),
        ("schedule job of no tick", vec!["sched-extra"]),
    ];
    let want: Vec<(&str, Vec<String>)> = want
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(got, want, "{r:#?}");
    // Nothing else, and one entry per planted instance.
    let count: Vec<usize> = r.kinds().iter().map(|k| k.1.len()).collect();
    assert_eq!(
        count,
        [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 1, 2, 1, 1, 2, 0
        ],
        "{r:#?}"
    );
    assert!(
        r.follow_up_missing
            .iter()
            .any(|e| e.contains("fu-partial>a2") && e.contains("another follow-up")),
        "{:#?}",
        r.follow_up_missing
    );
    assert!(
        r.tick_doubled[0].contains("DB11a") && r.tick_doubled[0].contains("DB11b"),
        "{:#?}",
        r.tick_doubled
    );
    assert!(
        r.tick_missed[0].contains("tick 2027-01-15T08:00:11.000Z"),
        "{:#?}",
        r.tick_missed
    );
    let extra = r.tick_unscheduled.join("\n");
    assert!(extra.contains("EX10h") && extra.contains("EX14"), "{extra}");
}

/// The same history without the planted breaks: no anomaly; every
/// follow-up counted, those of the Acks that committed (answered OK, or
/// unanswered with their job gone) found, and every tick's job.
#[test]
fn checker_reports_follow_ups_and_ticks_clean() {
    let (p, dead) = follow_up_history(false);
    let r = p.h.check(&dead, &HashSet::new());
    assert!(r.anomalies().is_empty(), "{:#?}", r.anomalies());
    // ok (2), refused, unknown-gone, unknown-again, dead-fu.
    assert_eq!((r.follow_ups, r.follow_ups_applied), (6, 4), "{r:#?}");
    assert_eq!(r.ticks, 4, "{r:#?}");
    assert_eq!(r.acked_unanswered, 1, "unknown-gone: {r:#?}");
}
