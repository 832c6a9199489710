//! The store seam through real registries: what one registry wrote, another
//! continues; a store's I/O never holds the registry's lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;
use tokio_stream::StreamExt;

use super::*;
use crate::job::Session;
use crate::registry::NodeStream;
use crate::{Error, Limits, Registry};

const TTL: Duration = Duration::from_secs(60);

fn session(n: u8) -> Session {
    Session::from_bytes([n; crate::job::SESSION_BYTES])
}

/// Node `node` joins the job afresh, with secret `n`.
fn join(registry: &Registry, node: &str, n: u8) -> Result<NodeStream, Error> {
    registry.join(
        Instant::now(),
        &join_request(node, None, None),
        None,
        session(n),
    )
}

fn join_request(
    node: &str,
    resume: Option<pb::Resume>,
    secret: Option<Session>,
) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "job".into(),
        node_id: node.into(),
        hostname: format!("host-{node}"),
        topology: String::new(),
        min_nodes: 2,
        max_nodes: 2,
        nproc_per_node: 1,
        max_restarts: 1,
        dead_after_ms: 60_000,
        resume,
        session: secret.map(Session::to_vec).unwrap_or_default(),
        ..Default::default()
    }
}

async fn next(stream: &mut NodeStream) -> Kind {
    let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("not an error");
    event.kind.expect("an event with a kind")
}

/// Waits for the event `pick` accepts, skipping progress reports.
async fn until<T>(stream: &mut NodeStream, pick: impl Fn(Kind) -> Option<T>) -> T {
    loop {
        if let Some(t) = pick(next(stream).await) {
            return t;
        }
    }
}

fn ready(registry: &Registry, node: &str, secret: Session, round: u64) -> Result<(), Error> {
    let now = Instant::now();
    registry.for_node(now, "job", node, &secret.to_vec(), |job| {
        (
            (),
            job.ready(now, node, round, ("127.0.0.1".into(), 29500), None),
        )
    })
}

fn fail(registry: &Registry, node: &str, secret: Session, round: u64) -> Result<(), Error> {
    let now = Instant::now();
    registry.for_node(now, "job", node, &secret.to_vec(), |job| {
        (
            (),
            job.failure(now, node, round, format!("a worker of {node} failed"), None),
        )
    })
}

#[tokio::test]
async fn a_new_registry_continues_the_jobs_a_store_holds() {
    let store = Arc::new(MemoryStore::new());
    let first = Registry::with_store(TTL, Limits::default(), store.clone());
    let now = Instant::now();
    let mut a = first
        .join(now, &join_request("a", None, None), None, session(1))
        .expect("a joins");
    let mut b = first
        .join(now, &join_request("b", None, None), None, session(2))
        .expect("b joins");
    ready(&first, "a", session(1), 0).expect("ready");
    ready(&first, "b", session(2), 0).expect("ready");
    // Nothing is sent before the change is in the store.
    assert!(store.get("job").is_none(), "nothing written yet");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), a.next())
            .await
            .is_err(),
        "no event before the change is durable"
    );
    assert_eq!(first.flush().await.expect("flushed"), 1, "one job written");
    // Round 0 runs; a failure spends the job's one restart; round 1 runs.
    let rank_of_a = until(&mut a, |k| match k {
        Kind::RoundComplete(r) => Some(r.node_rank),
        _ => None,
    })
    .await;
    fail(&first, "b", session(2), 0).expect("failure");
    first.flush().await.expect("flushed");
    until(&mut b, |k| {
        matches!(k, Kind::RestartRequested(_)).then_some(())
    })
    .await;
    ready(&first, "a", session(1), 1).expect("ready");
    ready(&first, "b", session(2), 1).expect("ready");
    first.flush().await.expect("flushed");
    until(&mut a, |k| {
        matches!(k, Kind::RoundComplete(r) if r.round == 1).then_some(())
    })
    .await;
    assert_eq!(
        first.flush().await.expect("flushed"),
        0,
        "nothing changed since"
    );
    let record = store.get("job").expect("recorded");
    assert_eq!(
        (record.round, record.restart_count, record.members.len()),
        (1, 1, 2)
    );

    // Another server process: it loads the job and continues it.
    let second = Registry::with_store(TTL, Limits::default(), store.clone());
    assert_eq!(second.load().await.expect("loaded"), 1);
    let status = second.status("job", 0, "").expect("known");
    let info = &status.jobs[0];
    assert_eq!(
        (
            info.phase.as_str(),
            info.round,
            info.restart_count,
            info.node_count
        ),
        ("running", 1, 1, 2)
    );
    // A member resumes its round with its secret; without it, it cannot.
    let resume = |node_rank| {
        Some(pb::Resume {
            round: 1,
            restart_count: 1,
            node_rank,
            nnodes: 2,
        })
    };
    let stolen = join_request("a", resume(rank_of_a), Some(session(9)));
    assert!(matches!(
        second.join(Instant::now(), &stolen, None, session(7)),
        Err(Error::Join(crate::job::JoinRefused::WrongSession { .. }))
    ));
    let mut a2 = second
        .join(
            Instant::now(),
            &join_request("a", resume(rank_of_a), Some(session(1))),
            None,
            session(7),
        )
        .expect("a resumes");
    second.flush().await.expect("flushed");
    match next(&mut a2).await {
        Kind::Joined(j) => {
            assert!(j.resumed, "round 1 goes on");
            assert_eq!(j.session, session(1).to_vec(), "the node keeps its secret");
        }
        other => panic!("expected Joined, got {other:?}"),
    }
    // The budget carried over: the next failure fails the job.
    fail(&second, "a", session(1), 1).expect("failure");
    second.flush().await.expect("flushed");
    let reason = until(&mut a2, |k| match k {
        Kind::JobFailed(f) => Some(f.reason),
        _ => None,
    })
    .await;
    assert!(
        reason.contains("budget is spent (1 of --max-restarts 1)"),
        "{reason}"
    );
    second.flush().await.expect("flushed");
    assert!(matches!(
        store.get("job").expect("kept").phase,
        crate::job::Phase::Failed(_)
    ));
}

/// A store whose saves wait until the test lets them go.
#[derive(Debug, Default)]
struct Gate {
    open: tokio::sync::Notify,
    saved: std::sync::atomic::AtomicUsize,
    fail: std::sync::atomic::AtomicBool,
}

impl JobStore for Gate {
    fn load(&self) -> StoreFuture<'_, Vec<crate::job::JobRecord>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn save(&self, batch: Batch) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.open.notified().await;
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Unavailable("etcd is down".into()));
            }
            self.saved
                .fetch_add(batch.put.len(), std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_slow_store_does_not_hold_the_registry_and_a_failed_batch_is_retried() {
    let gate = Arc::new(Gate::default());
    let registry = Registry::with_store(TTL, Limits::default(), gate.clone());
    let _a = join(&registry, "a", 1).expect("joins");
    gate.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let flushing = tokio::spawn({
        let registry = registry.clone();
        async move { registry.flush().await }
    });
    tokio::task::yield_now().await;
    // While the save waits, the registry serves: another node joins.
    let _b = join(&registry, "b", 2).expect("joins during a save");
    assert_eq!(registry.job_count(), 1);
    gate.open.notify_one();
    assert!(flushing.await.expect("ran").is_err(), "the store failed");
    // Until a write succeeds, no newcomer is admitted.
    let refused = join(&registry, "c", 3)
        .map(|_| ())
        .expect_err("no join while the store takes nothing");
    assert!(matches!(refused, Error::Unwritable(_)), "{refused}");
    assert_eq!(
        tonic::Status::from(refused).code(),
        tonic::Code::Unavailable
    );
    // A member's own calls go on (a few a round; they are written later).
    ready(&registry, "a", session(1), 0).expect("a member is not refused");
    // The failed batch's job is written by the next flush.
    gate.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let flushing = tokio::spawn({
        let registry = registry.clone();
        async move { registry.flush().await }
    });
    tokio::task::yield_now().await;
    gate.open.notify_one();
    assert_eq!(flushing.await.expect("ran").expect("saved"), 1);
    assert_eq!(gate.saved.load(std::sync::atomic::Ordering::SeqCst), 1);
    let _c = join(&registry, "c", 3).expect("joins once the store takes writes again");
}

#[tokio::test]
async fn keep_alives_and_a_closing_server_write_nothing() {
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::with_store(TTL, Limits::default(), store.clone());
    let _a = join(&registry, "a", 1).expect("joins");
    assert_eq!(registry.flush().await.expect("flushed"), 1);
    assert!(registry
        .keep_alive(Instant::now(), "job", "a", &session(1).to_vec())
        .expect("member"));
    assert_eq!(
        registry.flush().await.expect("flushed"),
        0,
        "a keep-alive marks nothing"
    );
    registry.close_all("shutting down", true);
    assert_eq!(registry.flush().await.expect("flushed"), 0);
    let kept = store.get("job").expect("kept");
    assert_eq!(
        kept.members.len(),
        1,
        "the successor sees the member, not the closed job"
    );
}

#[test]
fn a_record_restores_to_the_same_job() {
    let store_now = Instant::now();
    let mut job = crate::job::Job::new(
        "job",
        crate::job::JobConfig::from_join(&join_request("a", None, None)),
    );
    job.join(store_now, "a", &join_request("a", None, None), session(1))
        .expect("joins");
    job.ready(store_now, "a", 0, ("10.0.0.1".into(), 1234), None);
    let record = job.record(store_now + Duration::from_secs(3));
    let later = store_now + Duration::from_secs(100);
    let restored = crate::job::Job::restore(record.clone(), later);
    assert_eq!(restored.record(later), record, "the same state, rebased");
    let member = &restored.members()["a"];
    assert_eq!(member.ready, Some(("10.0.0.1".into(), 1234)));
    assert_eq!(
        later.duration_since(member.last_seen),
        Duration::from_secs(3),
        "as long ago as when recorded"
    );
}

#[test]
fn without_relearning_a_resumed_job_the_store_lacks_is_gone() {
    let registry = Registry::with_store(TTL, Limits::default(), Arc::new(Gate::default()))
        .without_relearning();
    let resume = pb::Resume {
        round: 3,
        nnodes: 2,
        node_rank: 1,
        ..Default::default()
    };
    let refused = registry
        .join(
            Instant::now(),
            &join_request("a", Some(resume), None),
            None,
            session(1),
        )
        .map(|_| ())
        .expect_err("nothing to resume");
    assert!(matches!(refused, Error::JobGone(_)), "{refused}");
    assert!(refused.to_string().contains("outcome"), "{refused}");
    assert_eq!(registry.job_count(), 0, "nothing was created");
    // A fresh join still starts the job.
    let _a = join(&registry, "a", 1).expect("joins");
}
