use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use super::*;
use accel_worker_store::wire::{parse, Command, VALIDATION_MAGIC};
use accel_worker_store::WorkerStore;

/// accel's store on a loopback port, served by its own runtime.
pub(crate) fn store() -> (tokio::runtime::Runtime, WorkerStore) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let store = {
        let _in_runtime = rt.enter();
        WorkerStore::start(listener).expect("store")
    };
    (rt, store)
}

fn parsed(bytes: &[u8]) -> Command {
    let (cmd, used) = parse(bytes).expect("valid").expect("complete");
    assert_eq!(used, bytes.len(), "one whole command");
    cmd
}

#[test]
fn requests_parse_as_the_server_reads_them() {
    assert_eq!(MAGIC, VALIDATION_MAGIC);
    assert_eq!(parsed(&encode::validate()), Command::Validate(MAGIC));
    assert_eq!(parsed(&encode::ping(7)), Command::Ping(7));
    assert_eq!(
        parsed(&encode::set(b"k", b"value")),
        Command::Set(b"k".to_vec(), b"value".to_vec())
    );
    assert_eq!(parsed(&encode::get(b"key")), Command::Get(b"key".to_vec()));
    assert_eq!(
        parsed(&encode::add(b"n", -3)),
        Command::Add(b"n".to_vec(), -3)
    );
    assert_eq!(
        parsed(&encode::check(&[b"a", b""])),
        Command::Check(vec![b"a".to_vec(), Vec::new()])
    );
    assert_eq!(
        parsed(&encode::wait(&[b"a", b"bc"])),
        Command::Wait(vec![b"a".to_vec(), b"bc".to_vec()])
    );
    // The bytes themselves: command, u64 LE length, key, i64 LE delta.
    assert_eq!(
        encode::add(b"k", 1),
        [&[4u8][..], &1u64.to_le_bytes(), b"k", &1i64.to_le_bytes()].concat()
    );
}

#[test]
fn round_trip_against_accels_store() {
    let (_rt, s) = store();
    let port = s.addr().port();
    let limit = Duration::from_secs(5);
    let mut a = Client::connect("127.0.0.1", port, limit).expect("connect");
    let mut b = Client::connect("localhost", port, limit).expect("connect by name");
    assert!(!a.check(&["x".into()]).expect("check"));
    a.set("x", "hello").expect("set");
    b.wait(&["x".into()]).expect("wait");
    assert_eq!(b.get("x").expect("get"), b"hello");
    assert_eq!(a.add("n", 2).expect("add"), 2);
    assert_eq!(b.add("n", 3).expect("add"), 5);
    assert!(a.check(&["x".into(), "n".into()]).expect("check"));
    assert_eq!(a.addr(), format!("127.0.0.1:{port}"));
}

#[test]
fn a_wait_that_never_ends_times_out() {
    let (_rt, s) = store();
    let mut c =
        Client::connect("127.0.0.1", s.addr().port(), Duration::from_millis(300)).expect("connect");
    let start = Instant::now();
    let e = c.wait(&["never".into()]).expect_err("times out");
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("WAIT never"), "{e}");
}

#[test]
fn connection_failures_are_clear() {
    // Nothing listens: retried until the limit, then an error naming the address.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let start = Instant::now();
    let e = Client::connect("127.0.0.1", port, Duration::from_millis(400)).expect_err("refused");
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");

    let e = Client::connect("no-such-host.invalid", 1, Duration::from_secs(30))
        .expect_err("unresolvable");
    assert!(matches!(e, ClientError::Resolve { .. }), "{e}");

    // Something that is not a store answers the PING with other bytes.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let e = Client::connect("127.0.0.1", port, Duration::from_secs(5)).expect_err("not a store");
    assert!(matches!(e, ClientError::Protocol { .. }), "{e}");
    let _ = server.join();
}
