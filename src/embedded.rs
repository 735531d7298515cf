//! The embedded default: a private PostgreSQL cluster run from the server
//! binaries installed on this machine, so `leaseq serve` and the test suite
//! work where PostgreSQL is installed but not set up.
//!
//! - The cluster lives under one directory (`data/` is PGDATA, `run/` holds
//!   the Unix socket, `postgres.log` the server log).
//! - It listens on **no TCP port** (`listen_addresses=''`), only on a socket in
//!   `run/`, a directory of mode 0700: only its owner (and root) can connect.
//!   That is why `trust` authentication is safe here.
//! - PostgreSQL refuses to run as root. When leaseq runs as root, initdb and
//!   the server run as the `postgres` user (or `nobody`), which owns the
//!   cluster directory.
//! - The server is started in its own process group and outlives the broker
//!   process if that is killed: the next start finds the live postmaster and
//!   reuses it. `serve` stops it on a clean exit.
//! - Several processes may start the same cluster at once (test binaries):
//!   initdb and start are serialised with an exclusive `flock` on `.lock`.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tracing::info;

/// Where and how to run the cluster.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Cluster directory; created if missing.
    pub dir: PathBuf,
    /// true: fsync and friends on (for `serve`). false: off, for fast tests.
    pub durable: bool,
}

impl EmbeddedOptions {
    /// `$LEASEQ_DATA_DIR`; else, as root, `/var/lib/leaseq/pg` (the server
    /// runs as another user, who cannot enter root's home); else
    /// `$XDG_DATA_HOME/leaseq/pg`, `$HOME/.local/share/leaseq/pg`, or
    /// `./leaseq-data/pg`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("LEASEQ_DATA_DIR") {
            return PathBuf::from(d);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return PathBuf::from("/var/lib/leaseq/pg");
        }
        if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
            return PathBuf::from(d).join("leaseq/pg");
        }
        if let Some(h) = std::env::var_os("HOME") {
            return PathBuf::from(h).join(".local/share/leaseq/pg");
        }
        PathBuf::from("leaseq-data/pg")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found; searched $LEASEQ_PG_BIN, PATH and {searched}. \
         Install them (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; \
         macOS: brew install postgresql@16), point LEASEQ_PG_BIN at their directory, or set DATABASE_URL"
    )]
    NotInstalled { searched: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("initdb failed: {0}")]
    Initdb(String),
    #[error("PostgreSQL did not start within 30s; last lines of {log}:\n{tail}")]
    Start { log: String, tail: String },
    #[error(
        "running as root, PostgreSQL runs as an unprivileged user who cannot enter {blocked}, \
         so it cannot use {dir}: choose a data directory elsewhere (--data-dir / LEASEQ_DATA_DIR, \
         e.g. /var/lib/leaseq/pg)"
    )]
    Unreachable { dir: String, blocked: String },
    #[error("no unprivileged user (postgres or nobody) to run PostgreSQL as root")]
    NoUser,
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EmbeddedError {
    let context = context.into();
    move |source| EmbeddedError::Io { context, source }
}

/// A running (or reused) embedded cluster.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    dir: PathBuf,
    socket_dir: PathBuf,
    started_here: bool,
}

/// The superuser initdb creates; connections use it.
const USER: &str = "leaseq";

impl EmbeddedPostgres {
    /// Finds the binaries, initialises the cluster if needed, starts the
    /// server unless one already runs on this directory, waits until it
    /// accepts connections, and creates database `leaseq` if missing.
    pub async fn start(opts: EmbeddedOptions) -> Result<EmbeddedPostgres, EmbeddedError> {
        let dir = opts.dir.clone();
        tokio::task::spawn_blocking(move || start_blocking(&opts))
            .await
            .map_err(|e| EmbeddedError::Io {
                context: format!("starting PostgreSQL under {}", dir.display()),
                source: std::io::Error::other(e.to_string()),
            })?
    }

    /// sqlx URL of `database` over the private socket.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{USER}@localhost/{database}?host={}",
            self.socket_dir.display()
        )
    }

    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Whether this call started the server (false: it reused a running one).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// Fast shutdown of the server (SIGINT to the postmaster), waiting up to 10 s.
    pub async fn stop(self) -> Result<(), EmbeddedError> {
        let Some(pid) = postmaster_pid(&self.dir.join("data")) else {
            return Ok(());
        };
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGINT) };
        for _ in 0..200 {
            // Reap it if it is our child (else it lingers as a zombie).
            // SAFETY: waitpid with WNOHANG on a pid; ECHILD when not ours.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            // SAFETY: signal 0 only checks existence.
            let gone = unsafe { libc::kill(pid, 0) } != 0;
            if gone || !self.dir.join("data/postmaster.pid").exists() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

fn start_blocking(opts: &EmbeddedOptions) -> Result<EmbeddedPostgres, EmbeddedError> {
    let dir = &opts.dir;
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let dir = fs::canonicalize(dir).map_err(io(format!("resolving {}", dir.display())))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .map_err(io("opening the cluster lock"))?;
    // SAFETY: flock on a file descriptor we own; released when `lock` drops.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io("locking the cluster")(std::io::Error::last_os_error()));
    }
    let result = start_locked(&dir, opts.durable);
    drop(lock);
    result
}

fn start_locked(dir: &Path, durable: bool) -> Result<EmbeddedPostgres, EmbeddedError> {
    let data = dir.join("data");
    let socket_dir = dir.join("run");
    let log = dir.join("postgres.log");
    let mut pg = EmbeddedPostgres {
        dir: dir.to_path_buf(),
        socket_dir: socket_dir.clone(),
        started_here: false,
    };
    if let Some(pid) = postmaster_pid(&data)
        // SAFETY: signal 0 only checks existence.
        && unsafe { libc::kill(pid, 0) } == 0
        && block_on_connect(&pg, Duration::from_secs(5)).is_ok()
    {
        info!(pid, dir = %dir.display(), "reusing running embedded PostgreSQL");
        create_database(&pg)?;
        return Ok(pg);
    }

    let bin = find_binaries()?;
    let user = run_as()?;
    if user.is_some()
        && let Some(blocked) = dir
            .ancestors()
            .skip(1)
            .find(|a| fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
    {
        return Err(EmbeddedError::Unreachable {
            dir: dir.display().to_string(),
            blocked: blocked.display().to_string(),
        });
    }
    fs::create_dir_all(&socket_dir).map_err(io("creating the socket directory"))?;
    fs::set_permissions(&socket_dir, fs::Permissions::from_mode(0o700))
        .map_err(io("securing the socket directory"))?;
    if let Some((uid, gid)) = user {
        for p in [dir, socket_dir.as_path()] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", p.display())))?;
        }
        if log.exists() {
            std::os::unix::fs::chown(&log, Some(uid), Some(gid)).map_err(io("chown log"))?;
        }
    }

    if !data.join("PG_VERSION").exists() {
        let _ = fs::remove_dir_all(&data);
        let mut cmd = Command::new(bin.join("initdb"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-locale"]);
        if !durable {
            cmd.arg("--no-sync");
        }
        as_user(&mut cmd, user);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(io("running initdb"))?;
        if !out.status.success() {
            return Err(EmbeddedError::Initdb(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        info!(dir = %dir.display(), "initialised embedded PostgreSQL cluster");
    }

    let logfile = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(io("opening postgres.log"))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&log, Some(uid), Some(gid)).map_err(io("chown log"))?;
    }
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&socket_dir)
        .args(["-c", "listen_addresses="])
        .args(["-c", "unix_socket_permissions=0700"])
        .args(["-c", "max_connections=300"]);
    if !durable {
        cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"]);
    }
    as_user(&mut cmd, user);
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(logfile.try_clone().map_err(io("log"))?)
        .stderr(logfile)
        .spawn()
        .map_err(io("starting postgres"))?;
    info!(pid = child.id(), dir = %dir.display(), "started embedded PostgreSQL");
    // Not waited for: the server must outlive this process if it is killed.
    drop(child);
    pg.started_here = true;
    if block_on_connect(&pg, Duration::from_secs(30)).is_err() {
        return Err(EmbeddedError::Start {
            log: log.display().to_string(),
            tail: tail(&log, 20),
        });
    }
    create_database(&pg)?;
    Ok(pg)
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
        // initdb and postgres look at HOME only for ~/.psqlrc-like files.
        cmd.env("HOME", "/tmp");
    }
}

/// Some((uid, gid)) of the user to run PostgreSQL as when we are root.
fn run_as() -> Result<Option<(u32, u32)>, EmbeddedError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        let c = CString::new(name).expect("no NUL");
        // SAFETY: getpwnam returns null or a pointer to static storage that we
        // read immediately.
        let pw = unsafe { libc::getpwnam(c.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: checked non-null above.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Ok(Some((uid, gid)));
        }
    }
    Err(EmbeddedError::NoUser)
}

/// The directory holding both `initdb` and `postgres`.
fn find_binaries() -> Result<PathBuf, EmbeddedError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("LEASEQ_PG_BIN") {
        candidates.push(PathBuf::from(d));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    let mut globbed = Vec::new();
    for (parent, prefix, suffix) in [
        ("/usr/lib/postgresql", "", "bin"),
        ("/usr", "pgsql-", "bin"),
        ("/opt/homebrew/opt", "postgresql", "bin"),
        ("/usr/local/opt", "postgresql", "bin"),
    ] {
        if let Ok(entries) = fs::read_dir(parent) {
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path().join(suffix))
                .collect();
            // Highest version first.
            found.sort_by_key(|p| {
                std::cmp::Reverse(
                    p.parent()
                        .and_then(|v| v.file_name())
                        .map(|v| {
                            v.to_string_lossy()
                                .trim_start_matches(|c: char| !c.is_ascii_digit())
                                .split(|c: char| !c.is_ascii_digit())
                                .next()
                                .and_then(|n| n.parse::<u32>().ok())
                                .unwrap_or(0)
                        })
                        .unwrap_or(0),
                )
            });
            globbed.extend(found);
        }
    }
    globbed.push(PathBuf::from("/usr/local/pgsql/bin"));
    let searched = globbed
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    candidates.extend(globbed);
    candidates
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file())
        .ok_or(EmbeddedError::NotInstalled { searched })
}

fn postmaster_pid(data: &Path) -> Option<i32> {
    fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn options(pg: &EmbeddedPostgres, database: &str) -> PgConnectOptions {
    PgConnectOptions::new()
        .socket(&pg.socket_dir)
        .username(USER)
        .database(database)
}

/// Polls until the server accepts connections (this runs on a blocking
/// thread, so it drives its own small runtime).
fn block_on_connect(pg: &EmbeddedPostgres, limit: Duration) -> Result<(), sqlx::Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(sqlx::Error::Io)?;
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match PgConnection::connect_with(&options(pg, "postgres")).await {
                Ok(c) => {
                    let _ = c.close().await;
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

fn create_database(pg: &EmbeddedPostgres) -> Result<(), EmbeddedError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("runtime"))?;
    rt.block_on(async {
        let mut c = PgConnection::connect_with(&options(pg, "postgres")).await?;
        let exists: bool = sqlx::query_scalar(
            "select exists (select 1 from pg_database where datname = 'leaseq')",
        )
        .fetch_one(&mut c)
        .await?;
        if !exists {
            match sqlx::query("create database leaseq").execute(&mut c).await {
                Ok(_) => {}
                // A concurrent process created it first.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e.into()),
            }
        }
        let _ = c.close().await;
        Ok(())
    })
}
