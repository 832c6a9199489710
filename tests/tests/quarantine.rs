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
    let mut cmd = AgentCmd::c10d(&server.addr, "quarantine")
        .nnodes("2:3")
        .nproc(1)
        .max_restarts(5)
        .conf("last_call_timeout=30")
        .recording(dir, host)
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
    let prefix = as_host(host);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    cmd.start_with(&prefix, dir, host)
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
    // The job runs on the well node alone meanwhile.
    let alone = of_world(&records(&dir), "1").len();
    assert!(alone >= 1, "a round of one ran");
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
