//! What one client connection may hold (`--max-connections` and the
//! per-connection budgets, docs/SECURITY.md "Limits").
//!
//! [`Admission`] wraps the listener: each accepted TCP connection takes one
//! of `--max-connections` slots for as long as it is open, and carries a
//! [`Conn`], its budgets, which tonic puts into every request's extensions
//! ([`ConnInfo`]). Handlers and [`crate::request_limit`] charge it:
//!
//! - the bytes of request messages under way on the connection (being
//!   received, decoded, handled, or, for a Consume stream's settles, until
//!   their results are sent): `--max-request-bytes-per-connection`;
//! - its Subscribe and Consume streams, `--max-subscriptions-per-connection`,
//!   and their credit, the deliveries the dispatcher may push to them before
//!   they are settled: `--max-in-flight-per-connection`.
//!
//! A connection past `--max-connections` is not dropped at once: it is
//! served just long enough ([`REFUSED_LIFETIME`]) for its calls to be
//! answered RESOURCE_EXHAUSTED naming the limit (health checks are answered
//! as usual), then closed. A gRPC client shows its user that status, where a
//! connection reset would read as the broker being down. At most
//! [`MAX_REFUSING`] such connections are served at once; beyond that a new
//! connection is closed as it is accepted.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures_core::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpIncoming};
use tracing::warn;

use crate::error::{Error, Result};

/// How long a connection over `--max-connections` is served (its calls
/// answered RESOURCE_EXHAUSTED) before it is closed.
pub const REFUSED_LIFETIME: Duration = Duration::from_secs(2);
/// Connections over `--max-connections` served at once to be refused.
pub const MAX_REFUSING: usize = 16;

/// The caps [`Conn`] enforces (from [`crate::config::SecurityConfig`]).
#[derive(Clone, Copy, Debug)]
pub struct ConnCaps {
    pub max_connections: usize,
    pub max_request_bytes: usize,
    pub max_subscriptions: usize,
    pub max_in_flight: u64,
}

impl ConnCaps {
    pub fn of(s: &crate::config::SecurityConfig) -> ConnCaps {
        ConnCaps {
            max_connections: s.max_connections,
            max_request_bytes: s.max_request_bytes_per_connection,
            max_subscriptions: s.max_subscriptions_per_connection,
            max_in_flight: s.max_in_flight_per_connection.into(),
        }
    }
}

/// One connection's budgets.
#[derive(Debug)]
pub struct Conn {
    /// Some(cap) when the connection is over `--max-connections`: every
    /// call but health checks is refused.
    refused: Option<usize>,
    requests: Budget,
    subscriptions: Budget,
    credit: Budget,
}

impl Conn {
    pub fn new(caps: &ConnCaps) -> Arc<Conn> {
        Arc::new(Conn {
            refused: None,
            requests: Budget::new(caps.max_request_bytes as u64),
            subscriptions: Budget::new(caps.max_subscriptions as u64),
            credit: Budget::new(caps.max_in_flight),
        })
    }

    fn refused(max_connections: usize) -> Arc<Conn> {
        Arc::new(Conn {
            refused: Some(max_connections),
            requests: Budget::new(0),
            subscriptions: Budget::new(0),
            credit: Budget::new(0),
        })
    }

    /// RESOURCE_EXHAUSTED naming `--max-connections`, if this connection is
    /// over it.
    pub fn check_admitted(&self) -> Result<()> {
        match self.refused {
            None => Ok(()),
            Some(max) => Err(Error::LimitReached {
                limit: "max-connections",
                what: format!(
                    "this broker already has its limit of {max} client connections open; this one is closed in {}s: retry later or on another replica",
                    REFUSED_LIFETIME.as_secs()
                ),
            }),
        }
    }

    /// Charges `bytes` of one request message, or RESOURCE_EXHAUSTED naming
    /// `--max-request-bytes-per-connection`. Never waits.
    pub fn charge_request(self: &Arc<Self>, bytes: usize) -> Result<RequestCharge> {
        let n = bytes as u64;
        if self.requests.try_take(n) {
            return Ok(RequestCharge {
                conn: self.clone(),
                bytes: n,
            });
        }
        Err(Error::LimitReached {
            limit: "max-request-bytes-per-connection",
            what: format!(
                "a request message of {bytes} bytes would pass this connection's limit of {} bytes of requests under way ({} taken); wait for answers, or spread calls over more connections",
                self.requests.max,
                self.requests.used()
            ),
        })
    }

    /// Waits until a message of `bytes` would fit in the request budget
    /// (it may still not fit when it comes: another stream may take the
    /// room first). Returns at once if it never could.
    pub async fn request_room(&self, bytes: usize) {
        let n = (bytes as u64).min(self.requests.max);
        loop {
            let freed = self.requests.freed.notified();
            if self.requests.used() + n <= self.requests.max {
                return;
            }
            freed.await;
        }
    }

    /// Bytes of requests under way on this connection.
    #[cfg(test)]
    pub fn request_bytes(&self) -> u64 {
        self.requests.used()
    }

    /// A place for one more Subscribe or Consume stream, with `credit` of
    /// the connection's in-flight budget; or RESOURCE_EXHAUSTED naming
    /// `--max-subscriptions-per-connection` or
    /// `--max-in-flight-per-connection`.
    pub fn open_stream(self: &Arc<Self>, credit: u32) -> Result<StreamHold> {
        if !self.subscriptions.try_take(1) {
            return Err(Error::LimitReached {
                limit: "max-subscriptions-per-connection",
                what: format!(
                    "this connection already has its limit of {} Subscribe and Consume streams open; open more on another connection",
                    self.subscriptions.max
                ),
            });
        }
        let hold = StreamHold {
            conn: self.clone(),
            held: AtomicU64::new(0),
        };
        hold.raise(credit)?;
        Ok(hold)
    }
}

/// A counter with a cap, and a wake-up when it goes down.
#[derive(Debug)]
struct Budget {
    used: AtomicU64,
    max: u64,
    freed: Notify,
}

impl Budget {
    fn new(max: u64) -> Budget {
        Budget {
            used: AtomicU64::new(0),
            max,
            freed: Notify::new(),
        }
    }

    fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&total| total <= self.max)
            })
            .is_ok()
    }

    fn give(&self, n: u64) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }
}

/// Bytes of one request message, given back when dropped.
#[derive(Debug)]
pub struct RequestCharge {
    conn: Arc<Conn>,
    bytes: u64,
}

impl Drop for RequestCharge {
    fn drop(&mut self) {
        self.conn.requests.give(self.bytes);
    }
}

/// One stream's place under `--max-subscriptions-per-connection`, and its
/// share of `--max-in-flight-per-connection`: the highest credit the stream
/// has asked for while it is open (lowering a stream's credit does not free
/// room: the deliveries it already holds stay until settled). Given back
/// when dropped.
#[derive(Debug)]
pub struct StreamHold {
    conn: Arc<Conn>,
    held: AtomicU64,
}

impl StreamHold {
    /// The stream's credit becomes `credit`: holds more if that is more
    /// than it holds, or RESOURCE_EXHAUSTED naming the limit (and holds what
    /// it held).
    pub fn raise(&self, credit: u32) -> Result<()> {
        let want = u64::from(credit);
        let held = self.held.load(Ordering::Relaxed);
        if want <= held {
            return Ok(());
        }
        let budget = &self.conn.credit;
        if !budget.try_take(want - held) {
            return Err(Error::LimitReached {
                limit: "max-in-flight-per-connection",
                what: format!(
                    "max_in_flight {credit} would pass this connection's limit of {} for all its streams ({} held by its other streams); ask for less, or open the stream on another connection",
                    budget.max,
                    budget.used() - held
                ),
            });
        }
        self.held.store(want, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.conn.credit.give(*self.held.get_mut());
        self.conn.subscriptions.give(1);
    }
}

/// What tonic puts into each request's extensions for a connection accepted
/// through [`Admission`].
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub conn: Arc<Conn>,
}

impl ConnInfo {
    /// The connection a request came on (None when it did not come through
    /// [`Admission`], e.g. a test serving another kind of stream).
    pub fn of(extensions: &http::Extensions) -> Option<Arc<Conn>> {
        extensions.get::<ConnInfo>().map(|c| c.conn.clone())
    }
}

/// An accepted connection: the socket, its budgets and its slot.
pub struct ConnIo {
    io: TcpStream,
    info: ConnInfo,
    /// The `--max-connections` slot (or the refusing slot) it holds until
    /// it is closed.
    _slot: OwnedSemaphorePermit,
    /// A refused connection reads end-of-stream from then on, so hyper
    /// closes it.
    close: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Connected for ConnIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(close) = self.close.as_mut()
            && close.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The listener, with `--max-connections` applied to what it accepts.
pub struct Admission {
    incoming: TcpIncoming,
    caps: ConnCaps,
    /// One permit per connection that may still be admitted.
    slots: Arc<Semaphore>,
    /// One permit per over-the-cap connection that may still be served to
    /// be refused.
    refusing: Arc<Semaphore>,
    /// Connections refused since the last warning.
    refused: Arc<AtomicUsize>,
    warned: Option<Instant>,
}

impl Admission {
    pub fn new(incoming: TcpIncoming, caps: ConnCaps) -> Admission {
        Admission {
            incoming,
            caps,
            slots: Arc::new(Semaphore::new(
                caps.max_connections.min(Semaphore::MAX_PERMITS),
            )),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            refused: Arc::new(AtomicUsize::new(0)),
            warned: None,
        }
    }

    fn admit(&mut self, io: TcpStream) -> Option<ConnIo> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(ConnIo {
                io,
                info: ConnInfo {
                    conn: Conn::new(&self.caps),
                },
                _slot: slot,
                close: None,
            });
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        // At most one warning every ten seconds, with the count since.
        if self
            .warned
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            self.warned = Some(Instant::now());
            warn!(
                max_connections = self.caps.max_connections,
                refused = self.refused.swap(0, Ordering::Relaxed),
                "connections refused: --max-connections reached"
            );
        }
        // Over the cap: answered and closed soon, or (when that many are
        // already being refused) closed now, by dropping the socket.
        let slot = self.refusing.clone().try_acquire_owned().ok()?;
        Some(ConnIo {
            io,
            info: ConnInfo {
                conn: Conn::refused(self.caps.max_connections),
            },
            _slot: slot,
            close: Some(Box::pin(tokio::time::sleep(REFUSED_LIFETIME))),
        })
    }
}

impl Stream for Admission {
    type Item = io::Result<ConnIo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match ready!(Pin::new(&mut self.incoming).poll_next(cx)) {
                Some(Ok(io)) => {
                    if let Some(conn) = self.admit(io) {
                        return Poll::Ready(Some(Ok(conn)));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(max_request_bytes: usize, max_subscriptions: usize, max_in_flight: u64) -> Arc<Conn> {
        Conn::new(&ConnCaps {
            max_connections: 1,
            max_request_bytes,
            max_subscriptions,
            max_in_flight,
        })
    }

    fn limit(e: Error) -> &'static str {
        match e {
            Error::LimitReached { limit, .. } => limit,
            other => panic!("not a limit: {other:?}"),
        }
    }

    #[test]
    fn request_charges_are_given_back_when_dropped() {
        let c = conn(100, 1, 1);
        let a = c.charge_request(60).expect("fits");
        let b = c.charge_request(40).expect("fits exactly");
        assert_eq!(c.request_bytes(), 100);
        let e = c.charge_request(1).unwrap_err();
        assert_eq!(limit(e), "max-request-bytes-per-connection");
        drop(a);
        assert_eq!(c.request_bytes(), 40);
        let _c = c.charge_request(60).expect("room again");
        drop(b);
        assert_eq!(c.request_bytes(), 60);
    }

    #[tokio::test]
    async fn room_waits_for_a_charge_to_be_given_back() {
        let c = conn(100, 1, 1);
        let held = c.charge_request(80).expect("fits");
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.request_room(30).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "room while 80 of 100 are held");
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("room once given back")
            .unwrap();
        // A message that could never fit does not wait forever.
        c.request_room(1000).await;
    }

    #[test]
    fn a_stream_holds_its_highest_credit_and_its_place_until_dropped() {
        let c = conn(1, 2, 100);
        let a = c.open_stream(60).expect("fits");
        let e = c.open_stream(41).unwrap_err();
        assert_eq!(limit(e), "max-in-flight-per-connection");
        // Lowering frees nothing; raising within the limit takes more.
        a.raise(10).expect("lower");
        let e = c.open_stream(41).unwrap_err();
        assert_eq!(limit(e), "max-in-flight-per-connection");
        a.raise(70).expect("raise within");
        let e = a.raise(101).unwrap_err();
        assert_eq!(limit(e), "max-in-flight-per-connection");
        let b = c.open_stream(30).expect("the rest");
        // The place is taken back when a stream is refused its credit: two
        // places, two streams open.
        let e = c.open_stream(1).unwrap_err();
        assert_eq!(limit(e), "max-subscriptions-per-connection");
        drop(a);
        let _c = c.open_stream(70).expect("room again");
        drop(b);
        let _d = c.open_stream(30).expect("and again");
    }

    #[test]
    fn only_a_connection_over_the_cap_is_refused() {
        let caps = ConnCaps {
            max_connections: 3,
            max_request_bytes: 1,
            max_subscriptions: 1,
            max_in_flight: 1,
        };
        Conn::new(&caps).check_admitted().expect("admitted");
        let e = Conn::refused(3).check_admitted().unwrap_err();
        let msg = e.to_string();
        assert_eq!(limit(e), "max-connections");
        assert!(msg.contains("limit of 3 client connections"), "{msg}");
    }
}
