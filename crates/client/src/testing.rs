//! A throwaway broker for tests: [`TestBroker::start`] runs the `leaseq`
//! binary (`$LEASEQ_BIN`, else `leaseq` on `PATH`) as `leaseq serve` with
//! its embedded PostgreSQL in a fresh temporary directory, on a free
//! loopback port, and stops it (SIGTERM to the process it started, which
//! stops its cluster) when dropped or [`stop`](TestBroker::stop)ped.
//!
//! ```no_run
//! use leaseq_client::{Job, Worker, testing::TestBroker};
//! use std::time::Duration;
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let broker = TestBroker::start().await?;
//! let client = broker.client().await?;
//! client.enqueue(Job::new("emails", "hi")).await?;
//! // Work what waits, then return.
//! Worker::new(client, ["emails"])
//!     .burst(Duration::from_millis(200))
//!     .run(|_job| async { Ok::<(), anyhow::Error>(()) }, std::future::pending())
//!     .await?;
//! broker.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! Start-up takes a few seconds (the embedded cluster's `initdb`): share
//! one broker across the tests of a file where you can, with queues of
//! their own.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{AdminClient, Client, ConnectError};

/// A `leaseq serve` started for a test (see the module's documentation).
pub struct TestBroker {
    child: Option<Child>,
    addr: SocketAddr,
    dir: PathBuf,
}

/// Why a test broker did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot run {bin:?} (set LEASEQ_BIN or put `leaseq` on PATH): {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("leaseq serve exited before it served ({0}); its output is above")]
    Exited(std::process::ExitStatus),
    #[error("leaseq serve did not serve within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl TestBroker {
    /// Starts a broker and waits (up to 60 s) until it answers.
    pub async fn start() -> Result<TestBroker, StartError> {
        let bin = std::env::var("LEASEQ_BIN").unwrap_or_else(|_| "leaseq".to_owned());
        TestBroker::start_binary(bin).await
    }

    /// The same with the `leaseq` binary at `bin`.
    pub async fn start_binary(bin: impl Into<String>) -> Result<TestBroker, StartError> {
        let bin = bin.into();
        let addr = free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "leaseq-test-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new(&bin)
            .arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(dir.join("pg"))
            .env_remove("DATABASE_URL")
            .env_remove("PGHOST")
            .env_remove("PGHOSTADDR")
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| StartError::Spawn { bin, source })?;
        let mut broker = TestBroker {
            child: Some(child),
            addr,
            dir,
        };
        let limit = Duration::from_secs(60);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = broker
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(StartError::Exited(status));
            }
            if let Ok(client) = broker.client().await
                && client.admin().queues().await.is_ok()
            {
                return Ok(broker);
            }
            if Instant::now() > deadline {
                return Err(StartError::Timeout(limit));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Where it listens (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of it.
    pub async fn client(&self) -> Result<Client, ConnectError> {
        Client::connect(format!("http://{}", self.addr)).await
    }

    /// An admin client of it.
    pub async fn admin(&self) -> Result<AdminClient, ConnectError> {
        AdminClient::connect(format!("http://{}", self.addr)).await
    }

    /// Stops it (SIGTERM: it drains, stops its cluster and exits) and
    /// removes its directory.
    pub async fn stop(mut self) {
        if let Some(child) = self.child.take() {
            let _ = tokio::task::spawn_blocking(move || terminate(child)).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM to the process we started, then wait (SIGKILL after 15 s).
fn terminate(mut child: Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn free_port() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}
