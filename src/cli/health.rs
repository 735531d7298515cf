//! `leaseq health`: one `grpc.health.v1.Health/Check` call, exit 0 when the
//! broker answers SERVING. The container image's HEALTHCHECK
//! (deploy/Dockerfile), for which it runs beside `leaseq serve` in the same
//! environment: without `--addr` / `LEASEQ_ADDR` it checks the port of
//! `LEASEQ_LISTEN` on loopback, so the image's one setting serves both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::connect::{ClientSecurity, DEFAULT_ADDR, channel};
use super::exit::{CliError, Exit};
use super::output::{self, Output};

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// Broker address. Default: the port of LEASEQ_LISTEN (the address
    /// `leaseq serve` listens on in the same environment) on loopback, else
    /// http://127.0.0.1:50051.
    #[arg(long, env = "LEASEQ_ADDR")]
    pub addr: Option<String>,
    /// `leaseq serve`'s listen address, read from its variable: where to
    /// check when no --addr is given.
    #[arg(long, env = "LEASEQ_LISTEN", hide = true)]
    pub listen: Option<SocketAddr>,
    /// The service to check: leaseq.v1.QueueService is SERVING while
    /// PostgreSQL answers and no drain has begun (readiness); `liveness`
    /// while the process runs.
    #[arg(long, default_value = "leaseq.v1.QueueService")]
    pub service: String,
    /// Give up after this long (connection and call).
    #[arg(long, default_value = "2s", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub security: ClientSecurity,
    /// Output: the status (`SERVING`), or {"addr", "service", "status"}.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

impl HealthArgs {
    /// --addr, else LEASEQ_LISTEN's port on loopback (the listen address
    /// itself when it names one host), else the default.
    pub fn address(&self) -> String {
        if let Some(addr) = &self.addr {
            return addr.clone();
        }
        match self.listen {
            Some(listen) => {
                let ip = match listen.ip() {
                    IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
                    ip => ip,
                };
                format!("http://{}", SocketAddr::new(ip, listen.port()))
            }
            None => DEFAULT_ADDR.to_owned(),
        }
    }
}

pub async fn run(args: HealthArgs) -> Result<(), CliError> {
    let addr = args.address();
    let check = async {
        let channel = channel(&addr, &args.security.options()).await?;
        let resp = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await?;
        Ok::<_, CliError>(resp.into_inner().status())
    };
    let status = tokio::time::timeout(args.timeout, check)
        .await
        .map_err(|_| {
            CliError::new(
                Exit::Unavailable,
                format!("{addr} did not answer within {:?}", args.timeout),
            )
        })??;
    let name = status.as_str_name();
    match args.output {
        Output::Json => output::print_json(&json!({
            "addr": addr,
            "service": args.service,
            "status": name,
        })),
        Output::Table => println!("{name}"),
    }
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(CliError::new(
            Exit::Unavailable,
            format!("{} on {addr} is {name}", args.service),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        health: HealthArgs,
    }

    fn address(argv: &[&str]) -> String {
        let mut all = vec!["leaseq"];
        all.extend_from_slice(argv);
        Cli::try_parse_from(all).unwrap().health.address()
    }

    #[test]
    fn the_address_is_addr_else_the_listen_port_on_loopback() {
        // (--listen stands for LEASEQ_LISTEN, which the image sets.) A
        // LEASEQ_ADDR of the environment would win over it: as a user's.
        if std::env::var_os("LEASEQ_ADDR").is_some() {
            eprintln!("LEASEQ_ADDR is set: its precedence is what this would check");
            return;
        }
        assert_eq!(
            address(&["--listen", "0.0.0.0:50051"]),
            "http://127.0.0.1:50051"
        );
        assert_eq!(address(&["--listen", "[::]:7000"]), "http://[::1]:7000");
        assert_eq!(
            address(&["--listen", "10.1.2.3:7000"]),
            "http://10.1.2.3:7000"
        );
        assert_eq!(
            address(&["--listen", "0.0.0.0:1", "--addr", "https://b:443"]),
            "https://b:443"
        );
    }
}
