//! Certificates for the tests, made fresh with rcgen: one place for the CA
//! and leaf parameters every TLS test uses (the broker's gRPC TLS and
//! mutual TLS, the console over HTTPS, the SDKs' TLS settings, PostgreSQL's
//! `ssl = on`).
//!
//! [`Pki::new`] is the usual set, as files: a CA, a server certificate for
//! `localhost` and `127.0.0.1` signed by it, a client certificate signed by
//! it, and a second CA ("rogue") with a client certificate of its own, which
//! the broker does not trust. [`Authority`] and [`write_pem`] make other sets
//! (other names, other files).

use std::path::{Path, PathBuf};

use leaseq::cli::ClientSecurity;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::Scratch;

/// A certificate authority: a self-signed CA certificate and its key.
pub struct Authority(CertifiedIssuer<'static, KeyPair>);

/// A certificate and its private key, both PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Authority {
    /// A CA named `name` (its common name), allowed to sign certificates and
    /// CRLs.
    pub fn new(name: &str) -> Authority {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.distinguished_name.push(DnType::CommonName, name);
        Authority(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses; the
    /// first is also its common name).
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `name`.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.0).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Writes `pem` to `path`: mode 0600 for a private key (a name ending in
/// `.key`, kept as an operator should keep it: the broker warns about keys
/// others can read, PostgreSQL refuses them), 0644 otherwise.
pub fn write_pem(path: &Path, pem: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, pem).unwrap();
    let key = path.extension().is_some_and(|e| e == "key");
    let mode = if key { 0o600 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.to_owned()
}

/// The usual set of certificates as PEM files in a scratch directory
/// (removed with the `Pki`).
pub struct Pki {
    _dir: Scratch,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// For `localhost` and `127.0.0.1`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Signed by `ca`.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed neither the server's certificate nor `client_cert`.
    pub rogue_ca: PathBuf,
    /// Signed by `rogue_ca`.
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = Scratch::new("pki");
        let write = |name: &str, pem: &str| write_pem(&dir.path(name), pem);
        let authority = Authority::new("leaseq test CA");
        let server = authority.server(&["localhost", "127.0.0.1"]);
        let client = authority.client("worker");
        let rogue = Authority::new("someone else's CA");
        let intruder = rogue.client("intruder");
        Pki {
            ca: write("ca.pem", &authority.pem()),
            server_cert: write("server.pem", &server.cert),
            server_key: write("server.key", &server.key),
            client_cert: write("client.pem", &client.cert),
            client_key: write("client.key", &client.key),
            rogue_ca: write("rogue-ca.pem", &rogue.pem()),
            rogue_cert: write("rogue.pem", &intruder.cert),
            rogue_key: write("rogue.key", &intruder.key),
            _dir: dir,
        }
    }

    /// A client that trusts the CA and presents no certificate.
    pub fn trusting(&self) -> ClientSecurity {
        ClientSecurity {
            tls_ca: Some(self.ca.clone()),
            ..Default::default()
        }
    }

    /// A client that trusts the CA and presents the client certificate.
    pub fn identity(&self) -> ClientSecurity {
        ClientSecurity {
            tls_cert: Some(self.client_cert.clone()),
            tls_key: Some(self.client_key.clone()),
            ..self.trusting()
        }
    }
}
