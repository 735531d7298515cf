//! The response stream of one Subscribe call.
//!
//! Deliveries arrive from the dispatcher over a bounded channel whose capacity
//! is the stream's credit (so it can never hold more than `max_in_flight`
//! jobs). On top, this wrapper interleaves heartbeats on an idle stream, and
//! its drop guard tells the dispatcher the moment the stream is gone (client
//! disconnect, cancellation, connection reset) so the stream's unsettled jobs
//! are released at once.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tonic::Status;

use super::{Msg, StreamId};
use crate::pb;

pub type Item = Result<pb::SubscribeResponse, Status>;

pub struct SubscriptionStream {
    rx: mpsc::Receiver<Item>,
    /// The first message has been sent. It is always a heartbeat, even when
    /// a delivery is already waiting: clients (and tests) use it to know the
    /// subscription is registered.
    greeted: bool,
    heartbeat: Pin<Box<Sleep>>,
    interval: Duration,
    _guard: CloseGuard,
}

impl SubscriptionStream {
    pub(super) fn new(
        rx: mpsc::Receiver<Item>,
        interval: Duration,
        id: StreamId,
        dispatcher: mpsc::UnboundedSender<Msg>,
    ) -> Self {
        SubscriptionStream {
            rx,
            greeted: false,
            // Reset when the first message (a heartbeat) goes out.
            heartbeat: Box::pin(tokio::time::sleep(interval)),
            interval,
            _guard: CloseGuard { id, dispatcher },
        }
    }
}

fn heartbeat() -> pb::SubscribeResponse {
    pb::SubscribeResponse {
        kind: Some(pb::subscribe_response::Kind::Heartbeat(pb::Heartbeat {
            sent_at: Some(std::time::SystemTime::now().into()),
        })),
    }
}

impl Stream for SubscriptionStream {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = self.get_mut();
        if !this.greeted {
            this.greeted = true;
            let next = Instant::now() + this.interval;
            this.heartbeat.as_mut().reset(next);
            return Poll::Ready(Some(Ok(heartbeat())));
        }
        if let Poll::Ready(item) = this.rx.poll_recv(cx) {
            let next = Instant::now() + this.interval;
            this.heartbeat.as_mut().reset(next);
            return Poll::Ready(item);
        }
        if this.heartbeat.as_mut().poll(cx).is_ready() {
            let next = Instant::now() + this.interval;
            this.heartbeat.as_mut().reset(next);
            return Poll::Ready(Some(Ok(heartbeat())));
        }
        Poll::Pending
    }
}

/// Sends `Closed` to the dispatcher when the response stream is dropped.
struct CloseGuard {
    id: StreamId,
    dispatcher: mpsc::UnboundedSender<Msg>,
}

impl Drop for CloseGuard {
    fn drop(&mut self) {
        let _ = self.dispatcher.send(Msg::Closed(self.id));
    }
}
