// A worker with a handler per queue, outcomes and a timeout. Enqueues a few
// sample jobs, then works until Ctrl-C or SIGTERM and stops gracefully.
//
//     cargo run --release -- serve                               # the broker
//     cargo run -p leaseq-client --example worker                # this
//     LEASEQ_ADDR=broker:50051 cargo run -p leaseq-client --example worker
//
// What happens to the samples:
//   emails "hello"      acked
//   emails "busy"       Retry: back 200 ms later as attempt 2, then acked
//   emails "bounce"     DeadLetter: straight to the dead letters
//   reports "slow"      runs past the 1 s timeout on attempt 1: cancelled,
//                       nacked, back after the queue's backoff, then acked
//   reports "broken"    any other error: nacked with its text until its
//                       max_attempts (2) are spent, then dead-lettered
//
// (tests/client.rs runs `enqueue_samples` and `worker` against a real broker.)

use std::time::Duration;

use leaseq_client::{Client, DeadLetter, Delivery, Job, Retry, Worker};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // LEASEQ_ADDR (default 127.0.0.1:50051), LEASEQ_TOKEN and the TLS
    // variables, as every leaseq client reads them.
    let client = Client::connect_env().await?;
    enqueue_samples(&client).await?;
    worker(client).serve(shutdown()).await?;
    println!("stopped");
    Ok(())
}

pub async fn enqueue_samples(client: &Client) -> anyhow::Result<()> {
    for payload in ["hello", "busy", "bounce"] {
        client.enqueue(Job::new("emails", payload)).await?;
    }
    client.enqueue(Job::new("reports", "slow")).await?;
    client
        .enqueue(Job::new("reports", "broken").max_attempts(2))
        .await?;
    Ok(())
}

/// The worker: a handler per queue, 4 handlers at once, a 1 s timeout for
/// reports.
pub fn worker(client: Client) -> Worker {
    Worker::builder(client)
        .handle("emails", send_email)
        .handle("reports", build_report)
        .queue_timeout("reports", Duration::from_secs(1))
        .concurrency(4)
        .lease(Duration::from_secs(30))
        .grace(Duration::from_secs(10))
}

/// `Ok` acks; `Retry` and `DeadLetter` (here inside anyhow) nack as they say.
async fn send_email(job: Delivery) -> anyhow::Result<()> {
    let payload = String::from_utf8_lossy(&job.payload).into_owned();
    println!("emails {} attempt {} {payload:?}", job.id, job.attempt);
    match payload.as_str() {
        "busy" if job.attempt == 1 => Err(Retry::after(Duration::from_millis(200))
            .because("mail server busy")
            .into()),
        "bounce" => Err(DeadLetter::new("address does not exist").into()),
        _ => Ok(()),
    }
}

/// Any error type that converts into `BoxError` works: here `String`.
async fn build_report(job: Delivery) -> Result<(), String> {
    let payload = String::from_utf8_lossy(&job.payload).into_owned();
    println!(
        "reports {} attempt {} {payload:?} last_error {:?}",
        job.id, job.attempt, job.last_error
    );
    match payload.as_str() {
        // Longer than the timeout: the worker drops this future and nacks.
        "slow" if job.attempt == 1 => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
        "broken" => Err(format!("cannot parse report {:?}", job.id)),
        _ => Ok(()),
    }
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
