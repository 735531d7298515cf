//! TCP keepalive and TCP_USER_TIMEOUT on the broker's connections to
//! PostgreSQL ([`crate::pgconn::TcpOptions`]: libpq's `keepalives*` and
//! `tcp_user_timeout` keywords over leaseq's defaults).
//!
//! Without them a connection whose server vanished without a FIN (a
//! failover, a host powered off, a NAT or firewall that forgot the flow)
//! looks alive for as long as the operating system cares to wait: hours
//! for an idle one (the LISTEN connection), about 15 minutes of
//! retransmissions for one waiting on an answer.
//!
//! sqlx 0.9 opens its TCP sockets itself and offers neither the socket nor
//! a hook to set options on it (launchbadge/sqlx#3540; the pull request
//! that adds keepalives, #4355, is not released). So after each connection
//! is opened ([`Tuner::tune`], called by the hot path's connection set and
//! by the sqlx pools' `after_connect`), the process's open descriptors
//! (`/proc/self/fd`) are looked through for TCP sockets connected to the
//! server's address, and the options are set on each. Setting them again
//! on a socket tuned before changes nothing, so concurrent connects need no
//! coordination: each finds its own socket (and perhaps others'). The look
//! costs a `getpeername` per open descriptor, once per new connection, not
//! per statement. Sockets to the same server opened by other code in the
//! process (an embedder's own pool) get the same options, which does them
//! no harm.
//!
//! Linux only (where `/proc/self/fd` and TCP_USER_TIMEOUT exist); elsewhere
//! [`Tuner::tune`] does nothing and says so once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{debug, warn};

use crate::pgconn::{Host, PgTarget, TcpOptions};

/// Sets [`TcpOptions`] on the sockets connected to one server.
#[derive(Debug)]
pub struct Tuner {
    host: String,
    port: u16,
    tcp: TcpOptions,
    /// Whether a look already found no socket (warned once).
    warned: AtomicBool,
}

impl Tuner {
    /// The tuner for `target`'s connections; None over a Unix socket (no
    /// TCP) or when every option is left to the system.
    pub fn for_target(target: &PgTarget) -> Option<Arc<Tuner>> {
        let Host::Tcp(host) = &target.host else {
            return None;
        };
        if target.tcp.keepalive.is_none() && target.tcp.user_timeout.is_none() {
            return None;
        }
        Some(Arc::new(Tuner {
            host: host.clone(),
            port: target.port,
            tcp: target.tcp,
            warned: AtomicBool::new(false),
        }))
    }

    /// Sets the options on every socket of this process connected to the
    /// server; returns how many it found. Called right after a connection
    /// was opened, so the new one is among them.
    pub async fn tune(&self) -> usize {
        // The same resolution sqlx's connect did (tokio's): an IP address
        // is used as is, a name is looked up.
        let peers: HashSet<SocketAddr> = match tokio::net::lookup_host((
            self.host.as_str(),
            self.port,
        ))
        .await
        {
            Ok(addrs) => addrs.collect(),
            Err(e) => {
                debug!(host = %self.host, error = %e, "TCP options: the server's address did not resolve");
                return 0;
            }
        };
        let found = set_on_sockets_to(&peers, &self.tcp);
        if found == 0 && !self.warned.swap(true, Ordering::Relaxed) {
            warn!(
                host = %self.host,
                port = self.port,
                "TCP keepalive and TCP_USER_TIMEOUT could not be set: no socket to the server found \
                 among this process's descriptors (a dead server may go unnoticed for minutes)"
            );
        }
        found
    }
}

#[cfg(target_os = "linux")]
fn set_on_sockets_to(peers: &HashSet<SocketAddr>, tcp: &TcpOptions) -> usize {
    use std::os::fd::{BorrowedFd, RawFd};

    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut found = 0;
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor is only passed to getpeername(2) and
        // setsockopt(2), which do not touch memory it refers to. It may be
        // closed by another thread meanwhile (the calls then fail with
        // EBADF) or even reused; the peer address is checked first, so at
        // worst a socket opened in between to the same server is tuned,
        // which it would be anyway.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&fd);
        let Some(peer) = sock.peer_addr().ok().and_then(|a| a.as_socket()) else {
            continue;
        };
        if !peers.contains(&peer) {
            continue;
        }
        if let Err(e) = apply(&sock, tcp) {
            debug!(%peer, error = %e, "TCP options not set on a socket to PostgreSQL");
            continue;
        }
        found += 1;
    }
    found
}

#[cfg(target_os = "linux")]
fn apply(sock: &socket2::SockRef<'_>, tcp: &TcpOptions) -> std::io::Result<()> {
    match &tcp.keepalive {
        Some(k) => {
            let mut params = socket2::TcpKeepalive::new();
            if let Some(idle) = k.idle {
                params = params.with_time(idle);
            }
            if let Some(interval) = k.interval {
                params = params.with_interval(interval);
            }
            if let Some(count) = k.count {
                params = params.with_retries(count);
            }
            sock.set_tcp_keepalive(&params)?;
        }
        None => sock.set_keepalive(false)?,
    }
    // None (or zero) is the system's default.
    sock.set_tcp_user_timeout(tcp.user_timeout)
}

#[cfg(not(target_os = "linux"))]
fn set_on_sockets_to(_peers: &HashSet<SocketAddr>, _tcp: &TcpOptions) -> usize {
    0
}
