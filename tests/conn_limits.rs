//! Limits a client cannot push past (docs/SECURITY.md, "Limits"): the
//! message size, each connection's request bytes and stream credit, and the
//! connection cap. First a table in tests/validation.rs's manner: each row a
//! call past one limit, which must fail with RESOURCE_EXHAUSTED whose
//! message names the limit and its value, and change nothing in the
//! database; rows at the limit are accepted. Then a hostile client against
//! the real binary: many connections, many streams, all the credit it may
//! have, messages left unfinished or too large, responses never read; the
//! broker's resident memory must stay under the bound docs/SECURITY.md
//! derives from the settings, and a well-behaved client must be served
//! throughout.
//!
//! The hostile client speaks raw HTTP/2 ([`Raw`]): a gRPC client library
//! would neither send half a message nor leave its responses unread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use leaseq::pb;
use leaseq_server::REFUSED_LIFETIME;
use prost::Message;
use tonic::{Code, Status};

use crate::common::consume::{Consumer, opening};
use crate::common::*;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

const ENQUEUE: &str = "/leaseq.v1.QueueService/Enqueue";
const CONSUME: &str = "/leaseq.v1.QueueService/Consume";

/// A gRPC message: the 5-byte prefix and the encoded message.
fn frame(msg: &impl Message) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.encoded_len());
    b.put_u8(0);
    b.put_u32(msg.encoded_len() as u32);
    msg.encode(&mut b).expect("encode");
    b.freeze()
}

/// The prefix of a message of `len` bytes, and `sent` bytes of its body.
fn partial(len: usize, sent: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + sent);
    b.put_u8(0);
    b.put_u32(len as u32);
    b.put_bytes(0, sent);
    b.freeze()
}

/// One raw HTTP/2 connection speaking gRPC by hand.
struct Raw {
    send: h2::client::SendRequest<Bytes>,
    /// Drives the connection; ends when the broker closes it.
    driver: tokio::task::JoinHandle<()>,
}

/// A call started on a [`Raw`] connection: its answer and its request body.
type RawCall = (h2::client::ResponseFuture, h2::SendStream<Bytes>);

impl Raw {
    async fn connect(addr: SocketAddr) -> Option<Raw> {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let (send, conn) = h2::client::handshake(tcp).await.ok()?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Some(Raw { send, driver })
    }

    /// Starts a call of `method`; None once the connection is gone, or
    /// when the broker has not allowed one more stream within 2 s.
    async fn call(&mut self, method: &str) -> Option<RawCall> {
        let req = http::Request::post(format!("http://leaseq{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
        // The same handle every time: it waits while its last stream is not
        // yet open (past the broker's SETTINGS_MAX_CONCURRENT_STREAMS).
        let ready = std::future::poll_fn(|cx| self.send.poll_ready(cx));
        tokio::time::timeout(Duration::from_secs(2), ready)
            .await
            .ok()?
            .ok()?;
        self.send.send_request(req, false).ok()
    }

    /// Starts a call of `method` and sends `body` (and ends the request
    /// side when `end`).
    async fn send(&mut self, method: &str, body: Bytes, end: bool) -> Option<RawCall> {
        let (resp, mut tx) = self.call(method).await?;
        tx.send_data(body, end).ok()?;
        Some((resp, tx))
    }

    fn closed(&self) -> bool {
        self.driver.is_finished()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The call's status (OK included), read from the trailers-only response
/// or the trailers after the body.
async fn status_of(resp: h2::client::ResponseFuture, limit: Duration) -> Status {
    let resp = match tokio::time::timeout(limit, resp).await {
        Err(_) => return Status::unknown(format!("no answer within {limit:?}")),
        Ok(Err(e)) => return Status::unknown(format!("no answer: {e}")),
        Ok(Ok(r)) => r,
    };
    if let Some(s) = Status::from_header_map(resp.headers()) {
        return s;
    }
    let mut body = resp.into_body();
    while let Some(d) = body.data().await {
        match d {
            Ok(d) => {
                let _ = body.flow_control().release_capacity(d.len());
            }
            Err(e) => return Status::unknown(format!("body: {e}")),
        }
    }
    match body.trailers().await {
        Ok(Some(t)) => Status::from_header_map(&t).unwrap_or_else(|| Status::unknown("no status")),
        other => Status::unknown(format!("trailers: {other:?}")),
    }
}

/// RESOURCE_EXHAUSTED naming `limit` (its message starts `limit: `) and
/// mentioning `value`; else what is wrong.
fn names_limit(got: &Result<(), Status>, limit: &str, value: usize) -> Result<(), String> {
    match got {
        Err(s)
            if s.code() == Code::ResourceExhausted
                && s.message().starts_with(&format!("{limit}: "))
                && s.message().contains(&value.to_string()) =>
        {
            Ok(())
        }
        other => Err(format!(
            "want RESOURCE_EXHAUSTED naming {limit} and {value}, got {other:?}"
        )),
    }
}

fn code(s: Status) -> Result<(), Status> {
    if s.code() == Code::Ok { Ok(()) } else { Err(s) }
}

/// The rows' bookkeeping: failures, and the database state a refused row
/// must leave as it was.
struct Table {
    db: TestDb,
    state: String,
    failures: Vec<String>,
}

impl Table {
    /// A row that must be refused naming `limit` = `value`, changing nothing.
    async fn refused(&mut self, row: &str, got: Result<(), Status>, limit: &str, value: usize) {
        if let Err(e) = names_limit(&got, limit, value) {
            self.failures.push(format!("{row}: {e}"));
        }
        let state = self.db.fingerprint().await;
        if state != self.state {
            self.failures
                .push(format!("{row}: the refused call changed the database"));
        }
        self.state = state;
    }

    /// A row that must be accepted.
    async fn accepted(&mut self, row: &str, got: Result<(), Status>) {
        if let Err(s) = got {
            self.failures
                .push(format!("{row}: must be accepted, got {s:?}"));
        }
        self.state = self.db.fingerprint().await;
    }
}

/// Limits of the table's broker: small, so that each is quick to reach.
const T_PAYLOAD: usize = 16 * KIB;
const T_MESSAGE: usize = 2 * MIB;
const T_REQUESTS: usize = 2 * MIB;
const T_CREDIT: u32 = 64;
const T_SUBSCRIPTIONS: usize = 4;
const T_CONNECTIONS: usize = 4;

fn sub_req(queue: &str, max_in_flight: u32) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        queues: vec![queue.to_owned()],
        consumer: "limits".into(),
        max_in_flight,
        lease: None,
        accept: Vec::new(),
    }
}

/// Opens a Subscribe stream; the call's status when refused.
async fn try_subscribe(
    c: &mut Client,
    queue: &str,
    max_in_flight: u32,
) -> Result<JobStream, Status> {
    let mut s = c
        .subscribe(sub_req(queue, max_in_flight))
        .await?
        .into_inner();
    // Open once its first heartbeat came.
    match tokio::time::timeout(Duration::from_secs(5), s.message()).await {
        Ok(Ok(Some(_))) => Ok(s),
        Ok(Ok(None)) => Err(Status::unknown("ended at once")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Status::unknown("no heartbeat within 5s")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_is_resource_exhausted_naming_it_and_changes_nothing() {
    let db = TestDb::new().await;
    let broker = TestBroker::on(&db)
        .config(|c| {
            c.request_limits.max_payload_bytes = T_PAYLOAD;
            c.request_limits.max_message_bytes = T_MESSAGE;
            c.security.max_request_bytes_per_connection = T_REQUESTS;
            c.security.max_in_flight_per_connection = T_CREDIT;
            c.security.max_subscriptions_per_connection = T_SUBSCRIPTIONS;
            c.security.max_connections = T_CONNECTIONS;
        })
        .start()
        .await;
    let mut c = broker.client().await;
    let state = db.fingerprint().await;
    let mut t = Table {
        db,
        state,
        failures: Vec::new(),
    };
    let big = |n: usize| String::from_utf8(vec![b'p'; n]).unwrap();

    // --- --max-message-bytes
    let r = c.enqueue(job("m", &big(T_MESSAGE))).await.map(|_| ());
    t.refused(
        "Enqueue of a message past the limit",
        r,
        "max-message-bytes",
        T_MESSAGE,
    )
    .await;
    let jobs = |n| (0..n).map(|_| job("m", &big(T_PAYLOAD))).collect();
    let r = c
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: jobs(130) })
        .await
        .map(|_| ());
    t.refused(
        "EnqueueBatch of 130 jobs of the largest payload",
        r,
        "max-message-bytes",
        T_MESSAGE,
    )
    .await;
    let r = c
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: jobs(120) })
        .await
        .map(|_| ());
    t.accepted(
        "EnqueueBatch of 120 jobs of the largest payload (under the limit)",
        r,
    )
    .await;
    let acks = (0..300)
        .map(|_| pb::AckRequest {
            job_id: big(10 * KIB),
            lease_token: "t".into(),
            enqueue: Vec::new(),
            result: Vec::new(),
        })
        .collect();
    let r = c.ack_batch(pb::AckBatchRequest { acks }).await.map(|_| ());
    t.refused(
        "AckBatch of 300 acks with 10 KiB job ids",
        r,
        "max-message-bytes",
        T_MESSAGE,
    )
    .await;
    // Only a prefix declaring 4 GiB - 1: answered without the body.
    let mut raw = Raw::connect(broker.addr).await.expect("connect");
    let (resp, _tx) = raw
        .send(ENQUEUE, partial(u32::MAX as usize, 0), false)
        .await
        .expect("call");
    let r = code(status_of(resp, Duration::from_secs(5)).await);
    t.refused(
        "a message declaring 4 GiB, body never sent",
        r,
        "max-message-bytes",
        T_MESSAGE,
    )
    .await;
    drop(raw);
    // A Consume stream's later message past the limit ends the stream, and
    // the job it held goes back to the queue.
    enqueue(&mut c, "held", "held").await;
    t.state = t.db.fingerprint().await;
    let mut s = Consumer::open(&mut c, &["held"], 1, None, true).await;
    let held = s.next_delivery(Duration::from_secs(5)).await;
    s.send(pb::ConsumeRequest {
        nacks: vec![pb::NackRequest {
            job_id: id_of(&held),
            lease_token: held.lease_token.clone(),
            error: big(T_MESSAGE),
            retry_after: None,
            dead_letter: true,
        }],
        ..Default::default()
    })
    .await;
    let end = s.end(Duration::from_secs(5)).await;
    if let Err(e) = names_limit(&end.status, "max-message-bytes", T_MESSAGE) {
        t.failures
            .push(format!("Consume, a later message past the limit: {e}"));
    }
    let mut again = subscribe(&mut c, &["held"], 1, None).await;
    let d = next_delivery(&mut again, Duration::from_secs(5)).await;
    if id_of(&d) != id_of(&held) {
        t.failures.push(format!(
            "Consume, a later message past the limit: the held job came back as {d:?}"
        ));
    }
    ack(&mut c, &d).await.expect("ack the held job");
    drop(again);
    t.state = t.db.fingerprint().await;

    // --- --max-request-bytes-per-connection: a message left unfinished
    // holds the connection's budget; its other calls are refused until it
    // is reset; other connections are not affected.
    let mut raw = Raw::connect(broker.addr).await.expect("connect");
    let unfinished = partial(T_REQUESTS, 64 * KIB);
    let mut held = raw
        .send(ENQUEUE, unfinished.clone(), false)
        .await
        .expect("call");
    let small = frame(&job("r", "small"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let (resp, _tx) = raw.send(ENQUEUE, small.clone(), true).await.expect("call");
        let r = code(status_of(resp, Duration::from_secs(5)).await);
        if r.is_err() || Instant::now() > deadline {
            break r;
        }
        // The broker had not read the unfinished message's prefix yet; or
        // the small call's charge came first and took the room it needed
        // (it was refused, and answered): then send it again.
        if tokio::time::timeout(Duration::from_millis(20), &mut held.0)
            .await
            .is_ok()
        {
            held = raw
                .send(ENQUEUE, unfinished.clone(), false)
                .await
                .expect("call");
        }
    };
    let (_held_resp, mut held_tx) = held;
    t.state = t.db.fingerprint().await;
    t.refused(
        "Enqueue beside an unfinished message of the connection's whole budget",
        r,
        "max-request-bytes-per-connection",
        T_REQUESTS,
    )
    .await;
    let r = c.enqueue(job("r", "other connection")).await.map(|_| ());
    t.accepted("Enqueue on another connection meanwhile", r)
        .await;
    held_tx.send_reset(h2::Reason::CANCEL);
    let deadline = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let (resp, _tx) = raw.send(ENQUEUE, small.clone(), true).await.expect("call");
        let r = code(status_of(resp, Duration::from_secs(5)).await);
        if r.is_ok() || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    t.accepted("Enqueue once the unfinished message was reset", r)
        .await;
    drop(raw);

    // --- --max-in-flight-per-connection
    let opened = |r: &Result<JobStream, Status>| r.as_ref().map(|_| ()).map_err(Clone::clone);
    let r = try_subscribe(&mut c, "credit", T_CREDIT + 1)
        .await
        .map(|_| ());
    t.refused(
        "Subscribe asking more than the connection's credit",
        r,
        "max-in-flight-per-connection",
        T_CREDIT as usize,
    )
    .await;
    let forty = try_subscribe(&mut c, "credit", 40).await;
    t.accepted("Subscribe of 40", opened(&forty)).await;
    let r = try_subscribe(&mut c, "credit", 30).await.map(|_| ());
    t.refused(
        "Subscribe of 30 beside one of 40",
        r,
        "max-in-flight-per-connection",
        T_CREDIT as usize,
    )
    .await;
    let twenty_four = try_subscribe(&mut c, "credit", 24).await;
    t.accepted(
        "Subscribe of 24 beside one of 40 (exactly the limit)",
        opened(&twenty_four),
    )
    .await;
    let mut other = broker.client().await;
    let thirty = try_subscribe(&mut other, "credit", 30).await;
    t.accepted("Subscribe of 30 on another connection", opened(&thirty))
        .await;
    drop((forty, twenty_four, thirty));
    let r = Consumer::start(&mut c, opening(&["credit"], T_CREDIT + 1, None, false))
        .await
        .map(|_| ());
    // The refusal may come with the response headers or as the stream's
    // first item, as tonic delivers it.
    let r = match r {
        Ok(()) => Err(Status::unknown("opened")),
        e => e,
    };
    t.refused(
        "Consume opening past the connection's credit",
        r,
        "max-in-flight-per-connection",
        T_CREDIT as usize,
    )
    .await;
    let mut s = Consumer::open(&mut c, &["credit"], 10, None, false).await;
    s.credit(T_CREDIT + 1).await;
    let end = s.end(Duration::from_secs(5)).await;
    t.refused(
        "Consume raising its credit past the connection's",
        end.status,
        "max-in-flight-per-connection",
        T_CREDIT as usize,
    )
    .await;
    // Lowering a stream's credit does not free the connection's: the
    // deliveries it holds stay until settled.
    let s = Consumer::open(&mut c, &["credit"], 40, None, false).await;
    s.credit(1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = try_subscribe(&mut c, "credit", 30).await.map(|_| ());
    t.refused(
        "Subscribe of 30 beside a stream lowered from 40 to 1",
        r,
        "max-in-flight-per-connection",
        T_CREDIT as usize,
    )
    .await;
    drop(s);
    let r = eventually_ok(|| {
        let mut c = c.clone();
        async move { try_subscribe(&mut c, "credit", T_CREDIT).await.map(|_| ()) }
    })
    .await;
    t.accepted("Subscribe of the whole credit once the others closed", r)
        .await;
    drop(other);

    // --- --max-subscriptions-per-connection
    let mut d = broker.client().await;
    let mut open = Vec::new();
    for i in 0..T_SUBSCRIPTIONS {
        let r = try_subscribe(&mut d, "subs", 1).await;
        t.accepted(
            &format!("stream {} of {T_SUBSCRIPTIONS} on one connection", i + 1),
            opened(&r),
        )
        .await;
        open.push(r);
    }
    let r = try_subscribe(&mut d, "subs", 1).await.map(|_| ());
    t.refused(
        "one stream more on that connection",
        r,
        "max-subscriptions-per-connection",
        T_SUBSCRIPTIONS,
    )
    .await;
    let r = Consumer::start(&mut d, opening(&["subs"], 1, None, false))
        .await
        .map(|_| ());
    let r = match r {
        Ok(()) => Err(Status::unknown("opened")),
        e => e,
    };
    t.refused(
        "one Consume stream more on that connection",
        r,
        "max-subscriptions-per-connection",
        T_SUBSCRIPTIONS,
    )
    .await;
    let r = try_subscribe(&mut c, "subs", 1).await;
    t.accepted("one more on another connection", opened(&r))
        .await;
    drop(r);
    open.pop();
    let r = eventually_ok(|| {
        let mut d = d.clone();
        async move { try_subscribe(&mut d, "subs", 1).await.map(|_| ()) }
    })
    .await;
    t.accepted("one more on that connection once one closed", r)
        .await;
    drop((open, d));

    // --- --max-connections: `c` holds one; three more fill the cap.
    // (A connection closed just before may hold its slot a moment more.)
    let mut full = Vec::new();
    for i in 1..T_CONNECTIONS {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (raw, r) = loop {
            let mut raw = eventually_connect(broker.addr).await;
            let (resp, _tx) = raw
                .send(ENQUEUE, frame(&job("conn", &i.to_string())), true)
                .await
                .expect("call");
            let r = code(status_of(resp, Duration::from_secs(5)).await);
            if r.is_ok() || Instant::now() > deadline {
                break (raw, r);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        t.accepted(&format!("connection {} of {T_CONNECTIONS}", i + 1), r)
            .await;
        full.push(raw);
    }
    // A connection past the cap is served for REFUSED_LIFETIME, and one
    // accepted while MAX_REFUSING others are being refused is closed at
    // once: on a loaded host the calls may find it gone (the send fails,
    // as a reset would); then another connection is tried. A call that
    // gets an answer must get the refusal, and a health check its answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (over, refused, health) = loop {
        let mut over = eventually_connect(broker.addr).await;
        let Some((resp, _tx)) = over.send(ENQUEUE, frame(&job("conn", "over")), true).await else {
            assert!(
                Instant::now() < deadline,
                "no call past the cap was answered in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let refused = code(status_of(resp, Duration::from_secs(5)).await);
        let Some((resp, _tx)) = over
            .send("/grpc.health.v1.Health/Check", pb_health_check(), true)
            .await
        else {
            assert!(
                Instant::now() < deadline,
                "no health check past the cap was answered in 10 s"
            );
            continue;
        };
        let health = code(status_of(resp, Duration::from_secs(5)).await);
        break (over, refused, health);
    };
    t.refused(
        "a call on a connection past the cap",
        refused,
        "max-connections",
        T_CONNECTIONS,
    )
    .await;
    t.accepted("a health check on a connection past the cap", health)
        .await;
    let closed = tokio::time::timeout(REFUSED_LIFETIME + Duration::from_secs(3), async {
        while !over.closed() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    if closed.is_err() {
        t.failures.push(format!(
            "a connection past the cap is still open {:?} after it was refused",
            REFUSED_LIFETIME + Duration::from_secs(3)
        ));
    }
    let r = c
        .enqueue(job("conn", "admitted meanwhile"))
        .await
        .map(|_| ());
    t.accepted("a call on an admitted connection meanwhile", r)
        .await;
    full.pop();
    let r = eventually_ok(|| async {
        let Some(mut raw) = Raw::connect(broker.addr).await else {
            return Err(Status::unavailable("connect"));
        };
        let (resp, _tx) = raw
            .send(ENQUEUE, frame(&job("conn", "after")), true)
            .await
            .ok_or_else(|| Status::unavailable("call"))?;
        code(status_of(resp, Duration::from_secs(5)).await)
    })
    .await;
    t.accepted("a new connection once one closed", r).await;

    assert!(
        t.failures.is_empty(),
        "{} row(s) failed:\n{}",
        t.failures.len(),
        t.failures.join("\n")
    );
    drop(full);
    broker.stop().await;
}

/// An encoded `grpc.health.v1.HealthCheckRequest` for the whole server.
fn pb_health_check() -> Bytes {
    frame(&tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    })
}

/// Retries `f` for up to 5 s until it is Ok; its last result.
async fn eventually_ok<F, Fut>(mut f: F) -> Result<(), Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = f().await;
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A raw connection (connecting is retried: the listener may be busy).
async fn eventually_connect(addr: SocketAddr) -> Raw {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(raw) = Raw::connect(addr).await {
            return raw;
        }
        assert!(Instant::now() < deadline, "cannot connect to {addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round trip of the well-behaved client: enqueue, receive, ack.
async fn round(c: &mut Client, good: &mut JobStream, i: usize) -> Duration {
    let started = Instant::now();
    let id = enqueue(c, "good", &i.to_string()).await;
    let d = next_delivery(good, Duration::from_secs(10)).await;
    assert_eq!(id_of(&d), id, "the good client's job");
    ack(c, &d).await.expect("ack");
    started.elapsed()
}

/// Resident memory of process `pid`, in bytes (VmRSS).
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// The hostile test's broker settings.
struct Settings {
    connections: usize,
    streams_per_connection: usize,
    message: usize,
    payload: usize,
    requests: usize,
    subscriptions: usize,
    credit: u32,
}

impl Settings {
    fn args(&self) -> Vec<String> {
        [
            ("--max-connections", self.connections),
            ("--max-streams-per-connection", self.streams_per_connection),
            ("--max-message-bytes", self.message),
            ("--max-payload-bytes", self.payload),
            ("--max-request-bytes-per-connection", self.requests),
            ("--max-subscriptions-per-connection", self.subscriptions),
            ("--max-in-flight-per-connection", self.credit as usize),
        ]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.to_string()])
        .collect()
    }

    /// docs/SECURITY.md's bound ("Worst-case memory") on what `clients`
    /// connections may make the broker hold, when the largest delivery
    /// among the queues' jobs is `delivery` bytes: per connection, its
    /// requests (REQUEST_FACTOR x the request budget), its deliveries
    /// (credit x delivery), its Subscribe and Consume streams (each
    /// RESPONSE_BYTES, one response message, and a receive buffer the size
    /// of its largest request message), its calls (STREAM_BYTES each) and
    /// CONNECTION_BYTES; and MAX_REFUSING connections being refused.
    fn bound(&self, clients: usize, delivery: usize) -> u64 {
        let per_connection = REQUEST_FACTOR * self.requests
            + self.credit as usize * delivery
            + self.subscriptions * (RESPONSE_BYTES + self.message.max(delivery) + self.message)
            + self.streams_per_connection * STREAM_BYTES
            + CONNECTION_BYTES;
        let refusing = leaseq_server::MAX_REFUSING
            * (CONNECTION_BYTES + self.streams_per_connection * STREAM_BYTES);
        (clients * per_connection + refusing) as u64
    }
}

/// docs/SECURITY.md's constants (see "Worst-case memory").
const REQUEST_FACTOR: usize = 3;
const RESPONSE_BYTES: usize = MIB;
const STREAM_BYTES: usize = 32 * KIB;
const CONNECTION_BYTES: usize = 2 * MIB;

/// One admitted hostile connection, as [`hostile`] left it.
struct Hostile {
    _raw: Raw,
    /// Its Consume streams: their response headers (the bodies never
    /// read) and request sides.
    _streams: Vec<(http::Response<h2::RecvStream>, h2::SendStream<Bytes>)>,
    /// How its openings past the credit and past the places were answered.
    refused: Vec<Status>,
    /// The message declaring 1 GiB, then the unfinished messages.
    calls: Vec<RawCall>,
    /// Calls that never send a byte of their message.
    _idle: Vec<RawCall>,
}

/// What one admitted hostile connection does: Consume streams with all the
/// credit and all the places it may have, and one past each (each opening
/// waits for the broker's answer, so that they are judged in order), ~1
/// MiB messages of garbage acks whose failure results echo them, a message
/// declaring 1 GiB, unfinished messages, and calls that send nothing on
/// every other stream it may open; it never reads a response message.
async fn hostile(addr: SocketAddr, s: &Settings, queue: &str) -> Option<Hostile> {
    let mut raw = Raw::connect(addr).await?;
    let (mut streams, mut refused) = (Vec::new(), Vec::new());
    let n = s.subscriptions as u32;
    let each = (s.credit - 1) / (n - 1);
    let mut credits = vec![each; s.subscriptions - 1];
    // Past the credit; the last place (what credit is left); past the places.
    credits.extend([s.credit, s.credit - each * (n - 1), 1]);
    for credit in credits {
        let open = opening(&[queue], credit, Some(Duration::from_secs(60)), true);
        let (resp, tx) = raw.send(CONSUME, frame(&open), false).await?;
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .ok()?
            .ok()?;
        match Status::from_header_map(resp.headers()) {
            Some(status) => refused.push(status),
            None => streams.push((resp, tx)),
        }
    }
    // Acks whose ids are 100 KiB of garbage: each fails, and its result
    // echoes the id.
    let garbage = frame(&pb::ConsumeRequest {
        acks: (0..9)
            .map(|_| pb::AckRequest {
                job_id: "g".repeat(100 * KIB),
                lease_token: "t".into(),
                enqueue: Vec::new(),
                result: Vec::new(),
            })
            .collect(),
        ..Default::default()
    });
    for (_, tx) in streams.iter_mut() {
        for _ in 0..64 {
            tx.send_data(garbage.clone(), false).ok()?;
        }
    }
    let mut calls = vec![raw.send(ENQUEUE, partial(1 << 30, 0), false).await?];
    // Twice what the request budget holds.
    let unfinished = partial(s.message, s.message / 2);
    for _ in 0..2 * s.requests / s.message {
        calls.push(raw.send(ENQUEUE, unfinished.clone(), false).await?);
    }
    // Every stream left (refused calls free theirs as they are answered;
    // h2 holds back those past the broker's SETTINGS_MAX_CONCURRENT_STREAMS).
    let mut idle = Vec::new();
    for _ in 0..s.streams_per_connection {
        match raw.call(ENQUEUE).await {
            Some(call) => idle.push(call),
            None => break,
        }
    }
    Some(Hostile {
        _raw: raw,
        _streams: streams,
        refused,
        calls,
        _idle: idle,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_client_cannot_grow_the_brokers_memory_past_its_limits() {
    let s = Settings {
        connections: 8,
        streams_per_connection: 64,
        message: 2 * MIB,
        payload: 64 * KIB,
        requests: 4 * MIB,
        subscriptions: 4,
        credit: 100,
    };
    let db = TestDb::new().await;
    let args = s.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let broker = BinaryBroker::start(&db, &args).await;
    let pid = broker.pid();
    let hostile_connections = s.connections - 1;

    // Jobs for the hostile streams to take: as many as their credit.
    let mut c = broker.client().await;
    let payload = vec![b'l'; s.payload];
    let n_loot = hostile_connections * s.credit as usize;
    for chunk in 0..n_loot.div_ceil(16) {
        let jobs = (0..16.min(n_loot - chunk * 16))
            .map(|_| pb::EnqueueRequest {
                payload: payload.clone(),
                ..job("loot", "")
            })
            .collect();
        c.enqueue_batch(pb::EnqueueBatchRequest { jobs })
            .await
            .expect("enqueue the loot");
    }
    // The well-behaved client: one connection, a stream, unary calls.
    let mut good = subscribe(&mut c, &["good"], 4, None).await;
    for i in 0..20 {
        round(&mut c, &mut good, i).await;
    }
    let base = rss(pid);

    // The attack: every connection slot but the good client's, and as many
    // more connections as it can open, for ATTACK.
    const ATTACK: Duration = Duration::from_secs(8);
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let attack = {
        let (stop, opened) = (stop.clone(), opened.clone());
        let addr = broker.addr;
        tokio::spawn(async move {
            let mut admitted = Vec::new();
            for _ in 0..hostile_connections {
                if let Some(h) = hostile(addr, &s, "loot").await {
                    admitted.push(h);
                }
            }

            // Past the cap: reconnect as the broker closes them, keeping
            // up to 100 open, at most 400 in all.
            let mut over: Vec<Raw> = Vec::new();
            let unfinished = partial(s.message, s.message / 2);
            let mut tries = 0;
            while !stop.load(Ordering::Relaxed) && tries < 400 {
                over.retain(|r| !r.closed());
                if over.len() < 100 {
                    tries += 1;
                    if let Some(mut raw) = Raw::connect(addr).await {
                        opened.fetch_add(1, Ordering::Relaxed);
                        for _ in 0..8 {
                            let _ = raw.send(ENQUEUE, unfinished.clone(), false).await;
                        }
                        over.push(raw);
                    }
                }
                // About 50 new connections a second.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (admitted, over, s)
        })
    };
    let started = Instant::now();
    let mut peak = base;
    let mut rounds = 0;
    let mut slowest = Duration::ZERO;
    while started.elapsed() < ATTACK {
        peak = peak.max(rss(pid));
        let took = tokio::time::timeout(Duration::from_secs(10), round(&mut c, &mut good, rounds))
            .await
            .expect("the good client is served during the attack");
        slowest = slowest.max(took);
        rounds += 1;
        peak = peak.max(rss(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (admitted, over, s) = attack.await.expect("attack");
    peak = peak.max(rss(pid));

    let delivery = s.payload + KIB;
    let bound = s.bound(hostile_connections, delivery);
    let grew = peak.saturating_sub(base);
    eprintln!(
        "broker RSS {} MiB before, peak {} MiB during the attack (+{} MiB, bound {} MiB); \
         {rounds} good round trips, slowest {slowest:?}; {} connections past the cap",
        base / MIB as u64,
        peak / MIB as u64,
        grew / MIB as u64,
        bound / MIB as u64,
        opened.load(Ordering::Relaxed)
    );
    assert!(
        grew <= bound,
        "the broker grew by {} MiB under attack, past the {} MiB the settings allow",
        grew / MIB as u64,
        bound / MIB as u64
    );
    // The attack reached the broker: every hostile connection was admitted
    // and kept its calls, and connections past the cap were opened.
    assert_eq!(admitted.len(), hostile_connections, "hostile connections");
    assert!(
        opened.load(Ordering::Relaxed) >= 20,
        "connections past the cap opened: {}",
        opened.load(Ordering::Relaxed)
    );
    // Each limit answered: the Consume streams past the credit and past the
    // places, the message declaring 1 GiB, and an unfinished message past
    // the request budget.
    let mut admitted = admitted;
    let h = admitted.swap_remove(0);
    let [past_credit, past_places] = &h.refused[..] else {
        panic!("want two refused openings, got {:?}", h.refused);
    };
    names_limit(
        &code(past_credit.clone()),
        "max-in-flight-per-connection",
        s.credit as usize,
    )
    .unwrap_or_else(|e| panic!("a Consume past the credit: {e}"));
    names_limit(
        &code(past_places.clone()),
        "max-subscriptions-per-connection",
        s.subscriptions,
    )
    .unwrap_or_else(|e| panic!("a Consume past the places: {e}"));
    let mut calls = h.calls.into_iter();
    let declared = calls.next().expect("1 GiB call");
    let got = code(status_of(declared.0, Duration::from_secs(5)).await);
    names_limit(&got, "max-message-bytes", s.message)
        .unwrap_or_else(|e| panic!("the 1 GiB message: {e}"));
    // Twice what the budget holds: those that found no room were refused
    // (which ones depends on the order the broker read them in), the
    // others still wait for the rest of their message.
    let mut refused = 0;
    for (resp, _tx) in calls {
        let got = code(status_of(resp, Duration::from_millis(500)).await);
        match got {
            Err(st)
                if st.code() == Code::Unknown && st.message().starts_with("no answer within") => {}
            got => {
                names_limit(&got, "max-request-bytes-per-connection", s.requests)
                    .unwrap_or_else(|e| panic!("an unfinished message: {e}"));
                refused += 1;
            }
        }
    }
    assert!(refused >= 1, "no unfinished message was refused");

    assert!(
        rounds >= 10,
        "only {rounds} good round trips during the attack"
    );
    drop((admitted, over));
    // Still up and serving.
    wait_serving(broker.addr, Duration::from_secs(10)).await;
    let id = enqueue(&mut c, "good", "after").await;
    let d = next_delivery(&mut good, Duration::from_secs(10)).await;
    assert_eq!(id_of(&d), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_limits_that_disagree() {
    // Checked before PostgreSQL is reached (there is none at this address).
    let refused = |extra: &'static [&'static str]| async move {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(["--database-url", "postgres://127.0.0.1:1/none"])
                .args(extra)
                .env("RUST_LOG", "error")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("serve exits within 30s")
        .expect("run leaseq");
        assert!(!out.status.success(), "serve {extra:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&["--max-message-bytes", "2097152"]).await;
    assert!(
        e.contains(
            "--max-message-bytes (2097152) must be at least --max-payload-bytes (1048576) + 1132672"
        ),
        "{e}"
    );
    let e = refused(&[
        "--max-message-bytes",
        "8388608",
        "--max-request-bytes-per-connection",
        "4194304",
    ])
    .await;
    assert!(
        e.contains("--max-request-bytes-per-connection (4194304) must be at least --max-message-bytes (8388608)"),
        "{e}"
    );
    let e = refused(&["--max-in-flight-per-connection", "0"]).await;
    assert!(e.contains("--max-in-flight-per-connection"), "{e}");
}
