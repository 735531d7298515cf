//! One trace from a Python producer through the broker to a Node worker, as
//! a real OTLP receiver sees it: a tonic server implementing the OTLP trace
//! service (opentelemetry-proto's generated one) in this test, the `leaseq`
//! binary with `--otlp-endpoint` pointing at it, the Python SDK enqueueing
//! inside a span and the Node SDK's Worker handling the job, both exporting
//! through their OpenTelemetry SDKs (`clients/setup.sh traces node` installs
//! them from PyPI and npm on first use).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use serde_json::Value;
use tonic::{Request, Response, Status};

use crate::common::*;

/// One span as received, flattened.
#[derive(Clone, Debug)]
struct Got {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
    /// The span's status code (0 unset, 1 ok, 2 error).
    status: i32,
}

/// The OTLP/gRPC trace service, keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let resource = rs
                .resource
                .map(|r| attrs(&r.attributes))
                .unwrap_or_default();
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Got {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attrs: attrs(&span.attributes),
                    status: span.status.map_or(0, |s| s.code),
                });
            }
        }
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap().clone()
    }

    fn of(&self, service: &str) -> Vec<Got> {
        self.spans()
            .into_iter()
            .filter(|s| s.service == service)
            .collect()
    }
}

fn attrs(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v: &AnyValue| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients")
}

/// Runs a program to its end (within `limit`) and returns the JSON object
/// its last stdout line holds; panics with its output otherwise.
async fn json_of(mut cmd: tokio::process::Command, what: &str, limit: Duration) -> Value {
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{what} printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_a_python_producer_through_the_broker_to_a_node_worker() {
    // The Python venv with the OTel SDK and exporter, and the Node package
    // with its dev dependencies (the OTel SDK and exporter among them).
    let setup = tokio::process::Command::new("bash")
        .arg(clients_dir().join("setup.sh"))
        .args(["traces", "node"])
        .status()
        .await
        .expect("running clients/setup.sh (needs bash)");
    assert!(setup.success(), "clients/setup.sh traces node: {setup}");

    // The receiver, on loopback and a port of its own.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let db = TestDb::new().await;
    let mut broker = BinaryBroker::start(&db, &["--otlp-endpoint", &otlp]).await;
    let queue = format!("traces-{}", uuid::Uuid::new_v4().simple());
    let addr = broker.addr.to_string();

    let python = clients_dir().join("python/.venv-traces/bin/python");
    let mut producer = tokio::process::Command::new(python);
    producer
        .arg(clients_dir().join("python/tests/otlp_producer.py"))
        .env("LEASEQ_ADDR", &addr)
        .env("QUEUE", &queue)
        .env("OTLP_ENDPOINT", &otlp);
    let produced = json_of(producer, "the Python producer", Duration::from_secs(60)).await;

    let mut worker = tokio::process::Command::new("node");
    worker
        .arg(clients_dir().join("node/harness/otlp-worker.mjs"))
        .current_dir(clients_dir().join("node"))
        .env("LEASEQ_ADDR", &addr)
        .env("QUEUE", &queue)
        .env("OTLP_ENDPOINT", &otlp);
    let handled = json_of(worker, "the Node worker", Duration::from_secs(60)).await;

    let trace = produced["trace_id"].as_str().unwrap().to_owned();
    let checkout = produced["span_id"].as_str().unwrap().to_owned();
    let job = produced["job_id"].as_str().unwrap().to_owned();
    assert_eq!(handled["job_id"], job.as_str(), "{handled}");
    // (Its flags may be 03: newer SDKs set W3C level 2's random-id bit.)
    let header = handled["traceparent"].as_str().unwrap();
    assert!(
        header.starts_with(&format!("00-{trace}-{checkout}-")),
        "the job's header is the producer's span: {header}"
    );
    assert_eq!(handled["trace_id"], trace.as_str(), "{handled}");

    // A drain ends with the broker's last export (the batch exporter would
    // otherwise send within 5 s).
    broker.signal(libc::SIGTERM);
    assert!(broker.wait(Duration::from_secs(30)).await.success());
    eventually(Duration::from_secs(20), "the spans of all three", || {
        let names: Vec<String> = receiver.spans().iter().map(|s| s.name.clone()).collect();
        let want = [
            "checkout".to_owned(),
            format!("enqueue {queue}"),
            format!("deliver {queue}"),
            format!("ack {queue}"),
            format!("{queue} process"),
        ];
        let all = want.iter().all(|w| names.contains(w));
        async move { all }
    })
    .await;

    let spans = receiver.spans();
    let by_name = |service: &str, name: &str| -> Got {
        let found: Vec<Got> = receiver
            .of(service)
            .into_iter()
            .filter(|s| s.name == name)
            .collect();
        assert_eq!(found.len(), 1, "one {name:?} of {service}: {spans:#?}");
        found[0].clone()
    };
    let producer_span = by_name("python-producer", "checkout");
    assert_eq!(
        (
            producer_span.trace_id.as_str(),
            producer_span.span_id.as_str()
        ),
        (trace.as_str(), checkout.as_str())
    );
    // The broker's spans: each a child of the job's traceparent (the
    // producer's span), with the job id and queue.
    for (name, op) in [
        (format!("enqueue {queue}"), "send"),
        (format!("deliver {queue}"), "receive"),
        (format!("ack {queue}"), "settle"),
    ] {
        let s = by_name("leaseq", &name);
        assert_eq!(s.trace_id, trace, "{s:#?}");
        assert_eq!(s.parent, checkout, "{s:#?}");
        assert_eq!(s.attrs["messaging.message.id"], job, "{s:#?}");
        assert_eq!(s.attrs["leaseq.job.id"], job, "{s:#?}");
        assert_eq!(s.attrs["messaging.destination.name"], queue, "{s:#?}");
        assert_eq!(s.attrs["messaging.operation.type"], op, "{s:#?}");
        assert_ne!(s.status, 2, "not an error: {s:#?}");
    }
    assert_eq!(
        by_name("leaseq", &format!("enqueue {queue}")).attrs["rpc.method"],
        "Enqueue"
    );
    assert_eq!(
        by_name("leaseq", &format!("ack {queue}")).attrs["rpc.method"],
        "Consume",
        "the Node worker acks on its Consume stream"
    );
    // The Node handler's span: the same trace, a child of the producer's.
    let handler = by_name("node-worker", &format!("{queue} process"));
    assert_eq!(handler.trace_id, trace);
    assert_eq!(handler.parent, checkout);
    assert_eq!(handler.span_id, handled["span_id"].as_str().unwrap());
    assert_eq!(handler.attrs["leaseq.job.id"], job);
    // Every span that names the job is in the one trace.
    let about_job: Vec<&Got> = spans
        .iter()
        .filter(|s| s.attrs.get("leaseq.job.id") == Some(&job))
        .collect();
    assert!(about_job.len() >= 4, "{about_job:#?}");
    assert!(
        about_job.iter().all(|s| s.trace_id == trace),
        "{about_job:#?}"
    );
    server.abort();
}
