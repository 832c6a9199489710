//! Joining a job: new nodes, spares, reconnecting members, and the
//! placeholders a relearned job keeps for members that have not come back.

use std::time::Instant;

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::{joined, Job, JobConfig, JoinError, Member, Outbound, Phase, ABSENT};

impl Job {
    /// A node joins, or a member reconnects (`req.resume`). On success it is
    /// told which round to get ready for, or that its round goes on.
    pub fn join(
        &mut self,
        now: Instant,
        node_id: &str,
        req: &pb::JoinRequest,
    ) -> Result<Vec<Outbound>, JoinError> {
        match self.phase {
            Phase::Succeeded => return Err(self.finished("succeeded")),
            Phase::Failed(_) => return Err(self.finished("failed")),
            _ => {}
        }
        self.check_config(&JobConfig::from_join(req))?;
        if self.members.contains_key(node_id) {
            if req.resume.is_none() {
                return Err(JoinError::DuplicateNode {
                    job: self.id.clone(),
                    node: node_id.to_owned(),
                });
            }
            return Ok(self.reattach(now, node_id, req));
        }
        // Checked before a reconnecting node may claim its place, too.
        if let Some(rank) = req.node_rank.filter(|r| *r >= self.config.max_nodes) {
            return Err(JoinError::RankOutOfRange {
                job: self.id.clone(),
                rank,
                nnodes: self.config.max_nodes,
            });
        }
        if let Some(out) = self.claim_absent(now, node_id, req) {
            return Ok(out);
        }
        if let Some(rank) = req.node_rank {
            if let Some(holder) = self
                .members
                .values()
                .find(|m| m.requested_rank == Some(rank))
            {
                return Err(JoinError::DuplicateRank {
                    job: self.id.clone(),
                    rank,
                    holder: holder.hostname.clone(),
                });
            }
        }
        self.insert(now, node_id.to_owned(), req.hostname.clone(), req.node_rank);
        let mut out = vec![joined(node_id, self.round, false)];
        if self.phase == Phase::Running {
            if (self.participants.len() as u32) < self.config.max_nodes {
                // A node arriving while a round with free slots runs: re-form with it.
                out.extend(self.restart(format!("host '{}' joined the job", req.hostname), false));
            } else {
                // The round is full: the newcomer waits as a spare for a freed slot.
                out.push(Outbound {
                    to: node_id.to_owned(),
                    event: Kind::Waiting(self.waiting(now, true)),
                });
            }
        }
        Ok(out)
    }

    /// A member reconnecting: it goes on if its round is still the running one.
    fn reattach(&mut self, now: Instant, node_id: &str, req: &pb::JoinRequest) -> Vec<Outbound> {
        if let Some(m) = self.members.get_mut(node_id) {
            m.last_seen = now;
            m.hostname.clone_from(&req.hostname);
        }
        let resumed = self.phase == Phase::Running
            && req.resume.as_ref().is_some_and(|r| r.round == self.round)
            && self.members.get(node_id).is_some_and(|m| m.rank.is_some());
        vec![joined(node_id, self.round, resumed)]
    }

    /// A relearned job: the reconnecting node takes back its placeholder.
    fn claim_absent(
        &mut self,
        now: Instant,
        node_id: &str,
        req: &pb::JoinRequest,
    ) -> Option<Vec<Outbound>> {
        // A static node's place is its requested rank: it claims only that one.
        let resume = req.resume.as_ref().filter(|r| {
            self.phase == Phase::Running
                && r.round == self.round
                && req.node_rank.is_none_or(|n| n == r.node_rank)
        })?;
        let slot = self.participants.get_mut(resume.node_rank as usize)?;
        if !slot.starts_with(ABSENT) {
            return None;
        }
        let placeholder = std::mem::replace(slot, node_id.to_owned());
        self.members.remove(&placeholder);
        self.insert(now, node_id.to_owned(), req.hostname.clone(), req.node_rank);
        if let Some(m) = self.members.get_mut(node_id) {
            m.rank = Some(resume.node_rank);
        }
        Some(vec![joined(node_id, self.round, true)])
    }

    pub(super) fn insert(
        &mut self,
        now: Instant,
        node_id: String,
        hostname: String,
        requested_rank: Option<u32>,
    ) {
        self.next_seq += 1;
        let member = Member {
            hostname,
            requested_rank,
            ready: None,
            rank: None,
            succeeded: false,
            last_seen: now,
            joined_seq: self.next_seq,
        };
        self.members.insert(node_id, member);
    }
}
