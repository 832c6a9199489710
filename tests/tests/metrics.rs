//! Metrics and health: both daemons' `/metrics` scraped while a job fails
//! once and restarts, the counters checked as they move, and a real
//! Prometheus (Debian's, installed by the test command) scraping both and
//! answering PromQL.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use accel_tests::{
    accept_queue, http_get, poll_until, sample, scratch, Agent, AgentCmd, Port, Server,
};

const LIMIT: Duration = Duration::from_secs(60);

/// The exposition at `addr`, or why not.
fn scrape(addr: &str) -> Result<String, String> {
    match http_get(addr, "/metrics") {
        Some((200, body)) => Ok(body),
        Some((code, body)) => Err(format!("HTTP {code}: {body}")),
        None => Err(format!("nothing answers at {addr}")),
    }
}

/// Waits until the exposition at `addr` has `series` at `value`.
fn until_sample(addr: &str, series: &str, value: f64) -> String {
    poll_until(&format!("{series} = {value} at {addr}"), LIMIT, || {
        let text = scrape(addr)?;
        match sample(&text, series) {
            Some(v) if v == value => Ok(text),
            other => Err(format!("{other:?}")),
        }
    })
}

/// The job of [`failing_job`].
struct FailingJob {
    server: Server,
    /// The server's metrics address.
    metrics: String,
    agents: Vec<Agent>,
    /// Each agent's metrics address.
    agent_metrics: Vec<String>,
    /// The agents' metrics ports, leased while they run (an agent is told
    /// its port; it does not report one it chose).
    _ports: Vec<Port>,
}

/// A server (metrics on a port it picks, read from its address file), and
/// two agents of a 2 × 2 job whose global rank 3 fails in the first round;
/// each agent serves its metrics on a leased port.
fn failing_job(dir: &Path, job: &str, run_for: &str) -> FailingJob {
    let server = Server::start();
    let metrics = server.metrics.clone().expect("the server serves metrics");
    let ports: Vec<Port> = (0..2).map(|_| Port::lease()).collect();
    let agent_metrics: Vec<String> = ports.iter().map(Port::loopback).collect();
    let agents = failing_agents(&server, dir, job, run_for, "0.2", &agent_metrics);
    FailingJob {
        server,
        metrics,
        agents,
        agent_metrics,
        _ports: ports,
    }
}

/// The agents of [`failing_job`], serving their metrics at `agent_metrics`;
/// the failing worker fails `fail_after` seconds in.
fn failing_agents(
    server: &Server,
    dir: &Path,
    job: &str,
    run_for: &str,
    fail_after: &str,
    agent_metrics: &[String],
) -> Vec<Agent> {
    agent_metrics
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let tag = format!("{job}-{i}");
            AgentCmd::c10d(&server.addr, job)
                .nnodes(2)
                .nproc(2)
                .max_restarts(2)
                .flag("--metrics-bind", addr)
                .recording(dir, &tag)
                .envs(&[
                    ("FAIL_RANKS", "3"),
                    ("FAIL_UNTIL", "1"),
                    ("RUN_FOR", run_for),
                    ("FAIL_AFTER", fail_after),
                ])
                .start(dir, &tag)
        })
        .collect()
}

#[test]
fn both_endpoints_count_a_failure_and_a_restart_while_the_job_runs() {
    let dir = scratch("metrics");
    let FailingJob {
        server,
        metrics,
        agents,
        agent_metrics,
        _ports,
    } = failing_job(&dir, "metrics-job", "6");

    // The server: one counted restart, two rounds, a failure by exit code,
    // the job running with both nodes, its restart budget.
    let text = until_sample(&metrics, "accel_rdzv_restarts_total{kind=\"failure\"}", 1.0);
    let _ = text;
    until_sample(&metrics, "accel_rdzv_rounds_formed_total", 2.0);
    // States are summed at most once a second: wait for one taken while
    // the second round runs.
    let text = poll_until("the states of the second round", LIMIT, || {
        let text = scrape(&metrics)?;
        let restarts = sample(&text, "accel_rdzv_job_restarts{rdzv_id=\"metrics-job\"}");
        let running = sample(&text, "accel_rdzv_jobs{phase=\"running\"}");
        match (restarts, running) {
            (Some(r), Some(j)) if r == 1.0 && j == 1.0 => Ok(text),
            other => Err(format!("{other:?}")),
        }
    });
    for (series, value) in [
        ("accel_rdzv_failures_total{kind=\"exit\"}", 1.0),
        ("accel_rdzv_restarts_total{kind=\"membership\"}", 0.0),
        ("accel_rdzv_jobs{phase=\"running\"}", 1.0),
        ("accel_rdzv_nodes{state=\"running\"}", 2.0),
        ("accel_rdzv_job_restarts{rdzv_id=\"metrics-job\"}", 1.0),
        (
            "accel_rdzv_job_restarts_remaining{rdzv_id=\"metrics-job\"}",
            1.0,
        ),
        ("accel_rdzv_rendezvous_duration_seconds_count", 1.0),
        ("accel_rdzv_reform_duration_seconds_count", 1.0),
        ("accel_rdzv_leader", 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    let joins = sample(&text, "accel_rdzv_rpcs_total{method=\"Join\",code=\"OK\"}");
    assert_eq!(joins, Some(2.0), "{text}");
    assert_eq!(http_get(&metrics, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(http_get(&metrics, "/healthz").map(|r| r.0), Some(200));

    // Each agent, while its second round runs: four workers started, the
    // restart, the time the failure cost, ready.
    let mut exits_3 = 0.0;
    for addr in &agent_metrics {
        let text = until_sample(addr, "accel_agent_worker_starts_total", 4.0);
        for (series, value) in [
            ("accel_agent_restarts_total{kind=\"failure\"}", 1.0),
            ("accel_agent_workers", 2.0),
            ("accel_agent_round", 1.0),
            ("accel_agent_round_formation_seconds_count", 2.0),
            ("accel_agent_recovery_seconds_count", 1.0),
        ] {
            assert_eq!(
                sample(&text, series),
                Some(value),
                "{series} at {addr}:\n{text}"
            );
        }
        exits_3 += sample(
            &text,
            "accel_agent_worker_exits_total{kind=\"exit\",code=\"3\"}",
        )
        .unwrap_or(0.0);
        let (code, body) = http_get(addr, "/readyz").expect("readyz answers");
        assert_eq!((code, body.as_str()), (200, "ready\n"), "{addr}");
    }
    assert_eq!(
        exits_3, 1.0,
        "rank 3's exit is counted once, by its own node"
    );

    // A worker of the second round SIGKILLed: a failure by signal (its
    // report's code, 128 + 9, is not taken for an exit code).
    let victim = accel_tests::records(&dir)
        .into_iter()
        .find(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "1")
        .expect("a worker of the second round");
    accel_tests::signal(victim.pid, "KILL");
    let text = until_sample(&metrics, "accel_rdzv_failures_total{kind=\"signal\"}", 1.0);
    assert_eq!(
        sample(&text, "accel_rdzv_failures_total{kind=\"exit\"}"),
        Some(1.0),
        "{text}"
    );

    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let text = until_sample(
        &metrics,
        "accel_rdzv_jobs_ended_total{kind=\"succeeded\"}",
        1.0,
    );
    assert_eq!(
        sample(&text, "accel_rdzv_jobs_ended_total{kind=\"failed\"}"),
        Some(0.0)
    );
    let _ = server;
}

#[test]
fn a_forming_node_is_alive_but_not_ready_and_says_why() {
    let dir = scratch("readyz");
    let server = Server::start();
    let port = Port::lease();
    let addr = port.loopback();
    let agent = AgentCmd::c10d(&server.addr, "readyz-job")
        .nnodes(2)
        .flag("--metrics-bind", &addr)
        .recording(&dir, "a")
        .start(&dir, "a");
    let why = poll_until("the lone node's /readyz", LIMIT, || {
        match http_get(&addr, "/readyz") {
            Some((503, body)) if body.contains("1 of 2 nodes ready") => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(why.starts_with("not ready: forming round 0: "), "{why}");
    assert_eq!(http_get(&addr, "/healthz").map(|r| r.0), Some(200));
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
}

#[test]
fn a_taken_metrics_port_is_a_start_up_error_naming_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Command::new(accel_tests::bin("rdzv-server"))
        .args(["--bind", "127.0.0.1:0", "--metrics-bind", &addr])
        .output()
        .expect("run rdzv-server");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen for metrics on {addr}")),
        "{err}"
    );
    assert!(
        err.contains("pick another --metrics-bind (or off)"),
        "{err}"
    );
    let out = AgentCmd::standalone()
        .flag("--metrics-bind", "localhost:1")
        .no_python("true", &[])
        .command()
        .output()
        .expect("run accel-agent");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not an address: write IP:PORT"), "{err}");
}

/// A Prometheus server on loopback scraping `targets` every second; its
/// data in `dir`. Stopped on drop.
struct Prometheus {
    child: Child,
    addr: String,
    /// Its web port, leased while it runs.
    _port: Port,
}

impl Prometheus {
    fn start(dir: &Path, server: &str, agents: &[String]) -> Self {
        let quoted = |t: &[String]| {
            t.iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n\
             \x20 - job_name: rdzv-server\n\
             \x20   static_configs: [{{targets: ['{server}']}}]\n\
             \x20 - job_name: accel-agent\n\
             \x20   static_configs: [{{targets: [{}]}}]\n",
            quoted(agents)
        );
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).expect("write prometheus.yml");
        let port = Port::lease();
        let addr = port.loopback();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus (scripts/setup.sh installs Debian's package)");
        Self {
            child,
            addr,
            _port: port,
        }
    }

    /// The value of an instant PromQL query that yields one sample.
    fn query(&self, promql: &str) -> Result<f64, String> {
        let (body, samples) = self.query_all(promql)?;
        match samples[..] {
            [one] => Ok(one),
            _ => Err(body),
        }
    }

    /// Every sample's value of an instant PromQL query (NaN for one that is
    /// not a number), with the answer's body.
    fn query_all(&self, promql: &str) -> Result<(String, Vec<f64>), String> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (code, body) = http_get(&self.addr, &format!("/api/v1/query?query={encoded}"))
            .ok_or("prometheus does not answer yet")?;
        if code != 200 {
            return Err(format!("HTTP {code}: {body}"));
        }
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let result = v["data"]["result"].as_array().ok_or_else(|| body.clone())?;
        let samples = result
            .iter()
            .map(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN)
            })
            .collect();
        Ok((body, samples))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_both_and_answers_promql() {
    let dir = scratch("prometheus");
    let FailingJob {
        server,
        metrics,
        agents,
        agent_metrics,
        _ports,
    } = failing_job(&dir, "prom-job", "10");
    let prometheus = Prometheus::start(&dir, &metrics, &agent_metrics);
    let query = |promql: &str, want: f64| {
        poll_until(
            &format!("PromQL {promql} = {want}"),
            LIMIT,
            || match prometheus.query(promql) {
                Ok(v) if v == want => Ok(()),
                Ok(v) => Err(format!("{v}")),
                Err(e) => Err(e),
            },
        )
    };
    // Every target is up, the restart and the failure are seen, across
    // both daemons.
    query("sum(up)", 3.0);
    query("accel_rdzv_restarts_total{kind=\"failure\"}", 1.0);
    query("sum(accel_agent_worker_exits_total{code=\"3\"})", 1.0);
    query("sum(accel_agent_restarts_total{kind=\"failure\"})", 2.0);
    query("sum(accel_agent_workers)", 4.0);
    query(
        "accel_rdzv_job_restarts_remaining{rdzv_id=\"prom-job\"}",
        1.0,
    );
    query("count(accel_agent_recovery_seconds_count > 0)", 2.0);
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    query("accel_rdzv_jobs_ended_total{kind=\"succeeded\"}", 1.0);
    drop(prometheus);
    let _ = server;
}

#[test]
fn json_logs_and_json_status_for_pipelines() {
    // The agent's own lines, one JSON object each.
    let out = AgentCmd::standalone()
        .flag("--log-format", "json")
        .env("ACCEL_LOG", "info")
        .no_python("true", &[])
        .command()
        .output()
        .expect("run accel-agent");
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty(), "the agent logged nothing");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{line}"
        );
    }
    assert!(err.contains("job succeeded"), "{err}");

    // The server's status, as one document.
    let dir = scratch("status-json");
    let server = Server::start();
    let agent = AgentCmd::c10d(&server.addr, "json-job")
        .nnodes(2)
        .recording(&dir, "a")
        .start(&dir, "a");
    let doc = poll_until("a forming job in status --json", LIMIT, || {
        let out = Command::new(accel_tests::bin("rdzv-server"))
            .args(["status", "--json", "--rdzv-endpoint", &server.addr])
            .output()
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))?;
        match v["jobs"].as_array().map(Vec::len) {
            Some(1) => Ok(v),
            _ => Err(v.to_string()),
        }
    });
    let job = &doc["jobs"][0];
    assert_eq!(job["job_id"], "json-job");
    assert_eq!(job["phase"], "forming");
    assert_eq!(job["node_count"], 1);
    assert!(job["nodes"][0]["node_rank"].is_null(), "{doc}");
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
    // A server that is not there: the cause, not just "transport error".
    // The port is leased, so nothing listens on it meanwhile.
    let nobody = Port::lease();
    let out = Command::new(accel_tests::bin("rdzv-server"))
        .args(["status", "--json", "--rdzv-endpoint", &nobody.loopback()])
        .output()
        .expect("run status");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connection refused"), "{err}");
}

/// A connection to `addr` from the loopback address `127.0.0.<from>`.
fn connect_from(from: u8, addr: &str) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        s.bind(std::net::SocketAddr::from(([127, 0, 0, from], 0)))
            .expect("bind");
        let s = s
            .connect(addr.parse().expect("addr"))
            .await
            .expect("connect");
        let s = s.into_std().expect("std");
        // tokio's streams are non-blocking; the test reads and writes plainly.
        s.set_nonblocking(false).expect("blocking");
        s
    })
}

/// `GET /readyz` from `127.0.0.<from>`: the status line, or why none.
fn readyz_from(from: u8, addr: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = connect_from(from, addr);
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out);
    text.lines()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| "closed without an answer".to_owned())
}

#[test]
fn readyz_answers_while_sixteen_addresses_hold_every_metrics_connection_idle() {
    let dir = scratch("readyz-crowded");
    let server = Server::start();
    let server_metrics = server.metrics.clone().expect("the server serves metrics");
    let port = Port::lease();
    let agent_metrics = port.loopback();
    let agent = AgentCmd::standalone()
        .nproc(1)
        .flag("--metrics-bind", &agent_metrics)
        .no_python("sleep", &["120"])
        .start(&dir, "agent");
    for addr in [&server_metrics, &agent_metrics] {
        poll_until(&format!("{addr} ready"), LIMIT, || {
            match http_get(addr, "/readyz") {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        // 16 addresses × 4 connections that never send a request: every
        // place the endpoint has.
        let idle: Vec<std::net::TcpStream> = (1..=16u8)
            .flat_map(|from| (0..4).map(move |_| from))
            .map(|from| connect_from(from, addr))
            .collect();
        // Every idle connection accepted (none left in the listener's
        // queue) before the probes: they find every place taken.
        poll_until(
            &format!("{addr} accepted the idle connections"),
            LIMIT,
            || match accept_queue(addr) {
                Some(0) => Ok(()),
                other => Err(format!("accept queue {other:?}")),
            },
        );
        // Probes from a crowding address and from a new one are answered,
        // again and again (each takes an idle connection's place).
        for round in 0..5u8 {
            for from in [1, 17 + round] {
                let status = readyz_from(from, addr)
                    .unwrap_or_else(|e| panic!("/readyz at {addr} from 127.0.0.{from}: {e}"));
                assert_eq!(status, "HTTP/1.1 200 OK", "{addr} from 127.0.0.{from}");
            }
        }
        drop(idle);
    }
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
    drop(server);
}

/// The Grafana dashboard (`deploy/grafana/accel.json`): well formed, and
/// every query of every panel returns data (a number, not only NaN) from a
/// real Prometheus scraping a server and two agents while a job that failed
/// once runs again.
#[test]
fn every_grafana_panel_s_query_returns_data_for_a_running_job() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/accel.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut exprs = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "id repeated: {p}"
        );
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().expect("x"), g["w"].as_u64().expect("w"));
        assert!(x + w <= 24 && g["h"].as_u64().is_some(), "{title}: {g}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            p["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            // The variables as Grafana fills them: every job, a window of a minute.
            let expr = expr
                .replace("$rdzv_id", ".*")
                .replace("$__rate_interval", "1m");
            exprs.push((title.to_owned(), expr));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());

    let dir = scratch("grafana");
    let server = Server::start();
    let metrics = server.metrics.clone().expect("the server serves metrics");
    let ports: Vec<Port> = (0..2).map(|_| Port::lease()).collect();
    let agent_metrics: Vec<String> = ports.iter().map(Port::loopback).collect();
    // Prometheus first, so that it sees the first round form.
    let prometheus = Prometheus::start(&dir, &metrics, &agent_metrics);
    poll_until("Prometheus scrapes the server", LIMIT, || match prometheus
        .query("sum(up{job=\"rdzv-server\"})")
    {
        Ok(1.0) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    // The failure comes 3 s in, once Prometheus scrapes the agents too:
    // the recovery it times is an increase Prometheus sees. The job runs
    // past the poll's limit (it is stopped once every query answered): an
    // ended job's series go stale, and under load the poll may need all of
    // its time.
    let agents = failing_agents(&server, &dir, "grafana-job", "90", "3", &agent_metrics);
    // Each query is asked again until it has answered with data once while
    // the job runs (a rate needs two scrapes; the restart comes 3 s in).
    let mut answered = std::collections::BTreeSet::new();
    poll_until("every panel's query returns data", LIMIT, || {
        let mut empty = Vec::new();
        for (i, (title, expr)) in exprs.iter().enumerate() {
            if answered.contains(&i) {
                continue;
            }
            match prometheus.query_all(expr) {
                Ok((_, v)) if v.iter().any(|x| x.is_finite()) => {
                    answered.insert(i);
                }
                Ok((body, _)) => empty.push(format!("{title}: {expr} -> {body}")),
                Err(e) => empty.push(format!("{title}: {expr} -> {e}")),
            }
        }
        match empty.is_empty() {
            true => Ok(()),
            false => Err(empty.join("\n")),
        }
    });
    for a in agents {
        a.signal("TERM");
        let _ = a.wait(LIMIT);
    }
    drop(prometheus);
}

/// The alert rules (`deploy/prometheus/accel.rules.yml`) pass `promtool
/// check rules` and their unit tests (`promtool test rules`), and every
/// series they name is one a running server (the `accel-server` group) or
/// agent (`accel-agents`) exposes: a server with a forming job (so its
/// per-job series exist) and that job's agent.
#[test]
fn alert_rules_pass_promtool_and_name_series_the_server_and_agents_expose() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    for args in [
        &["check", "rules", "accel.rules.yml"][..],
        &["test", "rules", "accel.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&rules)
            .output()
            .expect("promtool (Debian's prometheus package, installed by scripts/setup.sh)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(rules.join("accel.rules.yml")).expect("rules");
    let mut names: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("accel_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    let dir = scratch("alert-series");
    let server = Server::start();
    let port = Port::lease();
    let agent_metrics = port.loopback();
    let agent = AgentCmd::c10d(&server.addr, "alert-series")
        .nnodes(2)
        .flag("--metrics-bind", &agent_metrics)
        .recording(&dir, "a")
        .start(&dir, "a");
    let exposes = |exposition: &str, name: &str| {
        exposition.lines().any(|l| {
            l.starts_with(&format!("{name}{{"))
                || l.starts_with(&format!("{name} "))
                || l.starts_with(&format!("# TYPE {name} "))
        })
    };
    // The forming job's gauge is there once the agent joined.
    let server_text = poll_until("the forming job's series", LIMIT, || {
        let text = scrape(server.metrics.as_deref().expect("metrics"))?;
        match text.contains("accel_rdzv_job_forming_seconds{rdzv_id=\"alert-series\"}") {
            true => Ok(text),
            false => Err(text),
        }
    });
    let agent_text = poll_until("the agent's metrics", LIMIT, || scrape(&agent_metrics));
    for name in names {
        let (who, text) = match name.starts_with("accel_agent_") {
            true => ("accel-agent", &agent_text),
            false => ("rdzv-server", &server_text),
        };
        assert!(
            exposes(text, name),
            "{name} is not a series {who} exposes:\n{text}"
        );
    }
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
}
