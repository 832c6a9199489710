//! The rendezvous as an attacker on the network sees it: no token, a stolen
//! token without a node's session secret, oversized or out-of-range fields,
//! too many jobs or nodes. Each refusal must leave the running job exactly
//! as it was (restarts, members, ranks, MASTER_ADDR, worker pids).

use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use accel_tests::{bin, ensure_quiet_for, eventually, records, scratch, Agent, AgentCmd, Server};
use accel_wire::auth::AttachToken;
use accel_wire::auth::Token;
use pb::rendezvous_client::RendezvousClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "security-test-token-4f1c9a7e2b";

type Client = RendezvousClient<InterceptedService<Channel, AttachToken>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A raw client of `addr`, with `token` or without.
async fn client(addr: &str, token: Option<&str>) -> Client {
    let token = token.map(|t| Token::new(t, "test").expect("token"));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    RendezvousClient::with_interceptor(channel, AttachToken::new(token.as_ref()))
}

fn join_req(job: &str, node: &str, host: &str, nnodes: u32) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: job.into(),
        node_id: node.into(),
        hostname: host.into(),
        min_nodes: nnodes,
        max_nodes: nnodes,
        nproc_per_node: 1,
        max_restarts: 3,
        dead_after_ms: 60_000,
        ..Default::default()
    }
}

async fn status(c: &mut Client, job: &str) -> pb::JobInfo {
    c.job_status(pb::JobStatusRequest {
        job_id: job.into(),
        ..Default::default()
    })
    .await
    .expect("status with the token")
    .into_inner()
    .jobs
    .remove(0)
}

fn agent(dir: &std::path::Path, tag: &str, addr: &str, job: &str) -> Agent {
    AgentCmd::c10d_no_local_addr(addr, job)
        .nnodes(2)
        .nproc(1)
        .max_restarts(3)
        .recording(dir, tag)
        .env("RUN_FOR", "30")
        .env("ACCEL_RDZV_TOKEN", TOKEN)
        .start(dir, tag)
}

/// The job's observable state: (restart count, members, ranks by host,
/// MASTER_ADDR:PORT and pid of every worker).
fn snapshot(
    c: &mut Client,
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    job: &str,
) -> String {
    let info = rt.block_on(status(c, job));
    let mut nodes: Vec<String> = info
        .nodes
        .iter()
        .map(|n| format!("{}={:?}/{}", n.node_id, n.node_rank, n.state))
        .collect();
    nodes.sort();
    let mut workers: Vec<String> = records(dir)
        .iter()
        .map(|r| {
            format!(
                "rank{} pid{} {}:{}",
                r.rank, r.pid, r.env["MASTER_ADDR"], r.env["MASTER_PORT"]
            )
        })
        .collect();
    workers.sort();
    format!(
        "round {} restarts {} phase {} nodes {nodes:?} workers {workers:?}",
        info.round, info.restart_count, info.phase
    )
}

#[test]
fn without_the_token_every_call_is_refused_and_the_job_is_untouched() {
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let dir = scratch("sec-token");
    let rt = runtime();
    let a = agent(&dir, "a", &server.addr, "victim");
    let mut admin = rt.block_on(client(&server.addr, Some(TOKEN)));
    assert!(eventually(Duration::from_secs(10), || rt
        .block_on(admin.job_status(pb::JobStatusRequest {
            job_id: "victim".into(),
            ..Default::default()
        }))
        .is_ok()));
    // While the job forms, an attacker without the token tries to take node
    // rank 0 with a host name that sorts first.
    let mut evil = rt.block_on(client(&server.addr, None));
    let refused = rt
        .block_on(evil.join(join_req("victim", "evil", "0000-evil", 2)))
        .expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("token"), "{refused:?}");
    let b = agent(&dir, "b", &server.addr, "victim");
    assert!(eventually(Duration::from_secs(20), || records(&dir).len() == 2));
    let before = snapshot(&mut admin, &rt, &dir, "victim");
    assert!(!before.contains("evil"), "{before}");
    // A job on a loopback endpoint: the real node rank 0 offers its loopback store.
    for r in records(&dir) {
        assert_eq!(
            r.env["MASTER_ADDR"], "127.0.0.1",
            "MASTER_ADDR is a real agent's"
        );
        assert!(
            !r.env.contains_key("ACCEL_RDZV_TOKEN"),
            "workers do not inherit the agent's token"
        );
    }
    let info = rt.block_on(status(&mut admin, "victim"));
    let node = info.nodes[0].node_id.clone();
    // Every call of the API, without the token.
    let codes = rt.block_on(async {
        vec![
            evil.ready(pb::ReadyRequest {
                job_id: "victim".into(),
                node_id: node.clone(),
                master_addr: "6.6.6.6".into(),
                master_port: 1,
                ..Default::default()
            })
            .await
            .map(drop),
            evil.keep_alive(pb::KeepAliveRequest {
                job_id: "victim".into(),
                node_id: node.clone(),
                ..Default::default()
            })
            .await
            .map(drop),
            evil.report_failure(pb::ReportFailureRequest {
                job_id: "victim".into(),
                node_id: node.clone(),
                round: info.round,
                reason: "owned".into(),
                ..Default::default()
            })
            .await
            .map(drop),
            evil.report_success(pb::ReportSuccessRequest {
                job_id: "victim".into(),
                node_id: node.clone(),
                round: info.round,
                ..Default::default()
            })
            .await
            .map(drop),
            evil.leave(pb::LeaveRequest {
                job_id: "victim".into(),
                node_id: node.clone(),
                reason: "owned".into(),
                ..Default::default()
            })
            .await
            .map(drop),
            evil.job_status(pb::JobStatusRequest::default())
                .await
                .map(drop),
        ]
    });
    for (i, r) in codes.into_iter().enumerate() {
        assert_eq!(
            r.expect_err("refused").code(),
            Code::Unauthenticated,
            "call {i}"
        );
    }
    // A refused call has no effect to wait for: the job is watched
    // unchanged (rounds, restarts, nodes, workers) for half a second.
    ensure_quiet_for("the job is untouched", Duration::from_millis(500), || {
        let now = snapshot(&mut admin, &rt, &dir, "victim");
        if now == before {
            Ok(())
        } else {
            Err(now)
        }
    });
    drop((a, b));
}

#[test]
fn the_token_without_a_nodes_session_secret_cannot_act_for_it() {
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let dir = scratch("sec-session");
    let rt = runtime();
    let a = agent(&dir, "a", &server.addr, "victim");
    let b = agent(&dir, "b", &server.addr, "victim");
    assert!(eventually(Duration::from_secs(20), || records(&dir).len() == 2));
    let mut insider = rt.block_on(client(&server.addr, Some(TOKEN)));
    let before = snapshot(&mut insider, &rt, &dir, "victim");
    let info = rt.block_on(status(&mut insider, "victim"));
    let node = info.nodes[0].node_id.clone();
    let wrong = vec![0u8; 16];
    let results = rt.block_on(async {
        let mut out = Vec::new();
        // Four failures would spend the job's --max-restarts 3.
        for _ in 0..4 {
            out.push(
                insider
                    .report_failure(pb::ReportFailureRequest {
                        job_id: "victim".into(),
                        node_id: node.clone(),
                        round: info.round,
                        reason: "\u{1b}[2Jowned".into(),
                        session: wrong.clone(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            );
        }
        out.push(
            insider
                .leave(pb::LeaveRequest {
                    job_id: "victim".into(),
                    node_id: node.clone(),
                    reason: "owned".into(),
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        out.push(
            insider
                .keep_alive(pb::KeepAliveRequest {
                    job_id: "victim".into(),
                    node_id: node.clone(),
                    session: wrong.clone(),
                    // A vouch for the whole round would keep its nodes.
                    round: info.round,
                    vouch_all: true,
                    ..Default::default()
                })
                .await
                .map(drop),
        );
        out.push(
            insider
                .report_success(pb::ReportSuccessRequest {
                    job_id: "victim".into(),
                    node_id: node.clone(),
                    round: info.round,
                    session: wrong.clone(),
                })
                .await
                .map(drop),
        );
        let mut resume = join_req("victim", &node, "evil", 2);
        resume.max_restarts = 3;
        resume.resume = Some(pb::Resume {
            round: info.round,
            restart_count: 0,
            node_rank: 0,
            nnodes: 2,
        });
        resume.session = wrong.clone();
        out.push(insider.join(resume).await.map(drop));
        out
    });
    for (i, r) in results.into_iter().enumerate() {
        let s = r.expect_err("refused");
        assert_eq!(s.code(), Code::PermissionDenied, "call {i}: {s:?}");
        assert!(s.message().contains("session secret"), "{s:?}");
    }
    // As above: watched unchanged for half a second.
    ensure_quiet_for("the job is untouched", Duration::from_millis(500), || {
        let now = snapshot(&mut insider, &rt, &dir, "victim");
        if now == before {
            Ok(())
        } else {
            Err(now)
        }
    });
    drop((a, b));
}

#[test]
fn every_bound_refuses_with_its_limit_and_the_server_stays_up() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &["--max-jobs", "2", "--max-nodes-per-job", "3"],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let rt = runtime();
    rt.block_on(async {
        let mut c = client(&server.addr, Some(TOKEN)).await;
        let code_and_message =
            |r: Result<tonic::Response<tonic::Streaming<pb::Event>>, tonic::Status>| {
                let s = r.expect_err("refused");
                (s.code(), s.message().to_owned())
            };
        let long = "h".repeat(300);
        let (code, msg) = code_and_message(c.join(join_req("j1", "n", &long, 2)).await);
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.contains("256"), "{msg}");
        // A resume claiming 4 billion nodes for a job the server does not know.
        let mut huge = join_req("ghost", "n", "h", 2);
        huge.resume = Some(pb::Resume {
            round: 1,
            restart_count: 0,
            node_rank: 0,
            nnodes: u32::MAX,
        });
        let t0 = Instant::now();
        let (code, msg) = code_and_message(c.join(huge).await);
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.contains("resume"), "{msg}");
        assert!(t0.elapsed() < Duration::from_secs(1));
        let (code, msg) = code_and_message(c.join(join_req("j1", "n", "h", 4)).await);
        assert_eq!(code, Code::ResourceExhausted);
        assert!(msg.contains("--max-nodes-per-job 3"), "{msg}");
        // Three nodes fit a job; a fourth does not (spares count).
        let mut streams = Vec::new();
        for i in 0..3 {
            let mut r = join_req("j1", &format!("n{i}"), "h", 2);
            r.min_nodes = 1;
            r.max_nodes = 2;
            streams.push(c.join(r).await.expect("fits").into_inner());
        }
        let mut r = join_req("j1", "n3", "h", 2);
        r.min_nodes = 1;
        r.max_nodes = 2;
        let (code, msg) = code_and_message(c.join(r).await);
        assert_eq!(code, Code::ResourceExhausted);
        assert!(msg.contains("already has 3 nodes"), "{msg}");
        // Two jobs fit the server; a third does not.
        streams.push(
            c.join(join_req("j2", "n", "h", 2))
                .await
                .expect("second job")
                .into_inner(),
        );
        let (code, msg) = code_and_message(c.join(join_req("j3", "n", "h", 2)).await);
        assert_eq!(code, Code::ResourceExhausted);
        assert!(msg.contains("--max-jobs"), "{msg}");
        // Failure text beyond 64 KiB.
        let big = c
            .report_failure(pb::ReportFailureRequest {
                job_id: "j1".into(),
                node_id: "n0".into(),
                reason: "x".repeat(70 * 1024),
                ..Default::default()
            })
            .await
            .expect_err("too big");
        assert_eq!(big.code(), Code::InvalidArgument);
        assert!(big.message().contains("65536"), "{big:?}");
        // Still serving.
        let all = c
            .job_status(pb::JobStatusRequest::default())
            .await
            .expect("status")
            .into_inner();
        assert_eq!(all.jobs.len(), 2);
        drop(streams);
    });
}

#[test]
fn a_server_on_a_routable_address_needs_a_token_or_an_explicit_opt_out() {
    let out = std::process::Command::new(bin("rdzv-server"))
        .args(["--bind", "0.0.0.0:0"])
        .env("RDZV_METRICS_BIND", "127.0.0.1:0")
        .env_remove("RDZV_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without a token") && err.contains("--token-file"),
        "{err}"
    );
    // With the opt-out it serves (and says what that means).
    let server = Server::start_with("0.0.0.0:0", &["--allow-unauthenticated"], &[]);
    let rt = runtime();
    let port = server.addr.rsplit(':').next().expect("port");
    let mut c = rt.block_on(client(&format!("127.0.0.1:{port}"), None));
    assert!(rt
        .block_on(c.job_status(pb::JobStatusRequest::default()))
        .is_ok());
}

#[test]
fn a_finished_jobs_id_is_reusable_after_the_ttl() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &["--finished-job-ttl", "1", "--tombstone-ttl", "1"],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let dir = scratch("sec-ttl");
    let job = AgentCmd::c10d_no_local_addr(&server.addr, "again")
        .nnodes(1)
        .nproc(1)
        .no_python("true", &[])
        .env("ACCEL_RDZV_TOKEN", TOKEN);
    let run = |tag: &str| job.run(&dir, tag, Duration::from_secs(30));
    assert_eq!(run("first").code(), 0);
    // Within the TTL the job is remembered: the same command again is a
    // new run, told of the earlier one.
    let early = run("early");
    assert_eq!(early.code(), 0, "{}", early.stderr);
    assert!(
        early.stderr.contains("job 'again' succeeded at")
            && early.stderr.contains("starting a new run"),
        "{}",
        early.stderr
    );
    // Both TTLs count from the job's end: once the server has forgotten
    // the job (its status no longer lists it), its tombstone, as old, is
    // gone too.
    accel_tests::poll_until(
        "the finished job forgotten",
        Duration::from_secs(30),
        || {
            let jobs = accel_tests::status_jobs(&server.addr, &[("ACCEL_RDZV_TOKEN", TOKEN)])?;
            match jobs.iter().any(|j| j["job_id"] == "again") {
                false => Ok(()),
                true => Err(format!("{jobs:?}")),
            }
        },
    );
    let again = run("again");
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert!(
        !again.stderr.contains("starting a new run") && again.stderr.contains("round formed"),
        "after both TTLs the id is unknown and starts afresh: {}",
        again.stderr
    );
}

/// Agents killed while their jobs form (preempted pods) leave no job
/// behind: a job that never ran a round is forgotten `--finished-job-ttl`
/// after its last member went, so churn cannot fill the job table.
#[test]
fn jobs_whose_agents_were_killed_while_forming_are_forgotten() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &["--finished-job-ttl", "1"],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let dir = scratch("sec-abandoned");
    let agents: Vec<Agent> = (0..20)
        .map(|i| {
            AgentCmd::c10d_no_local_addr(&server.addr, &format!("ab-{i}"))
                .nnodes(2)
                .nproc(1)
                .no_python("true", &[])
                .env("ACCEL_RDZV_TOKEN", TOKEN)
                .start(&dir, &format!("ab-{i}"))
        })
        .collect();
    let env = [("ACCEL_RDZV_TOKEN", TOKEN)];
    accel_tests::poll_until("20 forming jobs", Duration::from_secs(30), || {
        let jobs = accel_tests::status_jobs(&server.addr, &env)?;
        match jobs.len() {
            20 => Ok(()),
            n => Err(format!("{n} jobs")),
        }
    });
    for a in &agents {
        a.signal("KILL");
    }
    let killed = Instant::now();
    accel_tests::poll_until(
        "the abandoned jobs forgotten",
        Duration::from_secs(20),
        || {
            let jobs = accel_tests::status_jobs(&server.addr, &env)?;
            match jobs.is_empty() {
                true => Ok(()),
                false => Err(format!("{} jobs left: {:?}", jobs.len(), jobs.first())),
            }
        },
    );
    eprintln!(
        "20 abandoned forming jobs forgotten {:?} after their agents were killed",
        killed.elapsed()
    );
    drop(agents);
}

#[test]
fn a_thousand_agents_are_a_few_log_lines_not_a_thousand() {
    let dir = scratch("sec-logs");
    let log = dir.join("server.log");
    let address_file = dir.join("addresses");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut server = std::process::Command::new(bin("rdzv-server"))
        .args(["--bind", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .arg("--address-file")
        .arg(&address_file)
        .env("RDZV_METRICS_BIND", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start");
    let (addr, _) = accel_tests::wait_for_address_file(&address_file, &mut server, &|| {
        std::fs::read_to_string(&log).unwrap_or_default()
    });
    let load = std::process::Command::new(bin("rdzv-load"))
        .args([
            "--endpoint",
            &addr,
            "--server-pid",
            &server.id().to_string(),
            "--agents",
            "1000",
            "--token-file",
        ])
        .arg(&token_file)
        .output()
        .expect("rdzv-load");
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    // Counts of one kind, summed over the aggregated lines.
    let count = |text: &str, what: &str| -> u32 {
        text.lines()
            .filter_map(|l| l.split("nodes=").nth(1))
            .flat_map(|counts| counts.split(", "))
            .filter_map(|n| n.strip_suffix(what)?.trim().parse::<u32>().ok())
            .sum()
    };
    // The load's streams end when it exits: aggregated too (within a second
    // or two of the last one).
    let read = || std::fs::read_to_string(&log).expect("read log");
    eventually(Duration::from_secs(10), || {
        count(&read(), " lost their connection") >= 1000
    });
    let _ = server.kill();
    let _ = server.wait();
    let text = read();
    let lines = text.lines().count();
    assert!(lines <= 12, "{lines} lines:\n{text}");
    let count = |what: &str| count(&text, what);
    assert_eq!(count(" joined"), 1000, "{text}");
    assert_eq!(count(" lost their connection"), 1000, "{text}");
    assert!(text.contains("round formed"), "{text}");
    assert!(!text.contains("may be read by other users"), "{text}");
    assert!(!text.contains(TOKEN), "the token is never logged");
}

/// Reads from `s` until the server closes it (end of file or reset), or
/// `limit` passes; true if it was closed.
fn closed_within(s: &mut std::net::TcpStream, limit: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 256];
    let t0 = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // The server's HTTP/2 preface, or whatever it sends first.
            Ok(_) if t0.elapsed() < limit => continue,
            Ok(_) => return false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn connections_without_the_token_are_few_per_address_and_do_not_linger() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &["--max-connections-per-ip", "4", "--auth-timeout", "1"],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let rt = runtime();
    let raw = || std::net::TcpStream::connect(&server.addr).expect("connect");
    // An agent with the token holds one connection and makes its calls.
    let mut agent = rt.block_on(client(&server.addr, Some(TOKEN)));
    rt.block_on(agent.job_status(pb::JobStatusRequest::default()))
        .expect("status with the token");
    // Three silent connections fill this address's share...
    let mut idle: Vec<_> = (0..3).map(|_| raw()).collect();
    // ...so a fifth is closed as it is accepted, before it sends a byte.
    let mut over = raw();
    assert!(
        closed_within(&mut over, Duration::from_millis(500)),
        "a connection beyond --max-connections-per-ip is closed at once"
    );
    // The silent ones are closed once --auth-timeout passes without a call.
    let t0 = Instant::now();
    for s in &mut idle {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "an idle connection is closed after --auth-timeout"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    // Calls without the token do not keep their connections either: three
    // refused callers fill the share again, and are closed in time.
    // (The server gives a closed connection's place back just after the
    // close the client sees: until then a new connection is closed at once,
    // which the client sees as a transport error — Unknown, Unavailable, or
    // Cancelled when the close races the request — and tries again.)
    let mut anonymous = Vec::new();
    for _ in 0..3 {
        let c = accel_tests::poll_until(
            "a caller without the token is answered UNAUTHENTICATED",
            Duration::from_secs(10),
            || {
                let mut c = rt.block_on(client(&server.addr, None));
                let refused = rt
                    .block_on(c.job_status(pb::JobStatusRequest::default()))
                    .expect_err("no token");
                match refused.code() {
                    Code::Unauthenticated => Ok(c),
                    Code::Unknown | Code::Unavailable | Code::Cancelled => {
                        Err(format!("not answered: {refused}"))
                    }
                    other => panic!("a caller without the token got {other:?}: {refused}"),
                }
            },
        );
        anonymous.push(c);
    }
    assert!(
        closed_within(&mut raw(), Duration::from_millis(500)),
        "refused callers hold their places until --auth-timeout"
    );
    // Once --auth-timeout closed the refused callers' connections, a new
    // one is kept (until then each try is closed at once, taking no place).
    let _again = accel_tests::poll_until(
        "the refused callers' places were given back",
        Duration::from_secs(10),
        || {
            let mut again = raw();
            match closed_within(&mut again, Duration::from_millis(300)) {
                false => Ok(again),
                true => Err("closed".to_owned()),
            }
        },
    );
    // The agent's connection proved itself and is kept.
    rt.block_on(agent.job_status(pb::JobStatusRequest::default()))
        .expect("the authenticated connection outlives --auth-timeout");
    drop(anonymous);
}

/// An agent more than one release line from the server is refused when it
/// joins, with both versions and the admitted lines named; one of the
/// server's line or an adjacent one (an upgrade, a rollback), or one too
/// old to say its version, is admitted.
#[test]
fn an_agent_of_another_release_line_is_refused_naming_both_versions() {
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let rt = runtime();
    let mut c = rt.block_on(client(&server.addr, Some(TOKEN)));
    let mut newer = join_req("skew", "n1", "h1", 2);
    newer.agent_version = "9.0.0".into();
    let e = rt.block_on(c.join(newer)).expect_err("refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let server_version = env!("CARGO_PKG_VERSION");
    assert!(
        e.message().contains("accel-agent 9.0.0 is newer")
            && e.message()
                .contains(&format!("rdzv-server {server_version}")),
        "{}",
        e.message()
    );
    let mut same = join_req("skew", "n2", "h2", 2);
    same.agent_version = server_version.into();
    assert!(rt.block_on(c.join(same)).is_ok());
    // The lines beside the server's: one newer (before 1.0, MINOR + 1),
    // one older where there is one; two apart is refused.
    let (major, minor) = {
        let mut parts = server_version
            .split('.')
            .map(|p| p.parse::<u64>().expect("number"));
        (parts.next().expect("major"), parts.next().expect("minor"))
    };
    assert_eq!(
        major, 0,
        "from 1.0 on the lines are MAJOR: adjust this test"
    );
    for (i, version) in [format!("0.{}.3", minor + 1)]
        .into_iter()
        .chain((minor > 0).then(|| format!("0.{}.0", minor - 1)))
        .enumerate()
    {
        let mut adjacent = join_req("skew-adjacent", &format!("a{i}"), &format!("ha{i}"), 2);
        adjacent.agent_version = version.clone();
        assert!(rt.block_on(c.join(adjacent)).is_ok(), "{version}");
    }
    let mut far = join_req("skew-far", "f1", "hf1", 2);
    far.agent_version = format!("0.{}.0", minor + 2);
    let e = rt.block_on(c.join(far)).expect_err("two lines newer");
    assert!(
        e.message().contains("by more than one release line")
            && e.message()
                .contains(&format!("0.{minor}.x, 0.{}.x", minor + 1)),
        "{}",
        e.message()
    );
    // An agent older than the check says nothing: admitted.
    assert!(rt.block_on(c.join(join_req("skew", "n3", "h3", 2))).is_ok());
    let mut garbage = join_req("skew", "n4", "h4", 2);
    garbage.agent_version = "latest".into();
    let e = rt.block_on(c.join(garbage)).expect_err("refused");
    assert!(e.message().contains("MAJOR.MINOR.PATCH"), "{}", e.message());
}

/// A missing token is named as each client takes it: `rdzv-server status`
/// its `--token-file`, an agent its `--rdzv-conf token_file` (the server
/// used to tell both the agent's).
#[test]
fn a_missing_token_is_named_as_each_client_takes_it() {
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let dir = scratch("sec-named");
    let e = accel_tests::status_jobs(&server.addr, &[]).expect_err("refused");
    assert!(
        e.contains("requires its token")
            && e.contains("give this command --token-file PATH")
            && !e.contains("--rdzv-conf"),
        "{e}"
    );
    let out = AgentCmd::c10d_no_local_addr(&server.addr, "no-token")
        .nnodes(1)
        .nproc(1)
        .no_python("true", &[])
        .run(&dir, "agent", Duration::from_secs(30));
    assert_ne!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("requires its token")
            && out
                .stderr
                .contains("give the agent --rdzv-conf token_file=PATH"),
        "{}",
        out.stderr
    );
}

/// Rotating the tokens mid-job, as an operator rotates a Secret: the
/// server's file holds the current token and the next, the agents' file
/// moves to the next, then the server's holds the next alone. The running
/// two-node job never notices (same round, no restart, same workers); a
/// worker that fails after the rotation is reported with the new token
/// (the agent's call with the old one is refused, and made again), so the
/// job restarts once and ends with success; a new job joins with the new
/// token; the old one is refused. With an operate token set, the agents' token can neither
/// collect stacks nor release a quarantined host, and the operate token
/// can.
#[test]
fn rotating_the_token_mid_job_keeps_the_job_and_the_agents_token_cannot_operate() {
    let dir = scratch("sec-rotate");
    let (old, new, operate) = (
        "rotate-old-token-0123456789",
        "rotate-new-token-0123456789",
        "rotate-operate-token-0123456789",
    );
    let (server_file, agents_file, operate_file) = (
        dir.join("server.token"),
        dir.join("agents.token"),
        dir.join("operate.token"),
    );
    let write = |f: &std::path::Path, text: String| {
        // As the kubelet updates a Secret: a new file moved into place.
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, f).expect("rename");
    };
    write(&server_file, format!("{old}\n"));
    write(&agents_file, format!("{old}\n"));
    write(&operate_file, format!("{operate}\n"));
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--token-file",
            server_file.to_str().expect("utf-8"),
            "--operate-token-file",
            operate_file.to_str().expect("utf-8"),
        ],
        &[],
    );
    let rt = runtime();
    let agent = |tag: &str, job: &str, nnodes: u32, run_for: &str| {
        AgentCmd::c10d_no_local_addr(&server.addr, job)
            .nnodes(nnodes)
            .nproc(1)
            .max_restarts(3)
            .conf("keep_alive_interval=1")
            .conf(format!("token_file={}", agents_file.display()))
            .recording(&dir.join(job), tag)
            .env("RUN_FOR", run_for)
            // Global rank 1 fails once, well after the rotation.
            .env("FAIL_RANKS", "1")
            .env("FAIL_UNTIL", "1")
            .env("FAIL_AFTER", "10")
            .start(&dir, tag)
    };
    std::fs::create_dir_all(dir.join("job")).expect("dir");
    std::fs::create_dir_all(dir.join("fresh")).expect("dir");
    let a = agent("a", "job", 2, "12");
    let b = agent("b", "job", 2, "12");
    let mut admin = rt.block_on(client(&server.addr, Some(operate)));
    let job_dir = dir.join("job");
    poll_until_running(&job_dir);
    let before = snapshot(&mut admin, &rt, &job_dir, "job");
    // Step 1: both accepted; the agents' file moves to the next.
    write(&server_file, format!("{new}\n{old}\n"));
    write(&agents_file, format!("{new}\n"));
    std::thread::sleep(Duration::from_millis(1500));
    // Step 2: the next alone. Every agent's next keep-alive is refused,
    // re-reads its file and is made again with the new token.
    write(&server_file, format!("{new}\n"));
    std::thread::sleep(Duration::from_secs(4));
    let mut stale = rt.block_on(client(&server.addr, Some(old)));
    let refused = rt
        .block_on(stale.job_status(pb::JobStatusRequest::default()))
        .expect_err("the old token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(
        snapshot(&mut admin, &rt, &job_dir, "job"),
        before,
        "the running job did not notice the rotation"
    );
    // A new job joins with the new token.
    let c = agent("c", "fresh", 1, "0");
    let fresh = c.wait(Duration::from_secs(30));
    assert_eq!(fresh.code(), 0, "{}", fresh.stderr);
    // The agents' token may only join.
    let mut agents = rt.block_on(client(&server.addr, Some(new)));
    let denied = rt
        .block_on(agents.stacks(pb::StacksRequest {
            job_id: "job".into(),
            timeout_ms: 1000,
            ..Default::default()
        }))
        .expect_err("no stacks with the agents' token");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied.message().contains("--operate-token-file"),
        "{denied:?}"
    );
    let denied = rt
        .block_on(agents.quarantine(pb::QuarantineRequest {
            job_id: "job".into(),
            release: "some-host".into(),
        }))
        .expect_err("no release with the agents' token");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let denied = rt
        .block_on(agents.job_status(pb::JobStatusRequest::default()))
        .expect_err("no reading with the agents' token once an operate token is set");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // An agent asking for its own job's stacks (a hung worker) may, with
    // the agents' token: its session secret proves it a member. A wrong
    // secret, or another job, is refused.
    let mut joined = rt
        .block_on(agents.join(join_req("mine", "m1", "hm1", 2)))
        .expect("joins with the new token")
        .into_inner();
    let session = match rt.block_on(joined.message()) {
        Ok(Some(pb::Event {
            kind: Some(pb::event::Kind::Joined(j)),
        })) => j.session,
        other => panic!("expected Joined, got {other:?}"),
    };
    let own = |job: &str, session: Vec<u8>| pb::StacksRequest {
        job_id: job.into(),
        timeout_ms: 1000,
        node_id: "m1".into(),
        session,
        ..Default::default()
    };
    rt.block_on(agents.stacks(own("mine", session.clone())))
        .expect("a member's own job's stacks");
    for (job, secret) in [("mine", vec![0u8; session.len()]), ("job", session)] {
        let denied = rt
            .block_on(agents.stacks(own(job, secret)))
            .expect_err("not a member with that secret");
        assert_eq!(denied.code(), Code::PermissionDenied, "{job}: {denied:?}");
    }
    // The operate token can: a release of a host that is not quarantined
    // is NOT_FOUND, not a refusal of the caller.
    let released = rt
        .block_on(admin.quarantine(pb::QuarantineRequest {
            job_id: "job".into(),
            release: "some-host".into(),
        }))
        .expect_err("not quarantined");
    assert_eq!(released.code(), Code::NotFound, "{released:?}");
    // The failure after the rotation restarts the job once; it ends with
    // success.
    for agent in [a, b] {
        let out = agent.wait(Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    assert_eq!(records(&job_dir).len(), 4, "one restart of both workers");
}

/// Waits until both workers of the job recorded in `dir` run.
fn poll_until_running(dir: &std::path::Path) {
    accel_tests::poll_until(
        "both workers run",
        Duration::from_secs(30),
        || match records(dir).len() {
            2 => Ok(()),
            n => Err(format!("{n} workers")),
        },
    );
}
