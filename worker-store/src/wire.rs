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
    /// A length-prefixed field: where its bytes are, once all have arrived.
    fn span(&mut self, what: &'static str, limit: u64) -> Step<Span> {
        let Some(len) = self.u64() else {
            return Ok(None);
        };
        if len > limit {
            return Err(WireError::TooLarge { what, len, limit });
        }
        self.within_request(len)?;
        let start = self.pos;
        Ok(self.take(len as usize).map(|_| Span {
            start,
            len: len as usize,
        }))
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
}

fn count(n: u64) -> Result<usize, WireError> {
    if n > MAX_KEY_COUNT {
        return Err(WireError::TooLarge {
            what: "key count",
            len: n,
            limit: MAX_KEY_COUNT,
        });
    }
    Ok(n as usize)
}

macro_rules! need {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

/// Where a field's bytes are, from the start of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: usize,
    len: usize,
}

/// The fields a request is made of, after its command byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Length-prefixed fields (`true`: a value, else a key), then for some
    /// commands a fixed-size integer.
    Fields(&'static [bool]),
    /// A `u64` count and that many keys.
    Keys,
    /// An `i64` count and that many key/value pairs.
    Pairs,
}

fn shape(code: u8) -> Result<Shape, WireError> {
    use Shape::Fields as F;
    Ok(match code {
        0 | 7 | 12 | 13 | 17 => F(&[]),
        1 | 9 | 14 => F(&[false, true]),
        2 => F(&[false, true, true]),
        3 | 4 | 8 | 15 | 16 | 18 => F(&[false]),
        5 | 6 | 10 => Shape::Keys,
        11 => Shape::Pairs,
        other => return Err(WireError::UnknownCommand(other)),
    })
}

/// An incremental parser that keeps its place in an incomplete request.
///
/// TCP delivers a large request over many reads. Parsing it from its first
/// byte on every read costs the square of its size (a 1.2 MB CHECK trickled
/// in a few KiB at a time used to cost seconds of CPU), so the parser
/// remembers the fields it has already found, and each call only looks at
/// what is new: the work is linear in the bytes received. Fields are kept as
/// positions and copied once, when the request is complete.
///
/// Contract: each call passes the buffered bytes starting at the first byte
/// of the request being parsed; after `Ok(None)` the next call passes the
/// same bytes, possibly followed by more. After a command is returned (or an
/// error), the parser starts afresh with the next request. A call that
/// breaks the contract (fewer bytes than already parsed, another command
/// byte) makes it start afresh too, so it never reads out of bounds. Results
/// never depend on how the bytes were cut ([`parse`] is this parser on all
/// the bytes at once).
#[derive(Debug, Default)]
pub struct Parser {
    /// Command byte of the request in progress.
    code: Option<u8>,
    /// Bytes of it already parsed into `spans` (and `count`).
    pos: usize,
    /// Length-prefixed fields found so far.
    spans: Vec<Span>,
    /// A multi-key request's announced count, once read.
    count: Option<usize>,
}

/// Spans kept between requests; a parser that held more releases them.
const KEEP_SPANS: usize = 1024;

impl Parser {
    /// Parses one command from the front of `buf`: `Ok(Some((cmd, consumed)))`,
    /// `Ok(None)` if the command is not complete yet, or an error.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Option<(Command, usize)>, WireError> {
        let Some(&code) = buf.first() else {
            self.reset();
            return Ok(None);
        };
        if self.code != Some(code) || self.pos > buf.len() {
            self.reset();
            self.code = Some(code);
            self.pos = 1;
        }
        let r = self.resume(code, buf);
        if !matches!(r, Ok(None)) {
            self.reset();
        }
        r
    }

    /// Whether a request is partly parsed (bytes of it are buffered).
    pub fn in_progress(&self) -> bool {
        self.code.is_some()
    }

    fn reset(&mut self) {
        self.code = None;
        self.pos = 0;
        self.count = None;
        if self.spans.capacity() > KEEP_SPANS {
            self.spans = Vec::new();
        } else {
            self.spans.clear();
        }
    }

    /// Parses length-prefixed fields from `self.pos` until `n` are found,
    /// remembering each one found.
    fn fields(&mut self, buf: &[u8], n: usize, value: impl Fn(usize) -> bool) -> Step<()> {
        while self.spans.len() < n {
            let mut c = Cursor { buf, pos: self.pos };
            let span = match value(self.spans.len()) {
                true => c.span("value length", MAX_VALUE_LEN)?,
                false => c.span("key length", MAX_KEY_LEN)?,
            };
            self.spans.push(need!(span));
            self.pos = c.pos;
        }
        Ok(Some(()))
    }

    fn resume(&mut self, code: u8, buf: &[u8]) -> Step<(Command, usize)> {
        let shape = shape(code)?;
        let owned = |s: &Span| buf[s.start..s.start + s.len].to_vec();
        let (cmd, end) = match shape {
            Shape::Fields(fields) => {
                need!(self.fields(buf, fields.len(), |i| fields[i])?);
                let mut c = Cursor { buf, pos: self.pos };
                // The fixed-size tail first: fields are copied once, when all is there.
                let (word, int) = match code {
                    0 | 13 => (need!(c.u32()), 0),
                    4 | 18 => (0, need!(c.i64())),
                    _ => (0, 0),
                };
                let mut f = self.spans.iter().map(owned);
                let mut next = || f.next().unwrap_or_default();
                let cmd = match code {
                    0 => Command::Validate(word),
                    1 => Command::Set(next(), next()),
                    2 => Command::CompareSet {
                        key: next(),
                        expected: next(),
                        desired: next(),
                    },
                    3 => Command::Get(next()),
                    4 => Command::Add(next(), int),
                    7 => Command::NumKeys,
                    8 => Command::DeleteKey(next()),
                    9 => Command::Append(next(), next()),
                    12 => Command::CancelWait,
                    13 => Command::Ping(word),
                    14 => Command::QueuePush(next(), next()),
                    15 => Command::QueuePop(next()),
                    16 => Command::QueueLen(next()),
                    17 => Command::ListKeys,
                    _ => Command::Barrier(next(), int),
                };
                (cmd, c.pos)
            }
            Shape::Keys => {
                if self.count.is_none() {
                    let mut c = Cursor { buf, pos: self.pos };
                    self.count = Some(count(need!(c.u64()))?);
                    self.pos = c.pos;
                }
                let n = self.count.unwrap_or(0);
                need!(self.fields(buf, n, |_| false)?);
                let keys: Vec<Vec<u8>> = self.spans.iter().map(owned).collect();
                let cmd = match code {
                    5 => Command::Check(keys),
                    6 => Command::Wait(keys),
                    _ => Command::MultiGet(keys),
                };
                (cmd, self.pos)
            }
            Shape::Pairs => {
                if self.count.is_none() {
                    let mut c = Cursor { buf, pos: self.pos };
                    let n = need!(c.i64());
                    if n < 0 {
                        return Err(WireError::NegativeCount(n));
                    }
                    self.count = Some(count(n as u64)?);
                    self.pos = c.pos;
                }
                let n = self.count.unwrap_or(0);
                need!(self.fields(buf, 2 * n, |i| i % 2 == 1)?);
                let pairs = self
                    .spans
                    .chunks_exact(2)
                    .map(|p| (owned(&p[0]), owned(&p[1])))
                    .collect();
                (Command::MultiSet(pairs), self.pos)
            }
        };
        // Fixed-size fields after the last length prefix may end a few bytes past it.
        Cursor { buf, pos: end }.within_request(0)?;
        Ok(Some((cmd, end)))
    }
}

/// Parses one command from the front of `buf`: `Ok(Some((cmd, consumed)))`,
/// `Ok(None)` if the command is not complete yet, or an error. (A
/// [`Parser`] on all the bytes at once; a connection keeps a [`Parser`] so
/// as not to parse an incomplete request again from its start.)
pub fn parse(buf: &[u8]) -> Result<Option<(Command, usize)>, WireError> {
    Parser::default().parse(buf)
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
