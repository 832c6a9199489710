//! Joining a job: new nodes, spares, reconnecting members, and the
//! placeholders a relearned job keeps for members that have not come back.

use std::time::Instant;

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::{joined, Job, JobConfig, JoinRefused, Member, Outbound, Phase, Session, ABSENT};

impl Job {
    /// A node joins, or a member reconnects (`req.resume`, with the secret it
    /// was given in `req.session`). On success it is told which round to get
    /// ready for, or that its round goes on, and its session secret: `fresh`
    /// for a node new to the job (or claiming a relearned placeholder), its
    /// own for a reconnecting member.
    pub fn join(
        &mut self,
        now: Instant,
        node_id: &str,
        req: &pb::JoinRequest,
        fresh: Session,
    ) -> Result<Vec<Outbound>, JoinRefused> {
        match self.phase {
            Phase::Succeeded => return Err(self.finished("succeeded")),
            Phase::Failed(_) => return Err(self.finished("failed")),
            _ => {}
        }
        // The job's time counts from its first join.
        self.goodput.start(now);
        if let Some(m) = self.config.mismatch(&JobConfig::from_join(req)) {
            return Err(JoinRefused::Mismatch {
                job: self.id.clone(),
                flag: m.flag,
                job_value: m.job_value,
                node_value: m.node_value,
            });
        }
        if self.members.contains_key(node_id) {
            // A member may reconnect (resuming its round or not) only with
            // its secret; without one, the id is someone else's.
            if self.authorize(node_id, &req.session).is_err() {
                if req.resume.is_none() && req.session.is_empty() {
                    return Err(JoinRefused::DuplicateNode {
                        job: self.id.clone(),
                        node: node_id.to_owned(),
                    });
                }
                return Err(JoinRefused::WrongSession {
                    job: self.id.clone(),
                    node: node_id.to_owned(),
                });
            }
            return Ok(self.reattach(now, node_id, req));
        }
        // Checked before a reconnecting node may claim its place, too.
        if let Some(rank) = req.node_rank.filter(|r| *r >= self.config.max_nodes) {
            return Err(JoinRefused::RankOutOfRange {
                job: self.id.clone(),
                rank,
                nnodes: self.config.max_nodes,
            });
        }
        if let Some(out) = self.claim_absent(now, node_id, req, fresh) {
            return Ok(out);
        }
        if let Some(rank) = req.node_rank {
            if let Some(holder) = self
                .members
                .values()
                .find(|m| m.requested_rank == Some(rank))
            {
                return Err(JoinRefused::DuplicateRank {
                    job: self.id.clone(),
                    rank,
                    holder: holder.hostname.clone(),
                });
            }
        }
        self.insert(
            now,
            node_id.to_owned(),
            req.hostname.clone(),
            &req.topology,
            req.node_rank,
            fresh,
        );
        let mut out = vec![joined(node_id, self.round, false, fresh)];
        let benched = self
            .members
            .get(node_id)
            .is_some_and(|m| self.is_benched(m));
        if self.phase == Phase::Running && benched {
            // Quarantined: nothing to re-form for; it waits, told why.
            out.push(Outbound {
                to: node_id.to_owned(),
                event: Kind::Waiting(self.waiting_of(now, node_id, true)),
            });
        } else if self.phase == Phase::Running {
            if (self.participants.len() as u32) < self.usable()
                && self.config.scale_up_settle.is_zero()
            {
                // A node arriving while a round with free slots runs, and
                // with it enough for a larger round the job can use
                // (`--nnodes-multiple-of`): re-form with it.
                out.extend(self.restart(
                    now,
                    format!("host '{}' joined the job", req.hostname),
                    false,
                ));
            } else {
                // With --scale-up-settle the round grows once the nodes
                // that make the larger count have waited that long.
                self.settle_growth(now);
                // The round is full (or one more would not make a count
                // the job can use): the newcomer waits as a spare.
                out.push(Outbound {
                    to: node_id.to_owned(),
                    event: Kind::Waiting(self.waiting(now, true)),
                });
            }
        }
        Ok(out)
    }

    /// Notes that the running round may grow: with `--scale-up-settle`,
    /// it re-forms that long from now, unless already due sooner (see
    /// [`Job::settled`]).
    pub(super) fn settle_growth(&mut self, now: Instant) {
        if self.phase == Phase::Running
            && self.grow_at.is_none()
            && (self.participants.len() as u32) < self.usable()
        {
            self.grow_at = Some(now.checked_add(self.config.scale_up_settle).unwrap_or(now));
        }
    }

    /// A running round that could grow re-forms once its spares have
    /// waited `--scale-up-settle`, if they still make a larger usable count
    /// (one may have left meanwhile). Growth is armed only by what can make
    /// it (a join, a bench that ends, a leader taking the job over), never
    /// again by the re-form itself: a member that stays but never offers
    /// (so the re-formed round goes on without it) must not re-form the job
    /// every settle time.
    pub(super) fn settled(&mut self, now: Instant) -> Vec<Outbound> {
        if self.phase != Phase::Running || self.config.scale_up_settle.is_zero() {
            self.grow_at = None;
            return Vec::new();
        }
        let could = (self.participants.len() as u32) < self.usable();
        match self.grow_at {
            Some(t) if now >= t => {
                self.grow_at = None;
                if !could {
                    return Vec::new();
                }
                let to = self.usable();
                self.restart(
                    now,
                    format!(
                        "{} more node(s) waited {} (--scale-up-settle): the round grows to {to} nodes",
                        to as usize - self.participants.len(),
                        accel_input::duration_words(self.config.scale_up_settle)
                    ),
                    false,
                )
            }
            _ => Vec::new(),
        }
    }

    /// How many nodes a round could take now: the largest count the job
    /// can use of its members that are not benched (MAX at most). A running
    /// round smaller than this re-forms to grow.
    pub(super) fn usable(&self) -> u32 {
        let available = self.members.len().saturating_sub(self.benched as usize);
        self.config
            .allowed(u32::try_from(available).unwrap_or(u32::MAX))
    }

    /// A member reconnecting: it goes on if its round is still the running one.
    fn reattach(&mut self, now: Instant, node_id: &str, req: &pb::JoinRequest) -> Vec<Outbound> {
        let Some(m) = self.members.get_mut(node_id) else {
            return Vec::new();
        };
        m.last_seen = now;
        let renamed = m.hostname != req.hostname;
        m.hostname.clone_from(&req.hostname);
        let session = m.session;
        let resumed = self.phase == Phase::Running
            && req.resume.as_ref().is_some_and(|r| r.round == self.round)
            && m.rank.is_some();
        // Placed in the running round but not running it: it rejoined
        // before that round's RoundComplete reached it (it went to the
        // stream the rejoin replaced), and its offer for a running round is
        // ignored. The round cannot go on without its ranks: re-form,
        // spending nothing.
        let stranded = self.phase == Phase::Running && m.rank.is_some() && !resumed;
        // A node of the last round that still ran its workers learns of the
        // restart only now (the restart's events went to a stream it had
        // lost, or to a leader that died): it stops them within its fence
        // from now, so the forming round waits for it from now (once per
        // round: `Member::learned_round`).
        let learns = self.phase == Phase::Forming
            && m.rank.is_some()
            && m.ready.is_none()
            && req.resume.as_ref().is_some_and(|r| r.round < self.round)
            && m.learned_round != Some(self.round);
        if learns {
            m.learned_round = Some(self.round);
        }
        let mut out = vec![joined(node_id, self.round, resumed, session)];
        if learns {
            self.restart_delivered(now);
        }
        if renamed {
            // Its host may be benched, or no longer: the forming round may
            // complete now (found by the rdzv_job fuzz target).
            self.recount_benched();
            out.extend(self.step(now));
        }
        if stranded {
            let reason = format!("host '{}' rejoined without its round", req.hostname);
            out.extend(self.restart(now, reason, false));
        }
        out
    }

    /// A relearned job: the reconnecting node takes back its placeholder.
    fn claim_absent(
        &mut self,
        now: Instant,
        node_id: &str,
        req: &pb::JoinRequest,
        fresh: Session,
    ) -> Option<Vec<Outbound>> {
        // A static node's place is its requested rank: it claims only that one.
        let resume = req.resume.as_ref().filter(|r| {
            req.node_rank.is_none_or(|n| n == r.node_rank)
                && match self.phase {
                    Phase::Running => r.round == self.round,
                    // The relearned round restarted before this node came
                    // back (another node's failure, reported once back):
                    // it takes its place, and is told the job moved on, so
                    // that the round forms with it at once instead of
                    // waiting out the placeholder.
                    Phase::Forming => r.round.checked_add(1) == Some(self.round),
                    _ => false,
                }
        })?;
        let placeholder_id = format!("{ABSENT}{}", resume.node_rank);
        let at = match self.phase {
            Phase::Running => resume.node_rank as usize,
            // A restart keeps the last round's nodes in order, without
            // those gone: the placeholder's index is no longer its rank.
            _ => self
                .participants
                .iter()
                .position(|p| *p == placeholder_id)?,
        };
        let slot = self.participants.get(at)?;
        // Only a placeholder that still waits (a closed job's are gone from
        // the members), and only for a node that holds no other place in the
        // round (it could otherwise take part twice: fuzz_regressions.rs).
        if !slot.starts_with(ABSENT)
            || !self.members.contains_key(slot)
            || self.participants.iter().any(|p| p == node_id)
        {
            return None;
        }
        let placeholder = std::mem::replace(&mut self.participants[at], node_id.to_owned());
        self.members.remove(&placeholder);
        self.absent = self.absent.saturating_sub(1);
        if self.absent == 0 && !self.placeholder_lost {
            // Every node of the relearned round is back: none of them can
            // be running workers this server does not know of.
            self.held_until = None;
        }
        self.insert(
            now,
            node_id.to_owned(),
            req.hostname.clone(),
            &req.topology,
            req.node_rank,
            fresh,
        );
        if let Some(m) = self.members.get_mut(node_id) {
            m.rank = Some(resume.node_rank);
        }
        // The placeholder went without its counts (its made-up host name
        // could even be benched): count again.
        self.recount_benched();
        let resumed = self.phase == Phase::Running;
        Some(vec![joined(node_id, self.round, resumed, fresh)])
    }

    pub(super) fn insert(
        &mut self,
        now: Instant,
        node_id: String,
        hostname: String,
        topology: &str,
        requested_rank: Option<u32>,
        session: Session,
    ) {
        self.next_seq += 1;
        let member = Member {
            hostname,
            topology: topology.into(),
            requested_rank,
            ready: None,
            rank: None,
            succeeded: false,
            last_seen: now,
            seen_from: None,
            session,
            joined_seq: self.next_seq,
            learned_round: None,
        };
        if self.is_benched(&member) {
            self.benched += 1;
        }
        self.members.insert(node_id, member);
        self.empty_since = None;
        let first_check = match self.config.outage {
            // It may turn silent, and a mass silence begin, this soon.
            Some(_) => self.config.silent_after(),
            None => self.config.dead_after,
        };
        if let Some(limit) = first_check {
            // The newcomer can be lost (or turn silent) no sooner than this.
            let t = now.checked_add(limit).unwrap_or(now);
            self.next_liveness = Some(self.next_liveness.map_or(t, |x| x.min(t)));
        }
    }

    fn finished(&self, outcome: &'static str) -> JoinRefused {
        JoinRefused::Finished {
            job: self.id.clone(),
            outcome,
        }
    }
}
