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
    assert_eq!((l.heartbeats().count(), l.participants().count()), (0, 0));
    l.step(later, Event::Join(member("new", 0)))
        .expect("room again");
}

#[test]
fn a_resumed_lighthouse_never_hands_out_an_old_quorum_id() {
    let t = Instant::now();
    let mut l = Lighthouse::resuming(config(1), 41);
    let q = l.step(t, Event::Join(member("a", 0))).expect("join");
    assert_eq!(formed(&q).expect("q").quorum_id, 42);
}
