//! Under Slurm: an `srun` step's variables give the agent its node count,
//! node rank, job id and rendezvous host; flags and `PET_*` win. (Slurm's
//! variables are set by the test, as `srun --ntasks-per-node=1` sets them.)

use std::time::Duration;

use accel_tests::{records, scratch, AgentCmd, Port};

use crate::check_layout;

const LIMIT: Duration = Duration::from_secs(60);

fn step(node_id: u32, tasks: u32) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_JOB_ID", "31337".into()),
        ("SLURM_STEP_ID", "0".into()),
        ("SLURM_NNODES", "2".into()),
        ("SLURM_JOB_NUM_NODES", "2".into()),
        ("SLURM_NODEID", node_id.to_string()),
        ("SLURM_PROCID", node_id.to_string()),
        ("SLURM_STEP_NUM_TASKS", tasks.to_string()),
        ("SLURM_NTASKS", tasks.to_string()),
        // The first host of the allocation hosts the rendezvous.
        ("SLURM_JOB_NODELIST", "localhost,node[02-03]".into()),
    ]
}

#[test]
fn an_srun_step_needs_no_flags() {
    let dir = scratch("slurm");
    let port = Port::lease();
    let agents: Vec<_> = (0..2)
        .map(|i| {
            let mut cmd = AgentCmd::new()
                .flag("--master-port", &port)
                .nproc(2)
                .recording(&dir, &format!("n{i}"));
            for (k, v) in step(i, 2) {
                cmd = cmd.env(k, v);
            }
            cmd.start(&dir, &format!("n{i}"))
        })
        .collect();
    for (i, a) in agents.into_iter().enumerate() {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        let said = format!(
            "running under Slurm (job 31337): took 2 nodes, rdzv_id 31337, node rank {i}, rendezvous host localhost"
        );
        assert_eq!(
            out.stderr.matches("running under Slurm").count(),
            1,
            "{}",
            out.stderr
        );
        assert!(out.stderr.contains(&said), "{}", out.stderr);
    }
    let recs = records(&dir);
    check_layout(&recs, 2, 2, 0, 0);
    for r in &recs {
        assert_eq!(r.env["TORCHELASTIC_RUN_ID"], "31337");
        assert_eq!(r.env["MASTER_ADDR"], "localhost");
        // Node rank follows SLURM_NODEID.
        let node: u32 = r.env["GROUP_RANK"].parse().expect("GROUP_RANK");
        assert_eq!(r.rank / 2, node);
    }
}

#[test]
fn flags_and_pet_variables_win_over_slurm() {
    let dir = scratch("slurm-flags");
    // One node of its own, whatever the allocation says (--nnodes 1), and
    // the job id of PET_RDZV_ID; only the node rank and the host (absent)
    // come from Slurm.
    let port = Port::lease();
    let mut cmd = AgentCmd::new()
        .flag("--master-port", &port)
        .nnodes(1)
        .nproc(1)
        .env("PET_RDZV_ID", "mine")
        .recording(&dir, "solo");
    for (k, v) in step(0, 2) {
        cmd = cmd.env(k, v);
    }
    let out = cmd.start(&dir, "solo").wait(LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let recs = records(&dir);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].env["WORLD_SIZE"], "1");
    assert_eq!(recs[0].env["TORCHELASTIC_RUN_ID"], "mine");
}

#[test]
fn several_tasks_per_node_are_refused_with_the_fix() {
    let mut cmd = AgentCmd::new().nproc(1);
    for (k, v) in step(0, 16) {
        cmd = cmd.env(k, v);
    }
    let out = cmd.no_python("true", &[]).command().output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this srun step has 16 tasks on 2 nodes"),
        "{err}"
    );
    assert!(err.contains("srun --ntasks-per-node=1"), "{err}");
}
