//! The embedded default: a private PostgreSQL cluster run from the server
//! binaries installed on this machine, so that `leaseq serve` and the test
//! suite work wherever PostgreSQL is installed, even if it is not set up or
//! running. With a `DATABASE_URL` none of this is used.
//!
//! # Layout
//!
//! Everything lives under one directory ([`EmbeddedOptions::dir`]):
//!
//! - `data/`: the cluster (PGDATA), created by `initdb` on first use;
//! - `run/`: the Unix socket (`.s.PGSQL.5432`), a directory of mode 0700;
//! - `postgres.log`: the server's output, appended to;
//! - `.lock`: an exclusive `flock` held while one process initialises,
//!   starts or checks the cluster, so that several processes (test binaries
//!   run in parallel by nextest, a broker restarted in a hurry) can call
//!   [`EmbeddedPostgres::start`] on the same directory at once.
//!
//! # Why `trust` authentication is safe here
//!
//! The server listens on **no TCP port** (`listen_addresses=''`), only on the
//! socket in `run/`. That directory has mode 0700, and the socket itself
//! `unix_socket_permissions=0700`, so only the user who runs the server (and
//! root) can connect at all. Whoever can reach the socket could read `data/`
//! directly anyway, so passwords would add nothing. `initdb` makes `leaseq`
//! the superuser; [`EmbeddedPostgres::url`] connects as it.
//!
//! # Running as root
//!
//! PostgreSQL refuses to run as root. When leaseq runs as root, `initdb` and
//! `postgres` run as the `postgres` user if it exists, else as `nobody`
//! (set with `setuid`/`setgid` in the child; no `su`/`runuser` needed). Their
//! directories (`data/`, `run/`, and the cluster directory itself when it
//! holds nothing but ours) are chowned to that user, and every directory above
//! must be searchable by it: a cluster under `/root` cannot work, which is why
//! [`EmbeddedOptions::default_dir`] picks `/var/lib/leaseq/pg` for root, and
//! why `start` fails with [`EmbeddedError::Unreachable`] (rather than with an
//! obscure permission error from PostgreSQL) when that does not hold. Root can
//! still connect to the 0700 socket.
//!
//! # Lifetime
//!
//! `postgres` is started directly (no `pg_ctl`) as a child in its own process
//! group, so a Ctrl-C in the broker's terminal reaches the broker, which then
//! drains and calls [`EmbeddedPostgres::stop`], rather than the server. The
//! child is never killed on drop: the server outlives the process that
//! started it. If the broker is killed with `kill -9`, the next `start` finds
//! the live postmaster (its pid in `data/postmaster.pid` is alive and the
//! socket answers) and reuses it; the test suite relies on the same to share
//! one cluster between test processes. A stale `postmaster.pid` (after a
//! crash or reboot) is handled by PostgreSQL itself when it starts.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::time::Instant;
use tracing::{info, warn};

/// Where and how to run the cluster.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Cluster directory; created if missing. Holds `data/` (PGDATA) and the
    /// Unix socket.
    pub dir: PathBuf,
    /// true for `serve`: fsync and friends on, durable. false for tests:
    /// `fsync=off`, `synchronous_commit=off`, `full_page_writes=off`, for
    /// speed; a crash of the machine may then lose or corrupt the cluster.
    pub durable: bool,
}

impl EmbeddedOptions {
    /// The documented default directory: `$LEASEQ_DATA_DIR` if set; else, as
    /// root, `/var/lib/leaseq/pg` (the server runs as another user, who
    /// cannot enter root's home); else `$XDG_DATA_HOME/leaseq/pg`, else
    /// `$HOME/.local/share/leaseq/pg`, else `./leaseq-data/pg`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = non_empty_env("LEASEQ_DATA_DIR") {
            return PathBuf::from(d);
        }
        if is_root() {
            return PathBuf::from("/var/lib/leaseq/pg");
        }
        if let Some(d) = non_empty_env("XDG_DATA_HOME") {
            return PathBuf::from(d).join("leaseq/pg");
        }
        if let Some(h) = non_empty_env("HOME") {
            return PathBuf::from(h).join(".local/share/leaseq/pg");
        }
        PathBuf::from("leaseq-data/pg")
    }
}

/// Why the embedded cluster could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No directory holds both `initdb` and `postgres`.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found in $LEASEQ_PG_BIN, on PATH or in \
         /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin, /usr/local/pgsql/bin, \
         /opt/homebrew/opt/postgresql*/bin, /usr/local/opt/postgresql*/bin; install them \
         (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; \
         macOS: brew install postgresql@16), point LEASEQ_PG_BIN at their directory, \
         or set DATABASE_URL (searched: {})",
        display_paths(.searched)
    )]
    NotInstalled { searched: Vec<PathBuf> },
    /// A file system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// `initdb` ran and failed.
    #[error("initdb failed ({status}):\n{stderr}")]
    Initdb { status: String, stderr: String },
    /// The server exited or did not accept connections in time.
    #[error("PostgreSQL did not start: {reason}; last lines of {}:\n{tail}", .log.display())]
    Start {
        reason: String,
        log: PathBuf,
        tail: String,
    },
    /// [`EmbeddedPostgres::stop`]: the server did not exit in time.
    #[error("PostgreSQL (pid {pid}) did not shut down within {}s", .waited.as_secs())]
    Timeout { pid: i32, waited: Duration },
    /// As root: the server's user cannot reach the cluster directory.
    #[error(
        "running as root, PostgreSQL runs as the unprivileged user {user}, who cannot enter \
         {}, so it cannot use {}: choose a data directory elsewhere (--data-dir / \
         LEASEQ_DATA_DIR, e.g. /var/lib/leaseq/pg)",
        .blocked.display(), .dir.display()
    )]
    Unreachable {
        user: String,
        dir: PathBuf,
        blocked: PathBuf,
    },
    /// As root: neither `postgres` nor `nobody` exists.
    #[error(
        "running as root, but there is no unprivileged user (postgres or nobody) to run \
         PostgreSQL as (it refuses to run as root)"
    )]
    NoUser,
    /// Creating database `leaseq` failed.
    #[error("embedded PostgreSQL: {0}")]
    Database(#[from] sqlx::Error),
}

fn display_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}

/// `map_err` helper: an I/O error with what we were doing.
fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EmbeddedError {
    let context = context.into();
    move |source| EmbeddedError::Io { context, source }
}

/// The superuser `initdb` creates; all connections use it.
const USER: &str = "leaseq";
/// The database [`EmbeddedPostgres::start`] creates.
const DATABASE: &str = "leaseq";
const CREATE_DATABASE: &str = "create database leaseq";
/// Only names the socket file (`.s.PGSQL.5432`): there is no TCP listener.
/// Passed explicitly so that a `PGPORT` in the environment changes nothing.
const PORT: u16 = 5432;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a postmaster found running gets to accept a connection before we
/// try to start our own (which fails with a clear message if it really runs).
const REUSE_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// A running (started or reused) embedded cluster.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log: PathBuf,
    /// The postmaster: our child if `started_here`, else from postmaster.pid.
    pid: i32,
    started_here: bool,
}

impl EmbeddedPostgres {
    /// Finds the binaries, runs `initdb` if the cluster does not exist,
    /// starts `postgres` unless a live postmaster already runs on this
    /// directory (then reuses it, e.g. after the broker was killed -9), waits
    /// until it accepts connections, and creates database `leaseq` if
    /// missing.
    ///
    /// Safe to call concurrently from several processes on the same
    /// directory: all of this happens under an exclusive `flock` on
    /// `<dir>/.lock`.
    pub async fn start(opts: EmbeddedOptions) -> Result<EmbeddedPostgres, EmbeddedError> {
        let dir = opts.dir.clone();
        let (dir, lock) = tokio::task::spawn_blocking(move || lock_dir(&dir))
            .await
            .map_err(|e| EmbeddedError::Io {
                context: format!("locking {}", opts.dir.display()),
                source: std::io::Error::other(e),
            })??;
        let result = start_locked(&dir, opts.durable).await;
        drop(lock);
        result
    }

    /// sqlx connection URL of `database` over the private Unix socket:
    /// `postgres://leaseq@localhost:5432/DATABASE?host=/abs/dir/run&sslmode=disable`
    /// (sqlx takes a `host` parameter starting with `/` as the socket
    /// directory; `localhost` is a placeholder it then ignores).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{USER}@localhost:{PORT}/{}?host={}&sslmode=disable",
            encode(database),
            encode(&self.socket_dir.to_string_lossy()),
        )
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Whether this call started the postmaster (false if it reused a
    /// running one).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// Fast shutdown: SIGINT to the postmaster (open sessions are rolled
    /// back), then waits up to 10 s for it to exit. Meant for the process
    /// that started it (`serve` on exit); the tests leave their shared
    /// cluster running.
    pub async fn stop(self) -> Result<(), EmbeddedError> {
        let pid_file = self.data_dir.join("postmaster.pid");
        // A reused postmaster may have exited since, and its pid been
        // recycled: only signal it while postmaster.pid still names it. Our
        // own child cannot be recycled before we reap it.
        if !self.started_here && read_pid(&pid_file) != Some(self.pid) {
            return Ok(());
        }
        // SAFETY: kill(2) has no memory-safety preconditions.
        if unsafe { libc::kill(self.pid, libc::SIGINT) } != 0 {
            reap(self.pid);
            return Ok(());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            // If it is our child, reap it: a zombie still "exists" for kill(pid, 0).
            reap(self.pid);
            if !alive(self.pid) {
                info!(pid = self.pid, "embedded PostgreSQL stopped");
                return Ok(());
            }
            if Instant::now() >= deadline {
                // postmaster.pid is removed last thing on shutdown: if it is
                // gone, the server is done (a zombie someone else must reap).
                if pid_file.exists() {
                    return Err(EmbeddedError::Timeout {
                        pid: self.pid,
                        waited: STOP_TIMEOUT,
                    });
                }
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn connect_options(&self, database: &str) -> Result<PgConnectOptions, sqlx::Error> {
        // Through the public URL, so that every start checks that it works.
        self.url(database).parse()
    }

    /// Polls until the server accepts a connection. `check` is called between
    /// attempts and ends the wait early with a reason (e.g. the server exited).
    async fn wait_ready(
        &self,
        limit: Duration,
        mut check: impl FnMut() -> Option<String>,
    ) -> Result<(), String> {
        let options = self
            .connect_options("postgres")
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + limit;
        loop {
            let last = match PgConnection::connect_with(&options).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(e) => e,
            };
            if let Some(reason) = check() {
                return Err(reason);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no connection within {}s (last error: {last})",
                    limit.as_secs()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Creates database `leaseq` if missing.
    async fn create_database(&self) -> Result<(), EmbeddedError> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres")?).await?;
        let exists: bool = sqlx::query_scalar!(
            r#"select exists (select 1 from pg_database where datname = $1) as "exists!""#,
            DATABASE,
        )
        .fetch_one(&mut conn)
        .await?;
        if !exists {
            match sqlx::query(CREATE_DATABASE).execute(&mut conn).await {
                Ok(_) => {}
                // duplicate_database, unique_violation: another process won
                // the race (only possible for clients not taking our lock).
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let _ = conn.close().await;
        Ok(())
    }
}

/// Creates and resolves the cluster directory and takes its lock (blocking).
fn lock_dir(dir: &Path) -> Result<(PathBuf, File), EmbeddedError> {
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let dir = fs::canonicalize(dir).map_err(io(format!("resolving {}", dir.display())))?;
    let lock_path = dir.join(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io(format!("opening {}", lock_path.display())))?;
    loop {
        // SAFETY: flock on a descriptor we own; the lock is released when
        // `lock` is closed. std opens files close-on-exec, so the server we
        // spawn does not inherit it.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok((dir, lock));
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(io(format!("locking {}", lock_path.display()))(err));
        }
    }
}

async fn start_locked(dir: &Path, durable: bool) -> Result<EmbeddedPostgres, EmbeddedError> {
    let mut pg = EmbeddedPostgres {
        data_dir: dir.join("data"),
        socket_dir: dir.join("run"),
        log: dir.join("postgres.log"),
        pid: 0,
        started_here: false,
    };

    if let Some(pid) = read_pid(&pg.data_dir.join("postmaster.pid"))
        && alive(pid)
    {
        let ready = pg
            .wait_ready(REUSE_TIMEOUT, || {
                (!alive(pid)).then(|| "the postmaster exited".to_owned())
            })
            .await;
        match ready {
            Ok(()) => {
                info!(pid, dir = %dir.display(), "reusing running embedded PostgreSQL");
                pg.pid = pid;
                pg.create_database().await?;
                return Ok(pg);
            }
            Err(reason) => warn!(
                pid, %reason, dir = %dir.display(),
                "postmaster.pid names a live process that does not accept connections; starting PostgreSQL"
            ),
        }
    }

    let (owned_dir, owned_log) = (dir.to_path_buf(), pg.log.clone());
    let mut child =
        tokio::task::spawn_blocking(move || spawn_server(&owned_dir, &owned_log, durable))
            .await
            .map_err(|e| EmbeddedError::Io {
                context: "starting PostgreSQL".to_owned(),
                source: std::io::Error::other(e),
            })??;
    pg.pid = i32::try_from(child.id()).map_err(|e| EmbeddedError::Io {
        context: "postgres pid".to_owned(),
        source: std::io::Error::other(e),
    })?;
    pg.started_here = true;
    info!(pid = pg.pid, dir = %dir.display(), "started embedded PostgreSQL");

    let ready = pg
        .wait_ready(READY_TIMEOUT, || match child.try_wait() {
            Ok(Some(status)) => Some(format!("postgres exited ({status})")),
            Ok(None) => None,
            Err(e) => Some(format!("waiting for postgres: {e}")),
        })
        .await;
    // Dropping a std Child neither kills nor waits for it: the server keeps
    // running after this process exits.
    drop(child);
    if let Err(reason) = ready {
        return Err(EmbeddedError::Start {
            reason,
            tail: tail(&pg.log, 20),
            log: pg.log,
        });
    }
    pg.create_database().await?;
    Ok(pg)
}

/// Settings of the durable cluster suited to a queue's write pattern (every
/// job is an insert, an update and a delete: WAL-heavy, small rows). With
/// PostgreSQL's defaults (`max_wal_size` 1 GB, `checkpoint_timeout` 5 min) a
/// queue at full rate filled the WAL in under a minute and checkpointed
/// every few seconds, each checkpoint making the next write of every page a
/// full-page image: the soak lost 20 % of its rate after minute one
/// (docs/BENCHMARKS.md). docs/DEPLOYMENT.md recommends the same for an
/// external PostgreSQL. Durability is unchanged: fsync and
/// `synchronous_commit` stay on.
const QUEUE_SETTINGS: &[&str] = &[
    "max_wal_size=4GB",
    "min_wal_size=512MB",
    "checkpoint_timeout=15min",
    "wal_compression=on",
    "wal_buffers=16MB",
];

/// Prepares the directories, runs initdb if needed and spawns `postgres`
/// (blocking).
fn spawn_server(dir: &Path, log: &Path, durable: bool) -> Result<Child, EmbeddedError> {
    let bin = find_binaries()?;
    let user = run_as()?;
    let data = dir.join("data");
    let socket_dir = dir.join("run");

    if let Some(user) = &user {
        // The cluster directory itself is chowned only when it holds nothing
        // but ours: never take over a directory like /tmp or $HOME.
        if only_ours(dir)? {
            chown(dir, user)?;
        }
        check_reachable(dir, user)?;
    }

    make_private_dir(&socket_dir, user.as_ref())?;
    if !data.join("PG_VERSION").exists() {
        if data.exists() {
            warn!(dir = %data.display(), "removing an incomplete cluster (an interrupted initdb?)");
            fs::remove_dir_all(&data).map_err(io(format!("removing {}", data.display())))?;
        }
        make_private_dir(&data, user.as_ref())?;
        let mut cmd = Command::new(bin.join("initdb"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-locale"]);
        if !durable {
            cmd.arg("--no-sync");
        }
        as_user(&mut cmd, dir, user.as_ref());
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("running {}", bin.join("initdb").display())))?;
        if !out.status.success() {
            return Err(EmbeddedError::Initdb {
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
            });
        }
        info!(dir = %dir.display(), bin = %bin.display(), "initialised embedded PostgreSQL cluster");
    } else if let Some(user) = &user {
        chown(&data, user)?;
    }

    let logfile = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("opening {}", log.display())))?;
    if let Some(user) = &user {
        chown(log, user)?;
    }
    let stdout = logfile
        .try_clone()
        .map_err(io(format!("opening {}", log.display())))?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&socket_dir)
        .args(["-p", &PORT.to_string()])
        .args(["-c", "listen_addresses="])
        .args(["-c", "unix_socket_permissions=0700"])
        .args(["-c", "max_connections=300"]);
    if durable {
        cmd.args(QUEUE_SETTINGS.iter().flat_map(|s| ["-c", s]));
    } else {
        cmd.args(["-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"]);
    }
    as_user(&mut cmd, dir, user.as_ref());
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(logfile)
        .spawn()
        .map_err(io(format!("starting {}", bin.join("postgres").display())))
}

/// The unprivileged user PostgreSQL runs as when we are root.
#[derive(Clone, Debug)]
struct RunAs {
    name: &'static str,
    uid: u32,
    gid: u32,
}

/// `Some(user)` when we are root, `None` to run as ourselves.
fn run_as() -> Result<Option<RunAs>, EmbeddedError> {
    if !is_root() {
        return Ok(None);
    }
    for (name, cname) in [("postgres", c"postgres"), ("nobody", c"nobody")] {
        // SAFETY: getpwnam returns null or a pointer to static storage, read
        // at once (we are on the one thread doing this under the cluster lock;
        // a concurrent getpwnam elsewhere could at worst give a wrong user).
        let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: checked non-null above.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Ok(Some(RunAs { name, uid, gid }));
        }
    }
    Err(EmbeddedError::NoUser)
}

fn as_user(cmd: &mut Command, dir: &Path, user: Option<&RunAs>) {
    // Started from a directory the server's user can enter (PostgreSQL warns
    // when it cannot return to its working directory, e.g. /root).
    cmd.current_dir(dir);
    if let Some(user) = user {
        // std drops supplementary groups (setgroups(0)) when root sets a uid.
        cmd.uid(user.uid).gid(user.gid);
    }
}

fn chown(path: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).map_err(io(format!(
        "chown {} to {}",
        path.display(),
        user.name
    )))
}

/// Creates `path` with mode 0700 if missing, else sets 0700; chowns it.
fn make_private_dir(path: &Path, user: Option<&RunAs>) -> Result<(), EmbeddedError> {
    if !path.exists() {
        DirBuilder::new()
            .mode(0o700)
            .create(path)
            .map_err(io(format!("creating {}", path.display())))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .map_err(io(format!("securing {}", path.display())))?;
    if let Some(user) = user {
        chown(path, user)?;
    }
    Ok(())
}

/// Whether `dir` holds only what this module puts there.
fn only_ours(dir: &Path) -> Result<bool, EmbeddedError> {
    let entries = fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
        if !matches!(
            entry.file_name().to_str(),
            Some(".lock" | "data" | "run" | "postgres.log")
        ) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// As root: fails unless `user` can search `dir` and every directory above.
fn check_reachable(dir: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    for d in dir.ancestors() {
        let meta = fs::metadata(d).map_err(io(format!("inspecting {}", d.display())))?;
        let mode = meta.mode();
        let searchable = if meta.uid() == user.uid {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !searchable {
            return Err(EmbeddedError::Unreachable {
                user: user.name.to_owned(),
                dir: dir.to_path_buf(),
                blocked: d.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// The directory holding both `initdb` and `postgres`.
fn find_binaries() -> Result<PathBuf, EmbeddedError> {
    let mut candidates = Vec::new();
    if let Some(d) = non_empty_env("LEASEQ_PG_BIN") {
        candidates.push(PathBuf::from(d));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).filter(|p| p.is_absolute()));
    }
    candidates.extend(versioned_dirs("/usr/lib/postgresql", "", "bin"));
    candidates.extend(versioned_dirs("/usr", "pgsql-", "bin"));
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    candidates.extend(versioned_dirs("/opt/homebrew/opt", "postgresql", "bin"));
    candidates.extend(versioned_dirs("/usr/local/opt", "postgresql", "bin"));
    find_binaries_in(candidates)
}

fn find_binaries_in(candidates: Vec<PathBuf>) -> Result<PathBuf, EmbeddedError> {
    match candidates
        .iter()
        .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file())
    {
        Some(found) => Ok(found.clone()),
        None => Err(EmbeddedError::NotInstalled {
            searched: candidates,
        }),
    }
}

/// `<parent>/<prefix><version>/<sub>` for each entry of `parent` named
/// `<prefix>...`, highest version first.
fn versioned_dirs(parent: &str, prefix: &str, sub: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let rest = name.strip_prefix(prefix)?;
            let version: Vec<u32> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            Some((version, e.path().join(sub)))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The postmaster pid: the first line of `postmaster.pid`.
fn read_pid(pid_file: &Path) -> Option<i32> {
    let text = fs::read_to_string(pid_file).ok()?;
    text.lines().next()?.trim().parse().ok().filter(|&p| p > 0)
}

/// Whether a process `pid` exists (EPERM: it does, owned by someone else).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Reaps `pid` if it is an exited child of ours; no-op otherwise.
fn reap(pid: i32) {
    // SAFETY: waitpid with WNOHANG and no status pointer; ECHILD if not ours.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn non_empty_env(key: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

/// The last `n` lines of `path` (reading at most its last 64 KiB).
fn tail(path: &Path, n: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

/// Percent-encodes everything but unreserved characters and `/`, for a URL
/// path segment or query value (sqlx decodes both).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(socket_dir: &str) -> EmbeddedPostgres {
        EmbeddedPostgres {
            data_dir: PathBuf::from("/x/data"),
            socket_dir: PathBuf::from(socket_dir),
            log: PathBuf::from("/x/postgres.log"),
            pid: 1,
            started_here: false,
        }
    }

    #[test]
    fn url_selects_the_socket() {
        let pg = handle("/tmp/lq pg+1/run");
        let url = pg.url("t_1");
        assert_eq!(
            url,
            "postgres://leaseq@localhost:5432/t_1?host=/tmp/lq%20pg%2B1/run&sslmode=disable"
        );
        let opts: PgConnectOptions = url.parse().expect("parses");
        assert_eq!(
            opts.get_socket().map(PathBuf::as_path),
            Some(Path::new("/tmp/lq pg+1/run"))
        );
        assert_eq!(opts.get_port(), 5432);
        assert_eq!(opts.get_username(), "leaseq");
        assert_eq!(opts.get_database(), Some("t_1"));
    }

    #[test]
    fn not_installed_says_what_to_install() {
        let err = find_binaries_in(vec![PathBuf::from("/nonexistent/bin")]).expect_err("none");
        let msg = err.to_string();
        assert!(matches!(err, EmbeddedError::NotInstalled { .. }), "{msg}");
        for needle in [
            "PostgreSQL server binaries (initdb, postgres) not found",
            "apt-get install postgresql",
            "dnf install postgresql-server",
            "brew install postgresql@16",
            "DATABASE_URL",
            "/nonexistent/bin",
        ] {
            assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        }
    }

    #[test]
    fn versions_sort_highest_first() {
        let root = std::env::temp_dir().join(format!("leaseq-vd-{}", std::process::id()));
        for v in ["9.6", "15", "16", "notes"] {
            fs::create_dir_all(root.join(v)).expect("mkdir");
        }
        let dirs = versioned_dirs(root.to_str().expect("utf-8"), "", "bin");
        let names: Vec<_> = dirs
            .iter()
            .map(|p| {
                p.parent()
                    .and_then(Path::file_name)
                    .and_then(|n| n.to_str())
            })
            .collect();
        let _ = fs::remove_dir_all(&root);
        assert_eq!(names[..3], [Some("16"), Some("15"), Some("9.6")]);
    }
}
