//! A private PostgreSQL cluster that a test may stop and start with
//! `pg_ctl`, never the shared test cluster (other test processes use it).
//!
//! It is started by `leaseq::embedded` in a fresh directory under /tmp
//! (reachable by the `postgres` user when the tests run as root) in durable
//! mode: `pg_ctl stop -m immediate` is a crash, and the embedded test
//! settings (`fsync=off`, `synchronous_commit=off`) would lose commits
//! already answered, which is the product's configuration neither in
//! `serve` nor in any sane deployment.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use leaseq::embedded::{EmbeddedOptions, EmbeddedPostgres};

pub struct PrivatePg {
    /// `/tmp/leaseq-faults-<uuid>`; the cluster is in `pg/` below it.
    root: PathBuf,
    dir: PathBuf,
    bin: PathBuf,
    pub url: String,
}

impl PrivatePg {
    pub async fn start() -> PrivatePg {
        let root =
            std::env::temp_dir().join(format!("leaseq-faults-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).expect("mkdir");
        // World-searchable: as root the server runs as `postgres`.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let dir = root.join("pg");
        seed_data_dir(&dir).await;
        let pg = EmbeddedPostgres::start(EmbeddedOptions {
            dir: dir.clone(),
            durable: true,
        })
        .await
        .expect("starting a private cluster");
        let url = pg.url("leaseq");
        // pg_ctl stops it from now on (or Drop does).
        std::mem::forget(pg);
        PrivatePg {
            root,
            dir,
            bin: pg_bin(),
            url,
        }
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = server_user() {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// `pg_ctl stop -m immediate`: every backend is killed at once, no
    /// checkpoint (a crash, recovered from the WAL at the next start).
    pub fn stop_immediate(&self) {
        run_ok(
            self.pg_ctl()
                .args(["stop", "-w", "-t", "30", "-m", "immediate", "-D"])
                .arg(self.dir.join("data")),
            "pg_ctl stop",
        );
    }

    /// `pg_ctl status` output, for diagnostics.
    pub fn status(&self) -> String {
        match self
            .pg_ctl()
            .args(["status", "-D"])
            .arg(self.dir.join("data"))
            .output()
        {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => format!("pg_ctl status: {e}"),
        }
    }

    /// `pg_ctl stop -m fast`, then [`PrivatePg::start_again`] with `env`
    /// set for the server (LD_PRELOAD of libfaketime, say).
    pub fn restart_with_env(&self, env: &[(&str, &str)]) {
        run_ok(
            self.pg_ctl()
                .args(["stop", "-w", "-t", "30", "-m", "fast", "-D"])
                .arg(self.dir.join("data")),
            "pg_ctl stop",
        );
        self.start_with_env(env);
    }

    /// `pg_ctl start` with the options `leaseq::embedded` starts it with
    /// (its private socket, no TCP), waiting until it accepts connections.
    pub fn start_again(&self) {
        self.start_with_env(&[]);
    }

    fn start_with_env(&self, env: &[(&str, &str)]) {
        let opts = format!(
            "-k {} -p 5432 -c listen_addresses= -c unix_socket_permissions=0700 -c max_connections=300",
            self.dir.join("run").display()
        );
        run_ok(
            self.pg_ctl()
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(self.dir.join("data"))
                .arg("-l")
                .arg(self.dir.join("postgres.log"))
                .args(["-o", &opts])
                .envs(env.iter().copied())
                // pg_ctl's server keeps our stdout open otherwise.
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "pg_ctl start",
        );
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["stop", "-w", "-t", "30", "-m", "fast", "-D"])
            .arg(self.dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Fills `dir/data` with a copy of a cluster that `leaseq::embedded`
/// initialised and stopped once per machine (and per PostgreSQL binary), so
/// `EmbeddedPostgres::start` finds a cluster and skips initdb. initdb's
/// bootstrap costs about 0.7 s of CPU; the scaling tests start 21 clusters,
/// on 2 cores shared by the whole suite. The copy is not fsynced: the
/// tests crash PostgreSQL, never the machine.
async fn seed_data_dir(dir: &Path) {
    let template = template_cluster().await;
    std::fs::create_dir_all(dir).expect("mkdir");
    // -a: as root, the files stay the server user's; the data directory 0700.
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(dir.join("data")),
        "copying the template cluster",
    );
}

/// Runs `cmd` to the end; panics with `what` and its stderr unless it
/// succeeded.
fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

static TEMPLATE: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();

/// `$TMPDIR/leaseq-pg-template-<key>`: an initialised, cleanly stopped
/// cluster (with the `leaseq` database), made by the first test process
/// that needs it and renamed into place whole, so a process that finds it
/// finds it complete. The key names the `postgres` binary (path, size,
/// mtime): an upgraded PostgreSQL gets a template of its own.
async fn template_cluster() -> &'static Path {
    TEMPLATE
        .get_or_init(|| async {
            use std::hash::{Hash, Hasher};
            let postgres = pg_bin().join("postgres");
            let meta = std::fs::metadata(&postgres).expect("stat postgres");
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&postgres, meta.len(), meta.modified().ok()).hash(&mut h);
            let tmp = std::env::temp_dir();
            let done = tmp.join(format!("leaseq-pg-template-{:016x}", h.finish()));
            if done.join("data/PG_VERSION").is_file() {
                return done;
            }
            let building = tmp.join(format!(
                "leaseq-pg-template-building-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&building).expect("mkdir");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&building, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            let pg = EmbeddedPostgres::start(EmbeddedOptions {
                dir: building.clone(),
                durable: false,
            })
            .await
            .expect("starting the template cluster");
            pg.stop().await.expect("stopping the template cluster");
            // Another process may have won the race: its copy is as good.
            if std::fs::rename(&building, &done).is_err() {
                let _ = std::fs::remove_dir_all(&building);
            }
            assert!(
                done.join("data/PG_VERSION").is_file(),
                "no template cluster at {}",
                done.display()
            );
            done
        })
        .await
}

/// As root, the (uid, gid) the server runs as (`postgres`, else `nobody`,
/// as in `leaseq::embedded`); None otherwise.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    for name in [c"postgres", c"nobody"] {
        // SAFETY: getpwnam returns null or static storage, read at once.
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: checked non-null.
            return Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) });
        }
    }
    None
}

/// The directory with `pg_ctl` and `postgres`, searched like
/// `leaseq::embedded` searches for `initdb`.
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
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versioned.sort_by_key(|v| std::cmp::Reverse(v.0));
    candidates.extend(versioned.into_iter().map(|v| v.1));
    candidates.push("/usr/local/pgsql/bin".into());
    candidates
        .into_iter()
        .find(|d| is_file(&d.join("pg_ctl")) && is_file(&d.join("postgres")))
        .unwrap_or_else(|| panic!("pg_ctl not found (set LEASEQ_PG_BIN)"))
}

fn is_file(p: &Path) -> bool {
    p.is_file()
}
