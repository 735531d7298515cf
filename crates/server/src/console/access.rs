//! Who may use the console, and how it knows: the session cookie and its
//! lookup ([`sessions`] keeps them in PostgreSQL), login and logout, the
//! same-origin and CSRF checks of every POST, the security headers of every
//! response, and each request's [`Caller`] with its per-queue grants.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tracing::info;

use super::json::{ApiError, ApiResult, forbidden};
use super::{CSP, CSRF_HEADER, Console, SESSION_COOKIE, SESSION_TTL, sessions};
use crate::auth::{Action, Identity};

impl Console {
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

/// The caller of an API request, checked by [`guard`].
#[derive(Clone)]
pub(super) struct Caller(pub(super) Identity);

impl Caller {
    pub(super) fn can_read(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => [Action::Enqueue, Action::Consume, Action::Admin]
                .into_iter()
                .any(|a| p.allows(a, queue)),
        }
    }

    /// A test job from the console: `enqueue` or `admin` on the queue (an
    /// operator who may requeue dead letters may also send one job).
    pub(super) fn can_enqueue(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => {
                p.allows(Action::Enqueue, queue) || p.allows(Action::Admin, queue)
            }
        }
    }

    pub(super) fn can_admin(&self, queue: &str) -> bool {
        match &self.0 {
            Identity::Anonymous => true,
            Identity::Token(p) => p.allows(Action::Admin, queue),
        }
    }

    pub(super) fn read(&self, queue: &str) -> ApiResult<()> {
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

    pub(super) fn admin(&self, queue: &str) -> ApiResult<()> {
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

/// Same-origin and CSRF checks for every POST; security headers on every
/// response.
pub(super) async fn protect(State(c): State<Console>, req: Request, next: Next) -> Response {
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
pub(super) async fn guard(State(c): State<Console>, mut req: Request, next: Next) -> Response {
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
pub(super) async fn session(State(c): State<Console>, headers: HeaderMap) -> Response {
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
pub(super) async fn login(State(c): State<Console>, body: axum::Json<Value>) -> Response {
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
pub(super) async fn logout(State(c): State<Console>, headers: HeaderMap) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

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
