//! Read-only access to a [`Job`]'s own counters for the fuzz targets
//! (`fuzz/fuzz_targets/rdzv_job.rs`), which check after every step that they
//! agree with the members. Not an API: hidden from the docs, may change with
//! the state machine.

use super::Job;

/// A job's bookkeeping beside its members.
#[derive(Debug)]
pub struct Internals<'a> {
    /// Members ready for the forming round, as counted.
    pub ready: u32,
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
        succeeded: job.succeeded,
        participants: &job.participants,
        slot_topologies: job.slot_topologies.iter().map(|t| t.as_deref()).collect(),
    }
}
