use std::time::Instant;

use accel_proto::v1 as pb;

use super::*;
use crate::job::{Job, Session};

fn request(node: &str, host: &str) -> pb::JoinRequest {
    pb::JoinRequest {
        job_id: "team/a%job".into(),
        node_id: node.into(),
        hostname: host.into(),
        topology: String::new(),
        min_nodes: 2,
        max_nodes: 3,
        nproc_per_node: 2,
        max_restarts: 4,
        dead_after_ms: 30_000,
        last_call_ms: 500,
        ..Default::default()
    }
}

/// A job with two members in a running round and a spare, one restart spent.
fn running_job(now: Instant) -> Job {
    let req = request("a", "h1");
    let mut job = Job::new("team/a%job", JobConfig::from_join(&req));
    for (i, (node, host)) in [("a", "h1"), ("b/../x", "h2")].into_iter().enumerate() {
        job.join(
            now,
            node,
            &request(node, host),
            Session::from_bytes([i as u8 + 1; SESSION_BYTES]),
        )
        .expect("joins");
        job.ready(
            now,
            node,
            0,
            (format!("10.0.0.{i}"), 29500),
            "10.1.1.1".parse().ok(),
        );
    }
    job.tick(now + Duration::from_secs(1));
    job.failure(
        now,
        "a",
        0,
        "rank 0 died".into(),
        Some(pb::Failure {
            rank: 0,
            exitcode: 1,
            ..Default::default()
        }),
    );
    job
}

#[test]
fn ids_escape_to_one_key_segment_and_back() {
    for id in [
        "plain",
        "a/b",
        "100%",
        "\u{0}absent-rank-3",
        "ünï/cödé%2F",
        "",
    ] {
        let e = escape(id);
        assert!(!e.contains('/'), "{e}");
        assert_eq!(unescape(&e).as_deref(), Some(id));
    }
    assert_eq!(unescape("%zz"), None);
    assert_eq!(unescape("%4"), None);
    let key = Slot::Member("n/1".into()).key("/accel", "j/1");
    assert_eq!(key, "/accel/jobs/j%2F1/m/n%2F1");
    assert_eq!(
        Slot::parse("/accel", &key),
        Some(("j/1".into(), Slot::Member("n/1".into())))
    );
    assert_eq!(
        Slot::parse("/accel", "/accel/jobs/j/meta"),
        Some(("j".into(), Slot::Meta))
    );
    assert_eq!(Slot::parse("/accel", "/accel/jobs/j/other"), None);
    assert_eq!(Slot::parse("/accel", "/other/jobs/j/meta"), None);
}

#[test]
fn a_record_decodes_to_itself_but_for_last_seen() {
    let now = Instant::now();
    let job = running_job(now);
    let mut record = job.record(now + Duration::from_secs(2));
    let decoded = decode(&record.id, &encode(&record)).expect("decodes");
    for (_, m) in &mut record.members {
        m.last_seen = 0;
    }
    assert_eq!(decoded, record);
    assert!(matches!(decoded.phase, Phase::Forming));
    assert_eq!(decoded.restart_count, 1);
}

#[test]
fn a_diff_applied_to_the_old_values_gives_the_new_ones() {
    let now = Instant::now();
    let mut job = running_job(now);
    let id = job.id().to_owned();
    let first = encode(&job.record(now));
    let changes = diff(&id, None, &first);
    let mut held = BTreeMap::new();
    for c in &changes {
        apply(&mut held, c);
    }
    assert_eq!(held.get(&id), Some(&first));
    // Members first, the meta last.
    assert!(matches!(
        changes.last(),
        Some(Change::Put {
            slot: Slot::Meta,
            ..
        })
    ));

    // One member gets ready: that member and the meta change, nothing else.
    job.ready(now, "a", 1, ("10.0.0.9".into(), 1), None);
    let second = encode(&job.record(now));
    let changes = diff(&id, held.get(&id), &second);
    let slots: Vec<_> = changes
        .iter()
        .map(|c| match c {
            Change::Put { slot, .. } => slot.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(slots, [Slot::Member("a".into()), Slot::Meta]);
    for c in &changes {
        apply(&mut held, c);
    }
    assert_eq!(held.get(&id), Some(&second));

    // A member leaves: its key goes.
    job.leave(now, "b/../x", "done");
    let third = encode(&job.record(now));
    let changes = diff(&id, held.get(&id), &third);
    assert!(changes.contains(&Change::DeleteMember {
        job: id.clone(),
        node: "b/../x".into()
    }));
    for c in &changes {
        apply(&mut held, c);
    }
    assert_eq!(held.get(&id), Some(&third));
    assert_eq!(
        diff(&id, held.get(&id), &third),
        Vec::new(),
        "nothing left to write"
    );
}

#[test]
fn damaged_or_newer_values_are_refused_with_the_job_named() {
    let now = Instant::now();
    let record = running_job(now).record(now);
    let good = encode(&record);
    let mut bad = good.clone();
    bad.meta = vec![0xff, 0xff, 0xff];
    let e = decode(&record.id, &bad).expect_err("garbage meta");
    assert!(e.to_string().contains("team%2Fa%25job"), "{e}");

    let mut newer = st::JobMeta::decode(good.meta.as_slice()).expect("meta");
    newer.format = FORMAT + 1;
    let mut future = good.clone();
    future.meta = newer.encode_to_vec();
    let e = decode(&record.id, &future).expect_err("newer format");
    assert!(e.to_string().contains("newer"), "{e}");

    let mut short = good.clone();
    let first = short.members.keys().next().cloned().expect("a member");
    let mut m = st::Member::decode(short.members[&first].as_slice()).expect("member");
    m.session.truncate(3);
    short.members.insert(first, m.encode_to_vec());
    let e = decode(&record.id, &short).expect_err("short secret");
    assert!(e.to_string().contains("session secret"), "{e}");

    assert!(
        decode("another", &good).is_err(),
        "a meta names its own job"
    );
}

#[test]
fn participants_are_kept_in_values_of_bounded_size() {
    let now = Instant::now();
    let mut record = running_job(now).record(now);
    let id = record.id.clone();
    record.participants = (0..2500).map(|i| format!("node-{i:04}")).collect();
    let big = encode(&record);
    assert_eq!(big.participants.len(), 3, "1000 + 1000 + 500");
    assert_eq!(
        decode(&id, &big).expect("decodes").participants,
        record.participants
    );
    let mut held = BTreeMap::new();
    for c in diff(&id, None, &big) {
        apply(&mut held, &c);
    }
    assert_eq!(held.get(&id), Some(&big));
    // The round shrinks: the values it no longer fills go.
    record.participants.truncate(500);
    let small = encode(&record);
    let changes = diff(&id, held.get(&id), &small);
    for index in [1, 2] {
        assert!(
            changes.contains(&Change::DeleteParticipants {
                job: id.clone(),
                index
            }),
            "{changes:?}"
        );
    }
    for c in &changes {
        apply(&mut held, c);
    }
    assert_eq!(held.get(&id), Some(&small));
    assert_eq!(
        Slot::parse("/p", &Slot::Participants(2).key("/p", "j")),
        Some(("j".into(), Slot::Participants(2)))
    );
    assert_eq!(Slot::parse("/p", "/p/jobs/j/participants/x"), None);
}

#[test]
fn a_marked_change_puts_the_marker_first_and_commits_the_meta_with_its_removal() {
    let now = Instant::now();
    let job = running_job(now);
    let id = job.id().to_owned();
    let new = encode(&job.record(now));
    let changes = marked(&id, diff(&id, None, &new), &new.meta, false);
    assert_eq!(
        changes.first(),
        Some(&Change::Put {
            job: id.clone(),
            slot: Slot::Writing,
            value: Vec::new()
        })
    );
    assert_eq!(
        changes.last(),
        Some(&Change::Commit {
            job: id.clone(),
            meta: new.meta.clone()
        })
    );
    assert_eq!(
        changes
            .iter()
            .filter(|c| matches!(
                c,
                Change::Put {
                    slot: Slot::Meta,
                    ..
                }
            ))
            .count(),
        0,
        "the meta is written only with the commit"
    );
    // Half of it applied: the marker is there; all of it: gone, the job whole.
    let mut held = BTreeMap::new();
    apply(&mut held, &changes[0]);
    assert!(held[&id].writing);
    for c in &changes[1..] {
        apply(&mut held, c);
    }
    assert_eq!(held.get(&id), Some(&new));
    // A job loaded with a marker: its next write clears it, with no new one.
    let mut torn = new.clone();
    torn.writing = true;
    assert!(decode(&id, &torn).expect("decodes").torn);
    let changes = marked(&id, diff(&id, Some(&torn), &new), &new.meta, true);
    assert_eq!(
        changes,
        [Change::Commit {
            job: id.clone(),
            meta: new.meta.clone()
        }]
    );
    assert_eq!(
        Slot::parse("/accel", &Slot::Writing.key("/accel", &id)),
        Some((id, Slot::Writing))
    );
}
