//! The durable commit path: what a change decided waits here until the
//! store holds it, and only then reaches the nodes.
//!
//! With a [`JobStore`], a change to a job marks the job ([`Commit::mark`])
//! and holds the events it caused ([`Commit::decided`]). A flush takes
//! everything marked and held as one [`Pending`] write (group commit: one
//! store round trip however many nodes called meanwhile), and
//! [`Pending::write`] gives the events back only once `save` succeeded. That
//! is the rule the type keeps: events of a change exist outside this module
//! only after the store took the change (or at once, when there is no
//! store), so a leader that dies before a write took no decision its
//! successor lacks. A failed write puts everything back, ahead of what was
//! decided meanwhile, for the next flush; new jobs and members are refused
//! until a write succeeds ([`Commit::unwritable`]), which bounds what waits.
//! Once the server is closing, nothing more is written or delivered: the
//! server that continues the jobs decides again.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::job::{JobRecord, Outbound};
use crate::store::{Batch, JobStore, StoreError};
use crate::tombstone::Tombstone;

/// The events one change caused, for the members' streams numbered below
/// its horizon (streams opened after the decision already reflect it).
#[derive(Debug)]
pub(super) struct HeldEvents {
    job_id: String,
    out: Vec<Outbound>,
    horizon: u64,
}

impl HeldEvents {
    /// The job, its events, and the first stream number that must not get them.
    pub(super) fn into_parts(self) -> (String, Vec<Outbound>, u64) {
        (self.job_id, self.out, self.horizon)
    }
}

/// What is decided and not yet written.
#[derive(Debug, Default)]
pub(super) struct Commit {
    /// Whether there is a store; without one nothing waits.
    enabled: bool,
    /// Jobs changed since the last flush.
    dirty: BTreeSet<String>,
    /// Events of changes not yet durable, in order.
    held: Vec<HeldEvents>,
    /// The server is shutting down: nothing more is written.
    closing: bool,
    /// Why the last flush failed, until one succeeds.
    unwritable: Option<String>,
    /// Tombstones to write, and to delete, with the next flush.
    tomb_put: Vec<Tombstone>,
    tomb_removed: Vec<String>,
}

/// One flush's write: the jobs to save (their records are taken by the
/// caller, under the lock), the tombstones, and the events that wait for it.
#[derive(Debug)]
pub(super) struct Pending {
    /// The changed jobs.
    pub(super) ids: BTreeSet<String>,
    tomb_put: Vec<Tombstone>,
    tomb_removed: Vec<String>,
    held: Vec<HeldEvents>,
}

impl Commit {
    /// A commit path for a registry with a store (`enabled`) or without one.
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// Marks `job_id` changed (with a store, until the server closes).
    pub(super) fn mark(&mut self, job_id: &str) {
        if self.enabled && !self.closing && !self.dirty.contains(job_id) {
            self.dirty.insert(job_id.to_owned());
        }
    }

    /// A change to `job_id` caused `out` (`over`: the job ended with it;
    /// `horizon`: the next stream number). Without a store the events come
    /// back at once, for every stream; with one they wait for the write
    /// (a job's end waits even without events, so its streams end only then).
    pub(super) fn decided(
        &mut self,
        job_id: &str,
        out: Vec<Outbound>,
        over: bool,
        horizon: u64,
    ) -> Option<HeldEvents> {
        let held = HeldEvents {
            job_id: job_id.to_owned(),
            out,
            horizon,
        };
        if !self.enabled {
            return Some(HeldEvents {
                horizon: u64::MAX,
                ..held
            });
        }
        if !held.out.is_empty() || over {
            // Deliver after durable: the write these events wait for must
            // carry the change that caused them (asserted in release builds
            // too; `job/invariants.rs` says why).
            assert!(
                self.closing || self.dirty.contains(job_id),
                "invariant: events of a change to job '{job_id}' would wait for a write that does not carry the change"
            );
            self.held.push(held);
        }
        None
    }

    /// Keeps tombstone `t` for the next write.
    pub(super) fn put_tombstone(&mut self, t: &Tombstone) {
        if self.enabled {
            self.tomb_put.push(t.clone());
        }
    }

    /// Deletes `job_id`'s tombstone with the next write (and does not write it).
    pub(super) fn remove_tombstone(&mut self, job_id: &str) {
        if self.enabled {
            self.tomb_put.retain(|t| t.job_id != job_id);
            self.tomb_removed.push(job_id.to_owned());
        }
    }

    /// Deletes a tombstone the store holds and this server does not keep
    /// (it expired before the server started).
    pub(super) fn delete_tombstone(&mut self, job_id: String) {
        if self.enabled {
            self.tomb_removed.push(job_id);
        }
    }

    /// Why the last write failed, while none has succeeded since.
    pub(super) fn unwritable(&self) -> Option<&str> {
        self.unwritable.as_deref()
    }

    /// Whether the server is closing.
    pub(super) fn closing(&self) -> bool {
        self.closing
    }

    /// The server closes: nothing decided and not written is delivered or
    /// written, and nothing more is marked.
    pub(super) fn close(&mut self) {
        self.closing = true;
        self.dirty.clear();
        self.held.clear();
    }

    /// Everything waiting, for one write; `None` once closing.
    pub(super) fn take(&mut self) -> Option<Pending> {
        if self.closing {
            return None;
        }
        Some(Pending {
            ids: std::mem::take(&mut self.dirty),
            tomb_put: std::mem::take(&mut self.tomb_put),
            tomb_removed: std::mem::take(&mut self.tomb_removed),
            held: std::mem::take(&mut self.held),
        })
    }

    /// A write failed: what it carried waits again, ahead of what was
    /// decided meanwhile, and new jobs and members are refused until a write
    /// succeeds.
    pub(super) fn failed(&mut self, pending: Pending, why: &StoreError) {
        self.unwritable = Some(why.to_string());
        self.dirty.extend(pending.ids);
        let later = std::mem::replace(&mut self.tomb_put, pending.tomb_put);
        self.tomb_put.extend(later);
        let later = std::mem::replace(&mut self.tomb_removed, pending.tomb_removed);
        self.tomb_removed.extend(later);
        let later = std::mem::replace(&mut self.held, pending.held);
        self.held.extend(later);
    }

    /// A write succeeded: its events, to deliver now (none if the server
    /// began closing meanwhile).
    pub(super) fn written(&mut self, done: Written) -> Vec<HeldEvents> {
        self.unwritable = None;
        if self.closing {
            Vec::new()
        } else {
            done.0
        }
    }
}

/// The events of a write the store took; [`Commit::written`] releases them.
#[derive(Debug)]
pub(super) struct Written(Vec<HeldEvents>);

impl Pending {
    /// Whether there is nothing to write (events may still wait: a change
    /// that changed no record, as a job that was already written).
    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.tomb_put.is_empty() && self.tomb_removed.is_empty()
    }

    /// Writes `put` (the records of the changed jobs that still exist),
    /// `removed` (the others) and the tombstones as one batch; the events
    /// come back only if the store took it. On failure, `self` comes back
    /// to be put back ([`Commit::failed`]).
    pub(super) async fn write(
        self,
        store: &dyn JobStore,
        put: Vec<JobRecord>,
        removed: Vec<String>,
        tombstone_ttl: Duration,
    ) -> Result<Written, (Self, StoreError)> {
        if !self.is_empty() {
            let batch = Batch {
                put,
                removed,
                tombstones: self.tomb_put.clone(),
                tombstones_removed: self.tomb_removed.clone(),
                tombstone_ttl,
            };
            if let Err(e) = store.save(batch).await {
                return Err((self, e));
            }
        }
        Ok(Written(self.held))
    }
}

#[cfg(test)]
mod tests;
