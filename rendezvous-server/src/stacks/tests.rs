use super::*;
use accel_wire::limits::printable_keeping;
use accel_wire::stacks::{ranges, render};

/// A `py-spy dump` as it prints a worker stuck in `frame`.
fn dump(pid: u32, state: &str, frame: &str) -> String {
    format!(
        "Process {pid}: /venv/bin/python3 -u train.py\nPython v3.11.2 (/usr/bin/python3.11)\n\nThread {pid} ({state}): \"MainThread\"\n    {frame}\n    main (train.py:20)\n    <module> (train.py:30)\n\n"
    )
}

fn worker(rank: u32, local_rank: u32, stack: String) -> pb::WorkerStack {
    pb::WorkerStack {
        rank,
        local_rank,
        pid: 1000 + rank,
        stack,
    }
}

const BARRIER: &str = "barrier (torch/distributed/distributed_c10d.py:4700)";
const STUCK: &str = "stuck (train.py:8)";

/// The 2x2 job of the acceptance: rank 2 sleeps in a function, the other
/// three wait in a barrier.
fn two_by_two() -> Vec<Answer> {
    vec![
        Answer {
            host: "node-a".into(),
            workers: vec![
                worker(0, 0, dump(1000, "idle", BARRIER)),
                worker(1, 1, dump(1001, "active", BARRIER)),
            ],
        },
        Answer {
            host: "node-b".into(),
            workers: vec![
                worker(2, 0, dump(1002, "idle", STUCK)),
                worker(3, 1, dump(1003, "idle", BARRIER)),
            ],
        },
    ]
}

#[test]
fn normalizing_drops_what_differs_between_processes_at_the_same_place() {
    let a = normalize(&dump(11, "idle", BARRIER));
    let b = normalize(&dump(4242, "active+gil", BARRIER));
    assert_eq!(a, b);
    assert_eq!(
        a,
        format!("Thread \"MainThread\"\n    {BARRIER}\n    main (train.py:20)\n    <module> (train.py:30)\n")
    );
    assert_ne!(a, normalize(&dump(11, "idle", STUCK)));
    // What py-spy says when it cannot dump is kept as it is.
    assert_eq!(
        normalize("(no stacks: py-spy is not installed)"),
        "(no stacks: py-spy is not installed)\n"
    );
}

#[test]
fn the_odd_rank_out_comes_first_then_the_three_that_wait() {
    let r = group(7, 2, &two_by_two(), &[]);
    assert_eq!(r.round, 7);
    assert_eq!((r.nodes_asked, r.nodes_answered), (2, 2));
    assert_eq!(r.groups.len(), 2);
    let (odd, rest) = (&r.groups[0], &r.groups[1]);
    assert_eq!(odd.rank_count, 1);
    assert_eq!(odd.ranks[0].rank, 2);
    assert_eq!(odd.ranks[0].host, "node-b");
    assert!(odd.stack.contains("stuck (train.py:8)"));
    assert_eq!(rest.rank_count, 3);
    let ranks: Vec<u32> = rest.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, [0, 1, 3]);
    assert!(rest.stack.contains("barrier"));
    let text = render("job-1", &r);
    assert!(
        text.starts_with("job job-1, round 7: stacks of 4 ranks from 2 of 2 nodes, 2 distinct\n"),
        "{text}"
    );
    assert!(text.contains("== 1 rank: 2  [node-b: 2]"), "{text}");
    assert!(
        text.contains("== 3 ranks: 0-1, 3  [node-a: 0-1; node-b: 3]"),
        "{text}"
    );
    assert!(text.find("stuck").expect("ok") < text.find("barrier").expect("ok"));
}

#[test]
fn nodes_that_did_not_answer_are_named() {
    let answers = &two_by_two()[..1];
    let r = group(1, 2, answers, &["node-b".into()]);
    assert_eq!((r.nodes_asked, r.nodes_answered), (2, 1));
    let text = render("j", &r);
    assert!(text.contains("from 1 of 2 nodes"), "{text}");
    assert!(text.contains("no answer in time from: node-b"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&render_json("j", &r)).expect("ok");
    assert_eq!(json["missing"][0], "node-b");
    assert_eq!(json["groups"][0]["rank_count"], 2);
    assert_eq!(json["groups"][0]["ranks"][1]["local_rank"], 1);
}

#[test]
fn an_answer_past_its_bound_counts_the_groups_it_leaves_out() {
    // Distinct stacks of 100 KiB each: the answer holds 20 of them.
    let big = |i: u32| format!("{i}{}", "x".repeat(100 * 1024));
    let answers = vec![Answer {
        host: "h".into(),
        workers: (0..40).map(|i| worker(i, i, big(i))).collect(),
    }];
    let r = group(1, 1, &answers, &[]);
    let text: usize = r.groups.iter().map(|g| g.stack.len()).sum();
    assert!(text <= MAX_ANSWER_TEXT);
    assert_eq!(r.groups.len() as u32 + r.groups_omitted, 40);
    assert!(r.groups_omitted > 0);
    assert_eq!(r.ranks_omitted, r.groups_omitted, "a rank each");
    let text = render("j", &r);
    assert!(
        text.starts_with("job j, round 1: stacks of 40 ranks"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} more distinct stacks, of {} ranks, left out",
            r.groups_omitted, r.ranks_omitted
        )),
        "{text}"
    );
}

#[test]
fn a_large_group_lists_a_bounded_number_of_ranks_and_counts_them_all() {
    let answers = vec![Answer {
        host: "h".into(),
        workers: (0..2500)
            .map(|i| worker(i, 0, dump(i, "idle", BARRIER)))
            .collect(),
    }];
    let r = group(1, 1, &answers, &[]);
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.groups[0].rank_count, 2500);
    assert_eq!(r.groups[0].ranks.len(), MAX_RANKS_LISTED);
    assert!(render("j", &r).contains("(and 1500 more)"));
}

#[test]
fn ranges_are_compact() {
    assert_eq!(ranges(&[3, 0, 1, 2, 7, 9, 8, 3]), "0-3, 7-9");
    assert_eq!(ranges(&[5]), "5");
    assert_eq!(ranges(&[]), "");
}

#[test]
fn timeouts_are_bounded() {
    assert_eq!(timeout_of(0), DEFAULT_TIMEOUT);
    assert_eq!(timeout_of(1), MIN_TIMEOUT);
    assert_eq!(timeout_of(u32::MAX), MAX_TIMEOUT);
    assert_eq!(timeout_of(2000), Duration::from_secs(2));
    assert!(agent_budget(DEFAULT_TIMEOUT) < DEFAULT_TIMEOUT);
}

fn answer(host: &str) -> Answer {
    Answer {
        host: host.into(),
        workers: vec![worker(0, 0, dump(1, "idle", BARRIER))],
    }
}

#[tokio::test(start_paused = true)]
async fn a_collection_takes_only_the_asked_nodes_first_answers_and_ends_at_its_deadline() {
    let desk = Arc::new(Desk::default());
    let Begin::New(c) = desk.begin("j", 2).expect("ok") else {
        panic!("a new collection")
    };
    let id = c.id;
    desk.expect("j", id, ["a".to_owned(), "b".to_owned()]);
    // A second caller joins it.
    let Begin::UnderWay(mut joined) = desk.begin("j", 2).expect("ok") else {
        panic!("the one under way")
    };
    let mut done = c.done();
    assert_eq!(desk.latest("j"), Latest::Collecting);
    let deadline = Instant::now() + Duration::from_secs(5);
    let run = tokio::spawn(c.run(
        desk.clone(),
        3,
        vec![("a".into(), "host-a".into()), ("b".into(), "host-b".into())],
        vec!["host-c".into()],
        Duration::from_secs(5),
    ));
    assert!(desk.deliver("j", id, "a", answer("host-a")));
    // Twice from one node, from a node not asked, or for another
    // collection: ignored.
    assert!(!desk.deliver("j", id, "a", answer("host-a")));
    assert!(!desk.deliver("j", id, "x", answer("host-x")));
    assert!(!desk.deliver("j", id + 1, "b", answer("host-b")));
    assert!(!desk.deliver("other", id, "b", answer("host-b")));
    // Node b never answers: the collection ends at its deadline.
    run.await.expect("ok");
    assert!(Instant::now() >= deadline);
    let r = done
        .wait_for(Option::is_some)
        .await
        .expect("ok")
        .clone()
        .expect("ok");
    assert_eq!((r.nodes_asked, r.nodes_answered), (3, 1));
    assert_eq!(r.missing, ["host-b", "host-c"]);
    assert_eq!(r.round, 3);
    let same = joined
        .wait_for(Option::is_some)
        .await
        .expect("ok")
        .clone()
        .expect("ok");
    assert_eq!(same, r);
    // Over: the desk is free and keeps the answer for the status page,
    // and a late answer changes nothing.
    assert_eq!(desk.under_way(), 0);
    assert!(matches!(desk.latest("j"), Latest::Done(_, kept) if *kept == *r));
    assert!(desk.kept_at("j").is_some());
    assert_eq!(desk.latest("other"), Latest::None);
    assert!(!desk.deliver("j", id, "b", answer("host-b")));
}

#[tokio::test(start_paused = true)]
async fn a_collection_ends_as_soon_as_every_node_answered() {
    let desk = Arc::new(Desk::default());
    let Begin::New(c) = desk.begin("j", 1).expect("ok") else {
        panic!("a new collection")
    };
    desk.expect("j", c.id, ["a".to_owned()]);
    let mut done = c.done();
    let start = Instant::now();
    assert!(desk.deliver("j", c.id, "a", answer("host-a")));
    c.run(
        desk.clone(),
        1,
        vec![("a".into(), "host-a".into())],
        vec![],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(Instant::now(), start);
    let r = done
        .wait_for(Option::is_some)
        .await
        .expect("ok")
        .clone()
        .expect("ok");
    assert_eq!((r.nodes_asked, r.nodes_answered), (1, 1));
    assert!(r.missing.is_empty());
}

#[test]
fn collections_at_once_are_bounded() {
    let desk = Desk::default();
    let mut held = Vec::new();
    for i in 0..MAX_COLLECTIONS {
        match desk.begin(&format!("job-{i}"), 1).expect("ok") {
            Begin::New(c) => held.push(c),
            Begin::UnderWay(_) => panic!("each job's first"),
        }
    }
    let err = desk.begin("one-more", 1).expect_err("an error");
    assert!(matches!(err, Error::LimitReached(_)), "{err}");
    // Another caller of a job under way still gets its answer.
    assert!(matches!(desk.begin("job-0", 1), Ok(Begin::UnderWay(_))));
}

#[tokio::test(start_paused = true)]
async fn an_answer_a_moment_old_stands_in_for_a_new_collection_and_a_forgotten_job_has_none() {
    let desk = Arc::new(Desk::default());
    let Begin::New(c) = desk.begin("j", 1).expect("ok") else {
        panic!("a new collection")
    };
    desk.expect("j", c.id, ["a".to_owned()]);
    assert!(desk.deliver("j", c.id, "a", answer("host-a")));
    let mut done = c.done();
    c.run(
        desk.clone(),
        1,
        vec![("a".into(), "host-a".into())],
        vec![],
        Duration::from_secs(5),
    )
    .await;
    let first = done
        .wait_for(Option::is_some)
        .await
        .expect("ok")
        .clone()
        .expect("ok");
    // Asked again at once: the same answer, no new collection (nothing is
    // under way, and the answer is there without waiting).
    let Begin::UnderWay(mut again) = desk.begin("j", 1).expect("ok") else {
        panic!("the answer of a moment ago")
    };
    assert_eq!(desk.under_way(), 0);
    let same = again
        .wait_for(Option::is_some)
        .await
        .expect("ok")
        .clone()
        .expect("ok");
    assert_eq!(same, first);
    // A forgotten job's answer is gone: a new job of that id starts afresh.
    desk.forget("j");
    assert_eq!(desk.latest("j"), Latest::None);
    assert!(matches!(desk.begin("j", 1), Ok(Begin::New(_))));
}

#[test]
fn a_thread_without_a_name_groups_whatever_its_id_and_state() {
    let a = "Thread 4242 (idle)\n    wait (threading.py:320)\n";
    let b = "Thread 977 (active)\n    wait (threading.py:320)\n";
    assert_eq!(normalize(a), normalize(b));
    assert_eq!(normalize(a), "Thread\n    wait (threading.py:320)\n");
}

#[test]
fn a_stack_cannot_pass_for_a_header_or_turn_a_line_around() {
    // A worker named a function so that py-spy prints a made-up header.
    let forged =
        "Thread 1 (idle): \"MainThread\"\n    f\n== 3 ranks: 0-2  [healthy-node: 0-2] (x.py:1)\n";
    let answers = vec![Answer {
        host: "h".into(),
        workers: vec![pb::WorkerStack {
            rank: 0,
            local_rank: 0,
            pid: 1,
            stack: printable_keeping(&format!("{forged}\u{202e}evil"), true),
        }],
    }];
    let text = render("j", &group(0, 1, &answers, &[]));
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with("==")).collect();
    assert_eq!(headers, ["== 1 rank: 0  [h: 0]"], "{text}");
    assert!(
        !text.contains('\u{202e}') && text.contains("\\u{202e}"),
        "{text}"
    );
}
