//! Two lighthouse replicas in one process, on 127.0.0.1 and 127.0.0.2 at
//! the same port (as replicas on two hosts): the follower passes calls on
//! to the leader, and holds them through a change of leader.

use std::time::Duration;

use accel_proto::torchft as pb;
use accel_proto::torchft::lighthouse_service_client::LighthouseServiceClient;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{leader_url, serve, Allow, Shared, FORWARDED};
use crate::ha::Role;
use crate::lighthouse::LighthouseConfig;
use crate::limits::Limits;
use crate::registry::Registry;

fn leads() -> Role {
    Role::Leader(Box::new(Registry::new(
        Duration::from_secs(60),
        Limits::default(),
    )))
}

fn follows(leader: &str) -> Role {
    Role::Follower {
        leader: Some(leader.to_owned()),
    }
}

fn config() -> LighthouseConfig {
    LighthouseConfig {
        min_replicas: 1,
        join_timeout: Duration::from_millis(100),
        quorum_tick: Duration::from_millis(20),
        heartbeat_timeout: Duration::from_secs(5),
    }
}

fn member(id: &str) -> pb::QuorumMember {
    pb::QuorumMember {
        replica_id: id.to_owned(),
        address: format!("http://{id}:1"),
        store_address: format!("{id}:2"),
        step: 1,
        world_size: 1,
        ..Default::default()
    }
}

/// A replica serving the lighthouse on `listener` as `role` says.
fn replica(listener: TcpListener, role: watch::Receiver<Role>, stop: &CancellationToken) {
    replica_with(config(), listener, role, stop);
}

fn replica_with(
    config: LighthouseConfig,
    listener: TcpListener,
    role: watch::Receiver<Role>,
    stop: &CancellationToken,
) {
    let shared = Shared::new(config, Allow::loopback());
    tokio::spawn(serve(listener, shared, role, stop.clone()));
}

async fn client(url: String) -> LighthouseServiceClient<tonic::transport::Channel> {
    LighthouseServiceClient::connect(url)
        .await
        .expect("connect")
}

#[test]
fn a_leader_s_lighthouse_is_its_advertised_host_at_this_replica_s_port() {
    assert_eq!(
        leader_url("10.0.0.5:29400", 29510).as_deref(),
        Some("http://10.0.0.5:29510")
    );
    assert_eq!(
        leader_url("rdzv-server-0.peers:29400", 7).as_deref(),
        Some("http://rdzv-server-0.peers:7")
    );
    assert_eq!(
        leader_url("[::1]:29400", 7).as_deref(),
        Some("http://[::1]:7")
    );
    assert_eq!(leader_url("no-port", 7), None);
    assert_eq!(leader_url(":29400", 7), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_passes_calls_on_and_holds_them_through_a_change_of_leader() {
    let a = TcpListener::bind("127.0.0.1:0").await.expect("bind a");
    let port = a.local_addr().expect("addr").port();
    let Ok(b) = TcpListener::bind(("127.0.0.2", port)).await else {
        panic!("cannot bind 127.0.0.2:{port}: the test needs the loopback network 127.0.0.0/8");
    };
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (a_role, a_seat) = watch::channel(leads());
    let (b_role, b_seat) = watch::channel(follows("127.0.0.1:29400"));
    replica(a, a_seat, &stop);
    replica(b, b_seat, &stop);
    let mut via_b = client(format!("http://127.0.0.2:{port}")).await;
    let mut via_a = client(format!("http://127.0.0.1:{port}")).await;

    // The follower passes a heartbeat and a quorum call on to the leader.
    via_b
        .heartbeat(pb::LighthouseHeartbeatRequest {
            replica_id: "g0".into(),
        })
        .await
        .expect("a heartbeat through the follower");
    let q = via_b
        .quorum(pb::LighthouseQuorumRequest {
            requester: Some(member("g0")),
        })
        .await
        .expect("a quorum through the follower")
        .into_inner()
        .quorum
        .expect("a quorum");
    let first = q.quorum_id;
    assert_eq!(q.participants.len(), 1);
    assert_eq!(q.participants[0].replica_id, "g0");

    // A call marked as passed on is not passed on again.
    let mut marked = tonic::Request::new(pb::LighthouseHeartbeatRequest {
        replica_id: "g0".into(),
    });
    marked
        .metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    let refused = via_b.heartbeat(marked).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // The leader goes (no leader known for a while): a call through the
    // follower waits, and is answered once the follower leads.
    a_role.send_replace(Role::Follower { leader: None });
    b_role.send_replace(Role::Follower { leader: None });
    let waiting = tokio::spawn(async move {
        via_b
            .quorum(pb::LighthouseQuorumRequest {
                requester: Some(member("g1")),
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiting.is_finished(), "the call waits for a leader");
    b_role.send_replace(leads());
    a_role.send_replace(follows(&format!("127.0.0.2:{port}")));
    let q = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("answered within 5 s")
        .expect("task")
        .expect("a quorum from the new leader")
        .into_inner()
        .quorum
        .expect("a quorum");
    assert!(q.participants.iter().any(|p| p.replica_id == "g1"));
    assert!(
        q.quorum_id > first,
        "ids grow: {} then {}",
        first,
        q.quorum_id
    );

    // The old leader, now a follower, passes calls on to the new one.
    let q = via_a
        .quorum(pb::LighthouseQuorumRequest {
            requester: Some(member("g1")),
        })
        .await
        .expect("a quorum through the old leader")
        .into_inner()
        .quorum
        .expect("a quorum");
    assert!(q.participants.iter().any(|p| p.replica_id == "g1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_through_a_new_term_joins_the_new_lead() {
    // Two groups make a quorum; the first waits for the second while its
    // replica's lead ends and a new term begins (the state afresh).
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (role, seat) = watch::channel(leads());
    replica_with(
        LighthouseConfig {
            min_replicas: 2,
            ..config()
        },
        listener,
        seat,
        &stop,
    );
    let mut first = client(url.clone()).await;
    let waiting = tokio::spawn(async move {
        first
            .quorum(pb::LighthouseQuorumRequest {
                requester: Some(member("g0")),
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "one group alone makes no quorum");
    // A new term of the same replica (the watch shows Leader throughout).
    role.send_replace(leads());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut second = client(url).await;
    let q = tokio::time::timeout(
        Duration::from_secs(5),
        second.quorum(pb::LighthouseQuorumRequest {
            requester: Some(member("g1")),
        }),
    )
    .await
    .expect("a quorum within 5 s")
    .expect("a quorum")
    .into_inner()
    .quorum
    .expect("a quorum");
    let mut ids: Vec<&str> = q
        .participants
        .iter()
        .map(|p| p.replica_id.as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["g0", "g1"], "the waiting call joined the new lead");
    let mine = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("answered")
        .expect("task")
        .expect("a quorum")
        .into_inner()
        .quorum
        .expect("a quorum");
    assert_eq!(mine.quorum_id, q.quorum_id);
}
