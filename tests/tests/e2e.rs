//! End-to-end tests: real `rdzv-server` and `accel-agent` binaries on
//! loopback, real worker processes. One test binary, several modules.

mod accelerate;
mod bad_input;
mod built_in_health;
mod chaos;
mod elastic;
mod errors;
mod guide;
mod ha;
mod hangs;
mod health_check;
mod hot_restart;
mod install;
mod kubeflow;
mod launch;
mod logs;
mod metrics;
mod no_restart;
mod numa;
mod outage;
mod pid_one;
mod process_secrets;
mod progress;
mod quarantine;
mod restart;
mod security;
mod shared_node_files;
mod shutdown;
mod slurm;
mod stacks;
mod status_page;
mod store_admission;
mod store_bounds;
mod tls;
mod topology;
mod torch;
mod torchft;
mod torchrun_flags;

use std::path::Path;

use accel_tests::Record;

/// PyTorch tests start several interpreters each; on a small machine they
/// run one at a time so none starves (and times out) another.
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the heavy-test lock for the caller's scope.
pub(crate) fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checks torchrun's environment contract and rank layout for one attempt.
pub(crate) fn check_layout(
    recs: &[Record],
    nnodes: u32,
    nproc: u32,
    restart: u32,
    max_restarts: u32,
) {
    let attempt: Vec<&Record> = recs.iter().filter(|r| r.restart == restart).collect();
    let world = nnodes * nproc;
    assert_eq!(
        attempt.len() as u32,
        world,
        "one record per rank in attempt {restart}: {attempt:#?}"
    );
    let master = (attempt[0].var("MASTER_ADDR"), attempt[0].var("MASTER_PORT"));
    let run_id = attempt[0].var("TORCHELASTIC_RUN_ID");
    for (i, r) in attempt.iter().enumerate() {
        let i = i as u32;
        assert_eq!(r.rank, i);
        let want = [
            ("RANK", i.to_string()),
            ("LOCAL_RANK", (i % nproc).to_string()),
            ("GROUP_RANK", (i / nproc).to_string()),
            ("ROLE_RANK", i.to_string()),
            ("ROLE_NAME", "default".into()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_WORLD_SIZE", nproc.to_string()),
            ("GROUP_WORLD_SIZE", nnodes.to_string()),
            ("ROLE_WORLD_SIZE", world.to_string()),
            ("TORCHELASTIC_RESTART_COUNT", restart.to_string()),
            ("TORCHELASTIC_MAX_RESTARTS", max_restarts.to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".into()),
            ("OMP_NUM_THREADS", if nproc > 1 { "1" } else { "" }.into()),
        ];
        for (k, v) in want {
            if v.is_empty() {
                assert!(
                    !r.env.contains_key(k),
                    "{k} must be unset for one worker per node"
                );
            } else {
                assert_eq!(r.var(k), v, "{k} of rank {i}");
            }
        }
        assert_eq!(
            (r.var("MASTER_ADDR"), r.var("MASTER_PORT")),
            master,
            "one MASTER for all ranks"
        );
        assert_eq!(r.var("TORCHELASTIC_RUN_ID"), run_id);
        let error_file = r.var("TORCHELASTIC_ERROR_FILE");
        let tail = format!("/attempt_{restart}/{}/error.json", i % nproc);
        assert!(
            error_file.ends_with(&tail),
            "{error_file} should end with {tail}"
        );
        assert!(
            Path::new(error_file).parent().is_some_and(Path::is_dir),
            "{error_file}'s directory exists"
        );
        assert!(r.unbuffered, "python runs with -u");
        assert_ne!(r.pid, 0);
        assert_eq!(r.pgid, r.pid, "each worker leads its own process group");
    }
    // Ranks are contiguous per node: every rank of a node comes from one agent.
    for node in 0..nnodes {
        let tags: Vec<&str> = attempt
            .iter()
            .filter(|r| r.var("GROUP_RANK") == node.to_string())
            .map(|r| r.var("AGENT_TAG"))
            .collect();
        assert_eq!(tags.len() as u32, nproc);
        assert!(
            tags.iter().all(|t| *t == tags[0]),
            "node {node}'s ranks come from one agent: {tags:?}"
        );
    }
}
