//! How client subcommands reach a broker: plaintext or TLS (`https://`
//! addresses, `--tls-ca`), optionally with a client certificate (mutual TLS),
//! and a bearer token on every call.

use std::fmt;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

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
        f.debug_struct("ClientSecurity")
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Adds `authorization: Bearer <token>` to every call (nothing without one).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

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

/// Connects to `addr` (`http://` or `https://`) with `sec`'s TLS and token.
pub async fn connect(addr: &str, sec: &ClientSecurity) -> anyhow::Result<ClientChannel> {
    let mut endpoint =
        Endpoint::from_shared(addr.to_owned()).with_context(|| format!("address {addr}"))?;
    let tls_wanted = addr.starts_with("https://") || sec.tls_ca.is_some() || sec.tls_cert.is_some();
    if tls_wanted {
        anyhow::ensure!(
            addr.starts_with("https://"),
            "TLS options need an https:// address, not {addr}"
        );
        let ca = sec.tls_ca.as_ref().context(
            "an https:// address needs --tls-ca (the CA that signed the broker's certificate)",
        )?;
        let pem =
            std::fs::read(ca).with_context(|| format!("--tls-ca: reading {}", ca.display()))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let (Some(cert), Some(key)) = (&sec.tls_cert, &sec.tls_key) {
            let cert = std::fs::read(cert)
                .with_context(|| format!("--tls-cert: reading {}", cert.display()))?;
            let key = std::fs::read(key)
                .with_context(|| format!("--tls-key: reading {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).context("TLS configuration")?;
    }
    let bearer = match &sec.token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .context("--token: must be printable ASCII")?,
        ),
        None => None,
    };
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(InterceptedService::new(channel, Bearer(bearer)))
}
