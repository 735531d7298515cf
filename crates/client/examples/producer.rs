// Producing jobs with `leaseq-client`: one at a time, a batch committed
// together, a delayed job, a deduplicated one (and its payload replaced
// while it waits: a debounce), and one carrying W3C trace context for the
// worker's spans.
//
//     cargo run --release -- serve                              # the broker
//     cargo run -p leaseq-client --example producer             # this
//     LEASEQ_ADDR=broker:50051 cargo run -p leaseq-client --example producer
//
// (tests/client.rs runs `produce` against a real broker.)

use std::time::Duration;

use leaseq_client::{Client, Job};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // LEASEQ_ADDR (default 127.0.0.1:50051), LEASEQ_TOKEN and the TLS
    // variables, as every leaseq client reads them.
    let client = Client::connect_env().await?;
    for id in produce(&client, "emails").await? {
        println!("enqueued {id}");
    }
    Ok(())
}

/// Enqueues five jobs on `queue` and returns their ids (the duplicate's is
/// the first one's).
pub async fn produce(client: &Client, queue: &str) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();

    // One job; returns once it is committed.
    let sent = client
        .enqueue(
            Job::new(queue, r#"{"to":"ada@example.com"}"#)
                .header("content-type", "application/json")
                .priority(5)
                .dedup_key("welcome-ada")
                // Once it completes, its key stays held for a day.
                .unique_for(Duration::from_secs(24 * 3600)),
        )
        .await?;
    ids.push(sent.job_id);

    // The same dedup key while that job is live: no second job.
    let again = client
        .enqueue(Job::new(queue, r#"{"to":"ada@example.com"}"#).dedup_key("welcome-ada"))
        .await?;
    assert!(again.duplicate && again.job_id == ids[0]);

    // Debounce: the key's job is still waiting, so it takes this payload
    // (and priority, headers, delay) and keeps its id (and its window).
    let newer = client
        .enqueue(
            Job::new(queue, r#"{"to":"ada@example.com","lang":"fr"}"#)
                .header("content-type", "application/json")
                .priority(5)
                .dedup_key("welcome-ada")
                .replace_waiting(),
        )
        .await?;
    assert!(newer.replaced && newer.job_id == ids[0]);

    // Several jobs, all or none.
    let batch = client
        .enqueue_batch([
            Job::new(queue, r#"{"to":"bob@example.com"}"#),
            Job::new(queue, r#"{"to":"eve@example.com"}"#).max_attempts(3),
        ])
        .await?;
    ids.extend(batch.into_iter().map(|e| e.job_id));

    // Not before a second from now.
    let later = client
        .enqueue(Job::new(queue, r#"{"to":"later@example.com"}"#).delay(Duration::from_secs(1)))
        .await?;
    ids.push(later.job_id);

    // Trace context: with OpenTelemetry, inject your current context into a
    // HashMap and pass it to `Job::headers`; here a fixed W3C traceparent.
    let traced = client
        .enqueue(
            Job::new(queue, r#"{"to":"traced@example.com"}"#)
                .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .tracestate("vendor=opaque"),
        )
        .await?;
    ids.push(traced.job_id);
    Ok(ids)
}
