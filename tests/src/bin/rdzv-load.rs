//! Load generator: N simulated agents complete one rendezvous round against
//! one `rdzv-server`, from this one process.
//!
//! Each simulated agent does what `accel-agent` does up to starting workers:
//! open its `Join` stream, wait for `Joined`, call `Ready`, wait for its
//! `RoundComplete`. Agents share HTTP/2 connections, 100 per connection.
//! Prints, per N: wall time from the first join to the last node's
//! `RoundComplete`, and the server's CPU time (from /proc) per node.
//!
//! Usage: rdzv-load --endpoint HOST:PORT --server-pid PID [--agents 100,1000,10000]
//!        [--token-file PATH]   (the server's token, sent with every call)
//!        [--tls-ca PEM [--tls-cert PEM --tls-key PEM]]   (TLS, mutual with a certificate)
//!        [--label TEXT] [--no-header] [--jobs J]   (split the agents into J jobs)
//!        [--per-connection K]   (agents per HTTP/2 connection, default 100)
//!        [--hold SECONDS]   (keep every node connected this long after measuring,
//!                            e.g. to profile the server in that state)
//!        [--topology]   (each agent joins with a topology path: zones of 4,096
//!                        nodes, racks of 64, NVLink domains of 16)
//!        [--keep-alives K [--progress]]   (then every agent sends K keep-alives,
//!                        vouching for its whole round, with its workers'
//!                        progress: the server's CPU per keep-alive is printed
//!                        on a line of its own)
//! The peak-RSS column is the server's high-water mark since it started minus
//! its RSS before this size: exact for a server that serves one size.

use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use accel_wire::auth::AttachToken;
use accel_wire::auth::Token;
use pb::event::Kind;
use pb::rendezvous_client::RendezvousClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

type Client = RendezvousClient<InterceptedService<Channel, AttachToken>>;

/// Simulated agents sharing one HTTP/2 connection, unless `--per-connection`.
const PER_CONNECTION: usize = 100;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// One simulated agent; returns its event stream, still open (the node stays
/// connected, as a real agent does while its workers run).
/// A simulated agent in its running round.
struct Joined {
    events: tonic::Streaming<pb::Event>,
    client: Client,
    /// Its keep-alive, as a current agent sends it in the steady state.
    keep_alive: pb::KeepAliveRequest,
}

/// `k` keep-alives of one agent, one after the other, with its 8 workers'
/// progress (a step further each time) when `progress`.
async fn keep_alives(
    mut client: Client,
    mut req: pb::KeepAliveRequest,
    k: u32,
    progress: bool,
) -> Result<(), String> {
    for step in 1..=u64::from(k) {
        req.progress = progress.then(|| pb::Progress {
            round: req.round,
            ranks: 8,
            min_step: step * 100,
            max_step: step * 100 + 1,
            checkpoint_step: Some(step * 100 / 1000 * 1000),
            first_step_ms_ago: step * 5000,
            min_step_ms_ago: 10,
            hang_timeout_ms: 0,
            failing_step: None,
            rank_times: Vec::new(),
        });
        client
            .keep_alive(req.clone())
            .await
            .map_err(|s| s.to_string())?;
    }
    Ok(())
}

async fn agent(
    mut client: Client,
    job: String,
    i: usize,
    n: u32,
    topology: bool,
) -> Result<Joined, String> {
    let node_id = format!("load-{i}");
    let req = pb::JoinRequest {
        job_id: job.clone(),
        node_id: node_id.clone(),
        hostname: format!("host-{i:05}"),
        min_nodes: n,
        max_nodes: n,
        nproc_per_node: 8,
        max_restarts: 0,
        node_rank: None,
        dead_after_ms: 600_000,
        last_call_ms: 0,
        resume: None,
        session: Vec::new(),
        silent_replica: String::new(),
        topology: if topology {
            format!("zone-{}/rack-{}/nvl-{}", i / 4096, i / 64 % 64, i / 16 % 4)
        } else {
            String::new()
        },
        no_restart_exit_code: 0,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        // As a current agent says (it rides out outages).
        outage_ms: 900_000,
        keep_alive_ms: 200_000,
        started_unix_ms: 0,
        max_no_progress_restarts: 0,
        nnodes_multiple_of: 0,
        scale_up_settle_ms: 0,
    };
    let mut session = Vec::new();
    let mut events = client
        .join(req)
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    loop {
        match events
            .message()
            .await
            .map_err(|s| s.to_string())?
            .and_then(|e| e.kind)
        {
            Some(Kind::Joined(j)) => {
                session = j.session.clone();
                let ready = pb::ReadyRequest {
                    job_id: job.clone(),
                    node_id: node_id.clone(),
                    round: j.round,
                    master_addr: "10.0.0.1".into(),
                    master_port: 29500,
                    session: j.session.clone(),
                };
                client.ready(ready).await.map_err(|s| s.to_string())?;
            }
            Some(Kind::RoundComplete(r)) if r.nnodes == n => {
                return Ok(Joined {
                    events,
                    client,
                    keep_alive: pb::KeepAliveRequest {
                        job_id: job,
                        node_id,
                        session,
                        round: r.round,
                        vouch: Vec::new(),
                        vouch_all: true,
                        progress: None,
                    },
                })
            }
            Some(_) => {}
            None => return Err("stream ended".into()),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = arg("--endpoint").ok_or("--endpoint HOST:PORT is required")?;
    let server_pid = arg("--server-pid").ok_or("--server-pid PID is required")?;
    let sizes: Vec<u32> = arg("--agents")
        .unwrap_or_else(|| "100,1000,10000".into())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let token = arg("--token-file")
        .map(|f| Token::from_file(std::path::Path::new(&f)))
        .transpose()?;
    let tls = accel_wire::tls::ClientTlsFiles {
        ca: arg("--tls-ca").map(Into::into),
        cert: arg("--tls-cert").map(Into::into),
        key: arg("--tls-key").map(Into::into),
    };
    let label = arg("--label").unwrap_or_else(|| "plain".into());
    let jobs: u32 = arg("--jobs").map_or(Ok(1), |j| j.parse())?.max(1);
    let per_connection: usize = arg("--per-connection")
        .map_or(Ok(PER_CONNECTION), |s| s.parse())?
        .max(1);
    let topology = std::env::args().any(|a| a == "--topology");
    let hold = Duration::from_secs_f64(arg("--hold").map_or(Ok(0.0), |s| s.parse())?);
    let beats: u32 = arg("--keep-alives").map_or(Ok(0), |k| k.parse())?;
    let progress = std::env::args().any(|a| a == "--progress");
    let rt = tokio::runtime::Runtime::new()?;
    if !std::env::args().any(|a| a == "--no-header") {
        println!("| agents | link | rendezvous wall time | server CPU | server CPU per agent | server peak RSS per agent | server RSS per connected agent |");
        println!("|---|---|---|---|---|---|---|");
    }
    for (k, n) in sizes.into_iter().enumerate() {
        let (wall, cpu, peak, steady, per_beat) = rt.block_on(async {
            let (host, port) = endpoint.rsplit_once(':').ok_or("--endpoint HOST:PORT")?;
            let uri = accel_wire::tls::endpoint_uri(host, port.parse()?, tls.enabled());
            let mut channels = Vec::new();
            for _ in 0..(n as usize).div_ceil(per_connection) {
                let mut ep = Endpoint::from_shared(uri.clone())?.tcp_nodelay(true);
                if let Some(config) = tls.config(host)? {
                    ep = ep.tls_config(config)?;
                }
                channels.push(ep.connect().await?);
            }
            let job = format!("load-{k}-{n}");
            let rss0 = status_kib(&server_pid, "VmRSS:");
            let cpu0 = cpu_seconds(&server_pid);
            let t0 = Instant::now();
            let tasks: Vec<_> = (0..n as usize)
                .map(|i| {
                    let client = RendezvousClient::with_interceptor(
                        channels[i / per_connection].clone(),
                        AttachToken::new(token.as_ref()),
                    );
                    let j = i as u32 % jobs;
                    // Job j gets every jobs-th agent: n / jobs of them, plus one
                    // for the first n % jobs jobs.
                    let size = n / jobs + u32::from(j < n % jobs);
                    tokio::spawn(agent(client, format!("{job}-{j}"), i, size, topology))
                })
                .collect();
            let mut open = Vec::with_capacity(n as usize);
            for t in tasks {
                open.push(t.await??);
            }
            let wall = t0.elapsed();
            // The server finishes its accounting of the round after the last
            // reply: its CPU is read once it has stopped growing (two reads
            // 20 ms, two clock ticks, apart agree), within a second.
            let mut cpu = cpu_seconds(&server_pid);
            let settle = std::time::Instant::now() + Duration::from_secs(1);
            while std::time::Instant::now() < settle {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let again = cpu_seconds(&server_pid);
                if again == cpu {
                    break;
                }
                cpu = again;
            }
            let cpu = cpu - cpu0;
            let peak = status_kib(&server_pid, "VmHWM:") - rss0;
            // Every node still connected, the round running: what a job costs
            // while it runs (the peak adds every node joining at once).
            let steady = status_kib(&server_pid, "VmRSS:") - rss0;
            let mut per_beat = None;
            if beats > 0 {
                let cpu0 = cpu_seconds(&server_pid);
                let t0 = Instant::now();
                let tasks: Vec<_> = open
                    .iter()
                    .map(|a| {
                        tokio::spawn(keep_alives(
                            a.client.clone(),
                            a.keep_alive.clone(),
                            beats,
                            progress,
                        ))
                    })
                    .collect();
                for t in tasks {
                    t.await??;
                }
                let took = t0.elapsed();
                let cpu = cpu_seconds(&server_pid) - cpu0;
                per_beat = Some((took, cpu / f64::from(n * beats) * 1e6));
            }
            tokio::time::sleep(hold).await;
            drop(open.into_iter().map(|a| a.events).collect::<Vec<_>>());
            Ok::<_, Box<dyn std::error::Error>>((wall, cpu, peak, steady, per_beat))
        })?;
        println!(
            "| {n} | {label} | {:.3} s | {:.2} s | {:.0} µs | {:.1} KiB | {:.1} KiB |",
            wall.as_secs_f64(),
            cpu,
            cpu / f64::from(n) * 1e6,
            peak / f64::from(n),
            steady / f64::from(n)
        );
        if let Some((took, micros)) = per_beat {
            let what = if progress {
                "with progress"
            } else {
                "without progress"
            };
            println!(
                "keep-alives: {n} agents x {beats} ({what}) in {:.3} s: server CPU {micros:.1} µs per keep-alive",
                took.as_secs_f64()
            );
        }
    }
    Ok(())
}
