// The admin client: queue settings, pause and resume, statistics, jobs and
// dead letters. With tokens on, it needs a token granted `admin` on `*`.
//
//     LEASEQ_ADDR=127.0.0.1:50051 cargo run -p leaseq-client --example admin
//     (LEASEQ_TLS_CA, LEASEQ_CLIENT_CERT/KEY and LEASEQ_TOKEN as in the tls example)
//
// (tests/client.rs runs `tour` against a real broker.)

use std::time::Duration;

use leaseq_client::{AdminClient, Client, DeadLetters, Job, QueueUpdate, pb};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // LEASEQ_ADDR, LEASEQ_TOKEN and the TLS variables.
    let client = Client::connect_env().await?;
    for line in tour(&client, "examples.admin").await? {
        println!("{line}");
    }
    Ok(())
}

/// Creates and tunes `queue`, looks at it and at a job, and moves its dead
/// letters back to it. Returns what it saw, one line per step.
pub async fn tour(client: &Client, queue: &str) -> anyhow::Result<Vec<String>> {
    // On the client's connection and token; `AdminClient::connect_with`
    // opens one of its own.
    let admin: AdminClient = client.admin();
    let mut seen = Vec::new();

    let info = admin
        .update_queue(
            queue,
            QueueUpdate::new()
                .create()
                .max_attempts(1)
                .default_lease(Duration::from_secs(60))
                .backoff(Duration::from_millis(500), Duration::from_secs(60)),
        )
        .await?;
    let settings = info.settings.unwrap_or_default();
    seen.push(format!(
        "{}: max_attempts {}",
        info.name, settings.max_attempts
    ));

    admin.pause_queue(queue).await?;
    let job = client.enqueue(Job::new(queue, "inspect me")).await?;
    let stats = admin.get_queue(queue).await?.stats.unwrap_or_default();
    seen.push(format!("paused, available {}", stats.available));

    let got = admin.get_job(&job.job_id).await?;
    let state = pb::JobState::try_from(got.state).map_or("unknown", |s| s.as_str_name());
    seen.push(format!("job {} is {state}", got.id));
    let listed = admin
        .list_jobs(pb::ListJobsRequest {
            queue: queue.to_owned(),
            ..Default::default()
        })
        .await?;
    seen.push(format!("{} live job(s)", listed.jobs.len()));

    // Gone for good (a worker holding it would see FAILED_PRECONDITION).
    let was_leased = admin.cancel_job(&job.job_id).await?;
    seen.push(format!("cancelled (was leased: {was_leased})"));
    admin.resume_queue(queue).await?;

    let queues = admin.queues().await?;
    seen.push(format!("{} queue(s)", queues.len()));

    let dead = admin.list_dead_letters(queue, 100, "", false).await?;
    let ids: Vec<String> = dead.jobs.into_iter().map(|j| j.id).collect();
    if !ids.is_empty() {
        let r = admin
            .requeue_dead_letters(DeadLetters::ids(ids).in_queue(queue))
            .await?;
        seen.push(format!("requeued {}", r.requeued));
    }
    let purged = admin.purge_dead_letters(DeadLetters::all(queue)).await?;
    seen.push(format!("purged {purged} dead letter(s)"));
    Ok(seen)
}
