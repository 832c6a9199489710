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
//! # Why its own crate
//! The store is a server for untrusted bytes with its own bounds, and it
//! needs nothing of the agent: not its rounds, configuration or logs. As a
//! crate of its own, that is checked by the compiler, and the parser can be
//! fuzzed and the server tested without building the agent. The dependency
//! goes one way: `accel-agent` depends on this crate (it starts a store each
//! round, chooses its [`StoreOptions`] and registers its [`metrics`]); this
//! crate depends on no other accel crate but `accel-telemetry` (for
//! `quiet`, the aggregated logging of recurring refusals).
//!
//! # How it serves
//! One task per connection on the agent's event loop; all connections share
//! one [`State`] behind a mutex that is never held across an await. A
//! connection task parses whatever bytes have arrived ([`wire::parse`]),
//! applies complete commands in order and writes their replies
//! (`conn`). A connection parked in WAIT or BARRIER processes nothing else
//! until it is woken (by another connection's write, through its wake
//! channel) or sends CANCEL_WAIT, so replies are never reordered.
//!
//! # Who may connect
//! TCPStore's protocol has no credentials, so the store admits connections
//! by address ([`admission`]): this host, and the addresses of the round's
//! members as the rendezvous reports them; and a connection whose other end
//! is a socket on this host only if the kernel says it belongs to the
//! agent's user or root (`owner`), so other local users are refused.
//! Others are accepted and closed before a byte is read. The agent binds the store to the node's own
//! address (loopback for a job on loopback), not every interface, and can
//! take its port from a range (`--rdzv-conf store_ports=A-B`) that a
//! firewall or NetworkPolicy names.
//!
//! # What a client cannot make it do
//! Every input is bounded, so a client (even an admitted one) cannot make
//! the agent allocate without limit or remember forever; each limit closes
//! only the offending connection, and refusals are logged aggregated
//! (at most a line a minute, with a count), never one line per connection:
//!
//! | what | bound | where |
//! |---|---|---|
//! | key, value, keys per request | 8 KiB, 8 MiB, 128 Ki (as PyTorch's libuv server) | [`wire`] |
//! | one request | one maximal COMPARE_SET, ≈ 16 MiB | [`wire::MAX_REQUEST_LEN`] |
//! | incomplete requests, all connections | 64 MiB; past it the connection buffering the most is closed | `budget` |
//! | parsing an incomplete request | once: the parser keeps its place between reads | [`wire::Parser`] |
//! | connections | `max(2048, 8 × world_size + 64)`, three quarters of that from one address (this host is one) | `budget` |
//! | a value grown by APPEND | 8 MiB, as SET | [`state`] |
//! | all keys and values | `store_max_bytes`, default 1 GiB; a write past it closes the writer | [`state`] |
//! | unwritten replies | ≈ 1 MiB per connection, then it stops reading | `conn` |
//! | a parked connection's input | one maximal request | `conn` |
//! | handshake; an incomplete request | 30 s; 30 s without progress | `conn::Limits` |
//! | waiters of a closed connection | removed with it | [`state`] |
//! | failing `accept` (EMFILE…) | backs off 10 ms doubling to 1 s, one line per episode | here |
//!
//! A malformed request (bad magic, unknown command, oversized field, ADD to
//! a non-number) closes that connection only.

#![deny(unsafe_code)]

pub mod admission;
mod budget;
mod conn;
pub mod metrics;
use accel_telemetry::peer as owner;
pub mod reply;
pub mod state;
mod sys;
pub mod wire;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use accel_telemetry::quiet::{Quiet, Say};
pub use admission::Admit;
use admission::{Admission, Decision, SharedAdmission, Stranger};
pub use budget::ConnLimits;
use budget::{Full, Ledger, Source, DEFAULT_PENDING_BUDGET};
pub use conn::Limits;
use conn::{ConnError, Connection, Signal};
use state::{ConnId, State, DEFAULT_MAX_BYTES};

/// First pause after a failed `accept`; it doubles up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause after a failed `accept`.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// An episode of failing accepts ends after this long without a failure
/// (at the descriptor limit, accepts alternate between succeeding and
/// failing as connections come and go: that is one episode, not many).
const ACCEPT_EPISODE_QUIET: Duration = Duration::from_secs(5);

/// How a store is bounded and whom it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Most bytes of keys and values held (`--rdzv-conf store_max_bytes`).
    pub max_bytes: u64,
    /// Addresses admitted besides this host's.
    pub admit: Admit,
    /// Per-connection bounds.
    pub limits: Limits,
    /// How many connections, in all and from one address.
    pub connections: ConnLimits,
    /// Bytes of incomplete requests held across all connections.
    pub pending_budget: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            admit: Admit::default(),
            limits: Limits::default(),
            connections: ConnLimits::default(),
            pending_budget: DEFAULT_PENDING_BUDGET,
        }
    }
}

/// What a store holds now (for tests and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Open, admitted connections.
    pub connections: usize,
    /// Bytes of keys and values.
    pub bytes: u64,
    /// Entries in the waiter index.
    pub waiter_entries: usize,
    /// Connections refused for their address or their owner.
    pub refused: u64,
    /// Connections closed at once for the connection limits.
    pub over_limit: u64,
    /// Bytes of incomplete requests buffered.
    pub pending_bytes: u64,
}

#[derive(Debug)]
struct Shared {
    state: State,
    wakers: HashMap<ConnId, mpsc::UnboundedSender<Signal>>,
    ledger: Ledger,
    next_conn: ConnId,
    refused: u64,
    over_limit: u64,
    /// Refused connections, for logging.
    refusals: Quiet,
    /// Connections from this host refused for their owner, for logging.
    strangers: Quiet,
    /// Connections over the limits, for logging.
    full: Quiet,
    /// Connections closed for misbehaving, for logging.
    closures: Quiet,
}

#[derive(Debug, Clone)]
struct Handle(Arc<Mutex<Shared>>);

impl Handle {
    fn new(options: &StoreOptions) -> Self {
        Self(Arc::new(Mutex::new(Shared {
            state: State::with_budget(options.max_bytes),
            wakers: HashMap::new(),
            ledger: Ledger::new(options.connections, options.pending_budget),
            next_conn: 0,
            refused: 0,
            over_limit: 0,
            refusals: Quiet::default(),
            strangers: Quiet::default(),
            full: Quiet::default(),
            closures: Quiet::default(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // State methods do not panic mid-update; a poisoned lock still holds consistent data.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refuse(&self, peer: SocketAddr) {
        let mut s = self.lock();
        s.refused += 1;
        match s.refusals.hit(Instant::now()) {
            Say::First => {
                warn!(%peer, "the worker store refused a connection from an address that is not a member of this round (and not this host); further refusals are counted")
            }
            Say::Summary(n, over) => {
                warn!(refused = n, over_s = over.as_secs(), latest = %peer, "the worker store refused connections from non-member addresses")
            }
            Say::Nothing => {}
        }
    }

    fn stranger(&self, peer: SocketAddr, why: Stranger) {
        let mut s = self.lock();
        s.refused += 1;
        match s.strangers.hit(Instant::now()) {
            Say::First => {
                warn!(%peer, reason = %why, "the worker store refused a connection from this host: only the agent's user (and root) may use it; further refusals are counted")
            }
            Say::Summary(n, over) => {
                warn!(refused = n, over_s = over.as_secs(), latest = %peer, reason = %why, "the worker store refused connections from other users of this host")
            }
            Say::Nothing => {}
        }
    }

    fn full(&self, peer: SocketAddr, why: Full) {
        let mut s = self.lock();
        s.over_limit += 1;
        match s.full.hit(Instant::now()) {
            Say::First => {
                warn!(%peer, reason = %why, "the worker store closed a connection over its limit; further ones are counted")
            }
            Say::Summary(n, over) => {
                warn!(closed = n, over_s = over.as_secs(), latest = %peer, reason = %why, "the worker store closed connections over its limits")
            }
            Say::Nothing => {}
        }
    }

    fn closed(&self, peer: SocketAddr, e: &ConnError) {
        if !e.is_misbehaviour() {
            debug!(%peer, error = %e, "worker store connection failed");
            return;
        }
        match self.lock().closures.hit(Instant::now()) {
            Say::First => {
                warn!(%peer, error = %e, "the worker store closed a connection; further closings are counted")
            }
            Say::Summary(n, over) => {
                warn!(closed = n, over_s = over.as_secs(), latest = %peer, error = %e, "the worker store closed misbehaving connections")
            }
            Say::Nothing => {}
        }
    }

    /// Logs what the counters have not said yet.
    fn summarize(&self) {
        let now = Instant::now();
        let mut s = self.lock();
        if let Some((n, over)) = s.refusals.take(now) {
            warn!(
                refused = n,
                over_s = over.as_secs(),
                "the worker store refused connections from non-member addresses"
            );
        }
        if let Some((n, over)) = s.strangers.take(now) {
            warn!(
                refused = n,
                over_s = over.as_secs(),
                "the worker store refused connections from other users of this host"
            );
        }
        if let Some((n, over)) = s.full.take(now) {
            warn!(
                closed = n,
                over_s = over.as_secs(),
                "the worker store closed connections over its limits"
            );
        }
        if let Some((n, over)) = s.closures.take(now) {
            warn!(
                closed = n,
                over_s = over.as_secs(),
                "the worker store closed misbehaving connections"
            );
        }
    }
}

/// A running worker store; stopped (every connection closed) on drop.
#[derive(Debug)]
pub struct WorkerStore {
    addr: SocketAddr,
    stop: CancellationToken,
    shared: Handle,
}

impl WorkerStore {
    /// Serves a fresh, empty store on `listener` with default bounds,
    /// admitting this host only.
    pub fn start(listener: TcpListener) -> std::io::Result<Self> {
        Self::start_with(listener, StoreOptions::default())
    }

    /// Serves a fresh, empty store on `listener`.
    pub fn start_with(listener: TcpListener, options: StoreOptions) -> std::io::Result<Self> {
        Self::start_counted(listener, options, Default::default())
    }

    /// The same, counting connections and operations in `metrics` (the
    /// agent's, which outlive each round's store).
    pub fn start_counted(
        listener: TcpListener,
        options: StoreOptions,
        metrics: metrics::StoreMetrics,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        // Large buffers freed (an evicted incomplete request's) go back to the system.
        crate::sys::unmap_large_frees(256 << 10);
        let shared = Handle::new(&options);
        let admission = Arc::new(Admission::new(&options.admit));
        {
            // Host names are looked up now, not at the first connection from them.
            let admission = admission.clone();
            tokio::spawn(async move {
                admission.resolve().await;
            });
        }
        let accept = Acceptor {
            shared: shared.clone(),
            stop: stop.clone(),
            admission,
            owners: Arc::new(owner::Owners::open()),
            limits: options.limits,
            metrics,
        };
        tokio::spawn(accept.run(listener));
        Ok(Self { addr, stop, shared })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it holds now.
    pub fn stats(&self) -> StoreStats {
        let s = self.shared.lock();
        StoreStats {
            connections: s.wakers.len(),
            bytes: s.state.bytes(),
            waiter_entries: s.state.waiter_entries(),
            refused: s.refused,
            over_limit: s.over_limit,
            pending_bytes: s.ledger.pending_bytes(),
        }
    }
}

impl Drop for WorkerStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The accept loop of one store.
struct Acceptor {
    shared: Handle,
    stop: CancellationToken,
    admission: SharedAdmission,
    owners: Arc<owner::Owners>,
    limits: Limits,
    metrics: metrics::StoreMetrics,
}

impl Acceptor {
    async fn run(self, listener: TcpListener) {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        let mut trouble: Option<AcceptTrouble> = None;
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.stop.cancelled() => break,
            };
            let (sock, peer) = match accepted {
                Ok(a) => a,
                // Too many open files and the like: keep serving the connections we have.
                Err(e) => {
                    let now = Instant::now();
                    match &mut trouble {
                        None => {
                            warn!(error = %e, "the worker store cannot accept connections; retrying with backoff up to {ACCEPT_BACKOFF_MAX:?}, quietly until it recovers");
                            trouble = Some(AcceptTrouble {
                                since: now,
                                last: now,
                                failures: 1,
                            });
                        }
                        Some(t) => {
                            t.last = now;
                            t.failures += 1;
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.cancelled() => break,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            };
            backoff = ACCEPT_BACKOFF_MIN;
            if let Some(t) = &trouble {
                if t.last.elapsed() >= ACCEPT_EPISODE_QUIET {
                    info!(
                        failed = t.failures,
                        lasted_s = (t.last - t.since).as_secs_f64(),
                        "the worker store accepts connections again"
                    );
                    trouble = None;
                }
            }
            match self.admission.decide(peer.ip(), || local_ip(&sock)) {
                Decision::Admit => self.admit(sock, peer),
                Decision::Refuse => self.refuse(sock, peer),
                Decision::AfterResolution => {
                    let (admission, next) = (self.admission.clone(), self.clone_parts());
                    tokio::spawn(async move {
                        if admission.admits_resolved(peer.ip()).await {
                            next.admit(sock, peer);
                        } else {
                            next.refuse(sock, peer);
                        }
                    });
                }
            }
        }
        if let Some(t) = trouble {
            warn!(
                failed = t.failures,
                lasted_s = (t.last - t.since).as_secs_f64(),
                "the worker store stopped; it could not accept some connections"
            );
        }
        self.shared.summarize();
    }

    fn clone_parts(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            stop: self.stop.clone(),
            admission: self.admission.clone(),
            owners: self.owners.clone(),
            limits: self.limits,
            metrics: self.metrics.clone(),
        }
    }

    /// Closes a connection the admission refused, and counts it.
    fn refuse(&self, sock: TcpStream, peer: SocketAddr) {
        drop(sock);
        self.metrics.refused();
        self.shared.refuse(peer);
    }

    /// Serves a connection its address admits if its owner (when it is on
    /// this host) is the agent's user or root, and the limits have room.
    fn admit(&self, sock: TcpStream, peer: SocketAddr) {
        let Ok(local) = sock.local_addr() else {
            return; // the connection is gone already
        };
        let source = Source::of(peer.ip(), Some(local.ip()));
        let owner = self.owners.peer_uid(peer, local);
        let me = nix::unistd::geteuid().as_raw();
        if let Err(why) = admission::owner_admits(source == Source::ThisHost, owner, me) {
            drop(sock);
            self.metrics.refused();
            self.shared.stranger(peer, why);
            return;
        }
        self.serve(sock, peer, source);
    }

    /// Serves an admitted connection on its own task, if the limits have room.
    fn serve(&self, sock: TcpStream, peer: SocketAddr, source: Source) {
        let _ = sock.set_nodelay(true);
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = {
            let mut s = self.shared.lock();
            s.ledger.open(source).map(|()| {
                s.next_conn += 1;
                let id = s.next_conn;
                s.wakers.insert(id, tx);
                id
            })
        };
        let id = match opened {
            Ok(id) => id,
            Err(why) => {
                drop(sock);
                self.shared.full(peer, why);
                return;
            }
        };
        let (shared, stop, limits) = (self.shared.clone(), self.stop.clone(), self.limits);
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let _open = metrics.connected();
            let served = Connection::new(id, &shared, rx, limits, &metrics)
                .serve(sock, stop)
                .await;
            {
                let mut s = shared.lock();
                s.state.disconnect(id);
                s.wakers.remove(&id);
                s.ledger.close(id, source);
            }
            if let Err(e) = served {
                shared.closed(peer, &e);
            }
        });
    }
}

/// An episode of failing accepts.
struct AcceptTrouble {
    since: Instant,
    last: Instant,
    failures: u64,
}

fn local_ip(sock: &TcpStream) -> Option<IpAddr> {
    sock.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests;
