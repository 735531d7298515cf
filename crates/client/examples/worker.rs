//! A worker built on `leaseq-client`: enqueues a few jobs, then handles jobs
//! of queue `examples` until Ctrl-C (or SIGTERM), stopping gracefully.
//!
//! ```sh
//! cargo run --release -- serve                # terminal 1: the broker
//! cargo run -p leaseq-client --example worker                  # terminal 2
//! LEASEQ_ADDR=http://broker:50051 cargo run -p leaseq-client --example worker
//! ```

use std::time::Duration;

use leaseq_client::{Client, Delivery, Job, Worker};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::var("LEASEQ_ADDR").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let client = Client::connect(addr).await?;

    for i in 0..5 {
        let job = Job::new("examples", format!("job {i}")).header("content-type", "text/plain");
        let sent = client.enqueue(job).await?;
        println!("enqueued {}", sent.job_id);
    }
    // Fails on its first attempt: the worker nacks it with the error text,
    // and the retry sees that text as `last_error`.
    client.enqueue(Job::new("examples", "flaky")).await?;

    Worker::new(client, ["examples"])
        .concurrency(4)
        .lease(Duration::from_secs(30))
        .grace(Duration::from_secs(10))
        .run(handle, shutdown())
        .await?;
    println!("stopped");
    Ok(())
}

/// Ok acks the job; Err nacks it (retried after the queue's backoff).
async fn handle(job: Delivery) -> anyhow::Result<()> {
    let payload = String::from_utf8_lossy(&job.payload);
    println!(
        "{} attempt {} payload {payload:?} last_error {:?}",
        job.id, job.attempt, job.last_error
    );
    if payload == "flaky" && job.attempt == 1 {
        anyhow::bail!("first attempts of flaky jobs fail");
    }
    // The worker extends the lease while this runs, however long it takes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
