//! The worker store as an attacker on the network sees it: arbitrary bytes,
//! cut anywhere, from a few connections at once, into the real parser (a
//! [`wire::Parser`] per connection, keeping its place in an incomplete
//! request between pieces as the server's does) and the real command
//! semantics ([`State`]).
//!
//! The harness plays the part of the store's connection tasks (handshake
//! first, a parked connection reads nothing but CANCEL_WAIT, wake-ups arrive
//! whenever the fuzzer says so) and keeps a small reference model of the
//! keys and queues, so besides "no panic" it checks:
//! - parsing is independent of how the bytes were cut: the commands parsed
//!   piece by piece (by the connection's resumable parser) are those of
//!   parsing all bytes at once ([`wire::parse`]), up to the same error, and
//!   each command re-encodes to exactly the bytes it came from;
//! - every reply is the one the model predicts (so nothing is lost, doubled
//!   or miscounted in the store's data);
//! - wake-ups go only to a connection parked with that generation, once;
//!   no connection stays parked when its wait is over.
//!
//! # Input
//! A sequence of records; the low two bits of a record's first byte name the
//! connection (0..4), the next two the action:
//! - `0`: a length byte and that many bytes arrive on the connection;
//! - `1`: one well-formed command, made from the next bytes with keys and
//!   values from small sets (so that connections meet on the same keys, which
//!   random bytes rarely do), arrives cut in two at a place the input picks;
//!   a connection's first such command is preceded by the handshake;
//! - `2`: the connection's pending wake-ups are delivered;
//! - `3`: the client disconnects, and the slot reconnects as a new client.
//!
//! `fuzz/corpus/store_wire/` holds real client sessions in this format
//! (`fuzz/seeds.py` writes them). To see what a crashing input does, replay
//! it with `STORE_FUZZ_TRACE=1` in the environment.

#![no_main]

use std::collections::{HashMap, VecDeque};

use accel_worker_store::reply::Replies;
use accel_worker_store::state::{ApplyError, ConnId, State};
use accel_worker_store::wire::{
    self, Command, WireError, NOT_READY, READY, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use libfuzzer_sys::fuzz_target;

const CONNECTIONS: usize = 4;

fuzz_target!(|data: &[u8]| {
    let mut store = Store {
        trace: std::env::var_os("STORE_FUZZ_TRACE").is_some(),
        ..Store::default()
    };
    let mut conns: Vec<Conn> = (0..CONNECTIONS).map(|_| store.connect()).collect();
    let mut at = 0;
    while let Some(&head) = data.get(at) {
        at += 1;
        let slot = usize::from(head & 3);
        match (head >> 2) & 3 {
            0 => {
                let len = usize::from(data.get(at).copied().unwrap_or(0));
                at += 1;
                let chunk = data.get(at..).map_or(&[][..], |d| &d[..len.min(d.len())]);
                at += len;
                store.feed(&mut conns, slot, chunk);
            }
            1 => {
                let mut fields = Fields { data, at };
                let cmd = fields.command();
                let cut = usize::from(fields.byte());
                at = fields.at;
                if conns[slot].received.is_empty() {
                    let hello = wire::encode(&Command::Validate(VALIDATION_MAGIC));
                    store.feed(&mut conns, slot, &hello);
                }
                let bytes = wire::encode(&cmd);
                let (first, second) = bytes.split_at(cut % (bytes.len() + 1));
                store.feed(&mut conns, slot, first);
                store.feed(&mut conns, slot, second);
            }
            2 => store.deliver(&mut conns, slot),
            _ => {
                let fresh = store.connect();
                let old = std::mem::replace(&mut conns[slot], fresh);
                store.disconnect(old);
            }
        }
        store.check_waits(&conns);
    }
    for conn in conns {
        store.disconnect(conn);
    }
});

/// Keys and values of the well-formed commands: few, so that they collide,
/// with numbers at the edges of ADD's range and a text that is not one.
const KEYS: [&[u8]; 4] = [b"/a", b"/b", b"q", b""];
const VALUES: [&[u8]; 6] = [b"", b"1", b" -2 ", b"x", b"9223372036854775807", b"-9223372036854775808"];
const DELTAS: [i64; 6] = [1, -1, 0, 7, i64::MAX, i64::MIN];

/// The bytes a well-formed command is made from; zeros once exhausted.
struct Fields<'a> {
    data: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    fn byte(&mut self) -> u8 {
        self.at += 1;
        self.data.get(self.at - 1).copied().unwrap_or(0)
    }

    fn key(&mut self) -> Vec<u8> {
        KEYS[usize::from(self.byte()) % KEYS.len()].to_vec()
    }

    fn keys(&mut self) -> Vec<Vec<u8>> {
        let n = self.byte() % 4;
        (0..n).map(|_| self.key()).collect()
    }

    fn value(&mut self) -> Vec<u8> {
        VALUES[usize::from(self.byte()) % VALUES.len()].to_vec()
    }

    fn command(&mut self) -> Command {
        match self.byte() % 19 {
            0 => Command::Validate(VALIDATION_MAGIC),
            1 => Command::Set(self.key(), self.value()),
            2 => Command::CompareSet {
                key: self.key(),
                expected: self.value(),
                desired: self.value(),
            },
            3 => Command::Get(self.key()),
            4 => Command::Add(self.key(), DELTAS[usize::from(self.byte()) % DELTAS.len()]),
            5 => Command::Check(self.keys()),
            6 => Command::Wait(self.keys()),
            7 => Command::NumKeys,
            8 => Command::DeleteKey(self.key()),
            9 => Command::Append(self.key(), self.value()),
            10 => Command::MultiGet(self.keys()),
            11 => {
                let n = self.byte() % 3;
                Command::MultiSet((0..n).map(|_| (self.key(), self.value())).collect())
            }
            12 => Command::CancelWait,
            13 => Command::Ping(u32::from(self.byte())),
            14 => Command::QueuePush(self.key(), self.value()),
            15 => Command::QueuePop(self.key()),
            16 => Command::QueueLen(self.key()),
            17 => Command::ListKeys,
            _ => Command::Barrier(self.key(), i64::from(self.byte() % 4)),
        }
    }
}

/// One client connection, as the server's connection task keeps it.
#[derive(Debug)]
struct Conn {
    id: ConnId,
    /// Bytes received and not yet consumed.
    buf: Vec<u8>,
    /// Where parsing stopped in an incomplete request.
    parser: wire::Parser,
    /// A command parsed while parked, applied once the wait ends.
    held: Option<(Command, usize)>,
    /// Every byte received (for the one-shot parse).
    received: Vec<u8>,
    /// Commands parsed piece by piece, in order.
    parsed: Vec<Command>,
    /// Why the server closed the connection, if it did.
    closed: Option<String>,
    /// The parse error that closed it, if that was the reason.
    wire_error: Option<WireError>,
    validated: bool,
    /// Generation of the wait it is parked in, and what it waits for.
    parked: Option<(u64, Awaiting)>,
    /// Wake-ups sent to it and not yet delivered.
    pending: Vec<u64>,
}

#[derive(Debug, Clone)]
enum Awaiting {
    /// WAIT: the keys that were missing when it parked.
    Keys(Vec<Vec<u8>>),
    /// BARRIER: the counter key and its target.
    Barrier(Vec<u8>, i64),
}

/// The real [`State`] and the reference model the harness compares it with.
#[derive(Debug, Default)]
struct Store {
    /// Print every command and its effects (`STORE_FUZZ_TRACE`).
    trace: bool,
    state: State,
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    next_id: ConnId,
}

impl Store {
    fn connect(&mut self) -> Conn {
        self.next_id += 1;
        Conn {
            id: self.next_id,
            buf: Vec::new(),
            parser: wire::Parser::default(),
            held: None,
            received: Vec::new(),
            parsed: Vec::new(),
            closed: None,
            wire_error: None,
            validated: false,
            parked: None,
            pending: Vec::new(),
        }
    }

    /// The server closes a connection: its task ends and the store forgets it.
    fn close(&mut self, conn: &mut Conn, why: String) {
        conn.closed = Some(why);
        conn.parked = None;
        conn.pending.clear();
        self.state.disconnect(conn.id);
    }

    fn disconnect(&mut self, conn: Conn) {
        self.state.disconnect(conn.id);
        check_one_shot_parse(&conn);
    }

    fn feed(&mut self, conns: &mut [Conn], slot: usize, chunk: &[u8]) {
        let conn = &mut conns[slot];
        if conn.closed.is_some() {
            return; // the server stopped reading
        }
        conn.buf.extend_from_slice(chunk);
        conn.received.extend_from_slice(chunk);
        self.process(conns, slot);
    }

    fn deliver(&mut self, conns: &mut [Conn], slot: usize) {
        let conn = &mut conns[slot];
        for generation in std::mem::take(&mut conn.pending) {
            if conn.parked.as_ref().is_some_and(|(g, _)| *g == generation) {
                conn.parked = None;
                // The STOP_WAITING reply; nothing to compare it with.
            }
        }
        if conn.closed.is_none() {
            self.process(conns, slot);
        }
    }

    /// The connection task's loop over buffered bytes (store.rs `process`).
    fn process(&mut self, conns: &mut [Conn], slot: usize) {
        loop {
            let conn = &mut conns[slot];
            let parsed = match conn.held.take() {
                Some(held) => Ok(Some(held)),
                None => conn.parser.parse(&conn.buf),
            };
            let (cmd, n) = match parsed {
                Ok(Some(parsed)) => parsed,
                Ok(None) => return,
                Err(e) => {
                    let why = e.to_string();
                    conn.wire_error = Some(e);
                    self.close(conn, why);
                    return;
                }
            };
            check_framing(&conn.buf, &cmd, n);
            if conn.parked.is_some() && cmd != Command::CancelWait {
                conn.held = Some((cmd, n));
                return; // answered once the wait ends
            }
            conn.buf.drain(..n);
            conn.parsed.push(cmd.clone());
            if !conn.validated {
                if cmd != Command::Validate(VALIDATION_MAGIC) {
                    self.close(conn, format!("no handshake: {cmd:?}"));
                    return;
                }
                conn.validated = true;
                continue;
            }
            if cmd == Command::CancelWait {
                let registered = self.state.cancel(conn.id);
                assert!(
                    !registered || conn.parked.is_some(),
                    "the state held a wait for connection {} that is not parked",
                    conn.id
                );
                conn.parked = None;
                continue;
            }
            let id = conn.id;
            if let Err(why) = self.apply(conns, id, cmd) {
                self.close(&mut conns[slot], why);
                return;
            }
        }
    }

    /// Applies one command to the real state and the model; compares them.
    fn apply(&mut self, conns: &mut [Conn], id: ConnId, cmd: Command) -> Result<(), String> {
        let mut replies = Replies::default();
        let result = self.state.apply(id, cmd.clone(), &mut replies);
        let out = replies.to_vec();
        if self.trace {
            let shown = format!("{cmd:?}");
            eprintln!("conn {id}: {} -> {result:?}, reply {:?}", &shown[..shown.len().min(200)], &out[..out.len().min(32)]);
        }
        let fx = match result {
            Ok(fx) => fx,
            Err(e) => {
                let expected = self.expected_error(&cmd);
                assert_eq!(Some(&e), expected.as_ref(), "{cmd:?} failed unexpectedly");
                return Err(e.to_string());
            }
        };
        assert_eq!(
            self.expected_error(&cmd),
            None,
            "{cmd:?} succeeded, the model expected an error"
        );
        let (reply, awaiting) = self.model(&cmd);
        match &cmd {
            Command::ListKeys => check_list_keys(&out, &self.kv),
            _ => assert_eq!(out, reply, "reply to {cmd:?}"),
        }
        assert_eq!(
            fx.parked.is_some(),
            awaiting.is_some(),
            "{cmd:?}: parked {:?}, the model says {awaiting:?}",
            fx.parked
        );
        for (woken, generation) in fx.woken {
            let c = conns
                .iter_mut()
                .find(|c| c.id == woken)
                .unwrap_or_else(|| panic!("woke connection {woken}, which is not connected"));
            let Some((g, awaiting)) = &c.parked else {
                panic!("woke connection {woken}, which is not parked");
            };
            assert_eq!(*g, generation, "woke connection {woken} for a stale wait");
            assert!(
                !c.pending.contains(&generation),
                "woke connection {woken} twice for one wait"
            );
            if let Awaiting::Barrier(key, target) = awaiting {
                // MULTI_SET writes its pairs one by one (as PyTorch's server
                // does): a barrier may open at any of them.
                let written = match &cmd {
                    Command::MultiSet(pairs) => pairs
                        .iter()
                        .filter(|(k, _)| k == key)
                        .map(|(_, v)| v.clone())
                        .collect(),
                    _ => Vec::new(),
                };
                let reached = |v: &[u8]| {
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .is_some_and(|n| n >= *target)
                };
                assert!(
                    number(&self.kv, key).is_some_and(|v| v >= *target)
                        || written.iter().any(|v| reached(v)),
                    "barrier on {key:?} released below its target {target}"
                );
            }
            c.pending.push(generation);
        }
        if let (Some(generation), Some(awaiting)) = (fx.parked, awaiting) {
            let c = conns.iter_mut().find(|c| c.id == id).expect("caller");
            c.parked = Some((generation, awaiting));
        }
        Ok(())
    }

    /// The error the model expects `cmd` to fail with, if any.
    fn expected_error(&self, cmd: &Command) -> Option<ApplyError> {
        let (key, delta) = match cmd {
            Command::Validate(_) => return Some(ApplyError::LateValidate),
            Command::Add(k, d) => (k, *d),
            Command::Barrier(k, _) => (k, 1),
            _ => return None,
        };
        let lossy = String::from_utf8_lossy(key).into_owned();
        if !self.kv.contains_key(key) {
            return None;
        }
        match number(&self.kv, key) {
            None => Some(ApplyError::NotANumber { key: lossy }),
            Some(v) if v.checked_add(delta).is_none() => Some(ApplyError::Overflow { key: lossy }),
            Some(_) => None,
        }
    }

    /// The reference model: updates itself for `cmd` and returns the reply
    /// it expects, and what the caller waits for if it must park.
    fn model(&mut self, cmd: &Command) -> (Vec<u8>, Option<Awaiting>) {
        let mut out = Vec::new();
        let mut awaiting = None;
        match cmd {
            Command::Validate(_) | Command::CancelWait => unreachable!("handled by the caller"),
            Command::Ping(n) => out.extend_from_slice(&n.to_le_bytes()),
            Command::Set(k, v) => {
                self.kv.insert(k.clone(), v.clone());
            }
            Command::CompareSet {
                key,
                expected,
                desired,
            } => match self.kv.get(key) {
                None if !expected.is_empty() => wire::put_bytes(&mut out, expected),
                Some(cur) if cur != expected => wire::put_bytes(&mut out, cur),
                _ => {
                    wire::put_bytes(&mut out, desired);
                    self.kv.insert(key.clone(), desired.clone());
                }
            },
            Command::Get(k) => wire::put_bytes(&mut out, self.value(k)),
            Command::Add(k, d) => wire::put_i64(&mut out, self.add(k, *d)),
            Command::Check(keys) => out.push(if keys.iter().all(|k| self.present(k)) {
                READY
            } else {
                NOT_READY
            }),
            Command::Wait(keys) => {
                let missing: Vec<Vec<u8>> =
                    keys.iter().filter(|k| !self.present(k)).cloned().collect();
                if missing.is_empty() {
                    out.push(STOP_WAITING);
                } else {
                    awaiting = Some(Awaiting::Keys(missing));
                }
            }
            Command::NumKeys => wire::put_i64(&mut out, self.kv.len() as i64),
            Command::DeleteKey(k) => {
                wire::put_i64(&mut out, i64::from(self.kv.remove(k).is_some()))
            }
            Command::Append(k, v) => self.kv.entry(k.clone()).or_default().extend_from_slice(v),
            Command::MultiGet(keys) => {
                for k in keys {
                    wire::put_bytes(&mut out, self.value(k));
                }
            }
            Command::MultiSet(pairs) => {
                for (k, v) in pairs {
                    self.kv.insert(k.clone(), v.clone());
                }
            }
            Command::QueuePush(k, v) => self.queues.entry(k.clone()).or_default().push_back(v.clone()),
            Command::QueuePop(k) => {
                let q = self.queues.entry(k.clone()).or_default();
                wire::put_i64(&mut out, q.len() as i64);
                if let Some(v) = q.pop_front() {
                    wire::put_bytes(&mut out, &v);
                }
            }
            Command::QueueLen(k) => {
                wire::put_i64(&mut out, self.queues.get(k).map_or(0, VecDeque::len) as i64)
            }
            Command::ListKeys => {} // compared as a set by the caller
            Command::Barrier(k, world_size) => {
                if self.add(k, 1) >= *world_size {
                    out.push(STOP_WAITING);
                } else {
                    awaiting = Some(Awaiting::Barrier(k.clone(), *world_size));
                }
            }
        }
        (out, awaiting)
    }

    fn value(&self, k: &[u8]) -> &[u8] {
        self.kv.get(k).map_or(&[][..], Vec::as_slice)
    }

    fn present(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    /// ADD on the model; the caller checked it cannot fail.
    fn add(&mut self, k: &[u8], delta: i64) -> i64 {
        let next = number(&self.kv, k).unwrap_or(0) + delta;
        self.kv.insert(k.to_vec(), next.to_string().into_bytes());
        next
    }

    /// No connection stays parked once what it waits for has happened.
    fn check_waits(&self, conns: &[Conn]) {
        for c in conns {
            let Some((generation, awaiting)) = &c.parked else {
                continue;
            };
            if c.pending.contains(generation) {
                continue; // woken, the wake-up is on its way
            }
            match awaiting {
                // A WAIT counts one write per awaited key; all of them written
                // (and still there) means the count must have reached zero.
                Awaiting::Keys(keys) => assert!(
                    !keys.iter().all(|k| self.kv.contains_key(k)),
                    "connection {} still parked though every key of its wait {keys:?} was written",
                    c.id
                ),
                Awaiting::Barrier(key, target) => assert!(
                    !number(&self.kv, key).is_some_and(|v| v >= *target),
                    "connection {} still parked at a barrier on {key:?} that reached {target}",
                    c.id
                ),
            }
        }
    }
}

/// A key's value read as the decimal counter ADD and BARRIER keep (`None`:
/// missing, or not a number).
fn number(kv: &HashMap<Vec<u8>, Vec<u8>>, k: &[u8]) -> Option<i64> {
    std::str::from_utf8(kv.get(k)?).ok()?.trim().parse().ok()
}

/// The command at the front of `buf` took `n` bytes: they encode it exactly,
/// and any shorter prefix is an incomplete command, not another one.
fn check_framing(buf: &[u8], cmd: &Command, n: usize) {
    assert_eq!(wire::encode(cmd), &buf[..n], "{cmd:?} does not re-encode to its bytes");
    for cut in [n - 1, n / 2, 1.min(n - 1)] {
        assert_eq!(
            wire::parse(&buf[..cut]),
            Ok(None),
            "a {cut}-byte prefix of {cmd:?} ({n} bytes) parsed as a command"
        );
    }
}

/// LIST_KEYS: a count and that many keys, the model's key set in any order.
fn check_list_keys(out: &[u8], kv: &HashMap<Vec<u8>, Vec<u8>>) {
    let count = i64::from_le_bytes(out[..8].try_into().expect("count"));
    assert_eq!(count, kv.len() as i64, "LIST_KEYS count");
    let mut at = 8;
    let mut keys = Vec::new();
    while at < out.len() {
        let len = u64::from_le_bytes(out[at..at + 8].try_into().expect("length")) as usize;
        keys.push(out[at + 8..at + 8 + len].to_vec());
        at += 8 + len;
    }
    keys.sort();
    let mut expected: Vec<Vec<u8>> = kv.keys().cloned().collect();
    expected.sort();
    assert_eq!(keys, expected, "LIST_KEYS keys");
}

/// Parsing everything the connection received at once gives the commands
/// parsed piece by piece (those it got to before it closed or parked), and
/// the same error at the same place.
fn check_one_shot_parse(conn: &Conn) {
    let mut at = 0;
    let mut whole = Vec::new();
    let mut error = None;
    while whole.len() < conn.parsed.len() + 1 {
        match wire::parse(&conn.received[at..]) {
            Ok(Some((cmd, n))) => {
                whole.push(cmd);
                at += n;
            }
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let k = conn.parsed.len();
    assert_eq!(
        &whole[..k.min(whole.len())],
        &conn.parsed[..],
        "parsing in pieces and at once disagree"
    );
    if let Some(e) = &conn.wire_error {
        assert_eq!(whole.len(), k, "the error came at another command");
        assert_eq!(error.as_ref(), Some(e), "parsing at once gives another error");
    }
}

// Keep the reply constants in view: a wake-up's reply is STOP_WAITING, a
// cancelled wait's WAIT_CANCELED; both are fixed by the protocol.
const _: () = assert!(STOP_WAITING == 0 && WAIT_CANCELED == 1);
