//! The delivery side of one stream (Subscribe or Consume).
//!
//! Deliveries arrive from the dispatcher over a bounded channel whose
//! capacity is at least the stream's credit (so a delivery never waits). On
//! top, [`DeliveryStream`] interleaves heartbeats on an idle stream, and its
//! drop guard tells the dispatcher the moment the stream is gone (client
//! disconnect, cancellation, connection reset) so its unsettled jobs are
//! released at once. [`SubscriptionStream`] is the Subscribe response built
//! on it; the Consume response (api/consume.rs) adds settle results.
//!
//! A stream whose client accepts `Deliveries` gets what already waits in
//! the channel packed into one response (at most `MAX_BATCH_DELIVERIES`
//! and `MAX_BATCH_BYTES`): the pack never waits to fill, so a delivery at
//! light load goes out as soon as it would alone. Each delivery keeps its
//! own `send_by` check: one too late is released, not packed.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tonic::Status;

use leaseq_proto::limits::{MAX_BATCH_BYTES, MAX_BATCH_DELIVERIES};
use prost::Message;

use super::{Msg, StreamId};
use crate::pb;

/// What the dispatcher sends a stream: a delivery or a cancel, or the
/// status that ends it.
pub type Item = Result<Push, Status>;

/// What goes out on a stream besides heartbeats. (Deliveries are the hot
/// path and cancels rare: the delivery is not boxed to make them alike.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Push {
    Deliver(Outgoing),
    /// A job the stream holds was cancelled (after its delivery: the
    /// channel keeps their order).
    Cancelled(pb::Cancelled),
}

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
    /// Two or more deliveries that were waiting together (a stream that
    /// accepts `Deliveries` only).
    Deliveries(Vec<pb::Delivery>),
    Cancelled(pb::Cancelled),
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
    /// The client reads `Deliveries`.
    batched: bool,
    /// An item taken from `rx` while packing that did not fit (the end of
    /// the stream, a status, a delivery over the byte bound): the next
    /// poll starts with it.
    held_over: Option<Option<Item>>,
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
            batched: false,
            held_over: None,
            // Reset when the first event (a heartbeat) goes out.
            heartbeat: Box::pin(tokio::time::sleep(interval)),
            interval,
            guard: CloseGuard { id, dispatcher },
        }
    }

    /// Packs deliveries waiting together into one response (the client
    /// listed `"deliveries"` in `accept`).
    pub(super) fn batched(mut self, on: bool) -> Self {
        self.batched = on;
        self
    }

    fn beat(&mut self) -> pb::Heartbeat {
        let next = Instant::now() + self.interval;
        self.heartbeat.as_mut().reset(next);
        pb::Heartbeat {
            sent_at: Some(std::time::SystemTime::now().into()),
            features: Vec::new(),
        }
    }

    /// The next item: one held over from packing, else from the channel.
    fn next_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        match self.held_over.take() {
            Some(item) => Poll::Ready(item),
            None => self.rx.poll_recv(cx),
        }
    }

    /// `out`, unless it is too late to be of use: then the dispatcher
    /// releases it.
    fn in_time(&self, out: Outgoing, now: Instant) -> Option<pb::Delivery> {
        if now < out.send_by {
            return Some(out.delivery);
        }
        let (id, token) = out.lease;
        let _ = self
            .guard
            .dispatcher
            .send(Msg::In(super::Input::Unsent(self.guard.id, id, token)));
        None
    }

    /// Adds to `first` what already waits in the channel, within the
    /// bounds; whatever does not fit is held over for the next poll.
    /// (`try_recv`, not `poll_recv`: it spends none of the task's
    /// cooperative budget, which would cut packs short at random.)
    fn pack(&mut self, first: pb::Delivery, now: Instant) -> Event {
        use mpsc::error::TryRecvError;
        let mut bytes = first.encoded_len();
        let mut pack = vec![first];
        while pack.len() < MAX_BATCH_DELIVERIES {
            let item = match self.rx.try_recv() {
                Err(TryRecvError::Empty) => break,
                Ok(Ok(Push::Deliver(out))) => out,
                Ok(other) => {
                    // A cancel or the end: after this pack.
                    self.held_over = Some(Some(other));
                    break;
                }
                Err(TryRecvError::Disconnected) => {
                    self.held_over = Some(None);
                    break;
                }
            };
            let size = item.delivery.encoded_len();
            if bytes + size > MAX_BATCH_BYTES {
                self.held_over = Some(Some(Ok(Push::Deliver(item))));
                break;
            }
            if let Some(d) = self.in_time(item, now) {
                bytes += size;
                pack.push(d);
            }
        }
        if pack.len() == 1 {
            Event::Delivery(pack.pop().expect("one"))
        } else {
            Event::Deliveries(pack)
        }
    }
}

impl Stream for DeliveryStream {
    type Item = Result<Event, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if !this.greeted {
            this.greeted = true;
            let mut hello = this.beat();
            // The first message says what this broker understands.
            hello.features = leaseq_proto::features::ALL
                .iter()
                .map(|f| (*f).to_owned())
                .collect();
            return Poll::Ready(Some(Ok(Event::Heartbeat(hello))));
        }
        if this.released.load(Ordering::Acquire) {
            // The jobs were released: what still waits is not the client's
            // any more. Only the end (or the drain's status) goes out.
            loop {
                match this.next_item(cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(Some(Err(status))) => return Poll::Ready(Some(Err(status))),
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        while let Poll::Ready(item) = this.next_item(cx) {
            let now = Instant::now();
            let event = match item {
                Some(Ok(Push::Deliver(out))) => match this.in_time(out, now) {
                    None => continue,
                    Some(d) if this.batched => this.pack(d, now),
                    Some(d) => Event::Delivery(d),
                },
                Some(Ok(Push::Cancelled(c))) => Event::Cancelled(c),
                Some(Err(status)) => return Poll::Ready(Some(Err(status))),
                None => return Poll::Ready(None),
            };
            this.heartbeat.as_mut().reset(now + this.interval);
            return Poll::Ready(Some(Ok(event)));
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
                        Event::Deliveries(d) => Kind::Deliveries(pb::Deliveries { deliveries: d }),
                        Event::Cancelled(c) => Kind::Cancelled(c),
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

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;
    use crate::dispatch::Input;
    use crate::domain::{JobId, LeaseToken};

    fn delivery(payload: usize) -> pb::Delivery {
        pb::Delivery {
            job: Some(pb::Job {
                id: uuid::Uuid::now_v7().to_string(),
                payload: vec![7; payload],
                ..Default::default()
            }),
            lease_token: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        }
    }

    fn outgoing(payload: usize, send_by: Instant) -> Item {
        Ok(Push::Deliver(Outgoing {
            delivery: delivery(payload),
            lease: (
                JobId::new(),
                LeaseToken(uuid::Uuid::new_v4(), crate::domain::ClusterId::HOME),
            ),
            send_by,
        }))
    }

    /// A stream over a channel of `cap`, its dispatcher's receiver, and
    /// its first event (the heartbeat) already taken.
    fn stream(
        cap: usize,
        batched: bool,
    ) -> (
        DeliveryStream,
        mpsc::Sender<Item>,
        mpsc::UnboundedReceiver<Msg>,
    ) {
        let (tx, rx) = mpsc::channel(cap);
        let (dtx, drx) = mpsc::unbounded_channel();
        let mut s = DeliveryStream::new(rx, Arc::default(), Duration::from_secs(60), 1, dtx)
            .batched(batched);
        match poll(&mut s) {
            Poll::Ready(Some(Ok(Event::Heartbeat(h)))) => {
                assert_eq!(h.features, leaseq_proto::features::ALL, "{h:?}");
            }
            other => panic!("first event: {other:?}"),
        }
        (s, tx, drx)
    }

    fn poll(s: &mut DeliveryStream) -> Poll<Option<Result<Event, Status>>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(s).poll_next(&mut cx)
    }

    fn sizes(e: &Poll<Option<Result<Event, Status>>>) -> Vec<usize> {
        match e {
            Poll::Ready(Some(Ok(Event::Delivery(d)))) => vec![d.encoded_len()],
            Poll::Ready(Some(Ok(Event::Deliveries(ds)))) => {
                ds.iter().map(Message::encoded_len).collect()
            }
            other => panic!("not deliveries: {other:?}"),
        }
    }

    #[tokio::test]
    async fn what_waits_together_goes_in_one_pack_within_the_count_bound() {
        let (mut s, tx, _d) = stream(1000, true);
        let later = Instant::now() + Duration::from_secs(60);
        for _ in 0..600 {
            tx.try_send(outgoing(10, later)).unwrap();
        }
        let packs: Vec<usize> = (0..3).map(|_| sizes(&poll(&mut s)).len()).collect();
        assert_eq!(packs, [256, 256, 88]);
        assert!(poll(&mut s).is_pending());
        // One alone goes alone, at once (no waiting to fill a pack).
        tx.try_send(outgoing(10, later)).unwrap();
        assert!(matches!(
            poll(&mut s),
            Poll::Ready(Some(Ok(Event::Delivery(_))))
        ));
    }

    #[tokio::test]
    async fn a_pack_stays_within_the_byte_bound_and_a_larger_delivery_goes_alone() {
        let (mut s, tx, _d) = stream(100, true);
        let later = Instant::now() + Duration::from_secs(60);
        // 24 KiB each: two fit in 64 KiB, three do not.
        for _ in 0..5 {
            tx.try_send(outgoing(24 * 1024, later)).unwrap();
        }
        // 100 KiB: over the bound alone, so alone.
        tx.try_send(outgoing(100 * 1024, later)).unwrap();
        tx.try_send(outgoing(10, later)).unwrap();
        let mut packs = Vec::new();
        while let p @ Poll::Ready(_) = poll(&mut s) {
            let sz = sizes(&p);
            packs.push(sz.len());
            if sz.len() > 1 {
                assert!(sz.iter().sum::<usize>() <= MAX_BATCH_BYTES, "{sz:?}");
            }
        }
        assert_eq!(packs, [2, 2, 1, 1, 1]);
    }

    #[tokio::test]
    async fn a_delivery_too_late_is_released_not_packed_and_an_end_waits_for_the_pack() {
        let (mut s, tx, mut d) = stream(100, true);
        let later = Instant::now() + Duration::from_secs(60);
        let past = Instant::now();
        tx.try_send(outgoing(10, later)).unwrap();
        tx.try_send(outgoing(10, past)).unwrap();
        tx.try_send(outgoing(10, later)).unwrap();
        tx.try_send(Err(Status::unavailable("draining"))).unwrap();
        assert_eq!(sizes(&poll(&mut s)).len(), 2);
        match d.try_recv() {
            Ok(Msg::In(Input::Unsent(1, _, _))) => {}
            Ok(_) => panic!("the late one is released: another message"),
            Err(e) => panic!("the late one is released: {e:?}"),
        }
        match poll(&mut s) {
            Poll::Ready(Some(Err(st))) => assert_eq!(st.message(), "draining"),
            other => panic!("then the status: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stream_that_did_not_accept_packs_gets_one_delivery_per_event() {
        let (mut s, tx, _d) = stream(100, false);
        let later = Instant::now() + Duration::from_secs(60);
        for _ in 0..5 {
            tx.try_send(outgoing(10, later)).unwrap();
        }
        drop(tx);
        for _ in 0..5 {
            assert!(matches!(
                poll(&mut s),
                Poll::Ready(Some(Ok(Event::Delivery(_))))
            ));
        }
        assert!(matches!(poll(&mut s), Poll::Ready(None)));
    }
}

#[cfg(test)]
mod cancel_tests {
    use std::task::Waker;

    use super::*;

    #[tokio::test]
    async fn a_cancel_ends_the_pack_before_it_and_goes_out_after_it() {
        let (tx, rx) = mpsc::channel(10);
        let (dtx, _drx) = mpsc::unbounded_channel();
        let mut s =
            DeliveryStream::new(rx, Arc::default(), Duration::from_secs(60), 1, dtx).batched(true);
        let mut cx = Context::from_waker(Waker::noop());
        let mut next = || Pin::new(&mut s).poll_next(&mut cx);
        assert!(matches!(next(), Poll::Ready(Some(Ok(Event::Heartbeat(_))))));
        let later = Instant::now() + Duration::from_secs(60);
        let deliver = || {
            Ok(Push::Deliver(Outgoing {
                delivery: pb::Delivery::default(),
                lease: (
                    crate::domain::JobId::new(),
                    crate::domain::LeaseToken(uuid::Uuid::new_v4(), crate::domain::ClusterId::HOME),
                ),
                send_by: later,
            }))
        };
        tx.try_send(deliver()).unwrap();
        tx.try_send(deliver()).unwrap();
        tx.try_send(Ok(Push::Cancelled(pb::Cancelled {
            job_id: "j".into(),
            lease_token: "t".into(),
        })))
        .unwrap();
        tx.try_send(deliver()).unwrap();
        assert!(matches!(next(), Poll::Ready(Some(Ok(Event::Deliveries(d)))) if d.len() == 2));
        assert!(matches!(next(), Poll::Ready(Some(Ok(Event::Cancelled(c)))) if c.job_id == "j"));
        assert!(matches!(next(), Poll::Ready(Some(Ok(Event::Delivery(_))))));
    }
}
