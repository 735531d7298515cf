//! Brokers for the tests, on loopback: [`TestBroker`], the broker as a
//! library in this process, started by one builder
//! ([`TestBroker::on`], [`TestBroker::on_url`], [`TestBroker::over`]); and
//! [`BinaryBroker`], the real `leaseq serve` as a child process, for what
//! depends on the process (signals, flags, environment, exit codes). Both
//! take their ports from [`free_port`] and their certificates from
//! [`Pki`](super::pki::Pki).
//!
//! ```ignore
//! let broker = TestBroker::start(&db).await;                       // defaults
//! let broker = TestBroker::on(&db).config(|c| c.pool_size = 1).start().await;
//! let broker = TestBroker::on(&db).mutual_tls(&pki).auth_file(&tokens).start().await;
//! let broker = TestBroker::on(&db).addr(addr).start().await;       // a restart where clients look
//! let broker = TestBroker::over(&three.databases()).start().await; // several clusters
//! let broker = BinaryBroker::on(&db).args(&["--pool-size", "3"]).tls(&pki).start().await;
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use leaseq::cli::{ClientChannel, ClientSecurity};
use leaseq::pb::queue_service_client::QueueServiceClient;
use leaseq_server::Config;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::pki::Pki;
use super::{Client, TestDb, connect, health};

/// One PostgreSQL cluster of a broker over several ([`TestBroker::over`]).
pub use leaseq_server::server::Database;

/// A free loopback port for a broker process to bind later (and bind
/// again after a restart). Taken below Linux's ephemeral range (32768 and
/// up): a port from `bind :0` is one that any other test's in-process
/// broker or outgoing connection may be given before the process binds it
/// (a kill -9 run once lost a replica so: "Address already in use"). Each
/// candidate is checked free; the process id spreads parallel test
/// processes over the range.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (base.wrapping_add(k.wrapping_mul(7919)) % SPAN);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// `127.0.0.1:`[`free_port`].
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// The settings of every in-process test broker before a test's own:
/// short intervals, so that tests wait less.
fn test_config() -> Config {
    Config {
        heartbeat_interval: Duration::from_millis(500),
        reap_interval: Duration::from_millis(200),
        health_interval: Duration::from_millis(200),
        drain_grace: Duration::from_secs(5),
        pool_size: 5,
        ..Config::default()
    }
}

/// Whether the broker at `url` answers health SERVING to a client with `sec`
/// (TLS: the harness's plaintext [`health`] cannot be used).
async fn serving_over(url: &str, sec: &ClientSecurity) -> bool {
    let Ok(ch) = leaseq::cli::connect(url, sec).await else {
        return false;
    };
    HealthClient::new(ch)
        .check(HealthCheckRequest::default())
        .await
        .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
}

/// Waits until the broker at `addr` reports SERVING (over TLS with `tls`),
/// and its HTTP listener, if any, accepts connections; panics after `limit`
/// or as soon as `exited()` says the broker is gone.
async fn wait_ready(
    addr: SocketAddr,
    tls: Option<&ClientSecurity>,
    http: Option<SocketAddr>,
    limit: Duration,
    mut exited: impl FnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + limit;
    let url = format!("https://{addr}");
    loop {
        let serving = match tls {
            Some(sec) => serving_over(&url, sec).await,
            None => health(addr, "").await == Some(ServingStatus::Serving),
        };
        let http_up = match http {
            Some(h) => serving && tokio::net::TcpStream::connect(h).await.is_ok(),
            None => true,
        };
        if serving && http_up {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker at {addr} not serving within {limit:?} (serving: {serving}, http {http:?} up: {http_up})"
        );
        assert!(!exited(), "broker at {addr} exited at startup");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A broker running in this process (`leaseq_server::server::run_clusters`
/// on a spawned task), on 127.0.0.1: an ephemeral port unless
/// [`TestBrokerBuilder::addr`] gives one.
pub struct TestBroker {
    pub addr: SocketAddr,
    /// The console's and /metrics' listener ([`TestBrokerBuilder::http`]).
    http: Option<SocketAddr>,
    /// Whether it serves TLS (its URL is https://).
    tls: bool,
    /// How long [`TestBroker::stop`] waits for the drain.
    stop_within: Duration,
    /// Cancelled to drain and stop it.
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// How a [`TestBroker`] starts: its databases, its [`Config`] (from
/// [`test_config`]), its address, TLS, and how long to wait for it.
#[must_use = "a builder starts nothing until .start(), .spawn() or .run()"]
pub struct TestBrokerBuilder {
    databases: Vec<Database>,
    cfg: Config,
    addr: Option<SocketAddr>,
    /// The readiness probe's client settings when the broker serves TLS.
    tls: Option<ClientSecurity>,
    ready_within: Duration,
    stop_within: Duration,
}

impl TestBroker {
    /// A broker on `db` with the test defaults, once it serves.
    pub async fn start(db: &TestDb) -> TestBroker {
        TestBroker::on(db).start().await
    }

    /// A broker on one database, `db`.
    pub fn on(db: &TestDb) -> TestBrokerBuilder {
        TestBroker::on_url(&db.url)
    }

    /// A broker on one database given by its URL (a private cluster, a
    /// proxy in front of one).
    pub fn on_url(url: &str) -> TestBrokerBuilder {
        TestBroker::over(&[Database {
            // As `leaseq_server::server::run` names its one database.
            name: "main".to_owned(),
            url: url.to_owned(),
        }])
    }

    /// A broker over several clusters, the home cluster first
    /// (docs/SCALING.md).
    pub fn over(databases: &[Database]) -> TestBrokerBuilder {
        TestBrokerBuilder {
            databases: databases.to_vec(),
            cfg: test_config(),
            addr: None,
            tls: None,
            ready_within: Duration::from_secs(20),
            stop_within: Duration::from_secs(15),
        }
    }

    /// Whether `run` has returned (e.g. it failed at startup).
    pub fn has_exited(&self) -> bool {
        self.handle.is_finished()
    }

    /// `http://ADDR`, or `https://ADDR` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The console's and /metrics' address ([`TestBrokerBuilder::http`]).
    pub fn http(&self) -> SocketAddr {
        self.http.expect("a broker started with .http()")
    }

    /// A plaintext client.
    pub async fn client(&self) -> Client {
        connect(self.addr).await
    }

    /// A client of [`TestBroker::url`] with `sec` (TLS, a client
    /// certificate, a token), as the CLI connects.
    pub async fn client_with(
        &self,
        sec: &ClientSecurity,
    ) -> anyhow::Result<QueueServiceClient<ClientChannel>> {
        Ok(QueueServiceClient::new(
            leaseq::cli::connect(&self.url(), sec).await?,
        ))
    }

    /// Drains and stops the broker; returns once `run` has returned, and
    /// panics unless it returned Ok within the builder's bound (15 s unless
    /// [`TestBrokerBuilder::stop_within`]).
    pub async fn stop(self) {
        let within = self.stop_within;
        self.shutdown(within)
            .await
            .unwrap_or_else(|| panic!("broker stops within {within:?}"))
            .expect("broker run (its task and `run`)");
    }

    /// Begins a drain and waits at most `limit` for `run` to return: its
    /// result (an error too if its task panicked), or None when it is still
    /// running.
    pub async fn shutdown(self, limit: Duration) -> Option<anyhow::Result<()>> {
        self.shutdown.cancel();
        let joined = tokio::time::timeout(limit, self.handle).await.ok()?;
        Some(joined.map_err(anyhow::Error::from).and_then(|run| run))
    }

    /// Begins a drain without waiting for it.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl TestBrokerBuilder {
    /// Changes the settings; applied in the order given, after the test
    /// defaults and after anything the builder set before.
    pub fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.cfg);
        self
    }

    /// Listens on `addr` (e.g. a [`free_addr`] a test restarts a broker on).
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    /// Serves TLS with `pki`'s server certificate; readiness is probed with
    /// `pki`'s CA and client certificate.
    pub fn tls(mut self, pki: &Pki) -> Self {
        self.cfg.security.tls_cert = Some(pki.server_cert.clone());
        self.cfg.security.tls_key = Some(pki.server_key.clone());
        self.tls = Some(pki.identity());
        self
    }

    /// [`tls`](Self::tls), and requires a client certificate signed by
    /// `pki`'s CA.
    pub fn mutual_tls(self, pki: &Pki) -> Self {
        let mut b = self.tls(pki);
        b.cfg.security.tls_client_ca = Some(pki.ca.clone());
        b
    }

    /// Requires bearer tokens from the file `path` (docs/SECURITY.md).
    pub fn auth_file(mut self, path: &Path) -> Self {
        self.cfg.security.auth_file = Some(path.to_owned());
        self
    }

    /// Turns the HTTP listener on (the console and /metrics) at a
    /// [`free_addr`]; readiness then also waits for it to accept.
    pub fn http(mut self) -> Self {
        self.cfg.http_listen = Some(free_addr());
        self
    }

    /// How long [`start`](Self::start) waits for SERVING (20 s by default).
    pub fn ready_within(mut self, limit: Duration) -> Self {
        self.ready_within = limit;
        self
    }

    /// How long [`TestBroker::stop`] waits for the drain (15 s by default).
    pub fn stop_within(mut self, limit: Duration) -> Self {
        self.stop_within = limit;
        self
    }

    /// Starts the broker and returns once it serves (see
    /// [`ready_within`](Self::ready_within)).
    pub async fn start(self) -> TestBroker {
        let (ready_within, tls) = (self.ready_within, self.tls.clone());
        let broker = self.spawn().await;
        wait_ready(broker.addr, tls.as_ref(), broker.http, ready_within, || {
            broker.has_exited()
        })
        .await;
        broker
    }

    /// Starts the broker without waiting for it to serve (a test that
    /// probes readiness its own way).
    pub async fn spawn(self) -> TestBroker {
        let listener = self.bind().await;
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let http = self.cfg.http_listen;
        let (cfg, databases) = (self.cfg, self.databases);
        let handle = tokio::spawn(async move {
            leaseq_server::server::run_clusters(cfg, &databases, listener, token).await
        });
        TestBroker {
            addr,
            http,
            tls: self.tls.is_some(),
            stop_within: self.stop_within,
            shutdown,
            handle,
        }
    }

    /// Runs the broker here, never asked to stop, and returns what `run`
    /// returned: for settings it must refuse at startup.
    pub async fn run(self) -> anyhow::Result<()> {
        let listener = self.bind().await;
        leaseq_server::server::run_clusters(
            self.cfg,
            &self.databases,
            listener,
            CancellationToken::new(),
        )
        .await
    }

    async fn bind(&self) -> tokio::net::TcpListener {
        let addr = self.addr.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
        tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("binding {addr}: {e}"))
    }
}

/// The real `leaseq` binary as a child process (`leaseq serve` with the
/// test defaults as flags), killed when dropped.
pub struct BinaryBroker {
    pub addr: SocketAddr,
    pub child: tokio::process::Child,
}

/// How a [`BinaryBroker`] starts: its flags, environment, address, log and
/// TLS.
#[must_use = "a builder starts nothing until .start()"]
pub struct BinaryBrokerBuilder {
    url: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    addr: Option<SocketAddr>,
    log: Option<PathBuf>,
    tls: Option<ClientSecurity>,
}

impl BinaryBroker {
    /// `leaseq serve` on `db` with `extra` flags, once it serves.
    pub async fn start(db: &TestDb, extra: &[&str]) -> BinaryBroker {
        BinaryBroker::on(db).args(extra).start().await
    }

    /// `leaseq serve` on `db`.
    pub fn on(db: &TestDb) -> BinaryBrokerBuilder {
        BinaryBroker::on_url(&db.url)
    }

    /// `leaseq serve` on the database at `url` (a private cluster).
    pub fn on_url(url: &str) -> BinaryBrokerBuilder {
        BinaryBrokerBuilder {
            url: url.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            addr: None,
            log: None,
            tls: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Waits for exit; panics after `limit`.
    pub async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .expect("broker exits in time")
            .expect("wait")
    }

    pub async fn client(&self) -> Client {
        connect(self.addr).await
    }
}

impl BinaryBrokerBuilder {
    /// More flags for `leaseq serve` (after the harness's own, so they win).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable for the child.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Listens on `addr`, chosen beforehand (e.g. one a load balancer's
    /// config already names); a [`free_addr`] otherwise.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    /// Writes the broker's log (stderr, warnings and up) to the file `path`
    /// instead of the test's stderr, for tests that check what it warns.
    pub fn log(mut self, path: &Path) -> Self {
        self.log = Some(path.to_owned());
        self
    }

    /// Serves TLS with `pki`'s server certificate (`--tls-cert`,
    /// `--tls-key`); readiness is probed with `pki`'s CA and client
    /// certificate.
    pub fn tls(mut self, pki: &Pki) -> Self {
        let (cert, key) = (pki.server_cert.display(), pki.server_key.display());
        let (cert, key) = (cert.to_string(), key.to_string());
        self = self.args(&["--tls-cert", &cert, "--tls-key", &key]);
        self.tls = Some(pki.identity());
        self
    }

    /// `--auth-file path`: bearer tokens required (docs/SECURITY.md).
    pub fn auth_file(self, path: &Path) -> Self {
        let path = path.display().to_string();
        self.args(&["--auth-file", &path])
    }

    /// Spawns `leaseq serve` and returns once it serves (30 s at most).
    pub async fn start(self) -> BinaryBroker {
        let tls = self.tls.clone();
        let mut broker = self.spawn();
        wait_ready(
            broker.addr,
            tls.as_ref(),
            None,
            Duration::from_secs(30),
            || matches!(broker.child.try_wait(), Ok(Some(_))),
        )
        .await;
        broker
    }

    /// Spawns `leaseq serve` without waiting for it to serve.
    pub fn spawn(self) -> BinaryBroker {
        let addr = self.addr.unwrap_or_else(free_addr);
        let stderr = match &self.log {
            Some(path) => {
                Stdio::from(std::fs::File::create(path).expect("creating the broker's log file"))
            }
            None => Stdio::inherit(),
        };
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"))
            .arg("serve")
            .args(["--listen", &addr.to_string()])
            .args(["--database-url", &self.url])
            .args(["--reap-interval", "200ms", "--health-interval", "200ms"])
            .args(["--heartbeat-interval", "500ms", "--drain-grace", "5s"])
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn leaseq serve");
        BinaryBroker { addr, child }
    }
}
