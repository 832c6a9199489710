//! The Kubeflow Trainer runtime's contract (deploy/kubeflow): Trainer's torch
//! plugin gives each node's `node` container PET_NNODES, PET_NPROC_PER_NODE
//! (`auto` by default), PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
//! and the runtime runs `accel-agent` with the TrainJob's arguments and the
//! runtime's own variables. Two agents given exactly that environment, and
//! no flag, run one 2-node job: node rank 0's agent hosts the rendezvous on
//! PET_MASTER_PORT, as torchrun's static rendezvous would.

use std::time::Duration;

use accel_tests::{record_script, records, scratch, venv_path, Agent, Port, Server};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn agents_given_what_trainer_injects_run_one_job() {
    let dir = scratch("kubeflow-runtime");
    let port = Port::lease();
    let port_s = port.to_string();
    let script = record_script();
    let dir_s = dir.to_str().expect("path").to_owned();
    let path = venv_path();
    let nodes: Vec<Agent> = ["0", "1"]
        .iter()
        .map(|rank| {
            let env = [
                // What Trainer sets.
                ("PET_NNODES", "2"),
                ("PET_NPROC_PER_NODE", "auto"),
                ("PET_NODE_RANK", *rank),
                ("PET_MASTER_ADDR", "127.0.0.1"),
                ("PET_MASTER_PORT", port_s.as_str()),
                // What the runtime sets (its metrics port on a free one here).
                ("PET_MAX_RESTARTS", "3"),
                ("PET_METRICS_BIND", "127.0.0.1:0"),
                ("PET_LOG_FORMAT", "json"),
                ("PATH", path.as_str()),
                ("RECORD_DIR", dir_s.as_str()),
                ("AGENT_TAG", *rank),
            ];
            Agent::start(
                &dir,
                &format!("node-{rank}"),
                &[script.to_str().expect("path")],
                &env,
            )
        })
        .collect();
    for n in nodes {
        let out = n.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        // The runtime asks for JSON logs.
        assert!(
            out.stderr.lines().any(|l| l.starts_with('{')),
            "{}",
            out.stderr
        );
    }
    // `auto` without GPUs is a worker per CPU, as torchrun's; one world.
    let per_node = std::thread::available_parallelism().map_or(1, |n| n.get());
    let recs = records(&dir);
    assert_eq!(recs.len(), 2 * per_node, "{recs:?}");
    for r in &recs {
        assert_eq!(r.var("WORLD_SIZE"), (2 * per_node).to_string());
        assert_eq!(r.var("MASTER_ADDR"), "127.0.0.1");
        assert_eq!(r.var("GROUP_WORLD_SIZE"), "2");
    }
    let mut ranks: Vec<u32> = recs.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..2 * per_node as u32).collect::<Vec<_>>());
}

/// The c10d runtime (deploy/kubeflow/runtime-c10d): the same variables from
/// Trainer, and the runtime's own, read from its manifest (backend, token
/// file, store ports, join timeout through PET_RDZV_CONF; the job id; the
/// pod IP), against a real rdzv-server that requires the token. The agents
/// ignore Trainer's node rank and master address under c10d and run one job
/// through the server; an agent without the token is refused.
#[test]
fn agents_given_what_trainer_injects_run_one_job_through_rdzv_server_with_the_c10d_runtime() {
    const TOKEN: &str = "kubeflow-c10d-token-4f1e9a";
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/kubeflow/runtime-c10d/cluster-training-runtime.yaml"),
    )
    .expect("the c10d runtime");
    let value_of = |name: &str| {
        let mut lines = manifest.lines();
        while let Some(l) = lines.next() {
            if l.trim() == format!("- name: {name}") {
                let v = lines.next().expect("a value").trim();
                return v.strip_prefix("value: ").map(str::to_owned);
            }
        }
        None
    };
    assert_eq!(value_of("PET_RDZV_BACKEND").as_deref(), Some("c10d"));
    let conf = value_of("PET_RDZV_CONF").expect("PET_RDZV_CONF");
    assert!(conf.contains("token_file=/etc/accel/token/token"), "{conf}");
    let dir = scratch("kubeflow-c10d");
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    // The runtime's conf, with the token where the Secret would be mounted,
    // and without its fixed store ports (a pod has its own; tests here share
    // one machine's).
    let conf = conf
        .replace("/etc/accel/token/token", token_file.to_str().expect("path"))
        .split(',')
        .filter(|kv| !kv.starts_with("store_ports="))
        .collect::<Vec<_>>()
        .join(",");
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let script = record_script();
    let dir_s = dir.to_str().expect("path").to_owned();
    let path = venv_path();
    // Trainer's node-0 address and port: unused under c10d.
    let unused = Port::lease().to_string();
    let start = |rank: &str, conf: &str| {
        let env = [
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_NODE_RANK", rank),
            ("PET_MASTER_ADDR", "node-0.example.invalid"),
            ("PET_MASTER_PORT", unused.as_str()),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_RDZV_ENDPOINT", server.addr.as_str()),
            ("PET_RDZV_ID", "llama-ft-0f1e2d-0"),
            ("PET_RDZV_CONF", conf),
            ("PET_LOCAL_ADDR", "127.0.0.1"),
            (
                "PET_NODE_IDENTITY",
                if rank == "0" {
                    "machine-a"
                } else {
                    "machine-b"
                },
            ),
            ("PET_MAX_RESTARTS", "3"),
            ("PET_SHUTDOWN_TIMEOUT", "110"),
            ("PET_METRICS_BIND", "127.0.0.1:0"),
            ("PET_LOG_FORMAT", "json"),
            ("PATH", path.as_str()),
            ("RECORD_DIR", dir_s.as_str()),
            ("AGENT_TAG", rank),
        ];
        Agent::start(
            &dir,
            &format!("node-{rank}"),
            &[script.to_str().expect("path")],
            &env,
        )
    };
    // Without the token: refused (exit 2), naming the token.
    let stranger = start("0", "join_timeout=900").wait(LIMIT);
    assert_eq!(stranger.code(), 2, "{}", stranger.stderr);
    assert!(stranger.stderr.contains("token"), "{}", stranger.stderr);
    let nodes: Vec<Agent> = ["0", "1"].iter().map(|r| start(r, &conf)).collect();
    for n in nodes {
        let out = n.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 2, "{recs:?}");
    for r in &recs {
        assert_eq!(r.var("WORLD_SIZE"), "2");
        assert_eq!(
            r.var("MASTER_ADDR"),
            "127.0.0.1",
            "the store's address, not Trainer's node 0"
        );
        assert_eq!(r.var("TORCHELASTIC_RUN_ID"), "llama-ft-0f1e2d-0");
    }
}
