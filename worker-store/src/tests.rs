//! The store over real TCP: framing, ordering, bad input, many clients.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::wire::{
    encode, parse, Command, Parser, WireError, MAX_KEY_LEN, MAX_REQUEST_LEN, MAX_VALUE_LEN,
    VALIDATION_MAGIC,
};
use super::{Limits, StoreOptions, WorkerStore};

async fn store() -> WorkerStore {
    store_with(StoreOptions::default()).await
}

async fn store_with(options: StoreOptions) -> WorkerStore {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    WorkerStore::start_with(l, options).expect("start")
}

async fn client(s: &WorkerStore) -> TcpStream {
    let mut c = TcpStream::connect(s.addr()).await.expect("connect");
    c.write_all(&encode(&Command::Validate(VALIDATION_MAGIC)))
        .await
        .expect("validate");
    c
}

async fn read_n(c: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0; n];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut b))
        .await
        .expect("reply in time")
        .expect("read");
    b
}

async fn closed(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn k(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

#[tokio::test]
async fn fragmented_and_pipelined_requests_are_answered_in_order() {
    let s = store().await;
    let mut c = client(&s).await;
    let mut bytes = Vec::new();
    for i in 0..50i64 {
        bytes.extend(encode(&Command::Add(k("/n"), i)));
    }
    bytes.extend(encode(&Command::Ping(7)));
    // One byte at a time, flushed separately: every split point is exercised.
    for b in &bytes {
        c.write_all(&[*b]).await.expect("write");
    }
    let mut total = 0i64;
    for i in 0..50i64 {
        total += i;
        assert_eq!(read_n(&mut c, 8).await, total.to_le_bytes());
    }
    assert_eq!(read_n(&mut c, 4).await, 7u32.to_le_bytes());
}

#[tokio::test]
async fn a_wait_is_answered_when_another_client_writes() {
    let s = store().await;
    let (mut waiter, mut writer) = (client(&s).await, client(&s).await);
    // WAIT, then a pipelined GET that must be answered only after the wait.
    let mut req = encode(&Command::Wait(vec![k("/k")]));
    req.extend(encode(&Command::Get(k("/k"))));
    waiter.write_all(&req).await.expect("wait");
    tokio::time::sleep(Duration::from_millis(50)).await;
    writer
        .write_all(&encode(&Command::Set(k("/k"), k("v"))))
        .await
        .expect("set");
    assert_eq!(read_n(&mut waiter, 1).await, [0], "STOP_WAITING");
    let mut want = 1u64.to_le_bytes().to_vec();
    want.push(b'v');
    assert_eq!(read_n(&mut waiter, 9).await, want);
}

#[tokio::test]
async fn cancel_wait_answers_canceled() {
    let s = store().await;
    let mut c = client(&s).await;
    c.write_all(&encode(&Command::Wait(vec![k("/never")])))
        .await
        .expect("wait");
    c.write_all(&encode(&Command::CancelWait))
        .await
        .expect("cancel");
    assert_eq!(read_n(&mut c, 1).await, [1], "WAIT_CANCELED");
    c.write_all(&encode(&Command::Ping(1))).await.expect("ping");
    assert_eq!(
        read_n(&mut c, 4).await,
        1u32.to_le_bytes(),
        "the connection still serves"
    );
}

#[tokio::test]
async fn bad_input_closes_only_that_connection() {
    let s = store().await;
    let mut good = client(&s).await;
    let bad_inputs: Vec<Vec<u8>> = vec![
        encode(&Command::Validate(0x1234)), // bad magic
        encode(&Command::Ping(1)),          // no VALIDATE first
        [encode(&Command::Validate(VALIDATION_MAGIC)), vec![99]].concat(), // unknown command
        [
            encode(&Command::Validate(VALIDATION_MAGIC)),
            encode(&Command::Validate(VALIDATION_MAGIC)),
        ]
        .concat(),
        [encode(&Command::Validate(VALIDATION_MAGIC)), {
            let mut v = vec![1u8];
            v.extend((MAX_KEY_LEN + 1).to_le_bytes());
            v
        }]
        .concat(), // oversized key
        [encode(&Command::Validate(VALIDATION_MAGIC)), {
            let mut v = encode(&Command::Get(k("/x")));
            v[0] = 1; // SET with the key, then an oversized value length
            v.extend((MAX_VALUE_LEN + 1).to_le_bytes());
            v
        }]
        .concat(),
        [
            encode(&Command::Validate(VALIDATION_MAGIC)),
            encode(&Command::Set(k("/t"), k("text"))),
            encode(&Command::Add(k("/t"), 1)),
        ]
        .concat(), // ADD to a non-number
    ];
    for (i, input) in bad_inputs.iter().enumerate() {
        let mut c = TcpStream::connect(s.addr()).await.expect("connect");
        c.write_all(input).await.expect("write");
        assert!(closed(&mut c).await, "bad input {i} closes the connection");
    }
    good.write_all(&encode(&Command::Ping(9)))
        .await
        .expect("ping");
    assert_eq!(
        read_n(&mut good, 4).await,
        9u32.to_le_bytes(),
        "other clients are undisturbed"
    );
}

#[tokio::test]
async fn thousands_of_connections_on_one_loop() {
    // 2,000 connections from this host: within the limits of a 512-worker job.
    let s = store_with(StoreOptions {
        connections: super::ConnLimits::for_world(512),
        ..StoreOptions::default()
    })
    .await;
    let mut clients = Vec::new();
    for _ in 0..2000 {
        clients.push(client(&s).await);
    }
    for c in clients.iter_mut() {
        c.write_all(&encode(&Command::Add(k("/count"), 1)))
            .await
            .expect("add");
    }
    let mut last = 0;
    for c in clients.iter_mut() {
        last = last.max(i64::from_le_bytes(
            read_n(c, 8).await.try_into().expect("8"),
        ));
    }
    assert_eq!(last, 2000);
}

/// A value of `n` bytes.
fn value(n: u64) -> Vec<u8> {
    vec![b'v'; n as usize]
}

/// Polls `f` until it holds (5 s at most).
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

async fn counter(s: &WorkerStore, key: &str) -> i64 {
    let mut c = client(s).await;
    c.write_all(&encode(&Command::Add(k(key), 0)))
        .await
        .expect("add");
    i64::from_le_bytes(read_n(&mut c, 8).await.try_into().expect("8"))
}

#[tokio::test]
async fn a_client_that_does_not_read_stops_being_served_until_it_does() {
    let s = store().await;
    let mut c = client(&s).await;
    c.write_all(&encode(&Command::Set(k("/big"), value(MAX_VALUE_LEN))))
        .await
        .expect("set");
    // 100 GETs of an 8 MiB value (800 MiB of replies), each followed by a count.
    let mut req = Vec::new();
    for _ in 0..100 {
        req.extend(encode(&Command::Get(k("/big"))));
        req.extend(encode(&Command::Add(k("/served"), 1)));
    }
    c.write_all(&req).await.expect("pipelined");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let served = counter(&s, "/served").await;
    assert!(
        served < 10,
        "applying stops while replies wait for the socket: {served} of 100 served"
    );
    // Reading lets it go on, in order, to the end.
    let mut reply = vec![0u8; 8 + MAX_VALUE_LEN as usize + 8];
    for i in 1..=100i64 {
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut reply))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&reply[..8], &MAX_VALUE_LEN.to_le_bytes());
        assert_eq!(&reply[reply.len() - 8..], &i.to_le_bytes());
    }
}

#[tokio::test]
async fn a_parked_connection_is_closed_past_one_maximal_request() {
    let s = store().await;
    let mut c = client(&s).await;
    c.write_all(&encode(&Command::Wait(vec![k("/never")])))
        .await
        .expect("wait");
    // Pipelined behind the WAIT: buffered, up to one maximal request.
    let pings: Vec<u8> = (0..(MAX_REQUEST_LEN / 5 + 1024))
        .flat_map(|_| encode(&Command::Ping(1)))
        .collect();
    // The server may close before taking everything: a failed write is fine.
    let _ = c.write_all(&pings).await;
    assert!(closed(&mut c).await, "closed once it buffered too much");
    // A parked connection within the bound stays, and CANCEL_WAIT still works.
    let mut ok = client(&s).await;
    ok.write_all(&encode(&Command::Wait(vec![k("/never")])))
        .await
        .expect("wait");
    ok.write_all(&encode(&Command::CancelWait))
        .await
        .expect("cancel");
    assert_eq!(read_n(&mut ok, 1).await, [1], "WAIT_CANCELED");
}

#[tokio::test]
async fn handshake_and_incomplete_requests_have_deadlines_idle_clients_do_not() {
    let limits = Limits {
        handshake: Duration::from_millis(300),
        partial_idle: Duration::from_millis(300),
        ..Limits::default()
    };
    let s = store_with(StoreOptions {
        limits,
        ..StoreOptions::default()
    })
    .await;
    let mut silent = TcpStream::connect(s.addr()).await.expect("connect");
    let mut half = client(&s).await;
    let set = encode(&Command::Set(k("/k"), value(1000)));
    half.write_all(&set[..set.len() / 2]).await.expect("half");
    let mut idle = client(&s).await;
    let mut trickle = client(&s).await;
    trickle.write_all(&set[..10]).await.expect("start");
    let t0 = std::time::Instant::now();
    // Progress keeps an incomplete request alive.
    for chunk in set[10..].chunks(set.len() / 8) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trickle.write_all(chunk).await.expect("trickle");
    }
    assert!(closed(&mut silent).await, "no VALIDATE: closed");
    assert!(
        closed(&mut half).await,
        "half a request, then nothing: closed"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for c in [&mut idle, &mut trickle] {
        c.write_all(&encode(&Command::Ping(3))).await.expect("ping");
        assert_eq!(read_n(c, 4).await, 3u32.to_le_bytes(), "still served");
    }
    trickle
        .write_all(&encode(&Command::Get(k("/k"))))
        .await
        .expect("get");
    assert_eq!(read_n(&mut trickle, 8 + 1000).await[8..], value(1000)[..]);
}

#[tokio::test]
async fn waiters_of_a_closed_connection_are_forgotten() {
    let s = store().await;
    let keys: Vec<Vec<u8>> = (0..20_000).map(|i| k(&format!("/wait/{i}"))).collect();
    for _ in 0..3 {
        let mut c = client(&s).await;
        c.write_all(&encode(&Command::Wait(keys.clone())))
            .await
            .expect("wait");
        assert!(eventually(|| s.stats().waiter_entries == 20_000).await);
        drop(c);
        assert!(
            eventually(|| s.stats().waiter_entries == 0 && s.stats().connections == 0).await,
            "{:?}",
            s.stats()
        );
    }
}

#[tokio::test]
async fn writes_past_the_byte_budget_close_only_the_writer() {
    let s = store_with(StoreOptions {
        max_bytes: 1 << 20,
        ..StoreOptions::default()
    })
    .await;
    let mut other = client(&s).await;
    let mut w = client(&s).await;
    w.write_all(&encode(&Command::Set(k("/a"), value(600 << 10))))
        .await
        .expect("set");
    w.write_all(&encode(&Command::Ping(1))).await.expect("ping");
    assert_eq!(read_n(&mut w, 4).await, 1u32.to_le_bytes());
    let _ = w
        .write_all(&encode(&Command::Set(k("/b"), value(600 << 10))))
        .await;
    assert!(closed(&mut w).await, "over budget: closed");
    assert_eq!(s.stats().bytes, 2 + (600 << 10));
    // APPEND past the value limit is refused the same way.
    let mut a = client(&s).await;
    a.write_all(&encode(&Command::Append(
        k("/a"),
        value(MAX_VALUE_LEN - 1000),
    )))
    .await
    .expect("append");
    assert!(closed(&mut a).await, "APPEND past 8 MiB: closed");
    other
        .write_all(&encode(&Command::Get(k("/b"))))
        .await
        .expect("get");
    assert_eq!(
        read_n(&mut other, 8).await,
        0u64.to_le_bytes(),
        "/b was not written"
    );
}

#[test]
fn parser_refuses_oversized_requests_from_their_length_prefix() {
    // 3 keys, the third's length prefix taking the request past the limit.
    let mut wait = vec![6u8];
    wait.extend(3u64.to_le_bytes());
    for _ in 0..2 {
        wait.extend(MAX_KEY_LEN.to_le_bytes());
        wait.extend(value(MAX_KEY_LEN));
    }
    assert_eq!(parse(&wait), Ok(None), "within the limit so far");
    let mut mset = vec![11u8];
    mset.extend(3i64.to_le_bytes());
    for _ in 0..2 {
        mset.extend(1u64.to_le_bytes());
        mset.push(b'k');
        mset.extend(MAX_VALUE_LEN.to_le_bytes());
        mset.extend(value(MAX_VALUE_LEN));
    }
    mset.extend(1u64.to_le_bytes());
    mset.push(b'k');
    // A third value this long takes the request past the limit: refused
    // before any of its bytes arrive.
    mset.extend((2 * MAX_KEY_LEN).to_le_bytes());
    assert!(
        matches!(
            parse(&mset),
            Err(WireError::TooLarge {
                what: "request length",
                ..
            })
        ),
        "{:?}",
        parse(&mset).map(|_| ())
    );
    // The largest single-key request fits exactly.
    let cas = encode(&Command::CompareSet {
        key: value(MAX_KEY_LEN),
        expected: value(MAX_VALUE_LEN),
        desired: value(MAX_VALUE_LEN),
    });
    assert_eq!(cas.len() as u64, MAX_REQUEST_LEN);
    assert!(matches!(parse(&cas), Ok(Some(_))));
}

#[test]
fn parser_needs_whole_commands() {
    let set = encode(&Command::Set(k("/key"), k("value")));
    for cut in 0..set.len() {
        assert_eq!(parse(&set[..cut]), Ok(None), "cut at {cut}");
    }
    assert_eq!(
        parse(&set),
        Ok(Some((Command::Set(k("/key"), k("value")), set.len())))
    );
    assert_eq!(parse(&[200]), Err(WireError::UnknownCommand(200)));
    let mut neg = vec![11u8];
    neg.extend((-1i64).to_le_bytes());
    assert_eq!(parse(&neg), Err(WireError::NegativeCount(-1)));
}

#[test]
fn every_command_round_trips() {
    let cmds = vec![
        Command::Validate(VALIDATION_MAGIC),
        Command::Set(k("a"), k("b")),
        Command::CompareSet {
            key: k("a"),
            expected: k("b"),
            desired: k("c"),
        },
        Command::Get(k("a")),
        Command::Add(k("a"), -3),
        Command::Check(vec![k("a"), k("b")]),
        Command::Wait(vec![k("a")]),
        Command::NumKeys,
        Command::DeleteKey(k("a")),
        Command::Append(k("a"), k("z")),
        Command::MultiGet(vec![k("a"), k("b")]),
        Command::MultiSet(vec![(k("a"), k("1")), (k("b"), k("2"))]),
        Command::CancelWait,
        Command::Ping(5),
        Command::QueuePush(k("q"), k("v")),
        Command::QueuePop(k("q")),
        Command::QueueLen(k("q")),
        Command::ListKeys,
        Command::Barrier(k("b"), 4),
    ];
    for c in cmds {
        let bytes = encode(&c);
        assert_eq!(parse(&bytes), Ok(Some((c.clone(), bytes.len()))));
        // Fed a byte at a time to one parser: the same command, at the last byte only.
        let mut p = Parser::default();
        for end in 1..bytes.len() {
            assert_eq!(p.parse(&bytes[..end]), Ok(None), "{c:?} cut at {end}");
        }
        assert_eq!(p.parse(&bytes), Ok(Some((c, bytes.len()))));
        assert!(!p.in_progress(), "it starts afresh after a command");
    }
}

#[test]
fn a_parser_keeps_its_place_and_survives_misuse() {
    let keys: Vec<Vec<u8>> = (0..5000).map(|i| k(&format!("/check/{i:06}"))).collect();
    let check = encode(&Command::Check(keys.clone()));
    let mut p = Parser::default();
    let mut end = 0;
    while end < check.len() {
        end = (end + 1000).min(check.len());
        let got = p.parse(&check[..end]).expect("valid");
        assert_eq!(got.is_some(), end == check.len());
        if end < check.len() {
            assert!(p.in_progress());
        }
    }
    // Misuse (fewer bytes than already parsed, another request) starts afresh.
    let mut p = Parser::default();
    assert_eq!(p.parse(&check[..check.len() / 2]), Ok(None));
    assert_eq!(p.parse(&check[..100]), Ok(None));
    let set = encode(&Command::Set(k("a"), k("b")));
    assert_eq!(p.parse(&check[..check.len() / 2]), Ok(None));
    assert_eq!(
        p.parse(&set),
        Ok(Some((Command::Set(k("a"), k("b")), set.len())))
    );
    assert_eq!(p.parse(&[]), Ok(None));
    // An error is final for that request, and the parser starts afresh.
    let mut p = Parser::default();
    assert_eq!(p.parse(&[200]), Err(WireError::UnknownCommand(200)));
    assert_eq!(
        p.parse(&check),
        Ok(Some((Command::Check(keys), check.len())))
    );
}
