//! The broker-wide cap on open Subscribe streams (`--max-streams`).
//!
//! Per-connection caps are HTTP/2's and tower's job (`server.rs` sets
//! `max_concurrent_streams` and `concurrency_limit_per_connection` with load
//! shedding); this one spans every connection, so it is a semaphore whose
//! permit lives inside the response stream and is returned when the stream is
//! dropped (client gone, drain, connection reset).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::conn_limit::StreamHold;
use crate::error::{Error, Result};

/// Counts open Subscribe streams against `--max-streams`.
#[derive(Clone, Debug)]
pub struct StreamLimit {
    /// One permit per stream that may still open; a stream holds its permit
    /// until it is dropped.
    permits: Arc<Semaphore>,
    max: usize,
}

impl StreamLimit {
    pub fn new(max: usize) -> StreamLimit {
        let max = max.min(Semaphore::MAX_PERMITS);
        StreamLimit {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A permit for one more stream, or RESOURCE_EXHAUSTED naming the limit.
    /// Never waits: a client over the limit should go to another replica.
    pub fn acquire(&self) -> Result<OwnedSemaphorePermit> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::LimitReached {
                limit: "max-streams",
                what: format!(
                    "this broker already serves its limit of {} Subscribe streams; retry later or on another replica",
                    self.max
                ),
            })
    }
}

/// A response stream that holds a [`StreamLimit`] permit while it lives
/// (and a Subscribe stream its place and credit on its connection).
pub struct Limited<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
    _hold: Option<StreamHold>,
}

impl<S> Limited<S> {
    pub fn new(inner: S, permit: OwnedSemaphorePermit) -> Limited<S> {
        Limited {
            inner,
            _permit: permit,
            _hold: None,
        }
    }

    /// Holds the stream's place and credit on its connection while it lives.
    pub fn holding(mut self, hold: Option<StreamHold>) -> Limited<S> {
        self._hold = hold;
        self
    }
}

impl<S: Stream + Unpin> Stream for Limited<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}
