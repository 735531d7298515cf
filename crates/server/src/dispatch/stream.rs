//! The delivery side of one stream (Subscribe or Consume).
//!
//! Deliveries arrive from the dispatcher over a bounded channel whose
//! capacity is at least the stream's credit (so a delivery never waits). On
//! top, [`DeliveryStream`] interleaves heartbeats on an idle stream, and its
//! drop guard tells the dispatcher the moment the stream is gone (client
//! disconnect, cancellation, connection reset) so its unsettled jobs are
//! released at once. [`SubscriptionStream`] is the Subscribe response built
//! on it; the Consume response (api/consume.rs) adds settle results.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tonic::Status;

use super::{Msg, StreamId};
use crate::pb;

/// What the dispatcher sends a stream: a delivery, or the status that ends it.
pub type Item = Result<Outgoing, Status>;

/// A delivery on its way to the client.
#[derive(Debug)]
pub struct Outgoing {
    pub delivery: pb::Delivery,
    /// The lease it carries (`Input::Unsent` names it).
    pub lease: (crate::domain::JobId, crate::domain::LeaseToken),
    /// Past this it is not sent: its lease may be three quarters over
    /// (`Core::assign`; a process frozen or stalled between the push and
    /// the write would otherwise send it late).
    pub send_by: Instant,
}

/// What a stream shows its client.
#[derive(Debug)]
pub enum Event {
    Delivery(pb::Delivery),
    Heartbeat(pb::Heartbeat),
}

pub struct DeliveryStream {
    rx: mpsc::Receiver<Item>,
    /// Set by the dispatcher before it releases the stream's jobs (its
    /// close, a drain): deliveries still waiting in `rx` are dropped, not
    /// sent (see `Outlet` in the dispatcher).
    released: Arc<AtomicBool>,
    /// The first event has been sent. It is always a heartbeat, even when a
    /// delivery is already waiting: clients (and tests) use it to know the
    /// subscription is registered.
    greeted: bool,
    heartbeat: Pin<Box<Sleep>>,
    interval: Duration,
    guard: CloseGuard,
}

impl DeliveryStream {
    pub(super) fn new(
        rx: mpsc::Receiver<Item>,
        released: Arc<AtomicBool>,
        interval: Duration,
        id: StreamId,
        dispatcher: mpsc::UnboundedSender<Msg>,
    ) -> Self {
        DeliveryStream {
            rx,
            released,
            greeted: false,
            // Reset when the first event (a heartbeat) goes out.
            heartbeat: Box::pin(tokio::time::sleep(interval)),
            interval,
            guard: CloseGuard { id, dispatcher },
        }
    }

    fn beat(&mut self) -> pb::Heartbeat {
        let next = Instant::now() + self.interval;
        self.heartbeat.as_mut().reset(next);
        pb::Heartbeat {
            sent_at: Some(std::time::SystemTime::now().into()),
        }
    }
}

impl Stream for DeliveryStream {
    type Item = Result<Event, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if !this.greeted {
            this.greeted = true;
            return Poll::Ready(Some(Ok(Event::Heartbeat(this.beat()))));
        }
        if this.released.load(Ordering::Acquire) {
            // The jobs were released: what still waits is not the client's
            // any more. Only the end (or the drain's status) goes out.
            loop {
                match this.rx.poll_recv(cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(Some(Err(status))) => return Poll::Ready(Some(Err(status))),
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        while let Poll::Ready(item) = this.rx.poll_recv(cx) {
            let now = Instant::now();
            if let Some(Ok(out)) = &item
                && now >= out.send_by
            {
                // Too late to be of use: the dispatcher releases it.
                let (id, token) = out.lease;
                let _ = this.guard.dispatcher.send(Msg::In(super::Input::Unsent(
                    this.guard.id,
                    id,
                    token,
                )));
                continue;
            }
            this.heartbeat.as_mut().reset(now + this.interval);
            return Poll::Ready(item.map(|r| r.map(|out| Event::Delivery(out.delivery))));
        }
        if this.heartbeat.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Ok(Event::Heartbeat(this.beat()))));
        }
        Poll::Pending
    }
}

/// The response stream of one Subscribe call.
pub struct SubscriptionStream(DeliveryStream);

impl SubscriptionStream {
    pub(super) fn new(inner: DeliveryStream) -> Self {
        SubscriptionStream(inner)
    }
}

impl Stream for SubscriptionStream {
    type Item = Result<pb::SubscribeResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use pb::subscribe_response::Kind;
        Pin::new(&mut self.0).poll_next(cx).map(|item| {
            item.map(|r| {
                r.map(|event| pb::SubscribeResponse {
                    kind: Some(match event {
                        Event::Delivery(d) => Kind::Delivery(d),
                        Event::Heartbeat(h) => Kind::Heartbeat(h),
                    }),
                })
            })
        })
    }
}

/// Sends `Closed` to the dispatcher when the stream is dropped.
struct CloseGuard {
    id: StreamId,
    dispatcher: mpsc::UnboundedSender<Msg>,
}

impl Drop for CloseGuard {
    fn drop(&mut self) {
        let _ = self.dispatcher.send(Msg::In(super::Input::Closed(self.id)));
    }
}
