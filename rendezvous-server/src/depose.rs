//! Deposing a leader its agents cannot reach: the complaint tally.
//!
//! # Why
//! A leader is elected through etcd, so etcd decides who leads: a leader
//! that still reaches etcd keeps its lease and its place even when its
//! agents cannot reach it (a one-way partition, a firewall rule, a broken
//! route between the agents' network and the leader's host). Its agents
//! notice the silence within a second (the agent's link), leave it and
//! ask the other replicas who leads; a follower keeps naming the
//! unreachable leader, no election ever happens, and at the drop limit the
//! agents fence their workers: the job stalls until the partition heals.
//!
//! So an agent that joins because its replica went silent says so (the
//! join's `silent_replica`), and a follower counts these complaints. When
//! more than half of the nodes of one job (as the job's record in etcd says)
//! complained about the current leader within the job's drop limit, the
//! follower deposes the leader: it revokes the leader's etcd lease, which
//! its election key carries, so the next replica in line (the follower
//! itself, campaigning all along) is elected at once and the agents asking
//! it join it and resume, their workers running on.
//!
//! # Guards
//! - Only members count, each once, and only with their session secret
//!   (read from the job's record): a complaint is as authenticated as a
//!   keep-alive. The bearer token is checked before the service runs.
//! - A majority of one job's nodes: one node cut off from the leader (its
//!   own network trouble) deposes nobody.
//! - At most one deposal per leader term (lease id), and at most one per
//!   [`MIN_BETWEEN`] across terms, so replicas cannot be flipped back and
//!   forth faster than jobs can follow.
//! - Bounded memory: at most [`MAX_JOBS`] jobs tracked (the least recently
//!   heard of makes room), [`MAX_UNVERIFIED`] complaints per job before
//!   the job's members are known, and every entry expires after its window.
//!
//! # Shape
//! [`Tally`] is a pure state machine, clock injected: [`Tally::step`] takes
//! the time and an [`Event`] and returns the [`Action`]s to take (read a
//! job's members from etcd, revoke a lease). The replica's I/O loop
//! ([`crate::ha`]) does them and feeds the answers back.
//!
//! # Agent-only rendezvous
//! There every agent asks only its own embedded replica, so one replica
//! hears one agent. Its replica therefore also writes each complaint to
//! etcd (a key per complaining node, on a short lease; [`crate::ha`]) and,
//! when it reads a job's members, steps every replica's complaints into
//! its tally as [`Event::Complaint`]s: the count is the same whichever
//! replica the nodes asked.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::job::SESSION_BYTES;
use accel_wire::auth::constant_time_eq;

/// Jobs whose complaints are tracked at once.
pub const MAX_JOBS: usize = 256;
/// Complaints kept per job while its members are not known yet.
pub const MAX_UNVERIFIED: usize = 4096;
/// Least time between two deposals (of different terms).
pub const MIN_BETWEEN: Duration = Duration::from_secs(10);
/// How long complaints count when the job has no drop limit.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(15);
/// Shortest and longest window complaints count for.
const WINDOW_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(120));
/// How long a job's members, once read, are trusted before read again.
pub const MEMBERS_FRESH: Duration = Duration::from_secs(2);
/// How long a read of a job's members may be outstanding before another.
const FETCH_PATIENCE: Duration = Duration::from_secs(2);
/// Terms remembered as deposed.
const TERMS_KEPT: usize = 64;

/// A leader's term: its address and the etcd lease its election key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The address agents reach it at.
    pub addr: String,
    /// Its lease id.
    pub lease: i64,
}

/// A job's members as its record in etcd holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    /// Node ids and their session secrets.
    pub nodes: BTreeMap<String, [u8; SESSION_BYTES]>,
    /// The job's drop limit, if any: the window complaints count in.
    pub drop_limit: Option<Duration>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A node of `job` joined this follower saying the current leader,
    /// `leader`, went silent.
    Complaint {
        /// The job.
        job: String,
        /// The node.
        node: String,
        /// The session secret it presented.
        session: Vec<u8>,
        /// The leader it complains of (this follower's current leader).
        leader: Term,
    },
    /// The members of `job` were read from etcd (`None`: no such job).
    Members {
        /// The job.
        job: String,
        /// What etcd holds.
        members: Option<Members>,
    },
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the members of `job` from etcd, then step [`Event::Members`].
    Fetch {
        /// The job.
        job: String,
    },
    /// Revoke the lease of `leader`: most nodes of `job` cannot reach it.
    Depose {
        /// The leader.
        leader: Term,
        /// The job whose nodes complained.
        job: String,
        /// How many of its nodes complained.
        complained: usize,
        /// Of how many.
        of: usize,
    },
}

/// One job's complaints about one term.
#[derive(Debug)]
struct JobTally {
    /// The term complained of.
    term: Term,
    /// Node -> (when it last complained, the secret it presented).
    complaints: BTreeMap<String, (Instant, [u8; SESSION_BYTES])>,
    /// The members, and when they were read.
    members: Option<(Instant, Members)>,
    /// Since when a read of the members is outstanding.
    fetching: Option<Instant>,
    /// When a complaint last came.
    heard: Instant,
}

impl JobTally {
    fn window(&self) -> Duration {
        let limit = self
            .members
            .as_ref()
            .and_then(|(_, m)| m.drop_limit)
            .unwrap_or(DEFAULT_WINDOW);
        limit.clamp(WINDOW_BOUNDS.0, WINDOW_BOUNDS.1)
    }

    /// Members whose complaint, with their secret, is within the window;
    /// and how many members there are.
    fn count(&self, now: Instant) -> (usize, usize) {
        let Some((_, members)) = &self.members else {
            return (0, 0);
        };
        let window = self.window();
        let complained = self
            .complaints
            .iter()
            .filter(|(node, (at, secret))| {
                now.saturating_duration_since(*at) <= window
                    && members
                        .nodes
                        .get(*node)
                        .is_some_and(|s| constant_time_eq(s, secret))
            })
            .count();
        (complained, members.nodes.len())
    }
}

/// The complaints a follower has heard, and the deposals it made.
#[derive(Debug, Default)]
pub struct Tally {
    jobs: BTreeMap<String, JobTally>,
    /// Terms this replica deposed (their lease ids), the latest last.
    deposed: VecDeque<i64>,
    /// When it last deposed a leader.
    last_deposal: Option<Instant>,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Self {
        Self::default()
    }

    /// Jobs tracked now.
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Takes `event` at `now`; returns what to do.
    pub fn step(&mut self, now: Instant, event: Event) -> Vec<Action> {
        self.expire(now);
        match event {
            Event::Complaint {
                job,
                node,
                session,
                leader,
            } => self.complaint(now, job, node, &session, leader),
            Event::Members { job, members } => {
                let Some(t) = self.jobs.get_mut(&job) else {
                    return Vec::new();
                };
                t.fetching = None;
                match members {
                    Some(m) => {
                        // Complaints of nodes that are not members never count.
                        t.complaints.retain(|n, _| m.nodes.contains_key(n));
                        t.members = Some((now, m));
                    }
                    None => {
                        t.complaints.clear();
                        t.members = Some((
                            now,
                            Members {
                                nodes: BTreeMap::new(),
                                drop_limit: None,
                            },
                        ));
                    }
                }
                self.decide(now, &job)
            }
        }
    }

    fn complaint(
        &mut self,
        now: Instant,
        job: String,
        node: String,
        session: &[u8],
        leader: Term,
    ) -> Vec<Action> {
        let Ok(secret) = <[u8; SESSION_BYTES]>::try_from(session) else {
            // No member holds a secret of another length.
            return Vec::new();
        };
        if self.deposed.contains(&leader.lease) || leader.addr.is_empty() {
            return Vec::new();
        }
        if !self.jobs.contains_key(&job) && self.jobs.len() >= MAX_JOBS {
            // The least recently heard of makes room.
            if let Some(oldest) = self
                .jobs
                .iter()
                .min_by_key(|(_, t)| t.heard)
                .map(|(j, _)| j.clone())
            {
                self.jobs.remove(&oldest);
            }
        }
        let t = self.jobs.entry(job.clone()).or_insert_with(|| JobTally {
            term: leader.clone(),
            complaints: BTreeMap::new(),
            members: None,
            fetching: None,
            heard: now,
        });
        if t.term != leader {
            // A new term: complaints about the last one say nothing of it.
            t.term = leader;
            t.complaints.clear();
        }
        t.heard = now;
        let known = t.members.as_ref().map(|(_, m)| m.nodes.contains_key(&node));
        match known {
            Some(false) => {}
            Some(true) => {
                t.complaints.insert(node, (now, secret));
            }
            None => {
                if t.complaints.len() < MAX_UNVERIFIED || t.complaints.contains_key(&node) {
                    t.complaints.insert(node, (now, secret));
                }
            }
        }
        let stale = t
            .members
            .as_ref()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= MEMBERS_FRESH);
        let waiting = t
            .fetching
            .is_some_and(|at| now.saturating_duration_since(at) < FETCH_PATIENCE);
        let mut actions = Vec::new();
        if stale && !waiting {
            t.fetching = Some(now);
            actions.push(Action::Fetch { job: job.clone() });
        }
        actions.extend(self.decide(now, &job));
        actions
    }

    /// Deposes the leader if most of `job`'s members complained of it.
    fn decide(&mut self, now: Instant, job: &str) -> Vec<Action> {
        let Some(t) = self.jobs.get(job) else {
            return Vec::new();
        };
        if self.deposed.contains(&t.term.lease) {
            return Vec::new();
        }
        let (complained, of) = t.count(now);
        if of == 0 || complained * 2 <= of {
            return Vec::new();
        }
        if self
            .last_deposal
            .is_some_and(|at| now.saturating_duration_since(at) < MIN_BETWEEN)
        {
            return Vec::new();
        }
        let leader = t.term.clone();
        self.last_deposal = Some(now);
        if self.deposed.len() >= TERMS_KEPT {
            self.deposed.pop_front();
        }
        self.deposed.push_back(leader.lease);
        // Every job's complaints were about a term that is over now.
        self.jobs.retain(|_, t| t.term.lease != leader.lease);
        vec![Action::Depose {
            leader,
            job: job.to_owned(),
            complained,
            of,
        }]
    }

    /// Forgets jobs not heard of for their window.
    fn expire(&mut self, now: Instant) {
        self.jobs.retain(|_, t| {
            let window = t.window();
            t.complaints
                .retain(|_, (at, _)| now.saturating_duration_since(*at) <= window);
            now.saturating_duration_since(t.heard) <= window
        });
    }

    /// Which jobs are tracked, for tests.
    #[cfg(test)]
    fn tracked(&self) -> std::collections::BTreeSet<String> {
        self.jobs.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests;
