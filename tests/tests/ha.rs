//! Rendezvous state on a real etcd: what one registry decided, a registry
//! on another host continues; a leader whose election key is gone can write
//! nothing; a lost etcd member (quorum kept) changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_etcd::{Client, EventType, GetOptions};
use accel_proto::v1 as pb;
use accel_tests::etcd::EtcdCluster;
use accel_tests::scratch;
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

/// A client of member 0 of `etcd`.
async fn connect(etcd: &EtcdCluster) -> Client {
    Client::connect([etcd.endpoint(0)], None)
        .await
        .expect("connect to etcd")
}

/// A registry keeping its jobs under `PREFIX` in etcd, its writes
/// conditioned on `fence` if given.
fn on_etcd(client: &Client, fence: Option<Fence>) -> Registry {
    Registry::with_store(
        TTL,
        Limits::default(),
        Arc::new(EtcdStore::new(client.clone(), PREFIX, fence)),
    )
}

/// Campaigns for leadership of `PREFIX/leader` with a fresh lease; the fence
/// and the lease id.
async fn lead(client: &Client, name: &str) -> (Fence, i64) {
    let lease = client.lease_grant(10).await.expect("lease").id;
    let won = client
        .campaign(format!("{PREFIX}/leader"), name, lease)
        .await
        .expect("campaign");
    let key = won.leader.expect("leader key");
    (
        Fence {
            key: key.key,
            revision: key.rev,
        },
        lease,
    )
}

async fn revision(client: &Client) -> i64 {
    client
        .get("/", None)
        .await
        .expect("get")
        .header
        .expect("header")
        .revision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_etcd_continues_in_another_registry_and_a_deposed_leader_writes_nothing() {
    let dir = scratch("ha-store");
    let etcd = EtcdCluster::start(&dir, 1);
    let client = connect(&etcd).await;
    let (fence, lease) = lead(&client, "first").await;
    let first = on_etcd(&client, Some(fence));

    let now = Instant::now();
    let mut a = first
        .join(now, &join_request("a", None, None), None, secret(1))
        .expect("a joins");
    let mut b = first
        .join(now, &join_request("b/1", None, None), None, secret(2))
        .expect("b joins");
    let before = revision(&client).await;
    ready(&first, "a", secret(1), 0);
    ready(&first, "b/1", secret(2), 0);
    let rank_of_a = until(&first, &mut a, |k| match k {
        Kind::RoundComplete(r) => Some(r.node_rank),
        _ => None,
    })
    .await;
    let per_round = revision(&client).await - before;
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
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "/accel-test/jobs/team%2Fjob/m/a",
            "/accel-test/jobs/team%2Fjob/m/b%2F1",
            "/accel-test/jobs/team%2Fjob/meta",
            "/accel-test/jobs/team%2Fjob/participants/0",
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
    let (fence, _) = lead(&client, "second").await;
    let second = on_etcd(&client, Some(fence));
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
    let third = on_etcd(&client, None);
    third.load().await.expect("load");
    let info = third.status("team/job", 0, "").expect("status").jobs[0].clone();
    assert_eq!((info.round, info.restart_count), (2, 2));
}

/// Whether etcd holds job `team/job`'s key `name` (under `PREFIX`).
async fn has_key(client: &Client, name: &str) -> bool {
    let key = format!("{PREFIX}/jobs/team%2Fjob/{name}");
    client.get(key, None).await.expect("get").count > 0
}

fn job_info(registry: &Registry) -> pb::JobInfo {
    registry
        .status("team/job", 1, "")
        .expect("the job is there")
        .jobs
        .remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_too_large_for_one_transaction_is_bracketed_and_a_half_written_one_re_forms() {
    let dir = scratch("ha-torn");
    let etcd = EtcdCluster::start(&dir, 1);
    let client = connect(&etcd).await;
    let (fence, _lease) = lead(&client, "first").await;
    let first = on_etcd(&client, Some(fence));
    // A round of 150 nodes changes every member at once: more operations
    // than one transaction takes.
    let n = 150;
    let now = Instant::now();
    let mut streams = Vec::new();
    for i in 0..n {
        let mut req = join_request(&format!("n{i:03}"), None, None);
        (req.min_nodes, req.max_nodes) = (n, n);
        let stream = first
            .join(now, &req, None, secret((i % 250) as u8))
            .expect("joins");
        streams.push(stream);
    }
    first.flush().await.expect("the joins are written");
    let before = revision(&client).await;
    let mut marker = client
        .watch(format!("{PREFIX}/jobs/team%2Fjob/writing"))
        .await
        .expect("watch the marker");
    for i in 0..n {
        ready(&first, &format!("n{i:03}"), secret((i % 250) as u8), 0);
    }
    until(&first, &mut streams[0], |k| {
        matches!(k, Kind::RoundComplete(_)).then_some(())
    })
    .await;
    let writes = revision(&client).await - before;
    assert!(
        writes >= 2,
        "the round took several transactions ({writes})"
    );
    // The marker went in with the first transaction and out with the last.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let resp = tokio::time::timeout(Duration::from_secs(5), marker.message())
            .await
            .expect("the marker's events")
            .expect("watch")
            .expect("watching");
        seen.extend(resp.events.iter().map(|e| e.r#type()));
    }
    assert_eq!(seen, [EventType::Put, EventType::Delete]);
    assert!(
        !has_key(&client, "writing").await,
        "a change written whole leaves no marker"
    );
    assert_eq!(job_info(&first).phase, "running");

    // A leader that stopped between two transactions of a change leaves the
    // marker behind: the next leader re-forms the job instead of trusting
    // half of a round, and spends nothing of the budget on it.
    client
        .put(format!("{PREFIX}/jobs/team%2Fjob/writing"), "")
        .await
        .expect("put the marker");
    let second = on_etcd(&client, None);
    assert_eq!(second.load().await.expect("loads"), 1);
    let info = job_info(&second);
    assert_eq!(
        (info.phase.as_str(), info.round, info.restart_count),
        ("forming", 1, 0),
        "re-formed as round 1, no restart counted"
    );
    second.flush().await.expect("the re-formed job is written");
    assert!(
        !has_key(&client, "writing").await,
        "the job written whole again: the marker is gone"
    );
    // Loaded once more, it is trusted as it is.
    let third = on_etcd(&client, None);
    assert_eq!(third.load().await.expect("loads"), 1);
    let info = job_info(&third);
    assert_eq!((info.phase.as_str(), info.round), ("forming", 1));
    assert_eq!(info.node_count, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_of_three_etcd_members_changes_nothing() {
    let dir = scratch("ha-quorum");
    let mut etcd = EtcdCluster::start(&dir, 3);
    let client = Client::connect(etcd.endpoints().split(',').collect::<Vec<_>>(), None)
        .await
        .expect("connect to etcd");
    let registry = on_etcd(&client, None);
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
    let again = on_etcd(&client, None);
    again.load().await.expect("load from the two members left");
    assert_eq!(
        again.status("team/job", 0, "").expect("status").jobs[0].phase,
        "running"
    );
}

/// The etcd client on its own against a real member: it connects past a
/// dead endpoint, authenticates, recovers when the member restarts, and
/// when etcd drops its token (the user was deleted and added again)
/// authenticates anew instead of failing the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_client_connects_past_a_dead_member_and_renews_a_dropped_token() {
    let dir = scratch("ha-client");
    let mut etcd = EtcdCluster::start(&dir, 1);
    let root = ["--user", "root:r00t"];
    etcd.ctl(&["user", "add", "root", "--new-user-password", "r00t"]);
    let add_accel = [
        &["user", "add", "accel", "--new-user-password", "s3cret"][..],
        &["user", "grant-role", "accel", "root"][..],
    ];
    for args in add_accel {
        etcd.ctl(args);
    }
    etcd.ctl(&["auth", "enable"]);
    // Leased, so nothing listens there for the whole test.
    let nobody = accel_tests::Port::lease();
    let dead = format!("http://{}", nobody.loopback());
    let endpoints = [dead, etcd.endpoint(0)];

    let wrong = accel_etcd::ConnectOptions::new().with_user("accel", "wrong");
    match Client::connect(&endpoints, Some(wrong)).await {
        Err(accel_etcd::Error::Status(s)) => {
            assert!(s.message().contains("authentication failed"), "{s:?}")
        }
        other => panic!("a wrong password is etcd's refusal, not {other:?}"),
    }
    let anonymous = Client::connect(&endpoints, None).await.expect("connects");
    let refused = anonymous.get("k", None).await.expect_err("auth is on");
    assert!(!refused.is_transient(), "{refused:?}");

    let options = accel_etcd::ConnectOptions::new()
        .with_user("accel", "s3cret")
        .with_connect_timeout(Duration::from_secs(2))
        .with_require_leader(true);
    let client = Client::connect(&endpoints, Some(options))
        .await
        .expect("connects to the live member and authenticates");
    client.put("k", "v1").await.expect("put");

    // Calls fail transiently while the member restarts, then go on.
    etcd.kill(0);
    etcd.restart(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.put("k", "v2").await {
            Ok(_) => break,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the client did not recover after the restart: {e}"),
        }
    }

    // Deleting a user drops its tokens; the client's next call is refused
    // for its token, and the client authenticates again on its own.
    etcd.ctl(&[&["user", "delete", "accel"][..], &root].concat());
    for args in add_accel {
        etcd.ctl(&[args, &root].concat());
    }
    let got = client
        .get("k", None)
        .await
        .expect("the call succeeds with a new token");
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.as_slice()),
        Some(&b"v2"[..])
    );
}

/// An etcd member serving clients over mutual TLS, killed when dropped.
struct TlsEtcd {
    child: std::process::Child,
    endpoint: String,
    /// Its client and peer ports, leased while it runs.
    _ports: (accel_tests::Port, accel_tests::Port),
}

impl TlsEtcd {
    /// Starts a one-member etcd in `dir` whose clients must present a
    /// certificate signed by `dir/ca.pem`; its own is `dir/server.pem`.
    fn start(dir: &std::path::Path) -> Self {
        let (client, peer) = (accel_tests::Port::lease(), accel_tests::Port::lease());
        let endpoint = format!("https://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd-tls.log")).expect("etcd log");
        let child = std::process::Command::new("etcd")
            .args(["--name", "tls"])
            .arg("--data-dir")
            .arg(dir.join("etcd-tls"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("tls={peer_url}")])
            .arg("--cert-file")
            .arg(dir.join("server.pem"))
            .arg("--key-file")
            .arg(dir.join("server.key"))
            .arg("--trusted-ca-file")
            .arg(dir.join("ca.pem"))
            .arg("--client-cert-auth")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (the test command installs etcd-server)");
        Self {
            child,
            endpoint,
            _ports: (client, peer),
        }
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The etcd client over mutual TLS (what `--etcd-ca`, `--etcd-cert` and
/// `--etcd-key` give it): it works with the member's CA and a client
/// certificate, and is refused with another CA or without a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_client_speaks_mutual_tls_and_is_refused_without_it() {
    let dir = scratch("ha-client-tls");
    crate::tls::ca(&dir, "ca");
    crate::tls::ca(&dir, "other-ca");
    crate::tls::leaf(&dir, "ca", "server");
    crate::tls::leaf(&dir, "ca", "client");
    let etcd = TlsEtcd::start(&dir);
    let tls = |ca: &str, client: bool| {
        let ca_path = dir.join(format!("{ca}.pem"));
        let identity = (dir.join("client.pem"), dir.join("client.key"));
        let identity = client.then_some((identity.0.as_path(), identity.1.as_path()));
        let options = rendezvous_server::ha::tls_options(Some(&ca_path), identity)
            .expect("the PEM files read");
        accel_etcd::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_tls(options)
    };

    // The member starts: the client's first put goes through once it serves.
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = loop {
        match Client::connect([&etcd.endpoint], Some(tls("ca", true))).await {
            Ok(c) => match c.put("k", "over tls").await {
                Ok(_) => break c,
                Err(e) if Instant::now() < deadline => eprintln!("not yet: {e}"),
                Err(e) => panic!("no put over TLS: {e}"),
            },
            Err(e) if Instant::now() < deadline => eprintln!("not yet: {e}"),
            Err(e) => panic!("no connection over TLS: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let got = client.get("k", None).await.expect("get over TLS");
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.as_slice()),
        Some(&b"over tls"[..])
    );

    // A member whose certificate another CA signed is not trusted.
    match Client::connect([&etcd.endpoint], Some(tls("other-ca", true))).await {
        Err(e @ accel_etcd::Error::Connect { .. }) => eprintln!("{e}"),
        other => panic!("the server's certificate is not of other-ca: {other:?}"),
    }
    // Without a client certificate the member refuses the handshake (at
    // connecting or at the first call, as TLS 1.3 allows).
    let refused = match Client::connect([&etcd.endpoint], Some(tls("ca", false))).await {
        Err(e) => e,
        Ok(c) => c.get("k", None).await.expect_err("no client certificate"),
    };
    assert!(
        matches!(
            refused,
            accel_etcd::Error::Connect { .. } | accel_etcd::Error::Transport { .. }
        ),
        "{refused:?}"
    );
}

mod replicas {
    //! Two `rdzv-server` replicas on a three-member etcd: one leads, the
    //! other sends callers to it; `kill -9` of the leader hands the job, its
    //! round and its restart budget, to the other.

    use super::*;
    use accel_tests::Server;
    use pb::rendezvous_client::RendezvousClient;
    use tonic::transport::Channel;
    use tonic::{Code, Streaming};

    type Rdzv = RendezvousClient<Channel>;

    async fn client(addr: &str) -> Rdzv {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        RendezvousClient::new(channel)
    }

    async fn status(c: &mut Rdzv) -> Result<pb::JobInfo, tonic::Status> {
        c.job_status(pb::JobStatusRequest {
            job_id: "team/job".into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().jobs.into_iter().next().unwrap_or_default())
    }

    /// The next event of a stream, skipping progress reports.
    async fn next(s: &mut Streaming<pb::Event>) -> Kind {
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(15), s.message())
                .await
                .expect("an event in time")
                .expect("the stream goes on")
                .expect("not the end");
            match ev.kind {
                Some(Kind::Waiting(_)) | None => continue,
                Some(k) => return k,
            }
        }
    }

    struct Node {
        id: &'static str,
        session: Vec<u8>,
        events: Streaming<pb::Event>,
    }

    async fn join(c: &mut Rdzv, id: &'static str, session: Vec<u8>) -> Node {
        join_resuming(c, id, session, None).await
    }

    /// [`join`], presenting the round the node's workers run.
    async fn join_resuming(
        c: &mut Rdzv,
        id: &'static str,
        session: Vec<u8>,
        resume: Option<pb::Resume>,
    ) -> Node {
        let mut req = join_request(id, resume, None);
        req.session = session;
        let mut events = c.join(req).await.expect("joins").into_inner();
        let session = match next(&mut events).await {
            Kind::Joined(j) => j.session,
            other => panic!("expected Joined, got {other:?}"),
        };
        Node {
            id,
            session,
            events,
        }
    }

    async fn ready(c: &mut Rdzv, n: &Node, round: u64) {
        c.ready(pb::ReadyRequest {
            job_id: "team/job".into(),
            node_id: n.id.into(),
            round,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            session: n.session.clone(),
        })
        .await
        .expect("ready");
    }

    async fn fail(c: &mut Rdzv, n: &Node, round: u64) {
        c.report_failure(pb::ReportFailureRequest {
            job_id: "team/job".into(),
            node_id: n.id.into(),
            round,
            local_rank: 0,
            global_rank: 0,
            reason: "exited with code 1".into(),
            session: n.session.clone(),
            ..Default::default()
        })
        .await
        .expect("failure reported");
    }

    async fn form(c: &mut Rdzv, nodes: &mut [Node], round: u64) {
        for n in nodes.iter() {
            ready(c, n, round).await;
        }
        for n in nodes.iter_mut() {
            match next(&mut n.events).await {
                Kind::RoundComplete(r) => assert_eq!(r.round, round),
                other => panic!("expected round {round} complete, got {other:?}"),
            }
        }
    }

    /// Two agents of `cmd`, `node-0` and `node-1`, recording into `dir`
    /// with `env`.
    fn two_nodes(
        cmd: &accel_tests::AgentCmd,
        dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Vec<accel_tests::Agent> {
        (0..2)
            .map(|i| {
                let tag = format!("node-{i}");
                cmd.clone().recording(dir, &tag).envs(env).start(dir, &tag)
            })
            .collect()
    }

    /// Two replicas (`--etcd-lease 2`) on a fresh three-member etcd, under
    /// `prefix`: `first` leads before `second` starts, so the test knows
    /// which one to kill.
    fn replicas(dir: &std::path::Path, prefix: &str) -> (EtcdCluster, Server, Server) {
        replicas_on(EtcdCluster::start(dir, 3), prefix)
    }

    /// The same on `etcd`.
    fn replicas_on(etcd: EtcdCluster, prefix: &str) -> (EtcdCluster, Server, Server) {
        let endpoints = etcd.endpoints();
        let args = [
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            prefix,
            "--etcd-lease",
            "2",
        ];
        let first = Server::start_with("127.0.0.1:0", &args, &[]);
        leads(&first);
        let second = Server::start_with("127.0.0.1:0", &args, &[]);
        (etcd, first, second)
    }

    /// Waits until `server`, the first replica, leads (it wins the empty
    /// election).
    fn leads(server: &Server) {
        // The tests are async or own a runtime: wait on a thread of its own.
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let mut c = client(&server.addr).await;
                    let deadline = Instant::now() + Duration::from_secs(20);
                    // The first replica wins the empty election.
                    loop {
                        match status(&mut c).await {
                            Err(s) if s.code() == Code::NotFound => break,
                            Err(s)
                                if s.code() == Code::Unavailable && Instant::now() < deadline =>
                            {
                                tokio::time::sleep(Duration::from_millis(100)).await
                            }
                            other => panic!("the first replica leads: {other:?}"),
                        }
                    }
                })
            });
        });
    }

    /// A rolling upgrade as a StatefulSet makes it: each replica stopped
    /// (SIGTERM) and started again at its address in turn, the follower
    /// first, then the leader, while a two-node job runs. No worker stops:
    /// the job ends with success in its first round, never restarted, its
    /// budget unspent.
    #[test]
    fn a_rolling_upgrade_of_both_replicas_stops_no_worker() {
        let dir = scratch("ha-rolling");
        let etcd = EtcdCluster::start(&dir, 3);
        let etcd_endpoints = etcd.endpoints();
        let args = [
            "--etcd-endpoints",
            &etcd_endpoints,
            "--etcd-prefix",
            "/rolling",
            "--etcd-lease",
            "2",
        ];
        let first = Server::start_with("127.0.0.1:0", &args, &[]);
        leads(&first);
        let second = Server::start_with("127.0.0.1:0", &args, &[]);
        let (first_addr, second_addr) = (first.addr.clone(), second.addr.clone());
        let endpoints = format!("{first_addr},{second_addr}");
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(1)
            .max_restarts(1);
        let env = [("RECORD_EACH_ROUND", "1"), ("RUN_FOR", "20")];
        let agents = two_nodes(&cmd, &dir, &env);
        accel_tests::poll_until("both workers run", Duration::from_secs(30), || {
            match accel_tests::records(&dir).len() {
                2 => Ok(()),
                n => Err(format!("{n} workers")),
            }
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // A replica that is back follows the leader, or leads.
        let serves = |addr: &str| {
            accel_tests::poll_until("the replica is back", Duration::from_secs(20), || {
                rt.block_on(async {
                    let mut c = client(addr).await;
                    match status(&mut c).await {
                        Ok(_) => Ok(()),
                        Err(s) if s.metadata().get(accel_wire::LEADER_METADATA).is_some() => Ok(()),
                        Err(s) => Err(format!("{s:?}")),
                    }
                })
            })
        };
        // The follower, then the leader: stopped, started again.
        second.signal("TERM");
        assert!(second.wait(Duration::from_secs(20)).success());
        let second = Server::start_with(&second_addr, &args, &[]);
        serves(&second_addr);
        first.signal("TERM");
        assert!(first.wait(Duration::from_secs(20)).success());
        let first = Server::start_with(&first_addr, &args, &[]);
        serves(&first_addr);
        for agent in agents {
            let out = agent.wait(Duration::from_secs(60));
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        let recs = accel_tests::records(&dir);
        assert_eq!(recs.len(), 2, "no worker was started again: {recs:?}");
        drop((first, second, etcd));
    }

    /// Two replicas as the etcd user of their namespace, whose role covers
    /// `/accel/team-a/` only (the Kubernetes HA overlay's setup): they
    /// elect a leader and run a two-node job, keys only under their
    /// prefix; a replica of another installation given that user cannot
    /// serve (etcd refuses it the other prefix) and says so.
    #[test]
    fn replicas_as_an_etcd_user_confined_to_their_prefix_serve_and_reach_no_other() {
        let dir = scratch("ha-etcd-user");
        let etcd = EtcdCluster::start(&dir, 1);
        let root = ["--user", "root:root-password"];
        for cmd in [
            &[
                "user",
                "add",
                "root",
                "--new-user-password=root-password",
                "--interactive=false",
            ][..],
            &["user", "grant-role", "root", "root"],
            &[
                "user",
                "add",
                "accel-team-a",
                "--new-user-password=team-a-password",
                "--interactive=false",
            ],
            &["role", "add", "accel-team-a"],
            &[
                "role",
                "grant-permission",
                "accel-team-a",
                "--prefix=true",
                "readwrite",
                "/accel/team-a/",
            ],
            &["user", "grant-role", "accel-team-a", "accel-team-a"],
            &["auth", "enable"],
        ] {
            etcd.ctl(cmd);
        }
        let password = dir.join("etcd-password");
        std::fs::write(&password, "team-a-password\n").expect("password");
        let endpoints = etcd.endpoints();
        let args = |prefix: &'static str| {
            [
                "--etcd-endpoints".to_owned(),
                endpoints.clone(),
                "--etcd-prefix".to_owned(),
                prefix.to_owned(),
                "--etcd-lease".to_owned(),
                "2".to_owned(),
                "--etcd-user".to_owned(),
                "accel-team-a".to_owned(),
                "--etcd-password-file".to_owned(),
                password.to_string_lossy().into_owned(),
            ]
        };
        let a = args("/accel/team-a");
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let first = Server::start_with("127.0.0.1:0", &a, &[]);
        leads(&first);
        let second = Server::start_with("127.0.0.1:0", &a, &[]);
        let endpoints = format!("{},{}", first.addr, second.addr);
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(1);
        for agent in two_nodes(&cmd, &dir, &[("RUN_FOR", "1")]) {
            let out = agent.wait(Duration::from_secs(60));
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        let mut ctl = root.to_vec();
        ctl.extend(["get", "--prefix", "/", "--keys-only"]);
        let keys = etcd.ctl(&ctl);
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        assert!(!keys.is_empty(), "the replicas wrote their keys");
        assert!(
            keys.iter().all(|k| k.starts_with("/accel/team-a/")),
            "only under the prefix: {keys:?}"
        );
        // Another installation's replica with this user: refused by etcd.
        let b = args("/accel/team-b");
        let b: Vec<&str> = b.iter().map(String::as_str).collect();
        let other = Server::start_with("127.0.0.1:0", &b, &[]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let said = accel_tests::poll_until(
            "the other installation's replica says etcd refused it",
            Duration::from_secs(20),
            || {
                let err = other.stderr();
                if err.to_lowercase().contains("permission denied") {
                    Ok(err)
                } else {
                    Err(err)
                }
            },
        );
        let served = rt.block_on(async {
            let mut c = client(&other.addr).await;
            status(&mut c).await
        });
        assert!(
            matches!(&served, Err(s) if s.code() == Code::Unavailable),
            "it serves nothing: {served:?}\n{said}"
        );
        drop((first, second));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_follower_names_the_leader_and_takes_the_job_over_when_it_is_killed() {
        let dir = scratch("ha-replicas");
        let (_etcd, first, second) = replicas(&dir, "/replicas");
        let mut c1 = client(&first.addr).await;
        let mut c2 = client(&second.addr).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let refused = loop {
            let s = status(&mut c2)
                .await
                .expect_err("a follower serves nothing");
            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
            if s.metadata().get(accel_wire::LEADER_METADATA).is_some() || Instant::now() > deadline
            {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            refused
                .metadata()
                .get(accel_wire::LEADER_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some(first.addr.as_str()),
            "the follower names the leader: {refused:?}"
        );
        assert!(refused.message().contains(&first.addr), "{refused:?}");

        // A job on the leader: round 0, a failure, round 1 (one restart spent).
        let mut nodes = vec![
            join(&mut c1, "a", Vec::new()).await,
            join(&mut c1, "b", Vec::new()).await,
        ];
        form(&mut c1, &mut nodes, 0).await;
        fail(&mut c1, &nodes[1], 0).await;
        for n in nodes.iter_mut() {
            assert!(matches!(
                next(&mut n.events).await,
                Kind::RestartRequested(_)
            ));
        }
        form(&mut c1, &mut nodes, 1).await;

        // kill -9 the leader: the follower leads within about the lease.
        let killed = Instant::now();
        drop(first);
        let info = loop {
            match status(&mut c2).await {
                Ok(info) => break info,
                Err(s)
                    if s.code() == Code::Unavailable
                        && killed.elapsed() < Duration::from_secs(20) =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(s) => panic!("the follower did not take over: {s:?}"),
            }
        };
        eprintln!(
            "failover: leader killed -> follower serving in {:?}",
            killed.elapsed()
        );
        assert_eq!(
            (
                info.phase.as_str(),
                info.round,
                info.restart_count,
                info.node_count
            ),
            ("running", 1, 1, 2),
            "the job as the first leader left it"
        );
        // The nodes come back with their secrets, resuming round 1 (their
        // workers run it); the budget is counted across both leaders: one
        // restart left of two.
        let resume = |node_rank| pb::Resume {
            round: 1,
            restart_count: 1,
            node_rank,
            nnodes: 2,
        };
        let mut nodes = vec![
            join_resuming(&mut c2, "a", nodes[0].session.clone(), Some(resume(0))).await,
            join_resuming(&mut c2, "b", nodes[1].session.clone(), Some(resume(1))).await,
        ];
        fail(&mut c2, &nodes[0], 1).await;
        for n in nodes.iter_mut() {
            match next(&mut n.events).await {
                Kind::RestartRequested(r) => assert!(r.counted && r.next_round == 2),
                other => panic!("expected a counted restart, got {other:?}"),
            }
        }
        form(&mut c2, &mut nodes, 2).await;
        fail(&mut c2, &nodes[1], 2).await;
        match next(&mut nodes[0].events).await {
            Kind::JobFailed(f) => assert!(
                f.reason.contains("budget is spent (2 of --max-restarts 2)"),
                "{}",
                f.reason
            ),
            other => panic!("expected the job to fail, got {other:?}"),
        }
    }

    #[test]
    fn agents_follow_a_failover_with_their_workers_running_and_the_budget_counted_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = scratch("ha-agents");
        let (_etcd, first, second) = replicas(&dir, "/agents");
        // The follower first: the agents find the leader through its answer.
        let endpoints = format!("{},{}", second.addr, first.addr);
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(2)
            .max_restarts(2);
        // Global rank 3 fails 6 s into the first attempt (after the
        // failover); every other worker runs 8 s.
        let env = [
            ("RECORD_EACH_ROUND", "1"),
            ("FAIL_RANKS", "3"),
            ("FAIL_UNTIL", "1"),
            ("FAIL_AFTER", "6"),
            ("RUN_FOR", "8"),
        ];
        let agents = two_nodes(&cmd, &dir, &env);
        let started = |restart: u32| {
            accel_tests::records(&dir)
                .into_iter()
                .filter(|r| r.restart == restart)
                .count()
        };
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || started(0) == 4),
            "four workers run"
        );
        let killed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        drop(first);
        let outs: Vec<_> = agents
            .into_iter()
            .map(|a| a.wait(Duration::from_secs(90)))
            .collect();
        for out in &outs {
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        let recs = accel_tests::records(&dir);
        let first_attempt: Vec<_> = recs.iter().filter(|r| r.restart == 0).collect();
        assert_eq!(
            first_attempt.len(),
            4,
            "no worker was started again by the failover: {:?}",
            first_attempt
                .iter()
                .map(|r| (r.rank, r.pid))
                .collect::<Vec<_>>()
        );
        let failed = first_attempt
            .iter()
            .find(|r| r.rank == 3)
            .expect("rank 3 of the first attempt");
        assert!(
            failed.start + 6.0 > killed,
            "the failure came after the leader was killed"
        );
        assert_eq!(started(1), 4, "one restart, on both nodes");
        assert!(recs.iter().all(|r| r.restart <= 1), "exactly one restart");
        // The leader that took over counted the one restart.
        rt.block_on(async {
            let mut c = client(&second.addr).await;
            let info = status(&mut c).await.expect("the new leader knows the job");
            assert_eq!((info.phase.as_str(), info.restart_count), ("succeeded", 1));
        });
    }

    /// Seconds since the epoch, as the workers' records count them.
    fn wall() -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
    }

    /// How a leader goes silent in [`a_silent_leader`].
    trait Silence {
        /// Makes the leader silent.
        fn start(&self);
        /// Ends it: the old leader hears and is heard again.
        fn end(&self);
    }

    /// `SIGSTOP` and `SIGCONT`: a GC pause, a frozen VM, swap. Its kernel
    /// keeps its TCP connections open and accepts new ones.
    struct Paused<'a>(&'a Server);

    impl Silence for Paused<'_> {
        fn start(&self) {
            self.0.signal("STOP");
        }
        fn end(&self) {
            self.0.signal("CONT");
        }
    }

    /// Every packet that reaches the leader's host from outside is dropped
    /// (nftables in its network namespace): the agents' and etcd's alike,
    /// so its lease lapses and the other replica is elected, while what it
    /// sends still goes out. Its process runs on throughout.
    struct Deaf<'a>(&'a accel_tests::Netns);

    impl Silence for Deaf<'_> {
        fn start(&self) {
            self.0.nft(&format!(
                "table inet accel_deaf {{\n  chain in {{\n    type filter hook input priority 0;\n    iifname \"{}\" drop\n  }}\n}}\n",
                self.0.iface
            ));
        }
        fn end(&self) {
            self.0.nft("delete table inet accel_deaf\n");
        }
    }

    /// A leader whose job (two nodes of two workers, one restart allowed
    /// per failure) goes silent 1.5 s into its first round for 10 s, while
    /// global rank 3 fails `fail_after` s into it (during the silence,
    /// before the other replica is elected). Checks that the workers ran on (no
    /// worker of the first round started twice), that the failure
    /// restarted the job exactly once on every node, within a second of
    /// the other replica's election, that the old leader, heard again,
    /// refuses to act and disturbs nobody (the second round's workers run
    /// to their end), and that the job succeeds on the new leader. The
    /// replicas: `old` leads, `new` follows; `cmd` starts the agent tagged
    /// so. Returns the seconds from the election to the last worker of the
    /// next round running.
    fn a_silent_leader(
        dir: &std::path::Path,
        old: &Server,
        new: &Server,
        silence: &dyn Silence,
        fail_after: f64,
        cmd: impl Fn(&str) -> accel_tests::Agent,
    ) -> f64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let agents: Vec<_> = (0..2).map(|i| cmd(&format!("node-{i}"))).collect();
        let records = || accel_tests::records(dir);
        let round = |restart: u32| {
            records()
                .into_iter()
                .filter(|r| r.restart == restart)
                .collect::<Vec<_>>()
        };
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || round(0).len() == 4),
            "four workers run"
        );
        let started = round(0).iter().map(|r| r.start).fold(f64::MIN, f64::max);
        // 1.5 s into the round (its workers' own clock), the leader goes silent.
        let at = started + 1.5;
        std::thread::sleep(Duration::from_secs_f64((at - wall()).max(0.0)));
        let silent_at = wall();
        silence.start();
        // The other replica is elected once the old one's lease runs out,
        // or once the agents' complaints depose it, whichever is first:
        // the moment its job status turns from UNAVAILABLE to an answer.
        let elected = rt.block_on(async {
            let mut c = client(&new.addr).await;
            loop {
                match status(&mut c).await {
                    Ok(_) => break wall(),
                    Err(s) if s.code() == Code::Unavailable && wall() - silent_at < 20.0 => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    Err(s) => panic!("the other replica did not take over: {s:?}"),
                }
            }
        });
        eprintln!(
            "silent leader: the other replica serves {:.2} s after the silence began",
            elected - silent_at
        );
        assert!(
            accel_tests::eventually(Duration::from_secs(10), || round(1).len() == 4),
            "every node runs the next round: {:?}",
            records()
                .iter()
                .map(|r| (r.restart, r.rank, r.pid))
                .collect::<Vec<_>>()
        );
        let next = round(1).iter().map(|r| r.start).fold(f64::MIN, f64::max);
        let took = next - elected;
        eprintln!("silent leader: new leader elected -> every worker of the next round running in {:.3} s", took);
        // Heard again 10 s after it went silent, mid-round.
        std::thread::sleep(Duration::from_secs_f64(
            (silent_at + 10.0 - wall()).max(0.0),
        ));
        silence.end();
        let healed = wall();
        let outs: Vec<_> = agents
            .into_iter()
            .map(|a| a.wait(Duration::from_secs(60)))
            .collect();
        for out in &outs {
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        let recs = records();
        let first: Vec<_> = recs.iter().filter(|r| r.restart == 0).collect();
        assert_eq!(
            first.len(),
            4,
            "no worker of the first round was started again: {:?}",
            first.iter().map(|r| (r.rank, r.pid)).collect::<Vec<_>>()
        );
        let failed = first.iter().find(|r| r.rank == 3).expect("rank 3");
        let failed_at = failed.start + fail_after;
        assert!(
            failed_at > silent_at && failed_at < elected,
            "the failure came during the silence, before the election ({silent_at:.2} < {failed_at:.2} < {elected:.2})"
        );
        let second: Vec<_> = recs.iter().filter(|r| r.restart == 1).collect();
        assert_eq!(second.len(), 4, "one restart, on every node");
        assert!(recs.iter().all(|r| r.restart <= 1), "exactly one restart");
        assert!(
            second.iter().all(|r| r.end.is_some_and(|end| end > healed)),
            "the second round ran to its end, past the old leader's return: {:?}",
            second.iter().map(|r| (r.rank, r.end)).collect::<Vec<_>>()
        );
        rt.block_on(async {
            let mut c = client(&new.addr).await;
            let info = status(&mut c).await.expect("the new leader knows the job");
            assert_eq!((info.phase.as_str(), info.restart_count), ("succeeded", 1));
            // The old one, heard again, serves nothing.
            let mut c = client(&old.addr).await;
            let s = status(&mut c)
                .await
                .expect_err("the old leader no longer leads");
            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        });
        took
    }

    #[test]
    fn a_paused_leader_loses_nothing_and_a_failure_meanwhile_restarts_the_job_once() {
        let dir = scratch("ha-paused-leader");
        let (_etcd, first, second) = replicas(&dir, "/paused");
        let endpoints = format!("{},{}", first.addr, second.addr);
        let took = a_silent_leader(&dir, &first, &second, &Paused(&first), 2.0, |tag| {
            accel_tests::AgentCmd::c10d(&endpoints, "team/job")
                .nnodes(2)
                .nproc(2)
                .max_restarts(3)
                .recording(&dir, tag)
                .envs(&SILENT_LEADER_ENV)
                .start(&dir, tag)
        });
        assert!(
            took <= 1.0,
            "the next round ran {took:.3} s after the election"
        );
    }

    #[test]
    fn a_deaf_leader_loses_nothing_and_a_failure_meanwhile_restarts_the_job_once() {
        // The old leader on a host of its own; the other replica, etcd and
        // the agents here, on the segment's gateway.
        let lan = accel_tests::Lan::create();
        let host = lan.host(2);
        let dir = scratch("ha-deaf-leader");
        let etcd = EtcdCluster::start_also_at(&dir, 3, Some(&lan.gateway));
        // The segment is the test's own: no token.
        let args = |endpoints: String| {
            [
                "--etcd-endpoints".to_owned(),
                endpoints,
                "--etcd-prefix".into(),
                "/deaf".into(),
                "--etcd-lease".into(),
                "2".into(),
                "--allow-unauthenticated".into(),
            ]
        };
        fn args_of(a: &[String; 7]) -> Vec<&str> {
            a.iter().map(String::as_str).collect()
        }
        let first_args = args(etcd.endpoints_at(&lan.gateway));
        let first = Server::start_in(
            &host.exec(),
            &format!("{}:0", host.addr),
            &args_of(&first_args),
            &[],
        );
        leads(&first);
        let second_args = args(etcd.endpoints());
        let second = Server::start_with(&format!("{}:0", lan.gateway), &args_of(&second_args), &[]);
        let endpoints = format!("{},{}", first.addr, second.addr);
        let took = a_silent_leader(&dir, &first, &second, &Deaf(&host), 2.0, |tag| {
            accel_tests::AgentCmd::c10d(&endpoints, "team/job")
                .nnodes(2)
                .nproc(2)
                .max_restarts(3)
                .recording(&dir, tag)
                .envs(&SILENT_LEADER_ENV)
                .start(&dir, tag)
        });
        assert!(
            took <= 1.0,
            "the next round ran {took:.3} s after the election"
        );
    }

    /// Packets from the agents to the leader's port are dropped (nftables
    /// in its network namespace), one way: the leader still reaches etcd
    /// (it keeps its lease) and what it sends still goes out. Nothing but
    /// the agents' complaints to the other replica can end its term.
    struct CutOff<'a> {
        host: &'a accel_tests::Netns,
        port: u16,
    }

    impl Silence for CutOff<'_> {
        fn start(&self) {
            self.host.nft(&format!(
                "table inet accel_cut {{\n  chain in {{\n    type filter hook input priority 0;\n    iifname \"{}\" tcp dport {} drop\n  }}\n}}\n",
                self.host.iface, self.port
            ));
        }
        fn end(&self) {
            self.host.nft("delete table inet accel_cut\n");
        }
    }

    #[test]
    fn a_leader_its_agents_cannot_reach_is_deposed_and_a_failure_meanwhile_restarts_the_job_once() {
        // The old leader on a host of its own; the other replica, etcd and
        // the agents here, on the segment's gateway.
        let lan = accel_tests::Lan::create();
        let host = lan.host(2);
        let dir = scratch("ha-cut-leader");
        let etcd = EtcdCluster::start_also_at(&dir, 3, Some(&lan.gateway));
        let args = |endpoints: String| {
            [
                "--etcd-endpoints".to_owned(),
                endpoints,
                "--etcd-prefix".into(),
                "/cut".into(),
                "--etcd-lease".into(),
                "2".into(),
                "--allow-unauthenticated".into(),
            ]
        };
        fn args_of(a: &[String; 7]) -> Vec<&str> {
            a.iter().map(String::as_str).collect()
        }
        let first_args = args(etcd.endpoints_at(&lan.gateway));
        let first = Server::start_in(
            &host.exec(),
            &format!("{}:0", host.addr),
            &args_of(&first_args),
            &[],
        );
        let port: u16 = first
            .addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the first replica's port");
        leads(&first);
        let second_args = args(etcd.endpoints());
        let second = Server::start_with(&format!("{}:0", lan.gateway), &args_of(&second_args), &[]);
        let endpoints = format!("{},{}", first.addr, second.addr);
        let cut = CutOff { host: &host, port };
        let took = a_silent_leader(&dir, &first, &second, &cut, 2.0, |tag| {
            accel_tests::AgentCmd::c10d(&endpoints, "team/job")
                .nnodes(2)
                .nproc(2)
                .max_restarts(3)
                .recording(&dir, tag)
                .envs(&SILENT_LEADER_ENV)
                .start(&dir, tag)
        });
        assert!(
            took <= 1.0,
            "the next round ran {took:.3} s after the election"
        );
        assert!(
            second
                .stderr()
                .contains("deposing the leader: 2 of 2 nodes"),
            "the new leader says why it took over"
        );
    }

    /// Complaints (joins that say the leader went silent) reach the
    /// follower from one of a job's three nodes, and from a second one
    /// with a wrong secret: the leader stays. A second node's own
    /// complaint makes a majority: the follower deposes the leader and
    /// leads within a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_minority_of_a_jobs_nodes_complaining_deposes_nobody_a_majority_does() {
        let dir = scratch("ha-complaints");
        let (etcd, first, second) = replicas(&dir, "/complaints");
        let mut c1 = client(&first.addr).await;
        let mut c2 = client(&second.addr).await;
        let three = |id: &str| {
            let mut req = join_request(id, None, None);
            req.min_nodes = 3;
            req.max_nodes = 3;
            req
        };
        let mut nodes = Vec::new();
        for id in ["a", "b", "c"] {
            let mut events = c1.join(three(id)).await.expect("joins").into_inner();
            let session = match next(&mut events).await {
                Kind::Joined(j) => j.session,
                other => panic!("expected Joined, got {other:?}"),
            };
            nodes.push((id, session, events));
        }
        let complain = |id: &str, session: &[u8]| {
            let mut req = three(id);
            req.session = session.to_vec();
            req.resume = Some(pb::Resume {
                round: 0,
                ..Default::default()
            });
            req.silent_replica = first.addr.clone();
            req
        };
        let to_follower = c2.clone();
        let complaints = |reqs: Vec<pb::JoinRequest>, for_s: f64| {
            let mut c2 = to_follower.clone();
            async move {
                let until = Instant::now() + Duration::from_secs_f64(for_s);
                while Instant::now() < until {
                    for req in &reqs {
                        // A follower refuses the join, naming the leader.
                        let _ = c2.join(req.clone()).await;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        };
        // The job is in etcd once its three members are (the leader writes
        // every tick): the complaints are checked against them.
        let stored_members = || {
            let keys = etcd.ctl(&["get", "--prefix", "/complaints/jobs/", "--keys-only"]);
            keys.lines().filter(|k| k.contains("/m/")).count()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while stored_members() < 3 {
            assert!(Instant::now() < deadline, "the members reach etcd");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        complaints(
            vec![
                complain("a", &nodes[0].1),
                complain("b", &[7; SESSION_BYTES]),
                complain("stranger", &nodes[2].1),
            ],
            4.0,
        )
        .await;
        status(&mut c1)
            .await
            .expect("one node of three (and a wrong secret, and a stranger) depose nobody");
        let s = status(&mut c2)
            .await
            .expect_err("the follower still follows");
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(
            !second.stderr().contains("deposing"),
            "no deposal: {}",
            second.stderr()
        );
        // A second node complains: 2 of 3.
        let complained = Instant::now();
        let majority = tokio::spawn(complaints(
            vec![complain("a", &nodes[0].1), complain("b", &nodes[1].1)],
            5.0,
        ));
        let elected = loop {
            match status(&mut c2).await {
                Ok(_) => break Instant::now(),
                Err(s)
                    if s.code() == Code::Unavailable
                        && complained.elapsed() < Duration::from_secs(5) =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(s) => panic!("the follower did not take over: {s:?}"),
            }
        };
        let took = elected.duration_since(complained);
        eprintln!("complaints: a majority -> the follower leads in {took:?}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        // The deposed leader, still reaching etcd, stepped down: it ends
        // its streams at once and follows.
        let (_, _, events) = &mut nodes[2];
        // It watches its election key: it learns at once, not at its next
        // keep-alive (a third of the lease) or write.
        let ended = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match events.message().await {
                    Ok(Some(pb::Event {
                        kind: Some(Kind::JobClosed(c)),
                    })) => break Some(c),
                    Ok(Some(_)) => continue,
                    _ => break None,
                }
            }
        })
        .await
        .expect("the deposed leader ends its streams promptly");
        if let Some(c) = ended {
            assert!(c.may_rejoin, "{c:?}");
        }
        let s = status(&mut c1)
            .await
            .expect_err("the deposed leader follows");
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        majority.await.expect("complaints sent");
        let log = second.stderr();
        assert_eq!(
            log.matches("deposing the leader").count(),
            1,
            "one warning per deposal: {log}"
        );
        assert!(log.contains("2 of 3 nodes"), "{log}");
    }

    /// The workers of [`a_silent_leader`]: rank 3 fails 2.0 s into the first
    /// round (0.5 s into the silence, before the agents take the leader for
    /// silent and their complaints depose it); the others run 12 s (the
    /// next round outlasts the silence).
    const SILENT_LEADER_ENV: [(&str, &str); 5] = [
        ("RECORD_EACH_ROUND", "1"),
        ("FAIL_RANKS", "3"),
        ("FAIL_UNTIL", "1"),
        ("FAIL_AFTER", "2.0"),
        ("RUN_FOR", "12"),
    ];

    #[test]
    fn losing_etcd_quorum_stops_every_decision_and_the_job_goes_on_when_it_returns() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = scratch("ha-quorum-lost");
        let (mut etcd, first, second) = replicas(&dir, "/quorum");
        let endpoints = format!("{},{}", first.addr, second.addr);
        // Workers are kept for the drop limit without a leader: 30 s here,
        // room for the outage and the election after it.
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(1)
            .max_restarts(1)
            .conf("keep_alive_max_attempt=6");
        let env = [("RECORD_EACH_ROUND", "1"), ("RUN_FOR", "25")];
        let agents = two_nodes(&cmd, &dir, &env);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || {
                accel_tests::records(&dir).len() == 2
            }),
            "both workers run"
        );
        // Two of three members gone: no write can land, so nothing is decided.
        etcd.kill(1);
        etcd.kill(2);
        let lost = Instant::now();
        rt.block_on(async {
            let mut clients = [client(&first.addr).await, client(&second.addr).await];
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let mut serving = 0;
                for c in &mut clients {
                    if status(c).await.is_ok() {
                        serving += 1;
                    }
                }
                if serving == 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "a replica still decides without quorum"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        eprintln!("quorum lost -> no replica serving in {:?}", lost.elapsed());
        // A while without quorum (within the agents' 60 s grace): the workers
        // keep running, watched for three seconds (an outage of a length,
        // not an event); then quorum returns and a replica leads again.
        let running = accel_tests::records(&dir);
        accel_tests::ensure_quiet_for(
            "the workers run through the outage",
            Duration::from_secs(3),
            || {
                let now = accel_tests::records(&dir);
                match now.len() == 2 && running.iter().all(|r| accel_tests::alive(r.pid)) {
                    true => Ok(()),
                    false => Err(format!(
                        "{} records; pids {:?}",
                        now.len(),
                        now.iter().map(|r| r.pid).collect::<Vec<_>>()
                    )),
                }
            },
        );
        etcd.restart(1);
        etcd.restart(2);
        etcd.wait_healthy(Duration::from_secs(30));
        let outs: Vec<_> = agents
            .into_iter()
            .map(|a| a.wait(Duration::from_secs(90)))
            .collect();
        for out in &outs {
            assert_eq!(out.code(), 0, "{}", out.stderr);
            assert!(out.stderr.contains("reconnected"), "{}", out.stderr);
        }
        let recs = accel_tests::records(&dir);
        assert_eq!(
            recs.len(),
            2,
            "the workers ran through the outage, not restarted: {:?}",
            recs.iter()
                .map(|r| (r.restart, r.rank, r.pid))
                .collect::<Vec<_>>()
        );
    }

    /// Every etcd member stopped for five drop limits (no replica can lead,
    /// none can be elected): no worker stops, and once etcd is back the new
    /// leader has the job running its round with both nodes.
    #[test]
    fn every_etcd_member_down_for_several_drop_limits_stops_no_worker() {
        let dir = scratch("ha-etcd-down");
        let (mut etcd, first, second) = replicas(&dir, "/etcd-down");
        let endpoints = format!("{},{}", first.addr, second.addr);
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(2)
            .max_restarts(1)
            .conf("keep_alive_interval=1,keep_alive_max_attempt=4");
        let env = [("RECORD_EACH_ROUND", "1"), ("RUN_FOR", "90")];
        let agents = two_nodes(&cmd, &dir, &env);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || accel_tests::records(&dir).len()
                == 4),
            "the job runs"
        );
        let running = accel_tests::records(&dir);
        for i in 0..3 {
            etcd.kill(i);
        }
        accel_tests::all_alive_for(&running, Duration::from_secs(20));
        for i in 0..3 {
            etcd.restart(i);
        }
        etcd.wait_healthy(Duration::from_secs(30));
        let back = Instant::now();
        let serving = |addr: &str| accel_tests::job_running(addr, &[], "team/job", 0, 2);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || serving(&first.addr)
                || serving(&second.addr)),
            "a leader has the job running again"
        );
        eprintln!(
            "etcd down 20 s: 0 workers stopped; job running again {:?} after etcd was healthy",
            back.elapsed()
        );
        assert_eq!(
            accel_tests::records(&dir).len(),
            4,
            "no worker was started again"
        );
        assert!(running.iter().all(|r| accel_tests::alive(r.pid)));
        drop(agents);
    }

    /// etcd full (its space quota reached: the NOSPACE alarm, no writes
    /// and no new leases) for five drop limits, then recovered as an
    /// operator would (delete, compact, defragment, disarm): no worker
    /// stops, and the job is running on a leader again.
    #[test]
    fn a_full_etcd_for_several_drop_limits_stops_no_worker() {
        let dir = scratch("ha-etcd-full");
        let etcd = EtcdCluster::start_with_quota(&dir, 3, 24 << 20);
        let (etcd, first, second) = replicas_on(etcd, "/etcd-full");
        let endpoints = format!("{},{}", first.addr, second.addr);
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(2)
            .max_restarts(1)
            .conf("keep_alive_interval=1,keep_alive_max_attempt=4");
        let env = [("RECORD_EACH_ROUND", "1"), ("RUN_FOR", "90")];
        let agents = two_nodes(&cmd, &dir, &env);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || accel_tests::records(&dir).len()
                == 4),
            "the job runs"
        );
        let running = accel_tests::records(&dir);
        let values = accel_tests::etcd::fill(&etcd.endpoints(), &dir).expect("fill etcd");
        assert!(values > 0, "etcd took some values before its quota");
        assert!(
            etcd.try_ctl(&["put", "/etcd-full/probe", "x"])
                .is_err_and(|e| e.contains("database space exceeded")),
            "etcd is full"
        );
        accel_tests::all_alive_for(&running, Duration::from_secs(20));
        accel_tests::etcd::make_room(&etcd.endpoints()).expect("recover etcd");
        let back = Instant::now();
        let serving = |addr: &str| accel_tests::job_running(addr, &[], "team/job", 0, 2);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || serving(&first.addr)
                || serving(&second.addr)),
            "a leader has the job running"
        );
        eprintln!(
            "etcd full 20 s: 0 workers stopped; job running {:?} after etcd had room",
            back.elapsed()
        );
        accel_tests::all_alive_for(&running, Duration::from_secs(2));
        assert_eq!(
            accel_tests::records(&dir).len(),
            4,
            "no worker was started again"
        );
        drop(agents);
    }

    /// A worker fails while every etcd member is down (no leader can be
    /// elected, so nobody can restart the job): the other node's workers
    /// keep running, and once etcd is back the job restarts exactly once.
    #[test]
    fn a_worker_failure_while_etcd_is_down_restarts_the_job_once_when_it_is_back() {
        let dir = scratch("ha-etcd-down-failure");
        let (mut etcd, first, second) = replicas(&dir, "/etcd-down-failure");
        let endpoints = format!("{},{}", first.addr, second.addr);
        let cmd = accel_tests::AgentCmd::c10d(&endpoints, "team/job")
            .nnodes(2)
            .nproc(2)
            .max_restarts(3)
            .conf("keep_alive_interval=1,keep_alive_max_attempt=4");
        // Rank 3 fails 8 s into its first attempt (etcd is down by then);
        // the second attempt runs to its end.
        let env = [
            ("RECORD_EACH_ROUND", "1"),
            ("RUN_FOR", "30"),
            ("FAIL_RANKS", "3"),
            ("FAIL_UNTIL", "1"),
            ("FAIL_AFTER", "8"),
        ];
        let agents = two_nodes(&cmd, &dir, &env);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || accel_tests::records(&dir).len()
                == 4),
            "the job runs"
        );
        let running = accel_tests::records(&dir);
        for i in 0..3 {
            etcd.kill(i);
        }
        assert!(
            accel_tests::eventually(Duration::from_secs(15), || running
                .iter()
                .any(|r| r.rank == 3 && !accel_tests::alive(r.pid))),
            "rank 3 failed"
        );
        std::thread::sleep(Duration::from_secs(8));
        assert!(
            running
                .iter()
                .filter(|r| r.rank < 2)
                .all(|r| accel_tests::alive(r.pid)),
            "node 0's workers still run: nobody can restart the job without a leader"
        );
        assert_eq!(accel_tests::records(&dir).len(), 4, "not restarted yet");
        for i in 0..3 {
            etcd.restart(i);
        }
        etcd.wait_healthy(Duration::from_secs(30));
        let back = Instant::now();
        let serving = |addr: &str| accel_tests::job_running(addr, &[], "team/job", 1, 2);
        assert!(
            accel_tests::eventually(Duration::from_secs(30), || serving(&first.addr)
                || serving(&second.addr)),
            "a leader has the job running its next round"
        );
        eprintln!(
            "a failure while etcd was down: restarted once, running again {:?} after etcd was healthy",
            back.elapsed()
        );
        for a in agents {
            let out = a.wait(Duration::from_secs(90));
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        let recs = accel_tests::records(&dir);
        assert_eq!(recs.len(), 8, "one restart of the four workers: {recs:#?}");
        assert!(
            recs.iter()
                .filter(|r| running.iter().all(|f| f.pid != r.pid))
                .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "1"),
            "the failure spent the budget once"
        );
    }

    #[test]
    fn a_ddp_job_trains_through_a_leader_failover_to_the_same_parameters() {
        let _heavy = crate::heavy();
        let dir = scratch("ha-ddp");
        let (_etcd, first, second) = replicas(&dir, "/ddp");
        let script = accel_tests::worker("ddp_train.py");
        let run = |name: &str, endpoints: Option<&str>, sleep: &str| {
            let (ck, out) = (dir.join(name).join("ckpt"), dir.join(name).join("out"));
            std::fs::create_dir_all(&ck).expect("ckpt dir");
            std::fs::create_dir_all(&out).expect("out dir");
            let (ck, out) = (
                ck.to_string_lossy().into_owned(),
                out.to_string_lossy().into_owned(),
            );
            let job = |c: accel_tests::AgentCmd| {
                c.nnodes(2)
                    .nproc(2)
                    .program(&script, &[&ck, &out, "--step-sleep", sleep])
                    .env("PATH", accel_tests::venv_path())
            };
            let port = accel_tests::Port::lease();
            let agents: Vec<_> = (0..2)
                .map(|node| {
                    let cmd = match endpoints {
                        Some(e) => job(accel_tests::AgentCmd::c10d(e, "ddp")),
                        None => job(accel_tests::AgentCmd::static_node(&port, node)),
                    };
                    cmd.start(&dir, &format!("{name}-{node}"))
                })
                .collect();
            (
                agents,
                std::path::PathBuf::from(ck),
                std::path::PathBuf::from(out),
            )
        };
        let finals = |out: &std::path::Path| -> Vec<serde_json::Value> {
            (0..4)
                .map(|r| accel_tests::read_json(&out.join(format!("final_{r}.json"))))
                .collect()
        };
        // Uninterrupted.
        let (agents, _, clean_out) = run("clean", None, "0");
        for a in agents {
            let out = a.wait(Duration::from_secs(240));
            assert_eq!(out.code(), 0, "{}", out.stderr);
        }
        // Through a failover: 30 steps of 0.3 s; the leader is killed once
        // the step-5 checkpoint is written.
        let endpoints = format!("{},{}", first.addr, second.addr);
        let (agents, ck, out) = run("failover", Some(&endpoints), "0.3");
        assert!(
            accel_tests::eventually(Duration::from_secs(120), || ck.join("ckpt_5.pt").exists()),
            "training reached step 5"
        );
        assert!(
            !ck.join("ckpt_25.pt").exists(),
            "the failover happens while the job trains"
        );
        drop(first);
        for a in agents {
            let o = a.wait(Duration::from_secs(240));
            assert_eq!(o.code(), 0, "{}", o.stderr);
            assert!(o.stderr.contains("reconnected"), "{}", o.stderr);
        }
        let (through, clean) = (finals(&out), finals(&clean_out));
        for (t, c) in through.iter().zip(&clean) {
            assert_eq!(
                t["restart"], 0,
                "no restart: the workers trained through the failover"
            );
            assert_eq!(t["start"], 0);
            assert_eq!(
                t["params"], c["params"],
                "bit-identical to the uninterrupted run (rank {})",
                t["rank"]
            );
        }
    }
}

mod agent_only {
    //! `--rdzv-backend etcd`: no `rdzv-server`; the job's agents elect one
    //! of themselves through etcd to host the rendezvous, and another takes
    //! over when its node dies.

    use super::*;

    /// The address the agent behind `stderr` serves its replica at.
    fn advertised(stderr: &std::path::Path) -> Option<String> {
        let text = std::fs::read_to_string(stderr).ok()?;
        let line = text
            .lines()
            .find(|l| l.contains("runs a replica of the job's rendezvous"))?;
        let at = line.find("advertise=")? + "advertise=".len();
        Some(line[at..].split_whitespace().next()?.to_owned())
    }

    /// Three agent-only agents of job `team/agents` on `etcd` running the
    /// recording worker (one each, records in `dir`): a round of two (the
    /// survivors') runs for a second, any other until it is broken (so a
    /// round formed before the third node arrived cannot finish the job);
    /// `conf`: more `--rdzv-conf` entries.
    fn three_agents(
        dir: &std::path::Path,
        etcd: &EtcdCluster,
        nnodes: &str,
        max_restarts: u32,
        conf: &[&str],
    ) -> Vec<(String, accel_tests::Agent)> {
        let endpoints = etcd.endpoints().replace("http://", "");
        let env = [
            ("RECORD_EACH_ROUND", "1"),
            ("RUN_FOR", "120"),
            ("RUN_FOR_WORLD", "2:1"),
            // A stop by SIGTERM is recorded; the fence's SIGKILL is not.
            ("ON_SIGTERM", "exit"),
        ];
        // torchrun's etcd-v2 name is the same backend.
        let agents: Vec<_> = ["etcd", "etcd", "etcd-v2"]
            .iter()
            .enumerate()
            .map(|(i, backend)| {
                let tag = format!("node-{i}");
                let mut cmd = accel_tests::AgentCmd::etcd(&endpoints, "team/agents")
                    .backend(backend)
                    .nnodes(nnodes)
                    .nproc(1)
                    .max_restarts(max_restarts)
                    // A first round waits for the third node (a re-formed
                    // one starts once its members are ready).
                    .conf("last_call_timeout=5")
                    .conf("etcd_prefix=/agent-only");
                for c in conf {
                    cmd = cmd.conf(c);
                }
                let agent = cmd.recording(dir, &tag).envs(&env).start(dir, &tag);
                (tag, agent)
            })
            .collect();
        let three = || {
            accel_tests::records(dir)
                .iter()
                .filter(|r| r.env.get("WORLD_SIZE").map(String::as_str) == Some("3"))
                .count()
                == 3
        };
        assert!(
            accel_tests::eventually(Duration::from_secs(60), three),
            "three workers run in a round of three"
        );
        agents
    }

    /// Kills (`kill -9`) the agent elected to host the rendezvous; its tag,
    /// its worker's record and when it was killed.
    fn kill_the_host(
        etcd: &EtcdCluster,
        agents: &mut Vec<(String, accel_tests::Agent)>,
        dir: &std::path::Path,
    ) -> (String, accel_tests::Record, Instant) {
        // The elected agent: the oldest candidacy in the job's election.
        let election = "/agent-only/team%2Fagents/leader";
        let leader = etcd.ctl(&[
            "get",
            "--prefix",
            election,
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--print-value-only",
        ]);
        let leader = leader
            .lines()
            .next()
            .expect("an elected agent")
            .trim()
            .to_owned();
        let host = agents
            .iter()
            .position(|(_, a)| advertised(&a.stderr).as_deref() == Some(leader.as_str()))
            .unwrap_or_else(|| panic!("no agent advertises {leader}"));
        let (killed_tag, killed) = agents.remove(host);
        let killed_worker = accel_tests::records(dir)
            .into_iter()
            .find(|r| {
                r.env.get("AGENT_TAG") == Some(&killed_tag)
                    && r.env.get("WORLD_SIZE").map(String::as_str) == Some("3")
            })
            .expect("the hosting node's worker");
        let at = Instant::now();
        killed.signal("KILL");
        let _ = killed.wait(Duration::from_secs(10));
        (killed_tag, killed_worker, at)
    }

    /// The survivors' round after the kill: one finished worker each, ranks
    /// 0 and 1 of a world of 2, no restart counted.
    fn reformed_by_the_survivors(
        dir: &std::path::Path,
        outs: &[(String, accel_tests::Finished)],
    ) -> Vec<accel_tests::Record> {
        let recs = accel_tests::records(dir);
        let reformed: Vec<_> = recs
            .into_iter()
            .filter(|r| r.env.get("WORLD_SIZE").map(String::as_str) == Some("2"))
            .collect();
        let mut tags: Vec<_> = reformed
            .iter()
            .map(|r| r.env["AGENT_TAG"].clone())
            .collect();
        tags.sort();
        let mut survivors: Vec<_> = outs.iter().map(|(t, _)| t.clone()).collect();
        survivors.sort();
        assert_eq!(tags, survivors, "the survivors re-formed, one worker each");
        assert!(
            reformed.iter().all(|r| r.end.is_some()),
            "the re-formed round finished"
        );
        let mut ranks: Vec<_> = reformed.iter().map(|r| r.rank).collect();
        ranks.sort();
        assert_eq!(ranks, [0, 1], "unique, contiguous ranks");
        for r in &reformed {
            assert_eq!(
                r.env["TORCHELASTIC_RESTART_COUNT"], "0",
                "a re-form is no restart"
            );
        }
        reformed
    }

    /// The job is over: nothing of it is left in etcd (presence keys
    /// included: each agent revoked its own) but its tombstone, which tells
    /// a late node the outcome (it expires after `tombstone_ttl`).
    fn only_the_tombstone_is_left(etcd: &EtcdCluster, prefix: &str, job: &str) {
        let left = etcd.ctl(&["get", "--prefix", prefix, "--keys-only"]);
        let keys: Vec<&str> = left.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            keys,
            [format!("{prefix}/{job}/tombstones/{job}")],
            "etcd still holds {left}"
        );
    }

    /// F7 of the chaos run: a finished agent-only job's records are deleted
    /// as its last agent leaves. A late agent of the job (started before its
    /// end; here held back by a slow health check) then led an empty job and
    /// waited alone until `join_timeout`. Now the job's tombstone tells it
    /// the outcome at once, and it exits with the job's result; a late agent
    /// of another host is refused, naming the fix. The same command started
    /// after the end runs the job anew, after a success or a failure.
    #[test]
    fn a_late_agent_of_a_finished_agent_only_job_is_told_its_outcome_at_once() {
        let dir = scratch("ha-agent-only-late");
        let etcd = EtcdCluster::start(&dir, 1);
        let endpoints = etcd.endpoints().replace("http://", "");
        let job = |id: &str, program: &str| {
            accel_tests::AgentCmd::etcd(&endpoints, id)
                .nnodes("1")
                .nproc(1)
                .conf("etcd_prefix=/late")
                .conf("etcd_lease=2")
                .no_python(program, &[])
        };
        let out = job("team/late", "true").run(&dir, "first", Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        only_the_tombstone_is_left(&etcd, "/late", "team%2Flate");
        // On a lease: etcd deletes it after tombstone_ttl even if no agent
        // of that id ever runs again.
        let fields = etcd.ctl(&[
            "get",
            "/late/team%2Flate/tombstones/team%2Flate",
            "-w",
            "fields",
        ]);
        let lease = fields
            .lines()
            .find(|l| l.starts_with("\"Lease\""))
            .unwrap_or_else(|| panic!("no lease field: {fields}"));
        assert!(!lease.trim_end().ends_with(": 0"), "{fields}");
        // The same command again: a new run, told of the earlier one.
        let out = job("team/late", "true").run(&dir, "again", Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert!(
            out.stderr.contains("job 'team/late' succeeded at")
                && out.stderr.contains("starting a new run")
                && out.stderr.contains("round formed"),
            "{}",
            out.stderr
        );
        only_the_tombstone_is_left(&etcd, "/late", "team%2Flate");

        // Late agents: started before the job ends, joining after it.
        let go = dir.join("go");
        let slow = format!("while [ ! -e {} ]; do sleep 0.1; done", go.display());
        let late = |id: &str, program: &str| job(id, program).flag("--health-check", &slow);
        let ok_late = late("team/slow", "true").start(&dir, "slow-late");
        let stranger = late("team/slow", "true").start_with(
            &accel_tests::STRANGER_HOST,
            &dir,
            "slow-stranger",
        );
        let failed_late = late("team/failed", "true").start(&dir, "failed-late");
        let out = job("team/slow", "true").run(&dir, "slow", Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        let out = job("team/failed", "false").run(&dir, "failed", Duration::from_secs(60));
        assert_eq!(out.code(), 1, "{}", out.stderr);
        std::fs::write(&go, b"").expect("go");
        let t = Instant::now();
        let out = ok_late.wait(Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert!(
            out.stderr.contains("job 'team/slow' already succeeded at")
                && out.stderr.contains("nothing to do"),
            "{}",
            out.stderr
        );
        assert!(t.elapsed() < Duration::from_secs(20), "told at once");
        // A failed job's late agent exits 1, with the job's reason.
        let out = failed_late.wait(Duration::from_secs(60));
        assert_eq!(out.code(), 1, "{}", out.stderr);
        assert!(
            out.stderr.contains("job 'team/failed' already failed at"),
            "{}",
            out.stderr
        );
        // Another host never belonged: refused, with the outcome and the fix.
        let out = stranger.wait(Duration::from_secs(60));
        assert_ne!(out.code(), 0, "{}", out.stderr);
        assert!(
            out.stderr.contains("job 'team/slow' already succeeded at")
                && out.stderr.contains("another --rdzv-id"),
            "{}",
            out.stderr
        );
        // After the bug is fixed, the same command trains again.
        let out = job("team/failed", "true").run(&dir, "fixed", Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert!(
            out.stderr.contains("job 'team/failed' failed at")
                && out.stderr.contains("starting a new run"),
            "{}",
            out.stderr
        );
    }

    /// Drops every packet to one TCP port of this host (nftables, root
    /// namespace, one way) until dropped.
    struct PortCut {
        table: String,
    }

    impl PortCut {
        fn nft(script: &str) -> bool {
            use std::io::Write;
            let mut child = std::process::Command::new("nft")
                .args(["-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .expect("run nft (the test command installs nftables)");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(script.as_bytes())
                .expect("nft script");
            child.wait().expect("nft").success()
        }

        fn start(port: u16) -> Self {
            let table = format!("accel_cut_{}", std::process::id());
            assert!(
                Self::nft(&format!(
                    "table inet {table} {{\n  chain in {{\n    type filter hook input priority 0;\n    tcp dport {port} drop\n  }}\n}}\n"
                )),
                "nft"
            );
            Self { table }
        }
    }

    impl Drop for PortCut {
        fn drop(&mut self) {
            Self::nft(&format!("delete table inet {}\n", self.table));
        }
    }

    /// Agent-only: the hosting agent's replica cannot be reached (every
    /// packet to its port dropped, one way) while it keeps its etcd lease.
    /// Each agent asks only its own replica, so each replica hears one
    /// complaint; they share them through etcd, and a replica that counts
    /// 2 of 3 deposes the host. The two other agents resume on the new
    /// host with their workers running. (On loopback the host's own agent
    /// is cut from its replica too, which a real partition would not do:
    /// it is left out of the checks, and the job re-forms without it at
    /// the drop limit, after this test.)
    #[test]
    fn agents_cut_off_from_the_hosting_agent_depose_it_and_resume_with_their_workers() {
        let dir = scratch("ha-agent-only-cut");
        let etcd = EtcdCluster::start(&dir, 3);
        let agents = three_agents(&dir, &etcd, "3", 1, &[]);
        let election = "/agent-only/team%2Fagents/leader";
        let host = etcd.ctl(&[
            "get",
            "--prefix",
            election,
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--print-value-only",
        ]);
        let host = host
            .lines()
            .next()
            .expect("an elected agent")
            .trim()
            .to_owned();
        let port: u16 = host
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("host:port");
        let others: Vec<_> = agents
            .iter()
            .filter(|(_, a)| advertised(&a.stderr).as_deref() != Some(host.as_str()))
            .collect();
        assert_eq!(others.len(), 2, "two agents do not host");
        let workers: Vec<_> = accel_tests::records(&dir)
            .into_iter()
            .filter(|r| {
                r.env.get("WORLD_SIZE").map(String::as_str) == Some("3")
                    && others
                        .iter()
                        .any(|(tag, _)| r.env.get("AGENT_TAG") == Some(tag))
            })
            .collect();
        assert_eq!(workers.len(), 2, "their workers of the first round");
        let cut_at = Instant::now();
        let cut = PortCut::start(port);
        let stderr =
            |a: &accel_tests::Agent| std::fs::read_to_string(&a.stderr).unwrap_or_default();
        assert!(
            accel_tests::eventually(Duration::from_secs(10), || agents
                .iter()
                .any(|(_, a)| stderr(a).contains("deposing the leader"))),
            "a replica deposed the unreachable host"
        );
        eprintln!(
            "agent-only cut: deposed {:.2} s after the cut",
            cut_at.elapsed().as_secs_f64()
        );
        let deposals: usize = agents
            .iter()
            .map(|(_, a)| stderr(a).matches("deposing the leader").count())
            .sum();
        assert_eq!(deposals, 1, "one deposal");
        assert!(
            agents
                .iter()
                .any(|(_, a)| stderr(a).contains("deposing the leader: 2 of 3 nodes")),
            "2 of 3 nodes complained, through etcd"
        );
        assert!(
            accel_tests::eventually(Duration::from_secs(5), || others
                .iter()
                .all(|(_, a)| stderr(a).contains("reconnected; the round is still current"))),
            "both resumed their round on the new host"
        );
        eprintln!(
            "agent-only cut: both resumed {:.2} s after the cut",
            cut_at.elapsed().as_secs_f64()
        );
        for r in &workers {
            assert!(
                std::path::Path::new(&format!("/proc/{}", r.pid)).exists(),
                "worker pid {} still runs",
                r.pid
            );
        }
        assert_eq!(
            accel_tests::records(&dir).len(),
            3,
            "no worker was started again"
        );
        drop(cut);
    }

    #[test]
    fn three_agents_on_etcd_re_form_without_the_hosting_agent_when_it_is_killed() {
        let dir = scratch("ha-agent-only");
        let etcd = EtcdCluster::start(&dir, 3);
        // A silent node would be dropped only after 30 s: the dead host is
        // dropped when its etcd lease (2 s) expires.
        let mut agents = three_agents(
            &dir,
            &etcd,
            "2:3",
            1,
            &[
                "etcd_lease=2",
                "keep_alive_interval=1",
                "keep_alive_max_attempt=30",
            ],
        );
        let (_, killed_worker, killed_at) = kill_the_host(&etcd, &mut agents, &dir);
        let outs: Vec<_> = agents
            .into_iter()
            .map(|(tag, a)| (tag, a.wait(Duration::from_secs(90))))
            .collect();
        for (tag, out) in &outs {
            assert_eq!(out.code(), 0, "{tag}: {}", out.stderr);
        }
        // One survivor was elected and hosted the rest of the job.
        let elected: Vec<_> = outs
            .iter()
            .filter(|(_, o)| o.stderr.contains("leading: serving the rendezvous"))
            .map(|(tag, _)| tag.as_str())
            .collect();
        assert_eq!(elected.len(), 1, "one survivor took over: {elected:?}");
        let reformed = reformed_by_the_survivors(&dir, &outs);
        // The survivors ran again long before the 30 s keep-alive limit
        // could have dropped the dead host: its lease did (bounded loosely
        // for a loaded machine; bench/failover.py measures it).
        let killed_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
            - killed_at.elapsed().as_secs_f64();
        for r in &reformed {
            let after = r.start - killed_unix;
            assert!(
                after < 20.0,
                "the re-formed round started {after:.1} s after the kill: the dead host was not dropped at its lease"
            );
        }
        let proc = format!("/proc/{}", killed_worker.pid);
        assert!(
            accel_tests::eventually(Duration::from_secs(10), || {
                !std::path::Path::new(&proc).exists()
            }),
            "the killed node's worker is gone (its guard stopped it)"
        );
        // The job is over: nothing of it is left in etcd (presence keys
        // included: each agent revoked its own).
        only_the_tombstone_is_left(&etcd, "/agent-only", "team%2Fagents");
    }

    #[test]
    fn a_one_second_drop_limit_fences_the_survivors_and_the_job_re_forms_without_spending_restarts()
    {
        let dir = scratch("ha-agent-only-fence");
        let etcd = EtcdCluster::start(&dir, 3);
        // The issue's settings: a 1 s drop limit, the default 5 s lease,
        // and no restart budget at all.
        let mut agents = three_agents(
            &dir,
            &etcd,
            "1:3",
            0,
            &["keep_alive_interval=0.5", "keep_alive_max_attempt=2"],
        );
        // Said once at start, naming both values.
        for (tag, a) in &agents {
            let text = std::fs::read_to_string(&a.stderr).unwrap_or_default();
            let warned = text
                .lines()
                .filter(|l| l.contains("(the drop limit) is shorter than etcd_lease = 5 s"))
                .count();
            assert_eq!(warned, 1, "{tag}: one warning\n{text}");
        }
        let (_, _, _) = kill_the_host(&etcd, &mut agents, &dir);
        let outs: Vec<_> = agents
            .into_iter()
            .map(|(tag, a)| (tag, a.wait(Duration::from_secs(90))))
            .collect();
        for (tag, out) in &outs {
            assert_eq!(out.code(), 0, "{tag}: the job finished\n{}", out.stderr);
        }
        let reformed = reformed_by_the_survivors(&dir, &outs);
        // The survivors' workers of the first round did not finish: they
        // were fenced (killed by SIGKILL, unrecorded) or, as the survivors'
        // complaints usually depose the dead host within half a second,
        // before the 1 s fence, stopped by the membership restart once its
        // presence lease lapsed (SIGTERM, which they record). Either way
        // no restart was spent (below).
        let recs = accel_tests::records(&dir);
        for (tag, _) in &outs {
            let first = recs
                .iter()
                .find(|r| {
                    r.env.get("AGENT_TAG") == Some(tag)
                        && r.env.get("WORLD_SIZE").map(String::as_str) == Some("3")
                })
                .expect("a survivor's first worker");
            assert!(
                first.end.is_none() && matches!(first.signal, None | Some(15)),
                "{tag}: its first worker was fenced or stopped by a membership restart: {:?}",
                (first.end, first.signal)
            );
            let reformed_start = reformed
                .iter()
                .find(|r| r.env.get("AGENT_TAG") == Some(tag))
                .expect("its re-formed worker")
                .start;
            assert!(reformed_start > first.start);
        }
        for r in &recs {
            assert_eq!(
                r.env["TORCHELASTIC_RESTART_COUNT"], "0",
                "the fence spent no restart"
            );
        }
        // The killed host could not revoke its presence key: it lapses
        // with its lease (5 s), which may be after the job ended now that
        // the survivors depose the dead host at once.
        let settled = || {
            etcd.ctl(&["get", "--prefix", "/agent-only", "--keys-only"])
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count()
                == 1
        };
        accel_tests::eventually(Duration::from_secs(10), settled);
        only_the_tombstone_is_left(&etcd, "/agent-only", "team%2Fagents");
    }

    /// The lease-death rule on its own: a node whose presence lease expires
    /// is dropped by the leader's watch, at once, whatever its keep-alive
    /// limit; a node that withdraws its key is dropped too; a live one stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_whose_etcd_lease_expires_is_dropped_by_the_leader() {
        use rendezvous_server::presence::{self, Presence};
        let dir = scratch("ha-presence");
        let etcd = EtcdCluster::start(&dir, 1);
        let client = connect(&etcd).await;
        let options = rendezvous_server::ha::EtcdOptions {
            endpoints: vec![etcd.endpoint(0)],
            prefix: "/presence-test/job".into(),
            lease: Duration::from_secs(1),
            user: None,
            tls: None,
            advertise: "127.0.0.1:1".into(),
            presence: true,
        };
        let registry = Registry::new(TTL, Limits::default());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut keys = Vec::new();
        let mut streams = Vec::new();
        for (n, node) in ["a", "b", "c"].into_iter().enumerate() {
            // The key first, then the join.
            let p = Presence::announce(&options, node, &format!("host-{node}"));
            assert!(p.held().wait(deadline).await, "{node}'s key is written");
            keys.push(p);
            let mut req = join_request(node, None, None);
            (req.min_nodes, req.max_nodes) = (1, 3);
            streams.push(
                registry
                    .join(Instant::now(), &req, None, secret(n as u8))
                    .expect("joins"),
            );
        }
        let watch = tokio::spawn(presence::watch(
            client.clone(),
            options.prefix.clone(),
            registry.clone(),
            Duration::from_secs(30),
        ));
        let members = |r: &Registry| {
            let mut m: Vec<_> = r.memberships().into_iter().map(|m| m.node_id).collect();
            m.sort();
            m
        };
        // Nobody went: checks drop nothing (no sign marks a check, so
        // the members are watched for 300 ms).
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            assert_eq!(members(&registry), ["a", "b", "c"]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // c's process dies: nothing renews its lease, which expires (1 s);
        // the watch drops it, long before its 60 s keep-alive limit.
        let c = keys.pop().expect("c");
        let dead_at = Instant::now();
        drop(c);
        let gone = async {
            while members(&registry).contains(&"c".to_owned()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), gone)
            .await
            .expect("c is dropped once its lease expired");
        assert!(
            dead_at.elapsed() >= Duration::from_millis(500),
            "dropped when the lease expired, not before"
        );
        assert_eq!(members(&registry), ["a", "b"]);
        // b leaves cleanly: its key is revoked, and it goes at once.
        let b = keys.pop().expect("b");
        b.withdraw().await;
        let gone = async {
            while members(&registry).contains(&"b".to_owned()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .expect("b is dropped once its key is gone");
        // a stays, its lease renewed well past its length: watched for
        // twice the lease (only time can show a renewal works).
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            assert_eq!(members(&registry), ["a"]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        watch.abort();
        let a = keys.pop().expect("a");
        a.withdraw().await;
        let left = client
            .get("/presence-test", Some(GetOptions::new().with_prefix()))
            .await
            .expect("get");
        assert!(
            left.kvs.is_empty(),
            "withdrawn keys are gone: {:?}",
            left.kvs
        );
        drop(streams);
    }
}

/// The lighthouse's quorum ids (torchft) are reserved in etcd per lead:
/// each reservation starts above every one before it, whatever the clock
/// says, and a deposed leader reserves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_id_reservations_in_etcd_only_grow_and_a_deposed_leader_makes_none() {
    let dir = scratch("ha-quorum-ids");
    let etcd = EtcdCluster::start(&dir, 1);
    let client = connect(&etcd).await;
    let (fence, lease) = lead(&client, "first").await;
    let first = on_etcd(&client, Some(fence));
    let block = 1000;
    let a = first
        .reserve_quorum_ids(5, block)
        .await
        .expect("reserve")
        .expect("etcd keeps ids");
    assert_eq!(a, 5, "nothing reserved before: from the floor asked for");
    // A clock behind (a smaller floor asked for) still gets ids above.
    let b = first
        .reserve_quorum_ids(1, block)
        .await
        .expect("reserve")
        .expect("ids");
    assert_eq!(b, a + block);
    // The leader's lease ends; another replica leads.
    client.lease_revoke(lease).await.expect("revoke");
    let (fence, _) = lead(&client, "second").await;
    let second = on_etcd(&client, Some(fence));
    let c = second
        .reserve_quorum_ids(2, block)
        .await
        .expect("reserve")
        .expect("ids");
    assert_eq!(c, b + block, "the new leader's ids are above the old one's");
    assert!(
        first.reserve_quorum_ids(1, block).await.is_err(),
        "the deposed leader cannot reserve"
    );
    let d = second
        .reserve_quorum_ids(10 * block + c, block)
        .await
        .expect("reserve")
        .expect("ids");
    assert_eq!(d, 10 * block + c, "a clock ahead moves the floor up");
}
