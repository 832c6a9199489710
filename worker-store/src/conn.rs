//! One client connection: read, apply in order, write with backpressure.
//!
//! The loop alternates between applying every complete buffered command and
//! waiting for the next event (bytes, a wake-up, a deadline, the store's
//! stop). Its bounds, each of which makes a client that misbehaves cost a
//! fixed amount instead of what it chooses:
//! * **Replies.** Applying stops as soon as [`Limits::reply_buffer`] bytes
//!   of replies wait (1 MiB by default); they are written, and nothing more
//!   is read or applied until the socket has taken them. A client that never
//!   reads therefore holds at most that much (plus large values it shares
//!   with the store, see [`super::reply`]), however many requests it sent.
//! * **Requests.** Complete commands are applied as they arrive; an
//!   incomplete one is at most [`MAX_REQUEST_LEN`] (the parser refuses a
//!   longer one from its length prefix), and is parsed once: the
//!   connection's [`Parser`] keeps its place between reads, so a request
//!   trickled in costs what it costs sent at once. Bytes buffered and not yet
//!   applied count against the store's budget for all connections
//!   ([`super::budget`]): past it, the connection buffering the most is
//!   closed. One read takes at most `READ_MAX` bytes and a buffer of
//!   16 KiB or more is counted as soon as it is read, so what the budget
//!   does not see is small; a buffer grown past `KEEP_BUFFER` is released
//!   once it is empty.
//! * **Parked.** A connection in WAIT or BARRIER applies nothing until it is
//!   woken, except a CANCEL_WAIT at the front of its buffer (PyTorch's client
//!   sends one when its wait times out). It keeps reading to see that one,
//!   but is closed once it has buffered more than one maximal request.
//! * **Time.** VALIDATE must arrive within [`Limits::handshake`] (30 s) of
//!   the connection; and an incomplete request is given up, and the
//!   connection closed, after [`Limits::partial_idle`] (30 s) without a byte
//!   of progress. A connection with nothing pending may idle for the
//!   whole round (PyTorch keeps one open per process), as may a parked one.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::reply::Replies;
use super::state::{self, ConnId};
use super::wire::{
    Command, Parser, WireError, MAX_REQUEST_LEN, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED,
};
use super::Handle;

const READ_CHUNK: usize = 16 * 1024;
/// Most bytes taken by one read (between two checks of the budget): small,
/// so that while an evicted connection has not yet run to free its buffer,
/// the others add little.
const READ_MAX: usize = 64 * 1024;
/// A read buffer grown past this by a large request is released once empty
/// (so that thousands of idle connections do not each keep one).
const KEEP_BUFFER: usize = 64 * 1024;

/// What the rest of the store tells a connection task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// The wait of this generation is over.
    Wake(u64),
    /// The store's budget for incomplete requests is spent and this
    /// connection buffers the most: close it.
    Evict,
}

/// A store's per-connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Replies buffered before the connection waits for the socket.
    pub reply_buffer: usize,
    /// Time allowed from accept to VALIDATE.
    pub handshake: Duration,
    /// Time an incomplete request may go without progress.
    pub partial_idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            reply_buffer: 1 << 20,
            handshake: Duration::from_secs(30),
            partial_idle: Duration::from_secs(30),
        }
    }
}

/// Why a connection was closed by the server.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Apply(#[from] state::ApplyError),
    #[error("no VALIDATE within {0:?} of connecting")]
    Handshake(Duration),
    #[error("an incomplete request ({0} bytes so far) made no progress for {1:?}")]
    PartialIdle(usize, Duration),
    #[error("sent {0} bytes while parked in WAIT or BARRIER, more than one maximal request ({MAX_REQUEST_LEN} bytes)")]
    ParkedOverflow(usize),
    #[error("closed while buffering {0} bytes of incomplete requests: the store's budget of {1} bytes for all connections' incomplete requests was spent, and this connection held the most")]
    Budget(usize, u64),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl ConnError {
    /// Whether the client did something wrong (as opposed to its socket failing).
    pub(super) fn is_misbehaviour(&self) -> bool {
        !matches!(self, Self::Io(_))
    }
}

pub(super) struct Connection<'a> {
    id: ConnId,
    shared: &'a Handle,
    wake: mpsc::UnboundedReceiver<Signal>,
    limits: Limits,
    metrics: &'a crate::metrics::StoreMetrics,
    validated: bool,
    /// Generation of the wait this connection is parked in.
    parked: Option<u64>,
    /// Where parsing stopped in an incomplete request.
    parser: Parser,
    /// A command parsed while parked, applied once the wait ends (so it is
    /// not parsed again on every read).
    held: Option<(Command, usize)>,
    /// Unapplied bytes last reported to the store's budget.
    reported: u64,
}

/// Why applying stopped.
#[derive(PartialEq, Eq)]
enum Stopped {
    /// The buffer holds no complete command that may be applied now.
    Drained,
    /// Enough replies wait: write them before applying more.
    RepliesFull,
}

impl<'a> Connection<'a> {
    pub(super) fn new(
        id: ConnId,
        shared: &'a Handle,
        wake: mpsc::UnboundedReceiver<Signal>,
        limits: Limits,
        metrics: &'a crate::metrics::StoreMetrics,
    ) -> Self {
        Self {
            id,
            shared,
            wake,
            limits,
            metrics,
            validated: false,
            parked: None,
            parser: Parser::default(),
            held: None,
            reported: 0,
        }
    }

    /// Reports the bytes buffered and not yet applied to the store's budget;
    /// closes the others it evicts (and says whether there were any), or
    /// fails if this one is evicted.
    fn account(&mut self, buffered: usize) -> Result<bool, ConnError> {
        let bytes = buffered as u64;
        if bytes == self.reported {
            return Ok(false); // the common case (nothing buffered): no lock
        }
        self.reported = bytes;
        let mut shared = self.shared.lock();
        let evicted = shared.ledger.pending(self.id, bytes);
        let (mut me, mut others) = (false, false);
        for conn in evicted {
            if conn == self.id {
                me = true;
            } else if let Some(tx) = shared.wakers.get(&conn) {
                let _ = tx.send(Signal::Evict);
                others = true;
            }
        }
        match me {
            true => Err(ConnError::Budget(buffered, shared.ledger.budget())),
            false => Ok(others),
        }
    }

    pub(super) async fn serve(
        mut self,
        sock: TcpStream,
        stop: CancellationToken,
    ) -> Result<(), ConnError> {
        let (mut rd, mut wr) = sock.into_split();
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut out = Replies::default();
        // Registered once: a fresh `cancelled()` per request would cost a lock each time.
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        let handshake_ends = Instant::now() + self.limits.handshake;
        let timer = tokio::time::sleep_until(handshake_ends);
        tokio::pin!(timer);
        let mut armed = Some(handshake_ends);
        let mut progress = false;
        loop {
            loop {
                let (used, why) = self.process(&buf, &mut out)?;
                buf.advance(used);
                if !out.is_empty() {
                    out.flush_tail();
                    tokio::select! {
                        w = wr.write_all_buf(&mut out) => w?,
                        _ = &mut stopped => return Ok(()),
                    }
                }
                if why == Stopped::Drained {
                    break;
                }
            }
            if self.account(buf.len())? {
                tokio::task::yield_now().await;
            }
            if buf.is_empty() && buf.capacity() > KEEP_BUFFER {
                buf = BytesMut::with_capacity(READ_CHUNK);
            }
            // The deadline that applies now, if any (no clock reads on the common path).
            let want = if !self.validated {
                Some(handshake_ends)
            } else if buf.is_empty() || self.parked.is_some() {
                None
            } else if progress || armed.is_none() {
                Some(Instant::now() + self.limits.partial_idle)
            } else {
                armed
            };
            progress = false;
            if want != armed {
                if let Some(at) = want {
                    timer.as_mut().reset(at);
                }
                armed = want;
            }
            buf.reserve(READ_CHUNK);
            let mut room = (&mut buf).limit(READ_MAX);
            let mut evicted = false;
            tokio::select! {
                n = rd.read_buf(&mut room) => {
                    if n? == 0 {
                        return Ok(());
                    }
                    progress = true;
                    if self.parked.is_some() && buf.len() as u64 > MAX_REQUEST_LEN {
                        return Err(ConnError::ParkedOverflow(buf.len()));
                    }
                    // Counted before applying, too: applying may stop at a full
                    // reply buffer and wait for the socket (small requests, the
                    // common case, are counted only after applying, without a lock).
                    if buf.len() >= READ_CHUNK {
                        evicted = self.account(buf.len())?;
                    }
                }
                Some(signal) = self.wake.recv() => match signal {
                    Signal::Wake(generation) => {
                        if self.parked == Some(generation) {
                            self.parked = None;
                            out.byte(STOP_WAITING);
                        }
                    }
                    Signal::Evict => {
                        let budget = self.shared.lock().ledger.budget();
                        return Err(ConnError::Budget(buf.len(), budget));
                    }
                },
                _ = &mut timer, if armed.is_some() => {
                    return Err(match self.validated {
                        false => ConnError::Handshake(self.limits.handshake),
                        true => ConnError::PartialIdle(buf.len(), self.limits.partial_idle),
                    });
                }
                _ = &mut stopped => return Ok(()),
            }
            if evicted {
                // Let the evicted connections run and free their buffers
                // before this one reads more (a task with data ready runs
                // on without yielding for a while).
                tokio::task::yield_now().await;
            }
        }
    }

    /// Applies complete commands from `buf` until none is left that may be
    /// applied now or enough replies wait; returns the bytes consumed.
    fn process(&mut self, buf: &[u8], out: &mut Replies) -> Result<(usize, Stopped), ConnError> {
        let mut used = 0;
        loop {
            if out.len() >= self.limits.reply_buffer {
                return Ok((used, Stopped::RepliesFull));
            }
            let parsed = match self.held.take() {
                Some(held) => Some(held),
                None => self.parser.parse(&buf[used..])?,
            };
            let Some((cmd, n)) = parsed else {
                return Ok((used, Stopped::Drained));
            };
            if self.parked.is_some() && cmd != Command::CancelWait {
                self.held = Some((cmd, n));
                return Ok((used, Stopped::Drained)); // answered once the wait ends
            }
            used += n;
            self.metrics.op(&cmd);
            if !self.validated {
                match cmd {
                    Command::Validate(VALIDATION_MAGIC) => {
                        self.validated = true;
                        continue;
                    }
                    Command::Validate(other) => return Err(WireError::BadMagic(other).into()),
                    _ => return Err(WireError::NotValidated.into()),
                }
            }
            let mut shared = self.shared.lock();
            if cmd == Command::CancelWait {
                let registered = shared.state.cancel(self.id);
                if !registered && self.parked.is_some() {
                    // Woken, but the wake-up has not been delivered: it goes first.
                    out.byte(STOP_WAITING);
                }
                self.parked = None;
                out.byte(WAIT_CANCELED);
                continue;
            }
            let fx = shared.state.apply(self.id, cmd, out)?;
            for (conn, generation) in fx.woken {
                if let Some(tx) = shared.wakers.get(&conn) {
                    let _ = tx.send(Signal::Wake(generation));
                }
            }
            if fx.parked.is_some() {
                debug!(conn = self.id, "parked");
                self.parked = fx.parked;
            }
        }
    }
}
