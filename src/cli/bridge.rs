//! A bearer token for [`leaseq_client::Worker`] until the client crate can
//! put one on a `Client` itself.
//!
//! A `Client` (and so a `Worker`) is built on a plain
//! [`tonic::transport::Channel`], which cannot add a header to its calls;
//! the token rides on an intercepted channel ([`ClientChannel`]) instead.
//! [`channel`] joins the two: the `Channel` it returns connects, in memory,
//! to an HTTP/2 server in this process that passes every call on through
//! the intercepted channel (token added, TLS to the broker), streams and
//! trailers included. A call the broker cannot be reached for gets
//! `UNAVAILABLE`, which the worker retries as it would over a direct
//! connection.
//!
//! Remove this module once `leaseq_client::Client::connect_with(addr,
//! ConnectOptions)` exists: `ConnectArgs::lazy_client` then calls it.

use std::convert::Infallible;
use std::future::{Ready, poll_fn, ready};
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::DuplexStream;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::{Channel, Endpoint, Uri};

use super::connect::ClientChannel;

/// Bytes buffered each way between the `Channel` and the in-process server.
const PIPE_BYTES: usize = 256 * 1024;

/// A `Channel` whose calls reach the broker through `upstream`.
pub fn channel(upstream: ClientChannel) -> Channel {
    // The address is never dialled: `Connector` answers every connect.
    Endpoint::from_static("http://leaseq-bridge.invalid")
        .connect_with_connector_lazy(Connector { upstream })
}

/// Connects the `Channel` to a new in-process HTTP/2 server.
#[derive(Clone)]
struct Connector {
    upstream: ClientChannel,
}

impl Service<Uri> for Connector {
    type Response = TokioIo<DuplexStream>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (near, far) = tokio::io::duplex(PIPE_BYTES);
        let upstream = self.upstream.clone();
        tokio::spawn(async move {
            let forward = hyper::service::service_fn(move |req| forward(upstream.clone(), req));
            // Ends when the `Channel` drops its side of the pipe.
            let _ = http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(far), forward)
                .await;
        });
        ready(Ok(TokioIo::new(near)))
    }
}

/// Passes one call on to the broker and its response back.
async fn forward(
    mut upstream: ClientChannel,
    req: http::Request<Incoming>,
) -> Result<http::Response<Body>, Infallible> {
    let req = req.map(Body::new);
    let sent = match poll_fn(|cx| upstream.poll_ready(cx)).await {
        Ok(()) => upstream.call(req).await,
        Err(e) => Err(e),
    };
    Ok(match sent {
        Ok(response) => response.map(Body::new),
        Err(e) => tonic::Status::unavailable(format!("connecting to the broker: {e}")).into_http(),
    })
}
