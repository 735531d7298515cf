//! Assembles and runs a broker in three steps: [`Server::build`] (security
//! settings, connections, migrations, the core and its background
//! services), [`Server::serve`] (health, reflection and the gRPC services)
//! and [`Server::drain`], then joins the background services.
//!
//! [`run`] takes an already-bound listener (tests bind `127.0.0.1:0`) and a
//! shutdown token (the binary cancels it on SIGTERM / SIGINT).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgListener;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::{Router, TcpIncoming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tower_layer::{Identity, Stack};
use tracing::{info, warn};

use crate::api::admin::AdminApi;
use crate::api::queue::QueueApi;
use crate::broker::Broker;
use crate::config::Config;
use crate::conn_limit::{Admission, ConnCaps};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::pb::admin_service_server::AdminServiceServer;
use crate::pb::queue_service_server::QueueServiceServer;
use crate::placement::Clusters;
use crate::request_limit::RequestLimitLayer;
use crate::settle::Notifiers;
use crate::store::{self, Store};
use crate::telemetry::Traces;

/// Health service name that stays SERVING while the process is healthy, even
/// when PostgreSQL is not: orchestrators use it for liveness, so a database
/// outage does not restart every replica.
pub(crate) const LIVENESS: &str = "liveness";
/// Health service name of the queue service.
pub(crate) const QUEUE_SERVICE: &str = "leaseq.v1.QueueService";
/// Health service name of the admin service (same readiness as the queue service).
pub(crate) const ADMIN_SERVICE: &str = "leaseq.v1.AdminService";

/// Runs the broker until `shutdown` is cancelled, then drains: reports
/// NOT_SERVING, releases every stream's unsettled jobs and ends the streams
/// with UNAVAILABLE, lets unary calls in flight finish, and returns within
/// `drain_grace`.
pub async fn run(
    cfg: Config,
    database_url: &str,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let db = Database {
        name: crate::domain::HOME_NAME.to_owned(),
        url: database_url.to_owned(),
    };
    run_clusters(cfg, &[db], listener, shutdown).await
}

/// One PostgreSQL cluster the broker routes to (docs/SCALING.md).
#[derive(Clone, Debug)]
pub struct Database {
    /// `--database-url NAME=URI`'s NAME; `main` for a single database.
    pub name: String,
    /// A URI or keyword/value string, read with the PG* variables.
    pub url: String,
}

/// [`run`] over several clusters, the home cluster (which holds the
/// placement) first. One database behaves exactly as [`run`].
pub async fn run_clusters(
    cfg: Config,
    databases: &[Database],
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    anyhow::ensure!(!databases.is_empty(), "no database given");
    let broker = Server::build(cfg, databases, &shutdown).await?;
    broker.serve(listener, shutdown).await
}

/// The connections of one cluster, closed at the end.
struct Connections {
    pool: sqlx::PgPool,
    conns: store::Conns,
    listen_pool: sqlx::PgPool,
}

/// A broker built and ready to serve: its connections, core, background
/// services and gRPC services.
struct Server {
    cfg: Config,
    /// Per cluster, home first.
    connections: Vec<Connections>,
    broker: Arc<Broker>,
    /// The operator API, shared by the gRPC AdminService and the console.
    admin: Arc<AdminApi>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    auth: crate::auth::Authenticator,
    reporter: HealthReporter,
    health: tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
    /// The background services (LISTEN, reaper, retention, vacuum, health,
    /// the HTTP servers of the console and the metrics); each ends when `stop_background` is cancelled, and
    /// [`Server::serve`] joins them before it returns.
    background: JoinSet<()>,
    stop_background: CancellationToken,
    /// Cancelled when a drain starts: health stays NOT_SERVING from then on,
    /// and WatchQueues streams end.
    draining: CancellationToken,
    /// The OTLP exporter of job spans (off unless `cfg.otlp`); flushed last.
    traces: Traces,
}

impl Server {
    /// Reads the security settings, connects (retrying while PostgreSQL
    /// starts), migrates, and starts the core and the background services.
    async fn build(
        cfg: Config,
        databases: &[Database],
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Server> {
        // Security settings are read before anything starts, so a bad file
        // stops the broker instead of serving without the protection asked for.
        let (tls, auth, traces) = security(&cfg)?;
        let clusters = connect_clusters(&cfg, databases, shutdown).await?;
        let home = clusters.home().clone();
        info!(broker = %home.broker_id(), clusters = clusters.all().len(), "migrations applied");

        let dispatcher = Dispatcher::spawn(
            clusters.clone(),
            Notifiers::spawn(&clusters),
            DispatchConfig {
                heartbeat_interval: cfg.heartbeat_interval,
                poll_interval: cfg.poll_interval,
                max_rounds_in_flight: DispatchConfig::rounds_for_pool(cfg.pool_size),
            },
        );
        let (connections, listens) = listen(&cfg, &clusters, databases).await?;
        let broker = Broker::new(
            clusters.clone(),
            dispatcher.clone(),
            cfg.batch_concurrency,
            cfg.ack_linger,
        );
        let (reporter, health) = health_service().await;

        let stop = CancellationToken::new();
        let draining = CancellationToken::new();
        let mut background = JoinSet::new();
        spawn_cluster_services(
            &cfg,
            &clusters,
            listens,
            &dispatcher,
            &stop,
            &mut background,
        );
        spawn_broker_services(
            &cfg,
            &clusters,
            &reporter,
            &draining,
            &stop,
            &mut background,
        );
        let scheduler = spawn_scheduler(&cfg, &clusters, &broker, &stop, &mut background);
        let admin = Arc::new(AdminApi::new(
            broker.clone(),
            draining.clone(),
            scheduler,
            cfg.request_limits,
        ));
        // The console's test jobs go through the QueueService's own handler.
        let queue_api =
            Arc::new(QueueApi::new(broker.clone(), cfg.request_limits).with_traces(traces.clone()));
        start_http(
            &cfg,
            admin.clone(),
            queue_api,
            &clusters,
            &auth,
            &stop,
            &mut background,
        )
        .await?;
        Ok(Server {
            cfg,
            connections,
            broker,
            admin,
            tls,
            auth,
            reporter,
            health,
            background,
            stop_background: stop,
            draining,
            traces,
        })
    }

    /// Serves gRPC on `listener` until `shutdown`, then drains.
    async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr()?;
        let stop_server = CancellationToken::new();
        let router = self.router()?;
        // --max-connections and each connection's budgets (conn_limit.rs).
        let incoming = Admission::new(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            ConnCaps::of(&self.cfg.security),
        );
        let mut server = tokio::spawn(
            router.serve_with_incoming_shutdown(incoming, stop_server.clone().cancelled_owned()),
        );
        info!(%addr, "leaseq serving");
        tokio::select! {
            _ = shutdown.cancelled() => {}
            r = &mut server => {
                self.stop().await;
                r??;
                anyhow::bail!("gRPC server stopped unexpectedly");
            }
        }
        self.drain(server, stop_server).await;
        self.stop().await;
        Ok(())
    }

    /// The gRPC server with every service: health and reflection (open to
    /// all), the queue and admin services (behind authentication).
    fn router(&mut self) -> anyhow::Result<Router<Stack<RequestLimitLayer, Identity>>> {
        let cfg = &self.cfg;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        let limits = cfg.request_limits;
        let queue_api = QueueApi::new(self.broker.clone(), limits)
            .with_stream_limit(crate::stream_limit::StreamLimit::new(
                cfg.security.max_streams,
            ))
            .with_traces(self.traces.clone());
        // A delivery of the largest job fits (`check_settings`), and so
        // does a completed job's record with the largest result (GetJob).
        let max_encoding = limits
            .max_message_bytes
            .max(limits.max_payload_bytes * 2)
            .saturating_add(limits.max_result_bytes);
        let queue_service = QueueServiceServer::new(queue_api)
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(max_encoding);
        // Admin calls need a token with the `admin` action (when auth is on).
        let admin_service = InterceptedService::new(
            AdminServiceServer::from_arc(self.admin.clone())
                .max_encoding_message_size(max_encoding),
            crate::auth::AdminGate::new(self.auth.clone()),
        );
        // Authentication runs before the body is decoded; health and
        // reflection are not wrapped, so probes and grpcurl's `list` work
        // without a token.
        let queue_service = InterceptedService::new(queue_service, self.auth.clone());

        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(cfg.keepalive_interval))
            .http2_keepalive_timeout(Some(cfg.keepalive_timeout))
            .tcp_nodelay(true)
            // Message sizes and each connection's request budget, on every
            // service; a connection over --max-connections is refused here.
            .layer(RequestLimitLayer::new(limits.max_message_bytes));
        if let Some(age) = cfg.max_connection_age {
            builder = builder.max_connection_age(age);
        }
        if let Some(grace) = cfg.max_connection_age_grace {
            builder = builder.max_connection_age_grace(grace);
        }
        builder = builder.max_concurrent_streams(cfg.security.max_streams_per_connection);
        if let Some(limit) = cfg.security.concurrency_limit_per_connection {
            // Shed instead of queueing: a call over the limit fails at once
            // with RESOURCE_EXHAUSTED rather than waiting behind the others.
            builder = builder
                .concurrency_limit_per_connection(limit)
                .load_shed(true);
        }
        if let Some(tls) = self.tls.take() {
            builder = builder
                .tls_config(tls)
                .context("--tls-cert / --tls-key / --tls-client-ca")?;
        }
        Ok(builder
            .add_service(self.health.clone())
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(queue_service)
            .add_service(admin_service))
    }

    /// NOT_SERVING at once, then the broker's drain (streams' jobs released,
    /// streams ended), then the server stops taking calls and finishes those
    /// in flight; all within `drain_grace`.
    async fn drain(
        &self,
        server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
        stop_server: CancellationToken,
    ) {
        info!(grace = ?self.cfg.drain_grace, "draining");
        self.draining.cancel();
        set_ready(&self.reporter, false).await;
        self.broker.store().metrics().serving.set(0);
        let drained = tokio::time::timeout(self.cfg.drain_grace, async {
            self.broker.drain().await;
            stop_server.cancel();
            server.await
        })
        .await;
        match drained {
            Ok(Ok(Ok(()))) => info!("drained"),
            Ok(Ok(Err(e))) => warn!(error = %e, "gRPC server error while draining"),
            Ok(Err(e)) => warn!(error = %e, "gRPC server task failed"),
            Err(_) => warn!("drain grace period elapsed; exiting with calls in flight"),
        }
    }

    /// Ends the background services, waits for them, closes the connections.
    async fn stop(&mut self) {
        self.stop_background.cancel();
        while let Some(r) = self.background.join_next().await {
            if let Err(e) = r
                && e.is_panic()
            {
                warn!(error = %e, "a background service panicked");
            }
        }
        // sqlx's close waits for every connection lent out to come back:
        // one whose server stopped answering may never, so not for long.
        for c in &self.connections {
            let _ = tokio::time::timeout(store::conn::PING_TIMEOUT, c.pool.close()).await;
            c.conns.close().await;
            let _ = tokio::time::timeout(store::conn::PING_TIMEOUT, c.listen_pool.close()).await;
        }
        self.traces.shutdown().await;
    }
}

/// The security settings (request limits, TLS, tokens) and the OTLP
/// exporter, read before anything starts.
fn security(
    cfg: &Config,
) -> anyhow::Result<(
    Option<tonic::transport::ServerTlsConfig>,
    crate::auth::Authenticator,
    Traces,
)> {
    crate::request_limit::check_settings(cfg)?;
    let tls = crate::tls::server_config(&cfg.security)?;
    let auth = authenticator(cfg)?;
    let traces = match &cfg.otlp {
        Some(otlp) => Traces::start(otlp).context("--otlp-endpoint")?,
        None => Traces::off(),
    };
    if tls.is_none() {
        warn!(
            "TLS is OFF (no --tls-cert): gRPC traffic, payloads and bearer tokens cross the network in plaintext"
        );
    }
    Ok((tls, auth, traces))
}

/// One LISTEN connection per cluster: wake-ups and settles are sent on the
/// cluster of the queue or the lease. Returns each cluster's connections
/// and its listener with how to replace it.
async fn listen(
    cfg: &Config,
    clusters: &Clusters,
    databases: &[Database],
) -> anyhow::Result<(Vec<Connections>, Vec<(PgListener, crate::notify::Relisten)>)> {
    let mut connections = Vec::new();
    let mut listens = Vec::new();
    let session = session(cfg)?;
    for (store, db) in clusters.all().iter().zip(databases) {
        let listen_pool = store::connect_listener_with(&db.url, session).await?;
        let listen = crate::notify::listen(store, &listen_pool)
            .await
            .with_context(|| format!("opening the LISTEN connection to cluster {}", db.name))?;
        let relisten = crate::notify::Relisten {
            url: db.url.clone(),
            session,
            check: cfg.health_interval,
        };
        listens.push((listen, relisten));
        connections.push(Connections {
            pool: store.pool().clone(),
            conns: store.conns().clone(),
            listen_pool,
        });
    }
    Ok((connections, listens))
}

/// The schedules' firing (docs/design/schedules.md): one loop per broker,
/// since schedules live on the home cluster, unless its interval is zero.
/// The scheduler is also RunSchedule's.
fn spawn_scheduler(
    cfg: &Config,
    clusters: &Clusters,
    broker: &Broker,
    stop: &CancellationToken,
    background: &mut JoinSet<()>,
) -> crate::schedule::run::Scheduler {
    let scheduler = crate::schedule::run::Scheduler::new(
        clusters.clone(),
        broker.settle().clone(),
        cfg.schedule_grace,
    );
    if !cfg.schedule_interval.is_zero() {
        background.spawn(scheduler.clone().run(cfg.schedule_interval, stop.clone()));
    }
    scheduler
}

/// The health service: live at once, ready once [`health_loop`] says.
async fn health_service() -> (
    HealthReporter,
    tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
) {
    let reporter = HealthReporter::new();
    let health = tonic_health::pb::health_server::HealthServer::new(
        tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
    );
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    set_ready(&reporter, false).await;
    (reporter, health)
}

/// Each cluster's services, until `stop`: its LISTEN connection, the lease
/// reaper and ttl expiry, retention and vacuum (unless their interval is
/// zero); and WaitJob's poll over them all.
fn spawn_cluster_services(
    cfg: &Config,
    clusters: &Clusters,
    listens: Vec<(PgListener, crate::notify::Relisten)>,
    dispatcher: &Dispatcher,
    stop: &CancellationToken,
    background: &mut JoinSet<()>,
) {
    for (store, (listen, relisten)) in clusters.all().iter().zip(listens) {
        background.spawn(crate::notify::run(
            store.clone(),
            listen,
            relisten,
            dispatcher.clone(),
            stop.clone(),
        ));
        background.spawn(crate::maintenance::run(
            dispatcher.settle().clone(),
            store.clone(),
            cfg.reap_interval,
            stop.clone(),
        ));
        if !cfg.retention_interval.is_zero() {
            background.spawn(crate::maintenance::retention_loop(
                store.clone(),
                cfg.retention_interval,
                cfg.result_retention,
                stop.clone(),
            ));
        }
        if !cfg.vacuum_interval.is_zero() {
            background.spawn(crate::maintenance::vacuum_loop(
                store.clone(),
                cfg.vacuum_interval,
                stop.clone(),
            ));
        }
    }
    // WaitJob's poll: one for the broker, over every cluster.
    let waits = dispatcher.settle().waits().clone();
    waits.set_max(cfg.max_waiters);
    background.spawn(crate::waits::poll_loop(
        waits,
        clusters.clone(),
        cfg.wait_poll_interval,
        stop.clone(),
    ));
}

/// The broker's own services, until `stop`: with several clusters,
/// following the placement and sweeping stray jobs; the health loop; the
/// history sampler.
fn spawn_broker_services(
    cfg: &Config,
    clusters: &Clusters,
    reporter: &HealthReporter,
    draining: &CancellationToken,
    stop: &CancellationToken,
    background: &mut JoinSet<()>,
) {
    if !clusters.is_single() {
        background.spawn(crate::placement::follow(
            clusters.clone(),
            cfg.placement_interval,
            stop.clone(),
        ));
        if !cfg.sweep_interval.is_zero() {
            background.spawn(crate::placement::sweep_loop(
                clusters.clone(),
                cfg.sweep_interval,
                stop.clone(),
            ));
        }
    }
    background.spawn(health_loop(
        clusters.clone(),
        reporter.clone(),
        cfg.health_interval,
        draining.clone(),
        stop.clone(),
    ));
    // Every broker's rates go to the database for the console of any
    // replica; a broker that serves /metrics or the console also counts
    // the queues' depth (the per-queue gauges).
    background.spawn(crate::history::sample_loop(
        clusters.clone(),
        cfg.metrics_interval,
        cfg.metrics_listen.is_some() || cfg.http_listen.is_some(),
        stop.clone(),
    ));
}

/// Starts the HTTP servers asked for: `--metrics-listen` (only `/metrics`)
/// and `--http-listen` (the console and `/metrics`, over TLS when the broker
/// has TLS). The per-queue gauges both read are refreshed by
/// [`crate::history::sample_loop`].
async fn start_http(
    cfg: &Config,
    admin: Arc<AdminApi>,
    queue_api: Arc<QueueApi>,
    clusters: &Clusters,
    auth: &crate::auth::Authenticator,
    stop: &CancellationToken,
    background: &mut JoinSet<()>,
) -> anyhow::Result<()> {
    if cfg.metrics_listen.is_none() && cfg.http_listen.is_none() {
        return Ok(());
    }
    let store = clusters.home();
    if let Some(addr) = cfg.metrics_listen {
        let listener = crate::console::bind(addr, "metrics").await?;
        info!(addr = %listener.local_addr()?, "metrics on /metrics");
        background.spawn(crate::console::serve(
            listener,
            None,
            crate::console::metrics_router(store.clone()),
            stop.clone(),
        ));
    }
    if let Some(addr) = cfg.http_listen {
        let tls = crate::console::tls_acceptor(&cfg.security)?;
        let listener = crate::console::bind(addr, "http").await?;
        let local = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        info!(url = %format!("{scheme}://{local}/"), "console and /metrics");
        if !auth.is_enabled() {
            warn!(
                %local,
                "console authentication is OFF (no --auth-file): anyone who reaches the console may read payloads, pause queues, requeue and purge dead letters"
            );
        }
        if tls.is_none() {
            warn!(%local, "console TLS is OFF (no --tls-cert): session cookies and payloads cross the network in plaintext");
        }
        let console = crate::console::Console::new(
            admin,
            queue_api,
            store.clone(),
            auth.clone(),
            tls.is_some(),
            stop.clone(),
        );
        background.spawn(crate::console::serve(
            listener,
            tls,
            crate::console::router(console),
            stop.clone(),
        ));
    }
    Ok(())
}

/// The bearer-token check, from `--auth-file` (or none, with a warning).
fn authenticator(cfg: &Config) -> anyhow::Result<crate::auth::Authenticator> {
    Ok(match &cfg.security.auth_file {
        Some(path) => {
            let tokens = crate::auth::TokenSet::load(path)?;
            info!(path = %path.display(), tokens = tokens.len(), "bearer-token authentication on");
            crate::auth::Authenticator::new(Some(tokens))
        }
        None => {
            warn!(
                "authentication is OFF (no --auth-file): any client that reaches this port may enqueue, consume and settle on every queue"
            );
            crate::auth::Authenticator::new(None)
        }
    })
}

/// Connects to PostgreSQL, retrying (it may still be starting) until it
/// answers or `shutdown`.
async fn connect_with_retry(
    url: &str,
    pool_size: u32,
    session: store::Session,
    shutdown: &CancellationToken,
) -> anyhow::Result<(sqlx::PgPool, store::Conns)> {
    let mut delay = Duration::from_millis(200);
    let started = tokio::time::Instant::now();
    loop {
        match store::open_with(url, pool_size, session).await {
            Ok(pool) => return Ok(pool),
            // Wrong settings or a TLS failure: waiting will not fix them.
            Err(e) if crate::pgconn::is_permanent(&e) => {
                return Err(e).context("connecting to PostgreSQL");
            }
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                warn!(error = %e, "PostgreSQL not reachable yet; retrying");
            }
            Err(e) => return Err(e).context("connecting to PostgreSQL"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("shut down before PostgreSQL was reachable"),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// The session settings `cfg` asks for, checked.
fn session(cfg: &Config) -> anyhow::Result<store::Session> {
    if let Some(t) = cfg.pg_statement_timeout {
        anyhow::ensure!(
            t >= Duration::from_millis(1) && t.as_millis() <= i32::MAX as u128,
            "pg_statement_timeout {t:?}: PostgreSQL takes 1ms to 2^31-1 ms"
        );
    }
    Ok(store::Session {
        statement_timeout: cfg.pg_statement_timeout,
    })
}

/// Logs a warning for each PostgreSQL setting that lets a crash of the
/// server lose what the broker answered as committed (docs/SECURITY.md,
/// "PostgreSQL's durability"). The session's values: a setting made for the database or
/// the role counts. A failure to look is only logged.
async fn warn_if_not_durable(pool: &sqlx::PgPool, cluster: &str, several: bool) {
    let settings = match store::durability_settings(pool).await {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "could not read PostgreSQL's durability settings");
            return;
        }
    };
    for (name, value) in settings {
        let risk = match (name.as_str(), value.as_str()) {
            ("fsync", "off") => {
                "a crash of PostgreSQL's host (or of the operating system) can corrupt the database \
                 and lose jobs answered as enqueued, and acks answered OK (the jobs come back)"
            }
            ("synchronous_commit", "off") => {
                "a crash of PostgreSQL can lose its last commits (up to three times \
                 wal_writer_delay): jobs answered as enqueued can vanish, and acked jobs be \
                 delivered again"
            }
            ("full_page_writes", "off") => {
                "a crash of PostgreSQL's host during a write can leave torn pages the database \
                 cannot recover from"
            }
            _ => continue,
        };
        if several {
            warn!(cluster, "PostgreSQL runs with {name} = {value}: {risk}");
        } else {
            warn!("PostgreSQL runs with {name} = {value}: {risk}");
        }
    }
}

async fn set_ready(reporter: &HealthReporter, ready: bool) {
    let status = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    reporter.set_service_status(QUEUE_SERVICE, status).await;
    reporter.set_service_status(ADMIN_SERVICE, status).await;
}

/// SERVING only while PostgreSQL answers (migrations ran before this starts)
/// and no drain has begun. With several clusters: while any of them answers
/// (the queues of one that does not answer UNAVAILABLE, the others flow;
/// taking the replica out of a load balancer would not help, since every
/// replica sees the same cluster), and each cluster has its own health
/// service, `leaseq.cluster.NAME`.
async fn health_loop(
    clusters: Clusters,
    reporter: HealthReporter,
    interval: Duration,
    draining: CancellationToken,
    stop: CancellationToken,
) {
    let metrics = clusters.home().metrics().clone();
    let mut last = None;
    let mut last_up: Vec<Option<bool>> = vec![None; clusters.all().len()];
    loop {
        let mut any = false;
        for (i, store) in clusters.all().iter().enumerate() {
            // Bounded: `select 1` within PING_TIMEOUT, on a hot-path connection.
            let ok = store.ping().await.is_ok();
            any |= ok;
            metrics.clusters.set_up(store.cluster_name(), ok);
            if last_up[i] != Some(ok) {
                if !clusters.is_single() {
                    if ok {
                        info!(cluster = %store.cluster_name(), "cluster answers");
                    } else {
                        warn!(cluster = %store.cluster_name(), "cluster unreachable: its queues answer UNAVAILABLE");
                    }
                    let status = if ok {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    reporter
                        .set_service_status(
                            format!("leaseq.cluster.{}", store.cluster_name()),
                            status,
                        )
                        .await;
                }
                last_up[i] = Some(ok);
            }
        }
        let ready = any && !draining.is_cancelled();
        if last != Some(ready) {
            if !any {
                warn!("PostgreSQL unreachable: health NOT_SERVING");
            } else if ready {
                info!("health SERVING");
            }
            set_ready(&reporter, ready).await;
            metrics.serving.set(i64::from(ready));
            last = Some(ready);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = draining.cancelled(), if !draining.is_cancelled() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Connects to every cluster (retrying while they start), migrates each,
/// and with several sets up the placement on home (ids, first map) and
/// checks each database is the cluster its name says.
async fn connect_clusters(
    cfg: &Config,
    databases: &[Database],
    shutdown: &CancellationToken,
) -> anyhow::Result<Clusters> {
    let mut opened = Vec::new();
    let session = session(cfg)?;
    for db in databases {
        let (pool, conns) = connect_with_retry(&db.url, cfg.pool_size, session, shutdown)
            .await
            .with_context(|| format!("cluster {}", db.name))?;
        store::migrate(&pool)
            .await
            .with_context(|| format!("applying migrations on cluster {}", db.name))?;
        warn_if_not_durable(&pool, &db.name, databases.len() > 1).await;
        conns.warm(2).await;
        opened.push((pool, conns));
    }
    let mut opened = opened.into_iter();
    let (pool, conns) = opened.next().expect("one database at least");
    let home = Store::new(pool, conns).named(&databases[0].name);
    if databases.len() == 1 {
        // The home of several clusters given alone would take every queue
        // for its own, and strand the jobs of the others.
        let elsewhere = store::placement::places_elsewhere(home.pool()).await?;
        anyhow::ensure!(
            !elsewhere,
            "this database is the home cluster of a placement over several clusters: give every cluster's --database-url (docs/SCALING.md)"
        );
        return Ok(Clusters::single(home));
    }
    let names: Vec<String> = databases.iter().map(|d| d.name.clone()).collect();
    let ids = crate::placement::setup(home.pool(), &names).await?;
    let mut stores = vec![home.clone()];
    for ((pool, conns), (id, db)) in opened.zip(ids.iter().zip(databases).skip(1)) {
        stores.push(home.sibling(pool, conns, *id, &db.name));
    }
    for (store, db) in stores.iter().zip(databases) {
        crate::placement::check_identity(store.pool(), store.cluster(), &db.name).await?;
    }
    let map = crate::placement::load(home.pool()).await?;
    info!(epoch = map.epoch, clusters = ?names, "placement loaded");
    Ok(Clusters::new(stores, map))
}
