//! The registry's own operations, on real registries without a store.

use std::time::Duration;

use accel_proto::v1 as pb;
use pb::event::Kind;
use tokio_stream::StreamExt;

use super::*;
use crate::clock::ManualClock;
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
        .join(registry.now().at, &req, None, session(n))
        .expect("joins")
}

fn ready(registry: &Registry, node: &str, n: u8, round: u64) {
    let now = registry.now().at;
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
    assert_eq!(registry.drop_expired(registry.now().at, &gone, why), 1);
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
    assert_eq!(registry.drop_expired(registry.now().at, &gone, why), 0);
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
    assert_eq!(
        registry.drop_expired(registry.now().at, &stale, "expired"),
        0
    );
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
        registry.drop_expired(registry.now().at, &unknown, "expired"),
        0
    );
    assert_eq!(registry.memberships().len(), 2);
}

fn join_req(job: &str, node: &str, host: &str) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: job.into(),
        node_id: node.into(),
        hostname: host.into(),
        min_nodes: 1,
        max_nodes: 2,
        nproc_per_node: 1,
        dead_after_ms: 60_000,
        last_call_ms: 60_000,
        ..Default::default()
    }
}

fn succeed(registry: &Registry, job: &str, node: &str, n: u8, round: u64) {
    let now = registry.now().at;
    registry
        .for_node(now, job, node, &session(n).to_vec(), |j| {
            ((), j.success(now, node, round))
        })
        .expect("a member");
}

/// Two nodes ran round 0 of "job" to success; `a`'s stream is gone.
async fn succeeded(registry: &Registry) {
    let (mut a, mut b) = (join(registry, "a", 1), join(registry, "b", 2));
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::Joined(_))));
    }
    ready(registry, "a", 1, 0);
    ready(registry, "b", 2, 0);
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::RoundComplete(_))));
    }
    succeed(registry, "job", "a", 1, 0);
    succeed(registry, "job", "b", 2, 0);
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::JobSucceeded(_))));
    }
}

/// What a joining node is answered: the outcome (a node of the job), or the error.
async fn answer(registry: &Registry, node: &str, host: &str) -> Result<pb::JobOver, Error> {
    let mut stream = registry.join(
        registry.now().at,
        &join_req("job", node, host),
        None,
        session(9),
    )?;
    let over = match next(&mut stream).await {
        Some(Kind::Joined(j)) => j
            .over
            .expect("a node of a finished job is told its outcome"),
        other => panic!("expected Joined, got {other:?}"),
    };
    assert_eq!(next(&mut stream).await, None, "nothing follows the outcome");
    Ok(over)
}

#[tokio::test]
async fn a_late_node_of_a_finished_job_is_told_its_outcome_and_a_stranger_is_refused() {
    let registry = Registry::new(Duration::from_secs(60), Limits::default());
    succeeded(&registry).await;
    assert_eq!(registry.tombstone_count(), 1);
    // While the job itself is still held, and once it is forgotten (an
    // agent-only leader leaving with its job, or the finished-job TTL).
    for forgotten in [false, true] {
        if forgotten {
            assert_eq!(registry.forget_finished(), 1);
            assert_eq!(registry.job_count(), 0);
        }
        // A member that was cut off at the end resumes under its own id.
        let over = answer(&registry, "a", "elsewhere").await.expect("told");
        assert!(
            over.succeeded && over.exit_code == 0 && over.round == 0,
            "{over:?}"
        );
        // A restarted agent has a new node id, on a host of the job.
        let over = answer(&registry, "b-restarted", "host-b")
            .await
            .expect("told");
        assert!(over.succeeded, "{over:?}");
        // A node that never belonged is refused, with the outcome and the fix.
        let e = answer(&registry, "c", "host-c").await.expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("job 'job' already succeeded at")
                && text.contains("took no part")
                && text.contains("another --rdzv-id"),
            "{text}"
        );
        assert_eq!(
            tonic::Status::from(e).code(),
            tonic::Code::FailedPrecondition
        );
        // None of this started a job.
        assert_eq!(registry.job_count(), usize::from(!forgotten));
    }
}

/// The same command typed again after the job ended: agents started after
/// the end start a new run of the id; the earlier run's own nodes are still
/// told its outcome meanwhile.
#[tokio::test]
async fn an_agent_started_after_the_end_starts_a_new_run_of_the_id() {
    // While the finished job is still held, and once it is forgotten (its
    // tombstone is not).
    for forgotten in [false, true] {
        let registry = Registry::new(Duration::from_secs(60), Limits::default());
        succeeded(&registry).await;
        let later = registry.now().unix_ms + 1;
        // Started before the end (no start time is taken so): a late node.
        let over = answer(&registry, "b-restarted", "host-b")
            .await
            .expect("told");
        assert!(over.succeeded, "{over:?}");
        if forgotten {
            assert_eq!(registry.forget_finished(), 1);
        }
        let mut req = join_req("job", "again", "host-a");
        req.started_unix_ms = later;
        let mut again = registry
            .join(registry.now().at, &req, None, session(7))
            .expect("a new run");
        match next(&mut again).await {
            Some(Kind::Joined(j)) => {
                assert!(j.over.is_none(), "{j:?}");
                let previous = j.previous.expect("told of the earlier run");
                assert!(previous.succeeded && previous.round == 0, "{previous:?}");
            }
            other => panic!("expected Joined, got {other:?}"),
        }
        let jobs = registry.status("job", 1, "").expect("listed").jobs;
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].phase, "forming", "the new run: {:?}", jobs[0]);
        // A node of the earlier run is told that run's outcome, not taken
        // into the new one.
        let over = answer(&registry, "a", "host-a").await.expect("told");
        assert!(over.succeeded && over.round == 0, "{over:?}");
        // Another agent of the new run joins it, and is told too.
        let mut req = join_req("job", "again-2", "host-c");
        req.started_unix_ms = later;
        let mut second = registry
            .join(registry.now().at, &req, None, session(8))
            .expect("joins the new run");
        match next(&mut second).await {
            Some(Kind::Joined(j)) => assert!(j.previous.is_some() && j.over.is_none(), "{j:?}"),
            other => panic!("expected Joined, got {other:?}"),
        }
        let jobs = registry.status("job", 1, "").expect("listed").jobs;
        assert_eq!(jobs[0].node_count, 2, "{:?}", jobs[0]);
    }
}

#[tokio::test]
async fn a_failed_jobs_tombstone_says_so_and_the_agents_exit_code() {
    let registry = Registry::new(Duration::from_secs(60), Limits::default());
    let mut req = join_req("job", "a", "host-a");
    req.max_nodes = 1;
    let mut a = registry
        .join(registry.now().at, &req, None, session(1))
        .expect("joins");
    assert!(matches!(next(&mut a).await, Some(Kind::Joined(_))));
    let now = registry.now().at;
    registry
        .for_node(now, "job", "a", &session(1).to_vec(), |j| {
            ((), j.ready(now, "a", 0, ("127.0.0.1".into(), 1), None))
        })
        .expect("a member");
    assert!(matches!(next(&mut a).await, Some(Kind::RoundComplete(_))));
    registry
        .for_node(now, "job", "a", &session(1).to_vec(), |j| {
            (
                (),
                j.failure(now, "a", 0, "worker rank 0 exited 3".into(), None),
            )
        })
        .expect("a member");
    assert!(matches!(next(&mut a).await, Some(Kind::JobFailed(_))));
    registry.forget_finished();
    let over = answer(&registry, "a2", "host-a").await.expect("told");
    assert!(!over.succeeded && over.exit_code == 1, "{over:?}");
    assert!(over.reason.contains("exited 3"), "{over:?}");
    let e = answer(&registry, "c", "host-c").await.expect_err("refused");
    assert!(e.to_string().contains("already failed at"), "{e}");
}

#[tokio::test]
async fn tombstones_expire_are_bounded_and_can_be_turned_off() {
    // Bounded: the oldest goes first.
    let limits = Limits {
        max_tombstones: 2,
        ..Limits::default()
    };
    let registry = Registry::new(Duration::from_secs(60), limits);
    for job in ["j1", "j2", "j3"] {
        let mut req = join_req(job, "a", "host-a");
        req.max_nodes = 1;
        let mut s = registry
            .join(registry.now().at, &req, None, session(1))
            .expect("joins");
        assert!(matches!(next(&mut s).await, Some(Kind::Joined(_))));
        let now = registry.now().at;
        registry
            .for_node(now, job, "a", &session(1).to_vec(), |j| {
                ((), j.ready(now, "a", 0, ("127.0.0.1".into(), 1), None))
            })
            .expect("a member");
        assert!(matches!(next(&mut s).await, Some(Kind::RoundComplete(_))));
        succeed(&registry, job, "a", 1, 0);
    }
    assert_eq!(registry.tombstone_count(), 2);
    registry.forget_finished();
    // j1's tombstone went: a stranger may use the id again.
    let mut fresh = join_req("j1", "c", "host-c");
    fresh.max_nodes = 1;
    assert!(registry
        .join(registry.now().at, &fresh, None, session(3))
        .is_ok());
    let mut other = join_req("j3", "c", "host-c");
    other.max_nodes = 1;
    assert!(registry
        .join(registry.now().at, &other, None, session(3))
        .is_err());

    // Expired: a TTL that has passed.
    let limits = Limits {
        tombstone_ttl: Duration::from_millis(50),
        ..Limits::default()
    };
    let clock = Arc::new(ManualClock::new());
    let registry =
        Registry::new(Duration::from_secs(60), limits).with_clock(Arc::new(clock.clone()));
    succeeded(&registry).await;
    registry.forget_finished();
    assert_eq!(registry.tombstone_count(), 1);
    clock.advance(Duration::from_millis(49));
    registry.tick(registry.now().at);
    assert_eq!(registry.tombstone_count(), 1, "kept for its whole TTL");
    clock.advance(Duration::from_millis(2));
    registry.tick(registry.now().at);
    assert_eq!(registry.tombstone_count(), 0);
    let mut s = registry
        .join(
            registry.now().at,
            &join_req("job", "c", "host-c"),
            None,
            session(3),
        )
        .expect("the id is free again");
    assert!(matches!(next(&mut s).await, Some(Kind::Joined(j)) if j.over.is_none()));

    // Off: none is kept.
    let limits = Limits {
        tombstone_ttl: Duration::ZERO,
        ..Limits::default()
    };
    let registry = Registry::new(Duration::from_secs(60), limits);
    succeeded(&registry).await;
    assert_eq!(registry.tombstone_count(), 0);
}

#[tokio::test]
async fn a_tombstone_outlives_its_leader_through_the_store() {
    let store = Arc::new(crate::store::MemoryStore::new());
    let first = Registry::with_store(Duration::from_secs(60), Limits::default(), store.clone());
    let (mut a, mut b) = (join(&first, "a", 1), join(&first, "b", 2));
    first.flush().await.expect("written");
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::Joined(_))));
    }
    ready(&first, "a", 1, 0);
    ready(&first, "b", 2, 0);
    first.flush().await.expect("written");
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::RoundComplete(_))));
    }
    succeed(&first, "job", "a", 1, 0);
    succeed(&first, "job", "b", 2, 0);
    first.flush().await.expect("written");
    // The agent-only leader leaves with its job: the job's records go.
    assert_eq!(first.forget_finished(), 1);
    first.flush().await.expect("written");
    assert!(store.is_empty(), "the job's own records are deleted");
    // The next leader (a late agent's) knows the outcome.
    let second = Registry::with_store(Duration::from_secs(60), Limits::default(), store.clone())
        .without_relearning();
    second.load().await.expect("loads");
    let over = answer(&second, "a", "host-a").await.expect("told");
    assert!(over.succeeded, "{over:?}");
    let mut resume = join_req("job", "b", "host-b");
    resume.resume = Some(pb::Resume {
        round: 0,
        restart_count: 0,
        node_rank: 1,
        nnodes: 2,
    });
    let mut s = second
        .join(second.now().at, &resume, None, session(2))
        .expect("a resuming node of the job is told, not refused as gone");
    assert!(matches!(next(&mut s).await, Some(Kind::Joined(j)) if j.over.is_some()));
    assert!(answer(&second, "c", "host-c").await.is_err());
}

/// F8: a spare (here on a host of its own) cut off and dropped before the
/// job succeeded still belongs to it when it comes back.
#[tokio::test]
async fn a_spare_dropped_before_the_end_still_belongs_to_the_job() {
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
    // The round is full: c waits as a spare, then is dropped (cut off).
    let mut c = join(&registry, "c", 3);
    assert!(matches!(next(&mut c).await, Some(Kind::Joined(_))));
    let gone: Vec<_> = registry
        .memberships()
        .into_iter()
        .filter(|m| m.node_id == "c")
        .collect();
    assert_eq!(
        registry.drop_expired(registry.now().at, &gone, "cut off"),
        1
    );
    succeed(&registry, "job", "a", 1, 0);
    succeed(&registry, "job", "b", 2, 0);
    for s in [&mut a, &mut b] {
        assert!(matches!(next(s).await, Some(Kind::JobSucceeded(_))));
    }
    // Back under its own id, or restarted on its host.
    assert!(
        answer(&registry, "c", "elsewhere")
            .await
            .expect("told")
            .succeeded
    );
    assert!(
        answer(&registry, "c2", "host-c")
            .await
            .expect("told")
            .succeeded
    );
    assert!(answer(&registry, "d", "host-d").await.is_err());
}

/// Limits that quarantine a host at its first worker failure (or, with
/// `stragglers`, its first straggler finding), for ten minutes, in `scope`.
fn quarantining(scope: crate::job::QuarantineScope, stragglers: bool) -> Limits {
    use crate::job::{QuarantinePolicy, QuarantineSettings};
    Limits {
        quarantine: Some(QuarantineSettings {
            policy: QuarantinePolicy {
                after: 1,
                window: Duration::from_secs(600),
                hold: Duration::from_secs(600),
                stragglers,
            },
            scope,
        }),
        ..Limits::default()
    }
}

/// A server-wide quarantine: a host one job quarantines is kept out of
/// every job, listed once, released everywhere at once.
#[tokio::test]
async fn a_server_wide_quarantine_reaches_every_job_and_is_released_everywhere() {
    let limits = quarantining(crate::job::QuarantineScope::Server, false);
    let registry = Registry::new(Duration::from_secs(60), limits);
    let now = registry.now().at;
    let join_as = |job: &str, node: &str, host: &str, n: u8| {
        registry
            .join(now, &join_req(job, node, host), None, session(n))
            .expect("joins")
    };
    let ready_in = |job: &str, node: &str, n: u8, round: u64| {
        registry
            .for_node(now, job, node, &session(n).to_vec(), |j| {
                ((), j.ready(now, node, round, ("127.0.0.1".into(), 1), None))
            })
            .expect("a member");
    };
    // Job one runs on "bad" and "good"; job two's "bad2" node is on host "bad" too.
    let _s = [
        join_as("one", "a", "bad", 1),
        join_as("one", "b", "good", 2),
        join_as("two", "c", "bad", 3),
    ];
    ready_in("one", "a", 1, 0);
    ready_in("one", "b", 2, 0);
    registry
        .for_node(now, "one", "a", &session(1).to_vec(), |j| {
            ((), j.failure(now, "a", 0, "worker 0 exited 1".into(), None))
        })
        .expect("a member");
    let listed = registry.quarantine(now, "", "").expect("list");
    assert_eq!(listed.hosts.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed.hosts[0].host.as_str(),
            listed.hosts[0].job_id.as_str()
        ),
        ("bad", "")
    );
    // Job one had no restart to spend: it failed. Job two, where "bad"
    // never failed, keeps it out too; and so does a job that starts now.
    assert_eq!(
        registry.status("one", 0, "").expect("status").jobs[0].phase,
        "failed"
    );
    let _d = join_as("three", "d", "bad", 4);
    for job in ["two", "three"] {
        let per_job = registry.quarantine(now, job, "").expect("list");
        assert_eq!(per_job.hosts.len(), 1, "{job}: {per_job:?}");
    }
    ready_in("two", "c", 3, 0);
    let two = registry.status("two", 0, "").expect("status");
    assert_eq!(two.jobs[0].phase, "forming", "{two:?}");
    assert_eq!(two.jobs[0].nodes[0].state, "quarantined", "{two:?}");
    assert_eq!(registry.summary().quarantined_hosts, 1);
    // Released everywhere at once: the server's copy and the two jobs
    // that are not over.
    let released = registry.quarantine(now, "", "bad").expect("release");
    assert_eq!(released.released, 3, "{released:?}");
    assert!(released.hosts.is_empty(), "{released:?}");
    assert!(matches!(
        registry.quarantine(now, "", "bad"),
        Err(Error::NotQuarantined(_))
    ));
    let two = registry.status("two", 0, "").expect("status");
    assert_eq!(two.jobs[0].nodes[0].state, "ready", "{two:?}");
}

/// `--straggler-quarantine` without a spare: the round goes on, and the
/// bench a keep-alive's step times caused is a change like any other:
/// written at once, so the next leader keeps the host out of the job's
/// next round (it was lost when only a re-form was written).
#[tokio::test]
async fn a_stragglers_bench_without_a_spare_outlives_its_leader() {
    let limits = quarantining(crate::job::QuarantineScope::Job, true);
    let store = Arc::new(crate::store::MemoryStore::new());
    let first = Registry::with_store(Duration::from_secs(60), limits, store.clone());
    let nodes = [("a", "host-a", 1), ("b", "host-b", 2), ("c", "host-c", 3)];
    let mut streams = Vec::new();
    for (node, host, n) in nodes {
        let mut req = join_req("job", node, host);
        (req.min_nodes, req.max_nodes) = (2, 3);
        let now = first.now().at;
        streams.push(first.join(now, &req, None, session(n)).expect("joins"));
    }
    for (node, _, n) in nodes {
        ready(&first, node, n, 0);
    }
    first.flush().await.expect("written");
    for s in &mut streams {
        assert!(matches!(next(s).await, Some(Kind::Joined(_))));
        assert!(matches!(next(s).await, Some(Kind::RoundComplete(_))));
    }
    // c's rank takes 1.4 times the others' time per step, at three
    // evaluations a second apart (the first only starts the count).
    let t = first.now().at;
    for k in 0..3u32 {
        for (node, _, n) in nodes {
            let step_us = if node == "c" { 140_000 } else { 100_000 };
            let req = pb::KeepAliveRequest {
                round: 0,
                progress: Some(pb::Progress {
                    round: 0,
                    ranks: 1,
                    min_step: 10,
                    max_step: 10,
                    rank_times: vec![pb::RankTime {
                        local_rank: 0,
                        step_us,
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let at = t + Duration::from_secs(u64::from(k));
            first
                .keep_alive_vouching(at, "job", node, &session(n).to_vec(), Some(&req))
                .expect("a member");
        }
    }
    first.flush().await.expect("written");
    let listed = first.quarantine(t, "job", "").expect("list");
    assert_eq!(listed.hosts.len(), 1, "{listed:?}");
    assert_eq!(listed.hosts[0].host, "host-c");
    // The round went on; the next leader knows the bench.
    assert_eq!(
        first.status("job", 0, "").expect("status").jobs[0].phase,
        "running"
    );
    let second =
        Registry::with_store(Duration::from_secs(60), limits, store.clone()).without_relearning();
    second.load().await.expect("loads");
    let listed = second.quarantine(second.now().at, "job", "").expect("list");
    assert_eq!(listed.hosts.len(), 1, "{listed:?}");
    assert_eq!(listed.hosts[0].host, "host-c");
}
