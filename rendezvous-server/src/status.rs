//! The client subcommands of `rdzv-server`: `status` asks a running server
//! for its jobs and prints them; `quarantine list|release` shows and ends
//! quarantines; `stacks` prints a job's stacks, grouped.

use std::fmt::Write as _;
use std::time::Duration;

use accel_proto::v1 as pb;
use pb::rendezvous_client::RendezvousClient;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::config::{ClientArgs, Command, QuarantineAction};
use accel_rdzv_client::EndpointError;
use accel_wire::auth::{client_token, AttachToken, Token};
use accel_wire::tls::ClientTlsFiles;

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The endpoint is not a `HOST:PORT`.
    #[error("'{0}' is not a rendezvous endpoint; give HOST:PORT")]
    BadEndpoint(String),
    /// The server could not be reached.
    #[error("cannot reach the rendezvous at {endpoint}: {cause}; is rdzv-server running there?")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause, with its sources.
        cause: String,
    },
    /// A TLS file cannot be used.
    #[error(transparent)]
    Tls(#[from] accel_wire::tls::TlsError),
    /// The server answered with an error.
    #[error("the rendezvous at {endpoint} answered: {message}")]
    Call {
        /// The endpoint.
        endpoint: String,
        /// Its message.
        message: String,
    },
}

use accel_wire::error_chain;

/// The error of a call the server at `endpoint` answered with `status`.
fn answered(endpoint: &str) -> impl Fn(tonic::Status) -> StatusError + '_ {
    move |s| {
        StatusError::Call {
        endpoint: endpoint.to_owned(),
        message: match s.code() {
            tonic::Code::Unauthenticated => format!(
                "{}; give this command --token-file PATH (or ACCEL_RDZV_TOKEN / RDZV_TOKEN) with that token",
                s.message()
            ),
            _ => s.message().to_owned(),
        },
    }
    }
}

/// A client of the server at `endpoint`.
async fn connect(
    endpoint: &str,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<RendezvousClient<InterceptedService<Channel, AttachToken>>, StatusError> {
    let bad = || StatusError::BadEndpoint(endpoint.to_owned());
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let ep = accel_rdzv_client::endpoint(host, port, tls).map_err(|e| match e {
        EndpointError::Invalid(_) => bad(),
        EndpointError::Tls(e) => StatusError::Tls(e),
        EndpointError::TlsConfig(e) => StatusError::Connect {
            endpoint: endpoint.to_owned(),
            cause: error_chain(&e),
        },
        e => StatusError::Connect {
            endpoint: endpoint.to_owned(),
            cause: error_chain(&e),
        },
    })?;
    let channel = ep
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| StatusError::Connect {
            endpoint: endpoint.to_owned(),
            cause: error_chain(&e),
        })?;
    Ok(RendezvousClient::with_interceptor(
        channel,
        AttachToken::new(token),
    ))
}

/// The status of every job (or of `job`) at `endpoint`; every page of a
/// server with many jobs is fetched.
pub async fn fetch(
    endpoint: &str,
    job: Option<&str>,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<Vec<pb::JobInfo>, StatusError> {
    fetch_all(endpoint, job, token, tls)
        .await
        .map(|(jobs, _)| jobs)
}

/// [`fetch`], and the torchft lighthouse if the server serves one.
pub async fn fetch_all(
    endpoint: &str,
    job: Option<&str>,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<(Vec<pb::JobInfo>, Option<pb::LighthouseStatus>), StatusError> {
    let mut client = connect(endpoint, token, tls).await?;
    let mut lighthouse = None;
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let mut request = tonic::Request::new(pb::JobStatusRequest {
            job_id: job.unwrap_or_default().to_owned(),
            page_size: 0,
            page_token,
        });
        request.set_timeout(Duration::from_secs(10));
        let page = client
            .job_status(request)
            .await
            .map_err(answered(endpoint))?
            .into_inner();
        jobs.extend(page.jobs);
        lighthouse = lighthouse.or(page.lighthouse);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok((jobs, lighthouse))
}

/// The lighthouse in words: `lighthouse (torchft): quorum N of K groups
/// (ID step S, ...), formed T s ago; H healthy, W waiting[: why]`.
pub fn render_lighthouse(l: &pb::LighthouseStatus) -> String {
    let members: Vec<String> = l
        .members
        .iter()
        .map(|m| format!("{} step {}", m.replica_id, m.step))
        .collect();
    let formed = match l.since_quorum_ms {
        Some(ms) => format!("formed {:.1} s ago", ms as f64 / 1000.0),
        None => "no quorum yet".into(),
    };
    let waiting = match l.waiting_reason.is_empty() {
        true => format!("{} waiting", l.waiting),
        false => format!("{} waiting: {}", l.waiting, l.waiting_reason),
    };
    format!(
        "lighthouse (torchft): quorum {} of {} group(s) ({}), {formed}; {} healthy, {waiting}\n",
        l.quorum_id,
        l.members.len(),
        members.join(", "),
        l.healthy
    )
}

/// The lighthouse as JSON (`rdzv-server status --json`'s `"lighthouse"`).
pub fn lighthouse_json(l: &pb::LighthouseStatus) -> serde_json::Value {
    serde_json::json!({
        "quorum_id": l.quorum_id,
        "members": l.members.iter().map(|m| serde_json::json!({"replica_id": m.replica_id, "step": m.step, "world_size": m.world_size})).collect::<Vec<_>>(),
        "since_quorum_ms": l.since_quorum_ms,
        "healthy": l.healthy,
        "waiting": l.waiting,
        "waiting_reason": l.waiting_reason,
    })
}

/// The jobs as one JSON document (`rdzv-server status --json`):
/// `{"jobs": [{"job_id", "phase", "round", "restart_count", "max_restarts",
/// "min_nodes", "max_nodes", "node_count", "last_failure", "nodes": [{"node_id",
/// "hostname", "node_rank", "state", "topology"}], "root_cause": {"host", "rank",
/// "local_rank", "exitcode", "pid", "timestamp", "error_file", "message"},
/// "stacks_unix_ms", "world_size", "timeline": [{"unix_ms", "kind", "round", "nnodes",
/// "world_size", "reason"}]}]}` (each node also has "last_seen_ms"); a node without a rank has `"node_rank": null`, an
/// empty `last_failure`, a job without a failure's `root_cause` and one
/// without kept stacks' `stacks_unix_ms` are `null`.
pub fn render_json(jobs: &[pb::JobInfo]) -> String {
    let mut out = serde_json::json!({ "jobs": jobs_json(jobs) }).to_string();
    out.push('\n');
    out
}

/// Each job of [`render_json`]'s document.
pub fn jobs_json(jobs: &[pb::JobInfo]) -> Vec<serde_json::Value> {
    jobs.iter()
        .map(|j| {
            let nodes: Vec<serde_json::Value> = j
                .nodes
                .iter()
                .map(|n| {
                    serde_json::json!({
                        "node_id": n.node_id,
                        "hostname": n.hostname,
                        "node_rank": n.node_rank,
                        "state": n.state,
                        "topology": n.topology,
                        "last_seen_ms": n.last_seen_ms,
                    })
                })
                .collect();
            serde_json::json!({
                "job_id": j.job_id,
                "phase": j.phase,
                "round": j.round,
                "restart_count": j.restart_count,
                "max_restarts": j.max_restarts,
                "min_nodes": j.min_nodes,
                "max_nodes": j.max_nodes,
                "node_count": j.node_count,
                "last_failure": (!j.last_failure.is_empty()).then_some(&j.last_failure),
                "nodes": nodes,
                "root_cause": j.root_cause.as_ref().map(|f| serde_json::json!({
                    "host": f.host,
                    "rank": f.rank,
                    "local_rank": f.local_rank,
                    "exitcode": f.exitcode,
                    "pid": f.pid,
                    "timestamp": f.timestamp,
                    "error_file": f.error_file,
                    "message": f.message,
                })),
                "stacks_unix_ms": j.stacks_unix_ms,
                "world_size": j.world_size,
                "step": j.step,
                "best_step": j.best_step,
                "no_progress_restarts": j.no_progress_restarts,
                "goodput": j.goodput.as_ref().map(goodput_json),
                "hang_timeout_ms": j.hang_timeout_ms,
                "stragglers": j.stragglers.iter().map(|s| serde_json::json!({
                    "rank": s.rank,
                    "host": s.host,
                    "node_id": s.node_id,
                    "step_us": s.step_us,
                    "median_us": s.median_us,
                })).collect::<Vec<_>>(),
                "timeline": j.timeline.iter().map(|e| serde_json::json!({
                    "unix_ms": e.unix_ms,
                    "kind": e.kind,
                    "round": e.round,
                    "nnodes": e.nnodes,
                    "world_size": e.world_size,
                    "reason": (!e.reason.is_empty()).then_some(&e.reason),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// A job's [`pb::Goodput`] for `--json`: seconds per category, their sum
/// (`wall_s`), and each kept restart's cost.
fn goodput_json(g: &pb::Goodput) -> serde_json::Value {
    let s = |ms: u64| ms as f64 / 1000.0;
    serde_json::json!({
        "productive_s": s(g.productive_ms),
        "recomputation_s": s(g.recomputation_ms),
        "recovery_s": s(g.recovery_ms),
        "start_up_s": s(g.start_up_ms),
        "waiting_s": s(g.waiting_ms),
        "wall_s": s(g.wall_ms()),
        "goodput_percent": g.percent(),
        "now": (!g.now.is_empty()).then_some(&g.now),
        "restarts": g.restarts,
        "lost_steps": g.lost_steps,
        "losses": g.losses.iter().map(|l| serde_json::json!({
            "round": l.round,
            "unix_ms": l.unix_ms,
            "cause": l.cause,
            "step": l.step,
            "checkpoint": l.checkpoint,
            "lost_steps": l.lost_steps,
            "recovery_s": s(l.recovery_ms),
            "recomputation_s": s(l.recomputation_ms),
        })).collect::<Vec<_>>(),
        "segments": g.segments.iter().map(|x| serde_json::json!({
            "category": x.category,
            "unix_ms": x.unix_ms,
            "ms": x.ms,
        })).collect::<Vec<_>>(),
    })
}

/// A straggler, in words.
fn straggler_line(s: &pb::Straggler) -> String {
    let ms = |us: u64| accel_proto::goodput::short(us / 1000);
    format!(
        "straggler: rank {} on host '{}' takes {:.2}x the job's median step ({} against {})",
        s.rank,
        s.host,
        s.step_us as f64 / s.median_us.max(1) as f64,
        ms(s.step_us),
        ms(s.median_us)
    )
}

/// What the job's last restart cost, in words.
fn loss_line(l: &pb::Loss) -> String {
    use accel_proto::goodput::short;
    let mut out = format!(
        "restart of round {} cost {} recovery",
        l.round,
        short(l.recovery_ms)
    );
    if l.lost_steps > 0 || l.recomputation_ms > 0 {
        let _ = write!(out, " + {} recomputation", short(l.recomputation_ms));
    }
    match (l.checkpoint, l.step) {
        (_, Some(step)) if l.lost_steps > 0 => {
            let from = l.checkpoint.unwrap_or(0);
            let _ = write!(out, " ({} steps, {from}->{step})", l.lost_steps);
        }
        (Some(c), Some(step)) => {
            let _ = write!(out, " (at step {step}, checkpoint {c})");
        }
        _ => {}
    }
    let _ = write!(out, ": {}", l.cause);
    out
}

/// One block per job: a summary line, then one line per node.
pub fn render(jobs: &[pb::JobInfo]) -> String {
    let mut out = String::new();
    if jobs.is_empty() {
        out.push_str("no jobs\n");
    }
    for j in jobs {
        let nnodes = if j.min_nodes == j.max_nodes {
            j.max_nodes.to_string()
        } else {
            format!("{}:{}", j.min_nodes, j.max_nodes)
        };
        let _ = writeln!(
            out,
            "job {}  phase {}  round {}  restarts {}/{}  nnodes {}  members {}  world {}",
            j.job_id,
            j.phase,
            j.round,
            j.restart_count,
            j.max_restarts,
            nnodes,
            j.node_count,
            j.world_size
        );
        if j.step.is_some() || j.best_step.is_some() {
            let at = |s: Option<u64>| s.map_or_else(|| "-".to_owned(), |s| s.to_string());
            let _ = write!(
                out,
                "  step {}  best before {}",
                at(j.step),
                at(j.best_step)
            );
            if j.no_progress_restarts > 0 {
                let _ = write!(
                    out,
                    "  ({} restarts without passing it)",
                    j.no_progress_restarts
                );
            }
            if let Some(ms) = j.hang_timeout_ms {
                let _ = write!(
                    out,
                    "  hang timeout {} (learned)",
                    accel_proto::goodput::short(ms)
                );
            }
            out.push('\n');
        }
        for s in &j.stragglers {
            let _ = writeln!(out, "  {}", straggler_line(s));
        }
        if let Some(g) = &j.goodput {
            if g.wall_ms() > 0 {
                let _ = writeln!(out, "  {}", g.line());
            }
            if let Some(l) = g.losses.last() {
                let _ = writeln!(out, "  last {}", loss_line(l));
            }
        }
        let now = accel_wire::time::unix_ms(std::time::SystemTime::now());
        for e in j.timeline.iter().rev().take(3).rev() {
            let ago =
                accel_input::duration_words(Duration::from_millis(now.saturating_sub(e.unix_ms)));
            let what = match e.kind.as_str() {
                "formed" => format!(
                    "round {} formed: {} nodes, {} workers",
                    e.round, e.nnodes, e.world_size
                ),
                "restart" => format!("round {} restarted: {}", e.round, e.reason),
                "re-form" => format!("round {} re-formed: {}", e.round, e.reason),
                other => format!(
                    "round {} {other}{}{}",
                    e.round,
                    if e.reason.is_empty() { "" } else { ": " },
                    e.reason
                ),
            };
            let _ = writeln!(out, "  {ago} ago: {what}");
        }
        if !j.last_failure.is_empty() {
            let _ = writeln!(out, "  last failure: {}", j.last_failure);
        }
        for n in &j.nodes {
            let rank = n
                .node_rank
                .map_or_else(|| "-".to_owned(), |r| r.to_string());
            let _ = write!(
                out,
                "  node {}  host {}  rank {}  {}",
                n.node_id, n.hostname, rank, n.state
            );
            if !n.topology.is_empty() {
                let _ = write!(out, "  topology {}", n.topology);
            }
            out.push('\n');
        }
        let unlisted = (j.node_count as usize).saturating_sub(j.nodes.len());
        if unlisted > 0 {
            let _ = writeln!(out, "  ... and {unlisted} more nodes");
        }
    }
    out
}

/// Asks the server at `endpoint` for its quarantined hosts (of `job`, or
/// all), after releasing `release` if given.
pub async fn quarantine(
    endpoint: &str,
    job: Option<&str>,
    release: Option<&str>,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<pb::QuarantineResponse, StatusError> {
    let mut client = connect(endpoint, token, tls).await?;
    let mut request = tonic::Request::new(pb::QuarantineRequest {
        job_id: job.unwrap_or_default().to_owned(),
        release: release.unwrap_or_default().to_owned(),
    });
    request.set_timeout(Duration::from_secs(10));
    Ok(client
        .quarantine(request)
        .await
        .map_err(answered(endpoint))?
        .into_inner())
}

/// Asks the server at `endpoint` for the grouped stacks of `job`'s workers,
/// waiting at most `timeout` for its nodes.
pub async fn stacks(
    endpoint: &str,
    job: &str,
    native: bool,
    timeout: Duration,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<pb::StacksResponse, StatusError> {
    let mut client = connect(endpoint, token, tls).await?;
    let timeout = timeout.clamp(crate::stacks::MIN_TIMEOUT, crate::stacks::MAX_TIMEOUT);
    let mut request = tonic::Request::new(pb::StacksRequest {
        job_id: job.to_owned(),
        native,
        timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
        ..Default::default()
    });
    // The server answers by its own deadline; this one is for a server
    // that went away.
    request.set_timeout(timeout + Duration::from_secs(10));
    Ok(client
        .stacks(request)
        .await
        .map_err(answered(endpoint))?
        .into_inner())
}

/// The quarantined hosts, one line each (`rdzv-server quarantine list`).
pub fn render_quarantine(hosts: &[pb::QuarantinedHost]) -> String {
    let mut out = String::new();
    if hosts.is_empty() {
        out.push_str("no quarantined hosts\n");
    }
    for h in hosts {
        let job = if h.job_id.is_empty() { "*" } else { &h.job_id };
        let left = accel_input::duration_words(Duration::from_secs(h.left_ms.div_ceil(1000)));
        let _ = writeln!(
            out,
            "host {}  job {}  {} left  {}",
            h.host, job, left, h.reason
        );
    }
    out
}

/// The same as one JSON document: `{"hosts": [{"host", "job_id" (null:
/// every job), "reason", "since_ms", "left_ms"}]}`.
pub fn render_quarantine_json(hosts: &[pb::QuarantinedHost]) -> String {
    let hosts: Vec<serde_json::Value> = hosts
        .iter()
        .map(|h| {
            serde_json::json!({
                "host": h.host,
                "job_id": (!h.job_id.is_empty()).then_some(&h.job_id),
                "reason": h.reason,
                "since_ms": h.since_ms,
                "left_ms": h.left_ms,
            })
        })
        .collect();
    let mut out = serde_json::json!({ "hosts": hosts }).to_string();
    out.push('\n');
    out
}

/// Runs a client subcommand; `Ok`: what to print.
pub async fn run(
    command: &Command,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let reach = |c: &ClientArgs| {
        let tls = ClientTlsFiles {
            ca: c.tls_ca.clone(),
            cert: c.tls_cert.clone(),
            key: c.tls_key.clone(),
        }
        .or_env(env);
        let token = client_token(c.token_file.as_deref(), env).map_err(|e| e.to_string())?;
        Ok::<_, String>((token, tls))
    };
    match command {
        Command::Status { client, job, json } => {
            let (token, tls) = reach(client)?;
            let (jobs, lighthouse) =
                fetch_all(&client.endpoint, job.as_deref(), token.as_ref(), &tls)
                    .await
                    .map_err(|e| e.to_string())?;
            Ok(match (json, lighthouse) {
                (true, None) => render_json(&jobs),
                (true, Some(l)) => {
                    let mut doc = serde_json::json!({ "jobs": jobs_json(&jobs) });
                    doc["lighthouse"] = lighthouse_json(&l);
                    doc.to_string() + "\n"
                }
                (false, None) => render(&jobs),
                (false, Some(l)) => render_lighthouse(&l) + &render(&jobs),
            })
        }
        Command::Stacks {
            job,
            client,
            native,
            timeout,
            json,
        } => {
            let (token, tls) = reach(client)?;
            let r = stacks(
                &client.endpoint,
                job,
                *native,
                *timeout,
                token.as_ref(),
                &tls,
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok(match json {
                true => crate::stacks::render_json(job, &r),
                false => accel_wire::stacks::render(job, &r),
            })
        }
        Command::Quarantine {
            action: QuarantineAction::List { client, job, json },
        } => {
            let (token, tls) = reach(client)?;
            let r = quarantine(&client.endpoint, job.as_deref(), None, token.as_ref(), &tls)
                .await
                .map_err(|e| e.to_string())?;
            Ok(match json {
                true => render_quarantine_json(&r.hosts),
                false => render_quarantine(&r.hosts),
            })
        }
        Command::Quarantine {
            action: QuarantineAction::Release { host, client, job },
        } => {
            let (token, tls) = reach(client)?;
            let r = quarantine(
                &client.endpoint,
                job.as_deref(),
                Some(host),
                token.as_ref(),
                &tls,
            )
            .await
            .map_err(|e| e.to_string())?;
            Ok(format!(
                "released host {host} ({} quarantine{}); its nodes may take part in the next round\n",
                r.released,
                if r.released == 1 { "" } else { "s" }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field_and_nulls_for_absent_ones() {
        let jobs = vec![pb::JobInfo {
            job_id: "j\"1".into(),
            phase: "running".into(),
            round: 2,
            restart_count: 1,
            max_restarts: 3,
            min_nodes: 1,
            max_nodes: 2,
            node_count: 2,
            last_failure: String::new(),
            root_cause: Some(pb::Failure {
                host: "h2".into(),
                rank: 3,
                exitcode: -9,
                message: "FileTimer 'step' expired".into(),
                ..Default::default()
            }),
            stacks_unix_ms: None,
            world_size: 4,
            step: Some(41),
            best_step: Some(40),
            no_progress_restarts: 1,
            hang_timeout_ms: Some(1500),
            stragglers: vec![pb::Straggler {
                rank: 3,
                host: "h2".into(),
                node_id: "b".into(),
                step_us: 140_000,
                median_us: 100_000,
            }],
            goodput: Some(pb::Goodput {
                productive_ms: 50_000,
                recovery_ms: 2_500,
                recomputation_ms: 5_000,
                restarts: 1,
                lost_steps: 5,
                losses: vec![pb::Loss {
                    round: 0,
                    step: Some(35),
                    checkpoint: Some(30),
                    lost_steps: 5,
                    recovery_ms: 2_500,
                    recomputation_ms: 5_000,
                    cause: "worker rank 3 failed".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            timeline: vec![
                pb::TimelineEvent {
                    unix_ms: 1_000,
                    kind: "formed".into(),
                    round: 1,
                    nnodes: 2,
                    world_size: 4,
                    reason: String::new(),
                },
                pb::TimelineEvent {
                    unix_ms: 2_000,
                    kind: "restart".into(),
                    round: 1,
                    reason: "worker rank 3 failed".into(),
                    ..Default::default()
                },
            ],
            nodes: vec![
                pb::NodeStatus {
                    node_id: "a".into(),
                    hostname: "h1".into(),
                    node_rank: Some(0),
                    state: "running".into(),
                    topology: "rack-1".into(),
                    last_seen_ms: 1200,
                },
                pb::NodeStatus {
                    node_id: "b".into(),
                    hostname: "h2".into(),
                    node_rank: None,
                    state: "spare".into(),
                    topology: String::new(),
                    last_seen_ms: 0,
                },
            ],
        }];
        let v: serde_json::Value = serde_json::from_str(&render_json(&jobs)).expect("json");
        let j = &v["jobs"][0];
        assert_eq!(j["job_id"], "j\"1");
        assert_eq!(j["restart_count"], 1);
        assert!(j["last_failure"].is_null());
        assert_eq!(j["root_cause"]["rank"], 3);
        assert_eq!(j["root_cause"]["exitcode"], -9);
        assert_eq!(j["root_cause"]["message"], "FileTimer 'step' expired");
        assert!(j["stacks_unix_ms"].is_null());
        assert_eq!(j["world_size"], 4);
        assert_eq!(j["nodes"][0]["last_seen_ms"], 1200);
        assert_eq!(j["timeline"][0]["kind"], "formed");
        assert!(j["timeline"][0]["reason"].is_null());
        assert_eq!(j["timeline"][1]["reason"], "worker rank 3 failed");
        let text = render(&jobs);
        assert!(text.contains("members 2  world 4"), "{text}");
        assert!(
            text.contains(" ago: round 1 formed: 2 nodes, 4 workers"),
            "{text}"
        );
        assert!(
            text.contains(" ago: round 1 restarted: worker rank 3 failed"),
            "{text}"
        );
        assert_eq!(j["nodes"][0]["node_rank"], 0);
        assert_eq!(j["nodes"][0]["topology"], "rack-1");
        assert!(j["nodes"][1]["node_rank"].is_null());
        assert_eq!(render_json(&[]), "{\"jobs\":[]}\n");
        assert_eq!(j["goodput"]["wall_s"], 57.5);
        assert_eq!(j["hang_timeout_ms"], 1500);
        assert!(text.contains("  hang timeout 1.5s (learned)\n"), "{text}");
        assert!(
            text.contains("  straggler: rank 3 on host 'h2' takes 1.40x the job's median step (140ms against 100ms)\n"),
            "{text}"
        );
        assert_eq!(j["stragglers"][0]["host"], "h2");
        assert_eq!(j["goodput"]["losses"][0]["lost_steps"], 5);
        assert!(j["goodput"]["now"].is_null());
        assert!(
            text.contains("  goodput 87.0 % of 57.5s: productive 50.0s, recomputation 5.0s (5 steps), recovery 2.5s (1 restart)\n"),
            "{text}"
        );
        assert!(
            text.contains("  last restart of round 0 cost 2.5s recovery + 5.0s recomputation (5 steps, 30->35): worker rank 3 failed\n"),
            "{text}"
        );
    }

    #[test]
    fn the_lighthouse_is_said_in_one_line_and_in_json() {
        let l = pb::LighthouseStatus {
            quorum_id: 42,
            members: vec![pb::LighthouseMember {
                replica_id: "g0:u".into(),
                step: 7,
                world_size: 2,
            }],
            since_quorum_ms: Some(1500),
            healthy: 2,
            waiting: 1,
            waiting_reason: "1 of 2 healthy replica groups asked for a quorum; more than half must"
                .into(),
        };
        assert_eq!(
            render_lighthouse(&l),
            "lighthouse (torchft): quorum 42 of 1 group(s) (g0:u step 7), formed 1.5 s ago; 2 healthy, 1 waiting: 1 of 2 healthy replica groups asked for a quorum; more than half must\n"
        );
        let v = lighthouse_json(&l);
        assert_eq!(
            (v["quorum_id"].as_i64(), v["members"][0]["step"].as_i64()),
            (Some(42), Some(7))
        );
        let none = pb::LighthouseStatus::default();
        assert!(render_lighthouse(&none).contains("no quorum yet"));
        assert!(lighthouse_json(&none)["since_quorum_ms"].is_null());
    }
}
