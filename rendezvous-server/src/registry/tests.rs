//! The registry's own operations, on real registries without a store.

use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;
use tokio_stream::StreamExt;

use super::*;
use crate::job::SESSION_BYTES;

fn session(n: u8) -> Session {
    Session::from_bytes([n; SESSION_BYTES])
}

fn join(registry: &Registry, node: &str, n: u8) -> NodeStream {
    let req = pb::JoinRequest {
        job_id: "job".into(),
        node_id: node.into(),
        hostname: format!("host-{node}"),
        min_nodes: 1,
        max_nodes: 2,
        nproc_per_node: 1,
        dead_after_ms: 60_000,
        // A first round waits for both nodes.
        last_call_ms: 60_000,
        ..Default::default()
    };
    registry
        .join(Instant::now(), &req, None, session(n))
        .expect("joins")
}

fn ready(registry: &Registry, node: &str, n: u8, round: u64) {
    let now = Instant::now();
    registry
        .for_node(now, "job", node, &session(n).to_vec(), |job| {
            (
                (),
                job.ready(now, node, round, ("127.0.0.1".into(), 1), None),
            )
        })
        .expect("a member");
}

/// The next event that is not progress; `None` once the stream ended.
async fn next(stream: &mut NodeStream) -> Option<Kind> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("an event (or the end) in time")?;
        match event.expect("not an error").kind.expect("a kind") {
            Kind::Waiting(_) => continue,
            kind => return Some(kind),
        }
    }
}

/// Two nodes running round 0.
async fn running() -> (Registry, NodeStream, NodeStream) {
    let registry = Registry::new(Duration::from_secs(60), Limits::default());
    let (mut a, mut b) = (join(&registry, "a", 1), join(&registry, "b", 2));
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::Joined(_))));
    }
    ready(&registry, "a", 1, 0);
    ready(&registry, "b", 2, 0);
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::RoundComplete(_))));
    }
    (registry, a, b)
}

#[tokio::test]
async fn an_expired_node_is_dropped_and_the_others_re_form_for_free() {
    let (registry, mut a, mut b) = running().await;
    let all = registry.memberships();
    let ids: Vec<_> = all.iter().map(|m| m.node_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let gone: Vec<_> = all.into_iter().filter(|m| m.node_id == "b").collect();
    let why = "its etcd lease expired";
    assert_eq!(registry.drop_expired(Instant::now(), &gone, why), 1);
    match next(&mut a).await {
        Some(Kind::RestartRequested(r)) => {
            assert!(!r.counted, "a departure spends no budget");
            assert!(
                r.reason.contains("host-b") && r.reason.contains(why),
                "{r:?}"
            );
        }
        other => panic!("expected a re-form, got {other:?}"),
    }
    assert_eq!(next(&mut b).await, None, "the dropped node's stream ends");
    let left: Vec<_> = registry
        .memberships()
        .into_iter()
        .map(|m| m.node_id)
        .collect();
    assert_eq!(left, ["a"]);
    // Dropping it again changes nothing.
    assert_eq!(registry.drop_expired(Instant::now(), &gone, why), 0);
    // The survivor forms the next round alone (MIN is 1).
    ready(&registry, "a", 1, 1);
    assert!(matches!(next(&mut a).await, Some(Kind::RoundComplete(r)) if r.nnodes == 1));
}

#[tokio::test]
async fn a_node_that_joined_again_since_the_snapshot_stays() {
    let (registry, _a, b) = running().await;
    let before = registry.memberships();
    // b leaves and joins again under the same id: another membership.
    drop(b);
    let _b = join(&registry, "b", 3);
    let again = registry.memberships();
    assert_ne!(before, again, "a new membership has a new number");
    let stale: Vec<_> = before.into_iter().filter(|m| m.node_id == "b").collect();
    assert_eq!(registry.drop_expired(Instant::now(), &stale, "expired"), 0);
    assert!(registry.memberships().iter().any(|m| m.node_id == "b"));
    // Unknown jobs and nodes change nothing either.
    let unknown = [
        Membership {
            job_id: "other".into(),
            node_id: "a".into(),
            seq: 1,
        },
        Membership {
            job_id: "job".into(),
            node_id: "nobody".into(),
            seq: 1,
        },
    ];
    assert_eq!(
        registry.drop_expired(Instant::now(), &unknown, "expired"),
        0
    );
    assert_eq!(registry.memberships().len(), 2);
}
