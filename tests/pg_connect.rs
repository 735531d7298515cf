//! The PostgreSQL connection forms and TLS modes of `leaseq_server::pgconn`,
//! against a real PostgreSQL started here with `ssl = on` and certificates
//! made here (`common::pki`): a CA and a server certificate (for `db.leaseq.test`
//! and 127.0.0.1, not `localhost`), a client certificate for the role
//! `certuser`, and a second CA nobody trusts. Its pg_hba.conf takes TCP only
//! over TLS (`hostssl`), `certuser` only with a client certificate, and the
//! Unix socket with `trust`. It listens on 127.0.0.1 on a free port.
//!
//! The PG* variables are process-global, so they are tested on the real
//! `leaseq` binary as a child process (`leaseq migrate`, `leaseq serve`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::free_port;
use crate::common::pki::{Authority, write_pem};
use leaseq::embedded::{EmbeddedOptions, EmbeddedPostgres};
use leaseq_server::pgconn;
use sqlx::{Connection, PgConnection, Row};

/// The password of role `app`: every character a URI or a keyword/value
/// string treats specially.
const PASSWORD: &str = r"p@ss w'rd/?&=%+\:#";

/// A PostgreSQL cluster with TLS on, stopped and removed on drop.
struct TlsPg {
    root: PathBuf,
    data: PathBuf,
    /// The directory of the Unix socket.
    run: PathBuf,
    port: u16,
    bin: PathBuf,
    /// The server's user and group (`postgres` when the tests run as root).
    owner: (u32, u32),
    ca: PathBuf,
    rogue_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

impl TlsPg {
    async fn start() -> TlsPg {
        let root =
            std::env::temp_dir().join(format!("leaseq-pgtls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        // World-searchable: as root the server runs as `postgres`.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.join("pg");
        // initdb (as the right user) and the roles, over the private socket;
        // then restarted below with TLS and a TCP port.
        let pg = EmbeddedPostgres::start(EmbeddedOptions {
            dir: dir.clone(),
            durable: false,
        })
        .await
        .expect("starting a private cluster");
        let mut conn = PgConnection::connect(&pg.url("leaseq")).await.unwrap();
        let sql_password = PASSWORD.replace('\'', "''");
        for stmt in [
            format!("create role app login password '{sql_password}'"),
            "create role certuser login".to_owned(),
            "create database appdb owner app".to_owned(),
            "create database appdb2 owner app".to_owned(),
            "create database sockdb".to_owned(),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(stmt))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        conn.close().await.unwrap();
        pg.stop().await.unwrap();

        let data = dir.join("data");
        let md = std::fs::metadata(&data).unwrap();
        let owner = (md.uid(), md.gid());
        let pki = PgCerts::write(&root, owner);
        std::fs::write(
            root.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        let port = free_port();
        let pg = TlsPg {
            root: root.clone(),
            data,
            run: dir.join("run"),
            port,
            bin: pg_bin(),
            owner,
            ca: pki.ca,
            rogue_ca: pki.rogue_ca,
            client_cert: pki.client_cert,
            client_key: pki.client_key,
            rogue_cert: pki.rogue_cert,
            rogue_key: pki.rogue_key,
        };
        let opts = format!(
            "-k {run} -p {port} -c listen_addresses=127.0.0.1 -c unix_socket_permissions=0700 \
             -c ssl=on -c ssl_cert_file={r}/server.crt -c ssl_key_file={r}/server.key \
             -c ssl_ca_file={r}/ca.crt -c hba_file={r}/pg_hba.conf \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            run = pg.run.display(),
            r = root.display(),
        );
        let out = pg
            .pg_ctl()
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&pg.data)
            .arg("-l")
            .arg(root.join("pg/postgres.log"))
            .args(["-o", &opts])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(root.join("pg/postgres.log")).unwrap_or_default()
        );
        pg
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.current_dir(&self.root).stdin(Stdio::null());
        let me = std::fs::metadata(&self.root).unwrap();
        if me.uid() != self.owner.0 {
            cmd.uid(self.owner.0).gid(self.owner.1);
        }
        cmd
    }

    /// Keyword/value settings for role `app` over TCP.
    fn app(&self, host: &str, extra: &str) -> String {
        let pw = PASSWORD.replace('\\', r"\\").replace('\'', r"\'");
        format!(
            "host={host} port={} user=app password='{pw}' dbname=appdb {extra}",
            self.port
        )
    }

    fn p(path: &Path) -> String {
        path.display().to_string()
    }
}

impl Drop for TlsPg {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["stop", "-w", "-t", "30", "-m", "fast", "-D"])
            .arg(&self.data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The certificates of the server and its clients, as files.
struct PgCerts {
    ca: PathBuf,
    rogue_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

impl PgCerts {
    /// Writes the certificates into `dir`; the server's key belongs to the
    /// server's user with mode 0600, as PostgreSQL requires.
    fn write(dir: &Path, server: (u32, u32)) -> PgCerts {
        let write = |name: &str, pem: &str| write_pem(&dir.join(name), pem);
        let authority = Authority::new("leaseq pg test CA");
        let leaf = authority.server(&["db.leaseq.test", "127.0.0.1"]);
        write("server.crt", &leaf.cert);
        let key = write("server.key", &leaf.key);
        std::os::unix::fs::chown(&key, Some(server.0), Some(server.1)).unwrap();
        let client = authority.client("certuser");
        let rogue = Authority::new("someone else's CA");
        let intruder = rogue.client("certuser");
        PgCerts {
            ca: write("ca.crt", &authority.pem()),
            rogue_ca: write("rogue-ca.crt", &rogue.pem()),
            client_cert: write("client.crt", &client.cert),
            client_key: write("client.key", &client.key),
            rogue_cert: write("rogue.crt", &intruder.cert),
            rogue_key: write("rogue.key", &intruder.key),
        }
    }
}

/// The directory with `pg_ctl` and `postgres`: $LEASEQ_PG_BIN, PATH, then
/// /usr/lib/postgresql/<newest>/bin.
fn pg_bin() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("LEASEQ_PG_BIN").filter(|d| !d.is_empty()) {
        candidates.push(d.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versioned.sort_by_key(|v| std::cmp::Reverse(v.0));
    candidates.extend(versioned.into_iter().map(|v| v.1));
    candidates
        .into_iter()
        .find(|d| d.join("pg_ctl").is_file() && d.join("postgres").is_file())
        .expect("pg_ctl not found (set LEASEQ_PG_BIN)")
}

/// Percent-encodes everything but unreserved characters.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What a connection turned out as: (current_user, TLS in use).
type Session = (String, bool);

/// Resolves `conninfo` with no PG* variables (and no HOME) and connects.
async fn connect(conninfo: &str) -> Result<Session, String> {
    let target = pgconn::resolve(conninfo, &|_| None).map_err(|e| format!("parse: {e}"))?;
    let opts = target.options().map_err(|e| format!("options: {e}"))?;
    let mut conn = match tokio::time::timeout(
        Duration::from_secs(15),
        PgConnection::connect_with(&opts),
    )
    .await
    {
        Err(_) => return Err("timed out".into()),
        Ok(Err(e)) => {
            let kind = if pgconn::is_permanent(&e) {
                "permanent"
            } else {
                "retryable"
            };
            return Err(format!("{kind}: {e}"));
        }
        Ok(Ok(c)) => c,
    };
    let row = sqlx::query(
        "select current_user::text, coalesce((select ssl from pg_stat_ssl where pid = pg_backend_pid()), false)",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(|e| format!("query: {e}"))?;
    let session = (row.get::<String, _>(0), row.get::<bool, _>(1));
    conn.close().await.ok();
    Ok(session)
}

/// One row of the matrix: a connection that must succeed as `Ok(session)`
/// or fail with an error containing the text.
enum Expect {
    Ok(&'static str, bool),
    Fails(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_certificates_and_forms_against_a_real_server() {
    let pg = TlsPg::start().await;
    let ca = TlsPg::p(&pg.ca);
    let rogue_ca = TlsPg::p(&pg.rogue_ca);
    let (cc, ck) = (TlsPg::p(&pg.client_cert), TlsPg::p(&pg.client_key));
    let (rc, rk) = (TlsPg::p(&pg.rogue_cert), TlsPg::p(&pg.rogue_key));
    let run = TlsPg::p(&pg.run);
    let port = pg.port;
    let ip = "127.0.0.1";
    let cert_user =
        |extra: &str| format!("host={ip} port={port} user=certuser dbname=appdb {extra}");
    let rows: Vec<(&str, String, Expect)> = vec![
        (
            "disable: the server takes TCP only over TLS",
            pg.app(ip, "sslmode=disable"),
            Expect::Fails("no encryption"),
        ),
        (
            "prefer",
            pg.app(ip, "sslmode=prefer"),
            Expect::Ok("app", true),
        ),
        (
            "allow (as prefer)",
            pg.app(ip, "sslmode=allow"),
            Expect::Ok("app", true),
        ),
        (
            "require, no CA",
            pg.app(ip, "sslmode=require"),
            Expect::Ok("app", true),
        ),
        (
            "require with the wrong CA verifies (as verify-ca) and fails",
            pg.app(ip, &format!("sslmode=require sslrootcert={rogue_ca}")),
            Expect::Fails("permanent"),
        ),
        (
            "verify-ca ignores the name",
            pg.app("localhost", &format!("sslmode=verify-ca sslrootcert={ca}")),
            Expect::Ok("app", true),
        ),
        (
            "verify-ca with the wrong CA",
            pg.app(ip, &format!("sslmode=verify-ca sslrootcert={rogue_ca}")),
            Expect::Fails("permanent"),
        ),
        (
            "verify-full, name in the certificate",
            pg.app(ip, &format!("sslmode=verify-full sslrootcert={ca}")),
            Expect::Ok("app", true),
        ),
        (
            "verify-full, wrong host name",
            pg.app(
                "localhost",
                &format!("sslmode=verify-full sslrootcert={ca}"),
            ),
            Expect::Fails("not valid for name"),
        ),
        (
            "verify-full with the system's roots (the test CA is not among them)",
            pg.app(ip, "sslmode=verify-full sslrootcert=system"),
            Expect::Fails("permanent"),
        ),
        (
            "client certificate (hostssl ... cert)",
            cert_user(&format!(
                "sslmode=verify-full sslrootcert={ca} sslcert={cc} sslkey={ck}"
            )),
            Expect::Ok("certuser", true),
        ),
        (
            "client-certificate user without a certificate",
            cert_user(&format!("sslmode=verify-full sslrootcert={ca}")),
            Expect::Fails("certificate"),
        ),
        (
            "client certificate from a CA the server does not trust",
            cert_user(&format!(
                "sslmode=verify-full sslrootcert={ca} sslcert={rc} sslkey={rk}"
            )),
            Expect::Fails(""),
        ),
        (
            "wrong password",
            format!("host={ip} port={port} user=app password=nope dbname=appdb sslmode=require"),
            Expect::Fails("password authentication failed"),
        ),
        (
            "URI, verify-full, password percent-encoded",
            format!(
                "postgresql://app:{}@{ip}:{port}/appdb?sslmode=verify-full&sslrootcert={}",
                enc(PASSWORD),
                enc(&ca)
            ),
            Expect::Ok("app", true),
        ),
        (
            "URI, client certificate in parameters",
            format!(
                "postgres://certuser@{ip}:{port}/appdb?sslmode=verify-full&sslrootcert={ca}&sslcert={cc}&sslkey={ck}"
            ),
            Expect::Ok("certuser", true),
        ),
        (
            "URI, Unix socket: empty host and ?host=",
            format!("postgresql://leaseq@/sockdb?host={run}&port={port}"),
            Expect::Ok("leaseq", false),
        ),
        (
            "URI, Unix socket: percent-encoded directory as host",
            format!("postgresql://leaseq@{}:{port}/sockdb", enc(&run)),
            Expect::Ok("leaseq", false),
        ),
        (
            "keyword/value, Unix socket (sslmode ignored there, as in libpq)",
            format!("host='{run}' port={port} user=leaseq dbname=sockdb sslmode=verify-full"),
            Expect::Ok("leaseq", false),
        ),
    ];
    let mut report = String::new();
    let mut failed = 0;
    for (name, conninfo, expect) in &rows {
        let got = connect(conninfo).await;
        let pass = match (expect, &got) {
            (Expect::Ok(user, tls), Ok((u, t))) => u == user && t == tls,
            (Expect::Fails(text), Err(e)) => e.contains(text) && !e.contains(PASSWORD),
            _ => false,
        };
        if !pass {
            failed += 1;
        }
        report.push_str(&format!(
            "{} {name}: {got:?}\n",
            if pass { "ok  " } else { "FAIL" }
        ));
    }
    println!("{report}");
    assert_eq!(failed, 0, "TLS matrix:\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_connect_keeps_leaseqs_session_settings() {
    let pg = TlsPg::start().await;
    let uri = format!(
        "postgres://app:{}@127.0.0.1:{}/appdb?sslmode=verify-full&sslrootcert={}&options=-c%20statement_timeout%3D7s",
        enc(PASSWORD),
        pg.port,
        enc(&TlsPg::p(&pg.ca)),
    );
    let pool = leaseq_server::store::connect(&uri, 1)
        .await
        .expect("store::connect");
    let row = sqlx::query(
        "select current_setting('search_path'), current_setting('jit'), \
         current_setting('application_name'), current_setting('statement_timeout'), \
         (select ssl from pg_stat_ssl where pid = pg_backend_pid())",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>(0), "leaseq,public");
    assert_eq!(row.get::<String, _>(1), "off");
    assert_eq!(row.get::<String, _>(2), "leaseq");
    assert_eq!(row.get::<String, _>(3), "7s");
    assert!(row.get::<bool, _>(4), "TLS");
    pool.close().await;
    let listener = leaseq_server::store::connect_listener(&format!("{uri}&application_name=mine"))
        .await
        .unwrap();
    let name: String = sqlx::query_scalar("select current_setting('application_name')")
        .fetch_one(&listener)
        .await
        .unwrap();
    assert_eq!(name, "mine");
    listener.close().await;
}

/// The real binary, with no DATABASE_URL, PG* or LEASEQ_* variables from
/// this process, and HOME in a scratch directory (no ~/.pgpass, no
/// ~/.postgresql).
fn leaseq(pg: &TlsPg, args: &[&str], vars: &[(&str, String)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leaseq"));
    for (k, _) in std::env::vars() {
        if k.starts_with("PG") || k.starts_with("LEASEQ_") || k == "DATABASE_URL" {
            cmd.env_remove(k);
        }
    }
    let home = pg.root.join("home");
    std::fs::create_dir_all(&home).unwrap();
    cmd.args(args)
        .env("HOME", home)
        .env("RUST_LOG", "info")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs to completion (at most 60 s): (success, stdout + stderr, took).
async fn run(mut cmd: tokio::process::Command) -> (bool, String, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("leaseq did not finish within 60 s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, started.elapsed())
}

async fn has_jobs_table(pg: &TlsPg, db: &str) -> bool {
    let url = format!(
        "postgresql://leaseq@/{db}?host={}&port={}",
        enc(&TlsPg::p(&pg.run)),
        pg.port
    );
    let mut conn =
        PgConnection::connect_with(&pgconn::connect_options(&url).unwrap().options().unwrap())
            .await
            .unwrap();
    let found: Option<String> = sqlx::query_scalar("select to_regclass('leaseq.jobs')::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    found.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_pg_variables_and_database_url_forms() {
    let pg = TlsPg::start().await;
    let ca = TlsPg::p(&pg.ca);
    let port = pg.port.to_string();
    let pg_vars = |sslmode: &str, db: &str| {
        vec![
            ("PGHOST", "127.0.0.1".to_owned()),
            ("PGPORT", port.clone()),
            ("PGUSER", "app".to_owned()),
            ("PGPASSWORD", PASSWORD.to_owned()),
            ("PGDATABASE", db.to_owned()),
            ("PGSSLMODE", sslmode.to_owned()),
            ("PGSSLROOTCERT", ca.clone()),
        ]
    };

    // PG* alone, no DATABASE_URL: the server they name, not the embedded one.
    let (ok, out, _) = run(leaseq(&pg, &["migrate"], &pg_vars("verify-full", "appdb"))).await;
    assert!(ok, "migrate with PG* only:\n{out}");
    assert!(has_jobs_table(&pg, "appdb").await);
    assert!(!out.contains(PASSWORD), "{out}");
    // The log says why this server: PGHOST named it.
    assert!(out.contains("\"PGHOST\""), "{out}");

    // A DATABASE_URL that says little; PG* fills the rest.
    let mut vars = pg_vars("require", "nosuchdb");
    vars.push(("DATABASE_URL", "dbname=appdb2".to_owned()));
    let (ok, out, _) = run(leaseq(&pg, &["migrate"], &vars)).await;
    assert!(
        ok,
        "migrate with DATABASE_URL=dbname=appdb2 and PG*:\n{out}"
    );
    assert!(has_jobs_table(&pg, "appdb2").await);

    // libpq's Unix-socket URI, the form of issue 12.
    let url = format!(
        "postgresql://leaseq@/sockdb?host={}&port={port}",
        TlsPg::p(&pg.run)
    );
    let (ok, out, _) = run(leaseq(&pg, &["migrate"], &[("DATABASE_URL", url)])).await;
    assert!(ok, "migrate over the socket URI:\n{out}");
    assert!(has_jobs_table(&pg, "sockdb").await);

    // sslmode=disable against a hostssl-only server: refused, no password shown.
    let (ok, out, _) = run(leaseq(&pg, &["migrate"], &pg_vars("disable", "appdb"))).await;
    assert!(!ok, "sslmode=disable must fail:\n{out}");
    assert!(out.contains("no encryption"), "{out}");
    assert!(!out.contains(PASSWORD), "{out}");

    // A malformed URL fails at once, naming the part, without the password.
    let bad = "postgresql://app:Xyzzy@127.0.0.1:54x2/appdb".to_owned();
    let (ok, out, took) = run(leaseq(&pg, &["migrate"], &[("DATABASE_URL", bad)])).await;
    assert!(!ok && out.contains("port \"54x2\""), "{out}");
    assert!(!out.contains("Xyzzy"), "{out}");
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // `serve` does not retry what waiting cannot fix: a missing CA file...
    let serve = ["serve", "--listen", "127.0.0.1:0"];
    let mut vars = pg_vars("verify-full", "appdb");
    vars.retain(|(k, _)| *k != "PGSSLROOTCERT");
    vars.push(("PGSSLROOTCERT", "/nonexistent/ca.crt".to_owned()));
    let (ok, out, took) = run(leaseq(&pg, &serve, &vars)).await;
    assert!(!ok && out.contains("PGSSLROOTCERT"), "{out}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // ...nor a certificate that does not match the host name.
    let mut vars = pg_vars("verify-full", "appdb");
    vars.retain(|(k, _)| *k != "PGHOST");
    vars.push(("PGHOST", "localhost".to_owned()));
    let (ok, out, took) = run(leaseq(&pg, &serve, &vars)).await;
    assert!(!ok && out.contains("not valid for name"), "{out}");
    assert!(
        took < Duration::from_secs(20),
        "took {took:?}: retried a TLS failure"
    );
}
