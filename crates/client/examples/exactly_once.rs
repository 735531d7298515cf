// Exactly-once effects (docs/clients.md, "Exactly-once effects"): a worker
// whose handlers commit their job's outcome together with what the job does.
//
//   orders    each order writes a row in `shipments`, enqueues its
//             "shipping" job and acks its own job in one transaction of the
//             application's database (the broker's database):
//             `select leaseq.ack($1, $2)` beside the insert. A crash before
//             the commit leaves none of them (the job comes back); after
//             it, all. The handler returns Ack::settled_in_sql(): the worker
//             sends no ack.
//   shipping  each shipping job acks with a follow-up job on "emails", in
//             the broker's own transaction (Ack::then): the email exists if
//             and only if the ack committed.
//
//     cargo run --release -- serve                                       # the broker
//     DATABASE_URL=postgres://... cargo run -p leaseq-client --example exactly_once
//
// It enqueues three orders, works until nothing is left (burst mode), and
// prints the shipments. (tests/client_effects.rs runs it against a real
// broker and PostgreSQL.)

use std::time::Duration;

use leaseq_client::{Ack, Client, Delivery, Job, Worker};
use sqlx::PgPool;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::connect_env().await?;
    let db = PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    create_table(&db).await?;
    for order in ["order-1", "order-2", "order-3"] {
        client.enqueue(Job::new("orders", order)).await?;
    }
    worker(client, db.clone())
        .burst(Duration::from_secs(1))
        .serve(std::future::pending())
        .await?;
    let rows: Vec<(String,)> = sqlx::query_as("select order_ref from shipments order by order_ref")
        .fetch_all(&db)
        .await?;
    for (order,) in rows {
        println!("shipped {order}");
    }
    Ok(())
}

/// The application's table, in the broker's database.
pub async fn create_table(db: &PgPool) -> sqlx::Result<()> {
    sqlx::query(
        "create table if not exists shipments (
             job_id uuid primary key,   -- at most one row per job, whatever happens
             order_ref text not null
         )",
    )
    .execute(db)
    .await?;
    Ok(())
}

pub fn worker(client: Client, db: PgPool) -> Worker {
    Worker::builder(client)
        .handle("orders", move |job| ship(db.clone(), job))
        .handle("shipping", notify)
}

/// The effect, the next job and the ack in one transaction. Should the ack fail (the
/// lease ran out and the job went to another worker: SQLSTATE 55000), the
/// insert rolls back with it and the error nacks nothing (the job is no
/// longer ours): the other worker's run is the one that counts.
pub async fn ship(db: PgPool, job: Delivery) -> anyhow::Result<Ack> {
    let order = String::from_utf8_lossy(&job.payload).into_owned();
    let mut tx = db.begin().await?;
    sqlx::query("insert into shipments (job_id, order_ref) values ($1::uuid, $2)")
        .bind(&job.id)
        .bind(&order)
        .execute(&mut *tx)
        .await?;
    sqlx::query("select leaseq.enqueue(queue => 'shipping', payload => convert_to($1, 'UTF8'))")
        .bind(&order)
        .execute(&mut *tx)
        .await?;
    sqlx::query("select leaseq.ack($1::uuid, $2)")
        .bind(&job.id)
        .bind(&job.lease_token)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Ack::settled_in_sql())
}

/// Acks a shipping job together with the email that follows from it.
async fn notify(job: Delivery) -> anyhow::Result<Ack> {
    let order = String::from_utf8_lossy(&job.payload).into_owned();
    Ok(Ack::new().then(Job::new("emails", format!("your {order} has shipped"))))
}
