//! Reaching a broker: plaintext or TLS, optionally with a client certificate
//! (mutual TLS), and a bearer token on every call.
//!
//! Every leaseq client (this crate, the CLI, the Python, Node and Go
//! clients) takes the same addresses and settings:
//!
//! - `host:port`: plaintext, or TLS when a CA or a client certificate is
//!   given; `http://host:port`: plaintext; `https://host:port`: TLS.
//! - TLS verifies the broker's certificate against the CA given
//!   ([`ConnectOptions::tls_ca`]), else against the system's roots (the
//!   operating system's store, read by `rustls-native-certs`; on Linux
//!   `SSL_CERT_FILE` / `SSL_CERT_DIR` name other ones, as for OpenSSL).
//! - The environment, read by [`ConnectOptions::from_env`] and
//!   [`addr_from_env`]: `LEASEQ_ADDR` (default [`DEFAULT_ADDR`]),
//!   `LEASEQ_TOKEN`, `LEASEQ_TLS_CA`, `LEASEQ_CLIENT_CERT`,
//!   `LEASEQ_CLIENT_KEY`.
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

/// The broker's address when none is given: plaintext on the local host.
pub const DEFAULT_ADDR: &str = "127.0.0.1:50051";

/// `LEASEQ_ADDR`, else [`DEFAULT_ADDR`].
pub fn addr_from_env() -> String {
    std::env::var("LEASEQ_ADDR")
        .ok()
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ADDR.to_owned())
}

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
    /// CA certificate (PEM) that signed the broker's certificate; without
    /// it, TLS (an `https://` address) trusts the system's roots. With a
    /// `host:port` address, giving it turns TLS on.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for brokers that require mutual TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Bearer token sent on every call.
    pub token: Option<String>,
}

impl ConnectOptions {
    /// The options the environment gives: `LEASEQ_TLS_CA`,
    /// `LEASEQ_CLIENT_CERT` and `LEASEQ_CLIENT_KEY` (PEM files), and
    /// `LEASEQ_TOKEN`; an unset or empty variable gives nothing.
    pub fn from_env() -> ConnectOptions {
        ConnectOptions::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`ConnectOptions::from_env`] with the variables read by `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> ConnectOptions {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        ConnectOptions {
            tls_ca: get("LEASEQ_TLS_CA").map(PathBuf::from),
            tls_cert: get("LEASEQ_CLIENT_CERT").map(PathBuf::from),
            tls_key: get("LEASEQ_CLIENT_KEY").map(PathBuf::from),
            token: get("LEASEQ_TOKEN"),
        }
    }

    /// Trusts the CA certificate (PEM) in `path` for the broker's
    /// certificate (instead of the system's roots); with a `host:port`
    /// address, turns TLS on.
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

/// Where to connect: the URI tonic wants, and whether it is TLS. `addr` is
/// `host:port` (TLS when `opts` has a CA or a client certificate),
/// `http://host:port` or `https://host:port`; a path, a query or another
/// scheme is refused.
pub fn target(addr: &str, opts: &ConnectOptions) -> Result<(String, bool), ConnectError> {
    let addr = addr.trim();
    let tls_files = opts.tls_ca.is_some() || opts.tls_cert.is_some() || opts.tls_key.is_some();
    let (tls, rest) = if let Some(rest) = addr.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = addr.strip_prefix("http://") {
        if tls_files {
            return Err(ConnectError::Config(format!(
                "address {addr:?}: http:// is plaintext, but TLS files were given (use https:// or host:port)"
            )));
        }
        (false, rest)
    } else if addr.contains("://") {
        return Err(ConnectError::Config(format!(
            "address {addr:?}: the scheme must be http:// or https:// (or none: host:port)"
        )));
    } else {
        (tls_files, addr)
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let bad = |why: &str| ConnectError::Config(format!("address {addr:?}: {why} (host:port)"));
    if rest.is_empty() {
        return Err(bad("no host"));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
        return Err(bad("only a host and a port"));
    }
    // A port is required, whatever the scheme: brokers have no default one.
    let port = match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            port
        }
        _ => return Err(bad("a port is required")),
    };
    if port.parse::<u16>().is_err() {
        return Err(bad("the port must be a number up to 65535"));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok((format!("{scheme}://{rest}"), tls))
}

/// The endpoint for `addr` (see [`target`]) with `opts`' TLS, and the
/// keep-alive settings every client of this crate uses.
pub fn endpoint(addr: &str, opts: &ConnectOptions) -> Result<Endpoint, ConnectError> {
    let (uri, tls) = target(addr, opts)?;
    let mut endpoint = keepalive(
        Endpoint::from_shared(uri)
            .map_err(|e| ConnectError::Config(format!("address {addr:?}: {e}")))?,
    );
    if tls {
        let mut config = ClientTlsConfig::new();
        config = match &opts.tls_ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca, "tls_ca")?)),
            None => config.with_native_roots(),
        };
        match (&opts.tls_cert, &opts.tls_key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(
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
            .tls_config(config)
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

/// Connects to `addr` (`host:port`, `http://` or `https://`) with `opts`'
/// TLS and token.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> ConnectOptions {
        ConnectOptions::default().tls_ca("/ca.pem")
    }

    #[test]
    fn every_address_form_is_taken() {
        let none = ConnectOptions::default();
        let t = |a: &str, o: &ConnectOptions| target(a, o).map_err(|e| e.to_string());
        assert_eq!(
            t("127.0.0.1:50051", &none),
            Ok(("http://127.0.0.1:50051".into(), false))
        );
        assert_eq!(
            t("127.0.0.1:50051", &ca()),
            Ok(("https://127.0.0.1:50051".into(), true))
        );
        assert_eq!(t("http://h:1", &none), Ok(("http://h:1".into(), false)));
        assert_eq!(t("https://h:1/", &none), Ok(("https://h:1".into(), true)));
        assert_eq!(t("https://h:1", &ca()), Ok(("https://h:1".into(), true)));
        assert_eq!(
            t(" [::1]:50051 ", &none),
            Ok(("http://[::1]:50051".into(), false))
        );
        let cert_only = ConnectOptions::default().tls_identity("/c.pem", "/c.key");
        assert_eq!(t("h:1", &cert_only), Ok(("https://h:1".into(), true)));
        for (bad, why) in [
            ("http://h:1", "TLS files"),
            ("grpc://h:1", "scheme"),
            ("h", "port"),
            ("h:", "port"),
            ("h:99999", "port"),
            ("https://h", "port"),
            ("h:1/path", "only a host and a port"),
            ("", "no host"),
            ("::1", "port"),
        ] {
            let opts = if bad.starts_with("http://") {
                ca()
            } else {
                none.clone()
            };
            let e = t(bad, &opts).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_environment_gives_the_options() {
        let env = |name: &str| match name {
            "LEASEQ_TLS_CA" => Some("/etc/leaseq/ca.pem".to_owned()),
            "LEASEQ_TOKEN" => Some("s3cret".to_owned()),
            "LEASEQ_CLIENT_CERT" => Some(String::new()),
            _ => None,
        };
        let o = ConnectOptions::from_lookup(env);
        assert_eq!(
            o.tls_ca.as_deref(),
            Some(std::path::Path::new("/etc/leaseq/ca.pem"))
        );
        assert_eq!(o.token.as_deref(), Some("s3cret"));
        assert_eq!(o.tls_cert, None, "an empty variable is unset");
        assert_eq!(o.tls_key, None);
    }
}
