use super::*;

const MS: Duration = Duration::from_millis(1);

fn member(id: &str, step: i64) -> pb::QuorumMember {
    pb::QuorumMember {
        replica_id: id.into(),
        address: format!("http://{id}:1"),
        store_address: format!("{id}:2"),
        step,
        world_size: 1,
        ..Default::default()
    }
}

fn config(min: u64) -> LighthouseConfig {
    LighthouseConfig {
        min_replicas: min,
        join_timeout: Duration::from_secs(1),
        quorum_tick: 100 * MS,
        heartbeat_timeout: Duration::from_secs(5),
    }
}

fn formed(actions: &[Action]) -> Option<&pb::Quorum> {
    match actions {
        [Action::Formed(q)] => Some(q),
        _ => None,
    }
}

fn ids(q: &pb::Quorum) -> Vec<&str> {
    q.participants
        .iter()
        .map(|p| p.replica_id.as_str())
        .collect()
}

#[test]
fn a_quorum_waits_for_healthy_stragglers_until_the_join_timeout() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1));
    l.step(t, Event::Heartbeat("b".into())).expect("heartbeat");
    l.step(t, Event::Heartbeat("c".into())).expect("heartbeat");
    // "a" asks alone of three healthy groups: not more than half.
    assert!(l
        .step(t, Event::Join(member("a", 0)))
        .expect("join")
        .is_empty());
    assert_eq!(
        l.compute(t),
        Err(Waiting::SplitBrain {
            have: 1,
            healthy: 3
        })
    );
    // "b" asks: a majority, but "c" heartbeats without asking: waited for.
    assert!(l
        .step(t, Event::Join(member("b", 0)))
        .expect("join")
        .is_empty());
    assert!(matches!(
        l.compute(t),
        Err(Waiting::Stragglers { missing: 1, .. })
    ));
    // "c" asks within the join timeout: all three, quorum 1.
    let out = l
        .step(t + 500 * MS, Event::Join(member("c", 0)))
        .expect("join");
    let q = formed(&out).expect("a quorum");
    assert_eq!((q.quorum_id, ids(q)), (1, vec!["a", "b", "c"]));
    // Participants start afresh.
    assert_eq!(l.participants().count(), 0);
}

#[test]
fn without_stragglers_the_join_timeout_ends_the_wait() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1));
    l.step(t, Event::Heartbeat("c".into())).expect("heartbeat");
    assert!(l
        .step(t, Event::Join(member("a", 0)))
        .expect("join")
        .is_empty());
    assert!(l
        .step(t, Event::Join(member("b", 0)))
        .expect("join")
        .is_empty());
    assert!(l.step(t + 900 * MS, Event::Tick).expect("tick").is_empty());
    let q = l.step(t + 1000 * MS, Event::Tick).expect("tick");
    assert_eq!(ids(formed(&q).expect("quorum")), vec!["a", "b"]);
}

#[test]
fn the_same_members_keep_their_quorum_id_and_a_change_or_failed_commit_bumps_it() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1));
    let q = l.step(t, Event::Join(member("a", 0))).expect("join");
    assert_eq!(formed(&q).expect("q").quorum_id, 1);
    // Fast quorum: every previous member asks again.
    let q = l
        .step(t + 10 * MS, Event::Join(member("a", 1)))
        .expect("join");
    assert_eq!(formed(&q).expect("q").quorum_id, 1, "same members");
    let mut failed = member("a", 2);
    failed.commit_failures = 1;
    let q = l.step(t + 20 * MS, Event::Join(failed)).expect("join");
    assert_eq!(formed(&q).expect("q").quorum_id, 2, "a failed commit");
    // A newcomer while "a" waits: the fast quorum takes both at once.
    l.step(t + 30 * MS, Event::Heartbeat("b".into()))
        .expect("hb");
    l.step(t + 30 * MS, Event::Rejoin(member("b", 0)))
        .expect("rejoin");
    let q = l
        .step(t + 30 * MS, Event::Join(member("a", 3)))
        .expect("join");
    let q = formed(&q).expect("q");
    assert_eq!((q.quorum_id, ids(q)), (3, vec!["a", "b"]));
}

#[test]
fn a_dead_group_is_left_out_after_the_heartbeat_timeout_and_split_brain_is_refused() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1));
    l.step(t, Event::Heartbeat("b".into())).expect("hb");
    l.step(t, Event::Heartbeat("c".into())).expect("hb");
    // One of three healthy groups asks: no quorum, however long it waits.
    l.step(t, Event::Join(member("a", 0))).expect("join");
    assert_eq!(
        l.compute(t + 2 * Duration::from_secs(1)),
        Err(Waiting::SplitBrain {
            have: 1,
            healthy: 3
        })
    );
    // "b" and "c" stop heartbeating: after the timeout only "a" is healthy.
    let late = t + Duration::from_secs(5) + 10 * MS;
    l.step(late, Event::Heartbeat("a".into())).expect("hb");
    let q = l.step(late, Event::Tick).expect("tick");
    assert_eq!(ids(formed(&q).expect("q")), vec!["a"]);
}

#[test]
fn min_replicas_and_shrink_only_are_honoured() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(2));
    assert!(l
        .step(t, Event::Join(member("a", 0)))
        .expect("join")
        .is_empty());
    assert_eq!(l.compute(t), Err(Waiting::TooFew { have: 1, need: 2 }));
    let q = l.step(t, Event::Join(member("b", 0))).expect("join");
    assert_eq!(ids(formed(&q).expect("q")), vec!["a", "b"]);
    // "c" joins asking only; "a" asks shrink-only: the quorum keeps to the
    // previous members.
    l.step(t + 10 * MS, Event::Join(member("c", 0)))
        .expect("join");
    let mut a = member("a", 1);
    a.shrink_only = true;
    l.step(t + 10 * MS, Event::Join(a)).expect("join");
    let q = l
        .step(t + 10 * MS, Event::Join(member("b", 1)))
        .expect("join");
    let q = formed(&q).expect("q");
    assert_eq!((ids(q), q.quorum_id), (vec!["a", "b"], 1));
}

#[test]
fn silent_groups_are_forgotten_and_the_table_is_bounded() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1_000_000));
    for i in 0..MAX_GROUPS {
        l.step(t, Event::Join(member(&format!("g{i}"), 0)))
            .expect("join");
    }
    assert_eq!(
        l.step(t, Event::Join(member("one-too-many", 0))),
        Err(Refused::Full)
    );
    // Ten heartbeat timeouts later they are gone, and room is back.
    let later = t + Duration::from_secs(5) * FORGET_AFTER + MS;
    l.step(later, Event::Tick).expect("tick");
    // Their heartbeats are forgotten; their places go when room is needed.
    assert_eq!(
        (l.heartbeats().count(), l.participants().count()),
        (0, MAX_GROUPS)
    );
    l.step(later, Event::Join(member("new", 0)))
        .expect("room again");
    assert_eq!(l.participants().count(), 1);
}

#[test]
fn a_quorum_too_large_for_a_client_is_refused_at_the_join() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1_000_000));
    let big = |i: usize| pb::QuorumMember {
        data: "x".repeat(limits::MAX_DATA_BYTES),
        reconfigure_handles: vec!["h".repeat(limits::MAX_HANDLE_BYTES); limits::MAX_HANDLES],
        ..member(&format!("g{i}"), 0)
    };
    let mut refused = None;
    for i in 0..MAX_GROUPS {
        if let Err(e) = l.step(t, Event::Join(big(i))) {
            refused = Some((i, e));
            break;
        }
    }
    let (at, e) = refused.expect("refused before the table is full");
    assert_eq!(e, Refused::TooLarge);
    assert!(e.to_string().contains("shorten them"));
    assert!(at > 50, "{at} groups");
}

#[test]
fn an_empty_shrink_only_quorum_is_handed_out_and_the_next_takes_everyone() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(1));
    let q = l.step(t, Event::Join(member("a", 0))).expect("join");
    assert_eq!(ids(formed(&q).expect("q")), vec!["a"]);
    // "a" dies; "b" asks shrink-only: no previous member is left.
    let late = t + Duration::from_secs(6);
    let mut b = member("b", 0);
    b.shrink_only = true;
    let q = l.step(late, Event::Join(b)).expect("join");
    let q = formed(&q).expect("an empty quorum");
    assert!(q.participants.is_empty());
    // "b" asks again: with no previous member to wait for, it is in.
    let q = l
        .step(late + 10 * MS, Event::Join(member("b", 1)))
        .expect("join");
    assert_eq!(ids(formed(&q).expect("q")), vec!["b"]);
}

#[test]
fn a_resumed_lighthouse_never_hands_out_an_old_quorum_id() {
    let t = Instant::now();
    let mut l = Lighthouse::resuming(config(1), 41);
    let q = l.step(t, Event::Join(member("a", 0))).expect("join");
    assert_eq!(formed(&q).expect("q").quorum_id, 42);
}

#[test]
fn the_status_page_says_what_status_json_says_and_the_groups_heard() {
    let t = Instant::now();
    let mut l = Lighthouse::new(config(2));
    l.step(t, Event::Heartbeat("b".into())).expect("heartbeat");
    l.step(t, Event::Join(member("a", 3))).expect("join");
    let r = report::Report::of(&l, t + 10 * MS);
    let page = r.json();
    let status = crate::status::lighthouse_json(&r.to_pb());
    for (key, value) in status.as_object().expect("an object") {
        assert_eq!(&page[key], value, "{key}");
    }
    assert_eq!(page["waiting"], 1);
    assert!(page["waiting_reason"]
        .as_str()
        .is_some_and(|w| !w.is_empty()));
    let heard: Vec<&str> = page["heartbeats"]
        .as_array()
        .expect("heartbeats")
        .iter()
        .filter_map(|h| h["replica_id"].as_str())
        .collect();
    assert_eq!(heard, ["a", "b"], "most recent first, then by name");
}
