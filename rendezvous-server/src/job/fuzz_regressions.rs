//! Inputs the `rdzv_job` fuzz target (fuzz/fuzz_targets/rdzv_job.rs) found,
//! each replayed on the `Job` API with the invariant it broke.

use super::*;

const S: Session = Session::from_bytes([7; SESSION_BYTES]);

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
    let t = crate::clock::epoch();
    let mut job = Job::new("job", JobConfig::from_join(&req(2, 2)));
    job.join(t, "n0", &req(2, 2), S).expect("join n0");
    job.join(t, "n1", &req(2, 2), S).expect("join n1");
    job.ready(t, "n0", 0, ("10.0.0.1".into(), 29500), None);
    job.close(t, "the server is shutting down", true);
    // One node joins and gets ready: still one short of MIN.
    job.join(t, "n2", &req(2, 2), S).expect("join n2");
    let out = job.ready(t, "n2", 0, ("10.0.0.2".into(), 29500), None);
    assert!(
        !out.iter()
            .any(|o| matches!(o.event, Kind::RoundComplete(_))),
        "a round of one node for nnodes 2: {out:?}"
    );
    assert_eq!(job.ready, 1, "only n2 is ready");
}

/// A static node reconnecting to a restarted server claimed its place
/// before its requested rank was checked: it joined with rank 4294911743
/// for nnodes 1, or with a requested rank another placeholder held.
#[test]
fn a_resuming_static_node_claims_only_its_own_rank_in_range() {
    let t = crate::clock::epoch();
    let resuming = |node_rank, rank| pb::JoinRequest {
        node_rank: Some(node_rank),
        resume: Some(pb::Resume {
            round: 3,
            restart_count: 0,
            node_rank: rank,
            nnodes: 2,
        }),
        ..req(2, 2)
    };
    let relearned =
        |r: &pb::JoinRequest| Job::relearn(t, "job", r, r.resume.as_ref().expect("resume"));

    let huge = resuming(4_294_911_743, 0);
    let mut job = relearned(&huge);
    let e = job.join(t, "n0", &huge, S).expect_err("out of range");
    assert!(matches!(e, JoinRefused::RankOutOfRange { .. }), "{e}");

    let crossed = resuming(1, 0);
    let mut job = relearned(&crossed);
    let e = job
        .join(t, "n0", &crossed, S)
        .expect_err("another node's rank");
    assert!(
        matches!(e, JoinRefused::DuplicateRank { rank: 1, .. }),
        "{e}"
    );

    let own = resuming(1, 1);
    let mut job = relearned(&own);
    let out = job.join(t, "n1", &own, S).expect("its own place");
    assert!(matches!(
        out[0].event,
        Kind::Joined(pb::Joined { resumed: true, .. })
    ));
    assert_eq!(job.members()["n1"].requested_rank, Some(1));
    assert_eq!(job.members()["n1"].rank, Some(1));
}

/// A tick dropped its lost nodes one by one and decided after each: the
/// first departure completed the round with a node the same tick dropped
/// next, so the survivor started a round that was restarted at once.
#[test]
fn a_tick_drops_every_lost_node_before_it_decides() {
    let t = crate::clock::epoch();
    let elastic = pb::JoinRequest {
        dead_after_ms: 1_000,
        last_call_ms: 200,
        ..req(2, 4)
    };
    let mut job = Job::new("job", JobConfig::from_join(&elastic));
    for n in ["n0", "n1", "n2"] {
        job.join(t, n, &elastic, S).expect("join");
    }
    job.ready(t, "n1", 0, ("10.0.0.1".into(), 29500), None);
    job.ready(t, "n2", 0, ("10.0.0.2".into(), 29500), None);
    // The last call is over and n0, n1 are lost; only n2 is alive.
    let later = t + Duration::from_millis(1_500);
    assert!(job.keep_alive(later, "n2"));
    let out = job.tick(later);
    assert!(
        !out.iter()
            .any(|o| matches!(o.event, Kind::RoundComplete(_) | Kind::RestartRequested(_))),
        "{out:?}"
    );
    assert_eq!(job.phase(), &Phase::Forming);
    assert_eq!(job.round(), 0);
    assert_eq!(job.members().keys().collect::<Vec<_>>(), ["n2"]);
}

/// `close` emptied a relearned job's members but kept its count of
/// unclaimed placeholders: the registry went on counting 64 placeholders
/// against `--max-nodes-per-job` for a job that had none, and the job's
/// record disagreed with itself (found by the record round trip).
#[test]
fn close_leaves_no_placeholder_count_behind() {
    let t = crate::clock::epoch();
    let mut join = req(1, 206);
    let resume = pb::Resume {
        round: 1,
        restart_count: 0,
        node_rank: 63,
        nnodes: 64,
    };
    join.resume = Some(resume);
    let mut job = Job::relearn(t, "job", &join, &resume);
    assert_eq!(job.absent_count(), 64);
    job.close(t, "the server is shutting down", true);
    assert_eq!(job.absent_count(), 0, "no placeholder is left");
    let record = job.record(t);
    assert_eq!(Job::restore(record.clone(), t).record(t), record);
}

/// A node resumed a relearned job at rank 18; the job was closed (its
/// members, placeholders included, cleared, its participants kept); the
/// same node then resumed at rank 0 and claimed that stale placeholder too,
/// so it took part twice (found by the fuzzer's participant check).
#[test]
fn a_closed_relearned_job_hands_out_no_placeholder() {
    let t = crate::clock::epoch();
    let mut join = req(1, 236);
    let resume = |node_rank| pb::Resume {
        round: 5,
        restart_count: 0,
        node_rank,
        nnodes: 32,
    };
    join.resume = Some(resume(18));
    let mut job = Job::relearn(t, "job", &join, &resume(18));
    job.join(t, "n0", &join, S).expect("claims rank 18");
    job.close(t, "the server is shutting down", false);
    join.resume = Some(resume(0));
    let _ = job.join(t, "n0", &join, S);
    let taking_part = fuzzing::internals(&job)
        .participants
        .iter()
        .filter(|p| *p == "n0")
        .count();
    assert!(taking_part <= 1, "n0 takes part {taking_part} times");
    // A node already in the round cannot claim a second placeholder either.
    let mut job = Job::relearn(t, "job", &join, &resume(0));
    join.resume = Some(resume(3));
    job.join(t, "n0", &join, S).expect("claims rank 3");
    join.resume = Some(resume(4));
    let _ = job.join(t, "n0", &join, S);
    let internals = fuzzing::internals(&job);
    assert_eq!(
        internals.participants.iter().filter(|p| *p == "n0").count(),
        1
    );
}

/// A ready member of a benched host rejoined under another host name: its
/// offer counted again, but a rejoin did not decide, so a round that could
/// complete (1 ready for nnodes 1) stayed forming until the next tick
/// (found by the fuzzer's "ready for a round of at most MAX" check).
#[test]
fn a_rejoin_that_ends_a_node_s_bench_decides_the_round() {
    let t = crate::clock::epoch();
    let on = |host: &str| pb::JoinRequest {
        hostname: host.into(),
        session: S.to_vec(),
        ..req(1, 1)
    };
    let mut job = Job::new("job", JobConfig::from_join(&on("host-a")));
    job.join(t, "n0", &on("host-a"), S).expect("join");
    job.bench_host(t, "host-a", t + Duration::from_millis(1), "why".into());
    let out = job.ready(t, "n0", 0, ("10.0.0.1".into(), 29500), None);
    assert!(!out
        .iter()
        .any(|o| matches!(o.event, Kind::RoundComplete(_))));
    let out = job.join(t, "n0", &on("host-b"), S).expect("rejoin");
    assert!(matches!(out[0].event, Kind::Joined(_)), "{out:?}");
    assert!(
        out.iter()
            .any(|o| matches!(o.event, Kind::RoundComplete(_))),
        "{out:?}"
    );
    assert_eq!(job.phase(), &Phase::Running);
}

/// An outage limit and keep-alive interval of `u64::MAX` ms (agents send
/// them; only the service's checks bounded them) did not survive the job
/// store's microseconds: the stored record was another job. The config
/// holds them at ten years, as every duration.
#[test]
fn an_outage_limit_beyond_ten_years_is_held_as_ten_years() {
    let r = pb::JoinRequest {
        outage_ms: u64::MAX,
        keep_alive_ms: u64::MAX,
        dead_after_ms: 122,
        ..req(2, 2)
    };
    let config = JobConfig::from_join(&r);
    assert_eq!(config.outage, Some(accel_input::MAX_DURATION));
    assert_eq!(config.keep_alive, Some(accel_input::MAX_DURATION));
    let t = crate::clock::epoch();
    let job = Job::new("job", config);
    let record = job.record(t);
    let encoded = crate::store::records::encode(&record);
    let decoded = crate::store::records::decode("job", &encoded).expect("decodes");
    assert_eq!(
        decoded.config, record.config,
        "the stored form of a job is another job"
    );
}
