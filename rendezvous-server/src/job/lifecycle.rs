//! The parts of a job's life that every operation shares: applying
//! [`decide`], completing and restarting rounds, finishing the job, and the
//! progress and events it sends.

use std::collections::HashSet;
use std::time::Instant;

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::{
    decide, Decision, Job, JobConfig, JoinError, Outbound, Phase, ABSENT, HOSTS_LISTED,
    PROGRESS_EVERY,
};

impl Job {
    /// Applies [`decide`]: completes the round, or reports progress when due.
    pub(super) fn step(&mut self, now: Instant) -> Vec<Outbound> {
        self.track_min_ready(now);
        match decide(now, self) {
            Decision::Complete(order) => self.complete(now, order),
            Decision::Wait { .. } if self.progress_due(now) => {
                self.progress_sent = Some(now);
                let waiting = self.waiting(now, false);
                self.broadcast(Kind::Waiting(waiting))
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn progress_due(&self, now: Instant) -> bool {
        self.phase == Phase::Forming
            && self
                .progress_sent
                .is_none_or(|t| now.saturating_duration_since(t) >= PROGRESS_EVERY)
    }

    pub(super) fn track_min_ready(&mut self, now: Instant) {
        if self.phase != Phase::Forming || self.ready < self.config.min_nodes {
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
            needed: self.config.min_nodes,
            hosts: self
                .members
                .values()
                .take(HOSTS_LISTED)
                .map(|m| m.hostname.clone())
                .collect(),
            min_nodes: self.config.min_nodes,
            max_nodes: self.config.max_nodes,
            last_call_ms: if spare { None } else { last_call },
            spare,
            members: self.members.len() as u32,
        }
    }

    pub(super) fn complete(&mut self, now: Instant, order: Vec<String>) -> Vec<Outbound> {
        let nnodes = order.len() as u32;
        let nproc = self.config.nproc_per_node;
        let (master_addr, master_port) = order
            .first()
            .and_then(|id| self.members[id].ready.clone())
            .unwrap_or_default();
        let mut out = Vec::with_capacity(self.members.len());
        for (id, rank) in order.iter().zip(0u32..) {
            out.push(Outbound {
                to: id.clone(),
                event: Kind::RoundComplete(pb::RoundComplete {
                    round: self.round,
                    node_rank: rank,
                    nnodes,
                    world_size: nnodes * nproc,
                    base_rank: rank * nproc,
                    restart_count: self.restart_count,
                    max_restarts: self.config.max_restarts,
                    master_addr: master_addr.clone(),
                    master_port,
                    member_addrs: Vec::new(),
                }),
            });
        }
        let ranks: std::collections::HashMap<&String, u32> = order.iter().zip(0u32..).collect();
        let mut spares = Vec::new();
        for (id, m) in self.members.iter_mut() {
            m.rank = ranks.get(id).copied();
            m.succeeded = false;
            if m.rank.is_some() {
                m.ready = None;
            } else {
                spares.push(id.clone());
            }
        }
        self.ready = self.members.values().filter(|m| m.ready.is_some()).count() as u32;
        self.participants = order;
        self.succeeded = 0;
        self.phase = Phase::Running;
        self.min_ready_since = None;
        self.progress_sent = None;
        let waiting = self.waiting(now, true);
        out.extend(spares.into_iter().map(|to| Outbound {
            to,
            event: Kind::Waiting(waiting.clone()),
        }));
        out
    }

    pub(super) fn restart(&mut self, reason: String, counted: bool) -> Vec<Outbound> {
        let old = self.round;
        self.round += 1;
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
        let event = match &phase {
            Phase::Failed(reason) => Kind::JobFailed(pb::JobFailed {
                round: self.round,
                reason: reason.clone(),
                root_cause: self.root_cause.clone(),
            }),
            _ => Kind::JobSucceeded(pb::JobSucceeded { round: self.round }),
        };
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

    pub(super) fn finished(&self, outcome: &'static str) -> JoinError {
        JoinError::Finished {
            job: self.id.clone(),
            outcome,
        }
    }

    pub(super) fn check_config(&self, other: &JobConfig) -> Result<(), JoinError> {
        let nnodes = |c: &JobConfig| {
            if c.min_nodes == c.max_nodes {
                c.max_nodes.to_string()
            } else {
                format!("{}:{}", c.min_nodes, c.max_nodes)
            }
        };
        let c = &self.config;
        let checks = [
            ("--nnodes", nnodes(c), nnodes(other)),
            (
                "--nproc-per-node",
                c.nproc_per_node.to_string(),
                other.nproc_per_node.to_string(),
            ),
            (
                "--max-restarts",
                c.max_restarts.to_string(),
                other.max_restarts.to_string(),
            ),
        ];
        for (flag, job_value, node_value) in checks {
            if job_value != node_value {
                return Err(JoinError::Mismatch {
                    job: self.id.clone(),
                    flag,
                    job_value,
                    node_value,
                });
            }
        }
        Ok(())
    }
}
