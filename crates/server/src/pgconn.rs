//! What the user passed to reach PostgreSQL (`DATABASE_URL` /
//! `--database-url` and the `PG*` environment variables), read as libpq
//! reads it, turned into sqlx's [`PgConnectOptions`].
//!
//! # Forms
//!
//! - A URI, `postgres://` or `postgresql://`, in every form libpq takes:
//!   `postgresql://user:pw@host:5432/db?sslmode=require`, an empty host with
//!   the socket directory as a parameter
//!   (`postgresql://postgres@/mydb?host=/var/run/postgresql`), the directory
//!   percent-encoded as the host (`postgresql://%2Fvar%2Frun%2Fpostgresql/db`),
//!   an IPv6 address in brackets (`postgresql://[::1]:5432/db`), and any
//!   keyword below as a query parameter (`ssl=true` means `sslmode=require`,
//!   as in libpq). Components are percent-decoded (`%XX` only: `+` is a plus).
//! - A keyword/value string: `host=/var/run/postgresql dbname=mydb user=x
//!   password='a b'`, spaces around `=` allowed, a value in single quotes may
//!   hold spaces, `\'` and `\\` escape inside and outside quotes.
//! - An empty string: everything from the environment (libpq's `""`).
//!
//! # The environment
//!
//! As in libpq, a variable fills what the string does not say: PGHOST,
//! PGHOSTADDR, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE,
//! PGSSLROOTCERT, PGSSLCERT, PGSSLKEY, PGAPPNAME, PGCONNECT_TIMEOUT,
//! PGOPTIONS, PGCLIENTENCODING, and the ones in the tables below. PGPASSFILE
//! (else `~/.pgpass`) is read by sqlx when no password is given; for a Unix
//! socket its host field is matched against `localhost`, as libpq does. One
//! rule is stricter than libpq's: when the string names the server (`host`
//! or `hostaddr`), PGHOST and PGHOSTADDR are both left out, so a PGHOSTADDR
//! left in a shell cannot redirect a DATABASE_URL that names its host. An
//! empty value, in the string or the environment, counts as not given.
//! sqlx reads PGOPTIONS itself, so when the string has `options` too both
//! are sent, the string's last (a setting in both takes the string's value;
//! libpq would drop PGOPTIONS).
//!
//! # TLS
//!
//! `sslmode` as libpq: `disable`, `allow` (sqlx has no `allow`, and would
//! take it as `disable`; leaseq treats it as `prefer`, which encrypts when
//! the server can and connects without TLS when it cannot), `prefer` (the
//! default), `require`, `verify-ca`,
//! `verify-full`. Over a Unix socket sslmode is ignored, as in libpq. As in
//! libpq, `require` with a root certificate behaves as `verify-ca`;
//! `verify-ca`/`verify-full` need `sslrootcert` (default
//! `~/.postgresql/root.crt`) or `sslrootcert=system` (the system's trusted
//! roots, `verify-full` only). `sslcert`/`sslkey` (default
//! `~/.postgresql/postgresql.crt` and `.key` when they exist) send a client
//! certificate; the key must be mode 0600 or less (0640 if owned by root), as
//! libpq requires. Files are checked here, so a missing or wrong file fails at
//! once instead of at every connection attempt.
//!
//! One difference remains that leaseq cannot close: sqlx adds the system's
//! trusted roots (`/etc/ssl/certs`, or `SSL_CERT_FILE`) to `sslrootcert`
//! rather than trusting that file alone. With `verify-full` the host name
//! check still ties the certificate to the server; with `verify-ca` a
//! certificate from any CA the system trusts is accepted. leaseq's container
//! image has no system store, so there `sslrootcert` is the only trust.
//!
//! # What sqlx cannot do
//!
//! Several hosts (`host=a,b`, `postgres://a,b/db`) are refused with an error
//! saying so: sqlx connects to one host. So are keywords that would ask for
//! something sqlx does not do (`service`, `passfile`, `sslpassword`,
//! `sslcrl`, `requirepeer`, `require_auth`, `gssencmode=require`,
//! `channel_binding=require`, `target_session_attrs` other than `any`, ...),
//! since silently dropping them could weaken what the user asked for.
//! A few keywords sqlx has no use for (`sslcompression`, `sslsni`, ...) are
//! accepted, have no effect, and are reported in [`PgTarget::warnings`].
//!
//! # TCP keepalive and user timeout
//!
//! sqlx 0.9 sets no TCP keepalive, so leaseq does ([`crate::pgsock`]), with
//! libpq's keywords and its own defaults where the string says nothing:
//! `keepalives` (1: on; 0: off), `keepalives_idle` (seconds idle before the
//! first probe, default 15), `keepalives_interval` (seconds between probes,
//! default 5), `keepalives_count` (unanswered probes before the connection
//! is dropped, default 3) and `tcp_user_timeout` (milliseconds sent data
//! may stay unacknowledged, default 30000). As in libpq, 0 leaves a value
//! to the operating system. A dead server or a cut network is so found
//! within about 30 s, on an idle connection (the LISTEN one) as on a busy
//! one. Over a Unix socket they do not apply.
//! `connect_timeout` bounds how long the pool waits for a connection (libpq's
//! minimum of 2 s applies; 0 means leaseq's default of 5 s).
//!
//! leaseq's own settings are added: `application_name=leaseq` unless one is
//! given (or `fallback_application_name`), and the startup options
//! `search_path=leaseq,public` and `jit=off` after the user's `options`.
//!
//! Error messages name the keyword and where it came from (the URI, the
//! string, or the variable) and never contain a password.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// A connection setting that cannot be used. The message names the setting
/// and where it came from; it never holds a password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PgConnError(String);

impl From<PgConnError> for sqlx::Error {
    fn from(e: PgConnError) -> Self {
        sqlx::Error::Configuration(Box::new(e))
    }
}

fn fail<T>(msg: impl Into<String>) -> Result<T, PgConnError> {
    Err(PgConnError(msg.into()))
}

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A host name or IP address (IPv6 without brackets).
    Tcp(String),
    /// The directory holding the server's Unix socket.
    Socket(PathBuf),
}

/// libpq's sslmode, after leaseq's reading of it (`allow` is `Prefer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl From<SslMode> for PgSslMode {
    fn from(m: SslMode) -> Self {
        match m {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require => PgSslMode::Require,
            SslMode::VerifyCa => PgSslMode::VerifyCa,
            SslMode::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

/// The trust anchors for the server's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// A PEM file of CA certificates (`sslrootcert=FILE`).
    File(PathBuf),
    /// The system's trusted roots (`sslrootcert=system`).
    System,
}

/// Everything needed to connect, resolved from the string and the
/// environment. `Display` and `Debug` never show the password.
#[derive(Clone)]
pub struct PgTarget {
    pub host: Host,
    pub port: u16,
    /// None: sqlx's default (PGUSER, else the operating-system user).
    pub(crate) user: Option<String>,
    password: Option<String>,
    /// None: the server's default (the user name).
    pub(crate) dbname: Option<String>,
    /// `Disable` for a Unix socket whatever was asked (libpq ignores it there).
    pub(crate) sslmode: SslMode,
    /// Set when the mode verifies the server's certificate.
    pub(crate) sslrootcert: Option<RootCert>,
    /// Client certificate and key, both or neither.
    pub(crate) sslcert: Option<PathBuf>,
    pub(crate) sslkey: Option<PathBuf>,
    pub(crate) application_name: String,
    /// The user's startup options (`options=`), as given.
    pub(crate) options: Option<String>,
    pub(crate) connect_timeout: Option<Duration>,
    /// TCP keepalive and user timeout (TCP connections only).
    pub(crate) tcp: TcpOptions,
    /// Settings accepted without effect, and similar notes, to log once.
    pub warnings: Vec<String>,
    /// Whether `options` came from PGOPTIONS (sqlx reads that itself).
    options_from_env: bool,
}

/// How long the pool waits for a connection unless `connect_timeout` says.
pub(crate) const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The socket options of a TCP connection to PostgreSQL, from libpq's
/// `keepalives*` and `tcp_user_timeout` keywords over leaseq's defaults
/// (module docs). A `None` leaves that value to the operating system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcpOptions {
    /// SO_KEEPALIVE and its timers; None: `keepalives=0`.
    pub(crate) keepalive: Option<Keepalive>,
    /// TCP_USER_TIMEOUT: how long sent data may stay unacknowledged
    /// before the connection is dropped.
    pub(crate) user_timeout: Option<Duration>,
}

/// TCP keepalive timers (TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    pub(crate) idle: Option<Duration>,
    pub(crate) interval: Option<Duration>,
    pub(crate) count: Option<u32>,
}

impl Default for TcpOptions {
    /// leaseq's defaults: a silent peer is dropped within about 30 s.
    fn default() -> Self {
        TcpOptions {
            keepalive: Some(Keepalive {
                idle: Some(Duration::from_secs(15)),
                interval: Some(Duration::from_secs(5)),
                count: Some(3),
            }),
            user_timeout: Some(Duration::from_secs(30)),
        }
    }
}

impl PgTarget {
    #[cfg(test)]
    pub(crate) fn has_password(&self) -> bool {
        self.password.is_some()
    }

    /// How long the pool may wait for a connection: `connect_timeout`, else
    /// [`DEFAULT_ACQUIRE_TIMEOUT`].
    pub(crate) fn acquire_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(DEFAULT_ACQUIRE_TIMEOUT)
    }

    /// sqlx's options, with leaseq's settings added.
    ///
    /// The target goes to sqlx as a URL of query parameters (which its
    /// parser reads right) so that sqlx looks the password up in PGPASSFILE
    /// or `~/.pgpass` for the final host, port, user and database.
    pub fn options(&self) -> Result<PgConnectOptions, PgConnError> {
        let opts: PgConnectOptions = self
            .sqlx_url()
            .parse()
            .map_err(|e| PgConnError(format!("sqlx refused the connection settings: {e}")))?;
        let mut opts = opts
            .ssl_mode(self.sslmode.into())
            .application_name(&self.application_name)
            // Every statement names its schema; the search path only
            // decides where sqlx keeps `_sqlx_migrations`: in our schema,
            // whatever the role is called (a role named `leaseq` would
            // otherwise pick it up via "$user" half-way through the first
            // migration). After the user's options, so it wins.
            .options([
                ("search_path", "leaseq,public"),
                // Short OLTP statements: JIT compiling one (PostgreSQL does
                // when a big table makes its cost estimate high) costs ~0.5 s.
                ("jit", "off"),
            ]);
        match &self.sslrootcert {
            Some(RootCert::File(path)) => opts = opts.ssl_root_cert(path),
            // No extra anchors: only the system's (this also overrides a
            // PGSSLROOTCERT=system that sqlx would take for a file name).
            Some(RootCert::System) => opts = opts.ssl_root_cert_from_pem(Vec::new()),
            None => {}
        }
        if let (Some(cert), Some(key)) = (&self.sslcert, &self.sslkey) {
            opts = opts.ssl_client_cert(cert).ssl_client_key(key);
        }
        Ok(opts)
    }

    fn sqlx_url(&self) -> String {
        let mut q = Query::default();
        match &self.host {
            Host::Socket(dir) => {
                // The first `host` is what sqlx matches in .pgpass (libpq
                // uses `localhost` for a socket); the second is the socket.
                q.push("host", "localhost");
                q.push("host", &dir.to_string_lossy());
            }
            Host::Tcp(name) => q.push("host", name),
        }
        q.push("port", &self.port.to_string());
        let string_options = self.options.as_deref().filter(|_| !self.options_from_env);
        for (k, v) in [
            ("user", self.user.as_deref()),
            ("password", self.password.as_deref()),
            ("dbname", self.dbname.as_deref()),
            // sqlx already put PGOPTIONS in; passing it again would repeat it.
            ("options", string_options),
        ] {
            if let Some(v) = v {
                q.push(k, v);
            }
        }
        format!("postgres:///?{}", q.0)
    }
}

/// `k=v&k=v` with every byte but unreserved ones percent-encoded.
#[derive(Default)]
struct Query(String);

impl Query {
    fn push(&mut self, key: &str, value: &str) {
        use std::fmt::Write;
        if !self.0.is_empty() {
            self.0.push('&');
        }
        self.0.push_str(key);
        self.0.push('=');
        for b in value.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                self.0.push(b as char);
            } else {
                let _ = write!(self.0, "%{b:02X}");
            }
        }
    }
}

impl fmt::Display for PgTarget {
    /// `host=... port=... user=... dbname=... sslmode=...`, no password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Tcp(h) => write!(f, "host={h}")?,
            Host::Socket(d) => write!(f, "host={} (Unix socket)", d.display())?,
        }
        write!(f, " port={}", self.port)?;
        if let Some(u) = &self.user {
            write!(f, " user={u}")?;
        }
        if let Some(d) = &self.dbname {
            write!(f, " dbname={d}")?;
        }
        write!(f, " sslmode={}", self.sslmode.as_str())?;
        match &self.sslrootcert {
            Some(RootCert::File(p)) => write!(f, " sslrootcert={}", p.display())?,
            Some(RootCert::System) => write!(f, " sslrootcert=system")?,
            None => {}
        }
        if let Some(c) = &self.sslcert {
            write!(f, " sslcert={}", c.display())?;
        }
        if self.password.is_some() {
            write!(f, " password=<hidden>")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgTarget({self})")
    }
}

/// Reads `conninfo` (a URI, a keyword/value string, or empty) and the
/// process's PG* variables.
pub fn connect_options(conninfo: &str) -> Result<PgTarget, PgConnError> {
    resolve(conninfo, &|name| std::env::var(name).ok())
}

/// [`connect_options`] with the environment given as a lookup (for tests).
/// `HOME` is read through it too (for `~/.postgresql`).
pub fn resolve(
    conninfo: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PgTarget, PgConnError> {
    let mut settings = Settings::default();
    for (keyword, value, from) in parse_conninfo(conninfo)? {
        settings.set(keyword, value, from);
    }
    settings.fill_from_env(env);
    let mut warnings = Vec::new();
    settings.check_support(&mut warnings)?;
    build(&settings, env, warnings)
}

/// The variable that names a server when DATABASE_URL is unset (PGHOST or
/// PGHOSTADDR), if one is set: leaseq then connects with the PG* variables
/// instead of starting its embedded cluster.
pub fn server_from_env() -> Option<&'static str> {
    ["PGHOST", "PGHOSTADDR"]
        .into_iter()
        .find(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

/// Whether retrying cannot help: the settings are wrong (a file, a
/// keyword) or TLS failed (no TLS on the server, a certificate that does
/// not verify: sqlx reports the latter as an I/O error of kind
/// `InvalidData` from the handshake). Unreachable servers and database
/// errors are retried.
pub fn is_permanent(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Keywords

/// What leaseq does with a libpq keyword.
#[derive(Clone, Copy)]
enum Use {
    /// Read and applied.
    Yes,
    /// Accepted, no effect with sqlx (reported as a warning).
    NoEffect,
    /// These values ask for nothing sqlx lacks; others are refused.
    Only(&'static [&'static str], &'static str),
    /// Refused: the text says why and what to do instead.
    No(&'static str),
}

struct Keyword {
    name: &'static str,
    env: &'static str,
    usage: Use,
}

const fn kw(name: &'static str, env: &'static str, usage: Use) -> Keyword {
    Keyword { name, env, usage }
}

/// libpq's keywords (PostgreSQL 17) and their environment variables.
const KEYWORDS: &[Keyword] = &[
    kw("host", "PGHOST", Use::Yes),
    kw("hostaddr", "PGHOSTADDR", Use::Yes),
    kw("port", "PGPORT", Use::Yes),
    kw("dbname", "PGDATABASE", Use::Yes),
    kw("user", "PGUSER", Use::Yes),
    kw("password", "PGPASSWORD", Use::Yes),
    kw("connect_timeout", "PGCONNECT_TIMEOUT", Use::Yes),
    kw("options", "PGOPTIONS", Use::Yes),
    kw("application_name", "PGAPPNAME", Use::Yes),
    kw("fallback_application_name", "", Use::Yes),
    kw("sslmode", "PGSSLMODE", Use::Yes),
    kw("sslrootcert", "PGSSLROOTCERT", Use::Yes),
    kw("sslcert", "PGSSLCERT", Use::Yes),
    kw("sslkey", "PGSSLKEY", Use::Yes),
    kw(
        "client_encoding",
        "PGCLIENTENCODING",
        Use::Only(
            &[
                "UTF8", "utf8", "UTF-8", "utf-8", "unicode", "UNICODE", "auto",
            ],
            "sqlx always speaks UTF8",
        ),
    ),
    kw("keepalives", "", Use::Yes),
    kw("keepalives_idle", "", Use::Yes),
    kw("keepalives_interval", "", Use::Yes),
    kw("keepalives_count", "", Use::Yes),
    kw("tcp_user_timeout", "", Use::Yes),
    kw("sslcompression", "", Use::NoEffect),
    kw("sslsni", "PGSSLSNI", Use::NoEffect),
    kw(
        "ssl_max_protocol_version",
        "PGSSLMAXPROTOCOLVERSION",
        Use::NoEffect,
    ),
    kw("krbsrvname", "PGKRBSRVNAME", Use::NoEffect),
    kw("gsslib", "PGGSSLIB", Use::NoEffect),
    kw("gssdelegation", "PGGSSDELEGATION", Use::NoEffect),
    kw(
        "ssl_min_protocol_version",
        "PGSSLMINPROTOCOLVERSION",
        Use::Only(
            &["TLSv1", "TLSv1.1", "TLSv1.2"],
            "sqlx's TLS (rustls) speaks TLS 1.2 and 1.3 and cannot be limited to 1.3",
        ),
    ),
    kw(
        "gssencmode",
        "PGGSSENCMODE",
        Use::Only(&["disable", "prefer"], "sqlx has no GSSAPI encryption"),
    ),
    kw(
        "channel_binding",
        "PGCHANNELBINDING",
        Use::Only(&["disable", "prefer"], "sqlx does no SCRAM channel binding"),
    ),
    kw(
        "target_session_attrs",
        "PGTARGETSESSIONATTRS",
        Use::Only(
            &["any"],
            "sqlx connects to one host and does not check its role",
        ),
    ),
    kw(
        "load_balance_hosts",
        "PGLOADBALANCEHOSTS",
        Use::Only(&["disable"], "sqlx connects to one host"),
    ),
    kw(
        "sslnegotiation",
        "PGSSLNEGOTIATION",
        Use::Only(
            &["postgres"],
            "sqlx negotiates TLS the traditional way only",
        ),
    ),
    kw(
        "sslcertmode",
        "PGSSLCERTMODE",
        Use::Only(
            &["allow"],
            "sqlx sends the client certificate whenever sslcert is set",
        ),
    ),
    kw(
        "service",
        "PGSERVICE",
        Use::No(
            "connection service files (pg_service.conf) are not read; put the settings in the string or in PG* variables",
        ),
    ),
    kw(
        "passfile",
        "",
        Use::No("set PGPASSFILE instead (or use ~/.pgpass)"),
    ),
    kw(
        "sslpassword",
        "",
        Use::No(
            "encrypted client keys are not supported; decrypt the key (openssl pkey -in KEY -out KEY2)",
        ),
    ),
    kw(
        "sslcrl",
        "PGSSLCRL",
        Use::No("certificate revocation lists are not supported by sqlx"),
    ),
    kw(
        "sslcrldir",
        "PGSSLCRLDIR",
        Use::No("certificate revocation lists are not supported by sqlx"),
    ),
    kw(
        "requirepeer",
        "PGREQUIREPEER",
        Use::No("sqlx cannot check the server's user on a Unix socket"),
    ),
    kw(
        "require_auth",
        "PGREQUIREAUTH",
        Use::No("sqlx cannot restrict the authentication methods"),
    ),
    kw(
        "replication",
        "",
        Use::No("a broker does not open replication connections"),
    ),
];

fn keyword(name: &str) -> Option<&'static Keyword> {
    KEYWORDS.iter().find(|k| k.name == name)
}

/// A value and where it came from (for messages).
#[derive(Clone, Debug)]
struct Value {
    text: String,
    from: &'static str,
}

#[derive(Default)]
struct Settings(HashMap<&'static str, Value>);

impl Settings {
    /// The last value wins; an empty one counts as not given.
    fn set(&mut self, keyword: &'static str, text: String, from: &'static str) {
        if text.is_empty() {
            self.0.remove(keyword);
        } else {
            self.0.insert(keyword, Value { text, from });
        }
    }

    fn get(&self, keyword: &str) -> Option<&Value> {
        self.0.get(keyword)
    }

    fn text(&self, keyword: &str) -> Option<&str> {
        self.get(keyword).map(|v| v.text.as_str())
    }

    fn fill_from_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let string_names_server = self.get("host").is_some() || self.get("hostaddr").is_some();
        for k in KEYWORDS.iter().filter(|k| !k.env.is_empty()) {
            if self.get(k.name).is_some()
                || (string_names_server && matches!(k.name, "host" | "hostaddr"))
            {
                continue;
            }
            if let Some(text) = env(k.env).filter(|t| !t.is_empty()) {
                self.0.insert(k.name, Value { text, from: k.env });
            }
        }
    }

    fn check_support(&self, warnings: &mut Vec<String>) -> Result<(), PgConnError> {
        let mut names: Vec<&&str> = self.0.keys().collect();
        names.sort();
        for name in names {
            let k = keyword(name).expect("only known keywords are stored");
            let v = &self.0[*name];
            match k.usage {
                Use::Yes => {}
                Use::NoEffect => warnings.push(format!(
                    "{} (from {}) has no effect: sqlx does not support it",
                    k.name, v.from
                )),
                Use::Only(ok, _) if ok.contains(&v.text.as_str()) => {}
                Use::Only(_, why) => {
                    return fail(format!(
                        "{}={:?} (from {}) is not supported: {why}",
                        k.name, v.text, v.from
                    ));
                }
                Use::No(why) => {
                    return fail(format!(
                        "{} (from {}) is not supported: {why}",
                        k.name, v.from
                    ));
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Parsing the string

const URI: &str = "the connection URI";
const KV: &str = "the connection string";

/// `(keyword, value, where)` in order, keywords checked and aliases resolved.
fn parse_conninfo(s: &str) -> Result<Vec<(&'static str, String, &'static str)>, PgConnError> {
    let s = s.trim();
    let (pairs, from) = if let Some(rest) = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
    {
        (parse_uri(rest)?, URI)
    } else if s.is_empty() {
        (Vec::new(), KV)
    } else if let Some((scheme, _)) = s.split_once("://").filter(|(sch, _)| !sch.contains('=')) {
        return fail(format!(
            "unsupported URI scheme {scheme:?}: use postgres:// or postgresql://, or keyword=value pairs"
        ));
    } else {
        (parse_keyword_value(s)?, KV)
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            let (k, v) = canonical(&k, v, from)?;
            Ok((k, v, from))
        })
        .collect()
}

/// Resolves libpq's and sqlx's aliases and refuses unknown keywords.
fn canonical(
    keyword: &str,
    value: String,
    from: &'static str,
) -> Result<(&'static str, String), PgConnError> {
    let (name, value) = match (keyword, from) {
        // libpq, for JDBC's sake (URI only).
        ("ssl", URI) if value == "true" => ("sslmode", "require".to_owned()),
        // libpq's old spelling.
        ("requiressl", _) => {
            let mode = if value.starts_with('1') {
                "require"
            } else {
                "prefer"
            };
            ("sslmode", mode.to_owned())
        }
        // sqlx's spellings, which leaseq's URLs could use before.
        ("ssl-mode", URI) => ("sslmode", value),
        ("ssl-root-cert" | "ssl-ca", URI) => ("sslrootcert", value),
        ("ssl-cert", URI) => ("sslcert", value),
        ("ssl-key", URI) => ("sslkey", value),
        (k, _) => (k, value),
    };
    match keyword_name(name) {
        Some(name) => Ok((name, value)),
        None => fail(format!("{from}: unknown keyword {name:?}")),
    }
}

/// Whether [`canonical`] maps `name` to a keyword.
fn is_alias(name: &str, from: &str) -> bool {
    name == "requiressl"
        || (from == URI
            && matches!(
                name,
                "ssl" | "ssl-mode" | "ssl-root-cert" | "ssl-ca" | "ssl-cert" | "ssl-key"
            ))
}

fn keyword_name(name: &str) -> Option<&'static str> {
    keyword(name).map(|k| k.name)
}

/// libpq's URI grammar, after the scheme:
/// `[user[:password]@][host][:port][,...][/dbname][?keyword=value&...]`.
fn parse_uri(rest: &str) -> Result<Vec<(String, String)>, PgConnError> {
    let mut out = Vec::new();
    let mut p = rest;
    // As libpq: an '@' before the first '/' ends the user information.
    if let Some(at) = p.find(['@', '/']).filter(|&i| p.as_bytes()[i] == b'@') {
        let (user, password) = match p[..at].split_once(':') {
            Some((u, pw)) => (u, Some(pw)),
            None => (&p[..at], None),
        };
        if !user.is_empty() {
            out.push(("user".to_owned(), decode(user, "user name")?));
        }
        if let Some(pw) = password.filter(|pw| !pw.is_empty()) {
            out.push(("password".to_owned(), decode(pw, "password")?));
        }
        p = &p[at + 1..];
    }
    let (hosts, ports, after) = parse_netlocs(p)?;
    if hosts.len() > 1 {
        return fail(several_hosts(URI, &hosts.join(",")));
    }
    if !hosts[0].is_empty() {
        out.push(("host".to_owned(), decode(&hosts[0], "host")?));
    }
    if after.contains('@') && !ports[0].bytes().all(|b| b.is_ascii_digit()) {
        // `postgres://user:pa/ss@host`: the '/' ended the host part early,
        // and the "port" is a piece of the password, not to be shown.
        return fail(format!(
            "{URI}: the part after the host is not a port number; if the user name or password \
             holds \"/\", \"?\", \"@\" or \":\", percent-encode it (%2F, %3F, %40, %3A)"
        ));
    }
    if !ports[0].is_empty() {
        out.push(("port".to_owned(), decode(&ports[0], "port")?));
    }
    let mut p = after;
    if let Some(db) = p.strip_prefix('/') {
        let end = db.find('?').unwrap_or(db.len());
        if end > 0 {
            out.push(("dbname".to_owned(), decode(&db[..end], "database name")?));
        }
        p = &db[end..];
    }
    if let Some(query) = p.strip_prefix('?') {
        out.extend(parse_query(query)?);
    }
    Ok(out)
}

/// The comma-separated `host[:port]` list (hosts still percent-encoded),
/// and what follows it.
fn parse_netlocs(mut p: &str) -> Result<(Vec<String>, Vec<String>, &str), PgConnError> {
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    loop {
        let host;
        if let Some(v6) = p.strip_prefix('[') {
            let Some(end) = v6.find(']') else {
                return fail(format!("{URI}: IPv6 address without its closing \"]\""));
            };
            if end == 0 {
                return fail(format!("{URI}: empty IPv6 address \"[]\""));
            }
            host = &v6[..end];
            p = &v6[end + 1..];
            if !(p.is_empty() || p.starts_with([':', '/', '?', ','])) {
                return fail(format!(
                    "{URI}: unexpected {:?} after the IPv6 address (expected \":\", \"/\" or \"?\")",
                    p.chars().next().unwrap_or_default()
                ));
            }
        } else {
            let end = p.find([':', '/', '?', ',']).unwrap_or(p.len());
            host = &p[..end];
            p = &p[end..];
        }
        let mut port = "";
        if let Some(r) = p.strip_prefix(':') {
            let end = r.find(['/', '?', ',']).unwrap_or(r.len());
            port = &r[..end];
            p = &r[end..];
        }
        hosts.push(host.to_owned());
        ports.push(port.to_owned());
        match p.strip_prefix(',') {
            Some(r) => p = r,
            None => return Ok((hosts, ports, p)),
        }
    }
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, PgConnError> {
    let mut out: Vec<(String, String)> = Vec::new();
    if query.is_empty() {
        return Ok(out);
    }
    for param in query.split('&') {
        let after_password = out.last().is_some_and(|(k, _)| k == "password");
        let Some((k, v)) = param.split_once('=') else {
            return fail(format!(
                "{URI}: parameter {} has no \"=\" (expected keyword=value; percent-encode \"&\" in a value as %26)",
                shown_token(param, after_password)
            ));
        };
        let k = decode(k, "parameter name")?;
        if keyword_name(&k).is_none() && !is_alias(&k, URI) {
            return fail(format!(
                "{URI}: unknown parameter {}",
                shown_token(&k, after_password)
            ));
        }
        if v.contains('=') {
            return fail(format!(
                "{URI}: parameter {k:?} has a second \"=\" (percent-encode it as %3D)"
            ));
        }
        let what = if k == "password" {
            "password"
        } else {
            "parameter value"
        };
        let v = decode(v, what)?;
        out.push((k, v));
    }
    Ok(out)
}

/// libpq's percent-decoding: `%XX` only, `%00` refused, UTF-8 required.
/// Messages show no value when `what` is the password.
fn decode(s: &str, what: &str) -> Result<String, PgConnError> {
    let shown = |s: &str| {
        if what == "password" {
            String::new()
        } else {
            format!(" {s:?}")
        }
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match hex {
            Some(0) => return fail(format!("{URI}: %00 in the {what}{}", shown(s))),
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                return fail(format!(
                    "{URI}: invalid percent-encoding in the {what}{} (\"%\" must be followed by two hex digits; write a literal % as %25)",
                    shown(s)
                ));
            }
        }
    }
    String::from_utf8(out).or_else(|_| {
        fail(format!(
            "{URI}: the {what}{} is not UTF-8 once decoded",
            shown(s)
        ))
    })
}

/// libpq's keyword/value syntax: `keyword = value`, values unquoted (up to
/// whitespace) or in single quotes; a backslash escapes the next character.
fn parse_keyword_value(s: &str) -> Result<Vec<(String, String)>, PgConnError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut chars = s.chars().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut chars);
        if chars.peek().is_none() {
            return Ok(out);
        }
        let after_password = out.last().is_some_and(|(k, _)| k == "password");
        let mut keyword = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            keyword.push(c);
        }
        skip_ws(&mut chars);
        if chars.next() != Some('=') {
            return fail(format!(
                "{KV}: missing \"=\" after {} (expected keyword=value pairs, a value with spaces in \
                 single quotes, or a postgres:// URI)",
                shown_token(&keyword, after_password)
            ));
        }
        if keyword_name(&keyword).is_none() && !is_alias(&keyword, KV) {
            return fail(format!(
                "{KV}: unknown keyword {}{}",
                shown_token(&keyword, after_password),
                if after_password {
                    " (a password with spaces must be in single quotes)"
                } else {
                    ""
                }
            ));
        }
        skip_ws(&mut chars);
        let value = keyword_value(&mut chars, &keyword)?;
        out.push((keyword, value));
    }
}

fn keyword_value(
    chars: &mut std::iter::Peekable<std::str::Chars>,
    keyword: &str,
) -> Result<String, PgConnError> {
    let mut value = String::new();
    if chars.next_if_eq(&'\'').is_some() {
        loop {
            match chars.next() {
                Some('\\') => match chars.next() {
                    Some(c) => value.push(c),
                    None => break,
                },
                Some('\'') => return Ok(value),
                Some(c) => value.push(c),
                None => break,
            }
        }
        return fail(format!(
            "{KV}: the quoted value of {keyword:?} has no closing quote"
        ));
    }
    while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
        if c == '\\' {
            if let Some(n) = chars.next() {
                value.push(n);
            }
        } else {
            value.push(c);
        }
    }
    Ok(value)
}

/// A token for an error message: quoted if it looks like a keyword and
/// cannot be a piece of a password, else described.
fn shown_token(token: &str, after_password: bool) -> String {
    let keyword_like = !token.is_empty()
        && token
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '-');
    if keyword_like && !after_password {
        format!("{token:?}")
    } else {
        "a word that is not a keyword".to_owned()
    }
}

// ---------------------------------------------------------------------------
// Building the target

fn several_hosts(from: &str, hosts: &str) -> String {
    format!(
        "{from} names several hosts ({hosts}): sqlx, leaseq's PostgreSQL driver, connects to one host; \
         give one (the primary's address, or a proxy such as PgBouncer in session mode or HAProxy)"
    )
}

fn build(
    s: &Settings,
    env: &dyn Fn(&str) -> Option<String>,
    mut warnings: Vec<String>,
) -> Result<PgTarget, PgConnError> {
    let port = port(s)?;
    let mut sslmode = sslmode(s, &mut warnings)?;
    let host = host(s, port, sslmode)?;
    let tls = if matches!(host, Host::Tcp(_)) && sslmode != SslMode::Disable {
        let home = env("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        tls_files(s, &mut sslmode, home.as_deref())?
    } else {
        // libpq ignores sslmode on a Unix socket; the server refuses TLS there.
        sslmode = SslMode::Disable;
        TlsFiles::default()
    };
    let application_name = s
        .text("application_name")
        .or_else(|| s.text("fallback_application_name"))
        .unwrap_or("leaseq")
        .to_owned();
    Ok(PgTarget {
        host,
        port,
        user: s.text("user").map(str::to_owned),
        password: s.text("password").map(str::to_owned),
        dbname: s.text("dbname").map(str::to_owned),
        sslmode,
        sslrootcert: tls.root,
        sslcert: tls.cert,
        sslkey: tls.key,
        application_name,
        options: s.text("options").map(str::to_owned),
        options_from_env: s.get("options").is_some_and(|v| v.from == "PGOPTIONS"),
        connect_timeout: connect_timeout(s)?,
        tcp: tcp_options(s)?,
        warnings,
    })
}

/// A whole, non-negative number for `keyword`, if given.
fn whole(s: &Settings, keyword: &str, unit: &str) -> Result<Option<u64>, PgConnError> {
    let Some(v) = s.get(keyword) else {
        return Ok(None);
    };
    match v.text.trim().parse::<u64>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => fail(format!(
            "{keyword} {:?} (from {}) is not a whole number of {unit}",
            v.text, v.from
        )),
    }
}

/// libpq's `keepalives*` and `tcp_user_timeout` over leaseq's defaults
/// ([`TcpOptions::default`]); 0 leaves a value to the system, as in libpq.
fn tcp_options(s: &Settings) -> Result<TcpOptions, PgConnError> {
    let ours = TcpOptions::default();
    let default = ours.keepalive.expect("on by default");
    let on = match whole(s, "keepalives", "(0 or 1)")? {
        None => true,
        Some(n) => n != 0,
    };
    let secs = |keyword, ours: Option<Duration>| -> Result<Option<Duration>, PgConnError> {
        Ok(match whole(s, keyword, "seconds")? {
            None => ours,
            Some(0) => None,
            Some(n) => Some(Duration::from_secs(n)),
        })
    };
    let keepalive = Keepalive {
        idle: secs("keepalives_idle", default.idle)?,
        interval: secs("keepalives_interval", default.interval)?,
        count: match whole(s, "keepalives_count", "probes")? {
            None => default.count,
            Some(0) => None,
            Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        },
    };
    let user_timeout = match whole(s, "tcp_user_timeout", "milliseconds")? {
        None => ours.user_timeout,
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
    };
    Ok(TcpOptions {
        keepalive: on.then_some(keepalive),
        user_timeout,
    })
}

fn port(s: &Settings) -> Result<u16, PgConnError> {
    let Some(v) = s.get("port") else {
        return Ok(5432);
    };
    if v.text.contains(',') {
        return fail(several_hosts(v.from, &format!("ports {}", v.text)));
    }
    match v.text.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => fail(format!(
            "port {:?} (from {}) is not a port number (1 to 65535)",
            v.text, v.from
        )),
    }
}

fn sslmode(s: &Settings, warnings: &mut Vec<String>) -> Result<SslMode, PgConnError> {
    let Some(v) = s.get("sslmode") else {
        return Ok(SslMode::Prefer);
    };
    Ok(match v.text.to_ascii_lowercase().as_str() {
        "disable" => SslMode::Disable,
        "allow" => {
            warnings.push(format!(
                "sslmode=allow (from {}) is treated as prefer: sqlx has no allow",
                v.from
            ));
            SslMode::Prefer
        }
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        _ => {
            return fail(format!(
                "sslmode {:?} (from {}) is not one of disable, allow, prefer, require, verify-ca, verify-full",
                v.text, v.from
            ));
        }
    })
}

fn host(s: &Settings, port: u16, sslmode: SslMode) -> Result<Host, PgConnError> {
    let host = match s.get("host") {
        Some(v) if v.text.contains(',') => return fail(several_hosts(v.from, &v.text)),
        Some(v) if v.text.starts_with('/') => Some(Host::Socket(PathBuf::from(&v.text))),
        Some(v) if v.text.starts_with('@') => {
            return fail(format!(
                "host {:?} (from {}): abstract Unix sockets are not supported by sqlx",
                v.text, v.from
            ));
        }
        Some(v) => Some(Host::Tcp(
            v.text
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        )),
        None => None,
    };
    let Some(addr) = s.get("hostaddr") else {
        return Ok(host.unwrap_or_else(|| default_host(port)));
    };
    if addr.text.contains(',') {
        return fail(several_hosts(addr.from, &addr.text));
    }
    if addr.text.parse::<IpAddr>().is_err() {
        return fail(format!(
            "hostaddr {:?} (from {}) is not an IP address",
            addr.text, addr.from
        ));
    }
    if let Some(Host::Tcp(name)) = &host
        && sslmode == SslMode::VerifyFull
        && *name != addr.text
    {
        return fail(format!(
            "host {name:?} with hostaddr {:?} under sslmode=verify-full is not supported: sqlx checks the \
             certificate against the address it connects to; give the host name alone",
            addr.text
        ));
    }
    Ok(Host::Tcp(addr.text.clone()))
}

/// libpq's default: the Unix socket in its usual directories, else
/// localhost over TCP (sqlx's default too).
fn default_host(port: u16) -> Host {
    let socket = format!(".s.PGSQL.{port}");
    ["/var/run/postgresql", "/private/tmp", "/tmp"]
        .into_iter()
        .map(PathBuf::from)
        .find(|d| d.join(&socket).exists())
        .map(Host::Socket)
        .unwrap_or_else(|| Host::Tcp("localhost".to_owned()))
}

fn connect_timeout(s: &Settings) -> Result<Option<Duration>, PgConnError> {
    let Some(v) = s.get("connect_timeout") else {
        return Ok(None);
    };
    match v.text.trim().parse::<i64>() {
        Ok(secs) if secs <= 0 => Ok(None),
        // libpq's minimum.
        Ok(secs) => Ok(Some(Duration::from_secs(secs.max(2) as u64))),
        Err(_) => fail(format!(
            "connect_timeout {:?} (from {}) is not a whole number of seconds",
            v.text, v.from
        )),
    }
}

#[derive(Default)]
struct TlsFiles {
    root: Option<RootCert>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// The certificate files for a TCP connection that may use TLS, checked.
/// Raises `require` to `verify-ca` when there is a root certificate (libpq).
fn tls_files(
    s: &Settings,
    sslmode: &mut SslMode,
    home: Option<&Path>,
) -> Result<TlsFiles, PgConnError> {
    let dot = home.map(|h| h.join(".postgresql"));
    let default = |name: &str| dot.as_ref().map(|d| d.join(name)).filter(|p| p.exists());
    let root = match s.get("sslrootcert") {
        Some(v) if v.text == "system" => {
            if *sslmode != SslMode::VerifyFull {
                return fail(format!(
                    "sslrootcert=system (from {}) needs sslmode=verify-full (sslmode is {}), as in libpq",
                    v.from,
                    sslmode.as_str()
                ));
            }
            Some((RootCert::System, v.from))
        }
        Some(v) => Some((RootCert::File(PathBuf::from(&v.text)), v.from)),
        None => {
            default("root.crt").map(|p| (RootCert::File(p), "the default ~/.postgresql/root.crt"))
        }
    };
    if *sslmode == SslMode::Require && root.is_some() {
        *sslmode = SslMode::VerifyCa;
    }
    if sslmode.verifies() && root.is_none() {
        return fail(format!(
            "sslmode={} needs the CA certificate to verify the server with: set sslrootcert=FILE \
             (or PGSSLROOTCERT), put it in ~/.postgresql/root.crt, or use sslrootcert=system for \
             the system's trusted roots (verify-full only)",
            sslmode.as_str()
        ));
    }
    let mut files = TlsFiles::default();
    if sslmode.verifies()
        && let Some((root, from)) = root
    {
        if let RootCert::File(path) = &root {
            check_pem(path, "sslrootcert", from, Pem::Certificate)?;
        }
        files.root = Some(root);
    }
    let cert = match s.get("sslcert") {
        Some(v) => Some((PathBuf::from(&v.text), v.from)),
        None => default("postgresql.crt").map(|p| (p, "the default ~/.postgresql/postgresql.crt")),
    };
    let key = match s.get("sslkey") {
        Some(v) => Some((PathBuf::from(&v.text), v.from)),
        None => default("postgresql.key").map(|p| (p, "the default ~/.postgresql/postgresql.key")),
    };
    match (cert, key) {
        (Some((cert, cfrom)), Some((key, kfrom))) => {
            check_pem(&cert, "sslcert", cfrom, Pem::Certificate)?;
            check_pem(&key, "sslkey", kfrom, Pem::Key)?;
            check_key_mode(&key, kfrom)?;
            files.cert = Some(cert);
            files.key = Some(key);
        }
        (Some((cert, from)), None) => {
            return fail(format!(
                "sslcert {:?} (from {from}) has no key: set sslkey (or PGSSLKEY)",
                cert.display()
            ));
        }
        (None, Some((key, from))) if s.get("sslkey").is_some() => {
            return fail(format!(
                "sslkey {:?} (from {from}) has no certificate: set sslcert (or PGSSLCERT)",
                key.display()
            ));
        }
        _ => {}
    }
    Ok(files)
}

#[derive(Clone, Copy, PartialEq)]
enum Pem {
    Certificate,
    Key,
}

fn check_pem(path: &Path, keyword: &str, from: &str, kind: Pem) -> Result<(), PgConnError> {
    let shown = path.display();
    let bytes = std::fs::read(path).or_else(|e| {
        fail(format!(
            "{keyword} {shown:?} (from {from}) cannot be read: {e}"
        ))
    })?;
    let text = String::from_utf8_lossy(&bytes);
    match kind {
        Pem::Certificate if !text.contains("-----BEGIN CERTIFICATE-----") => fail(format!(
            "{keyword} {shown:?} (from {from}) holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )),
        Pem::Key if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") => fail(format!(
            "sslkey {shown:?} (from {from}) is encrypted, which sqlx does not support: decrypt it \
             (openssl pkey -in KEY -out KEY2)"
        )),
        Pem::Key if !text.contains("PRIVATE KEY-----") => fail(format!(
            "sslkey {shown:?} (from {from}) holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        )),
        _ => Ok(()),
    }
}

/// libpq's rule: a key file owned by root may be 0640 or less, any other
/// 0600 or less.
fn check_key_mode(path: &Path, from: &str) -> Result<(), PgConnError> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).or_else(|e| {
        fail(format!(
            "sslkey {:?} (from {from}) cannot be read: {e}",
            path.display()
        ))
    })?;
    let too_open = if md.uid() == 0 {
        md.mode() & 0o037 != 0
    } else {
        md.mode() & 0o077 != 0
    };
    if too_open {
        return fail(format!(
            "sslkey {:?} (from {from}) has group or world access (mode {:o}): it must be u=rw (0600) \
             or less, or u=rw,g=r (0640) or less if owned by root, as libpq requires",
            path.display(),
            md.mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn with_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    fn ok(s: &str) -> PgTarget {
        resolve(s, &no_env).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn ok_env(s: &str, vars: &[(&str, &str)]) -> PgTarget {
        resolve(s, &with_env(vars)).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(s: &str) -> String {
        err_env(s, &[])
    }

    fn err_env(s: &str, vars: &[(&str, &str)]) -> String {
        match resolve(s, &with_env(vars)) {
            Ok(t) => panic!("{s:?} was accepted: {t}"),
            Err(e) => e.to_string(),
        }
    }

    fn tcp(h: &str) -> Host {
        Host::Tcp(h.to_owned())
    }

    fn socket(d: &str) -> Host {
        Host::Socket(PathBuf::from(d))
    }

    /// A private directory for certificate files.
    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!("leaseq-pgconn-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn uri_with_empty_host_and_socket_parameter() {
        let t = ok("postgresql://postgres@/mydb?host=/var/run/postgresql");
        assert_eq!(t.host, socket("/var/run/postgresql"));
        assert_eq!(t.user.as_deref(), Some("postgres"));
        assert_eq!(t.dbname.as_deref(), Some("mydb"));
        assert_eq!(t.port, 5432);
        // libpq ignores sslmode on a socket; so does leaseq.
        assert_eq!(t.sslmode, SslMode::Disable);
        let o = t.options().unwrap();
        assert_eq!(
            o.get_socket().map(|p| p.as_path()),
            Some(Path::new("/var/run/postgresql"))
        );
        assert_eq!(o.get_username(), "postgres");
        assert_eq!(o.get_database(), Some("mydb"));
    }

    #[test]
    fn uri_with_percent_encoded_socket_as_host() {
        let t = ok("postgresql://%2Fvar%2Frun%2Fpostgresql:6432/mydb");
        assert_eq!(t.host, socket("/var/run/postgresql"));
        assert_eq!(t.port, 6432);
        assert_eq!(t.dbname.as_deref(), Some("mydb"));
    }

    #[test]
    fn uri_with_ipv6_address() {
        let t = ok("postgres://u:p@[::1]:6543/db");
        assert_eq!(t.host, tcp("::1"));
        assert_eq!(t.port, 6543);
        let o = t.options().unwrap();
        assert_eq!(o.get_host(), "::1");
        assert_eq!(o.get_port(), 6543);
        assert!(o.get_socket().is_none());
        assert!(err("postgres://[::1/db").contains("closing \"]\""));
        assert!(err("postgres://[]/db").contains("empty IPv6"));
        assert!(err("postgres://[::1]x/db").contains("after the IPv6 address"));
    }

    #[test]
    fn uri_forms_without_host() {
        let t = ok("postgres:///mydb");
        assert_eq!(t.dbname.as_deref(), Some("mydb"));
        assert!(t.user.is_none());
        let t = ok("postgresql://");
        assert!(t.dbname.is_none());
        assert_eq!(t.port, 5432);
        let t = ok("postgresql://?dbname=x&user=y&port=5433&host=h");
        assert_eq!(
            (t.host, t.port, t.user, t.dbname),
            (tcp("h"), 5433, Some("y".into()), Some("x".into()))
        );
    }

    #[test]
    fn uri_query_parameters() {
        let t = ok(
            "postgres://app:s%40c%2Fret@db.example.com/prod?sslmode=require&application_name=worker\
             &connect_timeout=7&options=-c%20statement_timeout%3D5s&keepalives=1&sslsni=1",
        );
        assert_eq!(t.host, tcp("db.example.com"));
        assert_eq!(t.password.as_deref(), Some("s@c/ret"));
        assert_eq!(t.sslmode, SslMode::Require);
        assert_eq!(t.application_name, "worker");
        assert_eq!(t.connect_timeout, Some(Duration::from_secs(7)));
        assert_eq!(t.acquire_timeout(), Duration::from_secs(7));
        assert_eq!(t.options.as_deref(), Some("-c statement_timeout=5s"));
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(t.warnings[0].contains("sslsni"));
        assert_eq!(t.tcp, TcpOptions::default());
        // '+' is a plus in libpq's URIs.
        assert_eq!(ok("postgres://u:a+b@h/").password.as_deref(), Some("a+b"));
    }

    #[test]
    fn uri_tls_parameters() {
        let dir = scratch();
        let ca = write(&dir, "ca.crt", CERT, 0o644);
        let cert = write(&dir, "client.crt", CERT, 0o644);
        let key = write(&dir, "client.key", KEY, 0o600);
        let t = ok(&format!(
            "postgres://h/db?sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"
        ));
        assert_eq!(t.sslmode, SslMode::VerifyFull);
        assert_eq!(t.sslrootcert, Some(RootCert::File(ca.clone().into())));
        assert_eq!(t.sslcert, Some(cert.into()));
        assert_eq!(t.sslkey, Some(key.into()));
        assert!(matches!(
            t.options().unwrap().get_ssl_mode(),
            PgSslMode::VerifyFull
        ));
        // sqlx's spellings still work; libpq's ssl=true is require.
        let t = ok(&format!(
            "postgres://h/db?ssl-mode=verify-ca&ssl-root-cert={ca}"
        ));
        assert_eq!(t.sslmode, SslMode::VerifyCa);
        assert_eq!(ok("postgres://h/db?ssl=true").sslmode, SslMode::Require);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn keyword_value_string() {
        let t = ok("host=/var/run/postgresql dbname=mydb user=x password='a b'");
        assert_eq!(t.host, socket("/var/run/postgresql"));
        assert_eq!(t.dbname.as_deref(), Some("mydb"));
        assert_eq!(t.user.as_deref(), Some("x"));
        assert_eq!(t.password.as_deref(), Some("a b"));
        let t = ok(r"host = db.example.com  port= 5433 password='it\'s \\ ok' user=a\ b");
        assert_eq!(t.host, tcp("db.example.com"));
        assert_eq!(t.port, 5433);
        assert_eq!(t.password.as_deref(), Some(r"it's \ ok"));
        assert_eq!(t.user.as_deref(), Some("a b"));
        let t = ok("options='-c geqo=off' application_name=''");
        assert_eq!(t.options.as_deref(), Some("-c geqo=off"));
        // An empty value counts as not given.
        assert_eq!(t.application_name, "leaseq");
        assert_eq!(ok("requiressl=1 host=h").sslmode, SslMode::Require);
    }

    #[test]
    fn keyword_value_errors() {
        assert!(err("host=x dbname").contains(r#"missing "=" after "dbname""#));
        assert!(err("mydb").contains("missing \"=\""));
        assert!(err("host=x foo=1").contains(r#"unknown keyword "foo""#));
        let e = err("password='abc");
        assert!(
            e.contains(r#"quoted value of "password" has no closing quote"#),
            "{e}"
        );
        assert!(!e.contains("abc"));
    }

    #[test]
    fn uri_errors_name_the_part() {
        assert!(err("postgres://h/db?foo=1").contains(r#"unknown parameter "foo""#));
        assert!(err("postgres://h/db?sslmode").contains("has no \"=\""));
        assert!(err("postgres://h/db?sslmode=a=b").contains("second \"=\""));
        assert!(
            err("postgres://h/db%zz").contains("invalid percent-encoding in the database name")
        );
        assert!(err("postgres://h/db%00").contains("%00"));
        let e = err("postgres://h:54x2/db");
        assert!(
            e.contains(r#"port "54x2""#) && e.contains("connection URI"),
            "{e}"
        );
        assert!(err("postgres://h:0/db").contains("not a port number"));
        assert!(err("postgres://h:70000/db").contains("not a port number"));
        assert!(err("mysql://h/db").contains("unsupported URI scheme \"mysql\""));
        assert!(err("postgres://h/db?sslmode=verify").contains(r#"sslmode "verify""#));
    }

    #[test]
    fn passwords_never_appear_in_messages() {
        for (s, secret) in [
            ("postgres://u:Xyzzy/Plugh@h/db", "Plugh"),
            ("postgres://u:Xyzzy/Plugh@h/db", "Xyzzy"),
            ("postgres://u:%zzXyzzy@h/db", "Xyzzy"),
            ("postgres://h/db?password=%zzXyzzy", "Xyzzy"),
            ("postgres://h/db?password=Xyzzy&plugh", "plugh"),
            ("host=h password=xyzzy plugh", "plugh"),
            ("host=h password=xyzzy plugh=1", "plugh"),
            ("password='xyzzy", "xyzzy"),
        ] {
            let e = err(s);
            assert!(!e.contains(secret), "{s:?} → {e}");
        }
        let t = ok("host=h user=u password=Xyzzy");
        assert!(!t.to_string().contains("Xyzzy"));
        assert!(!format!("{t:?}").contains("Xyzzy"));
        assert!(t.to_string().contains("password=<hidden>"));
        assert!(t.has_password());
    }

    #[test]
    fn several_hosts_are_refused_with_the_reason() {
        for s in [
            "postgres://h1,h2/db",
            "postgres://h1:5432,h2:5433/db",
            "host=h1,h2",
            "host=h port=5432,5433",
            "hostaddr=10.0.0.1,10.0.0.2",
        ] {
            let e = err(s);
            assert!(e.contains("several hosts") && e.contains("one host"), "{e}");
        }
        assert!(err_env("", &[("PGHOST", "a,b")]).contains("PGHOST names several hosts"));
    }

    #[test]
    fn environment_fills_what_the_string_does_not_say() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "6000"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpw"),
            ("PGDATABASE", "envdb"),
            ("PGAPPNAME", "envapp"),
            ("PGCONNECT_TIMEOUT", "3"),
            ("PGOPTIONS", "-c geqo=off"),
        ];
        let t = ok_env("", &env);
        assert_eq!(t.host, tcp("envhost"));
        assert_eq!(t.port, 6000);
        assert_eq!(t.user.as_deref(), Some("envuser"));
        assert_eq!(t.password.as_deref(), Some("envpw"));
        assert_eq!(t.dbname.as_deref(), Some("envdb"));
        assert_eq!(t.application_name, "envapp");
        assert_eq!(t.connect_timeout, Some(Duration::from_secs(3)));
        assert_eq!(t.options.as_deref(), Some("-c geqo=off"));
        // The string wins, the environment fills the rest.
        let t = ok_env("postgres://a@h1:1/db", &env);
        assert_eq!((t.host, t.port), (tcp("h1"), 1));
        assert_eq!(t.user.as_deref(), Some("a"));
        assert_eq!(t.dbname.as_deref(), Some("db"));
        assert_eq!(t.password.as_deref(), Some("envpw"));
        // A string naming its server keeps PGHOSTADDR out (and PGHOST).
        let t = ok_env("host=h1", &[("PGHOSTADDR", "10.9.9.9")]);
        assert_eq!(t.host, tcp("h1"));
        let t = ok_env("dbname=x", &[("PGHOSTADDR", "10.9.9.9")]);
        assert_eq!(t.host, tcp("10.9.9.9"));
        // Empty variables count as unset; bad ones name themselves.
        assert_eq!(ok_env("host=h", &[("PGPORT", "")]).port, 5432);
        let e = err_env("host=h", &[("PGPORT", "x")]);
        assert!(e.contains("PGPORT"), "{e}");
        let e = err_env("host=h", &[("PGSSLMODE", "on")]);
        assert!(e.contains("PGSSLMODE"), "{e}");
        // A socket directory in PGHOST.
        let t = ok_env("", &[("PGHOST", "/run/pg"), ("PGSSLMODE", "require")]);
        assert_eq!((t.host, t.sslmode), (socket("/run/pg"), SslMode::Disable));
    }

    #[test]
    fn unsupported_keywords_say_why() {
        let e = err("host=h service=foo");
        assert!(
            e.contains("service (from the connection string) is not supported"),
            "{e}"
        );
        let e = err_env("host=h", &[("PGSSLCRL", "/x.crl")]);
        assert!(e.contains("sslcrl (from PGSSLCRL)"), "{e}");
        let e = err("host=h target_session_attrs=read-write");
        assert!(e.contains("target_session_attrs=\"read-write\""), "{e}");
        assert!(err("postgres://h/?passfile=/x").contains("PGPASSFILE"));
        assert!(err("host=h client_encoding=LATIN1").contains("UTF8"));
        ok("host=h target_session_attrs=any gssencmode=prefer client_encoding=UTF8");
        assert!(err("host=h gssencmode=require").contains("GSSAPI"));
        assert!(err("host=@abstract").contains("abstract"));
    }

    #[test]
    fn sslmodes() {
        assert_eq!(ok("host=h").sslmode, SslMode::Prefer);
        assert_eq!(ok("host=h sslmode=disable").sslmode, SslMode::Disable);
        let t = ok("host=h sslmode=allow");
        assert_eq!(t.sslmode, SslMode::Prefer);
        assert!(t.warnings[0].contains("allow"));
        assert_eq!(ok("host=h sslmode=REQUIRE").sslmode, SslMode::Require);
        // No certificate to verify with.
        for mode in ["verify-ca", "verify-full"] {
            let e = err(&format!("host=h sslmode={mode}"));
            assert!(e.contains("sslrootcert") && e.contains(mode), "{e}");
        }
        // The system's roots, verify-full only (libpq's rule).
        let t = ok("host=h sslmode=verify-full sslrootcert=system");
        assert_eq!(t.sslrootcert, Some(RootCert::System));
        assert!(err("host=h sslmode=require sslrootcert=system").contains("verify-full"));
        // Over a socket sslmode is ignored and no file is looked at.
        let t = ok("host=/tmp sslmode=verify-full sslrootcert=/nonexistent");
        assert_eq!(t.sslmode, SslMode::Disable);
        // With disable no file is looked at either.
        ok("host=h sslmode=disable sslrootcert=/nonexistent sslcert=/nonexistent");
    }

    #[test]
    fn tls_files_are_checked_at_once() {
        let dir = scratch();
        let ca = write(&dir, "ca.crt", CERT, 0o644);
        let junk = write(&dir, "junk.crt", "hello", 0o644);
        let cert = write(&dir, "c.crt", CERT, 0o644);
        let key = write(&dir, "c.key", KEY, 0o600);
        let open_key = write(&dir, "open.key", KEY, 0o644);
        let enc = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nx\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let enc_key = write(&dir, "enc.key", enc, 0o600);
        // require with a root certificate verifies it (libpq: as verify-ca).
        let t = ok(&format!("host=h sslmode=require sslrootcert={ca}"));
        assert_eq!(t.sslmode, SslMode::VerifyCa);
        let e = err("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.crt");
        assert!(e.contains("sslrootcert \"/nonexistent/ca.crt\"") && e.contains("cannot be read"));
        let e = err(&format!("host=h sslmode=verify-ca sslrootcert={junk}"));
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = err(&format!("host=h sslcert={cert}"));
        assert!(e.contains("has no key"), "{e}");
        let e = err(&format!("host=h sslkey={key}"));
        assert!(e.contains("has no certificate"), "{e}");
        let e = err(&format!("host=h sslcert={cert} sslkey={open_key}"));
        assert!(e.contains("group or world access"), "{e}");
        let e = err(&format!("host=h sslcert={cert} sslkey={enc_key}"));
        assert!(e.contains("encrypted"), "{e}");
        let e = err(&format!("host=h sslcert={cert} sslkey={cert}"));
        assert!(e.contains("no PEM private key"), "{e}");
        let e = err_env(
            "host=h sslmode=verify-full",
            &[("PGSSLROOTCERT", "/nonexistent/x")],
        );
        assert!(e.contains("PGSSLROOTCERT"), "{e}");
        let t = ok(&format!("host=h sslcert={cert} sslkey={key}"));
        assert_eq!(t.sslcert.as_deref(), Some(Path::new(&cert)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn defaults_in_home_dot_postgresql() {
        let home = scratch();
        let dot = home.join(".postgresql");
        std::fs::create_dir(&dot).unwrap();
        write(&dot, "root.crt", CERT, 0o644);
        let h = home.to_string_lossy().into_owned();
        let t = ok_env("host=h sslmode=require", &[("HOME", &h)]);
        assert_eq!(t.sslmode, SslMode::VerifyCa);
        assert_eq!(t.sslrootcert, Some(RootCert::File(dot.join("root.crt"))));
        write(&dot, "postgresql.crt", CERT, 0o644);
        write(&dot, "postgresql.key", KEY, 0o600);
        let t = ok_env("host=h", &[("HOME", &h)]);
        assert_eq!(t.sslcert, Some(dot.join("postgresql.crt")));
        assert_eq!(t.sslkey, Some(dot.join("postgresql.key")));
        std::fs::remove_dir_all(home).unwrap();
    }

    #[test]
    fn hostaddr() {
        assert_eq!(ok("hostaddr=127.0.0.1").host, tcp("127.0.0.1"));
        assert_eq!(ok("host=db hostaddr=::1").host, tcp("::1"));
        assert!(err("hostaddr=db.example.com").contains("not an IP address"));
        let e = err("host=db hostaddr=10.0.0.1 sslmode=verify-full sslrootcert=system");
        assert!(e.contains("verify-full"), "{e}");
    }

    #[test]
    fn connect_timeout_and_application_name() {
        assert_eq!(
            ok("host=h connect_timeout=1").connect_timeout,
            Some(Duration::from_secs(2))
        );
        assert_eq!(ok("host=h connect_timeout=0").connect_timeout, None);
        assert_eq!(ok("host=h").acquire_timeout(), DEFAULT_ACQUIRE_TIMEOUT);
        assert!(err("host=h connect_timeout=5s").contains("connect_timeout \"5s\""));
        assert_eq!(ok("host=h").application_name, "leaseq");
        assert_eq!(
            ok("host=h fallback_application_name=f").application_name,
            "f"
        );
        let t = ok_env("host=h fallback_application_name=f", &[("PGAPPNAME", "e")]);
        assert_eq!(t.application_name, "e");
    }

    #[test]
    fn keepalives_and_tcp_user_timeout() {
        let secs = |n| Some(Duration::from_secs(n));
        // leaseq's defaults, when the string says nothing.
        let t = ok("host=h");
        let k = t.tcp.keepalive.unwrap();
        assert_eq!((k.idle, k.interval, k.count), (secs(15), secs(5), Some(3)));
        assert_eq!(t.tcp.user_timeout, secs(30));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        // libpq's keywords, in either form; 0 leaves a value to the system.
        let t = ok("postgres://h/db?keepalives_idle=7&keepalives_interval=2\
             &keepalives_count=0&tcp_user_timeout=1500");
        let k = t.tcp.keepalive.unwrap();
        assert_eq!((k.idle, k.interval, k.count), (secs(7), secs(2), None));
        assert_eq!(t.tcp.user_timeout, Some(Duration::from_millis(1500)));
        let t = ok("host=h keepalives=0 tcp_user_timeout=0");
        assert_eq!(t.tcp.keepalive, None);
        assert_eq!(t.tcp.user_timeout, None);
        assert!(ok("host=h keepalives=1").tcp.keepalive.is_some());
        let e = err("host=h keepalives_idle=10s");
        assert!(
            e.contains("keepalives_idle \"10s\" (from the connection string)")
                && e.contains("seconds"),
            "{e}"
        );
        assert!(err("postgres://h/?tcp_user_timeout=-1").contains("milliseconds"));
        assert!(err("host=h keepalives_count=x").contains("keepalives_count"));
    }

    #[test]
    fn leaseq_settings_come_after_the_users() {
        let o = ok("host=h options='-c search_path=x' application_name=mine")
            .options()
            .unwrap();
        assert_eq!(o.get_application_name(), Some("mine"));
        let opts = o.get_options().unwrap();
        let user = opts.find("-c search_path=x").unwrap();
        let ours = opts.find("-c search_path=leaseq,public").unwrap();
        assert!(user < ours, "{opts}");
        assert!(opts.ends_with("-c jit=off"), "{opts}");
        let o = ok("host=h").options().unwrap();
        assert_eq!(o.get_application_name(), Some("leaseq"));
    }

    #[test]
    fn special_characters_survive_the_trip_to_sqlx() {
        let t = ok(r"host=h user='u s+e&r' password='p@ss w&rd=+%/?' dbname='d b'");
        let o = t.options().unwrap();
        assert_eq!(o.get_username(), "u s+e&r");
        assert_eq!(o.get_database(), Some("d b"));
        // sqlx has no getter for the password; its Debug shows it.
        assert!(format!("{o:?}").contains(r#"password: Some("p@ss w&rd=+%/?")"#));
    }

    #[test]
    fn the_embedded_clusters_url() {
        let t = ok("postgres://leaseq@localhost:5432/leaseq?host=%2Fx%2Frun&sslmode=disable");
        assert_eq!(t.host, socket("/x/run"));
        assert_eq!(t.user.as_deref(), Some("leaseq"));
        assert_eq!(t.dbname.as_deref(), Some("leaseq"));
    }

    #[test]
    fn which_errors_are_permanent() {
        let cfg: sqlx::Error = PgConnError("x".into()).into();
        assert!(is_permanent(&cfg));
        assert!(is_permanent(&sqlx::Error::Tls("bad certificate".into())));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_permanent(&sqlx::Error::Io(refused)));
        assert!(!is_permanent(&sqlx::Error::PoolTimedOut));
        let handshake = std::io::Error::new(std::io::ErrorKind::InvalidData, "bad certificate");
        assert!(is_permanent(&sqlx::Error::Io(handshake)));
    }
}
