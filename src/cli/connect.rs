//! How every client command reaches the broker: one set of flags
//! ([`ConnectArgs`]: address, TLS files, bearer token, each with an
//! environment twin), turned into the client crate's
//! [`leaseq_client::ConnectOptions`], and one way to connect with them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use leaseq_client::connect::{bearer, endpoint};
use leaseq_client::{Client, ConnectOptions};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::exit::{CliError, Exit};

pub use leaseq_client::ClientChannel;

/// The broker's address when neither `--addr` nor `LEASEQ_ADDR` is given
/// (every leaseq client's default).
pub const DEFAULT_ADDR: &str = leaseq_client::DEFAULT_ADDR;

/// Address, TLS and token: flattened into every client command.
#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Broker address: HOST:PORT (plaintext, or TLS with --tls-ca or a client
    /// certificate), http://HOST:PORT, or https://HOST:PORT (TLS, verified
    /// against --tls-ca, else the system's roots).
    #[arg(long, env = "LEASEQ_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    #[command(flatten)]
    pub security: ClientSecurity,
}

/// TLS files and the bearer token, with environment twins (the part of
/// [`ConnectArgs`] that `bench`, which has its own address flags, shares).
#[derive(Args, Clone, Default)]
pub struct ClientSecurity {
    /// CA certificate (PEM) that signed the broker's certificate; without
    /// it TLS trusts the system's roots. Turns TLS on for a HOST:PORT
    /// address.
    #[arg(long, env = "LEASEQ_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that require mutual TLS.
    #[arg(long, env = "LEASEQ_CLIENT_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM).
    #[arg(long, env = "LEASEQ_CLIENT_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Bearer token sent on every call. Prefer the environment variable:
    /// command lines are visible to other users.
    #[arg(long, env = "LEASEQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The token redacted.
impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options().fmt(f)
    }
}

impl ClientSecurity {
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            token: self.token.clone(),
        }
    }
}

impl ConnectArgs {
    pub fn options(&self) -> ConnectOptions {
        self.security.options()
    }

    /// Connects now: a broker that cannot be reached is an error (exit 4;
    /// 5 if the TLS handshake fails).
    pub async fn connect(&self) -> Result<ClientChannel, CliError> {
        channel(&self.addr, &self.options()).await
    }

    /// For commands that wait for a broker that is down (`work`): one
    /// health check (it needs no token) that fails only when waiting would
    /// not help. A broker that cannot be reached (refused, timed out) passes,
    /// and so does any answer from it; unusable options fail (2), a failed
    /// TLS handshake (5), and a broker that is reached but hangs up without
    /// answering (4; e.g. it wants a client certificate, or TLS).
    pub async fn preflight(&self) -> Result<(), CliError> {
        let channel = match self.connect().await {
            Ok(channel) => channel,
            Err(e) if e.exit == Exit::Unavailable => return Ok(()),
            Err(e) => return Err(e),
        };
        match HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
        {
            // A status with a source is the connection's failure, not an
            // answer.
            Err(s) if std::error::Error::source(&s).is_some() => Err(s.into()),
            _ => Ok(()),
        }
    }

    /// A [`Client`] that connects on first use, and again whenever the
    /// connection breaks (for `leaseq work`, which waits for a broker that
    /// is not up yet).
    pub fn lazy_client(&self) -> Result<Client, CliError> {
        let opts = self.options();
        let lazy = configured(&self.addr, &opts)?.connect_lazy();
        Ok(Client::from_client_channel(InterceptedService::new(
            lazy,
            bearer(&opts)?,
        )))
    }
}

/// The endpoint for `addr` with `opts`' TLS (built by the client crate),
/// plus the timeouts a command line wants: a broker that does not answer
/// within 5 s is unreachable, and a connection that dies is noticed by
/// HTTP/2 pings.
fn configured(addr: &str, opts: &ConnectOptions) -> Result<Endpoint, CliError> {
    Ok(endpoint(addr, opts)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// The one way client commands connect: `addr` with `opts`' TLS, and the
/// token on every call.
pub async fn channel(addr: &str, opts: &ConnectOptions) -> Result<ClientChannel, CliError> {
    let endpoint = configured(addr, opts)?;
    let bearer = bearer(opts)?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| CliError::connecting(addr, &e))?;
    Ok(InterceptedService::new(channel, bearer))
}

/// Connects to `addr` (`http://` or `https://`) with `sec`'s TLS and token
/// (for `bench` and tests, which have their own address flags).
pub async fn connect(addr: &str, sec: &ClientSecurity) -> anyhow::Result<ClientChannel> {
    channel(addr, &sec.options())
        .await
        .map_err(|e| anyhow::anyhow!(e.message))
}
