//! How a round forms and ends, whatever operation moved it: applying
//! [`decide`] (completing the round, or reporting progress when due),
//! assigning node ranks and telling every member its place, restarting as
//! the next round, finishing the job, and sending one event to every member.
//! The operations in `job.rs` and `membership.rs` change who is ready, failed
//! or present; this module turns that into the round's next state.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::placement::segments;
use super::{decide, invariants, Decision, Job, Outbound, Phase, ABSENT};

/// Host names listed in a progress report.
const HOSTS_LISTED: usize = 16;

impl Job {
    /// Applies [`decide`]: completes the round, or reports progress when due.
    pub(super) fn step(&mut self, now: Instant) -> Vec<Outbound> {
        self.track_min_ready(now);
        if self.phase == Phase::Forming {
            let present = self.members.len().saturating_sub(self.benched as usize);
            let short = present < self.config.needed() as usize;
            self.goodput.forming(now, short);
        }
        match decide(now, self) {
            Decision::Complete(order) => self.complete(now, order),
            Decision::Wait { .. } if self.progress_due(now) => {
                self.progress_sent = Some(now);
                let waiting = self.waiting(now, false);
                let mut out = self.broadcast(Kind::Waiting(waiting));
                if self.benched > 0 {
                    // A benched node is told why it waits with every
                    // progress report, not only with its own offer's.
                    for o in &mut out {
                        if self.members.get(&o.to).is_some_and(|m| self.is_benched(m)) {
                            o.event = Kind::Waiting(self.waiting_of(now, &o.to, false));
                        }
                    }
                }
                out
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn progress_due(&self, now: Instant) -> bool {
        self.phase == Phase::Forming
            && self
                .progress_sent
                .is_none_or(|t| now.saturating_duration_since(t) >= self.progress_every())
    }

    pub(super) fn track_min_ready(&mut self, now: Instant) {
        if self.phase != Phase::Forming || self.ready < self.config.needed() {
            self.min_ready_since = None;
        } else if self.min_ready_since.is_none() {
            self.min_ready_since = Some(now);
        }
    }

    /// Progress for the members (`spare`: the round is full, this node waits).
    pub(super) fn waiting(&self, now: Instant, spare: bool) -> pb::Waiting {
        let last_call = match decide(now, self) {
            Decision::Wait {
                last_call_ends: Some(t),
                ..
            } => Some(t.saturating_duration_since(now).as_millis() as u64),
            _ => None,
        };
        pb::Waiting {
            round: self.round,
            ready: self.ready,
            needed: self.config.needed(),
            // Names help in small jobs; in large ones a sample of 16 says
            // little and would be copied to every member.
            hosts: if self.members.len() <= 4 * HOSTS_LISTED {
                self.members
                    .values()
                    .take(HOSTS_LISTED)
                    .map(|m| m.hostname.clone())
                    .collect()
            } else {
                Vec::new()
            },
            min_nodes: self.config.min_nodes,
            max_nodes: self.config.max_nodes,
            last_call_ms: if spare { None } else { last_call },
            spare,
            members: self.members.len() as u32,
            quarantine: String::new(),
            quarantine_left_ms: 0,
            round_nodes: if spare {
                u32::try_from(self.participants.len()).unwrap_or(u32::MAX)
            } else {
                0
            },
        }
    }

    pub(super) fn complete(&mut self, now: Instant, order: Vec<String>) -> Vec<Outbound> {
        // Vouches and holds were for the last round's nodes.
        self.vouched_all = None;
        self.held = None;
        let nnodes = order.len() as u32;
        let nproc = self.config.nproc_per_node;
        let (master_addr, master_port) = order
            .first()
            .and_then(|id| self.members[id].ready.clone())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(self.members.len());
        let topologies: Vec<Arc<str>> = order
            .iter()
            .map(|id| self.members[id].topology.clone())
            .collect();
        let paths: Vec<&str> = topologies.iter().map(|t| &**t).collect();
        let segments = segments(&paths);
        for ((id, rank), (segment, first, len)) in order.iter().zip(0u32..).zip(segments) {
            out.push(Outbound {
                to: id.clone(),
                event: Kind::RoundComplete(pb::RoundComplete {
                    round: self.round,
                    node_rank: rank,
                    nnodes,
                    world_size: nnodes.saturating_mul(nproc),
                    base_rank: rank.saturating_mul(nproc),
                    restart_count: self.restart_count,
                    max_restarts: self.config.max_restarts,
                    master_addr: master_addr.clone(),
                    master_port,
                    member_addrs: if rank == 0 {
                        self.member_addrs(&order)
                    } else {
                        Vec::new()
                    },
                    segment,
                    segment_first_node: first,
                    segment_nodes: len,
                    // The registry fills it in (one per round, random).
                    peer_key: Vec::new(),
                }),
            });
        }
        let ranks: std::collections::HashMap<&String, u32> = order.iter().zip(0u32..).collect();
        invariants::round_formed(
            &ranks,
            order.len(),
            self.config.max_nodes,
            self.config.nnodes_multiple_of,
        );
        let mut spares = Vec::new();
        let benched: Vec<bool> = self.members.values().map(|m| self.is_benched(m)).collect();
        for (id, m) in self.members.iter_mut() {
            m.rank = ranks.get(id).copied();
            m.succeeded = false;
            if m.rank.is_some() {
                m.ready = None;
            } else {
                spares.push(id.clone());
            }
        }
        self.ready = self
            .members
            .values()
            .zip(&benched)
            .filter(|(m, b)| m.ready.is_some() && !**b)
            .count() as u32;
        self.participants = order;
        self.slot_topologies = topologies.into_iter().map(Some).collect();
        self.succeeded = 0;
        self.phase = Phase::Running;
        self.running_since = Some(now);
        self.goodput.round_started(now);
        self.min_ready_since = None;
        self.progress_sent = None;
        let waiting = self.waiting(now, true);
        for to in spares {
            let event = match self.benched > 0 {
                true => Kind::Waiting(self.waiting_of(now, &to, true)),
                false => Kind::Waiting(waiting.clone()),
            };
            out.push(Outbound { to, event });
        }
        out
    }

    /// Where the nodes of `order` are: the address each offered and the one
    /// its calls came from, without repeats (node rank 0's store admits them).
    fn member_addrs(&self, order: &[String]) -> Vec<String> {
        let mut seen = HashSet::new();
        let mut addrs = Vec::new();
        for m in order.iter().filter_map(|id| self.members.get(id)) {
            let offered = m.ready.as_ref().map(|(addr, _)| addr.clone());
            let from = m.seen_from.map(|ip| ip.to_string());
            for a in offered.into_iter().chain(from) {
                if !a.is_empty() && seen.insert(a.clone()) {
                    addrs.push(a);
                }
            }
        }
        addrs
    }

    /// Starts the next round now, spending nothing of the budget: for a job
    /// whose stored state is not to be trusted as a whole
    /// ([`super::JobRecord::torn`]). Every member is asked to offer itself
    /// again; nothing happens to a job that is over.
    pub fn reform(&mut self, now: Instant, reason: String) -> Vec<Outbound> {
        if self.phase.is_terminal() {
            return Vec::new();
        }
        self.restart(now, reason, false)
    }

    /// Ends the running round (or the forming one) and starts forming the
    /// next; `counted`: a worker failure, which spends one restart of the
    /// budget (the caller checked that one is left).
    /// The restart's events left for the nodes at `now` (after the store
    /// took the change, which may take a while): the forming round waits
    /// for the last round's nodes a drop limit from here, not from the
    /// decision, since a node stops its workers within its fence of
    /// hearing it (see [`super::decide`]).
    pub fn restart_delivered(&mut self, now: Instant) {
        if self.phase == Phase::Forming {
            if let Some(since) = &mut self.forming_since {
                *since = (*since).max(now);
            }
        }
    }

    pub(super) fn restart(&mut self, now: Instant, reason: String, counted: bool) -> Vec<Outbound> {
        let old = self.round;
        let used = self.restart_count;
        // The new round takes every ready node anyway.
        self.grow_at = None;
        if counted {
            self.restart_count = used.saturating_add(1);
        }
        invariants::budget(used, self.restart_count, self.config.max_restarts, counted);
        if !counted {
            // A counted restart's round was judged in `worker_failed`.
            self.progress.reformed();
        }
        self.goodput.restarted(
            now,
            old,
            &reason,
            self.progress.ended_at,
            self.progress.checkpoint,
        );
        self.round_ended(now);
        self.stragglers = Default::default();
        self.forming_since = Some(now);
        self.round = self.round.saturating_add(1);
        invariants::next_round(old, self.round);
        self.phase = Phase::Forming;
        self.succeeded = 0;
        self.ready = 0;
        self.progress_sent = None;
        let present: HashSet<&String> = self.members.keys().collect();
        self.participants.retain(|p| present.contains(p));
        for m in self.members.values_mut() {
            m.ready = None;
            m.succeeded = false;
        }
        self.broadcast(Kind::RestartRequested(pb::RestartRequested {
            round: old,
            next_round: self.round,
            reason,
            counted,
        }))
    }

    pub(super) fn finish(&mut self, now: Instant, phase: Phase) -> Vec<Outbound> {
        let succeeded = !matches!(phase, Phase::Failed(_));
        self.goodput.finished(now, succeeded, self.progress.best);
        let goodput = Some(Box::new(self.goodput_message(now, 0)));
        let event = match &phase {
            Phase::Failed(reason) => Kind::JobFailed(pb::JobFailed {
                round: self.round,
                reason: reason.clone(),
                root_cause: self.root_cause.clone(),
                exit_code: self.exit_code,
                goodput,
            }),
            _ => Kind::JobSucceeded(pb::JobSucceeded {
                round: self.round,
                goodput,
            }),
        };
        self.round_ended(now);
        self.stragglers = Default::default();
        self.phase = phase;
        self.finished_at = Some(now);
        self.broadcast(event)
    }

    pub(super) fn broadcast(&self, event: Kind) -> Vec<Outbound> {
        self.members
            .keys()
            .filter(|id| !id.starts_with(ABSENT))
            .map(|id| Outbound {
                to: id.clone(),
                event: event.clone(),
            })
            .collect()
    }
}
