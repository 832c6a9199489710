//! The store over real TCP: framing, ordering, bad input, many clients.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::wire::{
    encode, parse, Command, WireError, MAX_KEY_LEN, MAX_VALUE_LEN, VALIDATION_MAGIC,
};
use super::WorkerStore;

async fn store() -> WorkerStore {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    WorkerStore::start(l).expect("start")
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
    let s = store().await;
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
        assert_eq!(parse(&bytes), Ok(Some((c, bytes.len()))));
    }
}
