//! How long a leader may still act on its etcd lease, by its own clock.
//!
//! # Why
//! A leader's writes are fenced by its election key, so a leader whose
//! lease ran out cannot change what etcd holds. But a leader that was
//! paused (SIGSTOP, a frozen VM, swap) wakes with its streams open and its
//! role unchanged, and until its lease keeper runs it would answer calls
//! and tick its jobs as if nothing happened: it would tell nodes that
//! still reach it what a job no longer is. So before it serves anything,
//! it asks this clock whether its lease can still be valid: the lease was
//! last renewed by a keep-alive *sent* at some instant, so etcd cannot
//! keep it past that instant plus its length; the leader acts only for
//! two thirds of that (the margin covers clock rates and the write in
//! flight), exactly as long as its lease keeper lets it lead. A woken
//! leader finds it lapsed at its first call, ends every stream saying it
//! no longer leads, and answers UNAVAILABLE: its nodes move to the new
//! leader at once.
//!
//! The clock is the process's monotonic clock, which runs on while the
//! process is stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Until when a leader may act, shared by its lease keeper (which moves it
/// on each renewal) and its registry (which checks it before each call).
#[derive(Debug, Clone)]
pub struct LeaseClock {
    /// The instant offsets are counted from.
    base: Instant,
    /// Until when (nanoseconds after `base`) the leader may act.
    until: Arc<AtomicU64>,
    /// The lease's length.
    length: Duration,
}

impl LeaseClock {
    /// A lease of `length` granted by a request sent at `sent`.
    pub fn granted(sent: Instant, length: Duration) -> Self {
        let clock = Self {
            base: sent,
            until: Arc::new(AtomicU64::new(0)),
            length,
        };
        clock.renewed(sent);
        clock
    }

    /// How long after a renewal the leader may act: two thirds of the lease.
    pub fn window(&self) -> Duration {
        self.length * 2 / 3
    }

    /// A keep-alive sent at `sent` renewed the lease.
    pub fn renewed(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.base) + self.window();
        let nanos = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        self.until.fetch_max(nanos, Ordering::AcqRel);
    }

    /// Until when the leader may act.
    pub fn until(&self) -> Instant {
        let nanos = self.until.load(Ordering::Acquire);
        self.base
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or(self.base)
    }

    /// Whether the lease can still be valid at `now`.
    pub fn may_act(&self, now: Instant) -> bool {
        now < self.until()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Session, SESSION_BYTES};
    use crate::{Limits, Registry};
    use accel_proto::v1 as pb;
    use pb::event::Kind;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn a_registry_whose_lease_lapsed_ends_its_streams_and_serves_nothing() {
        let clock = LeaseClock::granted(Instant::now(), Duration::from_millis(300));
        let registry =
            Registry::new(Duration::from_secs(60), Limits::default()).with_lease(clock.clone());
        let secret = Session::from_bytes([1; SESSION_BYTES]);
        let req = |node: &str| pb::JoinRequest {
            job_id: "j".into(),
            node_id: node.into(),
            hostname: "h".into(),
            min_nodes: 2,
            max_nodes: 2,
            nproc_per_node: 1,
            ..Default::default()
        };
        let mut stream = registry
            .join(Instant::now(), &req("a"), None, secret)
            .expect("joins while the lease is valid");
        assert!(matches!(
            stream.next().await,
            Some(Ok(pb::Event {
                kind: Some(Kind::Joined(_))
            }))
        ));
        // The process sleeps past the lease (a pause, as the clock sees it).
        while clock.may_act(Instant::now()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        registry.tick(Instant::now());
        let refused = registry
            .keep_alive(Instant::now(), "j", "a", &secret.to_vec())
            .expect_err("a leader whose lease lapsed serves nothing");
        assert_eq!(
            tonic::Status::from(refused).code(),
            tonic::Code::Unavailable
        );
        match stream.next().await {
            Some(Ok(pb::Event {
                kind: Some(Kind::JobClosed(c)),
            })) => assert!(
                c.may_rejoin && c.reason.contains("no longer the leader"),
                "{c:?}"
            ),
            other => panic!("expected the stream to say it no longer leads, got {other:?}"),
        }
        assert!(stream.next().await.is_none(), "and then end");
        assert!(registry
            .join(Instant::now(), &req("b"), None, secret)
            .is_err());
        assert!(registry.status("j", 0, "").is_err());
    }

    #[test]
    fn a_leader_acts_for_two_thirds_of_the_lease_after_each_renewal_was_sent() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let clock = LeaseClock::granted(t0, s(3));
        assert!(clock.may_act(t0));
        assert!(clock.may_act(t0 + Duration::from_millis(1999)));
        assert!(!clock.may_act(t0 + s(2)), "two thirds of the lease");
        clock.renewed(t0 + s(1));
        assert!(clock.may_act(t0 + Duration::from_millis(2999)));
        assert!(!clock.may_act(t0 + s(3)));
        // A late answer to an older keep-alive does not shorten it.
        clock.renewed(t0);
        assert_eq!(clock.until(), t0 + s(3));
        // Shared: the registry's copy sees the keeper's renewals.
        let seen = clock.clone();
        clock.renewed(t0 + s(10));
        assert!(seen.may_act(t0 + s(11)));
        // Paused for 10 s after the last renewal: lapsed on waking.
        assert!(!seen.may_act(t0 + s(22)));
    }
}
