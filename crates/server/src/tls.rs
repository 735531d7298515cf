//! TLS (rustls, ring provider) for the gRPC port, and optional mutual TLS.
//!
//! Files are read once at startup; a bad or missing file stops `serve` with
//! a message naming the flag, rather than serving plaintext by surprise.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tracing::warn;

use crate::config::SecurityConfig;

/// A client that opens TCP and never finishes the handshake is dropped after
/// this long, so it cannot hold a connection slot forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("{flag}: reading {}", path.display()))
}

/// The server TLS configuration, or `None` when `--tls-cert` is not set.
pub fn server_config(args: &SecurityConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    warn_if_readable_by_others(key);
    let mut cfg = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read(cert, "--tls-cert")?,
            read(key, "--tls-key")?,
        ))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = &args.tls_client_ca {
        cfg = cfg.client_ca_root(Certificate::from_pem(read(ca, "--tls-client-ca")?));
    }
    Ok(Some(cfg))
}

/// A private key others can read is a key others may have copied.
fn warn_if_readable_by_others(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key)
        && meta.permissions().mode() & 0o077 != 0
    {
        warn!(path = %key.display(), "--tls-key is readable by group or others; chmod 600 it");
    }
}
