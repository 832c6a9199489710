//! Read-only access to a [`Job`]'s own counters for the fuzz targets
//! (`fuzz/fuzz_targets/rdzv_job.rs`), which check after every step that they
//! agree with the members, and the checks of the quarantine's rules they
//! share. Not an API: hidden from the docs, may change with the state
//! machine.

use accel_proto::v1::event::Kind;

use super::{Job, Outbound};

/// A job's bookkeeping beside its members.
#[derive(Debug)]
pub struct Internals<'a> {
    /// Members ready for the forming round, as counted (benched ones not).
    pub ready: u32,
    /// Members whose host is benched, as counted.
    pub benched: u32,
    /// Participants of the running round whose workers all succeeded, as counted.
    pub succeeded: usize,
    /// Node ids of the running (or last) round, in node-rank order.
    pub participants: &'a [String],
    /// The topology path of each place of the last round that ran (`None`:
    /// unknown), by node rank.
    pub slot_topologies: Vec<Option<&'a str>>,
}

/// `job`'s bookkeeping.
pub fn internals(job: &Job) -> Internals<'_> {
    Internals {
        ready: job.ready,
        benched: job.benched,
        succeeded: job.succeeded,
        participants: &job.participants,
        slot_topologies: job.slot_topologies.iter().map(|t| t.as_deref()).collect(),
    }
}

/// The ready and benched counts against the members: `ready` is the
/// members with an offer whose host is not benched, `benched` the members
/// whose host is. `Err` says how they differ.
pub fn check_counts(job: &Job) -> Result<(), String> {
    let benched = job.members.values().filter(|m| job.is_benched(m)).count();
    let ready = job
        .members
        .values()
        .filter(|m| m.ready.is_some() && !job.is_benched(m))
        .count();
    if job.ready as usize != ready {
        return Err(format!(
            "ready count {} but {ready} members offered and are not benched",
            job.ready
        ));
    }
    if job.benched as usize != benched {
        return Err(format!(
            "benched count {} but {benched} members' hosts are benched",
            job.benched
        ));
    }
    Ok(())
}

/// No node whose host is benched after a step holds a rank in a round that
/// step completed (`out`, its events): a bench keeps a node out of every
/// round that forms while it lasts. (A bench never begins in the same step
/// after a completion: each operation benches before it decides.)
pub fn check_no_benched_rank(job: &Job, out: &[Outbound]) -> Result<(), String> {
    for o in out {
        let Kind::RoundComplete(rc) = &o.event else {
            continue;
        };
        if let Some(m) = job.members.get(&o.to).filter(|m| job.is_benched(m)) {
            return Err(format!(
                "'{}' of benched host '{}' got node rank {} in round {}",
                o.to, m.hostname, rc.node_rank, rc.round
            ));
        }
    }
    Ok(())
}
