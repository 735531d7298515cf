//! The connection flags of client subcommands (TLS files and a bearer token,
//! with environment twins), turned into the client crate's
//! [`leaseq_client::ConnectOptions`].

use std::fmt;
use std::path::PathBuf;

use clap::Args;
use leaseq_client::ConnectOptions;

pub use leaseq_client::ClientChannel;

/// TLS and token flags shared by `enqueue`, `tail` and `bench`.
#[derive(Args, Clone, Default)]
pub struct ClientSecurity {
    /// CA certificate (PEM) that signed the broker's certificate. Needed for
    /// TLS, which also needs an https:// address.
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

/// Connects to `addr` (`http://` or `https://`) with `sec`'s TLS and token.
pub async fn connect(addr: &str, sec: &ClientSecurity) -> anyhow::Result<ClientChannel> {
    Ok(leaseq_client::connect(addr, &sec.options()).await?)
}
