//! Listeners for the HTTP server: plain TCP, or TLS with the broker's own
//! certificate (and its client CA, when mutual TLS is on). axum drives the
//! connections (hyper 1, HTTP/1.1); TLS handshakes run in tasks of their own
//! with a deadline, so a client that never finishes one holds up nobody.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::SecurityConfig;

/// Binds an HTTP listener (so `serve` fails fast on a taken port).
pub async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} listener {addr}"))
}

/// The console's TLS settings from the broker's: the same certificate and
/// key, and the same client CA. None when the broker has no TLS.
pub fn tls_acceptor(sec: &SecurityConfig) -> anyhow::Result<Option<TlsAcceptor>> {
    let (Some(cert), Some(key)) = (&sec.tls_cert, &sec.tls_key) else {
        return Ok(None);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| anyhow::anyhow!("--tls-cert {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &sec.tls_client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?
            {
                let c = c.map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?;
                roots.add(c).context("--tls-client-ca")?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("--tls-client-ca")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .context("--tls-cert / --tls-key")?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(cfg))))
}

/// Accepted TLS connections, handshakes done.
struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop ended (shutdown): wait for axum to stop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

fn tls_listener(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: CancellationToken,
) -> std::io::Result<TlsListener> {
    let addr = listener.local_addr()?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = listener.accept() => match c {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "http: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "http: TLS handshake failed"),
                    Err(_) => debug!(%peer, "http: TLS handshake timed out"),
                }
            });
        }
    });
    Ok(TlsListener { rx, addr })
}

/// Serves `router` on `listener` (over TLS when `tls` is given) until
/// `shutdown`, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: CancellationToken,
) {
    let stop = shutdown.clone().cancelled_owned();
    let result = match tls {
        None => {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop)
                .await
        }
        Some(acceptor) => match tls_listener(listener, acceptor, shutdown.clone()) {
            Ok(l) => axum::serve(l, router).with_graceful_shutdown(stop).await,
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        warn!(error = %e, "http server failed");
    }
}
