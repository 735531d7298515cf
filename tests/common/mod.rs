//! Test harness: a real PostgreSQL (DATABASE_URL, or a shared embedded cluster
//! under the system temp dir), a fresh database per test, and brokers over
//! real gRPC on loopback: in-process ([`TestBroker`], one builder for every
//! test that starts one) or as the real binary ([`BinaryBroker`]), on ports
//! from [`free_port`] (module [`broker`]), with certificates from [`Pki`]
//! (module [`pki`]). Also the helpers several test files share: waiting on
//! streams and conditions ([`take`], [`assert_quiet`], [`stream_end`],
//! [`eventually`]), database snapshots ([`TestDb::fingerprint`],
//! [`TestDb::live_row`], ...), outages ([`TestDb::cut_off`]), AdminService
//! clients ([`admin`], [`update`]), scratch directories under the temp dir
//! that a server running as `postgres` can reach ([`scratch_path`];
//! [`Scratch`], removed when dropped) and reflection.
#![allow(dead_code)]

pub mod broker;
pub mod consume;
pub mod history;
pub mod load;
pub mod pgproxy;
pub mod pki;
pub mod serving;
pub mod slow;

pub use broker::{BinaryBroker, Database, TestBroker, TestBrokerBuilder, free_addr, free_port};
pub use pki::Pki;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leaseq::pb;
use leaseq::pb::admin_service_client::AdminServiceClient;
use leaseq::pb::queue_service_client::QueueServiceClient;
use sqlx::PgPool;
use tokio::sync::OnceCell;
use tonic::Streaming;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub type Client = QueueServiceClient<Channel>;

pub type Admin = AdminServiceClient<Channel>;

/// A Subscribe response stream.
pub type JobStream = Streaming<pb::SubscribeResponse>;

/// URL of a database we may create test databases from.
static ADMIN_URL: OnceCell<String> = OnceCell::const_new();

async fn admin_url() -> &'static str {
    ADMIN_URL
        .get_or_init(|| async {
            if let Ok(url) = std::env::var("DATABASE_URL") {
                return url;
            }
            // Under the system temp dir, not target/: when the suite runs as
            // root the server runs as `postgres`, who must be able to reach it.
            let dir = std::env::temp_dir().join("leaseq-test-pg");
            let pg = leaseq::embedded::EmbeddedPostgres::start(leaseq::embedded::EmbeddedOptions {
                dir,
                durable: false,
            })
            .await
            .expect("starting the embedded test cluster");
            // The shared cluster outlives this process: other test binaries reuse it.
            let url = pg.url("postgres");
            std::mem::forget(pg);
            url
        })
        .await
}

/// `url` with its database name replaced.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    // scheme://authority/dbname
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[scheme_end..].find('/').map(|i| i + scheme_end);
    let mut out = match path_start {
        Some(i) => format!("{}/{db}", &base[..i]),
        None => format!("{base}/{db}"),
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A fresh, empty database for one test (migrations run when a broker starts).
pub struct TestDb {
    pub url: String,
    /// The database's name (also the last segment of `url`).
    pub name: String,
    pub pool: PgPool,
}

/// The migrated database every test database is copied from (`create
/// database ... template`), made once per version of the migrations; and,
/// first, the databases that test processes no longer running left behind
/// (a test database is named `t_<pid>_<random>`), dropped so the shared
/// cluster does not grow with every run. Its value is what follows
/// `create database NAME template`: the template's name and, on PostgreSQL
/// 15+, `strategy file_copy` (the copy is a few small files and a
/// checkpoint, about 45 ms of CPU against 125 ms for the default WAL_LOG,
/// which writes every page of the template to the WAL; the suite makes
/// about 200 databases on 2 cores).
static TEMPLATE: OnceCell<String> = OnceCell::const_new();

async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let admin = admin_url().await;
            let pool = PgPool::connect(admin).await.expect("admin connection");
            // One process at a time tidies up and makes the template.
            let mut conn = pool.acquire().await.expect("admin connection");
            sqlx::query("select pg_advisory_lock(7253411)")
                .execute(&mut *conn)
                .await
                .expect("advisory lock");
            let names: Vec<String> =
                sqlx::query_scalar("select datname from pg_database where datname like 't\\_%'")
                    .fetch_all(&mut *conn)
                    .await
                    .expect("listing test databases");
            for name in names {
                let pid = name.split('_').nth(1).and_then(|p| p.parse::<i32>().ok());
                // SAFETY: kill with signal 0 only checks that the process exists.
                let alive = pid.is_some_and(|p| unsafe { libc::kill(p, 0) } == 0);
                if !alive {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "drop database if exists {name} with (force)"
                    )))
                    .execute(&mut *conn)
                    .await;
                }
            }
            // Named by every migration's version and checksum, not the
            // newest version alone: checkouts sharing this cluster (another
            // branch with a migration restored or changed) must not share a
            // template migrated differently.
            let version = leaseq_server::store::MIGRATOR
                .iter()
                .map(|m| m.version)
                .max()
                .unwrap_or(0);
            let digest =
                leaseq_server::store::MIGRATOR
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325_u64, |h, m| {
                        (m.version.to_le_bytes().iter().chain(m.checksum.iter()))
                            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
                    });
            let tpl = format!("leaseq_template_{version}_{:08x}", digest as u32);
            let exists: bool =
                sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
                    .bind(&tpl)
                    .fetch_one(&mut *conn)
                    .await
                    .expect("looking for the template");
            if !exists {
                let building = format!("{tpl}_building");
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "drop database if exists {building} with (force)"
                )))
                .execute(&mut *conn)
                .await;
                sqlx::query(sqlx::AssertSqlSafe(format!("create database {building}")))
                    .execute(&mut *conn)
                    .await
                    .expect("create template database");
                let migrated = leaseq_server::store::connect(&with_database(admin, &building), 1)
                    .await
                    .expect("template connection");
                leaseq_server::store::migrate(&migrated)
                    .await
                    .expect("migrations");
                migrated.close().await;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "alter database {building} rename to {tpl}"
                )))
                .execute(&mut *conn)
                .await
                .expect("naming the template");
            }
            sqlx::query("select pg_advisory_unlock(7253411)")
                .execute(&mut *conn)
                .await
                .expect("advisory unlock");
            let new_enough: bool =
                sqlx::query_scalar("select current_setting('server_version_num')::int >= 150000")
                    .fetch_one(&mut *conn)
                    .await
                    .expect("server version");
            drop(conn);
            pool.close().await;
            if new_enough {
                format!("{tpl} strategy file_copy")
            } else {
                tpl
            }
        })
        .await
}

impl TestDb {
    /// A fresh database with the schema applied (a copy of the migrated
    /// template).
    pub async fn new() -> TestDb {
        let admin = admin_url().await;
        let tpl = template().await;
        let name = format!(
            "t_{}_{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let pool = PgPool::connect(admin).await.expect("admin connection");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "create database {name} template {tpl}"
        )))
        .execute(&pool)
        .await
        .expect("create database");
        pool.close().await;
        let url = with_database(admin, &name);
        let pool = leaseq_server::store::connect(&url, 4)
            .await
            .expect("test db connection");
        TestDb { url, name, pool }
    }

    /// A connection pool to the cluster's `postgres` database: this one
    /// cannot be altered from a connection to itself.
    async fn admin(&self) -> PgPool {
        PgPool::connect(&with_database(&self.url, "postgres"))
            .await
            .expect("admin connection")
    }

    /// Lets new connections to this database in again, or refuses them
    /// (connections already open are not touched).
    pub async fn allow_connections(&self, allow: bool) {
        let admin = self.admin().await;
        let name = &self.name;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "alter database {name} allow_connections {allow}"
        )))
        .execute(&admin)
        .await
        .expect("alter database allow_connections");
        admin.close().await;
    }

    /// Cuts this database off, as an outage would: no new connections, and
    /// every open one (the brokers', this pool's) ended. Undo with
    /// `allow_connections(true)`.
    pub async fn cut_off(&self) {
        self.allow_connections(false).await;
        let admin = self.admin().await;
        sqlx::query(
            "select pg_terminate_backend(pid) from pg_stat_activity
             where datname = $1 and pid <> pg_backend_pid()",
        )
        .bind(&self.name)
        .execute(&admin)
        .await
        .expect("terminate backends");
        admin.close().await;
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    pub async fn live_jobs(&self) -> i64 {
        self.count("select count(*) from leaseq.jobs").await
    }

    pub async fn dead_jobs(&self) -> i64 {
        self.count("select count(*) from leaseq.dead_jobs").await
    }

    /// Backends of this test database waiting for a lock.
    pub async fn lock_waiters(&self) -> i64 {
        self.count(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
        )
        .await
    }

    /// A live job's (state, attempt, lease token), or None once it left the table.
    pub async fn live_row(&self, id: &str) -> Option<(String, i32, Option<uuid::Uuid>)> {
        sqlx::query_as("select state, attempt, lease_token from leaseq.jobs where id = $1")
            .bind(uuid::Uuid::parse_str(id).expect("job id is a UUID"))
            .fetch_optional(&self.pool)
            .await
            .expect("live row")
    }

    /// A dead job's (reason, attempt, last_error).
    pub async fn dead_row(&self, id: &str) -> Option<(String, i32, Option<String>)> {
        sqlx::query_as("select reason, attempt, last_error from leaseq.dead_jobs where id = $1")
            .bind(uuid::Uuid::parse_str(id).expect("job id is a UUID"))
            .fetch_optional(&self.pool)
            .await
            .expect("dead row")
    }

    /// (payload, state, attempt, lease_token) of every live job, in id order.
    pub async fn job_rows(&self) -> Vec<(String, String, i32, Option<String>)> {
        sqlx::query_as(
            "select convert_from(payload, 'UTF8'), state, attempt, lease_token::text
             from leaseq.jobs order by id",
        )
        .fetch_all(&self.pool)
        .await
        .expect("job rows")
    }

    /// How many jobs of `queue` are leased.
    pub async fn leased_in(&self, queue: &str) -> i64 {
        sqlx::query_scalar("select count(*) from leaseq.jobs where state = 'leased' and queue = $1")
            .bind(queue)
            .fetch_one(&self.pool)
            .await
            .expect("leased count")
    }

    /// Everything a request could have changed, as one comparable string:
    /// every column of every queue, live job and dead job (payloads as
    /// their md5, so 1 MiB payloads stay cheap to compare).
    pub async fn fingerprint(&self) -> String {
        sqlx::query_scalar::<_, String>(
            r#"select concat_ws(E'\n--\n',
                (select coalesce(string_agg(to_jsonb(q)::text, ',' order by name), '')
                   from leaseq.queues q),
                (select coalesce(string_agg((to_jsonb(j) - 'payload')::text || md5(payload), ','
                                            order by id), '')
                   from leaseq.jobs j),
                (select coalesce(string_agg((to_jsonb(d) - 'payload')::text || md5(payload), ','
                                            order by id), '')
                   from leaseq.dead_jobs d))"#,
        )
        .fetch_one(&self.pool)
        .await
        .expect("fingerprint")
    }
}

/// Polls `check` until it holds; returns how long that took. Panics after
/// `limit`, naming `what`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `sql` (a boolean query) is true on `db`; panics after `limit`.
pub async fn until(db: &TestDb, sql: &'static str, limit: Duration) {
    eventually(limit, sql, || async {
        sqlx::query_scalar::<_, bool>(sql)
            .fetch_one(&db.pool)
            .await
            .expect(sql)
    })
    .await;
}

/// An AdminService client of `broker`.
pub async fn admin(broker: &TestBroker) -> Admin {
    AdminServiceClient::connect(broker.url())
        .await
        .expect("admin connect")
}

/// Nacks `d` into the dead letters with `why` as its error.
pub async fn nack_dead(c: &mut Client, d: &pb::Delivery, why: &str) {
    let r = c
        .nack(pb::NackRequest {
            job_id: d.job.as_ref().unwrap().id.clone(),
            lease_token: d.lease_token.clone(),
            error: why.into(),
            retry_after: None,
            dead_letter: true,
        })
        .await
        .expect("nack")
        .into_inner();
    assert!(r.dead_lettered);
}

/// UpdateQueue with `create: true` and whatever `f` sets; returns the
/// settings the broker answered with.
pub async fn update(
    a: &mut Admin,
    f: impl FnOnce(&mut pb::UpdateQueueRequest),
) -> pb::QueueSettings {
    let mut r = pb::UpdateQueueRequest {
        create: true,
        ..Default::default()
    };
    f(&mut r);
    a.update_queue(r)
        .await
        .expect("update_queue")
        .into_inner()
        .settings
        .expect("settings")
}

/// A directory of one test's files under the temp dir
/// (`leaseq-<tag>-<uuid>`), removed with everything in it when dropped: the
/// suite runs on a tmpfs (test.sh), where what a test leaves holds memory.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = scratch_path(tag);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        Scratch(dir)
    }

    /// A new scratch directory holding one file, `name`, with `text`.
    pub fn with_file(tag: &str, name: &str, text: &str) -> (Scratch, PathBuf) {
        let scratch = Scratch::new(tag);
        let path = scratch.path(name);
        std::fs::write(&path, text).expect("writing a scratch file");
        (scratch, path)
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh path (not created) under the system temp dir, for a cluster or
/// anything else a child process may have to reach. Never under the
/// checkout or `CARGO_TARGET_TMPDIR`: as root, PostgreSQL runs as `postgres`
/// (else `nobody`), which must be able to enter every directory above its
/// data, and a checkout may live where only root can (a 0700 home, a
/// `mktemp -d`).
pub fn scratch_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("leaseq-{tag}-{}", uuid::Uuid::new_v4().simple()))
}

pub async fn connect(addr: SocketAddr) -> Client {
    QueueServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

pub async fn health(addr: SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .ok()?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(resp.into_inner().status).ok()
}

/// Polls health for `service` until it is not SERVING (NOT_SERVING, or the
/// server is unreachable); returns what it saw. Panics after `limit`.
pub async fn wait_not_serving(
    addr: SocketAddr,
    service: &str,
    limit: Duration,
) -> Option<ServingStatus> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let h = health(addr, service).await;
        if h != Some(ServingStatus::Serving) {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health {service:?} still SERVING after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the broker reports SERVING (panics after `limit`).
pub async fn wait_serving(addr: SocketAddr, limit: Duration) {
    wait_health(addr, "", ServingStatus::Serving, limit).await
}

pub async fn wait_health(addr: SocketAddr, service: &str, want: ServingStatus, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if health(addr, service).await == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker at {addr} not {want:?} for {service:?} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A job request with defaults.
pub fn job(queue: &str, payload: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.to_owned(),
        payload: payload.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub async fn enqueue(client: &mut Client, queue: &str, payload: &str) -> String {
    client
        .enqueue(job(queue, payload))
        .await
        .expect("enqueue")
        .into_inner()
        .job_id
}

pub fn dur(d: Duration) -> prost_types::Duration {
    d.try_into().unwrap()
}

/// Opens a stream and waits for its first heartbeat (the subscription is then
/// registered with the dispatcher).
pub async fn subscribe(
    client: &mut Client,
    queues: &[&str],
    max_in_flight: u32,
    lease: Option<Duration>,
) -> Streaming<pb::SubscribeResponse> {
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            consumer: "test".into(),
            max_in_flight,
            lease: lease.map(dur),
            accept: Vec::new(),
        })
        .await
        .expect("subscribe")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("first message within 5s")
        .expect("stream ok")
        .expect("stream open");
    assert!(
        matches!(first.kind, Some(pb::subscribe_response::Kind::Heartbeat(_))),
        "first message is a heartbeat"
    );
    stream
}

/// The next delivery, skipping heartbeats; panics after `limit`.
pub async fn next_delivery(
    stream: &mut Streaming<pb::SubscribeResponse>,
    limit: Duration,
) -> pb::Delivery {
    try_next_delivery(stream, limit)
        .await
        .unwrap_or_else(|| panic!("no delivery within {limit:?}"))
}

/// The next delivery within `limit`, or None.
pub async fn try_next_delivery(
    stream: &mut Streaming<pb::SubscribeResponse>,
    limit: Duration,
) -> Option<pb::Delivery> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let msg = tokio::time::timeout_at(deadline, stream.message())
            .await
            .ok()?;
        match msg.expect("stream error").expect("stream ended").kind {
            Some(pb::subscribe_response::Kind::Delivery(d)) => return Some(d),
            _ => continue,
        }
    }
}

/// Waits for `n` deliveries on `s`, each within `limit`.
pub async fn take(s: &mut JobStream, n: usize, limit: Duration) -> Vec<pb::Delivery> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next_delivery(s, limit).await);
    }
    out
}

/// Asserts nothing is delivered on `s` for `window`.
pub async fn assert_quiet(s: &mut JobStream, window: Duration, why: &str) {
    if let Some(d) = try_next_delivery(s, window).await {
        panic!(
            "{why}: unexpected delivery of {:?} (attempt {})",
            String::from_utf8_lossy(&job_of(&d).payload),
            job_of(&d).attempt
        );
    }
}

/// Reads `stream` until it ends; returns its final status (`Ok` for a clean
/// end). Panics on a delivery (none is expected) or when it does not end
/// within `limit`.
pub async fn stream_end(stream: &mut JobStream, limit: Duration) -> Result<(), tonic::Status> {
    tokio::time::timeout(limit, async {
        loop {
            match stream.message().await {
                Ok(Some(m)) => {
                    if let Some(pb::subscribe_response::Kind::Delivery(d)) = m.kind {
                        panic!("delivery on an ending stream: {:?}", d.job.map(|j| j.id));
                    }
                }
                Ok(None) => return Ok(()),
                Err(s) => return Err(s),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("stream did not end within {limit:?}"))
}

pub fn job_of(d: &pb::Delivery) -> &pb::Job {
    d.job.as_ref().expect("delivery carries a job")
}

pub fn id_of(d: &pb::Delivery) -> String {
    job_of(d).id.clone()
}

pub fn payload_of(d: &pb::Delivery) -> String {
    String::from_utf8(job_of(d).payload.clone()).expect("utf-8 payload")
}

pub async fn ack(client: &mut Client, d: &pb::Delivery) -> Result<(), tonic::Status> {
    client
        .ack(pb::AckRequest {
            job_id: d.job.as_ref().unwrap().id.clone(),
            lease_token: d.lease_token.clone(),
            enqueue: Vec::new(),
            result: Vec::new(),
        })
        .await
        .map(|_| ())
}

/// What gRPC server reflection answers: the services it lists, and the file
/// descriptors it returns for one symbol.
#[derive(Debug)]
pub struct Reflection {
    pub services: Vec<String>,
    pub files: Vec<Vec<u8>>,
}

// v1 and v1alpha are the same protocol in two generated modules with no
// common trait, so one body serves both through a macro.
macro_rules! reflect {
    ($version:ident, $addr:expr, $symbol:expr) => {{
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::$version::{ServerReflectionRequest, ServerReflectionResponse};

        let version = stringify!($version);
        let channel = Channel::from_shared(format!("http://{}", $addr))
            .expect("url")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("reflection {version}: connect: {e}"));
        let request = |m: MessageRequest| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let reqs = vec![
            request(MessageRequest::ListServices(String::new())),
            request(MessageRequest::FileContainingSymbol($symbol.to_owned())),
        ];
        let mut resp = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter(reqs))
            .await
            .unwrap_or_else(|e| panic!("reflection {version}: {e:?}"))
            .into_inner();
        let mut next = async || -> ServerReflectionResponse {
            tokio::time::timeout(Duration::from_secs(5), resp.message())
                .await
                .unwrap_or_else(|_| panic!("reflection {version}: no answer within 5s"))
                .unwrap_or_else(|e| panic!("reflection {version}: {e:?}"))
                .unwrap_or_else(|| panic!("reflection {version}: stream ended"))
        };
        let Some(MessageResponse::ListServicesResponse(list)) = next().await.message_response
        else {
            panic!("reflection {version}: not a ListServices response");
        };
        let Some(MessageResponse::FileDescriptorResponse(files)) = next().await.message_response
        else {
            panic!("reflection {version}: no file descriptor for {}", $symbol);
        };
        Reflection {
            services: list.service.into_iter().map(|s| s.name).collect(),
            files: files.file_descriptor_proto,
        }
    }};
}

/// Asks reflection v1 for its services and the file defining `symbol`.
pub async fn reflection_v1(addr: SocketAddr, symbol: &str) -> Reflection {
    reflect!(v1, addr, symbol)
}

/// As [`reflection_v1`], over the older v1alpha protocol.
pub async fn reflection_v1alpha(addr: SocketAddr, symbol: &str) -> Reflection {
    reflect!(v1alpha, addr, symbol)
}
