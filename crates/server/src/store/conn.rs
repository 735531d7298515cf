//! The hot path's connections: a fixed set of PostgreSQL connections that
//! the group-commit batchers and lease rounds borrow for one statement (or
//! one transaction) and give back without a round trip.
//!
//! Why not sqlx's `PgPool` here: sqlx 0.9 tests every connection when it
//! goes back to its pool (`PoolConnection::return_to_pool` sends a `Sync`
//! and waits for `ReadyForQuery`, whatever `test_before_acquire` says), from
//! a task spawned on drop. On a path that runs one short statement per
//! borrow, that doubled the round trips to PostgreSQL, added a task hop and
//! kept the connection out of the pool until the reply came back
//! (docs/BENCHMARKS.md, "Where the time goes"). The pool below returns a
//! connection at once, and instead discards any connection whose borrower
//! did not finish cleanly: an error, or a future dropped mid-statement, may
//! leave it in an unknown state, so it is closed and a new one is opened on
//! the next borrow.
//!
//! A connection that sat idle for a second or more is pinged before it is
//! lent out: after a database restart or an operator terminating backends,
//! every idle connection is dead, and a client's statement should not be the
//! one to find out. At load, connections are reused within milliseconds and
//! never pinged.
//!
//! Every wait on PostgreSQL here is bounded, since a connection whose
//! server stopped answering (a partition, a half-open TCP connection, a
//! frozen server or proxy) never fails by itself: opening a connection
//! takes at most the acquire timeout, the ping of an idle one
//! [`PING_TIMEOUT`], and the statements of one borrow (one statement or
//! one transaction, run through [`Conn::bounded`]) the statement bound:
//! PostgreSQL's `statement_timeout` plus [`BOUND_MARGIN`], so that a
//! server that is merely slow cancels the statement itself, with a clear
//! error, before the broker gives up on it. Past a bound the call fails
//! with UNAVAILABLE and the connection is closed (never reused: what it was
//! doing is unknown).
//!
//! The health probe borrows from this set too (`Store::ping`). sqlx's pool
//! is still used for everything else (admin, maintenance, migrations),
//! where its extra round trip costs nothing that matters.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::pgsock::Tuner;

/// A connection idle longer than this is checked with a ping before use.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a ping (`select 1`, or sqlx's ping) may take before its
/// connection counts as dead: the idle check here, the health probe, the
/// LISTEN connection's check and the sqlx pools' check on release.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Added to PostgreSQL's `statement_timeout` for the broker's own bound on
/// a borrow: the server cancels a slow statement first, and the broker
/// stops waiting only for a server that does not answer at all.
pub const BOUND_MARGIN: Duration = Duration::from_secs(1);

/// The error of a wait on PostgreSQL that went past its bound: UNAVAILABLE
/// to clients, like any lost connection.
pub fn no_answer(what: &str, bound: Duration) -> Error {
    Error::Unavailable(Arc::new(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("PostgreSQL did not answer {what} within {bound:?}"),
    ))))
}

/// A fixed-size set of connections. Cheap to clone.
#[derive(Clone)]
pub struct Conns {
    inner: Arc<Inner>,
}

struct Inner {
    opts: PgConnectOptions,
    /// Connections not borrowed right now, with when they were given back;
    /// most recently used last.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    /// One permit per connection that may exist: borrowed, idle, or not
    /// opened yet. Bounds the connections this set holds at `size`.
    permits: Arc<Semaphore>,
    /// How long a borrower waits for a permit before giving up (the
    /// database is stuck or the broker is overloaded: UNAVAILABLE), and
    /// how long opening a connection may take.
    acquire_timeout: Duration,
    /// The bound on one borrow's statements ([`Conn::bounded`]); None: no
    /// bound (no statement timeout was set).
    bound: Option<Duration>,
    /// Sets TCP keepalive on each connection opened (None: a Unix socket).
    tuner: Option<Arc<Tuner>>,
}

impl Inner {
    /// Opens a connection, within the acquire timeout, and sets its TCP
    /// options.
    async fn connect(&self) -> Result<PgConnection> {
        let conn = tokio::time::timeout(self.acquire_timeout, self.opts.connect())
            .await
            .map_err(|_| no_answer("a new connection", self.acquire_timeout))??;
        if let Some(t) = &self.tuner {
            t.tune().await;
        }
        Ok(conn)
    }
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("available", &self.inner.permits.available_permits())
            .finish()
    }
}

impl Conns {
    /// Up to `size` connections, opened on first use; each borrow's
    /// statements bounded by `bound` (None: unbounded); TCP options set by
    /// `tuner` on each connection opened.
    pub fn new(
        opts: PgConnectOptions,
        size: u32,
        acquire_timeout: Duration,
        bound: Option<Duration>,
        tuner: Option<Arc<Tuner>>,
    ) -> Conns {
        Conns {
            inner: Arc::new(Inner {
                opts,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(size.max(1) as usize)),
                acquire_timeout,
                bound,
                tuner,
            }),
        }
    }

    /// The bound on one borrow's statements (None: unbounded).
    pub fn bound(&self) -> Option<Duration> {
        self.inner.bound
    }

    /// How long a borrower waits for a connection.
    pub fn acquire_timeout(&self) -> Duration {
        self.inner.acquire_timeout
    }

    /// A connection outside the set, with its settings and TCP options,
    /// for a statement that must not hold one of the set's (VACUUM).
    pub async fn connect_apart(&self) -> Result<PgConnection> {
        self.inner.connect().await
    }

    /// Opens up to `n` connections now (fewer if the set is smaller or
    /// busy), so the first statements do not pay for connecting. Errors are
    /// ignored: borrowers connect on demand.
    pub async fn warm(&self, n: usize) {
        let mut conns = Vec::new();
        for _ in 0..n {
            let Ok(permit) = self.inner.permits.clone().try_acquire_owned() else {
                break;
            };
            match self.inner.connect().await {
                Ok(c) => conns.push((c, permit)),
                Err(_) => break,
            }
        }
        let mut idle = self.inner.idle.lock().expect("poisoned");
        for (c, _permit) in conns {
            idle.push((c, Instant::now()));
        }
    }

    /// Borrows a connection: an idle one, or a new one while fewer than
    /// `size` exist. Call [`Conn::done`] after the statement succeeded;
    /// a connection dropped without it is closed.
    pub async fn acquire(&self) -> Result<Conn> {
        // One deadline for all of it: the wait for a permit, the pings of
        // idle connections (each of which may be dead), a new connection.
        let timeout = self.inner.acquire_timeout;
        let deadline = Instant::now() + timeout;
        let permit = tokio::time::timeout_at(deadline, self.inner.permits.clone().acquire_owned())
            .await
            .map_err(|_| Error::from(sqlx::Error::PoolTimedOut))?
            .map_err(|_| Error::from(sqlx::Error::PoolClosed))?;
        let conn = tokio::time::timeout_at(deadline, async {
            loop {
                let idle = self.inner.idle.lock().expect("poisoned").pop();
                match idle {
                    // Used a moment ago: it works (the hot path, no round
                    // trip).
                    Some((c, since)) if since.elapsed() < IDLE_CHECK => return Ok(c),
                    // Idle a while: the server may have closed it meanwhile
                    // (restarted, terminated the backend). One round trip
                    // to know, instead of failing a client's statement. A
                    // server that does not answer at all fails it too.
                    Some((mut c, _)) => match tokio::time::timeout(PING_TIMEOUT, c.ping()).await {
                        Ok(Ok(())) => return Ok(c),
                        // Closed (a backend terminated): try the next one.
                        Ok(Err(_)) => {}
                        // No answer at all: the server or the path to it is
                        // gone, and the other idle connections, opened to
                        // it too, most likely with it. Close them all
                        // rather than wait on each in turn; a new
                        // connection costs a few milliseconds if the
                        // server is fine.
                        Err(_) => {
                            let stale =
                                std::mem::take(&mut *self.inner.idle.lock().expect("poisoned"));
                            drop(stale);
                        }
                    },
                    None => return self.inner.connect().await,
                }
            }
        })
        .await
        .map_err(|_| no_answer("a connection", timeout))??;
        Ok(Conn {
            conn: Some(conn),
            inner: self.inner.clone(),
            clean: false,
            _permit: permit,
        })
    }

    /// Closes the idle connections (borrowed ones close when dropped).
    pub async fn close(&self) {
        self.inner.permits.close();
        let idle = std::mem::take(&mut *self.inner.idle.lock().expect("poisoned"));
        for (c, _) in idle {
            let _ = c.close().await;
        }
    }
}

/// A borrowed connection. Goes back to its set on drop if [`Conn::done`]
/// was called, and is closed otherwise.
pub struct Conn {
    conn: Option<PgConnection>,
    inner: Arc<Inner>,
    clean: bool,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    /// The statement (or transaction) finished cleanly: the connection can
    /// be reused as it is.
    pub fn done(mut self) {
        self.clean = true;
    }

    /// Runs a borrow's statements, `f` (one statement's future, or an
    /// `async` block with a transaction), within the set's bound. Past it
    /// the future is dropped and the call fails with UNAVAILABLE; the
    /// connection, not [`Conn::done`], is then closed when dropped.
    pub async fn bounded<'a, T, E, Fut>(
        &'a mut self,
        f: impl FnOnce(&'a mut PgConnection) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T, E>> + 'a,
        Error: From<E>,
    {
        let bound = self.inner.bound;
        let conn = self.conn.as_mut().expect("connection present until drop");
        match bound {
            None => Ok(f(conn).await?),
            Some(bound) => match tokio::time::timeout(bound, f(conn)).await {
                Ok(r) => Ok(r?),
                Err(_) => {
                    tracing::warn!(
                        ?bound,
                        "PostgreSQL did not answer a statement in time: connection discarded"
                    );
                    Err(no_answer("a statement", bound))
                }
            },
        }
    }
}

impl Deref for Conn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("connection present until drop")
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("connection present until drop")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.clean && !self.inner.permits.is_closed() {
            let mut idle = self.inner.idle.lock().expect("poisoned");
            idle.push((conn, Instant::now()));
        }
        // Otherwise the connection is dropped, which closes its socket; the
        // permit returns with `_permit`, so a new one can be opened.
    }
}
