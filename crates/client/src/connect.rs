//! Reaching a broker: plaintext or TLS (`https://` addresses, a CA
//! certificate), optionally with a client certificate (mutual TLS), and a
//! bearer token on every call.
//!
//! [`Client::connect_with`](crate::Client::connect_with) and
//! [`AdminClient::connect_with`](crate::AdminClient::connect_with) are the
//! usual way in; [`connect`] gives the bare [`ClientChannel`] for other
//! services (health, reflection) with the same options.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

/// How to reach a broker besides its address: TLS files and a bearer token.
///
/// ```
/// use leaseq_client::ConnectOptions;
///
/// let opts = ConnectOptions::default()
///     .tls_ca("/etc/leaseq/ca.pem")
///     .tls_identity("/etc/leaseq/worker.pem", "/etc/leaseq/worker.key")
///     .token("s3cret");
/// assert!(format!("{opts:?}").contains("<redacted>"));
/// ```
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// CA certificate (PEM) that signed the broker's certificate. Needed for
    /// TLS, which also needs an `https://` address.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for brokers that require mutual TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Bearer token sent on every call.
    pub token: Option<String>,
}

impl ConnectOptions {
    /// Trusts the CA certificate (PEM) in `path` for the broker's
    /// certificate. TLS also needs an `https://` address.
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> ConnectOptions {
        self.tls_ca = Some(path.into());
        self
    }

    /// Presents this client certificate and key (PEM files) to a broker that
    /// requires mutual TLS.
    pub fn tls_identity(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> ConnectOptions {
        self.tls_cert = Some(cert.into());
        self.tls_key = Some(key.into());
        self
    }

    /// Sends `authorization: Bearer <token>` on every call. An empty token
    /// sends nothing.
    pub fn token(mut self, token: impl Into<String>) -> ConnectOptions {
        let token = token.into();
        self.token = Some(token).filter(|t| !t.is_empty());
        self
    }
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a connection could not be set up. The messages name the option at
/// fault (`tls_ca: reading ...`).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address or an option is unusable.
    #[error("{0}")]
    Config(String),
    /// The broker could not be reached.
    #[error("connecting to {addr}: {source}")]
    Transport {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Adds `authorization: Bearer <token>` to every call (nothing without one).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer(<redacted>)"
        } else {
            "Bearer(none)"
        })
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// A connection to a broker that sends the token on every call.
pub type ClientChannel = InterceptedService<Channel, Bearer>;

fn read(path: &PathBuf, option: &str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path)
        .map_err(|e| ConnectError::Config(format!("{option}: reading {}: {e}", path.display())))
}

/// The connection settings every client of this crate uses.
pub(crate) fn keepalive(endpoint: Endpoint) -> Endpoint {
    endpoint
        .connect_timeout(Duration::from_secs(5))
        // A stream that goes quiet because the connection died (not because
        // the queue is idle: the broker sends heartbeats) is noticed by
        // HTTP/2 pings, so the worker reconnects.
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
}

/// The endpoint for `addr` (`http://` or `https://`) with `opts`' TLS, and
/// the keep-alive settings every client of this crate uses.
pub fn endpoint(addr: &str, opts: &ConnectOptions) -> Result<Endpoint, ConnectError> {
    let mut endpoint = keepalive(
        Endpoint::from_shared(addr.to_owned())
            .map_err(|e| ConnectError::Config(format!("address {addr:?}: {e}")))?,
    );
    let tls_wanted =
        addr.starts_with("https://") || opts.tls_ca.is_some() || opts.tls_cert.is_some();
    if tls_wanted {
        if !addr.starts_with("https://") {
            return Err(ConnectError::Config(format!(
                "TLS options need an https:// address, not {addr}"
            )));
        }
        let ca = opts.tls_ca.as_ref().ok_or_else(|| {
            ConnectError::Config(
                "an https:// address needs tls_ca (the CA that signed the broker's certificate)"
                    .into(),
            )
        })?;
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "tls_ca")?));
        match (&opts.tls_cert, &opts.tls_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(
                    read(cert, "tls_cert")?,
                    read(key, "tls_key")?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(ConnectError::Config(
                    "tls_cert and tls_key go together".into(),
                ));
            }
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ConnectError::Config(format!("TLS configuration: {e}")))?;
    }
    Ok(endpoint)
}

/// The interceptor that sends `opts.token`.
pub fn bearer(opts: &ConnectOptions) -> Result<Bearer, ConnectError> {
    let value = match opts.token.as_ref().filter(|t| !t.is_empty()) {
        Some(t) if !t.bytes().all(|b| b.is_ascii_graphic()) => {
            return Err(ConnectError::Config(
                "token: must be printable ASCII without spaces".into(),
            ));
        }
        Some(t) => {
            let mut v: MetadataValue<Ascii> = format!("Bearer {t}")
                .parse()
                .map_err(|_| ConnectError::Config("token: must be printable ASCII".into()))?;
            // Never put into HTTP/2's header compression tables.
            v.set_sensitive(true);
            Some(v)
        }
        None => None,
    };
    Ok(Bearer(value))
}

/// Connects to `addr` (`http://` or `https://`) with `opts`' TLS and token.
pub async fn connect(addr: &str, opts: &ConnectOptions) -> Result<ClientChannel, ConnectError> {
    let endpoint = endpoint(addr, opts)?;
    let bearer = bearer(opts)?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ConnectError::Transport {
            addr: addr.to_owned(),
            source,
        })?;
    Ok(InterceptedService::new(channel, bearer))
}

/// Like [`connect`], but connects on first use: fails only on a malformed
/// address or unusable options (unreadable TLS files, a token that is not
/// printable ASCII).
pub fn connect_lazy(addr: &str, opts: &ConnectOptions) -> Result<ClientChannel, ConnectError> {
    let endpoint = endpoint(addr, opts)?;
    let bearer = bearer(opts)?;
    Ok(InterceptedService::new(endpoint.connect_lazy(), bearer))
}

/// A channel configured by the caller, with `token` (if any) on every call.
pub fn with_token(channel: Channel, token: Option<&str>) -> Result<ClientChannel, ConnectError> {
    let opts = ConnectOptions {
        token: token.map(str::to_owned),
        ..ConnectOptions::default()
    };
    Ok(InterceptedService::new(channel, bearer(&opts)?))
}
