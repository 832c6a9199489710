use super::*;

/// The session secret tests hand out.
const S: Session = Session::from_bytes([7; SESSION_BYTES]);

fn req(host: &str, nnodes: u32, rank: Option<u32>) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "j".into(),
        node_id: String::new(),
        hostname: host.into(),
        min_nodes: nnodes,
        max_nodes: nnodes,
        nproc_per_node: 2,
        max_restarts: 1,
        node_rank: rank,
        dead_after_ms: 15_000,
        last_call_ms: 30_000,
        resume: None,
        session: Vec::new(),
        silent_replica: String::new(),
        topology: String::new(),
        no_restart_exit_code: 0,
        agent_version: String::new(),
        outage_ms: 0,
        keep_alive_ms: 0,
        started_unix_ms: 0,
        max_no_progress_restarts: 0,
        nnodes_multiple_of: 0,
        scale_up_settle_ms: 0,
    }
}

fn elastic(host: &str, min: u32, max: u32) -> pb::JoinRequest {
    pb::JoinRequest {
        min_nodes: min,
        max_nodes: max,
        ..req(host, max, None)
    }
}

fn job(nnodes: u32) -> Job {
    Job::new("j", JobConfig::from_join(&req("h", nnodes, None)))
}

fn kinds_for<'a>(out: &'a [Outbound], node: &str) -> Vec<&'a Kind> {
    out.iter()
        .filter(|o| o.to == node)
        .map(|o| &o.event)
        .collect()
}

fn round_of(out: &[Outbound], node: &str) -> pb::RoundComplete {
    kinds_for(out, node)
        .into_iter()
        .find_map(|k| match k {
            Kind::RoundComplete(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no RoundComplete for {node} in {out:?}"))
}

/// Joins `hosts` (node ids `n0`, `n1`, …) and makes them all ready for round 0.
fn formed(hosts: &[&str], t: Instant) -> (Job, Vec<Outbound>) {
    let mut j = job(hosts.len() as u32);
    for (i, h) in hosts.iter().enumerate() {
        j.join(t, &format!("n{i}"), &req(h, hosts.len() as u32, None), S)
            .expect("join");
    }
    let mut out = Vec::new();
    for i in 0..hosts.len() {
        out = j.ready(
            t,
            &format!("n{i}"),
            0,
            (format!("addr{i}"), 1000 + i as u32),
            None,
        );
    }
    (j, out)
}

#[test]
fn round_completes_only_when_every_node_is_ready() {
    let t = crate::clock::epoch();
    let mut j = job(2);
    j.join(t, "a", &req("host-a", 2, None), S).expect("join a");
    j.join(t, "b", &req("host-b", 2, None), S).expect("join b");
    assert_eq!(
        decide(t, &j),
        Decision::Wait {
            ready: 0,
            needed: 2,
            last_call_ends: None
        }
    );
    let out = j.ready(t, "a", 0, ("addr-a".into(), 1), None);
    assert!(matches!(kinds_for(&out, "a")[0], Kind::Waiting(w) if w.ready == 1 && w.needed == 2));
    let out = j.ready(t, "b", 0, ("addr-b".into(), 2), None);
    let (ra, rb) = (round_of(&out, "a"), round_of(&out, "b"));
    assert_eq!((ra.node_rank, rb.node_rank), (0, 1));
    assert_eq!((ra.base_rank, rb.base_rank), (0, 2));
    assert_eq!(ra.world_size, 4);
    assert_eq!((ra.master_addr.as_str(), ra.master_port), ("addr-a", 1));
    assert_eq!((rb.master_addr.as_str(), rb.master_port), ("addr-a", 1));
    assert_eq!(j.phase(), &Phase::Running);
}

#[test]
fn dynamic_ranks_follow_host_names_then_stay_put() {
    let t = crate::clock::epoch();
    let (mut j, out) = formed(&["zeta", "alpha", "mid"], t);
    assert_eq!(round_of(&out, "n1").node_rank, 0);
    assert_eq!(round_of(&out, "n2").node_rank, 1);
    assert_eq!(round_of(&out, "n0").node_rank, 2);
    // A failure restarts everyone; the same members keep the same ranks.
    j.failure(t, "n0", 0, "exited 1".into(), None);
    let mut out = Vec::new();
    for n in ["n0", "n1", "n2"] {
        out = j.ready(t, n, 1, (format!("{n}-addr"), 7), None);
    }
    assert_eq!(round_of(&out, "n1").node_rank, 0);
    assert_eq!(round_of(&out, "n2").node_rank, 1);
    assert_eq!(round_of(&out, "n0").node_rank, 2);
    assert_eq!(round_of(&out, "n0").master_addr, "n1-addr");
}

#[test]
fn static_ranks_are_the_requested_ones_and_unique() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&req("h", 2, Some(1))));
    j.join(t, "b", &req("host-b", 2, Some(1)), S)
        .expect("join b");
    let dup = j
        .join(t, "c", &req("host-c", 2, Some(1)), S)
        .expect_err("must be refused");
    assert!(
        matches!(&dup, JoinRefused::DuplicateRank { rank: 1, holder, .. } if holder == "host-b")
    );
    assert!(dup
        .to_string()
        .contains("node rank 1 is already taken by host 'host-b'"));
    let range = j
        .join(t, "c", &req("host-c", 2, Some(2)), S)
        .expect_err("must be refused");
    assert!(matches!(range, JoinRefused::RankOutOfRange { rank: 2, .. }));
    j.join(t, "a", &req("host-a", 2, Some(0)), S)
        .expect("join a");
    j.ready(t, "b", 0, ("b".into(), 1), None);
    let out = j.ready(t, "a", 0, ("a".into(), 2), None);
    assert_eq!(round_of(&out, "b").node_rank, 1);
    assert_eq!(round_of(&out, "a").node_rank, 0);
    assert_eq!(round_of(&out, "b").master_addr, "a");
}

#[test]
fn disagreeing_settings_are_rejected_naming_both_values() {
    let t = crate::clock::epoch();
    let mut j = job(2);
    let e = j
        .join(t, "x", &req("h", 3, None), S)
        .expect_err("must be refused");
    let msg = e.to_string();
    assert!(
        msg.contains("--nnodes 2") && msg.contains("--nnodes 3"),
        "{msg}"
    );
    let mut r = req("h", 2, None);
    r.nproc_per_node = 4;
    let msg = j
        .join(t, "x", &r, S)
        .expect_err("must be refused")
        .to_string();
    assert!(
        msg.contains("--nproc-per-node 2") && msg.contains("--nproc-per-node 4"),
        "{msg}"
    );
}

#[test]
fn nodes_beyond_max_wait_as_spares_and_take_a_freed_slot() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    let out = j
        .join(t, "n9", &req("c", 2, None), S)
        .expect("a spare may join");
    assert!(out
        .iter()
        .any(|o| o.to == "n9" && matches!(&o.event, Kind::Waiting(w) if w.spare)));
    assert_eq!(
        j.phase(),
        &Phase::Running,
        "a spare does not disturb the running round"
    );
    j.ready(t, "n9", 0, ("c".into(), 9), None);
    // A participant leaves: the spare takes its slot in the next round.
    j.leave(t, "n1", "SIGTERM");
    j.ready(t, "n0", 1, ("a".into(), 1), None);
    let out = j.ready(t, "n9", 1, ("c".into(), 9), None);
    assert_eq!(round_of(&out, "n0").node_rank, 0);
    assert_eq!(round_of(&out, "n9").node_rank, 1);
    assert_eq!(j.restart_count(), 0, "membership changes are free");
}

/// `--nnodes 2:8 --nnodes-multiple-of 2` with five nodes ready.
fn in_pairs(host: &str) -> pb::JoinRequest {
    pb::JoinRequest {
        nnodes_multiple_of: 2,
        last_call_ms: 1000,
        ..elastic(host, 2, 8)
    }
}

#[test]
fn rounds_take_a_multiple_of_k_nodes_and_the_rest_wait_as_ready_spares() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&in_pairs("h")));
    let hosts = ["a", "b", "c", "d", "e"];
    for h in hosts {
        j.join(t, h, &in_pairs(h), S).expect("join");
    }
    // Five ready: at the end of the last call the round takes four (the
    // largest pair count), and the fifth waits, ready, as a spare.
    for (i, h) in hosts.iter().enumerate() {
        j.ready(t, h, 0, (format!("{h}-addr"), i as u32), None);
    }
    assert_eq!(j.phase(), &Phase::Forming, "the last call runs");
    let out = j.tick(t + Duration::from_secs(1));
    assert_eq!(j.phase(), &Phase::Running);
    let placed: Vec<&str> = hosts
        .iter()
        .copied()
        .filter(|h| {
            kinds_for(&out, h)
                .iter()
                .any(|k| matches!(k, Kind::RoundComplete(_)))
        })
        .collect();
    assert_eq!(j.participants().len(), 4, "five ready: a round of four");
    let spare = hosts
        .iter()
        .copied()
        .find(|h| !j.participants().iter().any(|p| p == h))
        .expect("one spare");
    assert!(
        kinds_for(&out, spare)
            .iter()
            .any(|k| matches!(k, Kind::Waiting(w) if w.spare)),
        "the fifth waits as a spare: {out:?}"
    );
    assert!(placed.len() <= 4);
    assert_eq!(round_of(&out, j.participants()[0].as_str()).nnodes, 4);
    // One of the four leaves: the round re-forms with the spare, four
    // again, spending nothing.
    let gone = j.participants()[1].clone();
    j.leave(t, &gone, "killed");
    let mut out = Vec::new();
    for h in hosts.iter().filter(|h| **h != gone) {
        out = j.ready(t, h, 1, (format!("{h}-addr"), 1), None);
    }
    assert_eq!(j.phase(), &Phase::Running);
    assert_eq!(j.participants().len(), 4);
    assert!(
        j.participants().iter().any(|p| p == spare),
        "the spare took the place"
    );
    assert_eq!(round_of(&out, spare).nnodes, 4);
    assert_eq!(j.restart_count(), 0, "membership changes are free");
    // Another leaves, with no spare: three left, so a round of two, and
    // one waits as a spare (the model cannot shard over three).
    let gone = j.participants()[0].clone();
    j.leave(t, &gone, "killed");
    let left: Vec<String> = j.participants().to_vec();
    let mut out = Vec::new();
    for h in hosts.iter().filter(|h| left.iter().any(|l| l == *h)) {
        out = j.ready(t, h, 2, (format!("{h}-addr"), 2), None);
    }
    assert_eq!(j.participants().len(), 2, "{out:?}");
    // A newcomer makes four available: the job grows to the next pair.
    j.join(t, "f", &in_pairs("f"), S).expect("join");
    assert_eq!(j.phase(), &Phase::Forming, "re-forms to grow");
    let mut out = Vec::new();
    for h in ["a", "b", "c", "d", "e", "f"] {
        if j.members.contains_key(h) {
            out = j.ready(t, h, 3, (format!("{h}-addr"), 3), None);
        }
    }
    assert_eq!(j.participants().len(), 4, "{out:?}");
}

#[test]
fn a_newcomer_that_does_not_make_a_usable_count_waits_without_a_restart() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&in_pairs("h")));
    for h in ["a", "b"] {
        j.join(t, h, &in_pairs(h), S).expect("join");
    }
    for h in ["a", "b"] {
        j.ready(t, h, 0, (h.into(), 1), None);
    }
    j.tick(t + Duration::from_secs(1));
    assert_eq!(j.participants().len(), 2);
    // A third: two plus one is no pair more; it waits, the round runs on.
    let out = j.join(t, "c", &in_pairs("c"), S).expect("join");
    assert_eq!(j.phase(), &Phase::Running);
    assert!(out
        .iter()
        .any(|o| o.to == "c" && matches!(&o.event, Kind::Waiting(w) if w.spare)));
    // A fourth makes a pair: re-form with four.
    j.join(t, "d", &in_pairs("d"), S).expect("join");
    assert_eq!(j.phase(), &Phase::Forming);
    assert_eq!(j.restart_count(), 0);
    // A node of another K is refused, naming the flag.
    let other = pb::JoinRequest {
        nnodes_multiple_of: 4,
        ..in_pairs("x")
    };
    let e = j.join(t, "x", &other, S).expect_err("mismatch");
    assert!(e.to_string().contains("--nnodes-multiple-of"), "{e}");
}

#[test]
fn with_a_settle_time_a_running_round_grows_once_its_spares_have_waited() {
    let t = crate::clock::epoch();
    let settled = |h: &str| pb::JoinRequest {
        scale_up_settle_ms: 5000,
        ..in_pairs(h)
    };
    let mut j = Job::new("j", JobConfig::from_join(&settled("h")));
    for h in ["a", "b"] {
        j.join(t, h, &settled(h), S).expect("join");
        j.ready(t, h, 0, (h.into(), 1), None);
    }
    j.tick(t + Duration::from_secs(1));
    assert_eq!(j.participants().len(), 2);
    // Two newcomers a second apart make a pair: no re-form yet, and one
    // re-form (not two) once the first has waited the settle time.
    let s = |secs| t + Duration::from_secs(secs);
    j.join(s(2), "c", &settled("c"), S).expect("join");
    j.join(s(3), "d", &settled("d"), S).expect("join");
    assert_eq!(j.phase(), &Phase::Running, "settling");
    assert_eq!(j.next_deadline(s(3), Duration::from_secs(600)), Some(s(8)));
    assert!(j.tick(s(7)).is_empty());
    assert_eq!(j.phase(), &Phase::Running);
    let out = j.tick(s(8));
    assert_eq!(j.phase(), &Phase::Forming, "grows: {out:?}");
    assert!(out.iter().any(|o| matches!(&o.event,
        Kind::RestartRequested(r) if !r.counted && r.reason.contains("--scale-up-settle") && r.reason.contains("grows to 4"))),
        "{out:?}");
    for h in ["a", "b", "c", "d"] {
        j.ready(s(8), h, 1, (h.into(), 2), None);
    }
    assert_eq!(j.participants().len(), 4);
    assert_eq!(j.restart_count(), 0);
    // A spare that leaves before the settle time is up: no re-form at the
    // deadline, the round of four runs on.
    j.join(s(9), "e", &settled("e"), S).expect("join");
    j.join(s(9), "f", &settled("f"), S).expect("join");
    j.leave(s(10), "f", "gone");
    let _ = j.tick(s(14));
    assert_eq!(j.phase(), &Phase::Running);
    assert_eq!(j.participants().len(), 4);
}

#[test]
fn a_first_round_waits_out_the_last_call_after_min() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 3)));
    for n in ["a", "b"] {
        j.join(t, n, &elastic(n, 2, 3), S).expect("join");
    }
    j.ready(t, "a", 0, ("a".into(), 1), None);
    let out = j.ready(t, "b", 0, ("b".into(), 2), None);
    assert!(
        matches!(&out[0].event, Kind::Waiting(w) if w.ready == 2 && w.last_call_ms == Some(30_000))
    );
    let alive =
        |j: &mut Job, at: Instant| ["a", "b"].iter().for_each(|n| assert!(j.keep_alive(at, n)));
    alive(&mut j, t + Duration::from_secs(29));
    let out = j.tick(t + Duration::from_secs(29));
    assert!(
        out.iter()
            .all(|o| matches!(&o.event, Kind::Waiting(w) if w.last_call_ms == Some(1_000))),
        "before the last call ends, only (rate-limited) progress: {out:?}"
    );
    let out = j.tick(t + Duration::from_secs(30));
    assert_eq!(round_of(&out, "a").nnodes, 2);
    assert_eq!(round_of(&out, "b").world_size, 4);
}

#[test]
fn max_nodes_complete_a_round_before_the_last_call() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 3)));
    for n in ["a", "b", "c"] {
        j.join(t, n, &elastic(n, 2, 3), S).expect("join");
        let out = j.ready(t, n, 0, (n.into(), 1), None);
        if n == "c" {
            assert_eq!(round_of(&out, "c").nnodes, 3);
        }
    }
}

#[test]
fn a_late_joiner_scales_the_job_up_for_free_and_ranks_stay() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 3)));
    for n in ["b", "c"] {
        j.join(t, n, &elastic(n, 2, 3), S).expect("join");
        j.ready(t, n, 0, (n.into(), 1), None);
    }
    j.keep_alive(t + Duration::from_secs(30), "b");
    j.keep_alive(t + Duration::from_secs(30), "c");
    let out = j.tick(t + Duration::from_secs(30));
    assert_eq!(round_of(&out, "b").node_rank, 0);
    let out = j.join(t, "a", &elastic("a", 2, 3), S).expect("join");
    assert!(out
        .iter()
        .any(|o| o.to == "b" && matches!(&o.event, Kind::RestartRequested(r) if !r.counted)));
    j.ready(t, "b", 1, ("b".into(), 1), None);
    j.ready(t, "c", 1, ("c".into(), 1), None);
    let out = j.ready(t, "a", 1, ("a".into(), 1), None);
    assert_eq!(round_of(&out, "b").node_rank, 0, "members keep their order");
    assert_eq!(round_of(&out, "c").node_rank, 1);
    assert_eq!(round_of(&out, "a").node_rank, 2, "the newcomer follows");
    assert_eq!(j.restart_count(), 0);
}

#[test]
fn survivors_of_a_lost_node_re_form_at_once_while_min_remain() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 3)));
    for n in ["a", "b", "c"] {
        j.join(t, n, &elastic(n, 2, 3), S).expect("join");
        j.ready(t, n, 0, (n.into(), 1), None);
    }
    let later = t + Duration::from_secs(16);
    j.keep_alive(later, "a");
    j.keep_alive(later, "b");
    let out = j.tick(later);
    assert!(out.iter().any(|o| o.to == "a"
        && matches!(&o.event, Kind::RestartRequested(r) if r.reason.contains("'c'"))));
    j.ready(later, "a", 1, ("a".into(), 1), None);
    let out = j.ready(later, "b", 1, ("b".into(), 1), None);
    assert_eq!(
        round_of(&out, "a").nnodes,
        2,
        "no last call when every member is ready"
    );
}

#[test]
fn failures_restart_everyone_until_the_job_budget_is_spent() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    let out = j.failure(t, "n1", 0, "exited 3".into(), None);
    assert_eq!(out.len(), 2, "both nodes are told");
    for o in &out {
        assert!(
            matches!(&o.event, Kind::RestartRequested(r) if r.round == 0 && r.next_round == 1 && r.counted)
        );
    }
    // A second report of the same round (the other node also saw a failure) is ignored.
    assert!(j.failure(t, "n0", 0, "exited 1".into(), None).is_empty());
    assert_eq!(j.restart_count(), 1);
    j.ready(t, "n0", 1, ("a".into(), 1), None);
    let out = j.ready(t, "n1", 1, ("b".into(), 1), None);
    assert_eq!(round_of(&out, "n0").restart_count, 1);
    assert_eq!(round_of(&out, "n1").restart_count, 1);
    // Budget (1) spent: the next failure fails the job on every node.
    let out = j.failure(t, "n0", 1, "exited 2".into(), None);
    assert_eq!(out.len(), 2);
    for o in &out {
        assert!(matches!(&o.event, Kind::JobFailed(f) if f.reason.contains("exited 2")));
    }
    assert!(matches!(j.phase(), Phase::Failed(_)));
    assert!(matches!(
        j.join(t, "n5", &req("c", 2, None), S),
        Err(JoinRefused::Finished {
            outcome: "failed",
            ..
        })
    ));
}

#[test]
fn a_fenced_node_re_forms_the_job_without_spending_the_budget() {
    let t = crate::clock::epoch();
    let no_budget = |h: &str| pb::JoinRequest {
        max_restarts: 0,
        ..req(h, 2, None)
    };
    let mut j = Job::new("j", JobConfig::from_join(&no_budget("h")));
    for (n, h) in [("n0", "a"), ("n1", "b")] {
        j.join(t, n, &no_budget(h), S).expect("join");
        j.ready(t, n, 0, (h.into(), 1), None);
    }
    assert_eq!(j.phase(), &Phase::Running);
    let why = "stopped its workers after 1.0 s without a rendezvous (the drop limit)";
    let out = j.fenced(t, "n1", 0, why);
    assert_eq!(out.len(), 2, "both nodes are told");
    for o in &out {
        assert!(
            matches!(&o.event, Kind::RestartRequested(r) if r.round == 0 && r.next_round == 1 && !r.counted && r.reason.contains("host 'b' stopped its workers")),
            "{o:?}"
        );
    }
    assert_eq!(j.restart_count(), 0, "no restart is counted");
    assert_eq!(j.last_failure(), None, "no worker failed");
    // The other node was fenced too; its report of the same round is stale.
    assert!(j.fenced(t, "n0", 0, why).is_empty());
    j.ready(t, "n0", 1, ("a".into(), 1), None);
    let out = j.ready(t, "n1", 1, ("b".into(), 1), None);
    let (r0, r1) = (round_of(&out, "n0"), round_of(&out, "n1"));
    assert_eq!((r0.node_rank, r1.node_rank), (0, 1), "ranks stay put");
    assert_eq!((r0.restart_count, r1.restart_count), (0, 0));
    // The budget is whole: with --max-restarts 0 a real failure fails the job.
    let out = j.failure(t, "n0", 1, "exited 1".into(), None);
    assert!(matches!(&out[0].event, Kind::JobFailed(_)), "{out:?}");
}

#[test]
fn a_fence_report_outside_the_running_round_changes_nothing() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    let why = "stopped its workers (fencing)";
    assert!(j.fenced(t, "n0", 1, why).is_empty(), "a future round");
    assert!(j.fenced(t, "nobody", 0, why).is_empty(), "not a member");
    j.success(t, "n1", 0);
    assert!(
        j.fenced(t, "n1", 0, why).is_empty(),
        "a node whose workers succeeded has nothing to re-run"
    );
    assert_eq!((j.round(), j.phase()), (0, &Phase::Running));
    // A spare of a full round has no workers to lose.
    let (mut j, _) = formed(&["a", "b"], t);
    j.join(t, "n2", &req("c", 2, None), S)
        .expect("a spare joins");
    assert!(j.fenced(t, "n2", 0, why).is_empty());
    assert_eq!((j.round(), j.phase()), (0, &Phase::Running));
}

#[test]
fn dropped_nodes_go_together_before_the_round_is_decided() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 3)));
    for n in ["a", "b", "c"] {
        j.join(t, n, &elastic(n, 2, 3), S).expect("join");
        j.ready(t, n, 0, (n.into(), 1), None);
    }
    assert_eq!(j.phase(), &Phase::Running);
    let why = "its etcd lease expired";
    // Two of the round's nodes are dropped at once: one re-form, uncounted.
    let out = j.drop_nodes(t, &["a".into(), "c".into(), "not-a-member".into()], why);
    let restarts: Vec<_> = out
        .iter()
        .filter_map(|o| match &o.event {
            Kind::RestartRequested(r) => Some(r),
            _ => None,
        })
        .collect();
    assert!(!restarts.is_empty());
    assert!(restarts.iter().all(|r| !r.counted && r.next_round == 1));
    assert!(restarts[0].reason.contains(why), "{:?}", restarts[0]);
    assert_eq!(j.restart_count(), 0);
    assert_eq!(j.members().keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(j.round(), 1);
    // b alone is below MIN (2): the round waits for more nodes.
    let out = j.ready(t, "b", 1, ("b".into(), 1), None);
    assert!(out
        .iter()
        .all(|o| !matches!(o.event, Kind::RoundComplete(_))));
    // While forming, a drop that would let the round complete on a node
    // it also drops decides only once both went.
    j.join(t, "d", &elastic("d", 2, 3), S).expect("join");
    j.join(t, "e", &elastic("e", 2, 3), S).expect("join");
    j.ready(t, "e", 1, ("e".into(), 1), None);
    assert_eq!(j.phase(), &Phase::Forming, "b and e wait for d (last call)");
    let out = j.drop_nodes(t, &["d".into(), "e".into()], why);
    assert!(
        out.iter()
            .all(|o| !matches!(o.event, Kind::RoundComplete(_))),
        "no round forms with a node the same call drops: {out:?}"
    );
    assert_eq!(j.phase(), &Phase::Forming);
    assert!(
        j.drop_nodes(t, &["d".into()], why).is_empty(),
        "gone already"
    );
}

#[test]
fn a_membership_has_its_own_number() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 1, 3)));
    j.join(t, "a", &elastic("a", 1, 3), S).expect("join");
    j.join(t, "b", &elastic("b", 1, 3), S).expect("join");
    let first = j.members()["a"].joined_seq();
    assert!(j.members()["b"].joined_seq() > first);
    j.leave(t, "a", "gone");
    j.join(t, "a", &elastic("a", 1, 3), S).expect("joins again");
    assert!(j.members()["a"].joined_seq() > j.members()["b"].joined_seq());
}

#[test]
fn success_needs_every_node_of_the_round() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    assert!(j.success(t, "n0", 0).is_empty());
    // A node whose workers succeeded may leave without disturbing the others.
    assert!(j.leave(t, "n0", "exit barrier timed out").is_empty());
    assert_eq!(j.phase(), &Phase::Running);
    let out = j.success(t, "n1", 0);
    assert!(matches!(&out[0].event, Kind::JobSucceeded(_)));
    assert_eq!(j.phase(), &Phase::Succeeded);
}

#[test]
fn a_running_node_leaving_restarts_the_rest_for_free() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    let out = j.leave(t, "n1", "SIGTERM");
    assert!(
        matches!(&out[0].event, Kind::RestartRequested(r) if !r.counted && r.reason.contains("'b' left"))
    );
    assert_eq!(j.restart_count(), 0);
    assert_eq!(j.phase(), &Phase::Forming);
    // A replacement joins and the round forms again.
    j.join(t, "n2", &req("c", 2, None), S).expect("join");
    j.ready(t, "n0", 1, ("a".into(), 1), None);
    let out = j.ready(t, "n2", 1, ("c".into(), 1), None);
    assert_eq!(
        round_of(&out, "n0").node_rank,
        0,
        "the survivor keeps rank 0"
    );
    assert_eq!(round_of(&out, "n2").node_rank, 1);
}

#[test]
fn silent_nodes_are_lost_on_the_servers_clock() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    let later = t + Duration::from_secs(10);
    j.keep_alive(later, "n0");
    assert!(j.tick(later).is_empty());
    let out = j.tick(t + Duration::from_secs(16));
    assert_eq!(
        decide(t + Duration::from_secs(16), &j),
        Decision::Wait {
            ready: 0,
            needed: 2,
            last_call_ends: None
        }
    );
    assert!(out
        .iter()
        .any(|o| o.to == "n0" && matches!(&o.event, Kind::RestartRequested(r) if !r.counted)));
    assert!(!j.members().contains_key("n1"));
}

#[test]
fn stale_reports_are_ignored() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    assert!(j.failure(t, "n0", 7, "late".into(), None).is_empty());
    assert!(j.success(t, "n0", 7).is_empty());
    assert!(
        j.ready(t, "n0", 0, ("x".into(), 1), None).is_empty(),
        "round 0 already runs"
    );
    assert_eq!(j.phase(), &Phase::Running);
}

#[test]
fn finished_jobs_and_jobs_without_members_expire_after_the_ttl() {
    let t = crate::clock::epoch();
    let ttl = Duration::from_secs(30);
    let (mut j, _) = formed(&["a"], t);
    j.success(t, "n0", 0);
    // Its members stay listed for status, but do not keep it alive.
    assert!(!j.expired(t + Duration::from_secs(1), ttl));
    assert!(j.expired(t + ttl, ttl));
    assert_eq!(j.next_deadline(t, ttl), Some(t + ttl));
    // A job whose every node left before it finished: kept for the
    // reconnect window (its nodes may come back to resume it), or the TTL
    // if that is longer.
    let (mut j, _) = formed(&["a", "b"], t);
    assert!(!j.expired(t + ttl * 10, ttl), "members are there");
    j.leave(t, "n0", "gone");
    j.leave(t, "n1", "gone");
    assert!(j.members().is_empty());
    assert!(!j.expired(t + ttl, ttl));
    assert!(!j.expired(t + Duration::from_secs(59), ttl));
    assert!(j.expired(t + RECONNECT_WINDOW, ttl));
    assert!(j.expired(t + ttl * 3, ttl * 3), "a longer TTL is kept");
    assert!(!j.expired(t + ttl * 3 - Duration::from_secs(1), ttl * 3));
    // A job that never ran a round has nothing to resume: the TTL alone
    // (agents killed while it formed must not pile up empty jobs).
    let mut j = job(2);
    j.join(t, "n0", &req("a", 2, None), S).expect("join");
    assert!(!j.expired(t + ttl * 10, ttl), "a member is there");
    j.leave(t, "n0", "gone");
    assert!(!j.expired(t + ttl - Duration::from_secs(1), ttl));
    assert!(j.expired(t + ttl, ttl));
    assert!(
        j.next_deadline(t, ttl).is_some_and(|d| d <= t + ttl),
        "the tick that forgets it comes"
    );
}

#[test]
fn every_node_dropped_for_silence_keeps_the_job_for_the_reconnect_window() {
    let t = crate::clock::epoch();
    let ttl = Duration::from_secs(5);
    let (mut j, _) = formed(&["a", "b"], t);
    // Both nodes kept a leader alive that this one never heard from.
    let dropped = t + Duration::from_secs(16);
    j.tick(dropped);
    assert!(j.members().is_empty(), "both dropped for silence");
    assert!(!j.expired(dropped + ttl, ttl));
    assert!(j.expired(dropped + RECONNECT_WINDOW, ttl));
    // A node that comes back within it finds the job, a round later.
    let mut back = req("a", 2, None);
    back.resume = Some(pb::Resume {
        round: 0,
        restart_count: 0,
        node_rank: 0,
        nnodes: 2,
    });
    let out = j
        .join(dropped + Duration::from_secs(30), "n0", &back, S)
        .expect("the job is there");
    assert!(matches!(
        kinds_for(&out, "n0")[..],
        [Kind::Joined(pb::Joined {
            round: 1,
            resumed: false,
            ..
        })]
    ));
}

#[test]
fn a_new_leader_counts_silence_from_when_it_took_the_job_over() {
    let t = crate::clock::epoch();
    let (j, _) = formed(&["a", "b"], t);
    // The last leader heard both at t and wrote the job 10 s later; the
    // record is loaded after a pause: without the handover both would be
    // dropped 5 s after it.
    let taken = t + Duration::from_secs(30);
    let mut j = Job::restore(j.record(t + Duration::from_secs(10)), taken);
    j.handed_over(taken);
    assert!(
        j.tick(taken + Duration::from_secs(14)).is_empty(),
        "nobody is lost before the drop limit has passed since the handover"
    );
    assert_eq!(j.members().len(), 2);
    assert_eq!(
        j.next_deadline(taken, Duration::from_secs(30)),
        Some(taken + Duration::from_millis(15_001))
    );
    // One node reaches the new leader; the other never does.
    j.keep_alive(taken + Duration::from_secs(10), "n0");
    let out = j.tick(taken + Duration::from_millis(15_002));
    assert!(!j.members().contains_key("n1"), "silent to this leader");
    assert!(j.members().contains_key("n0"));
    assert!(out
        .iter()
        .any(|o| o.to == "n0" && matches!(&o.event, Kind::RestartRequested(r) if !r.counted)));
}

#[test]
fn only_the_node_itself_presents_its_session() {
    let t = crate::clock::epoch();
    let (j, out) = formed(&["a", "b"], t);
    let joined_secret = |node: &str| {
        let mut j2 = job(2);
        let out = j2
            .join(
                t,
                node,
                &req("x", 2, None),
                Session::from_bytes([9; SESSION_BYTES]),
            )
            .expect("join");
        match &out[0].event {
            Kind::Joined(x) => x.session.clone(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(joined_secret("z"), vec![9; SESSION_BYTES]);
    assert!(j.authorize("n0", &S.to_vec()).is_ok());
    assert_eq!(
        j.authorize("n0", &[0; SESSION_BYTES]),
        Err(AuthError::WrongSession)
    );
    assert_eq!(j.authorize("n0", &[]), Err(AuthError::WrongSession));
    assert_eq!(j.authorize("zz", &S.to_vec()), Err(AuthError::NotMember));
    let _ = out;
}

#[test]
fn deadlines_follow_liveness_last_call_and_progress() {
    let t = crate::clock::epoch();
    let ttl = Duration::from_secs(30);
    let mut j = Job::new("j", JobConfig::from_join(&elastic("a", 2, 3)));
    assert_eq!(
        j.next_deadline(t, ttl),
        None,
        "nothing to do for an empty new job"
    );
    j.join(t, "a", &elastic("a", 2, 3), S).expect("join");
    // Forming: progress is due now.
    assert_eq!(j.next_deadline(t, ttl), Some(t));
    j.tick(t);
    let next = j.next_deadline(t, ttl).expect("some");
    assert_eq!(next, t + PROGRESS_EVERY);
    j.join(t, "b", &elastic("b", 2, 3), S).expect("join");
    j.ready(t, "a", 0, ("a".into(), 1), None);
    j.ready(t, "b", 0, ("b".into(), 1), None);
    // MIN ready: the last call (30 s) is a deadline, progress an earlier one.
    assert!(j.next_deadline(t, ttl).expect("some") <= t + PROGRESS_EVERY);
    let t29 = t + Duration::from_secs(29);
    j.keep_alive(t29, "a");
    j.keep_alive(t29, "b");
    let out = j.tick(t + Duration::from_secs(30));
    assert!(out
        .iter()
        .any(|o| matches!(o.event, Kind::RoundComplete(_))));
    assert_eq!(j.members().len(), 2, "both kept alive");
    // Running: only liveness (15 s keep-alive limit) remains.
    let d = j
        .next_deadline(t + Duration::from_secs(30), ttl)
        .expect("liveness");
    let limit = t29 + Duration::from_secs(15);
    assert!(d > limit && d <= limit + Duration::from_millis(1), "{d:?}");
}

#[test]
fn a_relearned_job_holds_at_most_its_max_nodes_placeholders() {
    let t = crate::clock::epoch();
    let mut r = req("a", 4, None);
    r.resume = Some(pb::Resume {
        round: 3,
        restart_count: 0,
        node_rank: 0,
        nnodes: u32::MAX,
    });
    let j = Job::relearn(t, "j", &r, r.resume.as_ref().expect("resume"));
    assert_eq!(j.members().len(), 4);
    // Placeholders cannot be acted for, whatever is presented.
    let placeholder = j.members().keys().next().expect("one").clone();
    assert_eq!(
        j.authorize(&placeholder, &[0; SESSION_BYTES]),
        Err(AuthError::NotMember)
    );
}

fn resume_of(out: &[Outbound], node: &str, round: u64, restart_count: u32) -> pb::Resume {
    let r = round_of(out, node);
    pb::Resume {
        round,
        restart_count,
        node_rank: r.node_rank,
        nnodes: r.nnodes,
    }
}

#[test]
fn a_reconnecting_member_resumes_only_if_its_round_is_current() {
    let t = crate::clock::epoch();
    let (mut j, out) = formed(&["a", "b"], t);
    let mut again = req("a", 2, None);
    again.resume = Some(resume_of(&out, "n0", 0, 0));
    // Without its secret, nobody resumes a member (nor learns anything).
    assert!(matches!(
        j.join(t, "n0", &again, S),
        Err(JoinRefused::WrongSession { .. })
    ));
    again.session = S.to_vec();
    let back = j.join(t, "n0", &again, S).expect("rejoin");
    assert!(matches!(&back[0].event, Kind::Joined(x) if x.resumed && x.round == 0));
    assert_eq!(j.phase(), &Phase::Running, "nothing restarted");
    // The job moves on (a failure elsewhere): a stale resume is told the new round.
    j.failure(t, "n1", 0, "exited 1".into(), None);
    let back = j.join(t, "n0", &again, S).expect("rejoin");
    assert!(matches!(&back[0].event, Kind::Joined(x) if !x.resumed && x.round == 1));
    // A plain join with a member's id is still a duplicate.
    assert!(matches!(
        j.join(t, "n0", &req("a", 2, None), S),
        Err(JoinRefused::DuplicateNode { .. })
    ));
}

#[test]
fn a_node_that_learns_of_the_restart_from_its_rejoin_is_waited_for_from_then_once() {
    // It still ran the last round's workers (the restart went to a stream it
    // had lost): it stops them within its fence of the rejoin, so the round
    // forming without it waits a drop limit from the rejoin, not from the
    // restart (accel-sim seed 96119). Once per round: a node rejoining again
    // and again cannot hold the round.
    let t = crate::clock::epoch();
    let s = Duration::from_secs(1);
    let join = |host: &str| pb::JoinRequest {
        last_call_ms: 1_000,
        ..elastic(host, 2, 3)
    };
    let mut j = Job::new("j", JobConfig::from_join(&join("a")));
    for (i, h) in ["a", "b", "c"].iter().enumerate() {
        j.join(t, &format!("n{i}"), &join(h), S).expect("join");
    }
    let mut out = Vec::new();
    for i in 0..3 {
        out = j.ready(t, &format!("n{i}"), 0, (format!("addr{i}"), 1), None);
    }
    let resume = resume_of(&out, "n2", 0, 0);
    j.failure(t, "n1", 0, "exited 1".into(), None);
    j.ready(t + s, "n0", 1, ("addr0".into(), 1), None);
    j.ready(t + s, "n1", 1, ("addr1".into(), 1), None);
    j.keep_alive(t + 10 * s, "n0");
    j.keep_alive(t + 10 * s, "n1");
    let mut again = join("c");
    again.resume = Some(resume);
    again.session = S.to_vec();
    let back = j.join(t + 10 * s, "n2", &again, S).expect("rejoin");
    assert!(matches!(&back[0].event, Kind::Joined(x) if !x.resumed && x.round == 1));
    // A drop limit (15 s) after the restart, the round still waits for it…
    assert!(
        matches!(decide(t + 16 * s, &j), Decision::Wait { ready: 2, last_call_ends: Some(e), .. } if e == t + 25 * s),
        "{:?}",
        decide(t + 16 * s, &j)
    );
    // …and a second rejoin does not move that.
    j.join(t + 20 * s, "n2", &again, S).expect("rejoin again");
    assert!(matches!(
        decide(t + 21 * s, &j),
        Decision::Wait { last_call_ends: Some(e), .. } if e == t + 25 * s
    ));
    assert!(matches!(decide(t + 25 * s, &j), Decision::Complete(_)));
}

#[test]
fn a_restarted_server_relearns_a_running_job_and_loses_silent_members() {
    let t = crate::clock::epoch();
    let (_, out) = formed(&["a", "b", "c"], t);
    let mut r = req("a", 3, None);
    r.resume = Some(resume_of(&out, "n0", 4, 2));
    let mut j = Job::relearn(t, "j", &r, r.resume.as_ref().expect("resume"));
    let back = j.join(t, "n0", &r, S).expect("first node back");
    assert!(matches!(&back[0].event, Kind::Joined(x) if x.resumed && x.round == 4));
    assert_eq!(
        (j.round(), j.restart_count(), j.phase()),
        (4, 2, &Phase::Running)
    );
    let mut r1 = req("b", 3, None);
    r1.resume = Some(resume_of(&out, "n1", 4, 2));
    assert!(
        matches!(&j.join(t, "n1", &r1, S).expect("second")[0].event, Kind::Joined(x) if x.resumed)
    );
    // n2 never comes back: lost after the keep-alive limit; the others re-form.
    let later = t + Duration::from_secs(16);
    j.keep_alive(later, "n0");
    j.keep_alive(later, "n1");
    let out = j.tick(later);
    assert!(out.iter().any(|o| o.to == "n0"
        && matches!(&o.event, Kind::RestartRequested(x) if !x.counted && x.next_round == 5)));
    assert!(!j.members().contains_key("n2"));
}

#[test]
fn a_spare_cannot_fail_the_running_round() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    // A third node joins the full job: it waits as a spare, with its own secret.
    j.join(t, "spare", &req("c", 2, None), S)
        .expect("spare joins");
    assert!(j.failure(t, "spare", 0, "owned".into(), None).is_empty());
    assert_eq!((j.restart_count(), j.phase()), (0, &Phase::Running));
}

#[test]
fn placeholders_expire_even_without_a_keep_alive_limit() {
    let t = crate::clock::epoch();
    let mut r = req("a", 3, None);
    r.dead_after_ms = 0;
    r.resume = Some(pb::Resume {
        round: 2,
        restart_count: 0,
        node_rank: 0,
        nnodes: 3,
    });
    let mut j = Job::relearn(t, "j", &r, r.resume.as_ref().expect("resume"));
    assert_eq!(j.absent_count(), 3);
    j.join(t, "n0", &r, S).expect("claims rank 0");
    assert_eq!(j.absent_count(), 2);
    let ttl = Duration::from_secs(30);
    let due = j
        .next_deadline(t, ttl)
        .expect("placeholders have a deadline");
    assert!(due <= t + RELEARN_WINDOW + Duration::from_millis(1));
    j.tick(t + RELEARN_WINDOW + Duration::from_secs(1));
    assert_eq!(j.absent_count(), 0);
    assert_eq!(j.members().len(), 1, "only the node that came back");
}

#[test]
fn a_member_reconnects_with_its_secret_even_without_resume() {
    let t = crate::clock::epoch();
    let mut j = job(2);
    j.join(t, "n0", &req("a", 2, None), S).expect("join");
    let mut again = req("a", 2, None);
    again.session = S.to_vec();
    let back = j.join(t, "n0", &again, S).expect("reattaches");
    assert!(matches!(&back[0].event, Kind::Joined(x) if !x.resumed && x.session == S.to_vec()));
    again.session = vec![1; SESSION_BYTES];
    assert!(matches!(
        j.join(t, "n0", &again, S),
        Err(JoinRefused::WrongSession { .. })
    ));
}

#[test]
fn a_round_never_forms_while_a_node_of_the_last_one_may_not_have_heard_the_restart() {
    // Three nodes ran round 0; one fails. The other two stop and are
    // ready for round 1, but c has not said it stopped: if it is cut off
    // from the server's events, its workers still hold ranks the new round
    // would give away, until it fences them within the drop limit (15 s).
    let t = crate::clock::epoch();
    let quick = |h: &str, min, max| pb::JoinRequest {
        last_call_ms: 1_000,
        max_restarts: 5,
        ..elastic(h, min, max)
    };
    let mut j = Job::new("j", JobConfig::from_join(&quick("h", 2, 3)));
    for n in ["a", "b", "c"] {
        j.join(t, n, &quick(n, 2, 3), S).expect("join");
    }
    for n in ["a", "b", "c"] {
        j.ready(t, n, 0, (n.into(), 1), None);
    }
    assert_eq!(j.phase(), &Phase::Running);
    j.failure(t, "a", 0, "worker 0 failed".into(), None);
    assert_eq!((j.phase(), j.round()), (&Phase::Forming, 1));
    j.ready(t, "a", 1, ("a".into(), 1), None);
    j.ready(t, "b", 1, ("b".into(), 1), None);
    // The last call is over: still no round beside c's workers, and the
    // job wakes when c must have fenced them.
    let later = t + Duration::from_secs(5);
    let out = j.tick(later);
    assert!(
        out.iter()
            .all(|o| !matches!(o.event, Kind::RoundComplete(_))),
        "{out:?}"
    );
    assert_eq!(
        decide(later, &j),
        Decision::Wait {
            ready: 2,
            needed: 2,
            last_call_ends: Some(t + Duration::from_secs(15)),
        },
    );
    // c hears and is ready: a full round at once.
    let out = j.ready(later, "c", 1, ("c".into(), 1), None);
    assert_eq!(round_of(&out, "a").nnodes, 3);
    // Once the drop limit from the restart passed, c (still silent, or
    // backing off with its workers gone) holds nobody up.
    j.failure(later, "a", 1, "worker 0 failed".into(), None);
    j.ready(later, "a", 2, ("a".into(), 1), None);
    j.ready(later, "b", 2, ("b".into(), 1), None);
    for n in ["a", "b", "c"] {
        assert!(j.keep_alive(later + Duration::from_secs(14), n));
    }
    assert!(j
        .tick(later + Duration::from_secs(14))
        .iter()
        .all(|o| !matches!(o.event, Kind::RoundComplete(_))));
    let out = j.tick(later + Duration::from_secs(15));
    assert_eq!(round_of(&out, "a").nnodes, 2);
    // The same when the round would fill up (MAX) with a newcomer.
    let mut j = Job::new("j", JobConfig::from_join(&elastic("h", 2, 2)));
    for n in ["a", "b"] {
        j.join(t, n, &elastic(n, 2, 2), S).expect("join");
    }
    for n in ["a", "b"] {
        j.ready(t, n, 0, (n.into(), 1), None);
    }
    j.join(t, "d", &elastic("d", 2, 2), S).expect("join");
    j.failure(t, "a", 0, "worker 0 failed".into(), None);
    j.ready(t, "a", 1, ("a".into(), 1), None);
    let out = j.ready(t, "d", 1, ("d".into(), 1), None);
    assert!(
        out.iter()
            .all(|o| !matches!(o.event, Kind::RoundComplete(_))),
        "b may still run rank 1's workers: {out:?}"
    );
    let out = j.ready(t, "b", 1, ("b".into(), 1), None);
    assert_eq!(round_of(&out, "a").nnodes, 2, "b stopped: a full round");
}

fn at(host: &str, topology: &str, min: u32, max: u32) -> pb::JoinRequest {
    pb::JoinRequest {
        topology: topology.into(),
        max_restarts: 5,
        ..elastic(host, min, max)
    }
}

/// A job of `min..=max` nodes that `nodes` (id, host, topology path) joined.
fn topo_job(t: Instant, min: u32, max: u32, nodes: &[(&str, &str, &str)]) -> Job {
    let mut j = Job::new("j", JobConfig::from_join(&at("h", "", min, max)));
    for (id, host, topo) in nodes {
        j.join(t, id, &at(host, topo, min, max), S).expect("join");
    }
    j
}

/// Node ranks of the round `out` completes, by node id.
fn ranks(out: &[Outbound]) -> BTreeMap<String, (u32, u32, u32, u32)> {
    out.iter()
        .filter_map(|o| match &o.event {
            Kind::RoundComplete(r) => Some((
                o.to.clone(),
                (
                    r.node_rank,
                    r.segment,
                    r.segment_first_node,
                    r.segment_nodes,
                ),
            )),
            _ => None,
        })
        .collect()
}

fn ready_all(j: &mut Job, t: Instant, round: u64) -> Vec<Outbound> {
    let ids: Vec<String> = j.members().keys().cloned().collect();
    let mut out = Vec::new();
    for id in ids {
        out.extend(j.ready(t, &id, round, (format!("{id}-addr"), 1), None));
    }
    out
}

#[test]
fn first_ranks_group_segments_and_compare_numbers_as_numbers() {
    let t = crate::clock::epoch();
    let mut j = topo_job(
        t,
        6,
        6,
        &[
            ("a", "node10", "zone-a/rack-2"),
            ("b", "node2", "zone-a/rack-10"),
            ("c", "node1", "zone-a/rack-2"),
            ("d", "node9", "zone-a/rack-10"),
            ("e", "node3", "zone-a/rack-2"),
            ("f", "node11", "zone-a/rack-10"),
        ],
    );
    let r = ranks(&ready_all(&mut j, t, 0));
    // rack-2 before rack-10; within a rack, node1 < node3 < node10.
    let order: Vec<&str> = {
        let mut v: Vec<_> = r.iter().collect();
        v.sort_by_key(|(_, (rank, ..))| *rank);
        v.into_iter().map(|(id, _)| id.as_str()).collect()
    };
    assert_eq!(order, ["c", "e", "a", "b", "d", "f"]);
    assert_eq!(r["c"], (0, 0, 0, 3));
    assert_eq!(r["a"], (2, 0, 0, 3));
    assert_eq!(r["b"], (3, 1, 3, 3));
    assert_eq!(r["f"], (5, 1, 3, 3));
}

#[test]
fn a_departed_node_s_rank_goes_to_a_spare_of_its_segment() {
    let t = crate::clock::epoch();
    // 4 places, 2 racks of 2, and a spare in each rack.
    let mut j = topo_job(
        t,
        2,
        4,
        &[
            ("a", "n1", "r1"),
            ("b", "n2", "r1"),
            ("c", "n3", "r2"),
            ("d", "n4", "r2"),
        ],
    );
    let first = ranks(&ready_all(&mut j, t, 0));
    assert_eq!(
        [first["a"].0, first["b"].0, first["c"].0, first["d"].0],
        [0, 1, 2, 3]
    );
    // Spares arrive while the round is full: one per rack, the r2 one with
    // the host name that sorts first overall.
    j.join(t, "s2", &at("n0-spare", "r2", 2, 4), S)
        .expect("spare r2");
    j.join(t, "s1", &at("n9-spare", "r1", 2, 4), S)
        .expect("spare r1");
    // b (rank 1, rack r1) dies: its place goes to r1's spare; nobody else moves.
    j.leave(t, "b", "killed");
    let next = ranks(&ready_all(&mut j, t, 1));
    assert_eq!(next["a"].0, 0);
    assert_eq!(next["s1"].0, 1, "{next:?}");
    assert_eq!(next["c"].0, 2);
    assert_eq!(next["d"].0, 3);
    assert!(!next.contains_key("s2"), "s2 stays a spare: {next:?}");
    assert_eq!(next["s1"].1, 0);
    assert_eq!((next["d"].1, next["d"].2, next["d"].3), (1, 2, 2));
}

#[test]
fn without_a_spare_of_its_segment_the_place_closes_and_newcomers_join_their_run() {
    let t = crate::clock::epoch();
    let mut j = topo_job(
        t,
        1,
        8,
        &[("a", "n1", "r1"), ("b", "n2", "r1"), ("c", "n3", "r2")],
    );
    let mut out = Vec::new();
    for id in ["a", "b", "c"] {
        out.extend(j.ready(t, id, 0, (id.into(), 1), None));
    }
    // MIN (1) is ready: the round forms when the last call (30 s) ends; the
    // nodes keep alive meanwhile (the drop limit is 15 s).
    let t1 = t + Duration::from_secs(30);
    for id in ["a", "b", "c"] {
        j.keep_alive(t1, id);
    }
    out.extend(j.tick(t1));
    let r0 = ranks(&out);
    assert_eq!([r0["a"].0, r0["b"].0, r0["c"].0], [0, 1, 2]);
    // a leaves; an r2 node and an r0 node (a segment new to the job) join.
    j.leave(t1, "a", "gone");
    j.join(t1, "x", &at("n7", "r2", 1, 8), S).expect("x");
    j.join(t1, "y", &at("n8", "r0", 1, 8), S).expect("y");
    let round = j.round();
    let r1 = ranks(&ready_all(&mut j, t1, round));
    // a's place (r1) has no r1 newcomer: it closes; x follows c (its
    // segment), y (a segment new to the job) comes last.
    assert_eq!(r1["b"].0, 0, "{r1:?}");
    assert_eq!(r1["c"].0, 1);
    assert_eq!(r1["x"].0, 2);
    assert_eq!(r1["y"].0, 3);
    assert_eq!((r1["x"].1, r1["x"].2, r1["x"].3), (1, 1, 2));
}

#[test]
fn ranks_stay_put_across_restarts_while_membership_holds() {
    let t = crate::clock::epoch();
    let mut j = topo_job(
        t,
        4,
        4,
        &[
            ("a", "n4", "r2"),
            ("b", "n3", "r1"),
            ("c", "n2", "r2"),
            ("d", "n1", "r1"),
        ],
    );
    let first = ranks(&ready_all(&mut j, t, 0));
    for round in 1..4 {
        j.failure(t, "a", round - 1, "exited 1".into(), None);
        let again = ranks(&ready_all(&mut j, t, round));
        assert_eq!(again, first, "round {round}");
    }
}

#[test]
fn newcomers_never_push_a_node_that_keeps_its_place_out_at_max() {
    let t = crate::clock::epoch();
    let mut j = topo_job(
        t,
        4,
        4,
        &[
            ("a", "n1", "r1"),
            ("b", "n2", "r1"),
            ("c", "n3", "r2"),
            ("d", "n4", "r2"),
        ],
    );
    let first = ranks(&ready_all(&mut j, t, 0));
    // A spare of r1 waits; a worker fails: all five offer themselves, the
    // spare (id "0s") first, so MAX are ready before the last veteran is.
    j.join(t, "0s", &at("n0", "r1", 4, 4), S).expect("spare");
    j.failure(t, "a", 0, "exited 1".into(), None);
    let again = ranks(&ready_all(&mut j, t, 1));
    assert!(
        !again.contains_key("0s"),
        "the spare still waits: {again:?}"
    );
    assert_eq!(again, first);
}

#[test]
fn a_restored_job_knows_the_segments_of_the_places_its_nodes_hold() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&at("h", "", 1, 6)));
    let nodes = [("a", "r1"), ("b", "r2"), ("c", "r3"), ("d", "r4")];
    for (id, topo) in nodes {
        j.join(t, id, &at(id, topo, 1, 6), S).expect("join");
    }
    let t1 = t + Duration::from_secs(30);
    for (id, _) in nodes {
        j.ready(t, id, 0, (id.into(), 1), None);
        j.keep_alive(t1, id);
    }
    let formed = ranks(&j.tick(t1));
    assert_eq!(formed["b"].0, 1, "{formed:?}");
    // b departs (the job re-forms without it), then a replica takes over.
    j.leave(t1, "b", "gone");
    let restored = Job::restore(j.record(t1), t1);
    assert_eq!(
        restored
            .slot_topologies
            .iter()
            .map(|s| s.as_deref())
            .collect::<Vec<_>>(),
        [Some("r1"), None, Some("r3"), Some("r4")],
        "by rank, b's place unknown"
    );
}

#[test]
fn the_round_waits_for_the_spare_of_a_departed_node_s_segment() {
    let t = crate::clock::epoch();
    let mut j = topo_job(
        t,
        4,
        4,
        &[
            ("a", "n1", "r1"),
            ("b", "n2", "r1"),
            ("c", "n3", "r2"),
            ("d", "n4", "r2"),
        ],
    );
    ready_all(&mut j, t, 0);
    j.join(t, "s2", &at("n5", "r2", 4, 4), S).expect("spare r2");
    j.join(t, "s1", &at("n6", "r1", 4, 4), S).expect("spare r1");
    j.leave(t, "a", "killed");
    // MAX (4) ready without r1's spare: the round waits for it...
    let mut out = Vec::new();
    for id in ["b", "c", "d", "s2"] {
        out.extend(j.ready(t, id, 1, (id.into(), 1), None));
    }
    assert!(ranks(&out).is_empty(), "formed without the spare: {out:?}");
    assert!(matches!(decide(t, &j), Decision::Wait { .. }));
    // ...which takes a's place when it is ready.
    let r = ranks(&j.ready(t, "s1", 1, ("s1".into(), 1), None));
    assert_eq!(
        [r["s1"].0, r["b"].0, r["c"].0, r["d"].0],
        [0, 1, 2, 3],
        "{r:?}"
    );
    assert!(!r.contains_key("s2"));
    // With no spare of r1 among the members, b's place closes at once and
    // r2's spare follows its segment.
    j.leave(t, "b", "killed");
    let mut out = Vec::new();
    for id in ["s1", "c", "d", "s2"] {
        out.extend(j.ready(t, id, 2, (id.into(), 1), None));
    }
    let r = ranks(&out);
    assert_eq!(
        [r["s1"].0, r["c"].0, r["d"].0, r["s2"].0],
        [0, 1, 2, 3],
        "{r:?}"
    );
}

#[test]
fn a_no_restart_exit_code_ends_the_job_at_once_with_that_code() {
    let t = crate::clock::epoch();
    let fatal = |host: &str| pb::JoinRequest {
        no_restart_exit_code: 93,
        max_restarts: 5,
        ..req(host, 2, None)
    };
    let mut j = Job::new("j", JobConfig::from_join(&fatal("h")));
    for n in ["n0", "n1"] {
        j.join(t, n, &fatal(n), S).expect("join");
    }
    ready_all(&mut j, t, 0);
    assert_eq!(j.config().max_restarts, 5);
    // Another code than the job's is an ordinary failure (a restart).
    let out = j.fatal_failure(t, "n1", 0, "exited with 7".into(), None, 7);
    assert!(
        out.iter()
            .any(|o| matches!(o.event, Kind::RestartRequested(_))),
        "{out:?}"
    );
    assert_eq!(j.restart_count(), 1);
    ready_all(&mut j, t, 1);
    let out = j.fatal_failure(t, "n1", 1, "worker rank 2 exited with 93".into(), None, 93);
    let failed: Vec<&pb::JobFailed> = out
        .iter()
        .filter_map(|o| match &o.event {
            Kind::JobFailed(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "every member is told: {out:?}");
    assert!(failed.iter().all(|f| f.exit_code == Some(93)));
    assert!(
        failed[0].reason.contains("--no-restart-exit-code"),
        "{}",
        failed[0].reason
    );
    assert!(
        failed[0]
            .reason
            .contains("4 of --max-restarts 5 left unused"),
        "{}",
        failed[0].reason
    );
    assert!(matches!(j.phase(), Phase::Failed(_)));
    assert_eq!((j.restart_count(), j.exit_code()), (1, 93));
    let stone = crate::tombstone::Tombstone::of(&j, 0, &BTreeMap::new()).expect("over");
    assert_eq!(stone.exit_code, 93, "a late agent is told the code too");
    // The code survives a failover, and a stale report changes nothing.
    let restored = Job::restore(j.record(t), t);
    assert_eq!(restored.exit_code(), 93);
    assert!(j
        .fatal_failure(t, "n0", 1, "late".into(), None, 93)
        .is_empty());
    assert_eq!(j.exit_code(), 93);
}

#[test]
fn a_ready_spare_of_the_segment_is_enough_the_round_does_not_wait_for_another() {
    // Found by the rdzv_job fuzz target: MAX 1, two spares of the departed
    // node's (empty) segment; the first ready one takes the place at once.
    let t = crate::clock::epoch();
    let mut j = job(1);
    for n in ["n0", "n1", "n2"] {
        j.join(t, n, &req(n, 1, None), S).expect("join");
    }
    let out = j.ready(t, "n0", 0, ("n0".into(), 1), None);
    assert_eq!(round_of(&out, "n0").node_rank, 0);
    j.leave(t, "n0", "gone");
    let r = ranks(&j.ready(t, "n1", 1, ("n1".into(), 1), None));
    assert_eq!(r.get("n1").map(|row| row.0), Some(0), "{r:?}");
}

// ---- quarantine ----------------------------------------------------------

/// Three worker failures within a minute bench a host for ten minutes.
fn three_strikes() -> QuarantinePolicy {
    QuarantinePolicy {
        after: 3,
        window: Duration::from_secs(60),
        hold: Duration::from_secs(600),
        stragglers: false,
    }
}

/// A job of `min..=max` with nodes a, b, c on hosts n1, n2, n3 (node ranks
/// 0, 1, 2), quarantining by [`three_strikes`]: c's workers fail in rounds
/// 0, 1 and 2, so its host is benched at `t` and round 3 is forming.
fn c_benched(t: Instant, min: u32, max: u32) -> (Job, Vec<Outbound>) {
    let nodes = [("a", "n1", ""), ("b", "n2", ""), ("c", "n3", "")];
    let mut j = topo_job(t, min, max, &nodes).with_quarantine(Some(three_strikes()));
    let first = ranks(&ready_all(&mut j, t, 0));
    assert_eq!([first["a"].0, first["b"].0, first["c"].0], [0, 1, 2]);
    let mut out = Vec::new();
    for round in 0..3 {
        if round > 0 {
            let again = ranks(&ready_all(&mut j, t, round));
            assert_eq!(again.len(), 3, "round {round}: {again:?}");
        }
        out = j.failure(t, "c", round, "worker 0 exited with 1".into(), None);
    }
    assert_eq!((j.round(), j.phase()), (3, &Phase::Forming));
    (j, out)
}

fn waiting_of(out: &[Outbound], node: &str) -> Option<pb::Waiting> {
    kinds_for(out, node).into_iter().find_map(|k| match k {
        Kind::Waiting(w) => Some(w.clone()),
        _ => None,
    })
}

fn restart_of(out: &[Outbound]) -> Option<pb::RestartRequested> {
    out.iter().find_map(|o| match &o.event {
        Kind::RestartRequested(r) => Some(r.clone()),
        _ => None,
    })
}

#[test]
fn a_host_failing_three_times_is_benched_and_the_job_goes_on_without_it() {
    let t = crate::clock::epoch();
    let (mut j, out) = c_benched(t, 2, 3);
    let restart = restart_of(&out).expect("the third failure restarts");
    assert!(restart.counted, "{restart:?}");
    assert!(
        restart.reason.contains("host 'n3' is quarantined"),
        "{}",
        restart.reason
    );
    assert!(j.is_benched(&j.members()["c"]));
    assert_eq!(j.benched_count(), 1);
    // a and b are every member that may take part: the round forms at
    // once with them, at the places they held; c is told why it waits.
    let out = ready_all(&mut j, t, 3);
    let r = ranks(&out);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!((r["a"].0, r["b"].0), (0, 1));
    assert_eq!(round_of(&out, "a").nnodes, 2);
    assert_eq!(j.phase(), &Phase::Running);
    assert_eq!(j.members()["c"].rank, None);
    let w = waiting_of(&out, "c").expect("c hears why it waits");
    assert!(w.spare, "{w:?}");
    assert!(
        w.quarantine.contains("3 worker failures within 1m"),
        "{}",
        w.quarantine
    );
    assert_eq!(w.quarantine_left_ms, 600_000);
    // Unbenched members' progress says nothing of a quarantine.
    assert!(j.waiting_of(t, "a", false).quarantine.is_empty());
}

#[test]
fn a_bench_spends_the_budget_as_usual_and_a_benched_node_cannot_fail_the_round() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 2, 3);
    assert_eq!(j.restart_count(), 3, "every failure is counted");
    ready_all(&mut j, t, 3);
    assert_eq!(j.phase(), &Phase::Running);
    // c is not in round 3: its reports change nothing.
    assert!(j.failure(t, "c", 3, "exited 1".into(), None).is_empty());
    assert!(j
        .fatal_failure(t, "c", 3, "exited 1".into(), None, 1)
        .is_empty());
    assert_eq!((j.restart_count(), j.round()), (3, 3));
    assert_eq!(j.phase(), &Phase::Running);
    // A benched host is not counted again while benched.
    assert!(j.quarantine().counts().all(|(h, _)| h != "n3"));
}

#[test]
fn a_bench_ending_on_time_re_forms_a_running_job_with_room_without_spending_the_budget() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 2, 3);
    ready_all(&mut j, t, 3);
    let until = t + Duration::from_secs(600);
    assert_eq!(j.quarantine().next_expiry(), Some(until));
    let next = j
        .next_deadline(t + Duration::from_secs(590), Duration::from_secs(3600))
        .expect("a deadline");
    assert!(next <= until, "the bench's end is a deadline");
    // Just before its end nothing happens; at it, the job re-forms.
    for id in ["a", "b", "c"] {
        j.keep_alive(until - Duration::from_millis(1), id);
    }
    let early = j.tick(until - Duration::from_millis(1));
    assert!(restart_of(&early).is_none(), "{early:?}");
    assert!(j.is_benched(&j.members()["c"]));
    let out = j.tick(until);
    let restart = restart_of(&out).expect("a membership restart");
    assert!(!restart.counted, "{restart:?}");
    assert!(
        restart.reason.contains("its quarantine ended"),
        "{}",
        restart.reason
    );
    assert_eq!((j.restart_count(), j.benched_count()), (3, 0));
    let r = ranks(&ready_all(&mut j, until, 4));
    assert_eq!([r["a"].0, r["b"].0, r["c"].0], [0, 1, 2], "{r:?}");
}

#[test]
fn an_operator_s_release_re_forms_the_job_as_well() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 2, 3);
    ready_all(&mut j, t, 3);
    let t1 = t + Duration::from_secs(5);
    assert!(j.release_host(t1, "n1").is_none(), "n1 is not benched");
    let out = j.release_host(t1, "n3").expect("n3 was benched");
    let restart = restart_of(&out).expect("a membership restart");
    assert!(!restart.counted, "{restart:?}");
    assert!(
        restart.reason.contains("an operator released it"),
        "{}",
        restart.reason
    );
    assert!(j.release_host(t1, "n3").is_none(), "released once");
    assert_eq!(j.restart_count(), 3);
    let r = ranks(&ready_all(&mut j, t1, 4));
    assert_eq!([r["a"].0, r["b"].0, r["c"].0], [0, 1, 2], "{r:?}");
}

#[test]
fn without_room_to_go_on_the_job_waits_for_the_benched_host() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 3, 3);
    let out = ready_all(&mut j, t, 3);
    assert!(ranks(&out).is_empty(), "formed without n3: {out:?}");
    // Every progress report c hears says why it waits (the periodic one
    // to every member once lacked it).
    let to_c: Vec<&Kind> = kinds_for(&out, "c");
    assert!(!to_c.is_empty());
    for k in to_c {
        assert!(
            matches!(k, Kind::Waiting(w) if !w.quarantine.is_empty() && w.spare),
            "{k:?}"
        );
    }
    assert!(matches!(decide(t, &j), Decision::Wait { ready: 2, .. }));
    // Time passes (the last call, the drop limit): still waiting.
    let t1 = t + Duration::from_secs(120);
    for id in ["a", "b", "c"] {
        j.keep_alive(t1, id);
    }
    assert!(ranks(&j.tick(t1)).is_empty());
    assert_eq!(j.phase(), &Phase::Forming);
    // Released, c's offer (kept meanwhile) counts: the round forms.
    let out = j.release_host(t1, "n3").expect("benched");
    let r = ranks(&out);
    assert_eq!([r["a"].0, r["b"].0, r["c"].0], [0, 1, 2], "{r:?}");
    assert_eq!(j.restart_count(), 3);
}

#[test]
fn benches_and_failure_counts_survive_a_record_and_a_benched_offer_does_not_count() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 2, 3);
    ready_all(&mut j, t, 3);
    // One failure of n1 is counted; round 4 forms with a and c offering.
    j.failure(t, "a", 3, "exited 1".into(), None);
    j.ready(t, "a", 4, ("a".into(), 1), None);
    j.ready(t, "c", 4, ("c".into(), 1), None);
    assert_eq!(super::fuzzing::internals(&j).ready, 1, "c's offer waits");
    let t1 = t + Duration::from_secs(10);
    let record = j.record(t1);
    assert_eq!(record.benched.len(), 1);
    assert_eq!(record.benched[0].0, "n3");
    assert_eq!(record.bench_repeats.len(), 1, "n3's bench in a row is kept");
    assert_eq!(
        record
            .failure_counts
            .iter()
            .map(|(h, at)| (h.as_str(), at.len()))
            .collect::<Vec<_>>(),
        [("n1", 1)]
    );
    let restored = Job::restore(record.clone(), t1);
    assert_eq!(restored.record(t1), record, "the same job");
    assert_eq!(super::fuzzing::internals(&restored).ready, 1);
    assert_eq!(restored.benched_count(), 1);
    assert!(restored.is_benched(&restored.members()["c"]));
    assert_eq!(
        restored.quarantine().next_expiry(),
        Some(t + Duration::from_secs(600))
    );
}

#[test]
fn static_ranks_are_never_benched() {
    let t = crate::clock::epoch();
    let fixed = |host: &str, rank| pb::JoinRequest {
        max_restarts: 5,
        ..req(host, 2, Some(rank))
    };
    let strict = QuarantinePolicy {
        after: 1,
        ..three_strikes()
    };
    let mut j = Job::new("j", JobConfig::from_join(&fixed("h", 0))).with_quarantine(Some(strict));
    j.join(t, "a", &fixed("n1", 0), S).expect("join a");
    j.join(t, "b", &fixed("n2", 1), S).expect("join b");
    ready_all(&mut j, t, 0);
    for round in 0..3 {
        let out = j.failure(t, "b", round, "exited 1".into(), None);
        let restart = restart_of(&out).expect("a restart");
        assert!(!restart.reason.contains("quarantine"), "{}", restart.reason);
        let r = ranks(&ready_all(&mut j, t, round + 1));
        assert_eq!((r["a"].0, r["b"].0), (0, 1), "round {}", round + 1);
    }
    assert!(j.quarantine().is_empty());
    assert_eq!(j.benched_count(), 0);
}

#[test]
fn a_round_without_a_benched_node_waits_until_it_may_no_longer_run_its_workers() {
    // Found by the simulator (accel-sim seed 6886): the benched node held
    // node rank 0 and was still stopping its other workers when the round
    // formed without it ("every remaining member ready"), giving its ranks
    // to another node.
    let t = crate::clock::epoch();
    let strict = QuarantinePolicy {
        after: 1,
        ..three_strikes()
    };
    let mut j =
        topo_job(t, 1, 2, &[("a", "n1", ""), ("b", "n2", "")]).with_quarantine(Some(strict));
    let first = ranks(&ready_all(&mut j, t, 0));
    assert_eq!((first["a"].0, first["b"].0), (0, 1));
    j.failure(t, "a", 0, "worker 0 exited with 1".into(), None);
    assert!(j.is_benched(&j.members()["a"]));
    // b is every member that may take part, but a (rank 0) has not offered.
    let out = j.ready(t, "b", 1, ("b".into(), 1), None);
    assert!(ranks(&out).is_empty(), "formed beside a's workers: {out:?}");
    assert!(matches!(
        decide(t, &j),
        Decision::Wait { last_call_ends: Some(e), .. } if e == t + Duration::from_secs(15)
    ));
    // a's offer (kept, not counted) says its workers are gone.
    let out = j.ready(t, "a", 1, ("a".into(), 1), None);
    let r = ranks(&out);
    assert_eq!((r.len(), r["b"].0), (1, 0), "{r:?}");
    // Without a's offer, the round forms at the drop limit.
    let mut j =
        topo_job(t, 1, 2, &[("a", "n1", ""), ("b", "n2", "")]).with_quarantine(Some(strict));
    ready_all(&mut j, t, 0);
    j.failure(t, "a", 0, "worker 0 exited with 1".into(), None);
    assert!(ranks(&j.ready(t, "b", 1, ("b".into(), 1), None)).is_empty());
    let limit = t + Duration::from_secs(15);
    for id in ["a", "b"] {
        j.keep_alive(limit, id);
    }
    let r = ranks(&j.tick(limit));
    assert_eq!((r.len(), r["b"].0), (1, 0), "{r:?}");
}

#[test]
fn a_benched_host_joining_a_running_job_with_room_waits_without_a_restart() {
    let t = crate::clock::epoch();
    let (mut j, _) = c_benched(t, 2, 3);
    ready_all(&mut j, t, 3);
    assert_eq!(j.phase(), &Phase::Running);
    // c leaves (its health check, say) and comes back as a new node of
    // the same host: the running round of two has room, but nothing
    // would re-form with it.
    j.leave(t, "c", "the node failed its health check");
    assert_eq!((j.round(), j.phase()), (3, &Phase::Running));
    let out = j.join(t, "c2", &at("n3", "", 2, 3), S).expect("joins");
    assert!(restart_of(&out).is_none(), "{out:?}");
    let w = waiting_of(&out, "c2").expect("told why it waits");
    assert!(
        w.spare && w.quarantine.contains("3 worker failures"),
        "{w:?}"
    );
    assert_eq!((j.round(), j.phase()), (3, &Phase::Running));
    // A node of another host still scales the job up.
    let out = j.join(t, "d", &at("n4", "", 2, 3), S).expect("joins");
    assert!(restart_of(&out).is_some_and(|r| !r.counted), "{out:?}");
}

#[test]
fn a_benched_node_without_a_rank_of_its_own_gets_none_in_a_static_job() {
    let t = crate::clock::epoch();
    let mut j = Job::new("j", JobConfig::from_join(&req("h", 2, Some(0))))
        .with_quarantine(Some(three_strikes()));
    j.join(t, "s0", &req("h0", 2, Some(0)), S).expect("join");
    j.join(t, "s1", &req("h1", 2, Some(1)), S).expect("join");
    // A member that asked for no rank, on a host benched from outside.
    j.join(t, "x", &req("bad", 2, None), S).expect("join");
    j.bench_host(t, "bad", t + Duration::from_secs(60), "why".into())
        .expect("benched");
    let out = ready_all(&mut j, t, 0);
    let r = ranks(&out);
    assert!(!r.contains_key("x"), "{r:?}");
    assert_eq!((r["s0"].0, r["s1"].0), (0, 1), "{r:?}");
}

/// A job whose agents ride out outages (`outage_timeout` 900 s, keep-alives
/// every 5 s, drop limit 15 s), formed on `hosts`.
fn riding(hosts: &[&str], t: Instant) -> Job {
    let n = hosts.len() as u32;
    let r = pb::JoinRequest {
        outage_ms: 900_000,
        keep_alive_ms: 5_000,
        ..req("h", n, None)
    };
    let mut j = Job::new("j", JobConfig::from_join(&r));
    for (i, h) in hosts.iter().enumerate() {
        j.join(
            t,
            &format!("n{i}"),
            &pb::JoinRequest {
                hostname: (*h).into(),
                ..r.clone()
            },
            S,
        )
        .expect("join");
    }
    for i in 0..hosts.len() {
        j.ready(
            t,
            &format!("n{i}"),
            0,
            (format!("addr{i}"), 1000 + i as u32),
            None,
        );
    }
    assert_eq!(j.phase(), &Phase::Running);
    j
}

#[test]
fn a_round_gone_silent_at_once_is_held_not_dropped() {
    let t = crate::clock::epoch();
    let mut j = riding(&["a", "b", "c"], t);
    let s = Duration::from_secs;
    // Nothing heard from anyone (the server was cut off): at the drop limit
    // the round is held, and the deadline follows the outage limit.
    for at in [8, 16, 100, 899] {
        assert!(j.tick(t + s(at)).is_empty(), "nothing happens at {at} s");
    }
    assert_eq!(j.members().len(), 3);
    assert!(j.held_since().is_some());
    // Past the outage limit the nodes have stopped their workers: dropped.
    let out = j.tick(t + s(901));
    assert!(j.members().is_empty(), "{out:?}");
}

#[test]
fn when_the_silence_ends_every_node_gets_the_whole_drop_limit_again() {
    let t = crate::clock::epoch();
    let mut j = riding(&["a", "b", "c"], t);
    let s = Duration::from_secs;
    assert!(j.tick(t + s(20)).is_empty());
    assert!(j.held_since().is_some());
    // Two nodes reach the server again at 60 s; the third stays away.
    j.keep_alive(t + s(60), "n0");
    j.keep_alive(t + s(60), "n1");
    assert!(
        j.tick(t + s(60)).is_empty(),
        "the silence ended: nobody dropped now"
    );
    assert_eq!(j.held_since(), None);
    j.keep_alive(t + s(70), "n0");
    j.keep_alive(t + s(70), "n1");
    assert!(j.tick(t + s(74)).is_empty(), "n2 still has its drop limit");
    assert!(j.members().contains_key("n2"));
    j.keep_alive(t + s(75), "n0");
    j.keep_alive(t + s(75), "n1");
    let out = j.tick(t + s(76));
    assert!(
        !j.members().contains_key("n2"),
        "dropped a drop limit after the silence ended"
    );
    assert!(out
        .iter()
        .any(|o| o.to == "n0" && matches!(&o.event, Kind::RestartRequested(r) if !r.counted)));
}

#[test]
fn one_silent_node_of_three_is_dropped_at_the_drop_limit() {
    let t = crate::clock::epoch();
    let mut j = riding(&["a", "b", "c"], t);
    let s = Duration::from_secs;
    for at in [5, 10, 15] {
        j.keep_alive(t + s(at), "n0");
        j.keep_alive(t + s(at), "n1");
        j.tick(t + s(at));
    }
    assert_eq!(j.held_since(), None);
    j.tick(t + s(16));
    assert!(!j.members().contains_key("n2"));
}

#[test]
fn a_peer_s_vouch_keeps_a_node_cut_off_from_the_server() {
    let t = crate::clock::epoch();
    let mut j = riding(&["a", "b", "c"], t);
    let s = Duration::from_secs;
    for at in [5, 10, 15, 20] {
        j.keep_alive(t + s(at), "n0");
        j.keep_alive(t + s(at), "n1");
        // n0 hears n2 through the hub.
        assert_eq!(j.vouch(t + s(at), "n0", 0, &[0b100], false), 1);
        assert!(j.tick(t + s(at)).is_empty());
    }
    assert!(j.members().contains_key("n2"));
    // "All" costs O(1) and counts for every node of the round.
    assert_eq!(j.vouch(t + s(25), "n1", 0, &[], true), 3);
    assert!(j.tick(t + s(39)).is_empty());
    // A vouch for another round, or from a stranger, counts for nothing.
    assert_eq!(j.vouch(t + s(30), "n0", 1, &[], true), 0);
    assert_eq!(j.vouch(t + s(30), "zz", 0, &[], true), 0);
    // Ranks the round does not have are ignored.
    assert_eq!(j.vouch(t + s(30), "n0", 0, &[0, 0xff], false), 0);
}

#[test]
fn a_held_round_does_not_re_form_without_its_silent_nodes() {
    let t = crate::clock::epoch();
    let mut j = riding(&["a", "b", "c"], t);
    let s = Duration::from_secs;
    // n0 fails while n1 and n2 are cut off from the server (but may run).
    j.keep_alive(t + s(4), "n0");
    let out = j.failure(t + s(4), "n0", 0, "boom".into(), None);
    assert!(!out.is_empty());
    j.keep_alive(t + s(8), "n0");
    j.tick(t + s(8));
    assert!(j.held_since().is_some(), "two of three silent");
    j.ready(t + s(9), "n0", 1, ("addr0".into(), 1000), None);
    for at in [20, 40, 120] {
        j.keep_alive(t + s(at), "n0");
        j.tick(t + s(at));
        assert_eq!(j.phase(), &Phase::Forming, "still waiting at {at} s");
        assert_eq!(j.members().len(), 3);
    }
}

#[test]
fn jobs_of_older_agents_are_never_held() {
    let t = crate::clock::epoch();
    let (mut j, _) = formed(&["a", "b"], t);
    j.tick(t + Duration::from_secs(16));
    assert!(
        j.members().is_empty(),
        "agents that fence at the drop limit are dropped at it"
    );
}

#[test]
fn a_node_back_after_its_relearned_round_restarted_takes_its_place_at_once() {
    let t = crate::clock::epoch();
    let (_, out) = formed(&["a", "b"], t);
    let mut r0 = req("a", 2, None);
    r0.resume = Some(resume_of(&out, "n0", 0, 0));
    let mut j = Job::relearn(t, "j", &r0, r0.resume.as_ref().expect("resume"));
    j.join(t, "n0", &r0, S).expect("first node back");
    // It reports a failure it saw while the server was away: round 1 forms.
    j.failure(t, "n0", 0, "exited 1".into(), None);
    assert_eq!((j.phase(), j.round()), (&Phase::Forming, 1));
    j.ready(t, "n0", 1, ("addr0".into(), 1000), None);
    // n1 comes back presenting round 0: it takes its place, is told the
    // job moved on, and the round forms as soon as it is ready.
    let mut r1 = req("b", 2, None);
    r1.resume = Some(resume_of(&out, "n1", 0, 0));
    let back = j.join(t, "n1", &r1, S).expect("second node back");
    assert!(
        matches!(&back[0].event, Kind::Joined(x) if !x.resumed && x.round == 1),
        "{back:?}"
    );
    assert_eq!(j.absent_count(), 0);
    let out = j.ready(t, "n1", 1, ("addr1".into(), 1001), None);
    assert_eq!(
        j.phase(),
        &Phase::Running,
        "no wait for a placeholder: {out:?}"
    );
    assert_eq!(round_of(&out, "n1").node_rank, 1);
}

/// Whether a job ran (a server-wide quarantine holds its benches firmly):
/// one of its rounds ran for `RAN_FOR`; a restart does not undo it.
#[test]
fn a_job_ran_once_one_of_its_rounds_ran_for_ran_for() {
    let t = crate::clock::epoch();
    let nodes = [("a", "n1", ""), ("b", "n2", "")];
    let mut j = topo_job(t, 2, 2, &nodes).with_quarantine(Some(three_strikes()));
    assert!(!j.ran(t + RAN_FOR), "no round ran");
    let _ = ready_all(&mut j, t, 0);
    let short = t + RAN_FOR - Duration::from_secs(1);
    assert!(!j.ran(short) && j.ran(t + RAN_FOR));
    // Restarted just short of it: the forming round does not count, and
    // the next round counts from its own start.
    let _ = j.failure(short, "a", 0, "worker 0 exited with 1".into(), None);
    assert!(!j.ran(short + RAN_FOR));
    let _ = ready_all(&mut j, short, 1);
    assert!(!j.ran(short + RAN_FOR - Duration::from_secs(1)));
    let long = short + RAN_FOR;
    assert!(j.ran(long));
    let _ = j.failure(long, "b", 1, "worker 0 exited with 1".into(), None);
    assert!(j.ran(long), "kept after the restart");
}

/// The goodput acceptance scenario through the job's own calls: two nodes
/// step once a second, checkpoint every 10 steps, a worker dies at step 35
/// and the job resumes from step 30.
#[test]
fn goodput_accounts_a_failure_at_35_as_recovery_and_5_steps_redone() {
    let t0 = crate::clock::epoch();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut j = job(2);
    j.join(t0, "n0", &req("a", 2, None), S).expect("join");
    j.join(at(500), "n1", &req("b", 2, None), S).expect("join");
    j.ready(at(1000), "n0", 0, ("a".into(), 1), None);
    let out = j.ready(at(2000), "n1", 0, ("b".into(), 1), None);
    round_of(&out, "n0");
    let report = |round, step, checkpoint, first_ago, step_ago| pb::Progress {
        round,
        ranks: 2,
        min_step: step,
        max_step: step,
        checkpoint_step: checkpoint,
        first_step_ms_ago: first_ago,
        min_step_ms_ago: step_ago,
        hang_timeout_ms: 0,
        failing_step: None,
        rank_times: Vec::new(),
    };
    // First step at 5 s (3 s of start-up), then one a second; heard late.
    for node in ["n0", "n1"] {
        j.report_progress(at(7000), node, &report(0, 3, None, 2000, 0));
        j.report_progress(at(37500), node, &report(0, 33, Some(30), 32500, 500));
        j.report_progress(at(40000), node, &report(0, 35, Some(30), 35000, 0));
    }
    assert_eq!(j.steps(), (None, Some(35)));
    // A worker of n1 dies at 40.5 s.
    let out = j.failure(at(40500), "n1", 0, "exited 1".into(), None);
    assert!(!out.is_empty());
    j.ready(at(41000), "n0", 1, ("a".into(), 1), None);
    let out = j.ready(at(41000), "n1", 1, ("b".into(), 1), None);
    round_of(&out, "n0");
    // Back at 44 s (resumed from 30); 35 at 48 s; 40 at 53 s.
    for node in ["n0", "n1"] {
        j.report_progress(at(45000), node, &report(1, 32, None, 1000, 0));
        j.report_progress(at(48000), node, &report(1, 35, None, 4000, 0));
        j.report_progress(at(53000), node, &report(1, 40, Some(40), 9000, 0));
    }
    let spent = j.time_spent(at(54000));
    assert_eq!(
        spent.total(),
        Duration::from_secs(54),
        "every instant in one category"
    );
    assert_eq!(spent.of(Category::Waiting), Duration::from_secs(2));
    assert_eq!(spent.of(Category::StartUp), Duration::from_secs(3));
    assert_eq!(spent.of(Category::Recovery), Duration::from_secs(4));
    assert_eq!(spent.of(Category::Recomputation), Duration::from_secs(4));
    assert_eq!(spent.of(Category::Productive), Duration::from_secs(41));
    let g = j.goodput_message(at(54000), 1_000_000);
    assert_eq!(
        (g.restarts, g.lost_steps, g.now.as_str()),
        (1, 5, "productive")
    );
    let l = &g.losses[0];
    assert_eq!(
        (l.step, l.checkpoint, l.lost_steps),
        (Some(35), Some(30), 5)
    );
    assert_eq!((l.recovery_ms, l.recomputation_ms), (4000, 4000));
    assert_eq!(l.unix_ms, 1_000_000 - 13_500);
    assert!(l.cause.contains("exited 1"), "{}", l.cause);
    // The job's end closes the accounting; its agents are told.
    j.success(at(60000), "n0", 1);
    let out = j.success(at(60000), "n1", 1);
    let Some(Kind::JobSucceeded(done)) = kinds_for(&out, "n0").first().cloned() else {
        panic!("{out:?}");
    };
    let g = done.goodput.clone().expect("goodput");
    assert_eq!(
        (g.wall_ms(), g.productive_ms, g.now.as_str()),
        (60_000, 47_000, "")
    );
    // A record keeps it: a replica that takes the job over has the same.
    let restored = Job::restore(j.record(at(61000)), at(61000));
    assert_eq!(restored.time_spent(at(99000)), j.time_spent(at(61000)));
}

// ---- stragglers ----------------------------------------------------------

/// Each node reports its two ranks' time per step at `at`: c's rank 1
/// takes `slow_us`, every other rank 100 ms.
fn step_times(j: &mut Job, at: Instant, round: u64, slow_us: u64) -> Vec<Outbound> {
    let mut out = Vec::new();
    for node in ["a", "b", "c"] {
        let times = [100_000, if node == "c" { slow_us } else { 100_000 }];
        let p = pb::Progress {
            round,
            ranks: 2,
            min_step: 10,
            max_step: 10,
            rank_times: times
                .iter()
                .enumerate()
                .map(|(r, us)| pb::RankTime {
                    local_rank: r as u32,
                    step_us: *us,
                })
                .collect(),
            ..Default::default()
        };
        out.extend(j.report_progress(at, node, &p));
    }
    out
}

fn straggler_policy(stragglers: bool) -> QuarantinePolicy {
    QuarantinePolicy {
        after: 1,
        stragglers,
        ..three_strikes()
    }
}

/// `--straggler-quarantine`: a node slower than the median at two
/// evaluations counts against its host; with one failure enough, its host
/// is benched and, a spare waiting, the round re-forms at once with the
/// spare in its place, without spending the budget.
#[test]
fn a_straggler_is_quarantined_and_a_spare_takes_its_place() {
    let t = crate::clock::epoch();
    let nodes = [
        ("a", "n1", ""),
        ("b", "n2", ""),
        ("c", "n3", ""),
        ("d", "n4", ""),
    ];
    let mut j = topo_job(t, 2, 3, &nodes).with_quarantine(Some(straggler_policy(true)));
    let first = ranks(&ready_all(&mut j, t, 0));
    assert_eq!(
        (first["a"].0, first["b"].0, first["c"].0, first.get("d")),
        (0, 1, 2, None),
        "{first:?}"
    );
    let second = Duration::from_secs(1);
    // Evaluated once a second at most: slow at t + 1 s, again at t + 2 s.
    for k in 0..2 {
        assert!(step_times(&mut j, t + second * k, 0, 140_000).is_empty());
    }
    let out = step_times(&mut j, t + second * 2, 0, 140_000);
    let restart = restart_of(&out).expect("the round re-forms");
    assert!(!restart.counted, "not a failure: {restart:?}");
    assert_eq!(j.restart_count(), 0);
    assert!(
        restart
            .reason
            .contains("rank 5 on host 'n3' is a straggler (1.40x")
            && restart.reason.contains("host 'n3' is quarantined")
            && restart.reason.contains("--straggler-quarantine"),
        "{}",
        restart.reason
    );
    assert!(j.is_benched(&j.members()["c"]));
    // The next round takes a, b and the spare d in c's place; c waits,
    // told why.
    let out = ready_all(&mut j, t + second, 1);
    let r = ranks(&out);
    assert_eq!((r.len(), r["d"].0), (3, 2), "{r:?}");
    assert!(!r.contains_key("c"));
    let w = waiting_of(&out, "c").expect("c told");
    assert!(w.quarantine.contains("straggler"), "{w:?}");
}

/// Without a spare the round goes on, slowly, even where `MIN:MAX` would
/// allow a smaller one; the bench applies from the job's next round.
/// Without the flag, a straggler counts for nothing.
#[test]
fn a_straggler_without_a_spare_stays_and_without_the_flag_counts_nothing() {
    let t = crate::clock::epoch();
    let second = Duration::from_secs(1);
    let nodes = [("a", "n1", ""), ("b", "n2", ""), ("c", "n3", "")];
    let mut j = topo_job(t, 2, 3, &nodes).with_quarantine(Some(straggler_policy(true)));
    ranks(&ready_all(&mut j, t, 0));
    for k in 0..5 {
        let out = step_times(&mut j, t + second * k, 0, 140_000);
        assert!(out.is_empty(), "{out:?}");
    }
    assert_eq!(j.phase(), &Phase::Running);
    assert!(j.quarantine().get("n3").is_some(), "benched for later");
    assert_eq!(j.straggler_info().count(), 1);
    // A failure restarts the job (c's own, not counted again: its host is
    // benched): the next round forms without c.
    let out = j.failure(t + second * 5, "c", 0, "exited 1".into(), None);
    assert!(restart_of(&out).is_some_and(|r| r.counted));
    let r = ranks(&ready_all(&mut j, t + second * 5, 1));
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(!r.contains_key("c"));

    let mut j = topo_job(t, 2, 3, &nodes).with_quarantine(Some(straggler_policy(false)));
    ranks(&ready_all(&mut j, t, 0));
    for k in 0..5 {
        assert!(step_times(&mut j, t + second * k, 0, 140_000).is_empty());
    }
    assert!(j.quarantine().is_empty());
    assert_eq!(j.straggler_info().count(), 1, "still shown");
}
