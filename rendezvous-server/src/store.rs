//! Where job state outlives the server process: the [`JobStore`] seam.
//!
//! The registry keeps jobs in memory and decides there; a store, when the
//! server has one, receives every change so that another server process can
//! [`JobStore::load`] the jobs and continue them (round numbers, node ranks,
//! restart budgets, failures, spares, session secrets). Live streams are not
//! state: they belong to the process, and nodes reconnect to whichever
//! server serves the job.
//!
//! # Batches
//! Changes are not written one by one. The registry marks each job a call
//! changed, and once per tick [`crate::Registry::flush`] takes a
//! [`JobRecord`] of every marked job under its lock (memory copies only),
//! releases the lock, and hands the batch to [`JobStore::save`]. A store's
//! I/O therefore never holds the registry's lock, and a 10,000-node round
//! that forms in one tick is one write, not 10,000. A batch that fails is
//! retried whole on the next tick; a job changed again meanwhile is written
//! as it is then. (Deciding only after a change is durable, and fencing a
//! deposed leader, is the replicated store's part, with leader election.)
//!
//! [`MemoryStore`] keeps records in this process: for tests, and for
//! embedding servers that hand their jobs from one registry to the next.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};

use crate::job::JobRecord;
use crate::tombstone::Tombstone;

pub mod etcd;
pub mod records;

/// A future a store returns (object-safe, so the registry holds any store).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Why a store could not load or save.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached or refused the operation; retried.
    #[error("the job store is unavailable: {0}")]
    Unavailable(String),
    /// What the store holds cannot be read back as jobs.
    #[error("the job store holds a record that cannot be read: {0}")]
    Corrupt(String),
    /// This server is no longer the leader: another replica decides now, so
    /// nothing was written and this one must stop deciding.
    #[error("this rdzv-server is no longer the leader: {0}")]
    Fenced(String),
}

/// One tick's changes, applied together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Jobs as they are now (created or changed).
    pub put: Vec<JobRecord>,
    /// Jobs forgotten (expired, or refused as they were created).
    pub removed: Vec<String>,
    /// Tombstones of jobs that ended ([`crate::tombstone`]).
    pub tombstones: Vec<Tombstone>,
    /// Tombstones expired or dropped, by job id.
    pub tombstones_removed: Vec<String>,
    /// How long the tombstones are kept: a store that can expire keys
    /// (etcd, with a lease) deletes them itself after that long.
    pub tombstone_ttl: std::time::Duration,
}

impl Batch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.put.is_empty()
            && self.removed.is_empty()
            && self.tombstones.is_empty()
            && self.tombstones_removed.is_empty()
    }
}

/// Durable job state.
pub trait JobStore: Send + Sync + std::fmt::Debug {
    /// Every job saved, for a server that starts.
    fn load(&self) -> StoreFuture<'_, Vec<JobRecord>>;
    /// Applies `batch` as one change: all of it or none.
    fn save(&self, batch: Batch) -> StoreFuture<'_, ()>;
    /// Every tombstone saved (expired ones included: the caller drops them).
    fn tombstones(&self) -> StoreFuture<'_, Vec<Tombstone>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// Reserves torchft lighthouse quorum ids for a new lead: the first id
    /// it may hand out, at least `at_least` and above every id reserved
    /// before, having stored `first + block` as the floor of the next
    /// reservation. `None`: the store keeps no ids (a lead then counts on
    /// from its clock alone).
    fn reserve_quorum_ids(&self, at_least: i64, block: i64) -> StoreFuture<'_, Option<i64>> {
        let _ = (at_least, block);
        Box::pin(async { Ok(None) })
    }
}

/// Records in this process's memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    jobs: Mutex<BTreeMap<String, JobRecord>>,
    tombstones: Mutex<BTreeMap<String, Tombstone>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, JobRecord>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of job `id`, if saved.
    pub fn get(&self, id: &str) -> Option<JobRecord> {
        self.lock().get(id).cloned()
    }

    /// Jobs saved.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no job is saved.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl JobStore for MemoryStore {
    fn load(&self) -> StoreFuture<'_, Vec<JobRecord>> {
        let jobs = self.lock().values().cloned().collect();
        Box::pin(async move { Ok(jobs) })
    }

    fn save(&self, batch: Batch) -> StoreFuture<'_, ()> {
        let mut jobs = self.lock();
        for id in batch.removed {
            jobs.remove(&id);
        }
        for record in batch.put {
            jobs.insert(record.id.clone(), record);
        }
        drop(jobs);
        let mut stones = self.tombstones.lock().unwrap_or_else(|e| e.into_inner());
        for id in batch.tombstones_removed {
            stones.remove(&id);
        }
        for t in batch.tombstones {
            stones.insert(t.job_id.clone(), t);
        }
        Box::pin(async { Ok(()) })
    }

    fn tombstones(&self) -> StoreFuture<'_, Vec<Tombstone>> {
        let stones = self.tombstones.lock().unwrap_or_else(|e| e.into_inner());
        let all = stones.values().cloned().collect();
        Box::pin(async move { Ok(all) })
    }
}

#[cfg(test)]
mod tests;
