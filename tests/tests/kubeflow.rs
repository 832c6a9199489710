//! The Kubeflow Trainer runtime's contract (deploy/kubeflow): Trainer's torch
//! plugin gives each node's `node` container PET_NNODES, PET_NPROC_PER_NODE
//! (`auto` by default), PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
//! and the runtime runs `accel-agent` with the TrainJob's arguments and the
//! runtime's own variables. Two agents given exactly that environment, and
//! no flag, run one 2-node job: node rank 0's agent hosts the rendezvous on
//! PET_MASTER_PORT, as torchrun's static rendezvous would.

use std::time::Duration;

use accel_tests::{record_script, records, scratch, venv_path, Agent, Port};

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
