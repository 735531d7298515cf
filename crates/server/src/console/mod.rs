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
//!   settings, requeue, purge) needs the `admin` action on that queue. A
//!   schedule is seen with the queue its jobs go to, and changed (pause,
//!   resume, run now, delete) with `admin` on that queue.
//! - Cross-site request forgery: every POST must carry the session's CSRF
//!   token in `X-CSRF-Token` (readable only by same-origin script), be
//!   `Content-Type: application/json` (a cross-site form cannot send that
//!   without a CORS preflight, which is never granted), and come from this
//!   console's own origin when the browser says (`Origin`).
//! - Nothing the broker stores is rendered as HTML: the page builds its DOM
//!   with `textContent` only, and a Content-Security-Policy without inline
//!   script forbids anything else from running.

//!
//! The files: this one holds [`Console`] and the routes; `access` the
//! sessions' cookies, login and logout, the same-origin and CSRF checks and
//! per-queue grants; `json` the API's errors and the JSON renditions of the
//! AdminService's messages; `handlers` the API's handlers, each calling the
//! AdminService's own method; `live` the live view's one sampler;
//! `sessions` the sessions' table; `serve` the listeners (TCP or TLS).

mod access;
mod handlers;
mod json;
mod live;
mod serve;
mod sessions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

pub use serve::{bind, serve, tls_acceptor};

use crate::api::admin::AdminApi;
use crate::api::queue::QueueApi;
use crate::auth::Authenticator;
use crate::metrics::Metrics;
use crate::store::Store;
use access::{guard, login, logout, protect, session};
use handlers::{
    cancel_job, enqueue_job, events, get_job, get_queue, list_dead, list_jobs, list_keys,
    list_queues, pause_queue, purge_dead, purge_queue, requeue_dead, resume_queue, update_queue,
};
use handlers::{delete_schedule, list_schedules, pause_schedule, resume_schedule, run_schedule};
use json::ApiError;

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

    pub(super) fn metrics(&self) -> &Metrics {
        self.store.metrics()
    }

    /// Per queue, (enqueued, acked) per second over the whole deployment
    /// (empty, and logged, when PostgreSQL does not answer).
    pub(super) async fn rates(&self) -> HashMap<String, (f64, f64)> {
        match crate::history::rates(&self.store).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "console: reading the queues' rates failed");
                HashMap::new()
            }
        }
    }
}

/// The router of `--http-listen`: the console, its API and `/metrics`.
pub fn router(console: Console) -> Router {
    let api = Router::new()
        .route("/queues", get(list_queues))
        .route("/events", get(events))
        .route("/queues/{name}", get(get_queue))
        .route("/queues/{name}/keys", get(list_keys))
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
        .route("/schedules", get(list_schedules))
        .route("/schedules/{name}/pause", post(pause_schedule))
        .route("/schedules/{name}/resume", post(resume_schedule))
        .route("/schedules/{name}/run", post(run_schedule))
        .route("/schedules/{name}/delete", post(delete_schedule))
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
