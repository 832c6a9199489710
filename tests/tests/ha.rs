//! Rendezvous state on a real etcd: what one registry decided, a registry
//! on another host continues; a leader whose election key is gone can write
//! nothing; a lost etcd member (quorum kept) changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use accel_tests::etcd::EtcdCluster;
use accel_tests::scratch;
use etcd_client::{Client, GetOptions};
use pb::event::Kind;
use rendezvous_server::job::{Session, SESSION_BYTES};
use rendezvous_server::registry::NodeStream;
use rendezvous_server::store::etcd::{EtcdStore, Fence};
use rendezvous_server::store::StoreError;
use rendezvous_server::{Limits, Registry};
use tokio_stream::StreamExt;

const TTL: Duration = Duration::from_secs(600);
const PREFIX: &str = "/accel-test";

fn secret(n: u8) -> Session {
    Session::from_bytes([n; SESSION_BYTES])
}

fn join_request(
    node: &str,
    resume: Option<pb::Resume>,
    session: Option<Session>,
) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "team/job".into(),
        node_id: node.into(),
        hostname: format!("host-{node}"),
        min_nodes: 2,
        max_nodes: 2,
        nproc_per_node: 4,
        max_restarts: 2,
        dead_after_ms: 60_000,
        resume,
        session: session.map(Session::to_vec).unwrap_or_default(),
        ..Default::default()
    }
}

/// Flushes `registry` until `stream` yields what `pick` accepts.
async fn until<T>(
    registry: &Registry,
    stream: &mut NodeStream,
    pick: impl Fn(Kind) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        registry.flush().await.expect("the store takes the batch");
        if let Ok(Some(Ok(pb::Event { kind: Some(kind) }))) =
            tokio::time::timeout(Duration::from_millis(50), stream.next()).await
        {
            if let Some(t) = pick(kind) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "the event did not come");
    }
}

fn ready(registry: &Registry, node: &str, s: Session, round: u64) {
    let now = Instant::now();
    registry
        .for_node(now, "team/job", node, &s.to_vec(), |job| {
            (
                (),
                job.ready(now, node, round, ("10.0.0.1".into(), 29500), None),
            )
        })
        .expect("ready");
}

fn fail(registry: &Registry, node: &str, s: Session, round: u64) {
    let now = Instant::now();
    registry
        .for_node(now, "team/job", node, &s.to_vec(), |job| {
            (
                (),
                job.failure(now, node, round, format!("{node} failed"), None),
            )
        })
        .expect("failure");
}

/// Campaigns for leadership of `PREFIX/leader` with a fresh lease; the fence
/// and the lease id.
async fn lead(client: &mut Client, name: &str) -> (Fence, i64) {
    let lease = client.lease_grant(10, None).await.expect("lease").id();
    let won = client
        .campaign(format!("{PREFIX}/leader"), name, lease)
        .await
        .expect("campaign");
    let key = won.leader().expect("leader key");
    (
        Fence {
            key: key.key().to_vec(),
            revision: key.rev(),
        },
        lease,
    )
}

async fn revision(client: &mut Client) -> i64 {
    client
        .get("/", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_etcd_continues_in_another_registry_and_a_deposed_leader_writes_nothing() {
    let dir = scratch("ha-store");
    let etcd = EtcdCluster::start(&dir, 1);
    let mut client = Client::connect([etcd.endpoint(0)], None)
        .await
        .expect("connect to etcd");
    let (fence, lease) = lead(&mut client, "first").await;
    let first = Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, Some(fence))),
    );

    let now = Instant::now();
    let mut a = first
        .join(now, &join_request("a", None, None), None, secret(1))
        .expect("a joins");
    let mut b = first
        .join(now, &join_request("b/1", None, None), None, secret(2))
        .expect("b joins");
    let before = revision(&mut client).await;
    ready(&first, "a", secret(1), 0);
    ready(&first, "b/1", secret(2), 0);
    let rank_of_a = until(&first, &mut a, |k| match k {
        Kind::RoundComplete(r) => Some(r.node_rank),
        _ => None,
    })
    .await;
    let per_round = revision(&mut client).await - before;
    assert!(
        (1..=2).contains(&per_round),
        "two members getting ready and a round forming is one or two etcd writes, not {per_round}"
    );
    fail(&first, "b/1", secret(2), 0);
    until(&first, &mut b, |k| {
        matches!(k, Kind::RestartRequested(_)).then_some(())
    })
    .await;
    ready(&first, "a", secret(1), 1);
    ready(&first, "b/1", secret(2), 1);
    until(&first, &mut a, |k| {
        matches!(k, Kind::RoundComplete(r) if r.round == 1).then_some(())
    })
    .await;

    // What etcd holds: one key per member, the meta, the participants.
    let keys = client
        .get(
            format!("{PREFIX}/jobs/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list");
    let mut names: Vec<String> = keys
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "/accel-test/jobs/team%2Fjob/m/a",
            "/accel-test/jobs/team%2Fjob/m/b%2F1",
            "/accel-test/jobs/team%2Fjob/meta",
            "/accel-test/jobs/team%2Fjob/participants",
        ]
    );

    // The first leader loses its lease (it was cut off from etcd): it can
    // write nothing more, and the events of what it decided are not sent.
    client.lease_revoke(lease).await.expect("revoke");
    fail(&first, "a", secret(1), 1);
    match first.flush().await {
        Err(StoreError::Fenced(why)) => assert!(why.contains("another replica"), "{why}"),
        other => panic!("a deposed leader's write must be refused, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), a.next())
            .await
            .is_err(),
        "no event of an undurable decision reaches a node"
    );

    // Another replica leads: it loads the job as the first left it in etcd
    // (round 1, one restart spent, both members with their secrets).
    let (fence, _) = lead(&mut client, "second").await;
    let second = Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, Some(fence))),
    );
    assert_eq!(second.load().await.expect("load"), 1);
    let info = second.status("team/job", 0, "").expect("status").jobs[0].clone();
    assert_eq!(
        (
            info.phase.as_str(),
            info.round,
            info.restart_count,
            info.node_count
        ),
        ("running", 1, 1, 2)
    );
    let resume = Some(pb::Resume {
        round: 1,
        restart_count: 1,
        node_rank: rank_of_a,
        nnodes: 2,
    });
    let mut a2 = second
        .join(
            Instant::now(),
            &join_request("a", resume, Some(secret(1))),
            None,
            secret(7),
        )
        .expect("a resumes with its secret");
    let joined = until(&second, &mut a2, |k| match k {
        Kind::Joined(j) => Some(j),
        _ => None,
    })
    .await;
    assert!(joined.resumed, "round 1 goes on");
    // The budget is counted across both leaders: one restart left.
    fail(&second, "a", secret(1), 1);
    let restart = until(&second, &mut a2, |k| match k {
        Kind::RestartRequested(r) => Some(r),
        _ => None,
    })
    .await;
    assert_eq!(restart.next_round, 2);
    let info = second.status("team/job", 0, "").expect("status").jobs[0].clone();
    assert_eq!(info.restart_count, 2, "the second restart, counted once");

    // A third registry reading the same etcd sees the second leader's state.
    let third = Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, None)),
    );
    third.load().await.expect("load");
    let info = third.status("team/job", 0, "").expect("status").jobs[0].clone();
    assert_eq!((info.round, info.restart_count), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_etcd_members_changes_nothing() {
    let dir = scratch("ha-quorum");
    let mut etcd = EtcdCluster::start(&dir, 3);
    let client = Client::connect(etcd.endpoints().split(',').collect::<Vec<_>>(), None)
        .await
        .expect("connect to etcd");
    let registry = Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, None)),
    );
    let now = Instant::now();
    let mut a = registry
        .join(now, &join_request("a", None, None), None, secret(1))
        .expect("a joins");
    let _b = registry
        .join(now, &join_request("b", None, None), None, secret(2))
        .expect("b joins");
    registry.flush().await.expect("written");
    etcd.kill(0);
    ready(&registry, "a", secret(1), 0);
    ready(&registry, "b", secret(2), 0);
    // The client may first try the dead member; a failed batch is retried
    // whole, and the round forms on the two members left.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut failures = 0;
    loop {
        match registry.flush().await {
            Ok(_) => break,
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => failures += 1,
            Err(e) => panic!("two of three members serve: {e}"),
        }
    }
    let round = until(&registry, &mut a, |k| match k {
        Kind::RoundComplete(r) => Some(r.round),
        _ => None,
    })
    .await;
    assert_eq!(round, 0);
    eprintln!("batches retried while a member was down: {failures}");
    let again = Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, None)),
    );
    again.load().await.expect("load from the two members left");
    assert_eq!(
        again.status("team/job", 0, "").expect("status").jobs[0].phase,
        "running"
    );
}
