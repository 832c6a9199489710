//! A job's state as plain data, for a [`crate::store::JobStore`]: what a new
//! server process needs to continue the job where this one left it.
//!
//! A [`Job`] holds instants on this process's monotonic clock, which mean
//! nothing to another process. A record keeps each one as an offset from the
//! moment the record was taken (negative: in the past), and
//! [`Job::restore`] rebases the offsets onto its own `now`. The time between
//! taking a record and restoring it is therefore elided: a member's last sign
//! of life, a last call, a finished job's age are as they were when the
//! record was taken, so a failover does not by itself drop members for
//! silence (they could not reach any server meanwhile) and a new leader gives
//! every deadline the same time left.
//!
//! The record carries the members' session secrets: a resuming node must
//! present its secret to the new server as to the old one. A store keeps
//! records where only the rendezvous servers can read them.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;

use super::{Job, JobConfig, Member, Phase, Session, SESSION_BYTES};

/// An instant as microseconds after the record was taken (negative: before).
pub type Offset = i64;

/// One member of a recorded job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// The agent's host name.
    pub hostname: String,
    /// Its topology path (empty: none given).
    pub topology: String,
    /// Static rendezvous: the rank it asked for.
    pub requested_rank: Option<u32>,
    /// Its offer for the forming round.
    pub ready: Option<(String, u32)>,
    /// Its rank in the running (or last) round.
    pub rank: Option<u32>,
    /// Its workers succeeded in the running round.
    pub succeeded: bool,
    /// Its last sign of life.
    pub last_seen: Offset,
    /// Where its calls came from.
    pub seen_from: Option<IpAddr>,
    /// Its session secret.
    pub session: [u8; SESSION_BYTES],
    /// Order of arrival.
    pub joined_seq: u64,
}

/// One job's whole state.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// The job id (`rdzv_id`).
    pub id: String,
    /// The settings every node agrees on.
    pub config: JobConfig,
    /// Where the job is in its life.
    pub phase: Phase,
    /// The current round.
    pub round: u64,
    /// Restarts consumed from the budget.
    pub restart_count: u32,
    /// Members by node id, in id order.
    pub members: Vec<(String, MemberRecord)>,
    /// Node ids of the running (or last) round, in node-rank order.
    pub participants: Vec<String>,
    /// Members ready for the forming round.
    pub ready: u32,
    /// Participants whose workers succeeded.
    pub succeeded: usize,
    /// The first failure of the latest failed round.
    pub last_failure: Option<String>,
    /// The running round's first failure.
    pub root_cause: Option<pb::Failure>,
    /// A failed job's agents' exit code, when a "do not restart" code ended it.
    pub exit_code: Option<i32>,
    /// When the job finished.
    pub finished_at: Option<Offset>,
    /// The next member's arrival number.
    pub next_seq: u64,
    /// Since when MIN members are ready.
    pub min_ready_since: Option<Offset>,
    /// When progress was last sent.
    pub progress_sent: Option<Offset>,
    /// When the next liveness check is due.
    pub next_liveness: Option<Offset>,
    /// Since when the job has had no members.
    pub empty_since: Option<Offset>,
    /// Placeholders of a relearned job not claimed yet.
    pub absent: u32,
    /// Benched hosts: host, since, until, why, and whether it is a copy of
    /// another job's bench (a server-wide quarantine).
    pub benched: Vec<(String, Offset, Offset, String, bool)>,
    /// Hosts' failures counted towards a bench, oldest first.
    pub failure_counts: Vec<(String, Vec<Offset>)>,
    /// Hosts' own benches in a row, and when the last one ends (a host
    /// benched again soon stays out longer).
    pub bench_repeats: Vec<(String, u32, Offset)>,
    /// The training progress reported, and the no-progress count.
    pub progress: super::progress::Progress,
    /// Where the job's time went.
    pub goodput: super::goodput::Stored,
    /// A store found the job's last change half-written (its leader stopped
    /// between two transactions of it): some values are from before that
    /// change, some after. Never set by [`Job::record`].
    pub torn: bool,
}

pub(super) fn offset(at: Instant, now: Instant) -> Offset {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match at.checked_duration_since(now) {
        Some(ahead) => micros(ahead),
        None => -micros(now.duration_since(at)),
    }
}

pub(super) fn instant(offset: Offset, now: Instant) -> Instant {
    let by = Duration::from_micros(offset.unsigned_abs());
    let at = match offset >= 0 {
        true => now.checked_add(by),
        false => now.checked_sub(by),
    };
    // An offset this clock cannot express is clamped to now: the deadline
    // it stood for is due at once (a past instant) or soon (a future one).
    at.unwrap_or(now)
}

impl Job {
    /// This job's state at `now`, as data.
    pub fn record(&self, now: Instant) -> JobRecord {
        let at = |t: Option<Instant>| t.map(|t| offset(t, now));
        JobRecord {
            id: self.id.clone(),
            config: self.config,
            phase: self.phase.clone(),
            round: self.round,
            restart_count: self.restart_count,
            members: self
                .members
                .iter()
                .map(|(id, m)| {
                    let record = MemberRecord {
                        hostname: m.hostname.clone(),
                        topology: m.topology.to_string(),
                        requested_rank: m.requested_rank,
                        ready: m.ready.clone(),
                        rank: m.rank,
                        succeeded: m.succeeded,
                        last_seen: offset(m.last_seen, now),
                        seen_from: m.seen_from,
                        session: m.session.bytes(),
                        joined_seq: m.joined_seq,
                    };
                    (id.clone(), record)
                })
                .collect(),
            participants: self.participants.clone(),
            ready: self.ready,
            succeeded: self.succeeded,
            last_failure: self.last_failure.clone(),
            root_cause: self.root_cause.clone(),
            exit_code: self.exit_code,
            finished_at: at(self.finished_at),
            next_seq: self.next_seq,
            min_ready_since: at(self.min_ready_since),
            progress_sent: at(self.progress_sent),
            next_liveness: at(self.next_liveness),
            empty_since: at(self.empty_since),
            absent: self.absent,
            benched: self
                .quarantine
                .benched()
                .map(|(h, b)| {
                    let (since, until) = (offset(b.since, now), offset(b.until, now));
                    (h.clone(), since, until, b.reason.clone(), b.shared)
                })
                .collect(),
            failure_counts: self
                .quarantine
                .counts()
                .map(|(h, at)| (h.clone(), at.iter().map(|t| offset(*t, now)).collect()))
                .collect(),
            bench_repeats: self
                .quarantine
                .repeats()
                .map(|(h, r)| (h.clone(), r.times, offset(r.until, now)))
                .collect(),
            // The best step and the count; the current round's reports
            // are heard again by whoever continues the job.
            progress: super::progress::Progress {
                round: Default::default(),
                checkpoints: Default::default(),
                ended_at: None,
                hang_timeouts: Default::default(),
                failing: None,
                ..self.progress.clone()
            },
            goodput: self.goodput.store(now),
            torn: false,
        }
    }

    /// The job a record describes, its instants rebased onto `now`. The
    /// counters that follow from the members (ready, unclaimed placeholders)
    /// are counted again rather than trusted, so a record that disagrees
    /// with itself cannot break the state machine's invariants.
    pub fn restore(record: JobRecord, now: Instant) -> Self {
        let at = |t: Option<Offset>| t.map(|t| instant(t, now));
        let members = record
            .members
            .into_iter()
            .map(|(id, m)| {
                let member = Member {
                    hostname: m.hostname,
                    topology: m.topology.into(),
                    requested_rank: m.requested_rank,
                    ready: m.ready,
                    rank: m.rank,
                    succeeded: m.succeeded,
                    last_seen: instant(m.last_seen, now),
                    seen_from: m.seen_from,
                    session: Session::from_bytes(m.session),
                    joined_seq: m.joined_seq,
                    learned_round: None,
                };
                (id, member)
            })
            .collect();
        let forming = record.phase == super::Phase::Forming;
        let running = record.phase == super::Phase::Running;
        let mut job = Self {
            id: record.id,
            config: record.config,
            phase: record.phase,
            round: record.round,
            restart_count: record.restart_count,
            members,
            participants: record.participants,
            slot_topologies: Vec::new(),
            ready: record.ready,
            succeeded: record.succeeded,
            last_failure: record.last_failure,
            root_cause: record.root_cause,
            exit_code: record.exit_code,
            finished_at: at(record.finished_at),
            next_seq: record.next_seq,
            min_ready_since: at(record.min_ready_since),
            progress_sent: at(record.progress_sent),
            next_liveness: at(record.next_liveness),
            empty_since: at(record.empty_since),
            absent: record.absent,
            // A node of the last round gets the drop limit from the load.
            forming_since: forming.then_some(now),
            held_until: None,
            placeholder_lost: false,
            quarantine_policy: None,
            quarantine: super::Quarantine::default(),
            benched: 0,
            new_benches: Vec::new(),
            running_since: running.then_some(now),
            ran: false,
            // Not stored: the loading leader gives every node the whole
            // drop limit, and sees a mass silence anew.
            held: None,
            grow_at: None,
            vouched_all: None,
            progress: record.progress,
            goodput: super::goodput::Goodput::restore(record.goodput, now),
            stragglers: Default::default(),
        };
        for (host, since, until, reason, shared) in record.benched {
            job.quarantine.restore_bench(
                instant(since, now),
                &host,
                instant(until, now),
                reason,
                shared,
            );
        }
        for (host, at) in record.failure_counts {
            let at = at.into_iter().map(|t| instant(t, now)).collect();
            job.quarantine.restore_count(host, at);
        }
        for (host, times, until) in record.bench_repeats {
            let until = instant(until, now);
            let repeat = super::quarantine::Repeat { times, until };
            job.quarantine.restore_repeat(host, repeat);
        }
        job.recount_benched();
        job.absent = job
            .members
            .keys()
            .filter(|id| id.starts_with(super::ABSENT))
            .count() as u32;
        job.succeeded = job.succeeded.min(job.participants.len());
        // The segments of the last round's places, by the ranks its nodes
        // still hold (a place whose node departed before the record was
        // taken, or a relearned job's placeholder, has none, and closes).
        let max = job.config.max_nodes as usize;
        let mut slots: Vec<Option<Arc<str>>> = Vec::new();
        for (id, m) in &job.members {
            let Some(rank) = m.rank.map(|r| r as usize).filter(|r| *r < max) else {
                continue;
            };
            if id.starts_with(super::ABSENT) {
                continue;
            }
            if slots.len() <= rank {
                slots.resize(rank + 1, None);
            }
            slots[rank] = Some(m.topology.clone());
        }
        job.slot_topologies = slots;
        job
    }
}
