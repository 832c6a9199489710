//! Request validation ([`crate::limits::check_join`]), with the inputs
//! fuzzing found.

use super::*;
use crate::limits::{check_join, Limits, MAX_ROUND as MAX_RESUME_ROUND};

const MAX_NODES_PER_JOB: u32 = 100_000;

fn validate_join(req: &pb::JoinRequest) -> Result<(), Error> {
    check_join(req, &Limits::default())
}

fn join(resume: Option<pb::Resume>) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "job".into(),
        node_id: "n0".into(),
        hostname: "host".into(),
        min_nodes: 2,
        max_nodes: 4,
        nproc_per_node: 8,
        max_restarts: 3,
        resume,
        ..Default::default()
    }
}

fn resume(restart_count: u32, node_rank: u32, nnodes: u32) -> Option<pb::Resume> {
    Some(pb::Resume {
        round: 5,
        restart_count,
        node_rank,
        nnodes,
    })
}

#[test]
fn a_resume_that_fits_the_job_is_accepted() {
    assert!(validate_join(&join(None)).is_ok());
    assert!(validate_join(&join(resume(3, 3, 4))).is_ok());
    assert!(validate_join(&join(resume(0, 0, 2))).is_ok());
}

/// Found by fuzzing (rdzv_job): a resume for an unknown job made the server
/// relearn a job of 2,744 nodes for nnodes 1, with 6 restarts spent of a
/// budget of 0; with nnodes 4294967295 it allocated until it aborted.
#[test]
fn a_resume_beyond_the_jobs_bounds_is_refused() {
    for (restarts, rank, nnodes) in [
        (6, 0, 2),        // more restarts than --max-restarts
        (0, 61, 2744),    // more nodes than MAX
        (0, 0, u32::MAX), // the allocation bomb
        (0, 0, 1),        // fewer nodes than MIN
        (0, 2, 2),        // a rank outside the round
        (0, u32::MAX, 4), // the rank + 1 overflow
    ] {
        let e = validate_join(&join(resume(restarts, rank, nnodes)))
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("resume names") && e.contains("nnodes 2:4") && e.contains("max_restarts 3"),
            "{e}"
        );
    }
}

/// Found by fuzzing (rdzv_job, a timeout): a resume within nnodes 3:3,600,000,000
/// made the server allocate a placeholder per node.
#[test]
fn more_nodes_than_a_job_may_have_are_refused() {
    let mut r = join(resume(0, 0, MAX_NODES_PER_JOB + 1));
    r.max_nodes = MAX_NODES_PER_JOB + 1;
    let e = validate_join(&r).expect_err("refused").to_string();
    assert!(e.contains("--max-nodes-per-job 100000"), "{e}");
    r.max_nodes = MAX_NODES_PER_JOB;
    r.resume = resume(0, 0, MAX_NODES_PER_JOB);
    assert!(validate_join(&r).is_ok());
}

/// Found by fuzzing (rdzv_job): a node whose id began like a relearned
/// job's placeholders ("\0absent-rank-") was skipped by every broadcast, so
/// it never heard of the restart its own join caused.
#[test]
fn ids_with_control_characters_are_refused() {
    for (job, node) in [
        ("job", "\u{0}absent-rank-0"),
        ("job", "n\u{1b}[2J"),
        ("j\nb", "n0"),
    ] {
        let r = pb::JoinRequest {
            job_id: job.into(),
            node_id: node.into(),
            ..join(None)
        };
        let e = validate_join(&r).expect_err("refused").to_string();
        assert!(e.contains("contains control characters"), "{e}");
    }
}

/// Found by fuzzing (rdzv_job): a resume of round u64::MAX made the server
/// relearn a job whose next restart overflowed the round number (a panic in
/// debug builds, round 0 again in release ones).
#[test]
fn a_resume_of_a_round_no_job_reaches_is_refused() {
    for round in [u64::MAX, MAX_RESUME_ROUND + 1] {
        let mut r = join(resume(0, 0, 2));
        if let Some(resume) = r.resume.as_mut() {
            resume.round = round;
        }
        let e = validate_join(&r).expect_err("refused").to_string();
        assert!(e.contains("beyond any round a job reaches"), "{e}");
    }
    let mut r = join(resume(0, 0, 2));
    if let Some(resume) = r.resume.as_mut() {
        resume.round = MAX_RESUME_ROUND;
    }
    assert!(validate_join(&r).is_ok());
}

/// Found by fuzzing (rdzv_job): nnodes x nproc_per_node overflowed the
/// round's world size (a panic in debug builds, a wrapped world size in
/// release ones).
#[test]
fn a_world_larger_than_pytorchs_ranks_is_refused() {
    let mut r = join(None);
    r.max_nodes = 100_000;
    r.nproc_per_node = 42_950;
    let e = validate_join(&r).expect_err("refused").to_string();
    assert!(
        e.contains("a world of 4295000000 ranks, more than PyTorch's 2147483647"),
        "{e}"
    );
    r.nproc_per_node = 21_474;
    assert!(validate_join(&r).is_ok());
}

/// A follower hands the joins that say the leader went silent to its
/// tally, bounded; other joins, and a leader's, are not complaints.
#[tokio::test]
async fn a_follower_queues_bounded_complaints_of_joins_that_left_a_silent_leader() {
    let (_roles, seat) = watch::channel(Role::Follower {
        leader: Some("head-1:29400".into()),
    });
    let (tx, mut rx) = mpsc::channel(8);
    let service = RendezvousService::seated(seat).hearing(tx);
    let complaint = |silent: &str, session: Vec<u8>| {
        let mut req = join(None);
        req.silent_replica = silent.into();
        req.session = session;
        Request::new(req)
    };
    let secret = vec![3; crate::job::SESSION_BYTES];
    for req in [
        complaint("head-1:29400", secret.clone()),
        complaint("", secret.clone()),
        complaint(&"h".repeat(limits::MAX_ADDR_BYTES + 1), secret.clone()),
        complaint("head-1:29400\n", secret.clone()),
        complaint("head-1:29400", vec![3; 4]),
    ] {
        let refused = service
            .join(req)
            .await
            .expect_err("a follower serves nothing");
        assert_eq!(refused.code(), tonic::Code::Unavailable);
    }
    let heard = rx.try_recv().expect("the well-formed complaint is queued");
    assert_eq!(
        (
            heard.job.as_str(),
            heard.node.as_str(),
            heard.silent.as_str()
        ),
        ("job", "n0", "head-1:29400")
    );
    assert_eq!(heard.session, secret);
    assert!(rx.try_recv().is_err(), "nothing else is a complaint");
    // A leader checks the field as part of the join.
    let mut req = join(None);
    req.silent_replica = "h".repeat(limits::MAX_ADDR_BYTES + 1);
    assert!(validate_join(&req).is_err());
    req.silent_replica = "head-1:29400".into();
    assert!(validate_join(&req).is_ok());
}
