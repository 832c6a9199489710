//! A [`JobStore`] on etcd: job state that outlives any one server host.
//!
//! Jobs are kept as one key per member plus two per job ([`super::records`]),
//! and a batch writes only the values that differ from what this store last
//! wrote or loaded. A batch is applied in transactions of at most
//! [`TXN_OPS`] operations and [`TXN_BYTES`] bytes (etcd's own limits are 128
//! operations and 1.5 MiB a request by default), members before the job's
//! meta, a job's changes in one transaction where they fit. A batch that
//! ends half-written (etcd lost quorum between two transactions) is retried
//! whole; its events were not delivered meanwhile (the registry sends a
//! change's events only once it is durable), so no node acted on the part
//! that was written. A job's change that spans transactions is bracketed by
//! a marker ([`records::marked`]), so a leader that stops halfway leaves the
//! job recognisably half-written, and the next one re-forms it.
//!
//! # Fencing
//! A store made for a leader carries a [`Fence`]: the key its election
//! campaign holds and that key's creation revision. Every transaction is
//! conditioned on that key still existing at that revision, so once the
//! leader's lease is gone (it lost etcd, or was paused beyond the lease) no
//! write of it can land, whatever its clock believes; the registry learns so
//! as [`StoreError::Fenced`] and the server stops deciding.

use std::collections::BTreeMap;
use std::fmt;

use accel_etcd::{prefix_end, Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use tokio::sync::Mutex;
use tracing::warn;

use super::records::{self, Change, Encoded, Slot};
use super::{Batch, JobStore, StoreError, StoreFuture};
use crate::job::JobRecord;
use crate::tombstone::Tombstone;

/// Most operations in one transaction.
pub const TXN_OPS: usize = 100;
/// Most value bytes in one transaction.
pub const TXN_BYTES: usize = 1 << 20;
/// Keys read per request when loading.
const PAGE: i64 = 1000;

/// The election key a leader holds, and its creation revision.
#[derive(Clone, PartialEq, Eq)]
pub struct Fence {
    /// The campaign's key (`<election>/<lease id>`).
    pub key: Vec<u8>,
    /// The revision at which that key was created.
    pub revision: i64,
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Fence({} @ {})",
            String::from_utf8_lossy(&self.key),
            self.revision
        )
    }
}

/// Job state in etcd under a key prefix.
pub struct EtcdStore {
    client: Client,
    prefix: String,
    fence: Option<Fence>,
    /// What etcd holds, as this store last wrote or loaded it. Saves take
    /// it in turn, so they apply in order.
    known: Mutex<Known>,
}

/// What a store knows etcd holds.
#[derive(Debug, Default)]
struct Known {
    /// Each job's values.
    jobs: BTreeMap<String, Encoded>,
    /// Jobs a transaction with an unknown outcome touched (its answer was
    /// lost): read back from etcd before they are diffed again.
    stale: std::collections::BTreeSet<String>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

fn fenced() -> StoreError {
    StoreError::Fenced(
        "its election key is gone (its etcd lease expired); another replica leads".into(),
    )
}

fn unavailable(e: accel_etcd::Error) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

/// Attempts of one request before its error is returned.
const ATTEMPTS: u32 = 6;

/// Runs `request` again (briefly backing off) while it fails in a way
/// another member may not ([`accel_etcd::Error::is_transient`]: no answer,
/// or UNAVAILABLE; the client then sends the next attempt to the next
/// member). Every request here may be repeated: reads, and
/// transactions of puts and deletes under the same condition.
async fn retrying<T, F, Fut>(mut request: F) -> Result<T, accel_etcd::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, accel_etcd::Error>>,
{
    let mut attempt = 1;
    loop {
        match request().await {
            Err(e) if attempt < ATTEMPTS && e.is_transient() => {
                tokio::time::sleep(std::time::Duration::from_millis(10 << attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl EtcdStore {
    /// A store under `prefix` (e.g. `/accel`; no trailing slash) whose every
    /// write is conditioned on `fence`, if given.
    pub fn new(client: Client, prefix: &str, fence: Option<Fence>) -> Self {
        Self {
            client,
            prefix: prefix.trim_end_matches('/').to_owned(),
            fence,
            known: Mutex::new(Known::default()),
        }
    }

    /// The operations of one change (as many as [`Change::cost`] counts).
    fn ops(&self, change: &Change) -> Vec<TxnOp> {
        match change {
            Change::Put { job, slot, value } => {
                vec![TxnOp::put(slot.key(&self.prefix, job), value.clone())]
            }
            Change::DeleteMember { job, node } => vec![TxnOp::delete(
                Slot::Member(node.clone()).key(&self.prefix, job),
                None,
            )],
            Change::DeleteParticipants { job, index } => vec![TxnOp::delete(
                Slot::Participants(*index).key(&self.prefix, job),
                None,
            )],
            Change::DeleteJob { job } => vec![TxnOp::delete(
                records::job_prefix(&self.prefix, job),
                Some(DeleteOptions::new().with_prefix()),
            )],
            Change::Commit { job, meta } => vec![
                TxnOp::put(Slot::Meta.key(&self.prefix, job), meta.clone()),
                TxnOp::delete(Slot::Writing.key(&self.prefix, job), None),
            ],
        }
    }

    /// Runs `txn`, retried while another member may answer.
    async fn commit(
        &self,
        txn: Txn,
    ) -> Result<accel_etcd::pb::etcdserverpb::TxnResponse, accel_etcd::Error> {
        retrying(|| {
            let client = self.client.clone();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }

    fn guard(&self) -> Vec<Compare> {
        match &self.fence {
            Some(f) => vec![Compare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.revision,
            )],
            None => Vec::new(),
        }
    }

    /// Every job's values under `start` (a key prefix), from one snapshot,
    /// with whether its meta is there.
    async fn read(&self, start: String) -> Result<BTreeMap<String, (Encoded, bool)>, StoreError> {
        let client = self.client.clone();
        let end = prefix_end(start.as_bytes());
        let mut from = start.clone().into_bytes();
        let mut revision = 0;
        let mut found: BTreeMap<String, (Encoded, bool)> = BTreeMap::new();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                // Every page from the first page's snapshot.
                options = options.with_revision(revision);
            }
            let resp = retrying(|| {
                let client = client.clone();
                let (from, options) = (from.clone(), options.clone());
                async move { client.get(from, Some(options)).await }
            })
            .await
            .map_err(unavailable)?;
            if revision == 0 {
                revision = resp.header.as_ref().map_or(0, |h| h.revision);
            }
            let more = resp.more;
            let kvs = resp.kvs;
            for kv in &kvs {
                let key = String::from_utf8_lossy(&kv.key);
                let Some((job, slot)) = Slot::parse(&self.prefix, &key) else {
                    warn!(key = %key, "ignoring a key under the job prefix that no rdzv-server writes");
                    continue;
                };
                let (e, has_meta) = found.entry(job).or_default();
                *has_meta |= slot == Slot::Meta;
                if !e.set(&slot, kv.value.clone()) {
                    return Err(StoreError::Corrupt(format!(
                        "key '{key}': a participants index no job reaches"
                    )));
                }
            }
            match kvs.last() {
                Some(last) if more => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(found)
    }

    /// Job `id` as etcd holds it now (`None`: no such job, or its first
    /// write did not finish), read without touching what this store holds:
    /// for a follower counting the job's members ([`crate::depose`]).
    pub async fn job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let mut found = self.read(records::job_prefix(&self.prefix, id)).await?;
        match found.remove(id) {
            Some((encoded, true)) => records::decode(id, &encoded).map(Some),
            _ => Ok(None),
        }
    }

    async fn load_all(&self) -> Result<Vec<JobRecord>, StoreError> {
        let found = self.read(records::jobs_prefix(&self.prefix)).await?;
        let mut known = self.known.lock().await;
        known.jobs.clear();
        known.stale.clear();
        let mut jobs = Vec::with_capacity(found.len());
        for (id, (encoded, has_meta)) in found {
            if !has_meta {
                // Its first write did not finish: no node was told of it.
                // Its values are kept here, so that the job's next write
                // (if its nodes come back) replaces them all, marker included.
                warn!(job = %accel_wire::keys::escape(&id), "ignoring a job whose first write did not finish");
                known.jobs.insert(id, encoded);
                continue;
            }
            match records::decode(&id, &encoded) {
                Ok(record) => jobs.push(record),
                // One damaged job must not keep every other from its leader:
                // it is left out (its nodes rejoin, and the server relearns
                // it from them), and its values are kept here so that the
                // job's next write replaces them all.
                Err(e) => {
                    tracing::error!(job = %accel_wire::keys::escape(&id), error = %e, "leaving out a job whose stored state cannot be read")
                }
            }
            known.jobs.insert(id, encoded);
        }
        Ok(jobs)
    }

    /// The key of job `id`'s tombstone (beside the jobs, not under them).
    fn tombstone_key(&self, id: &str) -> String {
        format!(
            "{}/tombstones/{}",
            self.prefix,
            accel_wire::keys::escape(id)
        )
    }

    /// Writes and deletes tombstones, in transactions within the bounds.
    /// Each put tombstone is attached to a lease of `ttl` (one per batch),
    /// so that etcd deletes it even if no leader of its job id ever runs
    /// again; a leader that loads one also drops it once expired.
    async fn save_tombstones(
        &self,
        put: &[Tombstone],
        removed: &[String],
        ttl: std::time::Duration,
    ) -> Result<(), StoreError> {
        let mut ops: Vec<(TxnOp, usize)> = removed
            .iter()
            .map(|id| (TxnOp::delete(self.tombstone_key(id), None), 0))
            .collect();
        let lease = if put.is_empty() {
            0
        } else {
            let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            retrying(|| {
                let client = self.client.clone();
                async move { client.lease_grant(secs).await }
            })
            .await
            .map_err(unavailable)?
            .id
        };
        for t in put {
            let value = t.encode();
            let len = value.len();
            ops.push((
                TxnOp::put_with_lease(self.tombstone_key(&t.job_id), value, lease),
                len,
            ));
        }
        let mut txns: Vec<Vec<TxnOp>> = vec![Vec::new()];
        let mut bytes = 0;
        for (op, len) in ops {
            let current = txns.last().map_or(0, Vec::len);
            if current > 0 && (current >= TXN_OPS || bytes + len > TXN_BYTES) {
                txns.push(Vec::new());
                bytes = 0;
            }
            bytes += len;
            if let Some(last) = txns.last_mut() {
                last.push(op);
            }
        }
        for ops in txns.into_iter().filter(|t| !t.is_empty()) {
            let txn = Txn::new().when(self.guard()).and_then(ops);
            let resp = self.commit(txn).await.map_err(unavailable)?;
            if !resp.succeeded {
                return Err(fenced());
            }
        }
        Ok(())
    }

    /// Every tombstone stored; one that cannot be read is left out.
    async fn load_tombstones(&self) -> Result<Vec<Tombstone>, StoreError> {
        let start = format!("{}/tombstones/", self.prefix);
        let end = prefix_end(start.as_bytes());
        let mut from = start.into_bytes();
        let mut out = Vec::new();
        loop {
            let options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            let resp = retrying(|| {
                let client = self.client.clone();
                let (from, options) = (from.clone(), options.clone());
                async move { client.get(from, Some(options)).await }
            })
            .await
            .map_err(unavailable)?;
            for kv in &resp.kvs {
                match Tombstone::decode(&kv.value) {
                    Some(t) => out.push(t),
                    None => {
                        warn!(key = %String::from_utf8_lossy(&kv.key), "ignoring a finished job's tombstone that cannot be read")
                    }
                }
            }
            match resp.kvs.last() {
                Some(last) if resp.more => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => break,
            }
        }
        Ok(out)
    }

    async fn save_batch(&self, batch: Batch) -> Result<(), StoreError> {
        let mut guard = self.known.lock().await;
        // A finished job's tombstone is durable before its final state
        // (whose events wait for this save): a node told the outcome can
        // count on later leaders knowing it.
        if !batch.tombstones.is_empty() || !batch.tombstones_removed.is_empty() {
            self.save_tombstones(
                &batch.tombstones,
                &batch.tombstones_removed,
                batch.tombstone_ttl,
            )
            .await?;
        }
        let known = &mut *guard;
        let stale: Vec<String> = batch
            .put
            .iter()
            .filter(|r| known.stale.contains(&r.id))
            .map(|r| r.id.clone())
            .collect();
        for id in stale {
            let mut found = self.read(records::job_prefix(&self.prefix, &id)).await?;
            match found.remove(&id) {
                Some((encoded, _)) => known.jobs.insert(id.clone(), encoded),
                None => known.jobs.remove(&id),
            };
            known.stale.remove(&id);
        }
        // Each job's changes, kept whole in one transaction where they fit.
        let mut groups: Vec<Vec<Change>> = batch
            .removed
            .into_iter()
            .map(|job| vec![Change::DeleteJob { job }])
            .collect();
        for record in &batch.put {
            let encoded = records::encode(record);
            let old = known.jobs.get(&record.id);
            let mut changes = records::diff(&record.id, old, &encoded);
            let (ops, bytes) = records::cost(&changes);
            let was_torn = old.is_some_and(|e| e.writing);
            if ops > TXN_OPS || bytes > TXN_BYTES || was_torn {
                changes = records::marked(&record.id, changes, &encoded.meta, was_torn);
            }
            if !changes.is_empty() {
                groups.push(changes);
            }
        }
        if groups.is_empty() && self.fence.is_some() {
            // Nothing to write, but events wait on this save: a deposed
            // leader must not send them, so the fence is checked all the same.
            let resp = self
                .commit(Txn::new().when(self.guard()))
                .await
                .map_err(unavailable)?;
            if !resp.succeeded {
                return Err(fenced());
            }
            return Ok(());
        }
        // Transactions of at most TXN_OPS operations and TXN_BYTES bytes; a
        // job's changes start a new one rather than straddle two, unless
        // they alone exceed one (then they are marked, above).
        let mut txns: Vec<Vec<Change>> = Vec::new();
        let mut current: Vec<Change> = Vec::new();
        let mut used = (0, 0);
        let fits = |used: (usize, usize), (ops, bytes): (usize, usize)| {
            used.0 == 0 || (used.0 + ops <= TXN_OPS && used.1 + bytes <= TXN_BYTES)
        };
        for group in groups {
            if !fits(used, records::cost(&group)) {
                txns.push(std::mem::take(&mut current));
                used = (0, 0);
            }
            for change in group {
                let cost = change.cost();
                if !fits(used, cost) {
                    txns.push(std::mem::take(&mut current));
                    used = (0, 0);
                }
                used = (used.0 + cost.0, used.1 + cost.1);
                current.push(change);
            }
        }
        txns.push(current);
        for done in txns {
            if done.is_empty() {
                continue;
            }
            let ops: Vec<TxnOp> = done.iter().flat_map(|c| self.ops(c)).collect();
            let txn = Txn::new().when(self.guard()).and_then(ops);
            let resp = match self.commit(txn).await {
                Ok(r) => r,
                Err(e) => {
                    // It may have been applied all the same.
                    for change in &done {
                        let job = change.job();
                        known.jobs.remove(job);
                        known.stale.insert(job.to_owned());
                    }
                    return Err(unavailable(e));
                }
            };
            if !resp.succeeded {
                return Err(fenced());
            }
            for change in &done {
                records::apply(&mut known.jobs, change);
            }
        }
        Ok(())
    }
}

impl EtcdStore {
    /// The key of the floor of the lighthouse's next quorum ids.
    fn quorum_id_key(&self) -> String {
        format!("{}/lighthouse/quorum-id-floor", self.prefix)
    }

    async fn reserve(&self, at_least: i64, block: i64) -> Result<Option<i64>, StoreError> {
        let key = self.quorum_id_key();
        let resp = retrying(|| {
            let client = self.client.clone();
            let key = key.clone();
            async move { client.get(key, None).await }
        })
        .await
        .map_err(unavailable)?;
        let floor = match resp.kvs.first() {
            None => i64::MIN,
            Some(kv) => std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("key '{key}' does not hold a quorum id"))
                })?,
        };
        let first = floor.max(at_least);
        let next = first.saturating_add(block);
        let txn = Txn::new()
            .when(self.guard())
            .and_then(vec![TxnOp::put(key, next.to_string())]);
        let resp = self.commit(txn).await.map_err(unavailable)?;
        if !resp.succeeded {
            return Err(fenced());
        }
        Ok(Some(first))
    }
}

impl JobStore for EtcdStore {
    fn load(&self) -> StoreFuture<'_, Vec<JobRecord>> {
        Box::pin(self.load_all())
    }

    fn save(&self, batch: Batch) -> StoreFuture<'_, ()> {
        Box::pin(self.save_batch(batch))
    }

    fn tombstones(&self) -> StoreFuture<'_, Vec<Tombstone>> {
        Box::pin(self.load_tombstones())
    }

    fn reserve_quorum_ids(&self, at_least: i64, block: i64) -> StoreFuture<'_, Option<i64>> {
        Box::pin(self.reserve(at_least, block))
    }
}
