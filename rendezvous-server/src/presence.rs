//! Presence keys: in an agent-only rendezvous on etcd, a node whose etcd
//! lease expired is dead, and the leader drops it then.
//!
//! # Why
//! Without a server, the job's rendezvous is hosted by one of its agents
//! ([`crate::ha`], with every agent a replica). When that agent's machine
//! dies, etcd proves it dead once its lease expires (the election key goes,
//! and another agent leads), but the new leader loads the dead node as a
//! member like any other and would wait the job's keep-alive limit (15 s by
//! default) before it drops it: the survivors run again only then. etcd has
//! already said which nodes live; this module lets the leader listen.
//!
//! # The keys
//! Each agent keeps `<prefix>/presence/<node id>` (the id escaped as job ids
//! are, [`accel_wire::keys::escape`]), attached to an etcd lease of its
//! own (`etcd_lease` long, renewed every third of it), written before the
//! node joins and revoked when the agent exits cleanly ([`Presence`]). A
//! node that cannot renew its lease for two thirds of it writes its key
//! again under a new lease: a key whose lease ends is a node that etcd
//! could not hear from for the whole lease.
//!
//! # The leader
//! While it leads, a replica with [`crate::ha::EtcdOptions::presence`]
//! watches the prefix ([`watch()`]): a key deleted (its lease expired or was
//! revoked) triggers a check, and so does every lease's worth of time (a
//! watch that missed something, or a member loaded without a key). A check
//! takes the registry's members first and reads the keys after, then drops
//! the members whose key is missing ([`crate::Registry::drop_expired`]).
//! That order is what makes it safe: a node joins only after its key
//! exists, so a member whose key is missing at a read that followed its
//! joining lost its key afterwards; and a node dropped and joining again
//! meanwhile is another membership, which the drop leaves alone.

use std::collections::HashSet;
use std::time::Duration;

use accel_etcd::{prefix_end, Client, EventType, GetOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ha::{connect, keep_lease, EtcdOptions};
use crate::lease::LeaseClock;
use crate::registry::Registry;
use accel_telemetry::quiet::{Quiet, Say};
use accel_wire::keys::{escape, unescape};

/// What the others are told about a node dropped for its expired lease.
pub const EXPIRED: &str =
    "its etcd lease expired (its presence key is gone: the node is dead, or cut off from etcd)";
/// Keys read per request in a check.
const PAGE: i64 = 1000;
/// Pause before trying etcd again after it failed.
const RETRY: Duration = Duration::from_millis(500);
/// How long after a deleted key the leader waits for more before it checks
/// (at most twenty times that while changes keep coming).
const COALESCE: Duration = Duration::from_millis(50);
/// Host names named in a drop's log line.
const NAMED: usize = 8;

/// The prefix under which a job's nodes keep their presence keys, for the
/// job prefix `prefix` (`<etcd_prefix>/<job id>`).
pub fn keys(prefix: &str) -> String {
    format!("{prefix}/presence/")
}

/// Node `node_id`'s presence key under job prefix `prefix`.
pub fn key(prefix: &str, node_id: &str) -> String {
    format!("{}{}", keys(prefix), escape(node_id))
}

/// A node's presence key, kept alive until [`Presence::withdraw`] (or the
/// process's end, after which its lease expires).
#[derive(Debug)]
pub struct Presence {
    /// Whether the key is in etcd (under a live lease) now.
    held: watch::Receiver<bool>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Presence {
    /// Starts keeping node `node_id`'s key under `options.prefix` (its value
    /// `host`, for people reading etcd); [`PresenceHeld::wait`] says when it is
    /// there.
    pub fn announce(options: &EtcdOptions, node_id: &str, host: &str) -> Self {
        let (tx, held) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(
            options.clone(),
            key(&options.prefix, node_id),
            host.to_owned(),
            tx,
            stop.clone(),
        ));
        Self {
            held,
            stop,
            task: Some(task),
        }
    }

    /// Whether the key is in etcd, to wait on where the node joins.
    pub fn held(&self) -> PresenceHeld {
        PresenceHeld(self.held.clone())
    }

    /// Deletes the key (revoking its lease) and stops keeping it: the node
    /// leaves cleanly. Bounded: at most about a second.
    pub async fn withdraw(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

/// Whether a node's presence key is in etcd (under a live lease).
#[derive(Debug, Clone)]
pub struct PresenceHeld(watch::Receiver<bool>);

impl PresenceHeld {
    /// Waits until the key is in etcd; false if it is not by `deadline`
    /// (or the node withdrew it).
    pub async fn wait(&self, deadline: tokio::time::Instant) -> bool {
        let mut held = self.0.clone();
        tokio::time::timeout_at(deadline, held.wait_for(|h| *h))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether the key is in etcd now.
    pub fn now(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the key's lease may have lapsed (its keeper could not
    /// renew it within two thirds of it): from then on the leader may drop
    /// the node at any moment. Never returns while the key is kept, nor
    /// once the node withdrew it.
    pub async fn lapsed(&self) {
        let mut held = self.0.clone();
        if held.wait_for(|h| !*h).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        // Not withdrawn: nothing renews the lease, which expires on its own
        // (as it does when the process dies).
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Keeps `key` in etcd under a lease of `o.lease`, term after term, until
/// `stop`; then revokes the lease.
async fn keep(
    o: EtcdOptions,
    key: String,
    value: String,
    held: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut failing = Quiet::every(Duration::from_secs(10));
    let lease_secs = i64::try_from(o.lease.as_secs().max(1)).unwrap_or(i64::MAX);
    let mut client: Option<Client> = None;
    // The lease the key was last written under, revoked once replaced.
    let mut old: Option<i64> = None;
    loop {
        let attempt = async {
            let c = match &client {
                Some(c) => c.clone(),
                None => connect(&o).await?,
            };
            client = Some(c.clone());
            // The lease can live no longer than from when it was asked for.
            let sent = std::time::Instant::now();
            let lease = c.lease_grant(lease_secs).await?.id;
            if let Err(e) = c.put_with_lease(key.clone(), value.clone(), lease).await {
                let _ = c.lease_revoke(lease).await;
                return Err(e);
            }
            Ok::<_, accel_etcd::Error>((c, lease, sent))
        };
        let (c, lease, sent) = tokio::select! {
            r = attempt => match r {
                Ok(held) => held,
                Err(e) => {
                    match failing.hit(tokio::time::Instant::now()) {
                        Say::First => warn!(error = %e, "cannot write this node's presence key to etcd; retrying"),
                        Say::Summary(n, over) => warn!(error = %e, attempts = n, over_s = over.as_secs(), "still cannot write this node's presence key to etcd"),
                        Say::Nothing => tracing::debug!(error = %e, "cannot write the presence key"),
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY) => continue,
                        _ = stop.cancelled() => break,
                    }
                }
            },
            _ = stop.cancelled() => break,
        };
        failing = Quiet::every(Duration::from_secs(10));
        if let Some(previous) = old.replace(lease) {
            // The key is attached to the new lease now: revoking the old
            // one deletes nothing.
            let _ = tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(previous)).await;
        }
        held.send_replace(true);
        let expired = CancellationToken::new();
        tokio::select! {
            _ = keep_lease(c.clone(), lease, LeaseClock::granted(sent, o.lease), expired.clone()) => {}
            _ = stop.cancelled() => break,
        }
        held.send_replace(false);
        warn!(
            lease_s = o.lease.as_secs(),
            "this node's etcd lease could not be renewed in time; writing its presence key again (if the lease expired, the rendezvous dropped this node and it rejoins)"
        );
    }
    held.send_replace(false);
    if let (Some(c), Some(lease)) = (client, old) {
        // The key goes with its lease, at once rather than after it.
        let _ = tokio::time::timeout(Duration::from_secs(1), c.lease_revoke(lease)).await;
    }
}

/// While this replica leads: drops every member of `registry`'s jobs whose
/// presence key under job prefix `prefix` is gone, when a key is deleted
/// and at least every `every` (see the module docs). Runs until dropped.
pub async fn watch(client: Client, prefix: String, registry: Registry, every: Duration) {
    let keys = keys(&prefix);
    let mut failing = Quiet::every(Duration::from_secs(10));
    loop {
        // The watch first, then a check: a key deleted after the check's
        // read comes as an event.
        let mut changes = match client.watch_prefix(keys.clone()).await {
            Ok(w) => Some(w),
            Err(e) => {
                if let Say::First = failing.hit(tokio::time::Instant::now()) {
                    warn!(error = %e, "cannot watch the nodes' presence keys; checking every lease instead");
                }
                None
            }
        };
        check_logged(&client, &keys, &registry, &mut failing).await;
        let mut next = tokio::time::Instant::now() + every;
        loop {
            let deleted = async {
                match &mut changes {
                    Some(w) => match w.message().await {
                        Ok(Some(r)) => Ok(r
                            .events
                            .iter()
                            .any(|e| e.r#type == EventType::Delete as i32)),
                        Ok(None) => Err("the watch ended".to_owned()),
                        Err(e) => Err(e.to_string()),
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                d = deleted => match d {
                    Ok(true) => {
                        // Many nodes going at once (a rack) are many events:
                        // those that follow closely share one check.
                        if let Some(w) = &mut changes {
                            let until = tokio::time::Instant::now() + COALESCE * 20;
                            while tokio::time::Instant::now() < until {
                                match tokio::time::timeout(COALESCE, w.message()).await {
                                    Ok(Ok(Some(_))) => {}
                                    _ => break,
                                }
                            }
                        }
                        check_logged(&client, &keys, &registry, &mut failing).await
                    }
                    Ok(false) => continue,
                    Err(why) => {
                        tracing::debug!(reason = %why, "the presence watch ended; watching again");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(next) => {
                    check_logged(&client, &keys, &registry, &mut failing).await;
                    next = tokio::time::Instant::now() + every;
                    if changes.is_none() {
                        // Try to watch again.
                        break;
                    }
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn check_logged(client: &Client, keys: &str, registry: &Registry, failing: &mut Quiet) {
    match check(client, keys, registry).await {
        Ok(_) => *failing = Quiet::every(Duration::from_secs(10)),
        Err(e) => match failing.hit(tokio::time::Instant::now()) {
            Say::First => {
                warn!(error = %e, "cannot read the nodes' presence keys; no node is dropped for an expired lease until etcd answers")
            }
            Say::Summary(n, over) => {
                warn!(error = %e, attempts = n, over_s = over.as_secs(), "still cannot read the nodes' presence keys")
            }
            Say::Nothing => {}
        },
    }
}

/// One check: the members first, then the keys, then the drop (see the
/// module docs for why in that order). Returns how many nodes went.
pub async fn check(
    client: &Client,
    keys: &str,
    registry: &Registry,
) -> Result<usize, accel_etcd::Error> {
    let members = registry.memberships();
    if members.is_empty() {
        return Ok(0);
    }
    let present = read(client, keys).await?;
    let gone: Vec<_> = members
        .into_iter()
        .filter(|m| !present.contains(&m.node_id))
        .collect();
    if gone.is_empty() {
        return Ok(0);
    }
    let named: Vec<&str> = gone
        .iter()
        .take(NAMED)
        .map(|m| m.node_id.as_str())
        .collect();
    let n = registry.drop_expired(registry.instant(), &gone, EXPIRED);
    if n > 0 {
        info!(
            nodes = n,
            named = %named.join(", "),
            "dropped nodes whose etcd lease expired; the job re-forms without them"
        );
    }
    Ok(n)
}

/// The node ids whose presence keys are under `keys` now (one snapshot,
/// paged).
async fn read(client: &Client, keys: &str) -> Result<HashSet<String>, accel_etcd::Error> {
    let end = prefix_end(keys.as_bytes());
    let mut from = keys.as_bytes().to_vec();
    let mut revision = 0;
    let mut present = HashSet::new();
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(PAGE)
            .with_keys_only();
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let resp = client.get(from.clone(), Some(options)).await?;
        if revision == 0 {
            revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        for kv in &resp.kvs {
            let id = std::str::from_utf8(&kv.key)
                .ok()
                .and_then(|k| k.strip_prefix(keys))
                .and_then(unescape);
            if let Some(id) = id {
                present.insert(id);
            }
        }
        match resp.kvs.last() {
            Some(last) if resp.more => {
                from = last.key.clone();
                from.push(0);
            }
            _ => return Ok(present),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{key, keys};
    use accel_wire::keys::unescape;

    #[test]
    fn a_node_id_is_one_key_under_its_jobs_prefix() {
        let k = key("/accel/team%2Fjob", "host/1-42-beef");
        assert_eq!(k, "/accel/team%2Fjob/presence/host%2F1-42-beef");
        let id = k
            .strip_prefix(&keys("/accel/team%2Fjob"))
            .and_then(unescape);
        assert_eq!(id.as_deref(), Some("host/1-42-beef"));
    }
}
