//! Inputs the `rdzv_job` fuzz target (fuzz/fuzz_targets/rdzv_job.rs) found,
//! each replayed on the `Job` API with the invariant it broke.

use super::*;

fn req(min: u32, max: u32) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "job".into(),
        hostname: "host".into(),
        min_nodes: min,
        max_nodes: max,
        nproc_per_node: 4,
        max_restarts: 5,
        ..Default::default()
    }
}

/// `close` emptied the members but kept the ready count: a join that raced
/// the shutdown found one node "ready" with nobody ready, and a round of
/// one node completed for nnodes 2.
#[test]
fn close_leaves_no_ready_count_behind() {
    let t = Instant::now();
    let mut job = Job::new("job", JobConfig::from_join(&req(2, 2)));
    job.join(t, "n0", &req(2, 2)).expect("join n0");
    job.join(t, "n1", &req(2, 2)).expect("join n1");
    job.ready(t, "n0", 0, ("10.0.0.1".into(), 29500));
    job.close("the server is shutting down", true);
    // One node joins and gets ready: still one short of MIN.
    job.join(t, "n2", &req(2, 2)).expect("join n2");
    let out = job.ready(t, "n2", 0, ("10.0.0.2".into(), 29500));
    assert!(
        !out.iter().any(|o| matches!(o.event, Kind::RoundComplete(_))),
        "a round of one node for nnodes 2: {out:?}"
    );
    assert_eq!(job.ready, 1, "only n2 is ready");
}
