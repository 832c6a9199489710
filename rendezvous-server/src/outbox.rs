//! Each node's queue of events: bounded, so a client that stops reading
//! cannot make the server grow.
//!
//! The state machine's events are pushed into the queue while the registry
//! lock is held, so pushing never waits. Progress reports (`Waiting`) are
//! only ever useful in their latest form: a new one replaces a queued one.
//! Every other event counts against [`MAX_QUEUED`]; a node whose queue is
//! full is not keeping up, and its stream is ended with `RESOURCE_EXHAUSTED`.
//! The node stays a member: its agent reconnects and resumes as after any
//! broken stream (or is lost after the keep-alive limit if it is gone).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use accel_proto::prost::Message as _;
use accel_proto::v1 as pb;
use pb::event::Kind;
use tokio_stream::Stream;
use tonic::Status;

/// Most events (other than progress) waiting for one node.
pub const MAX_QUEUED: usize = 64;
/// Most encoded bytes of events waiting for one node (a failure report can
/// be 64 KiB, and every member hears the job's end).
pub const MAX_QUEUED_BYTES: usize = 1 << 20;

/// One per node, for the node's whole life: kept small. The queue is freed
/// whenever it is drained (an event is a few hundred bytes, and a deque keeps
/// its capacity), and the rare error is boxed.
#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<pb::Event>,
    /// Encoded size of `events`.
    bytes: usize,
    /// Ends the stream with this error once the events before it are read.
    error: Option<Box<Status>>,
    /// The sending side is gone: the stream ends once drained.
    closed: bool,
    waker: Option<Waker>,
}

fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // Queue updates do not panic; a poisoned lock still holds a valid queue.
    q.lock().unwrap_or_else(|e| e.into_inner())
}

/// The sending half, held by the registry; the stream ends when it is dropped.
#[derive(Debug)]
pub struct Outbox(Arc<Mutex<Queue>>);

/// The queue is full: the node does not keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

/// A new queue: the registry's half and the half the node's stream reads.
pub fn outbox() -> (Outbox, Inbox) {
    let q = Arc::new(Mutex::new(Queue::default()));
    (Outbox(q.clone()), Inbox(q))
}

impl Outbox {
    /// Queues `event`. On [`Overflow`] the queue is emptied and the stream
    /// will end with an error; drop this outbox.
    pub fn send(&self, event: Kind) -> Result<(), Overflow> {
        let mut q = lock(&self.0);
        if q.error.is_some() {
            return Err(Overflow);
        }
        let progress = matches!(event, Kind::Waiting(_));
        let event = pb::Event { kind: Some(event) };
        let queued = q.events.len();
        let size = event.encoded_len();
        let fits = q.bytes + size <= MAX_QUEUED_BYTES;
        match q.events.back_mut() {
            Some(last) if progress && matches!(last.kind, Some(Kind::Waiting(_))) => {
                let old = last.encoded_len();
                *last = event;
                q.bytes = q.bytes - old + size;
            }
            _ if fits && (progress || queued < MAX_QUEUED) => {
                q.events.push_back(event);
                q.bytes += size;
            }
            _ => {
                q.events = VecDeque::new();
                q.bytes = 0;
                q.error = Some(Box::new(Status::resource_exhausted(format!(
                    "this node did not read its rendezvous events ({MAX_QUEUED} waiting); \
                     the stream is ended, and the node may reconnect and resume"
                ))));
                wake(&mut q);
                return Err(Overflow);
            }
        }
        wake(&mut q);
        Ok(())
    }

    /// Events waiting to be read (for tests and status).
    pub fn len(&self) -> usize {
        lock(&self.0).events.len()
    }

    /// Whether nothing waits to be read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn wake(q: &mut Queue) {
    if let Some(w) = q.waker.take() {
        w.wake();
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let mut q = lock(&self.0);
        q.closed = true;
        wake(&mut q);
    }
}

/// The receiving half: the events of one node's `Join` stream.
#[derive(Debug)]
pub struct Inbox(Arc<Mutex<Queue>>);

impl Stream for Inbox {
    type Item = Result<pb::Event, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut q = lock(&self.0);
        if let Some(e) = q.events.pop_front() {
            q.bytes = q.bytes.saturating_sub(e.encoded_len());
            if q.events.is_empty() {
                q.events = VecDeque::new();
            }
            return Poll::Ready(Some(Ok(e)));
        }
        if let Some(status) = q.error.take() {
            q.closed = true;
            return Poll::Ready(Some(Err(*status)));
        }
        if q.closed {
            return Poll::Ready(None);
        }
        q.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn waiting(ready: u32) -> Kind {
        Kind::Waiting(pb::Waiting {
            ready,
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn progress_is_replaced_and_other_events_are_bounded() {
        let (tx, mut rx) = outbox();
        for i in 0..1000 {
            tx.send(waiting(i)).expect("progress never overflows");
        }
        assert_eq!(tx.len(), 1, "only the latest progress is kept");
        tx.send(Kind::JobSucceeded(pb::JobSucceeded {
            round: 1,
            goodput: None,
        }))
        .expect("room");
        let first = rx.next().await.expect("event").expect("ok");
        assert!(matches!(first.kind, Some(Kind::Waiting(w)) if w.ready == 999));
        for _ in 1..MAX_QUEUED {
            tx.send(Kind::JobSucceeded(pb::JobSucceeded {
                round: 1,
                goodput: None,
            }))
            .expect("room");
        }
        assert_eq!(
            tx.send(Kind::JobSucceeded(pb::JobSucceeded {
                round: 1,
                goodput: None
            })),
            Err(Overflow)
        );
        let end = rx.next().await.expect("error item");
        assert_eq!(
            end.expect_err("overflow").code(),
            tonic::Code::ResourceExhausted
        );
        assert!(rx.next().await.is_none(), "then the stream ends");
    }

    #[tokio::test]
    async fn dropping_the_outbox_ends_the_stream_after_its_events() {
        let (tx, mut rx) = outbox();
        tx.send(Kind::JobSucceeded(pb::JobSucceeded {
            round: 3,
            goodput: None,
        }))
        .expect("room");
        drop(tx);
        assert!(rx.next().await.expect("event").is_ok());
        assert!(rx.next().await.is_none());
    }
}
