//! Quarantine (`rdzv-server --quarantine-after`): a host whose workers fail
//! three times is kept out of the job's rounds, the job runs without it,
//! its agent says why, `rdzv-server quarantine list` and `status` show it,
//! and `quarantine release` lets it back in without spending the budget.
//!
//! Each agent runs as its own host (a UTS namespace with its own name):
//! quarantine is kept per host name.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use accel_tests::{
    as_host, bin, http_get, poll_until, records, sample, scratch, status_jobs, Agent, AgentCmd,
    Record, Server,
};

const LIMIT: Duration = Duration::from_secs(90);

fn agent(server: &Server, dir: &Path, host: &str, failing: bool) -> Agent {
    node(server, "quarantine", dir, host, None, host, failing)
}

/// An agent of job `job` running as `host`, known by `identity` if given
/// (`--node-identity`), recording its workers as `tag`.
fn node(
    server: &Server,
    job: &str,
    dir: &Path,
    host: &str,
    identity: Option<&str>,
    tag: &str,
    failing: bool,
) -> Agent {
    let mut cmd = AgentCmd::c10d(&server.addr, job)
        .nnodes("2:3")
        .nproc(1)
        .max_restarts(5)
        .conf("last_call_timeout=30")
        .recording(dir, tag)
        .env("RECORD_EACH_ROUND", "1")
        // Rounds of two nodes run until the test lets the third back in;
        // rounds of three end (exit 0) after two seconds.
        .env("RUN_FOR_WORLD", "2:600")
        .env("RUN_FOR", "2");
    if failing {
        // This host's worker fails, whatever its rank, in the first three
        // attempts (restart counts 0, 1, 2), 0.3 s in.
        cmd = cmd
            .env("FAIL_RANKS", "0,1,2")
            .env("FAIL_UNTIL", "3")
            .env("FAIL_AFTER", "0.3");
    }
    if let Some(identity) = identity {
        cmd = cmd.flag("--node-identity", identity);
    }
    let prefix = as_host(host);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    cmd.start_with(&prefix, dir, tag)
}

fn quarantine(server: &Server, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin("rdzv-server"))
        .arg("quarantine")
        .args(args)
        .args(["--rdzv-endpoint", &server.addr])
        .output()
        .expect("rdzv-server quarantine");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Workers of rounds with `world` workers, by host.
fn of_world<'a>(recs: &'a [Record], world: &str) -> Vec<&'a Record> {
    recs.iter()
        .filter(|r| r.var("WORLD_SIZE") == world)
        .collect()
}

#[test]
fn a_host_failing_three_times_is_quarantined_and_the_job_runs_without_it_until_released() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--quarantine-after",
            "3",
            "--quarantine-window",
            "10m",
            "--quarantine-for",
            "10m",
        ],
        &[],
    );
    let dir = scratch("quarantine");
    let agents: Vec<(&str, Agent)> = [("node1", false), ("node2", false), ("node10", true)]
        .into_iter()
        .map(|(host, failing)| (host, agent(&server, &dir, host, failing)))
        .collect();

    // Three failures of node10, three counted restarts, then a round of two.
    let running = poll_until("a round without the quarantined host", LIMIT, || {
        let recs = records(&dir);
        let two = of_world(&recs, "2");
        match two.len() {
            2 => Ok(recs),
            n => Err(format!(
                "{n} workers in rounds of two; {} records",
                recs.len()
            )),
        }
    });
    for r in of_world(&running, "2") {
        assert_ne!(r.var("AGENT_TAG"), "node10", "{running:#?}");
        assert_eq!(r.var("TORCHELASTIC_RESTART_COUNT"), "3", "{running:#?}");
    }
    let failed = running
        .iter()
        .filter(|r| r.var("AGENT_TAG") == "node10")
        .count();
    assert_eq!(failed, 3, "node10 ran three times: {running:#?}");

    // The operator's views.
    let (ok, listed, err) = quarantine(&server, &["list", "--json"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).expect("json");
    let hosts = listed["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 1, "{listed}");
    assert_eq!(hosts[0]["host"], "node10", "{listed}");
    assert_eq!(hosts[0]["job_id"], "quarantine", "{listed}");
    let reason = hosts[0]["reason"].as_str().expect("reason");
    assert!(reason.contains("3 worker failures within 10m"), "{listed}");
    let left = hosts[0]["left_ms"].as_u64().expect("left_ms");
    assert!(left > 500_000 && left <= 600_000, "{listed}");
    let jobs = status_jobs(&server.addr, &[]).expect("status");
    let node10 = jobs[0]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["hostname"] == "node10")
        .cloned()
        .expect("node10 is still a member");
    assert_eq!(node10["state"], "quarantined", "{jobs:?}");
    assert_eq!(jobs[0]["restart_count"], 3, "{jobs:?}");
    let metrics = server.metrics.as_deref().expect("metrics");
    let text = http_get(metrics, "/metrics").expect("scrape").1;
    assert_eq!(
        sample(&text, "accel_rdzv_quarantined_hosts"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "accel_rdzv_quarantines_total"),
        Some(1.0),
        "{text}"
    );
    // A host that is not quarantined is named in the refusal.
    let (ok, _, err) = quarantine(&server, &["release", "node1"]);
    assert!(!ok && err.contains("'node1' is not quarantined"), "{err}");

    // Released: the job re-forms with it (no restart counted), and the
    // round of three ends the job.
    let (ok, said, err) = quarantine(&server, &["release", "node10"]);
    assert!(ok, "{err}");
    assert!(said.contains("released host node10"), "{said}");
    let mut out = Vec::new();
    for (host, a) in agents {
        let done = a.wait(LIMIT);
        assert_eq!(done.code(), 0, "{host}: {}", done.stderr);
        out.push((host, done));
    }
    let (_, node10) = out.iter().find(|(h, _)| *h == "node10").expect("node10");
    assert!(
        node10
            .stderr
            .contains("this host is quarantined by the rendezvous")
            && node10.stderr.contains("--quarantine-after"),
        "the agent says why it waits: {}",
        node10.stderr
    );
    let recs = records(&dir);
    let three: Vec<_> = of_world(&recs, "3")
        .into_iter()
        .filter(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "3")
        .collect();
    assert_eq!(
        three.len(),
        3,
        "a round of three after the release: {recs:#?}"
    );
    assert!(three.iter().any(|r| r.var("AGENT_TAG") == "node10"));
    let (ok, listed, err) = quarantine(&server, &["list"]);
    assert!(ok, "{err}");
    assert_eq!(listed, "no quarantined hosts\n");
}

#[test]
fn a_host_failing_its_health_check_is_quarantined_when_it_passes_again() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &["--quarantine-after", "3", "--quarantine-for", "10m"],
        &[],
    );
    let dir = scratch("quarantine-health");
    let count = dir.join("checks");
    // Passes, fails once (the check before the second round), then passes.
    let check = format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; \
         if [ $n -eq 2 ]; then echo fan failure >&2; exit 1; fi",
        c = count.display()
    );
    let start = |host: &str, flaky: bool| {
        let mut cmd = AgentCmd::c10d(&server.addr, "health-quarantine")
            .nnodes("1:2")
            .nproc(1)
            .max_restarts(3)
            .conf("last_call_timeout=1")
            .recording(&dir, host)
            .env("RECORD_EACH_ROUND", "1")
            .env("RUN_FOR_WORLD", "1:600")
            .env("RUN_FOR", "1");
        if flaky {
            // Its worker fails in the first attempt; then its check fails.
            cmd = cmd
                .flag("--health-check", &check)
                .env("FAIL_RANKS", "0,1")
                .env("FAIL_UNTIL", "1");
        }
        let prefix = as_host(host);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        cmd.start_with(&prefix, &dir, host)
    };
    let well = start("well", false);
    // Both join the first round: the flaky one a moment later.
    poll_until("the first node joined", LIMIT, || {
        status_jobs(&server.addr, &[]).and_then(|j| match j.len() {
            1 => Ok(()),
            n => Err(format!("{n} jobs")),
        })
    });
    let flaky = start("flaky", true);
    let listed = poll_until("the flaky host quarantined", LIMIT, || {
        let (ok, out, err) = quarantine(&server, &["list", "--json"]);
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out} {err}"))?;
        let benched = ok && v["hosts"][0]["host"] == "flaky";
        // Back from its check and waiting, told why.
        let jobs = status_jobs(&server.addr, &[])?;
        let waiting = jobs[0]["nodes"].as_array().is_some_and(|n| {
            n.iter()
                .any(|n| n["hostname"] == "flaky" && n["state"] == "quarantined")
        });
        match benched && waiting {
            true => Ok(v),
            false => Err(format!("{v} {jobs:?}")),
        }
    });
    let reason = listed["hosts"][0]["reason"].as_str().expect("reason");
    assert!(reason.contains("fan failure"), "{listed}");
    // The job runs on the well node alone meanwhile (its round of one
    // may start a moment after the bench is listed, on a loaded machine).
    poll_until("a round of one ran", LIMIT, || {
        match of_world(&records(&dir), "1").len() {
            0 => Err("no worker of a round of one yet".to_owned()),
            n => Ok(n),
        }
    });
    let (ok, _, err) = quarantine(
        &server,
        &["release", "flaky", "--rdzv-id", "health-quarantine"],
    );
    assert!(ok, "{err}");
    for (host, a) in [("well", well), ("flaky", flaky)] {
        let done = a.wait(LIMIT);
        assert_eq!(done.code(), 0, "{host}: {}", done.stderr);
        if host == "flaky" {
            assert!(
                done.stderr.contains("failed its health check")
                    && done
                        .stderr
                        .contains("this host is quarantined by the rendezvous"),
                "{}",
                done.stderr
            );
        }
    }
    let recs = records(&dir);
    let two = of_world(&recs, "2");
    assert!(
        two.iter()
            .any(|r| r.var("AGENT_TAG") == "flaky" && r.var("TORCHELASTIC_RESTART_COUNT") == "1"),
        "after the release a round of two ran, with no restart counted for it: {recs:#?}"
    );
}

/// A token holder's one-node job on made-up host `host`: it joins, is
/// placed, and reports one worker failure (issue 50, B6).
async fn fail_once_as(
    c: &mut accel_proto::v1::rendezvous_client::RendezvousClient<tonic::transport::Channel>,
    job: &str,
    host: &str,
) -> Result<(), String> {
    use accel_proto::v1 as pb;
    use pb::event::Kind;
    let join = pb::JoinRequest {
        job_id: job.into(),
        node_id: "n".into(),
        hostname: host.into(),
        min_nodes: 1,
        max_nodes: 1,
        nproc_per_node: 1,
        max_restarts: 0,
        dead_after_ms: 60_000,
        ..Default::default()
    };
    async fn next(events: &mut tonic::Streaming<pb::Event>, job: &str) -> Result<Kind, String> {
        match events.message().await {
            Ok(Some(pb::Event { kind: Some(k) })) => Ok(k),
            other => Err(format!("{job}: {other:?}")),
        }
    }
    let mut events = c.join(join).await.map_err(|e| e.to_string())?.into_inner();
    let Kind::Joined(joined) = next(&mut events, job).await? else {
        return Err(format!("{job}: not joined"));
    };
    c.ready(pb::ReadyRequest {
        job_id: job.into(),
        node_id: "n".into(),
        round: joined.round,
        master_addr: "127.0.0.1".into(),
        master_port: 1,
        session: joined.session.clone(),
    })
    .await
    .map_err(|e| e.to_string())?;
    let round = loop {
        if let Kind::RoundComplete(r) = next(&mut events, job).await? {
            break r.round;
        }
    };
    c.report_failure(pb::ReportFailureRequest {
        job_id: job.into(),
        node_id: "n".into(),
        round,
        exit_code: 1,
        reason: "worker 0 exited with code 1".into(),
        session: joined.session,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Issue 50, B6: 256 one-node jobs on made-up host names whose worker
/// fails once fill the server-wide quarantine; a real host whose worker
/// fails afterwards is still quarantined (in its job and server-wide),
/// the least recent made-up host giving its place, and the refusal is
/// counted.
#[test]
fn made_up_hosts_filling_the_server_wide_quarantine_do_not_stop_a_real_hosts() {
    const TABLE: usize = 256;
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--quarantine-after",
            "1",
            "--quarantine-for",
            "10m",
            "--quarantine-scope",
            "server",
        ],
        &[],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut c = accel_proto::v1::rendezvous_client::RendezvousClient::new(channel);
        for i in 0..TABLE {
            fail_once_as(&mut c, &format!("fake-job-{i}"), &format!("fake-{i}"))
                .await
                .expect("a made-up job fails once");
        }
    });
    let list = |server: &Server| {
        let (ok, out, err) = quarantine(server, &["list", "--json"]);
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out} {err}"))?;
        match ok {
            true => Ok(v["hosts"].as_array().cloned().unwrap_or_default()),
            false => Err(err),
        }
    };
    let fakes = list(&server).expect("list");
    assert_eq!(fakes.len(), TABLE, "the table is full of made-up hosts");

    // A real job afterwards: "bad"'s worker fails once, "good" goes on alone.
    let dir = scratch("quarantine-full");
    let start = |host: &str, failing: bool| {
        let mut cmd = AgentCmd::c10d(&server.addr, "real")
            .nnodes("1:2")
            .nproc(1)
            .max_restarts(3)
            .conf("last_call_timeout=30")
            .recording(&dir, host)
            .env("RECORD_EACH_ROUND", "1")
            .env("RUN_FOR_WORLD", "2:600")
            .env("RUN_FOR", "1");
        if failing {
            cmd = cmd
                .env("FAIL_RANKS", "0,1")
                .env("FAIL_UNTIL", "1")
                .env("FAIL_AFTER", "0.3");
        }
        let prefix = as_host(host);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        cmd.start_with(&prefix, &dir, host)
    };
    let agents = [("good", start("good", false)), ("bad", start("bad", true))];
    let listed = poll_until("the real host quarantined server-wide", LIMIT, || {
        let hosts = list(&server)?;
        let bad = hosts
            .iter()
            .any(|h| h["host"] == "bad" && h["job_id"].is_null());
        match bad {
            true => Ok(hosts),
            false => Err(format!("{} hosts, none of them 'bad'", hosts.len())),
        }
    });
    assert_eq!(listed.len(), TABLE);
    assert!(
        !listed.iter().any(|h| h["host"] == "fake-0"),
        "the least recent made-up host gave its place"
    );
    let metrics = server.metrics.as_deref().expect("metrics");
    let text = http_get(metrics, "/metrics").expect("scrape").1;
    assert_eq!(
        sample(&text, "accel_rdzv_quarantined_hosts"),
        Some(TABLE as f64),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "accel_rdzv_quarantines_refused_total{reason=\"evicted\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "accel_rdzv_quarantine_table_free"),
        Some(0.0),
        "{text}"
    );
    // The job ran on without it: a round of one, on "good".
    for (host, a) in agents {
        let done = a.wait(LIMIT);
        assert_eq!(done.code(), 0, "{host}: {}", done.stderr);
    }
    let recs = records(&dir);
    let one = of_world(&recs, "1");
    assert!(!one.is_empty(), "{recs:#?}");
    assert!(
        one.iter().all(|r| r.var("AGENT_TAG") == "good"),
        "{recs:#?}"
    );
}

/// `--node-identity`: quarantine keys on the machine the agent names, not
/// its host name (under Kubernetes a pod's host name is its pod name, which
/// a replacement pod on another machine keeps). Pod `pod-0` on machine-x
/// fails three times: machine-x is benched, not pod-0. Its replacement, a
/// pod of the same name on machine-y, is placed, and the job ends in a
/// round of three.
#[test]
fn quarantine_keys_on_the_node_identity_so_a_replacement_pod_of_the_same_name_runs() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--quarantine-after",
            "3",
            "--quarantine-window",
            "10m",
            "--quarantine-for",
            "10m",
        ],
        &[],
    );
    let dir = scratch("quarantine-identity");
    let pod = |host: &str, identity: &str, tag: &str, failing: bool| {
        node(
            &server,
            "quarantine-identity",
            &dir,
            host,
            Some(identity),
            tag,
            failing,
        )
    };
    let a = pod("pod-1", "machine-a", "pod-1", false);
    let b = pod("pod-2", "machine-b", "pod-2", false);
    let bad = pod("pod-0", "machine-x", "pod-0-on-x", true);
    poll_until("a round of two without machine-x", LIMIT, || {
        let recs = records(&dir);
        match of_world(&recs, "2").len() {
            2 => Ok(()),
            n => Err(format!(
                "{n} workers in rounds of two; {} records",
                recs.len()
            )),
        }
    });
    let (ok, listed, err) = quarantine(&server, &["list", "--json"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).expect("json");
    let hosts = listed["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 1, "{listed}");
    assert_eq!(
        hosts[0]["host"], "machine-x",
        "the machine, not the pod: {listed}"
    );
    let jobs = status_jobs(&server.addr, &[]).expect("status");
    let names: Vec<&str> = jobs[0]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["hostname"].as_str())
        .collect();
    assert!(
        names.contains(&"machine-x") && !names.iter().any(|n| n.starts_with("pod-")),
        "status shows identities: {names:?}"
    );

    // The pod is replaced: same pod name, another machine.
    bad.signal("KILL");
    let _ = bad.wait(LIMIT);
    let replacement = pod("pod-0", "machine-y", "pod-0-on-y", false);
    for (name, agent) in [
        ("pod-1", a),
        ("pod-2", b),
        ("pod-0 on machine-y", replacement),
    ] {
        let done = agent.wait(LIMIT);
        assert_eq!(done.code(), 0, "{name}: {}", done.stderr);
    }
    // The last round (three nodes: machine-x's three failing rounds were of
    // three too) has the replacement and not machine-x.
    let recs = records(&dir);
    let last = recs.iter().map(|r| r.restart).max().expect("records");
    let mut tags: Vec<String> = of_world(&recs, "3")
        .into_iter()
        .filter(|r| r.restart == last)
        .map(|r| r.var("AGENT_TAG").to_owned())
        .collect();
    tags.sort();
    assert_eq!(tags, ["pod-0-on-y", "pod-1", "pod-2"], "{recs:#?}");
}
