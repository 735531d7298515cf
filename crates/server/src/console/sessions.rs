//! Console sessions kept in PostgreSQL (`leaseq.console_sessions`, on the
//! home cluster), so that every replica over the database accepts a login
//! made on any of them, and a rolling deploy logs nobody out.
//!
//! Why PostgreSQL and not signed cookies: every replica already shares the
//! database, so nothing new has to be distributed (a signing key in every
//! replica's auth file, rotated together); a logout ends the session on
//! every replica at once, where a signed cookie stays valid until it
//! expires. Why not the `tower-sessions` crate: its PostgreSQL store is
//! built on sqlx 0.8, and the broker is on sqlx 0.9 (a second sqlx and a
//! second pool for three statements).
//!
//! The browser holds a random 256-bit session id; the table holds its
//! SHA-256, the SHA-256 of the bearer token it logged in with (what the
//! tokens file holds), the session's CSRF token and its expiry. Each request
//! looks its session up (a primary-key probe) and resolves the token against
//! this replica's own tokens file: a token removed from the file, or given a
//! new secret, ends its sessions there.

use std::time::Duration;

use sqlx::PgPool;

use crate::auth::{generate_token, hash_token};
use crate::error::Result;

/// Most sessions kept at once: beyond it a login drops the sessions closest
/// to their expiry (without `--auth-file` anyone who reaches the console
/// opens one).
pub const MAX_SESSIONS: i64 = 10_000;

/// A session as stored: the token it names and its CSRF token.
pub struct Stored {
    pub token_sha256: Option<String>,
    pub csrf: String,
}

/// Opens a session for the token whose SHA-256 is `token_sha256` (None:
/// anonymous), valid for `ttl`; returns the id for the cookie and the CSRF
/// token. Expired sessions are deleted on the way, and the oldest beyond
/// [`MAX_SESSIONS`].
pub async fn open(
    pool: &PgPool,
    token_sha256: Option<&str>,
    ttl: Duration,
) -> Result<(String, String)> {
    let sid = generate_token();
    let csrf = generate_token();
    let mut tx = pool.begin().await?;
    sqlx::query!("delete from leaseq.console_sessions where expires_at <= now()")
        .execute(&mut *tx)
        .await?;
    sqlx::query!(
        "delete from leaseq.console_sessions where id_sha256 in (
             select id_sha256 from leaseq.console_sessions
             order by expires_at desc offset $1)",
        MAX_SESSIONS - 1,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "insert into leaseq.console_sessions (id_sha256, token_sha256, csrf, expires_at)
         values ($1, $2, $3, now() + $4 * interval '1 millisecond')",
        hash_token(&sid),
        token_sha256,
        csrf,
        ttl.as_millis() as f64,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((sid, csrf))
}

/// The unexpired session whose id is `sid`.
pub async fn find(pool: &PgPool, sid: &str) -> Result<Option<Stored>> {
    // Session ids are 64 hex digits; anything else was never issued.
    if sid.len() != 64 || !sid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let row = sqlx::query!(
        "select token_sha256, csrf from leaseq.console_sessions
         where id_sha256 = $1 and expires_at > now()",
        hash_token(sid),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Stored {
        token_sha256: r.token_sha256,
        csrf: r.csrf,
    }))
}

/// Ends the session whose id is `sid`, on every replica.
pub async fn close(pool: &PgPool, sid: &str) -> Result<()> {
    sqlx::query!(
        "delete from leaseq.console_sessions where id_sha256 = $1",
        hash_token(sid),
    )
    .execute(pool)
    .await?;
    Ok(())
}
