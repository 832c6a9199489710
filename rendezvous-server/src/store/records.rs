//! A [`JobRecord`] as the keys and values of a key-value store
//! (`accel.rendezvous.store.v1`): one key for the job's counters and phase,
//! one per [`PARTICIPANTS_PER_KEY`] of the round's participants, one per
//! member.
//!
//! # Why a key per member
//! A 10,000-node job is megabytes as one value, over etcd's request limit
//! (1.5 MiB by default), and rewriting it for every join would cost O(n²)
//! bytes while the job forms. With a key per member, a join writes one small
//! member and the job's counters; only a completed or restarted round touches
//! every member. A store compares what it would write with what it wrote
//! last ([`Encoded`]) and writes only what differs.
//!
//! A member's last sign of life is not stored: it changes with every
//! keep-alive (which writes nothing) and its offset with every record taken.
//! A job restored from a store treats every member as seen at that moment,
//! so a failover never drops a member for silence it could not help.
//!
//! # Keys
//! `P/jobs/<job>/meta`, `P/jobs/<job>/participants/<i>`, `P/jobs/<job>/m/<node>`
//! under the store's prefix `P`. Ids are percent-escaped (`%`, `/` and
//! control characters), so no id can reach into another job's keys.
//!
//! # A change too large for one transaction
//! A store writes a job's change in one transaction when it fits. One that
//! does not (a round of thousands of nodes) is bracketed ([`marked`]): its
//! first transaction also puts `P/jobs/<job>/writing`, and the job's meta
//! and the marker's deletion go together in its last ([`Change::Commit`]). A
//! job loaded with the marker was left half-written by a leader that stopped
//! in between ([`JobRecord::torn`]): no node acted on that change (its events
//! wait for the whole write), but which of its parts the store holds is
//! unknown, so the new leader re-forms the job instead of trusting it.

use std::collections::BTreeMap;
use std::time::Duration;

use accel_proto::store::v1 as st;
use prost::Message;

use super::StoreError;
use crate::job::{JobConfig, JobRecord, MemberRecord, Phase, SESSION_BYTES};
use accel_wire::keys::{escape, unescape};

/// The record format this server writes and reads.
pub const FORMAT: u32 = 1;
/// Participants per value: 1,000 ids of at most 256 bytes stay far below
/// etcd's request limit (1.5 MiB by default), however large the job.
pub const PARTICIPANTS_PER_KEY: usize = 1000;
/// Most failure instants read per host of a quarantine count (at most
/// `--quarantine-after` are kept).
const MAX_COUNTED: usize = 100;

/// One job, encoded: the values a store holds for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    /// The job's phase, round, budget and counters.
    pub meta: Vec<u8>,
    /// The running (or last) round's node ids, in rank order, in values of
    /// [`PARTICIPANTS_PER_KEY`].
    pub participants: Vec<Vec<u8>>,
    /// Each member, by node id.
    pub members: BTreeMap<String, Vec<u8>>,
    /// Whether the half-written marker is there.
    pub writing: bool,
}

/// Most participant values of one job: far beyond any job the limits admit
/// (100,000 nodes are 100 values), so a damaged index cannot grow a job.
pub const MAX_PARTICIPANT_VALUES: usize = 1 << 20;

impl Encoded {
    /// Sets the value at `slot`; false for a participants index beyond
    /// [`MAX_PARTICIPANT_VALUES`] (nothing is set).
    pub fn set(&mut self, slot: &Slot, value: Vec<u8>) -> bool {
        match slot {
            Slot::Meta => self.meta = value,
            Slot::Participants(i) => {
                let i = *i as usize;
                if i >= MAX_PARTICIPANT_VALUES {
                    return false;
                }
                if self.participants.len() <= i {
                    self.participants.resize(i + 1, Vec::new());
                }
                self.participants[i] = value;
            }
            Slot::Member(node) => {
                self.members.insert(node.clone(), value);
            }
            Slot::Writing => self.writing = true,
        }
        true
    }
}

/// The key prefix of every job.
pub fn jobs_prefix(prefix: &str) -> String {
    format!("{prefix}/jobs/")
}

/// The key prefix of job `id`'s keys.
pub fn job_prefix(prefix: &str, id: &str) -> String {
    format!("{prefix}/jobs/{}/", escape(id))
}

/// Which of a job's values a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// [`Encoded::meta`].
    Meta,
    /// One value of [`Encoded::participants`].
    Participants(u32),
    /// One member.
    Member(String),
    /// The marker of a change written in several transactions.
    Writing,
}

impl Slot {
    /// The key of this slot of job `id`.
    pub fn key(&self, prefix: &str, id: &str) -> String {
        let job = job_prefix(prefix, id);
        match self {
            Slot::Meta => format!("{job}meta"),
            Slot::Participants(i) => format!("{job}participants/{i}"),
            Slot::Member(node) => format!("{job}m/{}", escape(node)),
            Slot::Writing => format!("{job}writing"),
        }
    }

    /// The job and slot a key under [`jobs_prefix`] names.
    pub fn parse(prefix: &str, key: &str) -> Option<(String, Slot)> {
        let rest = key.strip_prefix(&jobs_prefix(prefix))?;
        let (job, slot) = rest.split_once('/')?;
        let slot = match slot {
            "meta" => Slot::Meta,
            "writing" => Slot::Writing,
            s => match s.strip_prefix("participants/") {
                Some(i) => Slot::Participants(i.parse().ok()?),
                None => Slot::Member(unescape(s.strip_prefix("m/")?)?),
            },
        };
        Some((unescape(job)?, slot))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Encodes a record.
pub fn encode(r: &JobRecord) -> Encoded {
    let (phase, failed_reason) = match &r.phase {
        Phase::Forming => (0, String::new()),
        Phase::Running => (1, String::new()),
        Phase::Succeeded => (2, String::new()),
        Phase::Failed(reason) => (3, reason.clone()),
    };
    let meta = st::JobMeta {
        format: FORMAT,
        id: r.id.clone(),
        min_nodes: r.config.min_nodes,
        max_nodes: r.config.max_nodes,
        nproc_per_node: r.config.nproc_per_node,
        max_restarts: r.config.max_restarts,
        dead_after_us: r.config.dead_after.map_or(0, micros),
        outage_us: r.config.outage.map_or(0, micros),
        keep_alive_us: r.config.keep_alive.map_or(0, micros),
        max_no_progress_restarts: r.config.max_no_progress_restarts,
        nnodes_multiple_of: r.config.nnodes_multiple_of,
        scale_up_settle_us: micros(r.config.scale_up_settle),
        best_step: r.progress.best,
        no_progress_restarts: r.progress.stalled,
        checkpoint_step: r.progress.checkpoint,
        goodput: Some(stored_goodput(&r.goodput)),
        last_call_us: micros(r.config.last_call),
        no_restart_exit_code: r.config.no_restart_exit_code.map_or(0, u32::from),
        phase,
        failed_reason,
        round: r.round,
        restart_count: r.restart_count,
        ready: r.ready,
        succeeded: r.succeeded as u64,
        last_failure: r.last_failure.clone(),
        root_cause: r.root_cause.clone(),
        exit_code: r.exit_code,
        finished_at: r.finished_at,
        next_seq: r.next_seq,
        min_ready_since: r.min_ready_since,
        progress_sent: r.progress_sent,
        next_liveness: r.next_liveness,
        empty_since: r.empty_since,
        absent: r.absent,
        benched: r
            .benched
            .iter()
            .map(|(host, since, until, reason, shared)| st::Benched {
                host: host.clone(),
                since: *since,
                until: *until,
                reason: reason.clone(),
                shared: *shared,
            })
            .collect(),
        failure_counts: r
            .failure_counts
            .iter()
            .map(|(host, at)| st::FailureCount {
                host: host.clone(),
                at: at.clone(),
            })
            .collect(),
        bench_repeats: r
            .bench_repeats
            .iter()
            .map(|(host, times, until)| st::BenchRepeat {
                host: host.clone(),
                times: *times,
                until: *until,
            })
            .collect(),
    };
    let participants = r
        .participants
        .chunks(PARTICIPANTS_PER_KEY)
        .map(|ids| st::Participants { ids: ids.to_vec() }.encode_to_vec())
        .collect();
    let members = r
        .members
        .iter()
        .map(|(id, m)| {
            let (ready_addr, ready_port) = match &m.ready {
                Some((addr, port)) => (Some(addr.clone()), *port),
                None => (None, 0),
            };
            let member = st::Member {
                hostname: m.hostname.clone(),
                topology: m.topology.clone(),
                requested_rank: m.requested_rank,
                ready_addr,
                ready_port,
                rank: m.rank,
                succeeded: m.succeeded,
                seen_from: m.seen_from.map(|ip| ip.to_string()),
                session: m.session.to_vec(),
                joined_seq: m.joined_seq,
            };
            (id.clone(), member.encode_to_vec())
        })
        .collect();
    Encoded {
        meta: meta.encode_to_vec(),
        participants,
        members,
        writing: false,
    }
}

/// Decodes job `id`'s values (members' last signs of life: the moment of
/// decoding, offset 0).
pub fn decode(id: &str, e: &Encoded) -> Result<JobRecord, StoreError> {
    let corrupt = |what: &str, err: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!("job '{}': {what}: {err}", escape(id)))
    };
    let meta = st::JobMeta::decode(e.meta.as_slice()).map_err(|err| corrupt("meta", &err))?;
    if meta.format > FORMAT {
        return Err(corrupt(
            "meta",
            &format!(
                "format {} is newer than this server's ({FORMAT}); run the newer rdzv-server",
                meta.format
            ),
        ));
    }
    if meta.id != id {
        return Err(corrupt(
            "meta",
            &format!("names job '{}'", escape(&meta.id)),
        ));
    }
    let mut participants = Vec::new();
    for chunk in &e.participants {
        let part = st::Participants::decode(chunk.as_slice())
            .map_err(|err| corrupt("participants", &err))?;
        participants.extend(part.ids);
    }
    let phase = match meta.phase {
        0 => Phase::Forming,
        1 => Phase::Running,
        2 => Phase::Succeeded,
        3 => Phase::Failed(meta.failed_reason),
        other => return Err(corrupt("meta", &format!("unknown phase {other}"))),
    };
    let mut members = Vec::with_capacity(e.members.len());
    for (node, bytes) in &e.members {
        let what = || format!("member '{}'", escape(node));
        let m = st::Member::decode(bytes.as_slice()).map_err(|err| corrupt(&what(), &err))?;
        let session: [u8; SESSION_BYTES] = m
            .session
            .as_slice()
            .try_into()
            .map_err(|_| corrupt(&what(), &"a session secret of the wrong length"))?;
        let seen_from = match m.seen_from {
            Some(ip) => Some(ip.parse().map_err(|err| corrupt(&what(), &err))?),
            None => None,
        };
        members.push((
            node.clone(),
            MemberRecord {
                hostname: m.hostname,
                // A path this replica cannot read (a newer one's syntax, or
                // damage) is as good as none: it orders ranks, nothing more.
                topology: if accel_wire::topology::check(&m.topology).is_ok() {
                    m.topology
                } else {
                    String::new()
                },
                requested_rank: m.requested_rank,
                ready: m.ready_addr.map(|addr| (addr, m.ready_port)),
                rank: m.rank,
                succeeded: m.succeeded,
                last_seen: 0,
                seen_from,
                session,
                joined_seq: m.joined_seq,
            },
        ));
    }
    Ok(JobRecord {
        id: meta.id,
        config: JobConfig {
            min_nodes: meta.min_nodes,
            max_nodes: meta.max_nodes,
            nproc_per_node: meta.nproc_per_node,
            max_restarts: meta.max_restarts,
            dead_after: (meta.dead_after_us > 0).then(|| Duration::from_micros(meta.dead_after_us)),
            last_call: Duration::from_micros(meta.last_call_us),
            no_restart_exit_code: u8::try_from(meta.no_restart_exit_code)
                .ok()
                .filter(|c| *c > 0),
            outage: (meta.outage_us > 0).then(|| Duration::from_micros(meta.outage_us)),
            keep_alive: (meta.keep_alive_us > 0).then(|| Duration::from_micros(meta.keep_alive_us)),
            max_no_progress_restarts: meta.max_no_progress_restarts,
            nnodes_multiple_of: meta.nnodes_multiple_of,
            scale_up_settle: Duration::from_micros(meta.scale_up_settle_us)
                .min(accel_input::MAX_DURATION),
        },
        phase,
        round: meta.round,
        restart_count: meta.restart_count,
        members,
        participants,
        ready: meta.ready,
        succeeded: usize::try_from(meta.succeeded).unwrap_or(usize::MAX),
        last_failure: meta.last_failure,
        root_cause: meta.root_cause,
        // Only an agent's exit status: 1..=255 (anything else is damage).
        exit_code: meta.exit_code.filter(|c| (1..=255).contains(c)),
        finished_at: meta.finished_at,
        next_seq: meta.next_seq,
        min_ready_since: meta.min_ready_since,
        progress_sent: meta.progress_sent,
        next_liveness: meta.next_liveness,
        empty_since: meta.empty_since,
        absent: meta.absent,
        // Bounded as the job bounds them; a reason is words for people.
        benched: meta
            .benched
            .into_iter()
            .take(crate::job::MAX_QUARANTINED)
            .map(|b| {
                let reason = accel_input::clip_message(&b.reason);
                (b.host, b.since, b.until, reason, b.shared)
            })
            .collect(),
        failure_counts: meta
            .failure_counts
            .into_iter()
            .take(crate::job::MAX_QUARANTINED)
            .map(|c| (c.host, c.at.into_iter().take(MAX_COUNTED).collect()))
            .collect(),
        bench_repeats: meta
            .bench_repeats
            .into_iter()
            .take(crate::job::MAX_QUARANTINED)
            .map(|r| (r.host, r.times, r.until))
            .collect(),
        // The current round's reports are heard again (the `progress`
        // module).
        progress: crate::job::Progress {
            best: meta.best_step,
            round: Default::default(),
            stalled: meta.no_progress_restarts,
            checkpoints: Default::default(),
            checkpoint: meta.checkpoint_step,
            ended_at: None,
            hang_timeouts: Default::default(),
            failing: None,
        },
        goodput: meta.goodput.map(goodput_of).unwrap_or_default(),
        torn: e.writing,
    })
}

fn stored_goodput(g: &crate::job::StoredGoodput) -> st::Goodput {
    st::Goodput {
        spent_us: g.spent_us.to_vec(),
        open: g.open,
        open_step: g.open_step,
        mark: g.mark,
        losses: g
            .losses
            .iter()
            .map(|l| st::Loss {
                round: l.round,
                at: l.at,
                cause: l.cause.clone(),
                step: l.step,
                checkpoint: l.checkpoint,
                recovery_us: l.recovery_us,
                recomputation_us: l.recomputation_us,
            })
            .collect(),
        restarts: g.restarts,
        lost_steps: g.lost_steps,
    }
}

/// A stored accounting, bounded as the job bounds it.
fn goodput_of(g: st::Goodput) -> crate::job::StoredGoodput {
    let mut spent_us = [0; 5];
    for (to, from) in spent_us.iter_mut().zip(g.spent_us) {
        *to = from;
    }
    let skip = g.losses.len().saturating_sub(crate::job::MAX_LOSSES);
    crate::job::StoredGoodput {
        spent_us,
        open: g.open.min(5),
        open_step: g.open_step,
        mark: g.mark,
        losses: g
            .losses
            .into_iter()
            .skip(skip)
            .map(|l| crate::job::StoredLoss {
                round: l.round,
                at: l.at,
                cause: crate::job::clip_cause(&l.cause),
                step: l.step,
                checkpoint: l.checkpoint,
                recovery_us: l.recovery_us,
                recomputation_us: l.recomputation_us,
            })
            .collect(),
        restarts: g.restarts,
        lost_steps: g.lost_steps,
    }
}

/// A change to one value of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write `value` at the slot of job `job`.
    Put {
        /// The job.
        job: String,
        /// Which value.
        slot: Slot,
        /// Its new bytes.
        value: Vec<u8>,
    },
    /// Remove a member.
    DeleteMember {
        /// The job.
        job: String,
        /// The member.
        node: String,
    },
    /// Remove a value of participants the round no longer fills.
    DeleteParticipants {
        /// The job.
        job: String,
        /// Which value.
        index: u32,
    },
    /// Remove every key of a job.
    DeleteJob {
        /// The job.
        job: String,
    },
    /// Put the job's meta and remove its half-written marker, in one
    /// transaction: the end of a [`marked`] change.
    Commit {
        /// The job.
        job: String,
        /// Its meta.
        meta: Vec<u8>,
    },
}

impl Change {
    /// The job it changes.
    pub fn job(&self) -> &str {
        match self {
            Change::Put { job, .. }
            | Change::DeleteMember { job, .. }
            | Change::DeleteParticipants { job, .. }
            | Change::DeleteJob { job }
            | Change::Commit { job, .. } => job,
        }
    }

    /// The store operations it takes and the bytes of value they write (a
    /// [`Change::Commit`] is two operations, which share a transaction).
    pub fn cost(&self) -> (usize, usize) {
        match self {
            Change::Put { value, .. } => (1, value.len()),
            Change::DeleteMember { .. }
            | Change::DeleteParticipants { .. }
            | Change::DeleteJob { .. } => (1, 0),
            Change::Commit { meta, .. } => (2, meta.len()),
        }
    }
}

/// The operations and bytes of `changes` together ([`Change::cost`]).
pub fn cost(changes: &[Change]) -> (usize, usize) {
    changes.iter().fold((0, 0), |(n, b), c| {
        let (ops, bytes) = c.cost();
        (n + ops, b + bytes)
    })
}

/// What turns `old` (what the store holds for job `id`; `None`: nothing)
/// into `new`: members and participants first, the job's meta last, so a
/// reader that sees the new meta sees its members too.
pub fn diff(id: &str, old: Option<&Encoded>, new: &Encoded) -> Vec<Change> {
    let empty = Encoded::default();
    let old = old.unwrap_or(&empty);
    let put = |slot: Slot, value: &Vec<u8>| Change::Put {
        job: id.to_owned(),
        slot,
        value: value.clone(),
    };
    let mut out = Vec::new();
    for (node, value) in &new.members {
        if old.members.get(node) != Some(value) {
            out.push(put(Slot::Member(node.clone()), value));
        }
    }
    for node in old.members.keys() {
        if !new.members.contains_key(node) {
            out.push(Change::DeleteMember {
                job: id.to_owned(),
                node: node.clone(),
            });
        }
    }
    for (i, chunk) in new.participants.iter().enumerate() {
        if old.participants.get(i) != Some(chunk) {
            out.push(put(Slot::Participants(i as u32), chunk));
        }
    }
    for i in new.participants.len()..old.participants.len() {
        out.push(Change::DeleteParticipants {
            job: id.to_owned(),
            index: i as u32,
        });
    }
    if old.meta != new.meta {
        out.push(put(Slot::Meta, &new.meta));
    }
    out
}

/// Applies one change to the encoded jobs it concerns.
pub fn apply(jobs: &mut BTreeMap<String, Encoded>, change: &Change) {
    match change {
        Change::Put { job, slot, value } => {
            // A diff's indexes are the job's own: always in range.
            jobs.entry(job.clone())
                .or_default()
                .set(slot, value.clone());
        }
        Change::DeleteMember { job, node } => {
            if let Some(e) = jobs.get_mut(job) {
                e.members.remove(node);
            }
        }
        Change::DeleteParticipants { job, index } => {
            if let Some(e) = jobs.get_mut(job) {
                e.participants.truncate(*index as usize);
            }
        }
        Change::DeleteJob { job } => {
            jobs.remove(job);
        }
        Change::Commit { job, meta } => {
            let e = jobs.entry(job.clone()).or_default();
            e.meta = meta.clone();
            e.writing = false;
        }
    }
}

/// Brackets job `id`'s `changes` for writing in several transactions (or
/// for clearing a marker a stopped leader left, `old_writing`): the marker
/// first (unless it is there already), the job's meta, `new_meta`, with the
/// marker's deletion last. See the module's docs.
pub fn marked(id: &str, changes: Vec<Change>, new_meta: &[u8], old_writing: bool) -> Vec<Change> {
    let mut out = Vec::with_capacity(changes.len() + 2);
    if !old_writing {
        out.push(Change::Put {
            job: id.to_owned(),
            slot: Slot::Writing,
            value: Vec::new(),
        });
    }
    out.extend(changes.into_iter().filter(|c| {
        !matches!(
            c,
            Change::Put {
                slot: Slot::Meta,
                ..
            }
        )
    }));
    out.push(Change::Commit {
        job: id.to_owned(),
        meta: new_meta.to_vec(),
    });
    out
}

#[cfg(test)]
mod tests;
