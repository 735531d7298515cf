//! Client-side subcommands: `leaseq enqueue` and `leaseq tail` here, one
//! file per further command: [`work`], and the operator commands in [`admin`].

pub mod admin;

use std::io::Read;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::pb;
use crate::pb::queue_service_client::QueueServiceClient;

mod connect;
mod hash_token;
pub mod work;
pub use connect::{ClientChannel, ClientSecurity, connect};
pub use hash_token::{HashTokenArgs, run as hash_token};

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    /// Broker address.
    #[arg(long, env = "LEASEQ_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Queue name.
    #[arg(long, short)]
    pub queue: String,
    /// Payload; read from stdin when absent.
    #[arg(long, short)]
    pub payload: Option<String>,
    /// Priority (higher first).
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Deliver after this delay (e.g. 30s).
    #[arg(long, value_parser = crate::duration::parse_duration)]
    pub delay: Option<Duration>,
    /// De-duplication key.
    #[arg(long)]
    pub dedup_key: Option<String>,
    /// Header as KEY=VALUE (repeatable).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    #[command(flatten)]
    pub security: ClientSecurity,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    /// Broker address.
    #[arg(long, env = "LEASEQ_ADDR", default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Queue(s) to consume (repeatable).
    #[arg(long, short, required = true)]
    pub queue: Vec<String>,
    /// Consumer name.
    #[arg(long, default_value = "leaseq-tail")]
    pub consumer: String,
    /// Leave jobs unacked (they are released when tail exits).
    #[arg(long)]
    pub no_ack: bool,
    /// Exit after this many jobs.
    #[arg(long)]
    pub count: Option<u64>,
    #[command(flatten)]
    pub security: ClientSecurity,
}

pub async fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let mut client = QueueServiceClient::new(connect(&args.addr, &args.security).await?);
    let payload = match args.payload {
        Some(p) => p.into_bytes(),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf)?;
            buf
        }
    };
    let mut headers = std::collections::HashMap::new();
    for h in args.headers {
        let (k, v) = h
            .split_once('=')
            .with_context(|| format!("header {h:?} is not KEY=VALUE"))?;
        headers.insert(k.to_owned(), v.to_owned());
    }
    let resp = client
        .enqueue(pb::EnqueueRequest {
            queue: args.queue,
            payload,
            headers,
            priority: args.priority,
            delay: args.delay.map(|d| d.try_into()).transpose()?,
            dedup_key: args.dedup_key.unwrap_or_default(),
            ..Default::default()
        })
        .await?
        .into_inner();
    if resp.duplicate {
        println!("{} (duplicate)", resp.job_id);
    } else {
        println!("{}", resp.job_id);
    }
    Ok(())
}

pub async fn tail(args: TailArgs) -> anyhow::Result<()> {
    let mut client = QueueServiceClient::new(connect(&args.addr, &args.security).await?);
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            queues: args.queue,
            consumer: args.consumer,
            max_in_flight: 16,
            lease: None,
        })
        .await?
        .into_inner();
    let mut seen = 0u64;
    while let Some(msg) = stream.message().await? {
        let Some(pb::subscribe_response::Kind::Delivery(d)) = msg.kind else {
            continue;
        };
        let job = d.job.unwrap_or_default();
        println!(
            "{} queue={} attempt={} priority={} payload={}",
            job.id,
            job.queue,
            job.attempt,
            job.priority,
            String::from_utf8_lossy(&job.payload)
        );
        if !args.no_ack {
            client
                .ack(pb::AckRequest {
                    job_id: job.id,
                    lease_token: d.lease_token,
                })
                .await?;
        }
        seen += 1;
        if args.count.is_some_and(|n| seen >= n) {
            break;
        }
    }
    Ok(())
}
