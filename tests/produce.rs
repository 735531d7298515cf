//! The Produce RPC (enqueues on a stream) as a client sees it: real gRPC to
//! a broker in process (and the real binary for the SIGTERM drain), a real
//! PostgreSQL, a fresh database per test. Each job answered by its id, once
//! committed; refused jobs answered alone with the unary call's status while
//! the stream goes on; half-close; a message past the size limit; the
//! permission per job's queue; a drain with jobs under way, where no job
//! answered OK is lost. The bad-input rows are in tests/validation.rs
//! (`produce_bad_input_table`); the SDKs' single enqueue over it (and their
//! fallback to Enqueue) in tests/client.rs and each SDK's suite; Produce
//! producers under faults in tests/faults.rs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use leaseq::cli::ClientSecurity;
use leaseq::pb;
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

const S5: Duration = Duration::from_secs(5);

/// One Produce call: its request side and its answers.
struct Producer {
    tx: Option<mpsc::UnboundedSender<pb::ProduceRequest>>,
    answers: Streaming<pb::ProduceResponse>,
}

impl Producer {
    async fn open(c: &mut Client) -> Producer {
        let (tx, requests) = Producer::requests();
        let answers = c.produce(requests).await.expect("Produce opens");
        Producer::on(tx, answers.into_inner())
    }

    /// A request side, for a call opened by hand (a deadline, another
    /// client type).
    fn requests() -> (
        mpsc::UnboundedSender<pb::ProduceRequest>,
        tokio_stream::wrappers::UnboundedReceiverStream<pb::ProduceRequest>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
    }

    fn on(
        tx: mpsc::UnboundedSender<pb::ProduceRequest>,
        answers: Streaming<pb::ProduceResponse>,
    ) -> Producer {
        Producer {
            tx: Some(tx),
            answers,
        }
    }

    fn send(&self, id: u64, job: Option<pb::EnqueueRequest>) {
        self.tx
            .as_ref()
            .expect("not half-closed")
            .send(pb::ProduceRequest { id, job })
            .expect("the request side is open");
    }

    fn half_close(&mut self) {
        self.tx = None;
    }

    /// The next `n` answers, by id.
    async fn answers(&mut self, n: usize, limit: Duration) -> HashMap<u64, pb::ProduceResponse> {
        let mut out = HashMap::new();
        while out.len() < n {
            let a = tokio::time::timeout(limit, self.answers.message())
                .await
                .expect("an answer in time")
                .expect("the stream goes on")
                .expect("an answer, not the end");
            assert!(out.insert(a.id, a).is_none(), "two answers to one id");
        }
        out
    }

    /// How the stream ends after what it has left to answer: the answers
    /// and the status.
    async fn end(
        &mut self,
        limit: Duration,
    ) -> (HashMap<u64, pb::ProduceResponse>, Result<(), tonic::Status>) {
        let mut out = HashMap::new();
        loop {
            match tokio::time::timeout(limit, self.answers.message())
                .await
                .expect("the stream ends in time")
            {
                Ok(Some(a)) => {
                    out.insert(a.id, a);
                }
                Ok(None) => return (out, Ok(())),
                Err(s) => return (out, Err(s)),
            }
        }
    }
}

fn enqueued_id(a: &pb::ProduceResponse) -> String {
    assert_eq!(a.code, 0, "{a:?}");
    assert!(a.message.is_empty(), "{a:?}");
    a.enqueued
        .as_ref()
        .expect("OK carries the job")
        .job_id
        .clone()
}

async fn payload_of(db: &TestDb, id: &str) -> Option<Vec<u8>> {
    sqlx::query_scalar("select payload from leaseq.jobs where id = $1")
        .bind(uuid::Uuid::parse_str(id).unwrap())
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

/// Many jobs in flight on one stream, good and bad interleaved, with ids
/// the client chose (not in order): every job is answered once under its
/// id; each OK names a committed job with that request's payload, each bad
/// one is refused alone with Enqueue's message (`queue: ...`, or `job:` for
/// a request without one) and changes nothing, and a
/// dedup key answers the live job as Enqueue does. A half-close then ends
/// the stream with OK once all is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_is_answered_by_its_id_once_committed() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut p = Producer::open(&mut c).await;
    let mut want_ok = HashMap::new();
    for i in 0..300u64 {
        let id = (i * 7919) % 1_000_003 + 1;
        match i % 10 {
            3 => p.send(id, Some(job("bad queue", "x"))),
            7 => p.send(id, None),
            _ => {
                p.send(id, Some(job("produce-q", &format!("p{i}"))));
                want_ok.insert(id, format!("p{i}"));
            }
        }
    }
    let answers = p.answers(300, S5).await;
    for (id, a) in &answers {
        match want_ok.get(id) {
            Some(payload) => {
                let job = enqueued_id(a);
                assert_eq!(
                    payload_of(&db, &job).await.as_deref(),
                    Some(payload.as_bytes())
                );
            }
            None => {
                assert_eq!(Code::from(a.code), Code::InvalidArgument, "{a:?}");
                assert!(
                    a.message.starts_with("queue:") || a.message.starts_with("job:"),
                    "{a:?}"
                );
                assert!(a.enqueued.is_none());
            }
        }
    }
    assert_eq!(db.live_jobs().await, want_ok.len() as i64);

    // A dedup key: the second job is answered with the first's id.
    let mut d = job("produce-q", "d1");
    d.dedup_key = "once".into();
    p.send(1, Some(d.clone()));
    let first = enqueued_id(&p.answers(1, S5).await[&1]);
    d.payload = b"d2".to_vec();
    p.send(2, Some(d));
    let again = &p.answers(1, S5).await[&2];
    assert_eq!(enqueued_id(again), first);
    assert!(again.enqueued.as_ref().unwrap().duplicate);

    // Sent, then half-closed at once: answered, then OK.
    p.send(3, Some(job("produce-q", "last")));
    p.half_close();
    let (last, end) = p.end(S5).await;
    end.expect("a half-close ends the stream with OK");
    assert_eq!(last.len(), 1);
    enqueued_id(&last[&3]);
    assert_eq!(db.live_jobs().await, want_ok.len() as i64 + 2);
    broker.stop().await;
}

/// A message past --max-message-bytes ends the stream with
/// RESOURCE_EXHAUSTED naming the limit; the jobs before it are answered
/// (or, if the stream ended first, committed or not, as for any call whose
/// answer was lost: here they all are, their answers sent first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_the_size_limit_ends_the_stream() {
    let db = TestDb::new().await;
    // The test brokers' --max-message-bytes: 4 MiB.
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let mut p = Producer::open(&mut c).await;
    p.send(1, Some(job("big-q", "small")));
    let first = p.answers(1, S5).await;
    enqueued_id(&first[&1]);
    let mut big = job("big-q", "");
    big.payload = vec![1; 5 * 1024 * 1024];
    p.send(2, Some(big));
    let (more, end) = p.end(S5).await;
    assert!(more.is_empty(), "{more:?}");
    let s = end.expect_err("the stream ends with the limit's status");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().starts_with("max-message-bytes:"), "{s:?}");
    assert_eq!(db.live_jobs().await, 1);
    // The broker and the connection go on: a new stream works.
    let mut p = Producer::open(&mut c).await;
    p.send(1, Some(job("big-q", "after")));
    enqueued_id(&p.answers(1, S5).await[&1]);
    broker.stop().await;
}

/// A call with a deadline (`grpc-timeout`) ends at it with
/// DEADLINE_EXCEEDED, though its client keeps it open: the jobs answered
/// before are in the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_at_its_deadline() {
    let db = TestDb::new().await;
    let broker = TestBroker::start(&db).await;
    let mut c = broker.client().await;
    let (tx, requests) = Producer::requests();
    let mut req = tonic::Request::new(requests);
    req.set_timeout(Duration::from_millis(400));
    let opened = Instant::now();
    let answers = c.produce(req).await.expect("Produce opens").into_inner();
    let mut p = Producer::on(tx, answers);
    p.send(1, Some(job("deadline-q", "a")));
    let id = enqueued_id(&p.answers(1, S5).await[&1]);
    let (more, end) = p.end(S5).await;
    assert!(more.is_empty(), "{more:?}");
    let s = end.expect_err("the deadline ends the call");
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    let took = opened.elapsed();
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(payload_of(&db, &id).await.is_some());
    drop(p);
    broker.stop().await;
}

/// A token that may enqueue to `emails*` only: it opens a stream, its jobs
/// for `emails-x` are enqueued and one for `orders` is refused alone with
/// PERMISSION_DENIED; a token that may only consume cannot open one; no
/// token at all is UNAUTHENTICATED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_needs_the_enqueue_permission_on_its_queue() {
    const PRODUCER: &str = "producer-secret-0123456789";
    const CONSUMER: &str = "consumer-secret-0123456789";
    let h = leaseq_server::hash_token;
    let text = serde_json::json!({"tokens": [
        {"name": "producer", "sha256": h(PRODUCER),
         "grants": [{"queues": "emails*", "actions": ["enqueue"]}]},
        {"name": "consumer", "sha256": h(CONSUMER),
         "grants": [{"queues": "emails*", "actions": ["consume"]}]},
    ]});
    let (_scratch, file) = Scratch::with_file("produce", "tokens.json", &text.to_string());
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db).auth_file(&file).start().await;
    let token = |t: &str| ClientSecurity {
        token: Some(t.to_owned()),
        ..Default::default()
    };

    let mut c = broker.client_with(&token(PRODUCER)).await.unwrap();
    let (tx, requests) = Producer::requests();
    let answers = c.produce(requests).await.expect("Produce opens");
    let mut p = Producer::on(tx, answers.into_inner());
    p.send(1, Some(job("emails-x", "a")));
    p.send(2, Some(job("orders", "b")));
    p.send(3, Some(job("emails-y", "c")));
    let a = p.answers(3, S5).await;
    enqueued_id(&a[&1]);
    enqueued_id(&a[&3]);
    assert_eq!(
        Code::from(a[&2].code),
        Code::PermissionDenied,
        "{:?}",
        a[&2]
    );
    assert_eq!(db.live_jobs().await, 2);

    for (sec, code) in [
        (token(CONSUMER), Code::PermissionDenied),
        (ClientSecurity::default(), Code::Unauthenticated),
    ] {
        let mut c = broker.client_with(&sec).await.unwrap();
        let (_tx, requests) = Producer::requests();
        let s = c.produce(requests).await.expect_err("refused");
        assert_eq!(s.code(), code, "{s:?}");
    }
    assert_eq!(db.live_jobs().await, 2);
    broker.stop().await;
}

/// SIGTERM to the real binary while a Produce stream has jobs under way:
/// the stream ends with UNAVAILABLE after the jobs the broker read are
/// answered, the broker exits 0 without waiting out its grace, and every
/// job answered OK is in the table (none answered OK is lost); the jobs
/// with no answer may or may not be, and nothing else is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_produce_stream_open_loses_no_answered_job() {
    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &[]).await;
    let mut c = broker.client().await;
    let mut p = Producer::open(&mut c).await;
    p.send(1, Some(job("drain-p", "first")));
    let first = enqueued_id(&p.answers(1, S5).await[&1]);
    // A steady flow, with SIGTERM in the middle of it.
    let tx = p.tx.take().unwrap();
    let sender = tokio::spawn(async move {
        for id in 2..=2000u64 {
            if tx
                .send(pb::ProduceRequest {
                    id,
                    job: Some(job("drain-p", &format!("j{id}"))),
                })
                .is_err()
            {
                return;
            }
            if id % 20 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        // Held open: the end is the broker's.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(tx);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let signalled = Instant::now();
    broker.signal(libc::SIGTERM);
    let (answers, end) = p.end(Duration::from_secs(10)).await;
    let s = end.expect_err("a drain ends the stream with a status");
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    let exit = broker.wait(Duration::from_secs(10)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(6),
        "{:?}",
        signalled.elapsed()
    );
    sender.abort();
    assert!(!answers.is_empty(), "jobs were answered during the flow");
    let mut ok = 0;
    for a in answers.values() {
        if a.code == 0 {
            let id = enqueued_id(a);
            assert!(
                payload_of(&db, &id).await.is_some(),
                "job {} answered OK and gone",
                a.id
            );
            ok += 1;
        } else {
            assert_eq!(Code::from(a.code), Code::Unavailable, "{a:?}");
        }
    }
    assert!(payload_of(&db, &first).await.is_some());
    let live = db.live_jobs().await;
    assert!(
        live > ok,
        "answered OK {ok} + the first, in the table {live}"
    );
    assert!(live <= 2000, "{live}");
    eprintln!("answered OK before the drain: {ok}; in the table: {live}");
}
