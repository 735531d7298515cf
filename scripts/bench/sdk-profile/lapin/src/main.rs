//! lapin-bench: RabbitMQ's Rust client (lapin) as a user would write a
//! worker and a producer, the peer of the Rust SDK in
//! scripts/bench/sdk-rabbitmq.sh (issue 36). A durable quorum queue,
//! persistent messages (delivery mode 2), the queue deleted at the end of
//! `worker` and `producer`. Each prints one JSON line.
//!
//!   lapin-bench fill URI QUEUE N [BYTES=100]
//!       the queue (re)declared, then N messages published with publisher
//!       confirms (at most 256 unconfirmed): the pre-fill of a worker run
//!   lapin-bench worker URI QUEUE N [PREFETCH=256]
//!       one consumer (basic.qos PREFETCH, manual acks) acks each delivery
//!       with one `ack().await` (multiple = false) until N are acked; the
//!       rate from the first delivery to the last ack's completion, and the
//!       process's CPU over that window (/proc/self/stat)
//!   lapin-bench producer URI QUEUE N SECS [BYTES=100]
//!       the queue (re)declared, then publishes one at a time, each awaited
//!       to its confirm (the peer of one acknowledged Enqueue), until N are
//!       confirmed or SECS have passed; the rate and CPU per message (one
//!       publish before the measured window, as every producer of the
//!       script does)
//!
//! Linux only (/proc). Not a test.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
        ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
};

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// utime + stime of this process (every thread), in seconds.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

async fn declare(ch: &Channel, queue: &str) -> Result<(), BoxErr> {
    ch.queue_delete(ShortString::from(queue), QueueDeleteOptions::default())
        .await?;
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    ch.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await?;
    Ok(())
}

fn publish_args() -> (ShortString, BasicPublishOptions, BasicProperties) {
    (
        ShortString::from(""),
        BasicPublishOptions::default(),
        BasicProperties::default().with_delivery_mode(2),
    )
}

/// `"secs": .., "rate": .., "cpu_s": .., "cpu_us_per_job": .., "cores": ..`
fn window(n: u64, secs: f64, cpu: f64) -> String {
    format!(
        r#""secs": {secs:.3}, "rate": {:.0}, "cpu_s": {cpu:.2}, "cpu_us_per_job": {:.1}, "cores": {:.2}"#,
        n as f64 / secs,
        cpu / n.max(1) as f64 * 1e6,
        cpu / secs
    )
}

async fn fill(ch: &Channel, queue: &str, n: u64, bytes: usize) -> Result<String, BoxErr> {
    let t0 = Instant::now();
    declare(ch, queue).await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (exchange, opts, props) = publish_args();
    let body = vec![b'x'; bytes];
    let rk = ShortString::from(queue);
    let mut inflight = futures_util::stream::FuturesUnordered::new();
    for _ in 0..n {
        if inflight.len() >= 256
            && let Some(c) = inflight.next().await
        {
            let c: lapin::Confirmation = c?;
            if !c.is_ack() {
                return Err("a publish was nacked".into());
            }
        }
        let confirm = ch
            .basic_publish(exchange.clone(), rk.clone(), opts, &body, props.clone())
            .await?;
        inflight.push(confirm);
    }
    while let Some(c) = inflight.next().await {
        if !c?.is_ack() {
            return Err("a publish was nacked".into());
        }
    }
    Ok(format!(
        r#"{{"filled": {n}, "queue": "{queue}", "bytes": {bytes}, "secs": {:.3}}}"#,
        t0.elapsed().as_secs_f64()
    ))
}

async fn worker(ch: &Channel, queue: &str, n: u64, prefetch: u16) -> Result<String, BoxErr> {
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            ShortString::from(queue),
            ShortString::from("lapin-bench"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut first = None;
    let mut done = 0u64;
    while done < n {
        let Some(d) = consumer.next().await else {
            break;
        };
        let d = d?;
        if first.is_none() {
            first = Some((Instant::now(), cpu_s()));
        }
        d.acker.ack(BasicAckOptions { multiple: false }).await?;
        done += 1;
    }
    let (t1, c1) = (Instant::now(), cpu_s());
    let mut out = format!(
        r#"{{"sdk": "lapin", "jobs": {done}, "credit": {prefetch}, "queue_type": "quorum""#
    );
    if let (Some((t0, c0)), true) = (first, done == n) {
        out += ", ";
        out += &window(n, (t1 - t0).as_secs_f64(), c1 - c0);
    }
    out += "}";
    Ok(out)
}

async fn producer(
    ch: &Channel,
    queue: &str,
    n: u64,
    secs: f64,
    bytes: usize,
) -> Result<String, BoxErr> {
    declare(ch, queue).await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (exchange, opts, props) = publish_args();
    let body = vec![b'x'; bytes];
    let rk = ShortString::from(queue);
    // One before the window, as every producer of the script does.
    ch.basic_publish(exchange.clone(), rk.clone(), opts, &body, props.clone())
        .await?
        .await?;
    let (t0, c0) = (Instant::now(), cpu_s());
    let deadline = t0 + Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    while sent < n && Instant::now() < deadline {
        let confirm = ch
            .basic_publish(exchange.clone(), rk.clone(), opts, &body, props.clone())
            .await?
            .await?;
        if !confirm.is_ack() {
            return Err("a publish was nacked".into());
        }
        sent += 1;
    }
    let (t1, c1) = (Instant::now(), cpu_s());
    Ok(format!(
        r#"{{"sdk": "lapin", "sent": {sent}, "bytes": {bytes}, "queue_type": "quorum", {}}}"#,
        window(sent, (t1 - t0).as_secs_f64(), c1 - c0)
    ))
}

#[tokio::main]
async fn main() -> Result<(), BoxErr> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: lapin-bench fill|worker|producer URI QUEUE N ...";
    if args.len() < 5 {
        return Err(usage.into());
    }
    let (cmd, uri, queue) = (args[1].as_str(), args[2].as_str(), args[3].as_str());
    let n: u64 = args[4].parse()?;
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let conn = Connection::connect(uri, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let line = match cmd {
        "fill" => fill(&ch, queue, n, arg(5, "100").parse()?).await?,
        "worker" => worker(&ch, queue, n, arg(5, "256").parse()?).await?,
        "producer" => {
            producer(&ch, queue, n, arg(5, "10").parse()?, arg(6, "100").parse()?).await?
        }
        _ => return Err(usage.into()),
    };
    if cmd != "fill" {
        // Outside the measured window: a new channel (the consumer's still
        // holds unacked deliveries when the run fell short).
        let admin = conn.create_channel().await?;
        admin
            .queue_delete(ShortString::from(queue), QueueDeleteOptions::default())
            .await?;
    }
    let _ = conn.close(200, ShortString::from("bye")).await;
    println!("{line}");
    Ok(())
}
