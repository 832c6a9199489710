//! torchft's lighthouse, served by `rdzv-server` (`--lighthouse ADDR`).
//!
//! # Why
//! torchft keeps a job training while its replica groups fail and come back,
//! without restarting the survivors: before every step each group's manager
//! asks a *lighthouse* for a quorum (which groups take part in this step),
//! and heartbeats it meanwhile. torchft's own lighthouse is one process with
//! its state in memory, the single point of failure of a system built to
//! remove them. `rdzv-server` already runs replicated on etcd, bounded and
//! authenticated; serving torchft's protocol from it gives torchft a
//! lighthouse that fails over with the rendezvous.
//!
//! # What it decides
//! The rules are torchft 0.2's (so a manager cannot tell the difference),
//! written here as a pure state machine ([`Lighthouse::step`]) that the gRPC
//! handlers ([`service`]) drive:
//! - A replica group is *healthy* while its last heartbeat (a `Heartbeat`
//!   call, or the implicit one of a `Quorum` call) is younger than
//!   `heartbeat_timeout`.
//! - A `Quorum` call makes its group a *participant* of the next quorum; the
//!   call returns once a quorum that includes it forms.
//! - On every call and every `quorum_tick`, with the healthy participants:
//!   a *fast quorum* forms at once when every member of the previous quorum
//!   is among them; otherwise a quorum needs at least `min_replicas` of
//!   them, more than half of the healthy groups (no split brain), and,
//!   until `join_timeout` after the first of them joined, every healthy
//!   group (stragglers are waited for only while they heartbeat). A
//!   participant asking `shrink_only` limits the quorum to the previous
//!   quorum's members.
//! - A quorum's id grows by one when its members (by replica id) differ
//!   from the previous quorum's, or when a member reports a failed commit;
//!   participants start afresh after each quorum.
//!
//! # Bounds
//! Every input is untrusted: replica ids, addresses and the opaque `data`
//! are bounded in size ([`limits`]), the participants and groups held are
//! bounded in number ([`MAX_GROUPS`]), and a group silent for
//! [`FORGET_AFTER`] heartbeat timeouts is forgotten (it could only ever be
//! unhealthy).

pub mod limits;
pub mod report;
pub mod service;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use accel_proto::torchft as pb;

/// The most replica groups (heartbeating or participating) held at once.
pub const MAX_GROUPS: usize = 1_024;

/// Heartbeat timeouts after which a silent group is forgotten.
pub const FORGET_AFTER: u32 = 10;

/// The lighthouse's settings (torchft's `LighthouseServer` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LighthouseConfig {
    /// The fewest replica groups a quorum has (`--lighthouse-min-replicas`).
    pub min_replicas: u64,
    /// How long a quorum waits for healthy groups that have not asked to
    /// join, from when the first participant joined.
    pub join_timeout: Duration,
    /// How often a quorum is looked for besides on every call.
    pub quorum_tick: Duration,
    /// How long a group counts as alive after its last heartbeat.
    pub heartbeat_timeout: Duration,
}

impl Default for LighthouseConfig {
    /// torchft's defaults (its command line's; `min_replicas` has none there).
    fn default() -> Self {
        Self {
            min_replicas: 1,
            join_timeout: Duration::from_secs(60),
            quorum_tick: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_secs(5),
        }
    }
}

/// What happens to the lighthouse.
#[derive(Debug, Clone)]
pub enum Event {
    /// A `Quorum` call: the group joins the next quorum (and heartbeats).
    Join(pb::QuorumMember),
    /// A caller that got a quorum without itself in it joins the next one
    /// (no quorum is looked for at once).
    Rejoin(pb::QuorumMember),
    /// A `Heartbeat` call from this replica id.
    Heartbeat(String),
    /// The quorum tick.
    Tick,
}

/// What the lighthouse decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A quorum formed: every waiting caller in it gets it (`created` is
    /// left for the caller to stamp with the wall clock).
    Formed(pb::Quorum),
}

/// Why no quorum formed yet, for the status page and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// No participant.
    Nobody,
    /// Fewer healthy participants than `min_replicas`.
    TooFew {
        /// Healthy participants.
        have: usize,
        /// `min_replicas`.
        need: u64,
    },
    /// Not more than half of the healthy groups take part.
    SplitBrain {
        /// Healthy participants.
        have: usize,
        /// Healthy groups.
        healthy: usize,
    },
    /// Healthy groups that have not joined are waited for until this
    /// instant.
    Stragglers {
        /// Healthy groups not participating.
        missing: usize,
        /// When the join timeout ends.
        until: Instant,
    },
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waiting::Nobody => write!(f, "no replica group asked for a quorum"),
            Waiting::TooFew { have, need } => write!(
                f,
                "{have} healthy replica group(s) asked for a quorum; it needs {need} (--lighthouse-min-replicas)"
            ),
            Waiting::SplitBrain { have, healthy } => write!(
                f,
                "{have} of {healthy} healthy replica groups asked for a quorum; more than half must"
            ),
            Waiting::Stragglers { missing, .. } => write!(
                f,
                "waiting for {missing} healthy replica group(s) that have not asked yet (join timeout)"
            ),
        }
    }
}

/// One participant: when it joined, and how it presented itself.
#[derive(Debug, Clone)]
struct Participant {
    joined: Instant,
    member: pb::QuorumMember,
}

/// The lighthouse's state.
#[derive(Debug)]
pub struct Lighthouse {
    config: LighthouseConfig,
    /// By replica id.
    participants: BTreeMap<String, Participant>,
    /// Last heartbeat, by replica id.
    heartbeats: HashMap<String, Instant>,
    /// The last quorum formed.
    prev: Option<pb::Quorum>,
    /// The last quorum id handed out.
    quorum_id: i64,
    /// When the last quorum formed.
    formed_at: Option<Instant>,
}

/// A group or participant the lighthouse cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// [`MAX_GROUPS`] are held.
    #[error("the lighthouse holds {MAX_GROUPS} replica groups already; a group silent for {FORGET_AFTER} heartbeat timeouts is forgotten")]
    Full,
    /// The next quorum would outgrow what a client decodes.
    #[error("the next quorum would be larger than {} bytes with this replica group (its members' addresses, data and handles); shorten them", limits::MAX_QUORUM_BYTES)]
    TooLarge,
}

impl Lighthouse {
    /// A lighthouse that has handed out no quorum yet.
    pub fn new(config: LighthouseConfig) -> Self {
        Self::resuming(config, 0)
    }

    /// A lighthouse whose last quorum id was `quorum_id` (a leader taking
    /// over: ids never go back, so no manager mistakes a new quorum for one
    /// it saw).
    pub fn resuming(config: LighthouseConfig, quorum_id: i64) -> Self {
        Self {
            config,
            participants: BTreeMap::new(),
            heartbeats: HashMap::new(),
            prev: None,
            quorum_id,
            formed_at: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LighthouseConfig {
        &self.config
    }

    /// The last quorum id handed out (0: none yet).
    pub fn quorum_id(&self) -> i64 {
        self.quorum_id
    }

    /// The last quorum formed, and when.
    pub fn last_quorum(&self) -> Option<(&pb::Quorum, Instant)> {
        self.prev.as_ref().zip(self.formed_at)
    }

    /// Replica ids waiting for the next quorum.
    pub fn participants(&self) -> impl Iterator<Item = &pb::QuorumMember> {
        self.participants.values().map(|p| &p.member)
    }

    /// Every replica group heard, with its last heartbeat.
    pub fn heartbeats(&self) -> impl Iterator<Item = (&str, Instant)> {
        self.heartbeats.iter().map(|(id, at)| (id.as_str(), *at))
    }

    /// Handles one event at `now`.
    pub fn step(&mut self, now: Instant, event: Event) -> Result<Vec<Action>, Refused> {
        match event {
            Event::Join(member) => {
                self.heard(now, &member.replica_id)?;
                self.join(now, member)?;
                Ok(self.tick(now))
            }
            Event::Rejoin(member) => {
                self.join(now, member)?;
                Ok(Vec::new())
            }
            Event::Heartbeat(id) => {
                self.heard(now, &id)?;
                Ok(Vec::new())
            }
            Event::Tick => {
                self.forget(now);
                Ok(self.tick(now))
            }
        }
    }

    fn heard(&mut self, now: Instant, id: &str) -> Result<(), Refused> {
        if let Some(at) = self.heartbeats.get_mut(id) {
            *at = now;
            return Ok(());
        }
        if self.heartbeats.len() >= MAX_GROUPS {
            self.forget(now);
            if self.heartbeats.len() >= MAX_GROUPS {
                return Err(Refused::Full);
            }
        }
        self.heartbeats.insert(id.to_owned(), now);
        Ok(())
    }

    fn join(&mut self, now: Instant, member: pb::QuorumMember) -> Result<(), Refused> {
        use prost::Message as _;
        let new = !self.participants.contains_key(&member.replica_id);
        if new && self.participants.len() >= MAX_GROUPS {
            // Participants of forgotten groups go only when room is needed:
            // a call still waiting keeps its place through a long silence.
            let heartbeats = &self.heartbeats;
            self.participants
                .retain(|id, _| heartbeats.contains_key(id));
            if self.participants.len() >= MAX_GROUPS {
                return Err(Refused::Full);
            }
        }
        let others: usize = self
            .participants
            .iter()
            .filter(|(id, _)| **id != member.replica_id)
            .map(|(_, p)| p.member.encoded_len() + 8)
            .sum();
        if others + member.encoded_len() + 8 > limits::MAX_QUORUM_BYTES {
            return Err(Refused::TooLarge);
        }
        self.participants.insert(
            member.replica_id.clone(),
            Participant {
                joined: now,
                member,
            },
        );
        Ok(())
    }

    /// Forgets the heartbeats of groups silent for [`FORGET_AFTER`]
    /// heartbeat timeouts (they could only count as unhealthy). Their
    /// participation stays until room is needed ([`Lighthouse::join`]).
    fn forget(&mut self, now: Instant) {
        let limit = self.config.heartbeat_timeout.saturating_mul(FORGET_AFTER);
        self.heartbeats
            .retain(|_, at| now.saturating_duration_since(*at) <= limit);
    }

    fn healthy(&self, now: Instant, id: &str) -> bool {
        self.heartbeats
            .get(id)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.config.heartbeat_timeout)
    }

    /// The quorum's members if one can form now, else why not.
    pub fn compute(&self, now: Instant) -> Result<Vec<pb::QuorumMember>, Waiting> {
        let healthy_groups = self
            .heartbeats
            .keys()
            .filter(|id| self.healthy(now, id))
            .count();
        let healthy: Vec<&Participant> = self
            .participants
            .values()
            .filter(|p| self.healthy(now, &p.member.replica_id))
            .collect();
        // In replica id order (the map's).
        let mut members: Vec<pb::QuorumMember> = healthy.iter().map(|p| p.member.clone()).collect();
        if let Some(prev) = &self.prev {
            if healthy.iter().any(|p| p.member.shrink_only) {
                members.retain(|m| {
                    prev.participants
                        .iter()
                        .any(|p| p.replica_id == m.replica_id)
                });
            }
            let fast = prev.participants.iter().all(|p| {
                self.participants.contains_key(&p.replica_id) && self.healthy(now, &p.replica_id)
            });
            if fast {
                return Ok(members);
            }
        }
        if healthy.is_empty() {
            return Err(Waiting::Nobody);
        }
        if (healthy.len() as u64) < self.config.min_replicas {
            return Err(Waiting::TooFew {
                have: healthy.len(),
                need: self.config.min_replicas,
            });
        }
        if healthy.len() <= healthy_groups / 2 {
            return Err(Waiting::SplitBrain {
                have: healthy.len(),
                healthy: healthy_groups,
            });
        }
        let first = healthy.iter().map(|p| p.joined).min().unwrap_or(now);
        let waited = now.saturating_duration_since(first);
        if waited < self.config.join_timeout && healthy.len() < healthy_groups {
            let until = first
                .checked_add(self.config.join_timeout)
                .or_else(|| now.checked_add(self.config.join_timeout - waited))
                .unwrap_or(now);
            return Err(Waiting::Stragglers {
                missing: healthy_groups - healthy.len(),
                until,
            });
        }
        Ok(members)
    }

    fn tick(&mut self, now: Instant) -> Vec<Action> {
        let Ok(members) = self.compute(now) else {
            return Vec::new();
        };
        // An empty quorum forms only after a non-empty one (a shrink-only
        // participant left no previous member): torchft hands it out, and
        // the next quorum, with no previous members to wait for, takes the
        // healthy participants at once.
        if members.is_empty() && self.prev.as_ref().is_none_or(|p| p.participants.is_empty()) {
            return Vec::new();
        }
        let changed = match &self.prev {
            None => true,
            Some(prev) => {
                prev.participants.len() != members.len()
                    || prev
                        .participants
                        .iter()
                        .zip(&members)
                        .any(|(a, b)| a.replica_id != b.replica_id)
            }
        };
        if changed || members.iter().any(|m| m.commit_failures > 0) {
            self.quorum_id = self.quorum_id.saturating_add(1);
        }
        let quorum = pb::Quorum {
            quorum_id: self.quorum_id,
            participants: members,
            created: None,
        };
        self.prev = Some(quorum.clone());
        self.formed_at = Some(now);
        self.participants.clear();
        vec![Action::Formed(quorum)]
    }
}

#[cfg(test)]
mod tests;
