//! PyTorch's TCPStore wire format: incremental parsing of requests and
//! encoding of replies.
//!
//! A request is a command byte followed by fields; integers are
//! little-endian, strings and byte values are a `u64` length plus the bytes.
//! There is no envelope, so the parser works on whatever has arrived: it
//! returns `Ok(None)` until a whole command is buffered (TCP may fragment a
//! command anywhere, or deliver several at once) and never consumes part of
//! one.
//!
//! # Limits
//! Per field, the same as PyTorch's libuv server, so a client sees the same
//! errors: keys up to [`MAX_KEY_LEN`] bytes, values up to [`MAX_VALUE_LEN`],
//! at most [`MAX_KEY_COUNT`] keys in one CHECK/WAIT/MULTI_GET/MULTI_SET.
//!
//! Per request, accel adds one limit libuv's server does not have: a whole
//! request is at most [`MAX_REQUEST_LEN`] bytes, the size of the largest
//! single-key request (a COMPARE_SET with a maximal key and two maximal
//! values). Without it the per-field limits multiply: 128 Ki keys of 8 KiB
//! make a 1 GiB WAIT, and 128 Ki pairs of maximal values a 1 TiB MULTI_SET,
//! all buffered before the request is complete. The limit is checked when a
//! length prefix arrives, so an oversized request is refused before its
//! bytes are. Real clients stay far below it (PyTorch's own multi-key
//! requests carry a few keys per rank).
//!
//! A request beyond a limit, a bad VALIDATE magic or an unknown command is a
//! [`WireError`]: the server closes that connection only.

/// First message of every connection: `VALIDATE` with this magic.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// Longest key accepted (8 KiB, as PyTorch's libuv server).
pub const MAX_KEY_LEN: u64 = 8 * 1024;
/// Largest value accepted (8 MiB, as PyTorch's libuv server).
pub const MAX_VALUE_LEN: u64 = 8 * 1024 * 1024;
/// Most keys in one multi-key request (128 Ki, as PyTorch's libuv server).
pub const MAX_KEY_COUNT: u64 = 128 * 1024;
/// Largest whole request: one maximal COMPARE_SET (command byte, a maximal
/// key and two maximal values, each with its 8-byte length).
pub const MAX_REQUEST_LEN: u64 = 1 + 3 * 8 + MAX_KEY_LEN + 2 * MAX_VALUE_LEN;

/// `CHECK` reply: every key exists.
pub const READY: u8 = 0;
/// `CHECK` reply: some key is missing.
pub const NOT_READY: u8 = 1;
/// `WAIT`/`BARRIER` reply: done.
pub const STOP_WAITING: u8 = 0;
/// `CANCEL_WAIT` reply.
pub const WAIT_CANCELED: u8 = 1;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Handshake with the magic number.
    Validate(u32),
    /// Overwrite a key.
    Set(Vec<u8>, Vec<u8>),
    /// Compare and swap.
    CompareSet {
        /// The key.
        key: Vec<u8>,
        /// Expected current value (empty: expect missing).
        expected: Vec<u8>,
        /// New value.
        desired: Vec<u8>,
    },
    /// Read a key.
    Get(Vec<u8>),
    /// Add to a decimal counter.
    Add(Vec<u8>, i64),
    /// Whether all keys exist.
    Check(Vec<Vec<u8>>),
    /// Block until all keys exist.
    Wait(Vec<Vec<u8>>),
    /// Number of keys.
    NumKeys,
    /// Delete a key.
    DeleteKey(Vec<u8>),
    /// Append to a key.
    Append(Vec<u8>, Vec<u8>),
    /// Read several keys.
    MultiGet(Vec<Vec<u8>>),
    /// Write several keys.
    MultiSet(Vec<(Vec<u8>, Vec<u8>)>),
    /// Cancel this connection's waits.
    CancelWait,
    /// Liveness check with a nonce.
    Ping(u32),
    /// Push to a queue.
    QueuePush(Vec<u8>, Vec<u8>),
    /// Pop from a queue.
    QueuePop(Vec<u8>),
    /// Length of a queue.
    QueueLen(Vec<u8>),
    /// Every key.
    ListKeys,
    /// Count arrivals at a key until `world_size`.
    Barrier(Vec<u8>, i64),
}

/// A request the server will not serve; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// An unknown command byte.
    #[error("unknown command {0}")]
    UnknownCommand(u8),
    /// VALIDATE with the wrong magic number.
    #[error("bad validation magic {0:#x}")]
    BadMagic(u32),
    /// The first command was not VALIDATE, or VALIDATE came later.
    #[error("VALIDATE must be the first command of a connection, and only the first")]
    NotValidated,
    /// A key, value or count beyond the limits.
    #[error("{what} of {len} exceeds the limit of {limit}")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// Its announced size.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A negative count.
    #[error("negative count {0}")]
    NegativeCount(i64),
}

/// A cursor over buffered bytes; `None` means "not enough bytes yet".
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Step<T> = Result<Option<T>, WireError>;

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn i64(&mut self) -> Option<i64> {
        self.u64().map(|v| v as i64)
    }
    fn bytes(&mut self, what: &'static str, limit: u64) -> Step<Vec<u8>> {
        let Some(len) = self.u64() else {
            return Ok(None);
        };
        if len > limit {
            return Err(WireError::TooLarge { what, len, limit });
        }
        self.within_request(len)?;
        Ok(self.take(len as usize).map(<[u8]>::to_vec))
    }
    /// Refuses a request that would grow past [`MAX_REQUEST_LEN`] with `more` bytes.
    fn within_request(&self, more: u64) -> Result<(), WireError> {
        let len = (self.pos as u64).saturating_add(more);
        if len > MAX_REQUEST_LEN {
            return Err(WireError::TooLarge {
                what: "request length",
                len,
                limit: MAX_REQUEST_LEN,
            });
        }
        Ok(())
    }
    fn key(&mut self) -> Step<Vec<u8>> {
        self.bytes("key length", MAX_KEY_LEN)
    }
    fn value(&mut self) -> Step<Vec<u8>> {
        self.bytes("value length", MAX_VALUE_LEN)
    }
    fn count(&mut self, n: u64) -> Result<usize, WireError> {
        if n > MAX_KEY_COUNT {
            return Err(WireError::TooLarge {
                what: "key count",
                len: n,
                limit: MAX_KEY_COUNT,
            });
        }
        Ok(n as usize)
    }
    fn keys(&mut self) -> Step<Vec<Vec<u8>>> {
        let Some(n) = self.u64() else { return Ok(None) };
        let n = self.count(n)?;
        let mut keys = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let Some(k) = self.key()? else {
                return Ok(None);
            };
            keys.push(k);
        }
        Ok(Some(keys))
    }
}

macro_rules! need {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

/// Parses one command from the front of `buf`: `Ok(Some((cmd, consumed)))`,
/// `Ok(None)` if the command is not complete yet, or an error.
pub fn parse(buf: &[u8]) -> Result<Option<(Command, usize)>, WireError> {
    let mut c = Cursor { buf, pos: 0 };
    let code = need!(c.u8());
    let cmd = match code {
        0 => Command::Validate(need!(c.u32())),
        1 => Command::Set(need!(c.key()?), need!(c.value()?)),
        2 => Command::CompareSet {
            key: need!(c.key()?),
            expected: need!(c.value()?),
            desired: need!(c.value()?),
        },
        3 => Command::Get(need!(c.key()?)),
        4 => Command::Add(need!(c.key()?), need!(c.i64())),
        5 => Command::Check(need!(c.keys()?)),
        6 => Command::Wait(need!(c.keys()?)),
        7 => Command::NumKeys,
        8 => Command::DeleteKey(need!(c.key()?)),
        9 => Command::Append(need!(c.key()?), need!(c.value()?)),
        10 => Command::MultiGet(need!(c.keys()?)),
        11 => {
            let n = need!(c.i64());
            if n < 0 {
                return Err(WireError::NegativeCount(n));
            }
            let n = c.count(n as u64)?;
            let mut pairs = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let k = need!(c.key()?);
                let v = need!(c.value()?);
                pairs.push((k, v));
            }
            Command::MultiSet(pairs)
        }
        12 => Command::CancelWait,
        13 => Command::Ping(need!(c.u32())),
        14 => Command::QueuePush(need!(c.key()?), need!(c.value()?)),
        15 => Command::QueuePop(need!(c.key()?)),
        16 => Command::QueueLen(need!(c.key()?)),
        17 => Command::ListKeys,
        18 => Command::Barrier(need!(c.key()?), need!(c.i64())),
        other => return Err(WireError::UnknownCommand(other)),
    };
    // Fixed-size fields after the last length prefix may end a few bytes past it.
    c.within_request(0)?;
    Ok(Some((cmd, c.pos)))
}

/// Appends a `u64` length and the bytes (a value reply; also how a model of
/// the store, e.g. the fuzz target's, writes the replies it expects).
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends an `i64` reply (ADD, NUM_KEYS, QUEUE_LEN).
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Encodes a request (the client side; used by tests and benchmarks).
pub fn encode(cmd: &Command) -> Vec<u8> {
    let mut o = Vec::new();
    let keys = |o: &mut Vec<u8>, ks: &[Vec<u8>]| {
        o.extend_from_slice(&(ks.len() as u64).to_le_bytes());
        for k in ks {
            put_bytes(o, k);
        }
    };
    match cmd {
        Command::Validate(m) => {
            o.push(0);
            o.extend_from_slice(&m.to_le_bytes());
        }
        Command::Set(k, v) => {
            o.push(1);
            put_bytes(&mut o, k);
            put_bytes(&mut o, v);
        }
        Command::CompareSet {
            key,
            expected,
            desired,
        } => {
            o.push(2);
            put_bytes(&mut o, key);
            put_bytes(&mut o, expected);
            put_bytes(&mut o, desired);
        }
        Command::Get(k) => {
            o.push(3);
            put_bytes(&mut o, k);
        }
        Command::Add(k, d) => {
            o.push(4);
            put_bytes(&mut o, k);
            put_i64(&mut o, *d);
        }
        Command::Check(ks) => {
            o.push(5);
            keys(&mut o, ks);
        }
        Command::Wait(ks) => {
            o.push(6);
            keys(&mut o, ks);
        }
        Command::NumKeys => o.push(7),
        Command::DeleteKey(k) => {
            o.push(8);
            put_bytes(&mut o, k);
        }
        Command::Append(k, v) => {
            o.push(9);
            put_bytes(&mut o, k);
            put_bytes(&mut o, v);
        }
        Command::MultiGet(ks) => {
            o.push(10);
            keys(&mut o, ks);
        }
        Command::MultiSet(pairs) => {
            o.push(11);
            put_i64(&mut o, pairs.len() as i64);
            for (k, v) in pairs {
                put_bytes(&mut o, k);
                put_bytes(&mut o, v);
            }
        }
        Command::CancelWait => o.push(12),
        Command::Ping(n) => {
            o.push(13);
            o.extend_from_slice(&n.to_le_bytes());
        }
        Command::QueuePush(k, v) => {
            o.push(14);
            put_bytes(&mut o, k);
            put_bytes(&mut o, v);
        }
        Command::QueuePop(k) => {
            o.push(15);
            put_bytes(&mut o, k);
        }
        Command::QueueLen(k) => {
            o.push(16);
            put_bytes(&mut o, k);
        }
        Command::ListKeys => o.push(17),
        Command::Barrier(k, n) => {
            o.push(18);
            put_bytes(&mut o, k);
            put_i64(&mut o, *n);
        }
    }
    o
}
