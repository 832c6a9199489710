//! Teeing a worker's stream: the agent reads the worker's pipe directly (no
//! file polling), writes every byte to the log file, and hands whole lines,
//! prefixed, to one console writer.
//!
//! # Policy
//! - The pipe is always drained as fast as the log file takes it, so a
//!   worker never waits on the console.
//! - The console writer is a thread fed by a bounded queue
//!   ([`CONSOLE_QUEUE`] lines). When the console is slower than the workers
//!   and the queue is full, lines are dropped from the console only (never
//!   from the files) and counted; the agent reports the count.
//! - Lines stay whole; bytes that are not UTF-8 pass through unchanged; a
//!   partial last line is written out (with a newline) at end of stream.
//! - A line longer than [`MAX_LINE`] bytes reaches the console in pieces of
//!   that size, so one endless line cannot grow memory without bound.

use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Console lines queued before new ones are dropped.
pub const CONSOLE_QUEUE: usize = 16 * 1024;
/// Longest piece of a line sent to the console at once.
pub const MAX_LINE: usize = 64 * 1024;
const CHUNK: usize = 64 * 1024;

struct Line {
    err: bool,
    bytes: Vec<u8>,
    /// A drain request: acknowledged once everything before it is written.
    ack: Option<std::sync::mpsc::Sender<()>>,
}

/// The agent's console: one writer thread for all tee'd streams.
#[derive(Debug, Clone)]
pub struct Console {
    tx: SyncSender<Line>,
    dropped: Arc<AtomicU64>,
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
            dropped: Arc::default(),
        })
    }

    fn line(&self, err: bool, bytes: Vec<u8>) {
        match self.tx.try_send(Line {
            err,
            bytes,
            ack: None,
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
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
                ack: Some(ack),
            })
            .is_ok()
        {
            let _ = done.recv_timeout(limit);
        }
    }

    /// Lines dropped from the console so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn write_lines(rx: &Receiver<Line>) {
    // Unlocked handles: the agent's own log lines (stderr) interleave between
    // batches instead of waiting for this thread.
    let mut out = io::BufWriter::with_capacity(CHUNK, io::stdout());
    let mut err = io::BufWriter::with_capacity(CHUNK, io::stderr());
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        // Write what is queued, then flush once: whole lines, few syscalls.
        let mut acks = Vec::new();
        while let Some(line) = next {
            let w: &mut dyn Write = if line.err { &mut err } else { &mut out };
            let _ = w.write_all(&line.bytes);
            acks.extend(line.ack);
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
        let _ = err.flush();
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

/// Copies `pipe` to `file` and, with a `prefix`, its lines to the console.
/// Returns when the worker (and anything that inherited its stream) closes it.
pub async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    file: &Path,
    prefix: Option<Vec<u8>>,
    err: bool,
    console: Console,
) -> io::Result<()> {
    let mut log = io::BufWriter::with_capacity(CHUNK, std::fs::File::create(file)?);
    let mut buf = vec![0u8; CHUNK];
    let mut pending: Vec<u8> = Vec::new();
    let emit = |pending: &mut Vec<u8>, prefix: &[u8]| {
        let mut line = Vec::with_capacity(prefix.len() + pending.len() + 1);
        line.extend_from_slice(prefix);
        line.append(pending);
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        console.line(err, line);
    };
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        log.write_all(chunk)?;
        // Readers of the file (tail -f) see output as it comes.
        log.flush()?;
        let Some(prefix) = prefix.as_deref() else {
            continue;
        };
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            pending.extend_from_slice(&rest[..=i]);
            emit(&mut pending, prefix);
            rest = &rest[i + 1..];
        }
        pending.extend_from_slice(rest);
        while pending.len() >= MAX_LINE {
            let mut piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
            emit(&mut piece, prefix);
        }
    }
    if let Some(prefix) = prefix.as_deref() {
        if !pending.is_empty() {
            emit(&mut pending, prefix);
        }
    }
    log.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A console whose lines a test can read.
    fn test_console() -> (Console, Receiver<Line>) {
        let (tx, rx) = sync_channel(CONSOLE_QUEUE);
        (
            Console {
                tx,
                dropped: Arc::default(),
            },
            rx,
        )
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("accel-tee-{}-{name}", std::process::id()))
    }

    #[tokio::test]
    async fn lines_stay_whole_and_files_get_every_byte() {
        let (console, rx) = test_console();
        let input: &[u8] = b"one\ntw\xffo\nthree without newline";
        let file = tmp("whole");
        pump(input, &file, Some(b"[p]:".to_vec()), false, console)
            .await
            .expect("pump");
        let lines: Vec<Vec<u8>> = rx.try_iter().map(|l| l.bytes).collect();
        assert_eq!(
            lines,
            vec![
                b"[p]:one\n".to_vec(),
                b"[p]:tw\xffo\n".to_vec(),
                b"[p]:three without newline\n".to_vec()
            ]
        );
        assert_eq!(
            std::fs::read(&file).expect("log"),
            input,
            "the file is the raw stream"
        );
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn an_endless_line_reaches_the_console_in_bounded_pieces() {
        let (console, rx) = test_console();
        let input = vec![b'x'; 3 * MAX_LINE + 10];
        let file = tmp("long");
        pump(&input[..], &file, Some(b">".to_vec()), true, console)
            .await
            .expect("pump");
        let sizes: Vec<usize> = rx.try_iter().map(|l| l.bytes.len()).collect();
        assert_eq!(
            sizes,
            vec![MAX_LINE + 2, MAX_LINE + 2, MAX_LINE + 2, 10 + 2]
        );
        let _ = std::fs::remove_file(file);
    }

    #[tokio::test]
    async fn a_full_console_drops_and_counts_but_the_file_keeps_all() {
        let (tx, _rx) = sync_channel(2);
        let console = Console {
            tx,
            dropped: Arc::default(),
        };
        let input = b"a\nb\nc\nd\ne\n";
        let file = tmp("drop");
        pump(&input[..], &file, Some(Vec::new()), false, console.clone())
            .await
            .expect("pump");
        assert_eq!(console.dropped(), 3);
        assert_eq!(std::fs::read(&file).expect("log"), input);
        let _ = std::fs::remove_file(file);
    }
}
