use super::*;

fn k(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// Applies `cmd` for connection `conn`; returns (reply bytes, effects).
fn run(st: &mut State, conn: ConnId, cmd: Command) -> (Vec<u8>, Effects) {
    let mut out = Replies::default();
    let fx = st.apply(conn, cmd, &mut out).expect("applies");
    (out.to_vec(), fx)
}

/// Applies `cmd`, expecting it to be refused.
fn refused(st: &mut State, cmd: Command) -> ApplyError {
    st.apply(1, cmd, &mut Replies::default())
        .expect_err("refused")
}

fn bytes_reply(v: &[u8]) -> Vec<u8> {
    let mut o = (v.len() as u64).to_le_bytes().to_vec();
    o.extend_from_slice(v);
    o
}

fn i64_reply(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn set_get_delete_numkeys_listkeys() {
    let mut st = State::default();
    assert_eq!(
        run(&mut st, 1, Command::Get(k("/a"))).0,
        bytes_reply(b""),
        "missing key reads empty"
    );
    assert_eq!(run(&mut st, 1, Command::Set(k("/a"), k("x"))).0, b"");
    assert_eq!(run(&mut st, 1, Command::Get(k("/a"))).0, bytes_reply(b"x"));
    run(&mut st, 1, Command::Set(k("/b"), k("y")));
    assert_eq!(run(&mut st, 1, Command::NumKeys).0, i64_reply(2));
    let (list, _) = run(&mut st, 1, Command::ListKeys);
    assert_eq!(&list[..8], &i64_reply(2)[..]);
    assert_eq!(list.len(), 8 + 2 * (8 + 2));
    assert_eq!(run(&mut st, 1, Command::DeleteKey(k("/a"))).0, i64_reply(1));
    assert_eq!(run(&mut st, 1, Command::DeleteKey(k("/a"))).0, i64_reply(0));
    assert_eq!(run(&mut st, 1, Command::NumKeys).0, i64_reply(1));
}

#[test]
fn compare_set_semantics() {
    let mut st = State::default();
    let cas = |e: &str, d: &str| Command::CompareSet {
        key: k("/c"),
        expected: k(e),
        desired: k(d),
    };
    // Missing key, non-empty expectation: the expectation comes back, nothing is stored.
    assert_eq!(run(&mut st, 1, cas("old", "new")).0, bytes_reply(b"old"));
    assert_eq!(run(&mut st, 1, Command::NumKeys).0, i64_reply(0));
    // Missing key, empty expectation: stored.
    assert_eq!(run(&mut st, 1, cas("", "v1")).0, bytes_reply(b"v1"));
    // Match: replaced; mismatch: the current value comes back.
    assert_eq!(run(&mut st, 1, cas("v1", "v2")).0, bytes_reply(b"v2"));
    assert_eq!(run(&mut st, 1, cas("v1", "v3")).0, bytes_reply(b"v2"));
}

#[test]
fn add_append_and_non_numbers() {
    let mut st = State::default();
    assert_eq!(run(&mut st, 1, Command::Add(k("/n"), 5)).0, i64_reply(5));
    assert_eq!(run(&mut st, 1, Command::Add(k("/n"), -7)).0, i64_reply(-2));
    assert_eq!(
        run(&mut st, 1, Command::Get(k("/n"))).0,
        bytes_reply(b"-2"),
        "stored as decimal text"
    );
    run(&mut st, 1, Command::Append(k("/s"), k("ab")));
    run(&mut st, 1, Command::Append(k("/s"), k("cd")));
    assert_eq!(
        run(&mut st, 1, Command::Get(k("/s"))).0,
        bytes_reply(b"abcd")
    );
    assert!(matches!(
        refused(&mut st, Command::Add(k("/s"), 1)),
        ApplyError::NotANumber { .. }
    ));
    run(
        &mut st,
        1,
        Command::Set(k("/big"), i64::MAX.to_string().into_bytes()),
    );
    assert!(matches!(
        refused(&mut st, Command::Add(k("/big"), 1)),
        ApplyError::Overflow { .. }
    ));
    assert!(matches!(
        refused(&mut st, Command::Validate(1)),
        ApplyError::LateValidate
    ));
}

#[test]
fn check_wait_and_wakeups() {
    let mut st = State::default();
    assert_eq!(
        run(&mut st, 1, Command::Check(vec![k("/a"), k("/b")])).0,
        [NOT_READY]
    );
    let (reply, fx) = run(&mut st, 1, Command::Wait(vec![k("/a"), k("/b")]));
    assert!(reply.is_empty());
    let generation = fx.parked.expect("parked");
    // One of two keys written: still parked.
    assert!(run(&mut st, 2, Command::Set(k("/a"), k("1")))
        .1
        .woken
        .is_empty());
    // The second: woken with the wait's generation.
    assert_eq!(
        run(&mut st, 2, Command::Add(k("/b"), 1)).1.woken,
        vec![(1, generation)]
    );
    assert_eq!(
        run(&mut st, 1, Command::Check(vec![k("/a"), k("/b")])).0,
        [READY]
    );
    assert_eq!(
        run(&mut st, 1, Command::Wait(vec![k("/a")])).0,
        [STOP_WAITING],
        "present keys answer at once"
    );
    // Every kind of write wakes: APPEND, MULTI_SET, a successful COMPARE_SET.
    for (n, write) in [
        Command::Append(k("/x1"), k("v")),
        Command::MultiSet(vec![(k("/x2"), k("v"))]),
        Command::CompareSet {
            key: k("/x3"),
            expected: vec![],
            desired: k("v"),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("/x{}", n + 1);
        let g = run(&mut st, 3, Command::Wait(vec![k(&key)]))
            .1
            .parked
            .expect("parked");
        assert_eq!(run(&mut st, 4, write).1.woken, vec![(3, g)]);
    }
    // A failed COMPARE_SET on a missing key writes nothing and wakes nobody.
    run(&mut st, 5, Command::Wait(vec![k("/never")]));
    let fx = run(
        &mut st,
        6,
        Command::CompareSet {
            key: k("/never"),
            expected: k("e"),
            desired: k("d"),
        },
    )
    .1;
    assert!(fx.woken.is_empty());
}

#[test]
fn cancel_and_disconnect_make_wakeups_stale() {
    let mut st = State::default();
    run(&mut st, 1, Command::Wait(vec![k("/a")]));
    assert_eq!(run(&mut st, 1, Command::CancelWait).0, [WAIT_CANCELED]);
    assert!(run(&mut st, 2, Command::Set(k("/a"), k("v")))
        .1
        .woken
        .is_empty());
    run(&mut st, 3, Command::Wait(vec![k("/b")]));
    st.disconnect(3);
    assert!(run(&mut st, 2, Command::Set(k("/b"), k("v")))
        .1
        .woken
        .is_empty());
    // A re-parked connection is woken only by its new wait's keys.
    run(&mut st, 4, Command::Wait(vec![k("/c")]));
    st.cancel(4);
    let g = run(&mut st, 4, Command::Wait(vec![k("/d")]))
        .1
        .parked
        .expect("parked");
    assert!(run(&mut st, 2, Command::Set(k("/c"), k("v")))
        .1
        .woken
        .is_empty());
    assert_eq!(
        run(&mut st, 2, Command::Set(k("/d"), k("v"))).1.woken,
        vec![(4, g)]
    );
}

#[test]
fn multi_get_and_multi_set() {
    let mut st = State::default();
    run(
        &mut st,
        1,
        Command::MultiSet(vec![(k("/a"), k("1")), (k("/b"), k("22"))]),
    );
    let (out, _) = run(
        &mut st,
        1,
        Command::MultiGet(vec![k("/b"), k("/a"), k("/zz")]),
    );
    let mut want = bytes_reply(b"22");
    want.extend(bytes_reply(b"1"));
    want.extend(bytes_reply(b""));
    assert_eq!(out, want);
}

#[test]
fn queues() {
    let mut st = State::default();
    assert_eq!(
        run(&mut st, 1, Command::QueuePop(k("/q"))).0,
        i64_reply(0),
        "empty pop reports length 0 only"
    );
    let g1 = run(&mut st, 1, Command::Wait(vec![k("/q")]))
        .1
        .parked
        .expect("parked");
    run(&mut st, 2, Command::Wait(vec![k("/q")]))
        .1
        .parked
        .expect("parked");
    // A push wakes one waiter.
    assert_eq!(
        run(&mut st, 3, Command::QueuePush(k("/q"), k("a"))).1.woken,
        vec![(1, g1)]
    );
    run(&mut st, 3, Command::QueuePush(k("/q"), k("b")));
    assert_eq!(run(&mut st, 1, Command::QueueLen(k("/q"))).0, i64_reply(2));
    assert_eq!(
        run(&mut st, 1, Command::Check(vec![k("/q")])).0,
        [READY],
        "a non-empty queue counts as present"
    );
    let mut want = i64_reply(2);
    want.extend(bytes_reply(b"a"));
    assert_eq!(
        run(&mut st, 1, Command::QueuePop(k("/q"))).0,
        want,
        "FIFO, length before the pop"
    );
    assert_eq!(
        run(&mut st, 1, Command::NumKeys).0,
        i64_reply(0),
        "queues are not keys"
    );
}

#[test]
fn barrier_releases_everyone_at_world_size() {
    let mut st = State::default();
    let g1 = run(&mut st, 1, Command::Barrier(k("/bar"), 3))
        .1
        .parked
        .expect("first waits");
    let g2 = run(&mut st, 2, Command::Barrier(k("/bar"), 3))
        .1
        .parked
        .expect("second waits");
    let (reply, fx) = run(&mut st, 3, Command::Barrier(k("/bar"), 3));
    assert_eq!(
        reply,
        [STOP_WAITING],
        "the last arriver is answered at once"
    );
    let mut woken = fx.woken;
    woken.sort();
    assert_eq!(woken, vec![(1, g1), (2, g2)]);
    assert_eq!(
        run(&mut st, 1, Command::Get(k("/bar"))).0,
        bytes_reply(b"3")
    );
}

#[test]
fn ping_echoes() {
    let mut st = State::default();
    assert_eq!(
        run(&mut st, 1, Command::Ping(0xdead_beef)).0,
        0xdead_beef_u32.to_le_bytes()
    );
}

#[test]
fn waiters_are_removed_when_their_wait_ends_in_any_way() {
    let mut st = State::default();
    let keys: Vec<Vec<u8>> = (0..20_000).map(|i| k(&format!("/key/{i}"))).collect();
    // Abandoned: the connection closes while parked on 20,000 keys.
    run(&mut st, 1, Command::Wait(keys.clone()))
        .1
        .parked
        .expect("parked");
    assert_eq!(st.waiter_entries(), 20_000);
    st.disconnect(1);
    assert_eq!(
        st.waiter_entries(),
        0,
        "nothing of a closed connection stays"
    );
    // Cancelled.
    run(&mut st, 2, Command::Wait(keys.clone()));
    assert!(st.cancel(2));
    assert_eq!(st.waiter_entries(), 0, "nothing of a cancelled wait stays");
    // Woken: every key written; no entry is left for the keys written first.
    run(&mut st, 3, Command::Wait(keys[..3].to_vec()));
    run(&mut st, 4, Command::Barrier(k("/bar"), 2));
    run(&mut st, 5, Command::Wait(vec![k("/q")]));
    assert_eq!(st.waiter_entries(), 5);
    for key in &keys[..3] {
        run(&mut st, 9, Command::Set(key.clone(), k("v")));
    }
    run(&mut st, 9, Command::Barrier(k("/bar"), 2));
    run(&mut st, 9, Command::QueuePush(k("/q"), k("v")));
    assert_eq!(st.waiter_entries(), 0, "woken waits leave nothing behind");
    // Others' entries on a shared key survive one connection's departure.
    run(&mut st, 6, Command::Wait(vec![k("/shared")]));
    let g7 = run(&mut st, 7, Command::Wait(vec![k("/shared")]))
        .1
        .parked
        .expect("parked");
    st.disconnect(6);
    assert_eq!(
        run(&mut st, 9, Command::Set(k("/shared"), k("v"))).1.woken,
        vec![(7, g7)]
    );
}

#[test]
fn append_may_not_grow_a_value_past_the_value_limit() {
    let mut st = State::default();
    let chunk = vec![b'x'; (MAX_VALUE_LEN / 2) as usize];
    run(&mut st, 1, Command::Append(k("/a"), chunk.clone()));
    run(&mut st, 1, Command::Append(k("/a"), chunk.clone()));
    assert_eq!(
        refused(&mut st, Command::Append(k("/a"), k("y"))),
        ApplyError::ValueTooLarge {
            key: "/a".into(),
            len: MAX_VALUE_LEN + 1,
            limit: MAX_VALUE_LEN
        }
    );
    let (got, _) = run(&mut st, 1, Command::Get(k("/a")));
    assert_eq!(
        got.len(),
        8 + MAX_VALUE_LEN as usize,
        "the value is unchanged"
    );
    assert!(refused(&mut st, Command::Append(k("/a"), chunk))
        .to_string()
        .contains("over the limit of 8388608 bytes a value may have"));
}

#[test]
fn the_byte_budget_refuses_growth_and_allows_shrinking() {
    let mut st = State::with_budget(100);
    run(&mut st, 1, Command::Set(k("/a"), vec![0; 48])); // 2 + 48
    run(&mut st, 1, Command::Set(k("/b"), vec![0; 38])); // 2 + 38
    assert_eq!(st.bytes(), 90);
    let e = refused(&mut st, Command::Set(k("/c"), vec![0; 9])); // 2 + 9 → 101
    assert_eq!(
        e,
        ApplyError::OverBudget {
            would: 101,
            budget: 100
        }
    );
    assert!(e.to_string().contains("store_max_bytes"), "{e}");
    // Replacing a value counts only the difference; shrinking always passes.
    run(&mut st, 1, Command::Set(k("/a"), vec![0; 58]));
    assert_eq!(st.bytes(), 100);
    run(&mut st, 1, Command::Set(k("/a"), vec![0; 1]));
    assert_eq!(st.bytes(), 43);
    // Every kind of write is counted.
    for cmd in [
        Command::Append(k("/b"), vec![0; 60]),
        Command::Add(
            k("/n/123456789012345678901234567890123456789012345678901234567"),
            1,
        ),
        Command::MultiSet(vec![(k("/m"), vec![0; 30]), (k("/m2"), vec![0; 30])]),
        Command::QueuePush(k("/q"), vec![0; 60]),
        Command::CompareSet {
            key: k("/c"),
            expected: vec![],
            desired: vec![0; 60],
        },
    ] {
        let name = format!("{cmd:?}").chars().take(20).collect::<String>();
        assert!(
            matches!(refused(&mut st, cmd), ApplyError::OverBudget { .. }),
            "{name}"
        );
    }
    assert_eq!(st.bytes(), 43, "refused writes change nothing");
    // A MULTI_SET naming a key twice counts its last value once.
    run(
        &mut st,
        1,
        Command::MultiSet(vec![(k("/m"), vec![0; 50]), (k("/m"), vec![0; 20])]),
    );
    assert_eq!(st.bytes(), 43 + 2 + 20);
    // Deleting and popping give bytes back.
    run(&mut st, 1, Command::QueuePush(k("/q"), vec![0; 10]));
    assert_eq!(st.bytes(), 65 + 2 + 10);
    run(&mut st, 1, Command::QueuePop(k("/q")));
    run(&mut st, 1, Command::DeleteKey(k("/m")));
    run(&mut st, 1, Command::DeleteKey(k("/b")));
    run(&mut st, 1, Command::DeleteKey(k("/a")));
    assert_eq!(st.bytes(), 0);
}

#[test]
fn byte_count_matches_contents_after_mixed_writes() {
    let mut st = State::default();
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..5_000 {
        let key = k(&format!("/{}", rng.u8(..16)));
        let val = vec![b'1'; rng.usize(..40)];
        let cmd = match rng.u8(..8) {
            0 => Command::Set(key, val),
            1 => Command::Append(key, val),
            2 => Command::Add(key, 1),
            3 => Command::DeleteKey(key),
            4 => Command::QueuePush(key, val),
            5 => Command::QueuePop(key),
            6 => Command::MultiSet(vec![(key.clone(), val.clone()), (key, val)]),
            _ => Command::CompareSet {
                key,
                expected: vec![],
                desired: val,
            },
        };
        // Non-numbers under ADD are refused; that is fine here.
        let _ = st.apply(1, cmd, &mut Replies::default());
    }
    let held: usize = st.kv.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
        + st.queues
            .iter()
            .map(|(k, q)| k.len() + q.iter().map(Bytes::len).sum::<usize>())
            .sum::<usize>();
    assert_eq!(st.bytes(), held as u64);
    assert!(st.queues.values().all(|q| !q.is_empty()));
}
