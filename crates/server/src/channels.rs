//! Every NOTIFY channel the brokers use, and every payload's format: what
//! they say to each other through PostgreSQL. Who sends and who listens is
//! elsewhere (`settle` and `store::Store::notify` send, `notify` listens);
//! what is said is here, and only here.
//!
//! | channel                  | payload                                  | sent by                             |
//! |--------------------------|------------------------------------------|-------------------------------------|
//! | [`WAKE`]                 | `<sender>:<delay ms>:<queue>` ([`wake`]) | settle, bucket moves, SQL enqueue    |
//! | [`settle`]`(broker)`     | `job:token,...` ([`settled`])            | settle, to the broker that leased; SQL ack/nack |
//! | [`OFFERS`]               | JSON ([`OfferNote`])                     | the dispatcher's idle streams        |
//! | [`handed`]`(broker)`     | JSON ([`HandedNote`])                    | enqueue (a job leased to its stream) |
//!
//! Four senders are SQL, which cannot import these constants:
//! `store/sql/enqueue_handover.sql` (a [`HandedNote`] on [`handed`]),
//! the migration `20261123000001_sql_enqueue.sql` (`leaseq.enqueue()`: a
//! wake-up from sender `sql`), the migration `20261202000001_sql_ack.sql`
//! (`leaseq.ack()` and `leaseq.nack()`: one `job:token` on the leasing
//! broker's [`settle`] channel, wake-ups from sender `sql`), and the bucket moves' wake-up (sender
//! `placement`, its payload written in SQL, the channel bound from
//! [`WAKE`]). The tests below read those files, and every `pg_notify` in
//! `src/` and `migrations/`, and fail if they disagree with this module.
//!
//! PostgreSQL's NOTIFY payloads must be shorter than 8000 bytes
//! ([`MAX_PAYLOAD`]); every encoder here keeps to it.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{ClusterId, JobId, LeaseToken, Leased, NewJob, QueueName, StreamId, Wake};

/// Every broker LISTENs here for wake-ups (payload: [`wake`]).
pub(crate) const WAKE: &str = "leaseq_wake";
/// Brokers publish their streams' offers here (payload: [`OfferNote`]).
pub(crate) const OFFERS: &str = "leaseq_offers";
/// The prefix of [`settle`]'s channels.
const SETTLE_PREFIX: &str = "leaseq_settle_";
/// The prefix of [`handed`]'s channels.
const HANDED_PREFIX: &str = "leaseq_handed_";

/// The channel one broker LISTENs on to hear that jobs it leased were
/// settled on another replica (payload: [`settled`]).
pub(crate) fn settle(broker: Uuid) -> String {
    format!("{SETTLE_PREFIX}{}", broker.simple())
}

/// The channel one broker LISTENs on for jobs other replicas inserted
/// leased to its streams (payload: [`HandedNote`]).
pub(crate) fn handed(broker: Uuid) -> String {
    format!("{HANDED_PREFIX}{}", broker.simple())
}

/// PostgreSQL's NOTIFY payloads must be shorter than 8000 bytes.
pub(crate) const MAX_PAYLOAD: usize = 7999;

/// The most `job:token` pairs in one [`settled`] payload: 100 is 7,400
/// bytes.
const SETTLED_PER_PAYLOAD: usize = 100;

/// A wake-up's payload, `<sender>:<delay ms>:<queue>`: `sender` is the
/// broker's id (simple form), so that it skips its own; SQL senders use a
/// word (`sql`, `placement`) no broker id equals.
pub(crate) fn wake(sender: &str, w: &Wake) -> String {
    format!("{sender}:{}:{}", w.delay_ms, w.queue)
}

/// Reads a wake-up; None if unreadable or sent by `me` (a broker wakes its
/// own dispatcher in-process already).
pub(crate) fn parse_wake(payload: &str, me: &str) -> Option<Wake> {
    let mut parts = payload.splitn(3, ':');
    let sender = parts.next()?;
    if sender == me {
        return None;
    }
    let delay_ms: i64 = parts.next()?.parse().ok()?;
    let queue = QueueName::parse(parts.next()?)?;
    Some(Wake { queue, delay_ms })
}

/// The payloads telling one broker that these of its leases were settled:
/// comma-separated `job_id:lease_token` (the bare UUID: the listener knows
/// the cluster it listens on), at most [`SETTLED_PER_PAYLOAD`] per payload.
pub(crate) fn settled(leases: &[(JobId, LeaseToken)]) -> Vec<String> {
    leases
        .chunks(SETTLED_PER_PAYLOAD)
        .map(|chunk| {
            chunk
                .iter()
                .map(|(id, token)| format!("{id}:{}", token.0))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// The payload telling one broker that this lease of its was cancelled
/// (`CancelJob`): `job_id:lease_token:c`, on the same channel as
/// [`settled`] (its stream gets the credit back and tells its client).
pub(crate) fn cancelled(id: JobId, token: LeaseToken) -> String {
    format!("{id}:{}:c", token.0)
}

/// What a [`settled`] or [`cancelled`] payload names: the lease, and
/// whether it was a cancel.
pub(crate) type Ended = (JobId, LeaseToken, bool);

/// Reads a [`settled`] or [`cancelled`] payload heard on `cluster`'s
/// LISTEN connection; unreadable entries are skipped.
pub(crate) fn parse_settled(payload: &str, cluster: ClusterId) -> Vec<Ended> {
    payload
        .split(',')
        .filter_map(|entry| {
            let (id, rest) = entry.split_once(':')?;
            let (token, cancel) = match rest.split_once(':') {
                None => (rest, false),
                Some((token, "c")) => (token, true),
                Some(_) => return None,
            };
            Some((
                JobId(Uuid::try_parse(id).ok()?),
                LeaseToken(Uuid::try_parse(token).ok()?, cluster),
                cancel,
            ))
        })
        .collect()
}

/// Whether a job is small enough to be handed over in one NOTIFY: its
/// payload (base64) and headers, plus the fixed fields, stay well under the
/// limit. Bigger jobs take the wake-up and lease-round path.
pub(crate) fn fits(job: &NewJob) -> bool {
    job.payload.len() <= 3 * 1024 && job.headers_json.len() <= 1024
}

/// One stream's offer, as published on [`OFFERS`]: `credit` 0 withdraws it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OfferNote {
    #[serde(rename = "b")]
    pub broker: Uuid,
    #[serde(rename = "s")]
    pub stream: StreamId,
    #[serde(rename = "c")]
    pub credit: i32,
    #[serde(rename = "l", default)]
    pub lease_ms: Option<i64>,
    #[serde(rename = "n", default)]
    pub consumer: String,
    #[serde(rename = "q", default)]
    pub queues: Vec<String>,
}

impl OfferNote {
    /// The payload, or None if it would not fit (the stream then offers
    /// its credit to this replica's enqueues only).
    pub fn encode(&self) -> Option<String> {
        let s = serde_json::to_string(self).ok()?;
        (s.len() <= MAX_PAYLOAD).then_some(s)
    }

    pub fn parse(payload: &str) -> Option<OfferNote> {
        serde_json::from_str(payload).ok()
    }
}

/// A job inserted leased to stream `stream` of the receiving broker.
/// `store/sql/enqueue_handover.sql` writes the same object
/// (`json_build_object`): keep the two alike (a test checks the keys).
#[derive(Debug, Serialize, Deserialize)]
struct HandedWire {
    s: StreamId,
    id: Uuid,
    /// The lease token (its cluster is the one the note arrives on).
    t: Uuid,
    q: String,
    /// The lease, in ms, and when it ends (µs since the epoch, database time).
    l: i64,
    x: i64,
    /// Enqueued at, µs since the epoch.
    e: i64,
    pr: i32,
    /// The payload, base64.
    p: String,
    h: HashMap<String, String>,
}

/// A job handed to another replica's stream, on that replica's [`handed`]
/// channel.
#[derive(Debug)]
pub(crate) struct HandedNote {
    pub stream: StreamId,
    pub job: Leased,
}

impl HandedNote {
    /// The payload, or None if it would not fit (see [`fits`]).
    pub fn encode(stream: StreamId, job: &Leased) -> Option<String> {
        let wire = HandedWire {
            s: stream,
            id: job.id.0,
            t: job.token.0,
            q: job.queue.clone(),
            l: job.lease_ms,
            x: job.lease_expires_at.timestamp_micros(),
            e: job.enqueued_at.timestamp_micros(),
            pr: job.priority,
            p: BASE64.encode(&job.payload),
            h: job.headers.clone(),
        };
        let s = serde_json::to_string(&wire).ok()?;
        (s.len() <= MAX_PAYLOAD).then_some(s)
    }

    /// Reads a payload heard on `cluster`'s LISTEN connection.
    pub fn parse(payload: &str, cluster: ClusterId) -> Option<HandedNote> {
        let w: HandedWire = serde_json::from_str(payload).ok()?;
        let enqueued_at = DateTime::from_timestamp_micros(w.e)?;
        Some(HandedNote {
            stream: w.s,
            job: Leased {
                slot: 0,
                lease_ms: w.l,
                id: JobId(w.id),
                queue: w.q,
                payload: BASE64.decode(w.p).ok()?,
                headers: w.h,
                priority: w.pr,
                // Inserted leased: its first attempt.
                attempt: 1,
                enqueued_at,
                // Handed over at its insert: it was due at once.
                run_at: enqueued_at,
                last_error: None,
                token: LeaseToken(w.t, cluster),
                lease_expires_at: DateTime::from_timestamp_micros(w.x)?,
                // Keyed jobs are never handed over (broker.rs).
                key: None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use chrono::Utc;

    use super::*;

    #[test]
    fn wake_payloads() {
        let w = parse_wake("abc:0:orders:eu", "me").unwrap();
        assert_eq!(w.queue.as_str(), "orders:eu");
        assert_eq!(w.delay_ms, 0);
        assert!(parse_wake("me:0:orders", "me").is_none());
        assert!(parse_wake("abc:x:orders", "me").is_none());
        assert!(parse_wake("garbage", "me").is_none());
        let sent = Wake {
            queue: QueueName::parse("a:b").unwrap(),
            delay_ms: 250,
        };
        assert_eq!(parse_wake(&wake("b1", &sent), "b2"), Some(sent.clone()));
        assert_eq!(parse_wake(&wake("b1", &sent), "b1"), None);
    }

    #[test]
    fn settled_payloads_round_trip_and_fit() {
        let leases: Vec<(JobId, LeaseToken)> = (0..250)
            .map(|_| {
                (
                    JobId(Uuid::new_v4()),
                    LeaseToken(Uuid::new_v4(), ClusterId::HOME),
                )
            })
            .collect();
        let payloads = settled(&leases);
        assert_eq!(payloads.len(), 3);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        let back: Vec<(JobId, LeaseToken)> = payloads
            .iter()
            .flat_map(|p| parse_settled(p, ClusterId::HOME))
            .map(|(id, token, cancel)| {
                assert!(!cancel);
                (id, token)
            })
            .collect();
        assert_eq!(back, leases);
        // The cluster is the listener's, not the payload's.
        let there = parse_settled(&payloads[0], ClusterId(2));
        assert_eq!(there[0].1, LeaseToken(leases[0].1.0, ClusterId(2)));
        assert!(parse_settled("x:y,garbage", ClusterId::HOME).is_empty());
        // A cancel names its lease and says so; an unknown mark is skipped.
        let (id, token) = leases[0];
        assert_eq!(
            parse_settled(&cancelled(id, token), ClusterId::HOME),
            [(id, token, true)]
        );
        let odd = format!("{id}:{}:x", token.0);
        assert!(parse_settled(&odd, ClusterId::HOME).is_empty());
    }

    #[test]
    fn a_handed_job_arrives_as_it_was_sent() {
        let now = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
        let job = Leased {
            slot: 3,
            lease_ms: 30_000,
            id: JobId(Uuid::now_v7()),
            queue: "q.1".into(),
            payload: vec![0, 255, b'"', b'\\', 7],
            headers: [("traceparent".to_owned(), "00-ab\"c".to_owned())].into(),
            priority: -4,
            attempt: 1,
            enqueued_at: now,
            run_at: now,
            last_error: None,
            token: LeaseToken(Uuid::new_v4(), ClusterId::HOME),
            lease_expires_at: now + chrono::Duration::seconds(30),
            key: None,
        };
        let p = HandedNote::encode(9, &job).unwrap();
        let got = HandedNote::parse(&p, ClusterId::HOME).unwrap();
        assert_eq!(got.stream, 9);
        let j = got.job;
        assert_eq!(
            (
                j.id, &j.queue, &j.payload, &j.headers, j.priority, j.attempt
            ),
            (job.id, &job.queue, &job.payload, &job.headers, -4, 1)
        );
        assert_eq!((j.token, j.lease_ms), (job.token, 30_000));
        assert_eq!(
            (j.enqueued_at, j.lease_expires_at),
            (job.enqueued_at, job.lease_expires_at)
        );
        assert!(HandedNote::parse("{\"s\":1}", ClusterId::HOME).is_none());
        assert!(HandedNote::parse("not json", ClusterId::HOME).is_none());
    }

    #[test]
    fn the_largest_job_that_fits_fits_in_one_notify() {
        let job = Leased {
            slot: 0,
            lease_ms: i64::MAX,
            id: JobId(Uuid::now_v7()),
            queue: "q".repeat(128),
            payload: vec![0xff; 3 * 1024],
            // 1 KiB of headers as JSON; escapes are already counted there.
            headers: [("h".to_owned(), "v".repeat(1024 - 10))].into(),
            priority: i32::MIN,
            attempt: 1,
            enqueued_at: Utc::now(),
            run_at: Utc::now(),
            last_error: None,
            token: LeaseToken(Uuid::new_v4(), ClusterId::HOME),
            lease_expires_at: Utc::now(),
            key: None,
        };
        let p = HandedNote::encode(u64::MAX, &job).expect("fits");
        assert!(p.len() < 8000, "{}", p.len());
        let big = Leased {
            payload: vec![0; 6000],
            ..job
        };
        assert!(HandedNote::encode(1, &big).is_none());
    }

    #[test]
    fn offers_round_trip_and_a_huge_one_is_not_published() {
        let o = OfferNote {
            broker: Uuid::new_v4(),
            stream: 4,
            credit: 12,
            lease_ms: None,
            consumer: "w-1".into(),
            queues: vec!["a".into(), "b".into()],
        };
        assert_eq!(OfferNote::parse(&o.encode().unwrap()), Some(o.clone()));
        let huge = OfferNote {
            queues: vec!["q".repeat(128); 100],
            ..o
        };
        assert_eq!(huge.encode(), None);
        assert_eq!(OfferNote::parse("{}"), None);
    }

    // --- The SQL senders (they cannot import this module). ---

    const HANDOVER_SQL: &str = include_str!("store/sql/enqueue_handover.sql");
    const SQL_ENQUEUE_MIGRATION: &str =
        include_str!("../../../migrations/20261123000001_sql_enqueue.sql");
    /// The last migration that replaces leaseq.enqueue().
    const DEDUP_WINDOW_MIGRATION: &str =
        include_str!("../../../migrations/20261206000301_dedup_window.sql");

    /// The string literals that open each `pg_notify(` call's first
    /// argument in `sql` (whitespace skipped).
    fn notify_channels(sql: &str) -> Vec<String> {
        sql.match_indices("pg_notify(")
            .filter_map(|(i, m)| {
                let rest = sql[i + m.len()..].trim_start();
                let rest = rest.strip_prefix('\'')?;
                Some(rest[..rest.find('\'')?].to_owned())
            })
            .collect()
    }

    #[test]
    fn the_sql_hand_over_uses_this_channel_and_payload() {
        // The channel: the prefix, then the broker's UUID without dashes
        // (Uuid::simple, as `handed` formats it).
        assert_eq!(notify_channels(HANDOVER_SQL), [HANDED_PREFIX]);
        assert!(
            HANDOVER_SQL.contains(&format!(
                "'{HANDED_PREFIX}' || replace($14::uuid::text, '-', '')"
            )),
            "enqueue_handover.sql names the channel another way than channels::handed"
        );
        let b = Uuid::new_v4();
        assert_eq!(
            handed(b),
            format!(
                "{HANDED_PREFIX}{}",
                b.hyphenated().to_string().replace('-', "")
            )
        );
        // The payload: json_build_object's keys are HandedWire's fields.
        let object = &HANDOVER_SQL[HANDOVER_SQL.find("json_build_object(").expect("an object")..];
        let object = &object[..object.find(")::text").expect("its end")];
        let sql_keys: BTreeSet<String> = object
            .split('\'')
            .skip(1)
            .step_by(2)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase()))
            .map(str::to_owned)
            .collect();
        let job = Leased {
            slot: 0,
            lease_ms: 1,
            id: JobId(Uuid::now_v7()),
            queue: "q".into(),
            payload: vec![],
            headers: HashMap::new(),
            priority: 0,
            attempt: 1,
            enqueued_at: Utc::now(),
            run_at: Utc::now(),
            last_error: None,
            token: LeaseToken(Uuid::new_v4(), ClusterId::HOME),
            lease_expires_at: Utc::now(),
            key: None,
        };
        let ours: serde_json::Value =
            serde_json::from_str(&HandedNote::encode(1, &job).unwrap()).unwrap();
        let rust_keys: BTreeSet<String> = ours.as_object().unwrap().keys().cloned().collect();
        assert_eq!(sql_keys, rust_keys, "enqueue_handover.sql's payload keys");
    }

    #[test]
    fn the_sql_enqueue_function_wakes_on_this_channel_in_this_format() {
        // Migrations are never edited: if this fails, the Rust side moved.
        for m in [SQL_ENQUEUE_MIGRATION, DEDUP_WINDOW_MIGRATION] {
            assert_eq!(notify_channels(m), [WAKE]);
            assert!(
                m.contains("'sql:' || wake_ms || ':' || enqueue.queue"),
                "leaseq.enqueue()'s wake-up payload is not `<sender>:<delay ms>:<queue>`"
            );
        }
        let w = parse_wake("sql:0:orders", "0123").expect("a wake-up from SQL");
        assert_eq!((w.queue.as_str(), w.delay_ms), ("orders", 0));
    }

    /// The Rust files under `src/`, but this one, with their text.
    fn sources() -> Vec<(String, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|x| x == "rs")
                    && !path.ends_with("channels.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    out.push((path.display().to_string(), text));
                }
            }
        }
        let mut out = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut out,
        );
        out
    }

    #[test]
    fn the_rust_senders_use_these_channels_and_formats() {
        // Two kinds of pg_notify in the Rust code: Store::notify's, which
        // sends what this module encoded (`pg_notify(c, p)`), and the bucket
        // moves' wake-ups, whose payload is written in SQL with the channel
        // bound from WAKE.
        let mut generic = 0;
        let mut wakes = 0;
        for (path, text) in sources() {
            for (i, m) in text.match_indices("select pg_notify(") {
                let call = &text[i + m.len()..];
                if call.starts_with("c, p)") {
                    generic += 1;
                    continue;
                }
                let sender = call
                    .strip_prefix("$1, '")
                    .and_then(|r| r.split_once("' || q)"))
                    .map(|(prefix, _)| prefix)
                    .unwrap_or_else(|| panic!("{path}: a pg_notify this module does not know"));
                let w = parse_wake(&format!("{sender}orders"), "0123")
                    .unwrap_or_else(|| panic!("{path}: wake-up payload {sender:?}"));
                assert_eq!(w.queue.as_str(), "orders", "{path}");
                assert!(
                    text.contains("channels::WAKE"),
                    "{path}: its wake-ups' channel must be channels::WAKE"
                );
                wakes += 1;
            }
        }
        assert_eq!((generic, wakes), (1, 1));
    }

    #[test]
    fn no_other_sql_notifies() {
        // Every pg_notify in the statements and the migrations is one of
        // the above: a new one must be added to this module's table.
        let mut found = Vec::new();
        for dir in ["src/store/sql", "../../migrations"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.extension().is_some_and(|x| x == "sql") {
                    let sql = std::fs::read_to_string(&path).unwrap();
                    if sql.contains("pg_notify") {
                        found.push(path.file_name().unwrap().to_string_lossy().into_owned());
                    }
                }
            }
        }
        found.sort();
        assert_eq!(
            found,
            [
                "20261123000001_sql_enqueue.sql",
                "20261202000001_sql_ack.sql",
                "20261204000001_keys.sql",
                // leaseq.ack() again: the same two payloads, the wake-up
                // naming the acked job's queue (`r.queue`).
                "20261206000001_ack_wake_by_key.sql",
                "20261206000301_dedup_window.sql",
                "enqueue_handover.sql"
            ]
        );
    }

    const SQL_ACK_MIGRATION: &str = include_str!("../../../migrations/20261202000001_sql_ack.sql");

    #[test]
    fn the_sql_ack_functions_use_these_channels_and_formats() {
        // Migrations are never edited: if this fails, the Rust side moved.
        // A settle notice and a wake-up each: ack's for a freed slot,
        // nack's for the retry or a freed slot.
        let channels = notify_channels(SQL_ACK_MIGRATION);
        assert_eq!(
            channels,
            [SETTLE_PREFIX, WAKE, SETTLE_PREFIX, WAKE],
            "leaseq.ack()/nack() notify other channels than channels.rs names"
        );
        // The settle channel: the prefix and the broker's id without dashes.
        let b = Uuid::new_v4();
        assert_eq!(
            settle(b),
            format!(
                "{SETTLE_PREFIX}{}",
                b.hyphenated().to_string().replace('-', "")
            )
        );
        for f in ["ack", "nack"] {
            assert!(
                SQL_ACK_MIGRATION.contains(&format!(
                    "pg_notify('{SETTLE_PREFIX}' || replace(r.lease_broker::text, '-', ''), {f}.job_id::text || ':' || token::text)"
                )),
                "leaseq.{f}()'s settle notice is not `job:token` on channels::settle"
            );
        }
        // The payload `job:token` (hyphenated UUIDs, as uuid::text) reads back.
        let (job, token) = (Uuid::now_v7(), Uuid::new_v4());
        assert_eq!(
            parse_settled(&format!("{job}:{token}"), ClusterId::HOME),
            [(JobId(job), LeaseToken(token, ClusterId::HOME), false)]
        );
        assert!(SQL_ACK_MIGRATION.contains("'sql:0:' || r.slot_freed"));
        assert!(SQL_ACK_MIGRATION.contains("'sql:' || delay_ms || ':' || r.queue"));
    }
}
