//! The one LISTEN connection of a broker process, and its fan-out.
//!
//! It listens on [`channels::WAKE`] (jobs became available somewhere: wake the
//! local dispatcher for that queue), on this broker's settle channel (jobs
//! leased here were acked / nacked on another replica: give the streams their
//! credit back), and for hand-off across replicas (`dispatch::remote`) on
//! [`channels::OFFERS`] (other replicas' idle streams) and this broker's
//! handed channel (jobs another replica inserted leased to our streams).
//! Notifications sent by this process itself are skipped: it woke its own
//! dispatcher in-process already.
//!
//! If the connection drops, a new one is opened and LISTENs ([`Relisten`]);
//! anything sent meanwhile is lost, so once the new LISTEN is in place (not
//! before: a wake-up sent between the look and the LISTEN would be lost
//! too) every queue is looked at (`wake_all`). A lost settle note keeps a
//! stream's credit until that lease's local deadline, a lost hand-over note
//! leaves its job leased until its lease ends; the dispatcher's slow
//! fallback poll covers the rest.
//!
//! A connection can also go silent without dropping: its server frozen, a
//! network path gone without a FIN. TCP keepalive ends it in about 30 s
//! ([`crate::pgsock`]), but not when something between still answers for
//! the server (a proxy whose upstream is gone), and a silent LISTEN
//! connection hears nothing while looking alive. So every `check` interval
//! the connection is pinged; without an answer within
//! [`PING_TIMEOUT`] it is given up and a new one opened ([`Relisten`]).
//! (The old one is dropped; sqlx sends it an UNLISTEN in a task of its own,
//! which ends when the connection does.)

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::channels::{self, HandedNote, OfferNote};
use crate::dispatch::Dispatcher;
use crate::store::conn::PING_TIMEOUT;
use crate::store::{Session, Store};

/// How to open a LISTEN connection again from scratch: the cluster's
/// connection string and the broker's session settings.
#[derive(Clone, Debug)]
pub struct Relisten {
    pub url: String,
    pub session: Session,
    /// How often the connection is pinged.
    pub check: Duration,
}

impl Relisten {
    /// A new pool of one and its listener, LISTENing; retried with backoff
    /// until it works or `shutdown` (None then).
    async fn open(&self, store: &Store, shutdown: &CancellationToken) -> Option<PgListener> {
        let mut delay = Duration::from_millis(100);
        loop {
            let attempt = async {
                let pool = crate::store::connect_listener_with(&self.url, self.session).await?;
                // Connecting is bounded by the pool's acquire timeout, the
                // LISTEN statement by this.
                let acquire = pool.options().get_acquire_timeout();
                tokio::time::timeout(acquire + PING_TIMEOUT, listen(store, &pool))
                    .await
                    .unwrap_or(Err(sqlx::Error::PoolTimedOut))
            };
            let r = tokio::select! {
                _ = shutdown.cancelled() => return None,
                r = attempt => r,
            };
            match r {
                Ok(l) => return Some(l),
                Err(e) => debug!(error = %e, "LISTEN connection not opened yet; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// Whether the listener's connection answers a ping (a protocol Sync, no
/// statement: `pg_stat_activity` still shows its LISTEN) within
/// [`PING_TIMEOUT`]; notifications that arrive meanwhile are kept for
/// `try_recv`. (A listener whose connection is gone would open one here
/// and LISTEN again unseen; `run` never pings one: `try_recv` said so
/// first and `run` replaced it.)
async fn answers(listener: &mut PgListener) -> bool {
    let ping = async {
        let conn = sqlx::Acquire::acquire(&mut *listener).await?;
        sqlx::Connection::ping(conn).await
    };
    matches!(tokio::time::timeout(PING_TIMEOUT, ping).await, Ok(Ok(())))
}

/// Connects and LISTENs; returns once listening, so the caller knows no
/// notification from now on is missed.
pub async fn listen(store: &Store, own_pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
    // Its own one-connection pool: the listener holds that connection for the
    // life of the process, and must not take one of the working pool's.
    let mut listener = PgListener::connect_with(own_pool).await?;
    // Never reconnect behind our back: sqlx would LISTEN again without a
    // word, and the look at every queue that must follow ([`run`]) would
    // not happen. Losing the connection makes `try_recv` answer None at
    // once, and `run` opens another.
    listener.eager_reconnect(false);
    let settle = channels::settle(store.broker_id());
    let handed = channels::handed(store.broker_id());
    let all = [
        channels::WAKE,
        settle.as_str(),
        channels::OFFERS,
        handed.as_str(),
    ];
    listener.listen_all(all).await?;
    Ok(listener)
}

/// Receives notifications until `shutdown`; checks the connection every
/// `relisten.check` and replaces one that does not answer or was lost.
pub async fn run(
    store: Store,
    mut listener: PgListener,
    relisten: Relisten,
    dispatcher: Dispatcher,
    shutdown: CancellationToken,
) {
    let me = store.broker_id().simple().to_string();
    let handed = channels::handed(store.broker_id());
    let mut check = tokio::time::interval(relisten.check);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.reset();
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = check.tick() => {
                if answers(&mut listener).await {
                    continue;
                }
                warn!("LISTEN connection does not answer; opening another");
                None
            }
            n = listener.try_recv() => match n {
                Ok(Some(n)) => Some(n),
                _ if shutdown.is_cancelled() => return,
                Ok(None) => {
                    warn!("LISTEN connection lost; opening another");
                    None
                }
                Err(e) => {
                    warn!(error = %e, "LISTEN connection failed; opening another");
                    None
                }
            },
        };
        if let Some(n) = next {
            heard(&n, &store, &me, &handed, &dispatcher);
            continue;
        }
        // sqlx's next `try_recv` would reconnect, but nothing would say
        // when its LISTEN is in place: the look at every queue must come
        // after that, or a wake-up sent between the look and the LISTEN is
        // lost until the fallback poll. So a new listener, LISTENing, then
        // the look.
        match relisten.open(&store, &shutdown).await {
            Some(l) => listener = l,
            None => return,
        }
        info!("LISTEN connection re-established");
        dispatcher.wake_all();
        check.reset();
    }
}

/// One notification, to the dispatcher.
fn heard(
    n: &sqlx::postgres::PgNotification,
    store: &Store,
    me: &str,
    handed: &str,
    dispatcher: &Dispatcher,
) {
    if n.channel() == channels::WAKE {
        if let Some(w) = channels::parse_wake(n.payload(), me) {
            trace!(queue = %w.queue, "woken by another replica");
            dispatcher.wake(vec![w]);
        }
    } else if n.channel() == channels::OFFERS {
        match OfferNote::parse(n.payload()) {
            Some(o) if o.broker != store.broker_id() => {
                trace!(broker = %o.broker, stream = o.stream, credit = o.credit, "offer heard");
                dispatcher.offers().heard(o, tokio::time::Instant::now());
            }
            Some(_) => {}
            None => warn!(payload = n.payload(), "unreadable offer notification"),
        }
    } else if n.channel() == handed {
        match HandedNote::parse(n.payload(), store.cluster()) {
            Some(h) => {
                trace!(job = %h.job.id, stream = h.stream, "job handed over");
                dispatcher.remote_handed(h.stream, h.job);
            }
            None => warn!("unreadable hand-over notification"),
        }
    } else {
        let (cancelled, settled): (Vec<_>, Vec<_>) =
            channels::parse_settled(n.payload(), store.cluster())
                .into_iter()
                .partition(|(_, _, cancel)| *cancel);
        debug!(
            jobs = settled.len(),
            cancelled = cancelled.len(),
            "settled on another replica"
        );
        let lease = |(id, token, _)| (id, token);
        dispatcher.settled(settled.into_iter().map(lease).collect());
        dispatcher.cancelled(cancelled.into_iter().map(lease).collect());
    }
}
