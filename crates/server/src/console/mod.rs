//! The web console and `/metrics`, on one HTTP server (axum on hyper 1).
//!
//! `--http-listen ADDR` serves the console (a single page, its assets built
//! into the binary) and `/metrics`; `--metrics-listen ADDR` serves only
//! `/metrics`. The console's JSON API calls the very functions of the
//! AdminService ([`AdminApi`]'s trait methods), so the console and
//! `leaseq admin` can never disagree; it only adds what the browser needs:
//! sessions, permission checks per queue, and JSON.
//!
//! Access (docs/ADMIN.md, "The console"):
//!
//! - With `--auth-file`, the browser logs in with a bearer token. The
//!   session is kept in PostgreSQL ([`sessions`]: the token's SHA-256, never
//!   its secret), so every replica accepts it and a rolling deploy logs
//!   nobody out; the browser holds only a random session id in a cookie
//!   that is `HttpOnly`, `SameSite=Strict`, and `Secure` under TLS. Without
//!   `--auth-file` every visitor gets an anonymous session (and the broker
//!   warns).
//! - A token sees the queues it has any grant on; changing a queue (pause,
//!   settings, requeue, purge) needs the `admin` action on that queue.
//! - Cross-site request forgery: every POST must carry the session's CSRF
//!   token in `X-CSRF-Token` (readable only by same-origin script), be
//!   `Content-Type: application/json` (a cross-site form cannot send that
//!   without a CORS preflight, which is never granted), and come from this
//!   console's own origin when the browser says (`Origin`).
//! - Nothing the broker stores is rendered as HTML: the page builds its DOM
//!   with `textContent` only, and a Content-Security-Policy without inline
//!   script forbids anything else from running.

mod live;
mod serve;
mod sessions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::info;

pub use serve::{bind, serve, tls_acceptor};

use crate::api::admin::AdminApi;
use crate::api::queue::QueueApi;
use crate::auth::{Action, Authenticator, Identity};
use crate::metrics::Metrics;
use crate::pb;
use crate::pb::admin_service_server::AdminService;
use crate::pb::queue_service_server::QueueService;
use crate::store::Store;

/// How long a console session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
pub const SESSION_COOKIE: &str = "leaseq_console";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The page's Content-Security-Policy: its own scripts and styles only, no
/// inline script, no plugins, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON: &[u8] = include_bytes!("assets/favicon.svg");

/// Everything a handler needs.
#[derive(Clone)]
pub struct Console {
    api: Arc<AdminApi>,
    /// The QueueService's own handler, for the test jobs the console
    /// enqueues (the same validation, limits and hand-off as a client's).
    queue: Arc<QueueApi>,
    /// The home cluster: sessions and the deployment's rates live there.
    store: Store,
    auth: Authenticator,
    /// The console is served over TLS (cookies get `Secure`).
    tls: bool,
    /// The live view's one sampler, shared by every browser.
    live: Arc<live::Live>,
    shutdown: CancellationToken,
}

impl Console {
    pub fn new(
        api: Arc<AdminApi>,
        queue: Arc<QueueApi>,
        store: Store,
        auth: Authenticator,
        tls: bool,
        shutdown: CancellationToken,
    ) -> Console {
        Console {
            api,
            queue,
            store,
            auth,
            tls,
            live: Arc::default(),
            shutdown,
        }
    }

    fn metrics(&self) -> &Metrics {
        self.store.metrics()
    }

    /// Per queue, (enqueued, acked) per second over the whole deployment
    /// (empty, and logged, when PostgreSQL does not answer).
    async fn rates(&self) -> HashMap<String, (f64, f64)> {
        match crate::history::rates(&self.store).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "console: reading the queues' rates failed");
                HashMap::new()
            }
        }
    }

    /// The request's session: its identity (as this replica's tokens file
    /// has it now) and CSRF token. Err when PostgreSQL does not answer.
    async fn session(&self, headers: &HeaderMap) -> ApiResult<Option<(Identity, String)>> {
        let Some(sid) = cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let stored = sessions::find(self.store.pool(), sid)
            .await
            .map_err(unavailable)?;
        Ok(stored.and_then(|s| {
            self.auth
                .session_identity(s.token_sha256.as_deref())
                .map(|identity| (identity, s.csrf))
        }))
    }

    /// Opens a session; returns its `Set-Cookie` value and CSRF token.
    async fn open_session(&self, token_sha256: Option<&str>) -> ApiResult<(String, String)> {
        let (sid, csrf) = sessions::open(self.store.pool(), token_sha256, SESSION_TTL)
            .await
            .map_err(unavailable)?;
        let secure = if self.tls { "; Secure" } else { "" };
        let cookie = format!(
            "{SESSION_COOKIE}={sid}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        );
        Ok((cookie, csrf))
    }
}

/// A session store that does not answer: 503, the cause logged.
fn unavailable(e: crate::error::Error) -> ApiError {
    tracing::warn!(error = %e, "console: sessions unavailable");
    ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        "console sessions unavailable: PostgreSQL does not answer".into(),
    )
}

/// A cookie's value from the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// An error as JSON `{"error": ...}` with its HTTP status.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> ApiError {
        let code = match s.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, s.message().to_owned())
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> ApiError {
        tonic::Status::from(e).into()
    }
}

type ApiResult<T = axum::Json<Value>> = Result<T, ApiError>;

fn bad(what: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, what.into())
}

fn forbidden(what: impl Into<String>) -> ApiError {
    ApiError(StatusCode::FORBIDDEN, what.into())
}

/// The caller of an API request, checked by [`guard`].
#[derive(Clone)]
struct Caller(Identity);

impl Caller {
    fn can_read(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => [Action::Enqueue, Action::Consume, Action::Admin]
                .into_iter()
                .any(|a| p.allows(a, queue)),
        }
    }

    /// A test job from the console: `enqueue` or `admin` on the queue (an
    /// operator who may requeue dead letters may also send one job).
    fn can_enqueue(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => {
                p.allows(Action::Enqueue, queue) || p.allows(Action::Admin, queue)
            }
        }
    }

    fn can_admin(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => p.allows(Action::Admin, queue),
        }
    }

    fn read(&self, queue: &str) -> ApiResult<()> {
        if self.can_read(queue) {
            Ok(())
        } else {
            // Not 403: a queue the token may not see is a queue it does not know.
            Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("queue {queue:?} does not exist"),
            ))
        }
    }

    fn admin(&self, queue: &str) -> ApiResult<()> {
        self.read(queue)?;
        if self.can_admin(queue) {
            Ok(())
        } else {
            let name = self.0.name().unwrap_or("anonymous");
            info!(token = name, queue, "console: permission denied");
            Err(forbidden(format!(
                "permission denied: token {name:?} lacks \"admin\" on queue {queue:?}"
            )))
        }
    }
}

/// The router of `--http-listen`: the console, its API and `/metrics`.
pub fn router(console: Console) -> Router {
    let api = Router::new()
        .route("/queues", get(list_queues))
        .route("/events", get(events))
        .route("/queues/{name}", get(get_queue))
        .route("/queues/{name}/pause", post(pause_queue))
        .route("/queues/{name}/resume", post(resume_queue))
        .route("/queues/{name}/settings", post(update_queue))
        .route("/dead", get(list_dead))
        .route("/dead/requeue", post(requeue_dead))
        .route("/dead/purge", post(purge_dead))
        .route("/jobs", get(list_jobs))
        .route("/jobs/{id}", get(get_job))
        .route("/jobs/{id}/cancel", post(cancel_job))
        .route("/queues/{name}/purge", post(purge_queue))
        .route("/queues/{name}/enqueue", post(enqueue_job))
        .route_layer(middleware::from_fn_with_state(console.clone(), guard))
        .route("/session", get(session))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such API".into()) });
    Router::new()
        .route(
            "/",
            get(|| async { page(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/assets/app.js",
            get(|| async { page(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/assets/app.css",
            get(|| async { page(APP_CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/favicon.svg",
            get(|| async { ([(header::CONTENT_TYPE, "image/svg+xml")], FAVICON) }),
        )
        .route("/metrics", get(metrics))
        .nest("/api", api)
        .layer(middleware::from_fn_with_state(console.clone(), protect))
        .with_state(console)
}

/// The router of `--metrics-listen`: `/metrics` only.
pub fn metrics_router(store: Store) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let store = store.clone();
            async move { metrics_response(store.metrics()) }
        }),
    )
}

fn page(body: &'static str, ctype: &'static str) -> Response {
    ([(header::CONTENT_TYPE, ctype)], body).into_response()
}

fn metrics_response(m: &Metrics) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        m.render(),
    )
        .into_response()
}

async fn metrics(State(c): State<Console>) -> Response {
    metrics_response(c.metrics())
}

/// Same-origin and CSRF checks for every POST; security headers on every
/// response.
async fn protect(State(c): State<Console>, req: Request, next: Next) -> Response {
    if req.method() != Method::GET
        && req.method() != Method::HEAD
        && let Err(e) = check_post(&c, req.headers())
    {
        return e.into_response();
    }
    let api = req.uri().path().starts_with("/api/");
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    if api {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if c.tls {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    resp
}

/// A state-changing request must be JSON, from this origin, and (but for
/// login) carry the session's CSRF token.
fn check_post(c: &Console, headers: &HeaderMap) -> ApiResult<()> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| forbidden("request refused: no Host header"))?;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let scheme = if c.tls { "https" } else { "http" };
        let ok = origin
            .to_str()
            .is_ok_and(|o| o == format!("{scheme}://{host}"));
        if !ok {
            info!(origin = ?origin, host, "console: cross-origin request refused");
            return Err(forbidden(
                "request refused: Origin is not this console (cross-site request)",
            ));
        }
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.to_str(), Ok("same-origin" | "none"))
    {
        return Err(forbidden("request refused: cross-site request"));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next() == Some("application/json"));
    if !json {
        return Err(ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "request refused: Content-Type must be application/json".into(),
        ));
    }
    Ok(())
}

/// Requires a session for the API (and its CSRF token on POSTs); attaches
/// the [`Caller`].
async fn guard(State(c): State<Console>, mut req: Request, next: Next) -> Response {
    let (identity, csrf) = match c.session(req.headers()).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return ApiError(
                StatusCode::UNAUTHORIZED,
                "not logged in (or the session expired)".into(),
            )
            .into_response();
        }
        Err(e) => return e.into_response(),
    };
    if req.method() == Method::POST {
        let sent = req
            .headers()
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let same: bool = subtle::ConstantTimeEq::ct_eq(sent.as_bytes(), csrf.as_bytes()).into();
        if !same {
            info!("console: request without a valid CSRF token refused");
            return forbidden("request refused: missing or wrong X-CSRF-Token").into_response();
        }
    }
    req.extensions_mut().insert(Caller(identity));
    next.run(req).await
}

fn identity_json(identity: &Identity, auth: bool, csrf: &str) -> Value {
    let (name, admin_everywhere, admin_somewhere) = match identity {
        Identity::Anonymous => (Value::Null, true, true),
        Identity::Token(p) => (
            json!(p.name),
            p.allows_everywhere(Action::Admin),
            p.allows_somewhere(Action::Admin),
        ),
    };
    json!({
        "auth": auth,
        "name": name,
        "admin": admin_somewhere,
        "admin_everywhere": admin_everywhere,
        "csrf": csrf,
        "version": env!("CARGO_PKG_VERSION"),
    })
}

/// The current session; without `--auth-file` one is opened on the spot.
async fn session(State(c): State<Console>, headers: HeaderMap) -> Response {
    let auth = c.auth.is_enabled();
    match c.session(&headers).await {
        Ok(Some((identity, csrf))) => {
            return axum::Json(identity_json(&identity, auth, &csrf)).into_response();
        }
        Ok(None) => {}
        Err(e) => return e.into_response(),
    }
    if auth {
        return ApiError(StatusCode::UNAUTHORIZED, "not logged in".into()).into_response();
    }
    match c.open_session(None).await {
        Ok((cookie, csrf)) => (
            [(header::SET_COOKIE, cookie)],
            axum::Json(identity_json(&Identity::Anonymous, false, &csrf)),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `{"token": "..."}`: checks it as the gRPC port would and opens a session.
async fn login(State(c): State<Console>, body: axum::Json<Value>) -> Response {
    let token = body.get("token").and_then(Value::as_str).unwrap_or("");
    let Some((identity, digest)) = c.auth.login(token.trim()) else {
        info!("console: login with an invalid token refused");
        return ApiError(StatusCode::UNAUTHORIZED, "invalid token".into()).into_response();
    };
    info!(
        token = identity.name().unwrap_or("anonymous"),
        "console: login"
    );
    match c.open_session(digest.as_deref()).await {
        Ok((cookie, csrf)) => (
            [(header::SET_COOKIE, cookie)],
            axum::Json(identity_json(&identity, c.auth.is_enabled(), &csrf)),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// Ends the session on every replica.
async fn logout(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Some(sid) = cookie(&headers, SESSION_COOKIE)
        && let Err(e) = sessions::close(c.store.pool(), sid).await
    {
        return unavailable(e).into_response();
    }
    let secure = if c.tls { "; Secure" } else { "" };
    (
        [(
            header::SET_COOKIE,
            format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
        )],
        axum::Json(json!({})),
    )
        .into_response()
}

// ---- JSON renditions of the AdminService's messages ----

fn secs(d: &Option<prost_types::Duration>) -> Value {
    match d {
        Some(d) => json!(d.seconds as f64 + f64::from(d.nanos) / 1e9),
        None => Value::Null,
    }
}

fn millis(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => json!(t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
        None => Value::Null,
    }
}

fn queue_json(q: &pb::QueueInfo, rates: Option<&(f64, f64)>, caller: &Caller) -> Value {
    let s = q.settings.unwrap_or_default();
    let st = q.stats.unwrap_or_default();
    json!({
        "name": q.name,
        "created_at": millis(&q.created_at),
        "can_admin": caller.can_admin(&q.name),
        "can_enqueue": caller.can_enqueue(&q.name),
        "stats": {
            "available": st.available,
            "scheduled": st.scheduled,
            "leased": st.leased,
            "dead": st.dead,
            "oldest_available_age": secs(&st.oldest_available_age),
            "streams": st.streams,
            "consumers": st.consumers,
            // No row: no traffic on any replica over its last intervals.
            "enqueue_rate": rates.map_or(0.0, |r| r.0),
            "ack_rate": rates.map_or(0.0, |r| r.1),
        },
        "settings": {
            "paused": s.paused,
            "default_lease": secs(&s.default_lease),
            "max_attempts": s.max_attempts,
            "backoff_base": secs(&s.backoff_base),
            "backoff_cap": secs(&s.backoff_cap),
            "completed_retention": secs(&s.completed_retention),
            "concurrency_limit": s.concurrency_limit,
            "rate_limit": s.rate_limit,
            "rate_burst": s.rate_burst,
        },
    })
}

fn job_state(state: i32) -> &'static str {
    match pb::JobState::try_from(state) {
        Ok(pb::JobState::Available) => "available",
        Ok(pb::JobState::Scheduled) => "scheduled",
        Ok(pb::JobState::Leased) => "leased",
        Ok(pb::JobState::Dead) => "dead",
        Ok(pb::JobState::Completed) => "completed",
        _ => "unknown",
    }
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn job_json(j: &pb::JobInfo, with_payload: bool) -> Value {
    let mut headers: Vec<(&String, &String)> = j.headers.iter().collect();
    headers.sort();
    json!({
        "id": j.id,
        "queue": j.queue,
        "state": job_state(j.state),
        "payload_b64": with_payload.then(|| b64(&j.payload)),
        "payload_bytes": j.payload.len(),
        "headers": headers.into_iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "priority": j.priority,
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "dedup_key": j.dedup_key,
        "enqueued_at": millis(&j.enqueued_at),
        "run_at": millis(&j.run_at),
        "expires_at": millis(&j.expires_at),
        "last_error": j.last_error,
        "leased_by": j.leased_by,
        "lease_expires_at": millis(&j.lease_expires_at),
        "dead_reason": j.dead_reason,
        "died_at": millis(&j.died_at),
        "completed_at": millis(&j.completed_at),
        "completed_by": j.completed_by,
    })
}

fn queues_json(
    caller: &Caller,
    queues: &[pb::QueueInfo],
    rates: &HashMap<String, (f64, f64)>,
) -> Vec<Value> {
    queues
        .iter()
        .filter(|q| caller.can_read(&q.name))
        .map(|q| queue_json(q, rates.get(&q.name), caller))
        .collect()
}

// ---- handlers: each calls the AdminService's own method ----

async fn list_queues(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let mut all = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut page_token = String::new();
    // Every page, bounded: 20 pages of 1,000 queues.
    for _ in 0..20 {
        let r = c
            .api
            .list_queues(tonic::Request::new(pb::ListQueuesRequest {
                page_size: 1000,
                page_token,
            }))
            .await?
            .into_inner();
        all.extend(r.queues);
        for m in r.unavailable_clusters {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    let rates = c.rates().await;
    Ok(axum::Json(
        json!({ "queues": queues_json(&caller, &all, &rates), "unavailable_clusters": missing }),
    ))
}

/// Server-sent events: `queues` events from the broker's one live sampler
/// ([`live`]: a snapshot when counts change, at most once a second, and at
/// least every 5 s), each filtered by this browser's grants.
async fn events(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult<Response> {
    let mut snapshots = c.live.subscribe(&c);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(2);
    let shutdown = c.shutdown.clone();
    tokio::spawn(async move {
        // The current snapshot first (a browser arriving sees the queues at
        // once), then each new one.
        snapshots.mark_changed();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                changed = snapshots.changed() => if changed.is_err() { return },
            }
            let snapshot = snapshots.borrow_and_update().clone();
            let event = match snapshot {
                live::Snapshot::Pending => continue,
                live::Snapshot::Queues(s) => Event::default().event("queues").data(
                    json!({
                        "queues": queues_json(&caller, &s.watch.queues, &s.rates),
                        "sent_at": millis(&s.watch.sent_at),
                        "unavailable_clusters": s.watch.unavailable_clusters,
                    })
                    .to_string(),
                ),
                live::Snapshot::Failed(why) => {
                    let _ = tx
                        .send(Ok(Event::default()
                            .event("error")
                            .data(json!({ "error": why }).to_string())))
                        .await;
                    return;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

async fn queue_info(c: &Console, caller: &Caller, name: &str) -> ApiResult<pb::QueueInfo> {
    caller.read(name)?;
    Ok(c.api
        .get_queue(tonic::Request::new(pb::GetQueueRequest {
            queue: name.to_owned(),
        }))
        .await?
        .into_inner())
}

/// Per consumer name, the jobs of `queue` it holds (every replica, every
/// cluster that answers: the names of those that did not come along).
async fn in_flight(
    c: &Console,
    queue: &str,
) -> ApiResult<crate::fanout::Partial<Vec<(String, i64)>>> {
    let name = crate::domain::QueueName::parse_field(queue, "queue")?;
    Ok(crate::fanout::in_flight(c.api.clusters(), &name).await?)
}

async fn get_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let q = queue_info(&c, &caller, &name).await?;
    let rates = c.rates().await;
    let held = in_flight(&c, &name).await?;
    let unavailable_clusters = held.missing;
    let held = held.value;
    let streams = c.metrics().streams.on_queue(&name);
    // One row per consumer name: this broker's streams and credit, and the
    // jobs it holds on any replica.
    let mut consumers: Vec<Value> = Vec::new();
    let mut names: Vec<&str> = streams.iter().map(|s| s.consumer.as_str()).collect();
    names.extend(held.iter().map(|(n, _)| n.as_str()));
    names.sort_unstable();
    names.dedup();
    for n in names {
        let mine: Vec<_> = streams.iter().filter(|s| s.consumer == n).collect();
        consumers.push(json!({
            "consumer": n,
            "streams": mine.len(),
            "credit": mine.iter().map(|s| u64::from(s.credit)).sum::<u64>(),
            "in_flight": held.iter().find(|(h, _)| h == n).map_or(0, |(_, k)| *k),
            "connected_for": mine.iter().map(|s| s.opened.elapsed().as_secs()).max(),
        }));
    }
    // The deployment's history, from the database (empty, and logged, when
    // it does not answer: the rest of the page still shows).
    let points = crate::history::series(&c.store, &name)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "console: reading the queue's history failed");
            Vec::new()
        });
    let history: Vec<Value> = points
        .iter()
        .map(|p| {
            json!([
                p.at_ms,
                p.depth[0],
                p.depth[1],
                p.depth[2],
                p.depth[3],
                p.enqueue_rate,
                p.ack_rate
            ])
        })
        .collect();
    Ok(axum::Json(json!({
        "queue": queue_json(&q, rates.get(&name), &caller),
        "consumers": consumers,
        "history": history,
        "history_columns": ["at_ms", "available", "scheduled", "leased", "dead", "enqueue_rate", "ack_rate"],
        "unavailable_clusters": unavailable_clusters,
    })))
}

async fn pause_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    caller.admin(&name)?;
    let q = c
        .api
        .pause_queue(tonic::Request::new(pb::PauseQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

async fn resume_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    caller.admin(&name)?;
    let q = c
        .api
        .resume_queue(tonic::Request::new(pb::ResumeQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

fn duration(v: &Value, field: &str) -> ApiResult<Option<prost_types::Duration>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let s = x
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e10)
                .ok_or_else(|| bad(format!("{field}: must be a number of seconds")))?;
            Ok(Some(prost_types::Duration {
                seconds: s.trunc() as i64,
                nanos: (s.fract() * 1e9).round() as i32,
            }))
        }
    }
}

fn int(v: &Value, field: &str) -> ApiResult<Option<i32>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(format!("{field}: must be an integer"))),
    }
}

/// Settings in seconds and plain numbers (0 clears a limit or the
/// retention), validated by UpdateQueue itself.
async fn update_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.admin(&name)?;
    let rate_limit = match v.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .ok_or_else(|| bad("rate_limit: must be a number"))?,
        ),
    };
    let req = pb::UpdateQueueRequest {
        queue: name,
        default_lease: duration(&v, "default_lease")?,
        max_attempts: int(&v, "max_attempts")?,
        backoff_base: duration(&v, "backoff_base")?,
        backoff_cap: duration(&v, "backoff_cap")?,
        completed_retention: duration(&v, "completed_retention")?,
        paused: v.get("paused").and_then(Value::as_bool),
        create: false,
        concurrency_limit: int(&v, "concurrency_limit")?,
        rate_limit,
        rate_burst: int(&v, "rate_burst")?,
    };
    let q = c
        .api
        .update_queue(tonic::Request::new(req))
        .await?
        .into_inner();
    Ok(axum::Json(queue_json(&q, None, &caller)))
}

async fn list_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let queue = q.get("queue").cloned().unwrap_or_default();
    if queue.is_empty() {
        if let Identity::Token(p) = &caller.0
            && !p.allows_everywhere(Action::Admin)
            && ![Action::Enqueue, Action::Consume]
                .into_iter()
                .any(|a| p.allows_everywhere(a))
        {
            return Err(bad("queue: choose a queue"));
        }
    } else {
        caller.read(&queue)?;
    }
    let r = c
        .api
        .list_dead_letters(tonic::Request::new(pb::ListDeadLettersRequest {
            queue,
            page_size: 100,
            page_token: q.get("page_token").cloned().unwrap_or_default(),
            include_payload: false,
        }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "jobs": r.jobs.iter().map(|j| job_json(j, false)).collect::<Vec<_>>(),
        "next_page_token": r.next_page_token,
    })))
}

/// `{"queue": q, "ids": [...]}` or `{"queue": q, "all": true}`.
fn selector(v: &Value) -> ApiResult<pb::DeadLettersSelector> {
    let queue = v.get("queue").and_then(Value::as_str).unwrap_or("");
    if queue.is_empty() {
        return Err(bad("queue: is required"));
    }
    let ids = match v.get("ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("ids: must be strings"))?,
        Some(_) => return Err(bad("ids: must be an array")),
    };
    Ok(pb::DeadLettersSelector {
        queue: queue.to_owned(),
        ids,
        all: v.get("all").and_then(Value::as_bool).unwrap_or(false),
    })
}

async fn requeue_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    let sel = selector(&v)?;
    caller.admin(&sel.queue)?;
    let r = c
        .api
        .requeue_dead_letters(tonic::Request::new(sel))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "requeued": r.requeued,
        "skipped_duplicates": r.skipped_duplicates,
    })))
}

async fn purge_dead(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    let sel = selector(&v)?;
    caller.admin(&sel.queue)?;
    if v.get("confirm").and_then(Value::as_bool) != Some(true) {
        return Err(bad(
            "confirm: a purge must be confirmed (\"confirm\": true)",
        ));
    }
    let r = c
        .api
        .purge_dead_letters(tonic::Request::new(sel))
        .await?
        .into_inner();
    Ok(axum::Json(json!({ "purged": r.purged })))
}

/// Most attempt errors shown for one job (the latest).
const MAX_ATTEMPTS_SHOWN: i64 = 100;

/// A job, with the error of each failed attempt.
async fn get_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let j = c
        .api
        .get_job(tonic::Request::new(pb::GetJobRequest {
            job_id: id.clone(),
        }))
        .await?
        .into_inner();
    if !caller.can_read(&j.queue) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("job {id} does not exist"),
        ));
    }
    let job_id = crate::domain::JobId::parse_field(&id, "job_id")?;
    let mut attempts: Vec<Value> = crate::fanout::attempt_errors(
        c.api.clusters(),
        job_id,
        MAX_ATTEMPTS_SHOWN,
    )
    .await?
    .into_iter()
    .map(|e| json!({ "attempt": e.attempt, "at": e.at.timestamp_millis(), "error": e.error }))
    .collect();
    // A dead letter's last attempt is the dead letter itself.
    if job_state(j.state) == "dead" {
        attempts.push(json!({
            "attempt": j.attempt,
            "at": millis(&j.died_at),
            "error": j.last_error,
        }));
    }
    let mut v = job_json(&j, true);
    v["attempts"] = json!(attempts);
    v["can_admin"] = json!(caller.can_admin(&j.queue));
    Ok(axum::Json(v))
}

/// Jobs by state (`available`, `scheduled`, `leased`, `dead`, `completed`;
/// none = every live job), of one queue or every queue the token may read,
/// matching `search` (an id, or text in the dedup key, last error or
/// payload), 50 a page after `after` (the last id of the previous page).
async fn list_jobs(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    use crate::store::admin::JobState;
    let queue = match q.get("queue").map(String::as_str).unwrap_or("") {
        "" => {
            if let Identity::Token(p) = &caller.0
                && ![Action::Enqueue, Action::Consume, Action::Admin]
                    .into_iter()
                    .any(|a| p.allows_everywhere(a))
            {
                return Err(bad("queue: choose a queue"));
            }
            None
        }
        name => {
            caller.read(name)?;
            Some(crate::domain::QueueName::parse_field(name, "queue")?)
        }
    };
    let state = match q.get("state").map(String::as_str).unwrap_or("") {
        "" | "live" => None,
        "available" => Some(JobState::Available),
        "scheduled" => Some(JobState::Scheduled),
        "leased" => Some(JobState::Leased),
        "dead" => Some(JobState::Dead),
        "completed" => Some(JobState::Completed),
        other => {
            return Err(bad(format!(
                "state: {other:?} is not one of live, available, scheduled, leased, dead, completed"
            )));
        }
    };
    let search = q.get("search").map(|s| s.trim()).filter(|s| !s.is_empty());
    if search.is_some_and(|s| s.len() > 256) {
        return Err(bad("search: at most 256 bytes"));
    }
    let after = match q.get("after").map(String::as_str).unwrap_or("") {
        "" => None,
        id => Some(crate::domain::JobId::parse_field(id, "after")?.0),
    };
    const PAGE: i64 = 50;
    let found = crate::fanout::list_jobs(
        c.api.clusters(),
        queue.as_ref(),
        state,
        after,
        PAGE,
        false,
        search,
    )
    .await?;
    let (rows, more) = found.value;
    let jobs: Vec<pb::JobInfo> = rows.into_iter().map(crate::api::admin::job_info).collect();
    let next = if more {
        jobs.last().map(|j| j.id.clone())
    } else {
        None
    };
    Ok(axum::Json(json!({
        "jobs": jobs
            .iter()
            .filter(|j| caller.can_read(&j.queue))
            .map(|j| job_json(j, false))
            .collect::<Vec<_>>(),
        "next": next,
        "unavailable_clusters": found.missing,
    })))
}

/// Cancels a live job (deleted; a leased one's stream gets its credit
/// back): `admin` on its queue.
async fn cancel_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let j = c
        .api
        .get_job(tonic::Request::new(pb::GetJobRequest {
            job_id: id.clone(),
        }))
        .await?
        .into_inner();
    if !caller.can_read(&j.queue) {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("job {id} does not exist"),
        ));
    }
    caller.admin(&j.queue)?;
    let r = c
        .api
        .cancel_job(tonic::Request::new(pb::CancelJobRequest { job_id: id }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({ "was_leased": r.was_leased })))
}

/// Deletes the queue's waiting jobs (and its completed records): `admin`
/// on the queue, and `{"confirm": "<the queue's name>"}`.
async fn purge_queue(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.admin(&name)?;
    if v.get("confirm").and_then(Value::as_str) != Some(name.as_str()) {
        return Err(bad(
            "confirm: a purge must be confirmed with the queue's name (\"confirm\": \"<queue>\")",
        ));
    }
    let r = c
        .api
        .purge_queue(tonic::Request::new(pb::PurgeQueueRequest { queue: name }))
        .await?
        .into_inner();
    Ok(axum::Json(json!({
        "purged": r.purged,
        "purged_completed": r.purged_completed,
    })))
}

/// Enqueues a test job: `{"payload": text, "headers": {k: v}, "priority":
/// n, "delay": seconds, "dedup_key": text}` (all optional), through the
/// QueueService's own Enqueue (its validation and limits): the `enqueue` or
/// the `admin` action on the queue.
async fn enqueue_job(
    State(c): State<Console>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    axum::Json(v): axum::Json<Value>,
) -> ApiResult {
    caller.read(&name)?;
    if !caller.can_enqueue(&name) {
        let who = caller.0.name().unwrap_or("anonymous");
        return Err(forbidden(format!(
            "permission denied: token {who:?} lacks \"enqueue\" and \"admin\" on queue {name:?}"
        )));
    }
    let payload = match v.get("payload") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("payload: must be text")),
    };
    let headers = match v.get("headers") {
        None | Some(Value::Null) => HashMap::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect::<Option<HashMap<_, _>>>()
            .ok_or_else(|| bad("headers: values must be text"))?,
        Some(_) => return Err(bad("headers: must be an object of text values")),
    };
    let dedup_key = match v.get("dedup_key") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("dedup_key: must be text")),
    };
    let mut req = tonic::Request::new(pb::EnqueueRequest {
        queue: name,
        payload: payload.into_bytes(),
        headers,
        priority: int(&v, "priority")?.unwrap_or(0),
        delay: duration(&v, "delay")?,
        dedup_key,
        ..Default::default()
    });
    // Checked above (enqueue or admin); the handler's own check would
    // refuse an admin-only token.
    req.extensions_mut().insert(Identity::Anonymous);
    let r = c.queue.enqueue(req).await?.into_inner();
    info!(
        token = caller.0.name().unwrap_or("anonymous"),
        job_id = %r.job_id,
        "console: test job enqueued"
    );
    Ok(axum::Json(
        json!({ "job_id": r.job_id, "duplicate": r.duplicate }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"<script>"), "PHNjcmlwdD4=");
        assert_eq!(b64(&[0xff, 0x00, 0x80]), "/wCA");
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, "a=1; leaseq_console=abc".parse().unwrap());
        h.append(header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
