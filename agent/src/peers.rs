//! The round's peer hub: how a node that lost the rendezvous learns whether
//! the job could re-form without it.
//!
//! # Why
//! A node stops its workers without a rendezvous (fencing) so that no
//! second copy of its ranks runs beside a job that re-formed without it.
//! But a job re-forms only through a rendezvous that is up, leading and
//! hearing most of the round. When the rendezvous (or etcd under it) is
//! down, paused or cut off from every node, nobody can re-form the job, and
//! fencing would throw away every rank's progress for nothing. So a node
//! keeps its workers past the drop limit only while it can show that the
//! rendezvous cannot drop it, and this module gathers that evidence.
//!
//! # How
//! Node rank 0 (the node that hosts the worker store, already in every
//! rank's data path) serves a hub on `MASTER_PORT` over UDP. Every node of
//! the round, rank 0 included, pings it every [`Timing::every`]; the hub
//! answers with the set of node ranks it heard within [`Timing::fresh`].
//! Datagrams carry an HMAC-SHA256 under the round's peer key, which the
//! rendezvous gave each node of the round (`RoundComplete.peer_key`), and
//! strictly increasing sequence numbers, so neither a stranger nor a replay
//! can make a node believe in peers it does not have.
//!
//! Two rules, one on each side, make that safe:
//! - **Vouching.** Every node's keep-alives name the ranks it hears through
//!   the hub (`KeepAliveRequest.vouch`, or "all"), and the rendezvous counts
//!   each as heard. A node cut off from the rendezvous but not from its
//!   round is not dropped while any node of the round still reaches the
//!   rendezvous.
//! - **Mass silence.** A rendezvous that finds more than half of a round
//!   silent at once holds their places for the job's outage limit instead of
//!   the drop limit, and gives every node the whole drop limit again when
//!   the silence ends (the server's `job::decide::liveness`).
//!
//! A node that hears, through the hub, more than half of its round (itself
//! included) therefore cannot be dropped: either one of them reaches the
//! rendezvous and vouches for it, or none does and more than half of the
//! round is silent there. Two majorities always share a node, so there is no
//! third case. The evidence is dated by the *send* time of the ping the hub
//! answered, less [`Timing::lag`] (how stale a peer's vouch may be, and how
//! long silence takes to count as a mass silence), and counts only when the
//! node's contact with the hub had been unbroken for that lag before the
//! ping, and so had the contact of every other node the majority counts:
//! each ping says whether its sender's answers have come unbroken for the
//! lag (*steady*), and the hub counts towards a majority only the steady
//! nodes. Then a peer the rendezvous heard in that while vouched for this
//! node, or none was heard and the round was in a mass silence, held until
//! a drop limit after it ends. (A peer that hears the hub only since a
//! moment ago has not vouched yet: its next keep-alive may come after the
//! rendezvous dropped this node. Found by the simulator, seed 351244.) It never extends past the outage limit from
//! the node's last contact with the rendezvous, when a held place is given
//! away.
//!
//! The argument counts only nodes the rendezvous may still hold in the
//! running round, so a node whose fence fell (its own deadline, or its
//! guard's) or that was told it was dropped leaves the hub at once, not at
//! its next offer: a fenced node still rejoining, heard by the hub, would
//! otherwise make a majority with a node the rendezvous is about to drop
//! (found by the simulator). A node that stopped its workers for its own
//! failure during an outage stays: the rendezvous still holds it, and its
//! report waits for the rendezvous to be back.
//!
//! A node that hears at most half of its round (cut off from the hub, or
//! the hub from most nodes) has no evidence and fences at the drop limit as
//! before; a round of one node is a majority of itself.
//!
//! The pure parts ([`Hub`], [`View`], the wire format) are unit-tested; the
//! task ([`spawn`]) only moves datagrams and publishes what the view says.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use accel_rdzv_client::client::Vouch;
use ring::hmac;
use std::time::Instant;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tracing::{debug, warn};

/// The first bytes of every datagram: "accel peer", version 2 (a ping says
/// whether its sender is steady). A node of another version is not heard:
/// it has no evidence and fences at the drop limit.
const MAGIC: [u8; 4] = *b"ACP2";
/// A ping (node to hub).
const PING: u8 = 1;
/// An answer (hub to node).
const ANSWER: u8 = 2;
/// Bytes of the MAC that ends every datagram.
const TAG: usize = 32;
/// Most nodes a round may have for its hub (a bitmap in one datagram).
pub const MAX_NODES: u32 = 60_000;
/// Pings whose send time a node remembers, to date their answers.
const PENDING: usize = 64;

/// The round's hub and the timing its nodes use.
#[derive(Debug, Clone)]
pub struct PeerRound {
    /// The round.
    pub round: u64,
    /// This node's rank in it.
    pub node_rank: u32,
    /// Its nodes.
    pub nnodes: u32,
    /// The round's peer key.
    pub key: Vec<u8>,
    /// Where the hub listens (`MASTER_ADDR:MASTER_PORT`, UDP).
    pub hub: String,
    /// Node rank 0: where to serve the hub (the store's address).
    pub serve: Option<SocketAddr>,
    /// How the evidence is dated.
    pub timing: Timing,
}

/// How often nodes ping, how long a ping counts, and how evidence is dated,
/// from the job's keep-alive settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Between two pings of a node.
    pub every: Duration,
    /// How long the hub counts a node as heard after its ping.
    pub fresh: Duration,
    /// How much older than its ping the evidence is taken to be (see the
    /// module docs).
    pub lag: Duration,
    /// How long after its (dated) last contact a node stops its workers:
    /// the drop limit less the fence margin.
    pub fence_in: Duration,
    /// The outage limit: no evidence keeps workers longer than this after
    /// the node last reached the rendezvous itself (less the fence margin).
    pub outage: Duration,
}

impl Timing {
    /// The timing for a job with drop limit `drop_limit`, keep-alives every
    /// `interval`, an outage limit `outage`, nodes that fence `fence_in`
    /// after their last contact, and rounds of `nnodes`.
    pub fn new(
        drop_limit: Duration,
        interval: Duration,
        outage: Duration,
        fence_in: Duration,
        nnodes: u32,
    ) -> Self {
        // A ping every fortieth of the drop limit (so the lag stays a small
        // part of it), within 10..250 ms; large rounds ping less often, so
        // the hub handles at most about 10,000 pings a second.
        let every = (drop_limit / 40)
            .clamp(Duration::from_millis(10), Duration::from_millis(250))
            .max(Duration::from_micros(100) * nnodes)
            .min(Duration::from_secs(2));
        // The rendezvous counts a node silent after one and a half
        // keep-alive intervals (`JobConfig::silent_after`); a peer's view of
        // the hub is at most `every + fresh` old; 50 ms of slack.
        let silent_after = (interval * 3 / 2).min(drop_limit);
        // How long the hub counts a ping, which is also the longest gap
        // between two answered pings that keeps a node's run of contact
        // unbroken (`View::majority`): two and a half pings, but up to
        // 2 s where the drop limit leaves room (two thirds of what is left
        // of the fence deadline after the rest of the lag: the evidence
        // still counts for the last third), so a node whose agent stalls
        // (a loaded machine, the burst of work when the rendezvous goes
        // away, the hub's own node busy) keeps its evidence.
        let rest = silent_after + every * 2 + Duration::from_millis(150);
        let room = fence_in.saturating_sub(rest) * 2 / 3;
        let fresh = (every * 5 / 2).max(room.min(Duration::from_secs(2)));
        // The hub forgets a node at its next sweep (every `every`) past
        // `fresh`; the rendezvous notices a mass silence at its next tick
        // (every 100 ms); 50 ms of slack.
        let lag = silent_after + every * 2 + fresh + Duration::from_millis(150);
        let margin = drop_limit.saturating_sub(fence_in);
        Self {
            every,
            fresh,
            lag,
            fence_in,
            outage: outage.saturating_sub(margin),
        }
    }

    /// Until when evidence from a ping sent at `sent` keeps workers, given
    /// the node last reached the rendezvous itself at `contact` (the send
    /// time of its last answered call); `None`: it keeps them no longer than
    /// the contact itself does.
    pub fn keeps_until(&self, sent: Instant, contact: Instant) -> Option<Instant> {
        let dated = sent.checked_sub(self.lag)?;
        let until = dated.checked_add(self.fence_in)?;
        let cap = contact.checked_add(self.outage).unwrap_or(until);
        let until = until.min(cap);
        let plain = contact.checked_add(self.fence_in).unwrap_or(until);
        (until > plain).then_some(until)
    }
}

/// What the agent's other parts read of the peer hub: the vouch for the
/// keep-alives and the evidence's deadline. One per agent, shared by its
/// rounds' tasks, links and guard.
#[derive(Debug, Clone)]
pub struct Shared {
    inner: Arc<Mutex<State>>,
    until: watch::Sender<Option<Instant>>,
}

#[derive(Debug, Default)]
struct State {
    /// The vouch, when the hub's answer it comes from arrived, and how
    /// long it counts.
    vouch: Option<(Vouch, Instant, Duration)>,
    until: Option<Instant>,
    /// The latest `until` published since the round began: the machine's
    /// fence never moves back, so whatever must outlast the workers (the
    /// held connection of a silent server) follows this, not `until`.
    latest: Option<Instant>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            until: watch::channel(None).0,
        }
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What this node's keep-alive vouches for at `now` (`None` once the
    /// hub's answer is no longer fresh).
    pub fn vouch(&self, now: Instant) -> Option<Vouch> {
        let s = self.state();
        let (v, at, fresh) = s.vouch.as_ref()?;
        (now.saturating_duration_since(*at) <= *fresh).then(|| v.clone())
    }

    /// Until when the peers' evidence keeps this node's workers, if at all.
    pub fn until(&self) -> Option<Instant> {
        self.state().until
    }

    /// The latest [`Shared::until`] published in this round (never moves
    /// back, even when the evidence lapses).
    pub fn latest(&self) -> Option<Instant> {
        self.state().latest
    }

    /// Wakes whoever waits on [`Shared::watch`] when the evidence moves.
    pub fn watch(&self) -> watch::Receiver<Option<Instant>> {
        self.until.subscribe()
    }

    fn publish(&self, vouch: Option<(Vouch, Instant, Duration)>, until: Option<Instant>) {
        {
            let mut s = self.state();
            s.vouch = vouch;
            s.until = until;
            s.latest = match (s.latest, until) {
                (Some(l), Some(u)) => Some(l.max(u)),
                (l, u) => l.or(u),
            };
        }
        self.until.send_if_modified(|u| {
            let changed = *u != until;
            *u = until;
            changed
        });
    }

    /// No vouch and no evidence any more (this node left the round's
    /// hub), but [`Shared::latest`] stays: workers that are still stopping
    /// are kept no longer than it allowed, and the hold of a silent
    /// server's connection must last as long.
    pub fn quiet(&self) {
        self.publish(None, None);
    }

    /// The round ended: nothing is vouched for or kept any more.
    pub fn clear(&self) {
        self.publish(None, None);
        self.state().latest = None;
    }
}

/// A bitmap of node ranks.
fn bit(map: &[u8], rank: u32) -> bool {
    map.get(rank as usize / 8)
        .is_some_and(|b| b & (1 << (rank % 8)) != 0)
}

fn set(map: &mut [u8], rank: u32, on: bool) {
    if let Some(b) = map.get_mut(rank as usize / 8) {
        match on {
            true => *b |= 1 << (rank % 8),
            false => *b &= !(1 << (rank % 8)),
        }
    }
}

/// The hub's table: when each rank last pinged, and the bitmap of those
/// heard within `fresh`, versioned so an unchanged bitmap is not sent again.
#[derive(Debug)]
pub struct Hub {
    fresh: Duration,
    /// Per rank: its last ping's arrival, sequence number, and whether it
    /// said its sender is steady.
    last: Vec<Option<(Instant, u64, bool)>>,
    map: Vec<u8>,
    heard: u32,
    /// Ranks heard whose last ping said steady.
    steady: u32,
    version: u64,
}

impl Hub {
    /// A hub for `nnodes` ranks.
    pub fn new(nnodes: u32, fresh: Duration) -> Self {
        Self {
            fresh,
            last: vec![None; nnodes as usize],
            map: vec![0; (nnodes as usize).div_ceil(8)],
            heard: 0,
            steady: 0,
            version: 1,
        }
    }

    /// A ping from `rank` with sequence number `seq`, `steady` as its
    /// sender says: false (ignored) for a rank the round does not have or a
    /// sequence number not above the last (a replay).
    pub fn ping(&mut self, now: Instant, rank: u32, seq: u64, steady: bool) -> bool {
        let Some(slot) = self.last.get_mut(rank as usize) else {
            return false;
        };
        if slot.is_some_and(|(_, last, _)| seq <= last) {
            return false;
        }
        let was = slot.is_some_and(|(_, _, s)| s) && bit(&self.map, rank);
        *slot = Some((now, seq, steady));
        if !bit(&self.map, rank) {
            set(&mut self.map, rank, true);
            self.heard += 1;
            self.version += 1;
        }
        match (was, steady) {
            (false, true) => self.steady += 1,
            (true, false) => self.steady -= 1,
            _ => {}
        }
        true
    }

    /// Forgets ranks not heard within `fresh` of `now`.
    pub fn sweep(&mut self, now: Instant) {
        for (rank, slot) in self.last.iter().enumerate() {
            let stale =
                slot.is_none_or(|(at, _, _)| now.saturating_duration_since(at) > self.fresh);
            if stale && bit(&self.map, rank as u32) {
                set(&mut self.map, rank as u32, false);
                self.heard -= 1;
                if slot.is_some_and(|(_, _, s)| s) {
                    self.steady -= 1;
                }
                self.version += 1;
            }
        }
    }

    /// The answer to `rank`, which has bitmap version `have`: how many ranks
    /// are heard, the version, the bitmap if the node's is another, and how
    /// many ranks but `rank` are heard and steady.
    pub fn answer(&self, have: u64, rank: u32) -> (u32, u64, Option<&[u8]>, u32) {
        let map = (have != self.version).then_some(&self.map[..]);
        let own = self
            .last
            .get(rank as usize)
            .is_some_and(|s| s.is_some_and(|(_, _, s)| s) && bit(&self.map, rank));
        (self.heard, self.version, map, self.steady - u32::from(own))
    }
}

/// One node's view of the hub: its pings' send times, the last bitmap, and
/// the evidence the answers make.
#[derive(Debug)]
pub struct View {
    rank: u32,
    nnodes: u32,
    fresh: Duration,
    seq: u64,
    pending: std::collections::VecDeque<(u64, Instant)>,
    version: u64,
    map: Vec<u8>,
    /// How many ranks the hub heard, as it last said (its bitmap's count).
    heard: u32,
    /// When the current unbroken run of answers began (the send time of
    /// its first answered ping), and the send time of the last.
    run: Option<(Instant, Instant)>,
    /// The send time of the last answered ping that showed a majority.
    majority: Option<Instant>,
    /// When the last answer came.
    answered: Option<Instant>,
}

impl View {
    /// Node `rank` of a round of `nnodes`.
    pub fn new(rank: u32, nnodes: u32, fresh: Duration) -> Self {
        Self {
            rank,
            nnodes,
            fresh,
            seq: 0,
            pending: Default::default(),
            version: 0,
            map: Vec::new(),
            heard: 0,
            run: None,
            majority: None,
            answered: None,
        }
    }

    /// The next ping, sent at `now`: its sequence number and the bitmap
    /// version this node has.
    pub fn ping(&mut self, now: Instant) -> (u64, u64) {
        self.seq += 1;
        if self.pending.len() == PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((self.seq, now));
        (self.seq, self.version)
    }

    /// Whether this node's answers have come unbroken for at least `lag`
    /// up to its last, still fresh at `now` (its pings say so: the hub
    /// counts only steady nodes towards another node's majority).
    pub fn steady(&self, now: Instant, lag: Duration) -> bool {
        self.run.is_some_and(|(first, last)| {
            now.saturating_duration_since(last) <= self.fresh
                && last.saturating_duration_since(first) >= lag
        })
    }

    /// The hub's answer to ping `seq`: `heard` ranks, bitmap `version`
    /// (and the bitmap, if it changed), and how many other ranks it hears
    /// that are steady (`steady_others`). False if it answers no ping of ours.
    pub fn answer(
        &mut self,
        now: Instant,
        seq: u64,
        heard: u32,
        version: u64,
        map: Option<&[u8]>,
        steady_others: u32,
    ) -> bool {
        let Some(i) = self.pending.iter().position(|(s, _)| *s == seq) else {
            return false;
        };
        let (_, sent) = self.pending[i];
        // Older pings can no longer be answered usefully.
        self.pending.drain(..=i);
        if let Some(map) = map {
            self.map = map.to_vec();
        }
        self.version = version;
        self.heard = heard;
        self.run = match self.run {
            Some((first, last)) if sent.saturating_duration_since(last) <= self.fresh => {
                Some((first, sent.max(last)))
            }
            _ => Some((sent, sent)),
        };
        self.answered = Some(now);
        // This node itself, and the other nodes whose contact with the hub
        // is as unbroken as `majority` asks of this node's.
        let counted = u64::from(steady_others.min(heard.saturating_sub(1))) + 1;
        if bit(&self.map, self.rank) && 2 * counted > u64::from(self.nnodes) {
            self.majority = Some(self.majority.map_or(sent, |m| m.max(sent)));
        }
        true
    }

    /// What this node vouches for at `now`: every rank the hub hears, while
    /// its answer is fresh.
    pub fn vouch(&self, now: Instant, round: u64) -> Option<Vouch> {
        let at = self.answered?;
        if now.saturating_duration_since(at) > self.fresh || self.map.is_empty() {
            return None;
        }
        Some(match self.heard == self.nnodes {
            true => Vouch {
                round,
                ranks: Vec::new(),
                all: true,
            },
            false => Vouch {
                round,
                ranks: self.map.clone(),
                all: false,
            },
        })
    }

    /// The send time of the last ping whose answer showed a majority, if
    /// this node's contact with the hub was unbroken for at least `lag`
    /// before that ping and still is at `now`: only then did every peer
    /// the rendezvous heard in that while vouch for this node.
    pub fn majority(&self, now: Instant, lag: Duration) -> Option<Instant> {
        let (first, last) = self.run?;
        if now.saturating_duration_since(last) > self.fresh + self.fresh {
            return None;
        }
        self.majority
            .filter(|m| *m >= first && m.saturating_duration_since(first) >= lag)
    }
}

/// A ping: round, rank, sequence number, the bitmap version it has, and
/// whether its sender is steady ([`View::steady`]).
fn encode_ping(
    key: &hmac::Key,
    round: u64,
    rank: u32,
    seq: u64,
    version: u64,
    steady: bool,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + 1 + 8 + 4 + 8 + 8 + 1 + TAG);
    b.extend_from_slice(&MAGIC);
    b.push(PING);
    b.extend_from_slice(&round.to_be_bytes());
    b.extend_from_slice(&rank.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&version.to_be_bytes());
    b.push(u8::from(steady));
    let tag = hmac::sign(key, &b);
    b.extend_from_slice(tag.as_ref());
    b
}

/// An answer: round, the rank it answers, the ping's sequence number, how
/// many ranks the hub hears, the bitmap version, how many other ranks are
/// heard and steady, and the bitmap (empty when the node has this version).
#[allow(clippy::too_many_arguments)]
fn encode_answer(
    key: &hmac::Key,
    round: u64,
    rank: u32,
    seq: u64,
    heard: u32,
    version: u64,
    steady_others: u32,
    map: Option<&[u8]>,
) -> Vec<u8> {
    let map = map.unwrap_or_default();
    let mut b = Vec::with_capacity(4 + 1 + 8 + 4 + 8 + 4 + 8 + 4 + map.len() + TAG);
    b.extend_from_slice(&MAGIC);
    b.push(ANSWER);
    b.extend_from_slice(&round.to_be_bytes());
    b.extend_from_slice(&rank.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&heard.to_be_bytes());
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&steady_others.to_be_bytes());
    b.extend_from_slice(map);
    let tag = hmac::sign(key, &b);
    b.extend_from_slice(tag.as_ref());
    b
}

/// A datagram that passed its MAC and names `round`.
#[derive(Debug, PartialEq, Eq)]
enum Datagram<'a> {
    Ping {
        rank: u32,
        seq: u64,
        version: u64,
        steady: bool,
    },
    Answer {
        rank: u32,
        seq: u64,
        heard: u32,
        version: u64,
        steady_others: u32,
        map: Option<&'a [u8]>,
    },
}

/// Reads a datagram; `None` for anything malformed, unauthenticated or of
/// another round (never a panic, whatever the bytes).
fn decode<'a>(key: &hmac::Key, round: u64, b: &'a [u8]) -> Option<Datagram<'a>> {
    let body_len = b.len().checked_sub(TAG)?;
    let (body, tag) = b.split_at(body_len);
    if body.len() < 4 + 1 + 8 + 4 + 8 || body[..4] != MAGIC {
        return None;
    }
    hmac::verify(key, body, tag).ok()?;
    let u64_at = |i: usize| -> Option<u64> {
        Some(u64::from_be_bytes(body.get(i..i + 8)?.try_into().ok()?))
    };
    let u32_at = |i: usize| -> Option<u32> {
        Some(u32::from_be_bytes(body.get(i..i + 4)?.try_into().ok()?))
    };
    if u64_at(5)? != round {
        return None;
    }
    let rank = u32_at(13)?;
    let seq = u64_at(17)?;
    match body[4] {
        PING if body.len() == 34 => Some(Datagram::Ping {
            rank,
            seq,
            version: u64_at(25)?,
            steady: match body[33] {
                0 => false,
                1 => true,
                _ => return None,
            },
        }),
        ANSWER if body.len() >= 41 => {
            let map = &body[41..];
            Some(Datagram::Answer {
                rank,
                seq,
                heard: u32_at(25)?,
                version: u64_at(29)?,
                steady_others: u32_at(37)?,
                map: (!map.is_empty()).then_some(map),
            })
        }
        _ => None,
    }
}

/// Runs this node's part of the round's peer hub until aborted: pings the
/// hub, serves it on node rank 0, and publishes to `shared` what the view
/// says, given the node's last contact with the rendezvous (`contact`).
/// Says once, quietly, if the hub cannot be reached or served.
pub fn spawn(
    peer: PeerRound,
    shared: Shared,
    contact: impl Fn() -> Option<Instant> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = run(&peer, &shared, contact).await {
            warn!(round = peer.round, error = %e, "no peer hub for this round: without the rendezvous, this node's workers stop at the drop limit");
        }
        shared.clear();
    })
}

async fn run(
    peer: &PeerRound,
    shared: &Shared,
    contact: impl Fn() -> Option<Instant>,
) -> std::io::Result<()> {
    if peer.nnodes == 0 || peer.nnodes > MAX_NODES || peer.node_rank >= peer.nnodes {
        return Err(std::io::Error::other(format!(
            "a round of {} nodes (at most {MAX_NODES} have a hub)",
            peer.nnodes
        )));
    }
    if peer.key.len() < 16 {
        return Err(std::io::Error::other(
            "the rendezvous gave this round no peer key (an older rdzv-server)",
        ));
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, &peer.key);
    let hub_addr = tokio::net::lookup_host(peer.hub.as_str())
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("'{}' resolves to no address", peer.hub)))?;
    let hub_socket = match peer.serve {
        Some(at) => Some(UdpSocket::bind(at).await?),
        None => None,
    };
    let local = match hub_addr {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let socket = UdpSocket::bind(local).await?;
    let t = peer.timing;
    let mut hub = Hub::new(peer.nnodes, t.fresh);
    let mut view = View::new(peer.node_rank, peer.nnodes, t.fresh);
    let mut tick = tokio::time::interval(t.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 65_536];
    let mut hub_buf = vec![0u8; 1024];
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = tokio::time::Instant::now().into_std();
                let steady = view.steady(now, t.lag);
                let (seq, version) = view.ping(now);
                let ping = encode_ping(&key, peer.round, peer.node_rank, seq, version, steady);
                if let Err(e) = socket.send_to(&ping, hub_addr).await {
                    debug!(error = %e, "peer hub ping not sent");
                }
                hub.sweep(now);
            }
            got = socket.recv_from(&mut buf) => {
                // Whoever sent it: the MAC says whether the hub did.
                let n = match got {
                    Ok((n, _)) => n,
                    Err(e) => {
                        debug!(error = %e, "peer hub answer not read");
                        tokio::time::sleep(t.every).await;
                        continue;
                    }
                };
                if let Some(Datagram::Answer { rank, seq, heard, version, steady_others, map }) = decode(&key, peer.round, &buf[..n]) {
                    if rank == peer.node_rank {
                        view.answer(tokio::time::Instant::now().into_std(), seq, heard, version, map, steady_others);
                    }
                }
            }
            got = async { hub_socket.as_ref().expect("guarded").recv_from(&mut hub_buf).await }, if hub_socket.is_some() => {
                let (n, from) = match got {
                    Ok(got) => got,
                    Err(e) => {
                        debug!(error = %e, "peer hub ping not read");
                        tokio::time::sleep(t.every).await;
                        continue;
                    }
                };
                if let Some(Datagram::Ping { rank, seq, version, steady }) = decode(&key, peer.round, &hub_buf[..n]) {
                    let now = tokio::time::Instant::now().into_std();
                    if hub.ping(now, rank, seq, steady) {
                        let (heard, current, map, steady_others) = hub.answer(version, rank);
                        let answer = encode_answer(&key, peer.round, rank, seq, heard, current, steady_others, map);
                        if let Some(s) = &hub_socket {
                            let _ = s.send_to(&answer, from).await;
                        }
                    }
                }
            }
        }
        let now = tokio::time::Instant::now().into_std();
        let vouch = view.vouch(now, peer.round).map(|v| (v, now, t.fresh));
        let until = contact().and_then(|c| {
            view.majority(now, t.lag)
                .and_then(|sent| t.keeps_until(sent, c))
        });
        shared.publish(vouch, until);
    }
}

#[cfg(test)]
mod tests;
