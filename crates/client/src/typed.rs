//! Typed payloads: JSON through serde, and [`Task`], a queue and its
//! payload type declared once for the producer and the handler (as
//! Celery's `task.delay()` or BullMQ's `queue.add`).

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;

use crate::{Client, Delivery, Enqueued, Job, pb};

/// The `content-type` of a JSON payload.
pub const JSON: &str = "application/json";

impl Job {
    /// A job whose payload is `value` as JSON, with `content-type:
    /// application/json`.
    ///
    /// ```
    /// # use leaseq_client::Job;
    /// #[derive(serde::Serialize)]
    /// struct Email<'a> { to: &'a str }
    /// let job = Job::json("emails", &Email { to: "a@b.c" })?.priority(5);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn json<T: Serialize + ?Sized>(
        queue: impl Into<String>,
        value: &T,
    ) -> Result<Job, serde_json::Error> {
        Ok(Job::new(queue, serde_json::to_vec(value)?).header("content-type", JSON))
    }
}

impl Delivery {
    /// The payload read as JSON into `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

/// A queue whose payloads are `T` as JSON: the producer's
/// [`enqueue`](Task::enqueue) and the worker's
/// [`Worker::task`](crate::Worker::task) share it, so the type is declared
/// once.
///
/// ```no_run
/// use leaseq_client::{Client, Delivery, Task, Worker};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Email { to: String }
///
/// const EMAILS: Task<Email> = Task::new("emails");
///
/// # async fn demo(client: Client) -> anyhow::Result<()> {
/// EMAILS.enqueue(&client, &Email { to: "a@b.c".into() }).await?;
/// Worker::builder(client)
///     .task(EMAILS, |email: Email, _job: Delivery| async move {
///         println!("to {}", email.to);
///         Ok::<(), anyhow::Error>(())
///     })
///     .serve(async { tokio::signal::ctrl_c().await.ok(); })
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct Task<T> {
    queue: &'static str,
    _payload: PhantomData<fn(T) -> T>,
}

impl<T> Clone for Task<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Task<T> {}

impl<T> std::fmt::Debug for Task<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("queue", &self.queue)
            .field("payload", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> Task<T> {
    /// The task of `queue` (a `const`, so a module can declare its tasks).
    pub const fn new(queue: &'static str) -> Task<T> {
        Task {
            queue,
            _payload: PhantomData,
        }
    }

    /// Its queue.
    pub fn queue(&self) -> &'static str {
        self.queue
    }
}

impl<T: Serialize> Task<T> {
    /// The job for `payload`, to set more options (priority, delay, dedup
    /// key...) before [`Client::enqueue`].
    pub fn job(&self, payload: &T) -> Result<Job, serde_json::Error> {
        Job::json(self.queue, payload)
    }

    /// Enqueues `payload`. A payload serde cannot write is refused as
    /// `INVALID_ARGUMENT` before anything is sent.
    pub async fn enqueue(&self, client: &Client, payload: &T) -> Result<Enqueued, Status> {
        let job = self
            .job(payload)
            .map_err(|e| Status::invalid_argument(format!("payload: {e}")))?;
        client.enqueue(job).await
    }

    /// Enqueues `payload` and waits (WaitJob, no polling) for its handler's
    /// result, read as JSON into `R` (what a handler returning
    /// `Ok(Ack::json(&value)?)` sent), as Celery's `AsyncResult.get()`.
    /// `timeout` as [`Client::wait_job`] (`DEADLINE_EXCEEDED` past it). A
    /// job that ended otherwise (dead, cancelled, unknown) is `ABORTED`,
    /// naming how; a result that is not an `R`, `INTERNAL`.
    pub async fn enqueue_and_wait<R: DeserializeOwned>(
        &self,
        client: &Client,
        payload: &T,
        timeout: Option<std::time::Duration>,
    ) -> Result<R, Status> {
        let job = self.enqueue(client, payload).await?;
        let outcome = client.wait_job(&job.job_id, timeout).await?;
        json_result(&outcome)
    }
}

/// A completed job's result read as JSON into `R`; `ABORTED` naming how the
/// job ended when it did not complete.
pub fn json_result<R: DeserializeOwned>(outcome: &pb::WaitJobResponse) -> Result<R, Status> {
    match pb::WaitState::try_from(outcome.state) {
        Ok(pb::WaitState::Completed) => serde_json::from_slice(&outcome.result).map_err(|e| {
            Status::internal(format!(
                "job {}: its result is not the JSON expected: {e}",
                outcome.job_id
            ))
        }),
        Ok(pb::WaitState::Dead) => Err(Status::aborted(format!(
            "job {} is dead ({}): {}",
            outcome.job_id, outcome.dead_reason, outcome.last_error
        ))),
        Ok(pb::WaitState::Cancelled) => Err(Status::aborted(format!(
            "job {} was cancelled",
            outcome.job_id
        ))),
        _ => Err(Status::aborted(format!(
            "job {} is unknown (no live job and no record)",
            outcome.job_id
        ))),
    }
}
