//! A TCP proxy between brokers and PostgreSQL, in the test process, that
//! breaks the network the ways deployments see it break: a blackhole (a
//! partition: bytes accepted, nothing forwarded, until it heals), a
//! half-open connection (the server gone without a FIN: what the broker
//! sends is swallowed and nothing comes back, for good), lost replies (one
//! direction only), a slow link (latency added to every chunk), and
//! connections dropped (FIN) or reset (RST).
//!
//! Brokers reach it over TCP on 127.0.0.1 ([`PgProxy::url`] rewrites a
//! database URL to point at it); it reaches the server the way the URL
//! says, over TCP or its Unix socket.
//!
//! Each connection is two pumps, one per direction. A pump's reader stamps
//! every chunk it reads with when it may be delivered (now + the delay);
//! its writer waits for that time and while the proxy is blackholed, then
//! writes it, or drops it when its direction was cut ([`PgProxy::half_open`],
//! [`PgProxy::lose_replies`]). Bytes held during a blackhole are delivered
//! in order once it heals, as TCP would retransmit them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where the server is.
#[derive(Clone, Debug)]
enum Upstream {
    Tcp(String, u16),
    Unix(PathBuf),
}

type Reader = Pin<Box<dyn AsyncRead + Send>>;
type Writer = Pin<Box<dyn AsyncWrite + Send>>;

impl Upstream {
    async fn connect(&self) -> std::io::Result<(Reader, Writer)> {
        Ok(match self {
            Upstream::Tcp(host, port) => {
                let s = TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                let (r, w) = s.into_split();
                (Box::pin(r), Box::pin(w))
            }
            Upstream::Unix(path) => {
                let (r, w) = UnixStream::connect(path).await?.into_split();
                (Box::pin(r), Box::pin(w))
            }
        })
    }
}

/// One connection's controls.
#[derive(Clone)]
struct Conn {
    /// Cancelled: client → server bytes are dropped from now on, and the
    /// server side is closed at once (its backend ends, rolling back what
    /// it had open, as if the server had gone).
    dead_up: CancellationToken,
    /// Cancelled: server → client bytes are dropped from now on.
    dead_down: CancellationToken,
    /// Ends the connection: closed, or reset when `reset` is set.
    kill: CancellationToken,
    reset: Arc<AtomicBool>,
}

struct Inner {
    upstream: Upstream,
    /// While true nothing is forwarded and new connections wait before
    /// reaching the server.
    blackholed: watch::Sender<bool>,
    /// While true new connections wait before reaching the server; open
    /// ones are untouched (a server slow to take connections).
    holding_new: watch::Sender<bool>,
    /// Added to every chunk's delivery time.
    delay: watch::Sender<Duration>,
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
}

/// The proxy; stops (every connection closed) when dropped.
pub struct PgProxy {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    accept: JoinHandle<()>,
}

impl PgProxy {
    /// A proxy on 127.0.0.1 (an ephemeral port) to the server `db_url`
    /// names.
    pub async fn start(db_url: &str) -> PgProxy {
        let target = leaseq_server::pgconn::connect_options(db_url).expect("database URL");
        let upstream = match &target.host {
            leaseq_server::pgconn::Host::Tcp(h) => Upstream::Tcp(h.clone(), target.port),
            leaseq_server::pgconn::Host::Socket(dir) => {
                Upstream::Unix(dir.join(format!(".s.PGSQL.{}", target.port)))
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Inner {
            upstream,
            blackholed: watch::channel(false).0,
            holding_new: watch::channel(false).0,
            delay: watch::channel(Duration::ZERO).0,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, inner.clone()));
        PgProxy {
            addr,
            inner,
            accept,
        }
    }

    /// `db_url` (a URI or keyword/value string) with the server replaced by
    /// this proxy.
    pub fn url(&self, db_url: &str) -> String {
        let port = self.addr.port();
        if db_url.starts_with("postgres://") || db_url.starts_with("postgresql://") {
            // Query parameters come last, and the last value wins.
            let sep = if db_url.contains('?') { '&' } else { '?' };
            format!("{db_url}{sep}host=127.0.0.1&port={port}&hostaddr=")
        } else {
            format!("{db_url} host=127.0.0.1 port={port} hostaddr=''")
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.conns.lock().unwrap().len()
    }

    /// A partition: nothing is forwarded either way, on any connection, and
    /// new connections are accepted but reach nothing, until [`heal`].
    ///
    /// [`heal`]: PgProxy::heal
    pub fn blackhole(&self) {
        self.inner.blackholed.send_replace(true);
    }

    /// Ends a blackhole: what was held is delivered, in order, and
    /// forwarding resumes. Also ends any delay.
    pub fn heal(&self) {
        self.inner.delay.send_replace(Duration::ZERO);
        self.inner.blackholed.send_replace(false);
    }

    /// New connections are accepted but wait before reaching the server
    /// (`true`) until this is called with `false`; open connections go on
    /// as they were.
    pub fn hold_new(&self, hold: bool) {
        self.inner.holding_new.send_replace(hold);
    }

    /// Adds `d` to the delivery of every chunk from now on, each way (a
    /// round trip gets 2 × `d` slower). `Duration::ZERO` ends it.
    pub fn delay(&self, d: Duration) {
        self.inner.delay.send_replace(d);
    }

    /// The server vanishes without a FIN for every connection open now:
    /// what clients send is swallowed and nothing comes back, for good (the
    /// server side is closed). New connections work. Returns how many.
    pub fn half_open(&self) -> usize {
        let conns = self.inner.conns.lock().unwrap();
        for c in conns.values() {
            c.dead_up.cancel();
            c.dead_down.cancel();
        }
        conns.len()
    }

    /// Every connection open now loses its replies for good: what clients
    /// send reaches the server (and is done), nothing comes back. New
    /// connections work. Returns how many.
    pub fn lose_replies(&self) -> usize {
        let conns = self.inner.conns.lock().unwrap();
        for c in conns.values() {
            c.dead_down.cancel();
        }
        conns.len()
    }

    /// Closes every connection open now (a FIN each way). Returns how many.
    pub fn drop_all(&self) -> usize {
        self.kill_all(false)
    }

    /// Resets every connection open now (an RST each way). Returns how many.
    pub fn reset_all(&self) -> usize {
        self.kill_all(true)
    }

    fn kill_all(&self, reset: bool) -> usize {
        let conns = self.inner.conns.lock().unwrap();
        for c in conns.values() {
            c.reset.store(reset, Ordering::SeqCst);
            c.kill.cancel();
        }
        conns.len()
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.kill_all(false);
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        inner.accepted.fetch_add(1, Ordering::Relaxed);
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Conn {
            dead_up: CancellationToken::new(),
            dead_down: CancellationToken::new(),
            kill: CancellationToken::new(),
            reset: Arc::new(AtomicBool::new(false)),
        };
        inner.conns.lock().unwrap().insert(id, conn.clone());
        let inner = inner.clone();
        tokio::spawn(async move {
            serve(client, &inner, conn).await;
            inner.conns.lock().unwrap().remove(&id);
        });
    }
}

async fn serve(mut client: TcpStream, inner: &Inner, conn: Conn) {
    let Conn {
        dead_up,
        dead_down,
        kill,
        reset,
    } = conn;
    // A connection opened during a blackhole reaches nothing until it heals.
    let mut blackholed = inner.blackholed.subscribe();
    let mut holding = inner.holding_new.subscribe();
    let upstream = tokio::select! {
        _ = kill.cancelled() => None,
        _ = async {
            drop(holding.wait_for(|h| !h).await);
            drop(blackholed.wait_for(|b| !b).await)
        } => {
            inner.upstream.connect().await.ok()
        }
    };
    let Some((sr, sw)) = upstream else {
        if reset.load(Ordering::SeqCst) {
            let _ = client.set_zero_linger();
        }
        return;
    };
    {
        let (cr, cw) = client.split();
        let up = pump(cr, sw, dead_up, inner, true);
        let down = pump(sr, cw, dead_down, inner, false);
        tokio::select! {
            _ = kill.cancelled() => {}
            _ = async { tokio::join!(up, down) } => {}
        }
    }
    if reset.load(Ordering::SeqCst) {
        // SO_LINGER 0: the close sends an RST. (The server side, dropped
        // with the pumps, gets a FIN: over a Unix socket there is no RST.)
        let _ = client.set_zero_linger();
    }
}

/// What a pump's reader hands its writer.
enum Chunk {
    Data(Instant, Vec<u8>),
    /// The reader saw EOF (or an error): shut the write side down.
    End(Instant),
}

/// Copies `r` to `w` one chunk at a time, each delivered at its due time,
/// held while blackholed, dropped once `dead`. `to_server`: once `dead`,
/// the server side is shut down at once (the backend ends).
async fn pump(
    mut r: impl AsyncRead + Unpin,
    mut w: impl AsyncWrite + Unpin,
    dead: CancellationToken,
    inner: &Inner,
    to_server: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let delay = inner.delay.subscribe();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf).await.unwrap_or(0);
            let due = Instant::now() + *delay.borrow();
            if n == 0 {
                let _ = tx.send(Chunk::End(due));
                return;
            }
            if tx.send(Chunk::Data(due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let mut blackholed = inner.blackholed.subscribe();
    let writer = async move {
        let mut shut = false;
        loop {
            let chunk = tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => c,
                    None => return,
                },
                _ = dead.cancelled(), if to_server && !shut => {
                    shut = true;
                    let _ = w.shutdown().await;
                    continue;
                }
            };
            let (due, data) = match chunk {
                Chunk::Data(due, data) => (due, Some(data)),
                Chunk::End(due) => (due, None),
            };
            tokio::time::sleep_until(due).await;
            let _ = blackholed.wait_for(|b| !b).await;
            if dead.is_cancelled() {
                continue;
            }
            match data {
                Some(data) => {
                    if w.write_all(&data).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = w.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}
