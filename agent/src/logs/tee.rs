//! Teeing a worker's stream: the agent reads the worker's pipe directly (no
//! file polling), writes every byte to the log file, and hands whole lines,
//! prefixed, to one console writer. Redirected-only streams take the same
//! path without the console.
//!
//! # Policy
//! - The pipe is always drained as fast as the log file takes it, so a
//!   worker never waits on the console.
//! - The pipe is drained to its end whatever happens to the log file. When
//!   the file cannot be created or written (a full disk, a quota), the agent
//!   warns once per worker ([`RankFiles`]), naming the file and the OS error,
//!   stops writing that file, and keeps copying lines to the console. Giving
//!   up on the pipe instead would kill the worker with SIGPIPE on its next
//!   write, and a full log disk would fail the job.
//! - The console writer is a thread fed by a bounded queue
//!   ([`CONSOLE_QUEUE`] lines). When the console is slower than the workers
//!   and the queue is full, lines are dropped from the console only (never
//!   from the files) and counted; the agent reports the count.
//! - Lines stay whole; bytes that are not UTF-8 pass through unchanged; a
//!   partial last line is written out (with a newline) at end of stream.
//! - A line longer than [`MAX_LINE`] bytes reaches the console in pieces of
//!   that size, so one endless line cannot grow memory without bound.
//! - A console line that matches `--duplicate-std*-filters` is marked with
//!   its filtered file ([`super::filter`]) and the writer thread writes it
//!   there too, after flushing the console: the same bytes, no second
//!   allocation.
//!   A line dropped from a full console queue is dropped from that file
//!   too (and counted with the console's).

use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::warn;

use super::filter::{Filtered, FilteredFile};
use crate::files::FileAt;

/// Console lines queued before new ones are dropped.
pub const CONSOLE_QUEUE: usize = 16 * 1024;
/// Longest piece of a line sent to the console at once.
pub const MAX_LINE: usize = 64 * 1024;
const CHUNK: usize = 64 * 1024;

struct Line {
    err: bool,
    bytes: Vec<u8>,
    /// The filtered file this line is copied to.
    dup: Option<Arc<FilteredFile>>,
    /// A drain request: acknowledged once everything before it is written.
    ack: Option<std::sync::mpsc::Sender<()>>,
}

/// The agent's console: one writer thread for all tee'd streams.
#[derive(Debug, Clone)]
pub struct Console {
    tx: SyncSender<Line>,
    /// Lines dropped so far (the agent's metric, once [`Console::counting`]).
    dropped: Counter,
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line")
            .field("err", &self.err)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Console {
    /// Starts the writer thread, writing to the agent's stdout and stderr.
    pub fn start() -> io::Result<Self> {
        let (tx, rx) = sync_channel(CONSOLE_QUEUE);
        std::thread::Builder::new()
            .name("accel-console".into())
            .spawn(move || write_lines(&rx))?;
        Ok(Self {
            tx,
            dropped: Counter::default(),
        })
    }

    /// The same console, counting dropped lines in `counter` (the agent's
    /// metric) instead of a counter of its own. Call before any line.
    pub fn counting(mut self, counter: Counter) -> Self {
        self.dropped = counter;
        self
    }

    fn line(&self, err: bool, bytes: Vec<u8>, dup: Option<Arc<FilteredFile>>) {
        match self.tx.try_send(Line {
            err,
            bytes,
            dup,
            ack: None,
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Waits (up to `limit`) until every line queued so far is written; call
    /// before the agent exits, which would otherwise cut the queue short.
    pub fn drain(&self, limit: std::time::Duration) {
        let (ack, done) = std::sync::mpsc::channel();
        if self
            .tx
            .send(Line {
                err: false,
                bytes: Vec::new(),
                dup: None,
                ack: Some(ack),
            })
            .is_ok()
        {
            let _ = done.recv_timeout(limit);
        }
    }

    /// Lines dropped from the console so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

fn write_lines(rx: &Receiver<Line>) {
    // Unlocked handles: the agent's own log lines (stderr) interleave between
    // batches instead of waiting for this thread.
    let mut out = io::BufWriter::with_capacity(CHUNK, io::stdout());
    let mut err = io::BufWriter::with_capacity(CHUNK, io::stderr());
    // Lines also bound for a filtered file, written once the console is
    // flushed (the console never waits on those files); reused.
    let mut dups: Vec<Line> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        // Write what is queued, then flush once: whole lines, few syscalls.
        let mut acks = Vec::new();
        while let Some(mut line) = next {
            let w: &mut dyn Write = if line.err { &mut err } else { &mut out };
            let _ = w.write_all(&line.bytes);
            acks.extend(line.ack.take());
            if line.dup.is_some() {
                dups.push(line);
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
        let _ = err.flush();
        for line in dups.drain(..) {
            if let Some(file) = &line.dup {
                file.write(&line.bytes);
            }
        }
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

/// Where a pumped stream's lines go on the console.
#[derive(Debug, Clone)]
pub struct ToConsole {
    /// The console.
    pub console: Console,
    /// Put before each line.
    pub prefix: Vec<u8>,
    /// To the agent's stderr (else stdout).
    pub err: bool,
    /// `--duplicate-std*-filters`: matching lines are also copied there.
    pub filtered: Option<Filtered>,
}

/// One worker's log files, shared by the pumps of its stdout and stderr, so
/// that a full disk is reported once per worker, not once per write.
#[derive(Debug, Clone)]
pub struct RankFiles {
    local_rank: u32,
    warned: Arc<AtomicBool>,
}

impl RankFiles {
    /// The log files of the worker with `local_rank`.
    pub fn new(local_rank: u32) -> Self {
        Self {
            local_rank,
            warned: Arc::default(),
        }
    }

    /// Whether a failure was reported for this worker.
    pub fn failed(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }

    fn report(&self, file: &Path, error: &io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(
                local_rank = self.local_rank,
                file = %file.display(),
                %error,
                "cannot write a worker's log file, so it ends here (reported once per worker); \
                 the worker keeps running and tee'd lines still reach the console"
            );
        }
    }
}

/// A log file that, once it fails, is given up (no gaps in the middle of a
/// file: what it holds is a complete beginning of the stream).
///
/// It is opened and written on tokio's blocking pool, never on the agent's
/// runtime thread: a log directory on a hung network filesystem then stalls
/// only this stream (its worker waits on its pipe, as it would writing the
/// file itself), while keep-alives and the other workers carry on.
struct LogFile<'a> {
    file: Option<std::fs::File>,
    path: &'a Path,
    rank: &'a RankFiles,
}

impl<'a> LogFile<'a> {
    async fn create(
        path: &'a Path,
        open: impl FnOnce() -> io::Result<std::fs::File> + Send + 'static,
        rank: &'a RankFiles,
    ) -> Self {
        let file = match tokio::task::spawn_blocking(open).await {
            Ok(Ok(f)) => Some(f),
            Ok(Err(e)) => {
                rank.report(path, &e);
                None
            }
            Err(e) => {
                rank.report(path, &io::Error::other(e));
                None
            }
        };
        Self { file, path, rank }
    }

    /// Writes `buf[..n]` and hands `buf` back. Unbuffered: one write per
    /// chunk read, so readers of the file (tail -f) see output as it comes.
    async fn write(&mut self, buf: Vec<u8>, n: usize) -> Vec<u8> {
        let Some(mut file) = self.file.take() else {
            return buf;
        };
        let written = tokio::task::spawn_blocking(move || {
            let result = file.write_all(&buf[..n]);
            (file, buf, result)
        })
        .await;
        match written {
            Ok((file, buf, Ok(()))) => {
                self.file = Some(file);
                buf
            }
            Ok((_, buf, Err(e))) => {
                self.rank.report(self.path, &e);
                buf
            }
            Err(e) => {
                self.rank.report(self.path, &io::Error::other(e));
                vec![0; CHUNK]
            }
        }
    }
}

/// Copies `pipe` to `file` and, with `console`, its lines to the console
/// (first, so a slow file never delays them). Returns when the worker (and
/// anything that inherited its stream) closes it; a log file that cannot be
/// written does not stop it (see the module policy). Errors are the pipe's
/// own. The file is created new, 0600, in its directory's handle, never
/// through a link (`crate::files`).
pub async fn pump(
    pipe: impl AsyncRead + Unpin,
    file: &FileAt,
    rank: &RankFiles,
    console: Option<ToConsole>,
) -> io::Result<()> {
    let at = file.clone();
    pump_into(pipe, &file.path(), move || at.create(), rank, console).await
}

/// [`pump`], with the log file at `path` opened by `open`.
async fn pump_into(
    mut pipe: impl AsyncRead + Unpin,
    file: &Path,
    open: impl FnOnce() -> io::Result<std::fs::File> + Send + 'static,
    rank: &RankFiles,
    console: Option<ToConsole>,
) -> io::Result<()> {
    let mut log = LogFile::create(file, open, rank).await;
    let mut buf = vec![0u8; CHUNK];
    let mut pending: Vec<u8> = Vec::new();
    let emit = |pending: &mut Vec<u8>, to: &ToConsole| {
        let dup = to
            .filtered
            .as_ref()
            .filter(|f| f.filter.matches(pending))
            .map(|f| f.file.clone());
        let mut line = Vec::with_capacity(to.prefix.len() + pending.len() + 1);
        line.extend_from_slice(&to.prefix);
        line.append(pending);
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        to.console.line(to.err, line, dup);
    };
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if let Some(to) = console.as_ref() {
            let mut rest = &buf[..n];
            while let Some(i) = rest.iter().position(|b| *b == b'\n') {
                pending.extend_from_slice(&rest[..=i]);
                emit(&mut pending, to);
                rest = &rest[i + 1..];
            }
            pending.extend_from_slice(rest);
            while pending.len() >= MAX_LINE {
                let mut piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
                emit(&mut piece, to);
            }
        }
        buf = log.write(buf, n).await;
    }
    if let Some(to) = console.as_ref() {
        if !pending.is_empty() {
            emit(&mut pending, to);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
