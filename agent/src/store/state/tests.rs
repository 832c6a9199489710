use super::*;
use crate::store::wire::WAIT_CANCELED;

fn k(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// Applies `cmd` for connection `conn`; returns (reply bytes, effects).
fn run(st: &mut State, conn: ConnId, cmd: Command) -> (Vec<u8>, Effects) {
    let mut out = Vec::new();
    let fx = st.apply(conn, cmd, &mut out).expect("applies");
    (out, fx)
}

fn bytes_reply(v: &[u8]) -> Vec<u8> {
    let mut o = Vec::new();
    put_bytes(&mut o, v);
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
    let mut out = Vec::new();
    assert!(matches!(
        st.apply(1, Command::Add(k("/s"), 1), &mut out),
        Err(ApplyError::NotANumber { .. })
    ));
    run(
        &mut st,
        1,
        Command::Set(k("/big"), i64::MAX.to_string().into_bytes()),
    );
    assert!(matches!(
        st.apply(1, Command::Add(k("/big"), 1), &mut out),
        Err(ApplyError::Overflow { .. })
    ));
    assert!(matches!(
        st.apply(1, Command::Validate(1), &mut out),
        Err(ApplyError::LateValidate)
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
