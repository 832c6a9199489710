use super::*;

fn term(lease: i64) -> Term {
    Term {
        addr: format!("head-{lease}:29400"),
        lease,
    }
}

fn secret(node: &str) -> [u8; SESSION_BYTES] {
    let mut s = [0; SESSION_BYTES];
    for (i, b) in node.bytes().enumerate().take(SESSION_BYTES) {
        s[i] = b;
    }
    s
}

fn members(nodes: &[&str], drop_limit_s: u64) -> Members {
    Members {
        nodes: nodes.iter().map(|n| ((*n).to_owned(), secret(n))).collect(),
        drop_limit: Some(Duration::from_secs(drop_limit_s)),
    }
}

fn complaint(job: &str, node: &str, lease: i64) -> Event {
    Event::Complaint {
        job: job.into(),
        node: node.into(),
        session: secret(node).to_vec(),
        leader: term(lease),
    }
}

fn read(job: &str, m: Members) -> Event {
    Event::Members {
        job: job.into(),
        members: Some(m),
    }
}

fn fetch(job: &str) -> Action {
    Action::Fetch { job: job.into() }
}

fn deposed(a: &[Action]) -> Option<(i64, String, usize, usize)> {
    a.iter().find_map(|a| match a {
        Action::Depose {
            leader,
            job,
            complained,
            of,
        } => Some((leader.lease, job.clone(), *complained, *of)),
        Action::Fetch { .. } => None,
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn most_nodes_of_a_job_complaining_depose_the_leader_once() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    // The first complaint asks for the job's members.
    assert_eq!(tally.step(t0, complaint("j", "a", 7)), vec![fetch("j")]);
    assert_eq!(
        tally.step(t0 + ms(10), read("j", members(&["a", "b", "c"], 15))),
        vec![],
        "1 of 3 is no majority"
    );
    // Complaints repeat every 250-500 ms: one node counts once.
    for i in 1..10 {
        assert_eq!(tally.step(t0 + ms(100 * i), complaint("j", "a", 7)), vec![]);
    }
    let a = tally.step(t0 + ms(1100), complaint("j", "b", 7));
    assert_eq!(deposed(&a), Some((7, "j".into(), 2, 3)), "{a:?}");
    // Once per term: the same leader's complaints do nothing more.
    for i in 0..5 {
        let a = tally.step(t0 + ms(1200 + 100 * i), complaint("j", "c", 7));
        assert_eq!(a, vec![], "no second deposal of term 7");
    }
}

#[test]
fn a_minority_or_exactly_half_never_deposes() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    tally.step(t0, complaint("j", "a", 7));
    tally.step(t0, read("j", members(&["a", "b", "c", "d"], 15)));
    let mut all = Vec::new();
    for i in 0..100 {
        let now = t0 + ms(250 * i);
        all.extend(tally.step(now, complaint("j", "a", 7)));
        all.extend(tally.step(now, complaint("j", "b", 7)));
        if let Some(Action::Fetch { job }) = all.last().cloned() {
            all.extend(tally.step(now, read(&job, members(&["a", "b", "c", "d"], 15))));
        }
    }
    assert_eq!(deposed(&all), None, "2 of 4 is not more than half");
}

#[test]
fn only_members_with_their_secret_count() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    // Complaints before the members are known: kept, checked once known.
    tally.step(t0, complaint("j", "a", 7));
    tally.step(
        t0,
        Event::Complaint {
            job: "j".into(),
            node: "b".into(),
            session: vec![9; SESSION_BYTES],
            leader: term(7),
        },
    );
    tally.step(t0, complaint("j", "stranger", 7));
    tally.step(t0, complaint("j", "other", 7));
    let a = tally.step(t0 + ms(5), read("j", members(&["a", "b", "c"], 15)));
    assert_eq!(
        a,
        vec![],
        "a wrong secret and non-members do not count: 1 of 3"
    );
    // A secret of the wrong length is no complaint at all.
    let a = tally.step(
        t0 + ms(10),
        Event::Complaint {
            job: "j".into(),
            node: "c".into(),
            session: vec![1, 2, 3],
            leader: term(7),
        },
    );
    assert_eq!(a, vec![]);
    // With its secret, b counts.
    let a = tally.step(t0 + ms(20), complaint("j", "b", 7));
    assert_eq!(deposed(&a), Some((7, "j".into(), 2, 3)), "{a:?}");
}

#[test]
fn complaints_count_within_the_jobs_drop_limit() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut tally = Tally::new();
    tally.step(t0, complaint("j", "a", 7));
    tally.step(t0, read("j", members(&["a", "b", "c"], 5)));
    // b complains 6 s later: a's complaint is older than the 5 s window
    // (and the job, not heard of since, was forgotten: read again).
    let a = tally.step(t0 + s(6), complaint("j", "b", 7));
    assert_eq!(a, vec![fetch("j")]);
    let a = tally.step(t0 + s(6), read("j", members(&["a", "b", "c"], 5)));
    assert_eq!(a, vec![], "1 of 3 within the window");
    // a again: both are within the window now.
    let a = tally.step(t0 + s(7), complaint("j", "a", 7));
    assert_eq!(deposed(&a), Some((7, "j".into(), 2, 3)), "{a:?}");
}

#[test]
fn a_new_term_starts_a_new_tally_and_deposals_are_rate_limited() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    tally.step(t0, complaint("j", "a", 7));
    tally.step(t0, read("j", members(&["a", "b"], 15)));
    // The leader changed (lease 8) before b complained: a's complaint was
    // about term 7 and does not carry over.
    let a = tally.step(t0 + ms(100), complaint("j", "b", 8));
    assert_eq!(deposed(&a), None, "1 of 2 about term 8: {a:?}");
    let a = tally.step(t0 + ms(200), complaint("j", "a", 8));
    assert_eq!(deposed(&a), Some((8, "j".into(), 2, 2)), "{a:?}");
    // Term 9's nodes complain at once: too soon after the last deposal.
    let mut all = Vec::new();
    let mut now = t0 + ms(300);
    while now < t0 + MIN_BETWEEN {
        for node in ["a", "b"] {
            for a in tally.step(now, complaint("j", node, 9)) {
                if let Action::Fetch { job } = &a {
                    all.extend(tally.step(now, read(job, members(&["a", "b"], 15))));
                }
                all.push(a);
            }
        }
        now += ms(250);
    }
    assert_eq!(deposed(&all), None, "one deposal per {MIN_BETWEEN:?}");
    // After that, the complaints (still within the window) depose term 9.
    let a = tally.step(t0 + ms(200) + MIN_BETWEEN, complaint("j", "a", 9));
    let a = if deposed(&a).is_none() {
        tally.step(
            t0 + ms(200) + MIN_BETWEEN,
            read("j", members(&["a", "b"], 15)),
        )
    } else {
        a
    };
    assert_eq!(deposed(&a), Some((9, "j".into(), 2, 2)), "{a:?}");
}

#[test]
fn members_are_read_once_at_a_time_and_again_when_stale() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    assert_eq!(tally.step(t0, complaint("j", "a", 7)), vec![fetch("j")]);
    // Outstanding: not asked again.
    assert_eq!(tally.step(t0 + ms(300), complaint("j", "a", 7)), vec![]);
    // The read never answered: asked again after FETCH_PATIENCE.
    assert_eq!(
        tally.step(t0 + FETCH_PATIENCE, complaint("j", "a", 7)),
        vec![fetch("j")]
    );
    tally.step(
        t0 + FETCH_PATIENCE,
        read("j", members(&["a", "b", "c"], 15)),
    );
    assert_eq!(
        tally.step(t0 + FETCH_PATIENCE + ms(500), complaint("j", "a", 7)),
        vec![]
    );
    assert_eq!(
        tally.step(t0 + FETCH_PATIENCE + MEMBERS_FRESH, complaint("j", "a", 7)),
        vec![fetch("j")]
    );
    // A job etcd does not hold: nobody counts.
    tally.step(
        t0 + FETCH_PATIENCE + MEMBERS_FRESH,
        Event::Members {
            job: "j".into(),
            members: None,
        },
    );
    let a = tally.step(
        t0 + FETCH_PATIENCE + MEMBERS_FRESH + ms(1),
        complaint("j", "b", 7),
    );
    assert_eq!(deposed(&a), None);
}

#[test]
fn memory_is_bounded_and_entries_expire() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    for i in 0..MAX_JOBS + 50 {
        tally.step(t0 + ms(i as u64), complaint(&format!("job-{i}"), "a", 7));
    }
    assert_eq!(tally.jobs(), MAX_JOBS);
    // The least recently heard of made room.
    assert!(!tally.tracked().contains("job-0"));
    assert!(tally.tracked().contains(&format!("job-{}", MAX_JOBS + 49)));
    // Unverified complaints per job are capped.
    for i in 0..MAX_UNVERIFIED + 10 {
        tally.step(t0 + ms(400), complaint("big", &format!("n{i}"), 7));
    }
    assert!(tally
        .jobs
        .get("big")
        .is_some_and(|t| t.complaints.len() <= MAX_UNVERIFIED));
    // Nothing heard for longer than the window: all forgotten.
    tally.step(
        t0 + DEFAULT_WINDOW + Duration::from_secs(2),
        Event::Members {
            job: "none".into(),
            members: None,
        },
    );
    assert_eq!(tally.jobs(), 0);
}

#[test]
fn a_complaint_without_a_leader_address_is_ignored() {
    let t0 = Instant::now();
    let mut tally = Tally::new();
    let a = tally.step(
        t0,
        Event::Complaint {
            job: "j".into(),
            node: "a".into(),
            session: secret("a").to_vec(),
            leader: Term {
                addr: String::new(),
                lease: 7,
            },
        },
    );
    assert_eq!(a, vec![]);
    assert_eq!(tally.jobs(), 0);
}
