// TLS, mutual TLS and a bearer token: the same options work for `Client`,
// `Worker` (through its client) and `AdminClient`.
//
//     LEASEQ_ADDR=https://broker:50051 LEASEQ_TLS_CA=ca.pem \
//     LEASEQ_CLIENT_CERT=worker.pem LEASEQ_CLIENT_KEY=worker.key \
//     LEASEQ_TOKEN=... cargo run -p leaseq-client --example tls
//
// Enqueues one job on queue `emails`, handles it with a worker, and stops.
// (tests/client.rs runs `round_trip` against a broker with TLS, client
// certificates and tokens.)

use std::time::Duration;

use leaseq_client::{Client, ConnectOptions, Delivery, Job, Worker};
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::var("LEASEQ_ADDR").unwrap_or_else(|_| "https://127.0.0.1:50051".into());
    let id = round_trip(&addr, options_from_env(), "emails").await?;
    println!("enqueued and handled {id} over TLS");
    Ok(())
}

/// The options from the variables every leaseq client reads
/// (`LEASEQ_TLS_CA`, `LEASEQ_CLIENT_CERT`, `LEASEQ_CLIENT_KEY`,
/// `LEASEQ_TOKEN`).
pub fn options_from_env() -> ConnectOptions {
    ConnectOptions::from_env()
}

/// Enqueues a job on `queue` and handles it, both with `opts`; returns its id.
pub async fn round_trip(addr: &str, opts: ConnectOptions, queue: &str) -> anyhow::Result<String> {
    // Unreadable files, an http:// address with TLS files and the like fail here,
    // naming the option; an unreachable broker too (connect_lazy_with
    // would wait for it).
    let client = Client::connect_with(addr, opts).await?;
    let sent = client.enqueue(Job::new(queue, "over TLS")).await?;

    let (done_tx, mut done) = mpsc::unbounded_channel();
    let worker = Worker::new(client, [queue]).run(
        move |job: Delivery| {
            let done_tx = done_tx.clone();
            async move {
                let _ = done_tx.send(job.id);
                Ok::<(), anyhow::Error>(())
            }
        },
        // Stop once the job was handled (its ack is sent before the stop ends).
        async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), done.recv()).await;
        },
    );
    worker.await?;
    Ok(sent.job_id)
}
