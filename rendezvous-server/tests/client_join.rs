//! The rendezvous client (`accel-rdzv-client`) against a real rendezvous
//! server on loopback: here, among the server's integration tests, so
//! that the client crate needs no dependency on the server.

use std::time::Duration;

use accel_proto::v1 as pb;
use accel_rdzv_client::{JoinError, Leaders, Pace, RdzvClient};
use accel_wire::accepted::Accepted;
use accel_wire::auth::{ClientToken, Token};
use accel_wire::tls::ClientTlsFiles;
use tokio::time::Instant;
use tonic::Code;

/// A real rendezvous on loopback with `token`, serving until the test ends.
async fn serve(token: &str) -> u16 {
    serve_accepting(Accepted::fixed(Token::new(token, "test").expect("token"))).await
}

/// A real rendezvous on loopback accepting `accepted`.
async fn serve_accepting(accepted: Accepted) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let options = rendezvous_server::ServeOptions {
        finished_job_ttl: Duration::from_secs(5),
        may_rejoin_after_shutdown: false,
        tokens: rendezvous_server::auth::Tokens::agents(Some(accepted)),
        limits: rendezvous_server::Limits::default(),
        tls: None,
        store: None,
        replication: None,
        ends_with_job: false,
        metrics: Default::default(),
        restarted: false,
    };
    tokio::spawn(rendezvous_server::serve(
        listener,
        options,
        std::future::pending(),
    ));
    port
}

fn request(nnodes: u32) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "j".into(),
        node_id: "n".into(),
        hostname: "h".into(),
        min_nodes: nnodes,
        max_nodes: nnodes,
        nproc_per_node: 1,
        dead_after_ms: 60_000,
        ..Default::default()
    }
}

/// A port whose kernel accepts connections that nobody serves: a
/// paused server, as its nodes see it.
async fn paused() -> (tokio::net::TcpListener, (String, u16)) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    (listener, ("127.0.0.1".to_owned(), port))
}

#[tokio::test]
async fn a_join_gives_a_paused_replica_up_after_the_silence_bound_or_at_once_when_it_went_silent() {
    let token = Token::new("right-token-0123456789", "test").expect("token");
    let (_held, silent) = paused().await;
    let live = (
        "127.0.0.1".to_owned(),
        serve("right-token-0123456789").await,
    );
    let endpoints = [silent.clone(), live];
    let join = |node: &str, silence: Duration, avoid: Option<&(String, u16)>| {
        let mut req = request(2);
        req.node_id = node.into();
        let (endpoints, token) = (endpoints.clone(), token.clone());
        let avoid = avoid.cloned();
        async move {
            let started = Instant::now();
            let (_client, _events, _probe, _joined, at) = RdzvClient::join(
                &endpoints,
                Leaders::Listed,
                req,
                &ClientToken::new(Some(&token), None),
                &ClientTlsFiles::default(),
                Pace::new(Duration::from_secs(60), silence),
                avoid.as_ref(),
                Instant::now() + Duration::from_secs(30),
            )
            .await
            .expect("joins the live replica");
            (at, started.elapsed())
        }
    };
    // Tried first, the paused one holds the join only until its PINGs
    // go unanswered for the bound.
    let (at, took) = join("a", Duration::from_secs(1), None).await;
    assert_eq!(at, 1);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // Known to be silent, it is left for the other at once.
    let (at, took) = join("b", Duration::from_secs(10), Some(&silent)).await;
    assert_eq!(at, 1);
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn a_refusal_keeps_the_servers_status_code() {
    let port = serve("right-token-0123456789").await;
    let join = |req, token: Option<Token>| async move {
        RdzvClient::join(
            &[("127.0.0.1".to_owned(), port)],
            Leaders::Listed,
            req,
            &ClientToken::new(token.as_ref(), None),
            &ClientTlsFiles::default(),
            Pace::new(Duration::from_secs(5), Duration::from_secs(1)),
            None,
            Instant::now() + Duration::from_secs(5),
        )
        .await
    };
    let wrong = Token::new("wrong-token-0123456789", "test").expect("token");
    match join(request(1), Some(wrong)).await {
        Err(JoinError::Rejected { code, message }) => {
            assert_eq!(code, Code::Unauthenticated, "{message}");
            assert!(message.contains("token"), "{message}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    let right = Token::new("right-token-0123456789", "test").expect("token");
    let (_client, _events, _probe, _joined, _at) = join(request(2), Some(right.clone()))
        .await
        .expect("joins with the token");
    // The job now wants 2 nodes: another node asking for 3 disagrees.
    let mut other = request(3);
    other.node_id = "m".into();
    match join(other, Some(right)).await {
        Err(e @ JoinError::Rejected { .. }) => {
            let JoinError::Rejected { code, .. } = &e else {
                unreachable!()
            };
            assert!(
                matches!(code, Code::FailedPrecondition | Code::InvalidArgument),
                "{code:?}: {e}"
            );
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

/// A rotated token: the server's file holds the current and the next, then
/// the next alone; a joined client whose calls are refused re-reads its
/// own file and makes the call again, and keeps its place in the job.
#[tokio::test]
async fn a_rotated_token_is_reread_and_the_refused_call_made_again() {
    let dir = tempfile::tempdir().expect("dir");
    let (server_file, client_file) = (dir.path().join("server"), dir.path().join("client"));
    let (old, new) = ("old-token-0123456789", "new-token-0123456789");
    std::fs::write(&server_file, format!("{old}\n")).expect("write");
    std::fs::write(&client_file, format!("{old}\n")).expect("write");
    let port = serve_accepting(Accepted::from_file(&server_file).expect("tokens")).await;
    let first = Token::first_in_file(&client_file).expect("token");
    let token = ClientToken::new(Some(&first), Some(&client_file));
    let (mut client, _events, _probe, _joined, _at) = RdzvClient::join(
        &[("127.0.0.1".to_owned(), port)],
        Leaders::Listed,
        request(2),
        &token,
        &ClientTlsFiles::default(),
        Pace::new(Duration::from_secs(5), Duration::from_secs(5)),
        None,
        Instant::now() + Duration::from_secs(5),
    )
    .await
    .expect("joins with the current token");
    // The server takes the next token beside the current one; the
    // client's file moves to it (the client keeps sending the old one).
    std::fs::write(&server_file, format!("{old}\n{new}\n")).expect("write");
    std::fs::write(&client_file, format!("{new}\n")).expect("write");
    tokio::time::sleep(accel_wire::accepted::RECHECK + Duration::from_millis(200)).await;
    client.keep_alive(None, None).await.expect("both accepted");
    // The next alone: the old token is refused, the client re-reads.
    std::fs::write(&server_file, format!("{new}\n")).expect("write");
    tokio::time::sleep(accel_wire::accepted::RECHECK + Duration::from_millis(200)).await;
    let before = token.generation();
    client
        .keep_alive(None, None)
        .await
        .expect("refused once, made again with the new token");
    assert_ne!(token.generation(), before, "the client re-read its file");
    // A client still holding only the old token is refused for good.
    let stale = ClientToken::new(Some(&first), None);
    let mut other = request(2);
    other.node_id = "m".into();
    match RdzvClient::join(
        &[("127.0.0.1".to_owned(), port)],
        Leaders::Listed,
        other,
        &stale,
        &ClientTlsFiles::default(),
        Pace::new(Duration::from_secs(5), Duration::from_secs(5)),
        None,
        Instant::now() + Duration::from_secs(5),
    )
    .await
    {
        Err(JoinError::Rejected { code, .. }) => assert_eq!(code, Code::Unauthenticated),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // The joined client keeps the new token (a re-read happens only on a
    // refusal).
    client.keep_alive(None, None).await.expect("the new token");
}
