//! The worker store: a server speaking PyTorch's TCPStore protocol, hosted
//! by the node-rank-0 agent at `MASTER_ADDR:MASTER_PORT`, fresh every round.
//!
//! # Why in the agent
//! With `TORCHELASTIC_USE_AGENT_STORE=True` every PyTorch worker, rank 0
//! included, is a store client. The store then outlives any worker, the
//! agent holds its port from the moment it offers it (no bind race), and a
//! new round gets a new store, so no worker can read a key of an earlier
//! attempt (PyTorch #135712).
//!
//! # How it serves
//! One task per connection on the agent's event loop; all connections share
//! one [`State`] behind a mutex that is never held across an await. A
//! connection task parses whatever bytes have arrived ([`wire::parse`]),
//! applies complete commands in order and writes their replies in one write.
//! A connection parked in WAIT or BARRIER processes nothing else until it is
//! woken (by another connection's write, through its wake channel) or sends
//! CANCEL_WAIT, so replies are never reordered. A malformed request (bad
//! magic, unknown command, oversized field, ADD to a non-number) closes that
//! connection only.

pub mod state;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use state::{ConnId, State};
use wire::{Command, WireError, STOP_WAITING, VALIDATION_MAGIC, WAIT_CANCELED};

#[derive(Debug, Default)]
struct Shared {
    state: State,
    wakers: HashMap<ConnId, mpsc::UnboundedSender<u64>>,
    next_conn: ConnId,
}

#[derive(Debug, Clone, Default)]
struct Handle(Arc<Mutex<Shared>>);

impl Handle {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // State methods do not panic mid-update; a poisoned lock still holds consistent data.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running worker store; stopped (every connection closed) on drop.
#[derive(Debug)]
pub struct WorkerStore {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl WorkerStore {
    /// Serves a fresh, empty store on `listener`.
    pub fn start(listener: TcpListener) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, Handle::default(), stop.clone()));
        Ok(Self { addr, stop })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for WorkerStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Handle, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        match accepted {
            Ok((sock, peer)) => {
                let _ = sock.set_nodelay(true);
                let (tx, rx) = mpsc::unbounded_channel();
                let id = {
                    let mut s = shared.lock();
                    s.next_conn += 1;
                    let id = s.next_conn;
                    s.wakers.insert(id, tx);
                    id
                };
                let (shared, stop) = (shared.clone(), stop.clone());
                tokio::spawn(async move {
                    if let Err(e) = Connection::new(id, &shared, rx).serve(sock, stop).await {
                        warn!(%peer, error = %e, "worker store closed a connection");
                    }
                    let mut s = shared.lock();
                    s.state.disconnect(id);
                    s.wakers.remove(&id);
                });
            }
            // Too many open files and the like: keep serving the connections we have.
            Err(e) => {
                warn!(error = %e, "worker store cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// Why a connection was closed by the server.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Apply(#[from] state::ApplyError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

struct Connection<'a> {
    id: ConnId,
    shared: &'a Handle,
    wake: mpsc::UnboundedReceiver<u64>,
    validated: bool,
    /// Generation of the wait this connection is parked in.
    parked: Option<u64>,
}

const READ_CHUNK: usize = 16 * 1024;

impl<'a> Connection<'a> {
    fn new(id: ConnId, shared: &'a Handle, wake: mpsc::UnboundedReceiver<u64>) -> Self {
        Self {
            id,
            shared,
            wake,
            validated: false,
            parked: None,
        }
    }

    async fn serve(mut self, sock: TcpStream, stop: CancellationToken) -> Result<(), ConnError> {
        let (mut rd, mut wr) = sock.into_split();
        let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        let mut out: Vec<u8> = Vec::with_capacity(256);
        // Registered once: a fresh `cancelled()` per request would cost a lock each time.
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        loop {
            let used = self.process(&buf, &mut out)?;
            buf.drain(..used);
            if !out.is_empty() {
                wr.write_all(&out).await?;
                out.clear();
            }
            buf.reserve(READ_CHUNK);
            tokio::select! {
                n = rd.read_buf(&mut buf) => {
                    if n? == 0 {
                        return Ok(());
                    }
                }
                Some(generation) = self.wake.recv() => {
                    if self.parked == Some(generation) {
                        self.parked = None;
                        out.push(STOP_WAITING);
                    }
                }
                _ = &mut stopped => return Ok(()),
            }
        }
    }

    /// Applies every complete command in `buf`; returns the bytes consumed.
    fn process(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<usize, ConnError> {
        let mut used = 0;
        while let Some((cmd, n)) = wire::parse(&buf[used..])? {
            if self.parked.is_some() && cmd != Command::CancelWait {
                break; // answered once the wait ends
            }
            used += n;
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
                    out.push(STOP_WAITING);
                }
                self.parked = None;
                out.push(WAIT_CANCELED);
                continue;
            }
            let fx = shared.state.apply(self.id, cmd, out)?;
            for (conn, generation) in fx.woken {
                if let Some(tx) = shared.wakers.get(&conn) {
                    let _ = tx.send(generation);
                }
            }
            if fx.parked.is_some() {
                debug!(conn = self.id, "parked");
                self.parked = fx.parked;
            }
        }
        Ok(used)
    }
}

#[cfg(test)]
mod tests;
