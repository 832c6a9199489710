//! Replicas of `rdzv-server` on etcd: one leads, the others stand by.
//!
//! # Why
//! A single server's jobs end with its host. With `--etcd-endpoints`, any
//! number of replicas run; they campaign through etcd's election API
//! (`<prefix>/leader`, each replica's value: the address agents reach it
//! at). The leader serves the rendezvous with its job state in etcd
//! ([`crate::store::etcd`]); a follower answers every call with
//! UNAVAILABLE naming the leader (message and [`LEADER_METADATA`]), and its
//! health service reports NOT_SERVING, so a load balancer or an agent with
//! several endpoints finds the leader.
//!
//! # A leader's term
//! A replica grants itself a lease of `--etcd-lease` and keeps it alive
//! (every third of it); it campaigns with that lease; once elected it loads
//! every job from etcd and serves them, round numbers, ranks, budgets and
//! secrets as the last leader left them. Nodes reconnect and resume (their
//! workers ran on meanwhile).
//!
//! # Never two leaders acting
//! Every write of a leader is conditioned on its election key (which lives
//! only as long as its lease), and no decision's events are sent before its
//! write succeeded ([`crate::registry`]). A leader whose lease expired (etcd
//! unreachable, the process paused) therefore cannot act on anything even
//! before it notices; it steps down when a write is refused (fenced), when
//! its election key is deleted (it watches the key: its lease was revoked),
//! or when it has not renewed its lease for two thirds of it, whichever
//! comes first:
//! it stops deciding, ends every node's stream (they reconnect to the new
//! leader) and campaigns again. A leader that was paused past that moment
//! does not wait for its lease keeper to run: its registry checks the
//! lease's clock ([`crate::lease`]) before it serves any call or tick, and
//! on waking refuses the first one and ends every stream at once.
//!
//! # A new leader's grace
//! The nodes of a job it loads kept alive the last leader, not this one:
//! each is given the full drop limit from the load to reach this leader
//! ([`crate::job::Job::handed_over`]) before it can be dropped for silence.
//!
//! On shutdown a leader writes what is pending and resigns, so another
//! replica takes over at once instead of after the lease.
//!
//! # A leader its agents cannot reach
//! A leader that reaches etcd but not its agents (a one-way partition)
//! keeps its lease. Its agents, leaving it for silence, join a follower
//! saying which replica went silent; the follower counts these complaints
//! ([`crate::depose`]) and, once most nodes of a job complained, revokes
//! the leader's lease: it is elected at once (it was campaigning), and the
//! deposed leader, which sees its election key deleted (or, should its
//! watch be down, its next keep-alive answered with TTL 0, or its next
//! write refused), steps down as above. In an agent-only rendezvous (each
//! agent asks only its own replica) the replicas also write their
//! complaints to etcd and count each other's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use accel_etcd::{Client, ConnectOptions, LeaderKey, TlsOptions};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

use crate::depose::{Action, Event, Members, Tally, Term};
use crate::lease::LeaseClock;
use crate::limits::Limits;
use crate::registry::Registry;
use crate::store::etcd::{EtcdStore, Fence};
use crate::store::StoreError;
use accel_telemetry::quiet::{Quiet, Say};

use accel_wire::LEADER_METADATA;
/// How often a follower asks who leads while etcd streams it no changes.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);
/// How often a follower checks the streamed leader by asking.
const RECHECK: Duration = Duration::from_secs(2);
/// Pause before campaigning again after etcd failed us.
const RETRY: Duration = Duration::from_secs(1);
/// Complaints a follower's service may queue for its tally.
pub const COMPLAINTS_QUEUED: usize = 1024;
/// A complaint older than this when its tally hears it is stale.
const COMPLAINT_FRESH: Duration = Duration::from_secs(1);
/// Bound on one etcd call of the tally (a job read, a revoke).
const DEPOSE_CALL: Duration = Duration::from_secs(2);

/// A node joined this follower because the replica it was connected to,
/// `silent`, stopped answering (see [`crate::depose`]). Bounded by the
/// service ([`crate::limits::check_silent_replica`]).
#[derive(Debug, Clone)]
pub struct Complaint {
    /// The job.
    pub job: String,
    /// The node.
    pub node: String,
    /// The session secret the join presented.
    pub session: Vec<u8>,
    /// The replica it left ("host:port").
    pub silent: String,
    /// When the service heard it.
    pub at: std::time::Instant,
}

/// What a replica's tally of complaints keeps across its terms.
struct Hearing {
    complaints: mpsc::Receiver<Complaint>,
    tally: Tally,
    /// Complaints are summed up, never logged one by one.
    said: Quiet,
    /// Complaints written to etcd (agent-only rendezvous).
    shared: Shared,
}

/// How long a complaint written to etcd outlives its last repetition, at
/// least (seconds: the TTL of the lease it is put with).
const SHARED_TTL: i64 = 3;
/// A lease for shared complaints is used this long, then a new one granted.
const SHARED_LEASE_USE: Duration = Duration::from_secs(1);
/// One node's complaint is written at most this often.
const SHARED_EVERY: Duration = Duration::from_millis(250);
/// Complaints of one job read back at most.
const SHARED_READ: i64 = 4096;
/// Nodes whose last write is remembered (then forgotten all at once).
const SHARED_NODES: usize = 1024;

/// Complaints this replica wrote to etcd, so that every replica counts
/// them: with `--rdzv-backend etcd` each agent asks only its own replica,
/// which alone would never see a majority. Each is a key
/// `<prefix>/complaints/<leader lease>/<job>/<node>` (value: the node's
/// session secret, then its id) on a short lease of its own, so it lapses
/// a few seconds after the node stops complaining.
#[derive(Default)]
struct Shared {
    /// The lease complaints are put with, and when it was granted.
    lease: Option<(i64, std::time::Instant)>,
    /// When each (job, node) was last written.
    written: std::collections::BTreeMap<(String, String), std::time::Instant>,
}

/// Deletes the complaints this replica wrote to etcd (revokes their lease).
async fn withdraw_complaints(client: &Client, hearing: &tokio::sync::Mutex<Hearing>) {
    let lease = hearing.lock().await.shared.lease.take();
    if let Some((id, _)) = lease {
        let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(id)).await;
    }
}

/// Where complaints about the leader of `lease` by nodes of `job` are kept.
fn complaints_prefix(prefix: &str, lease: i64, job: &str) -> String {
    format!(
        "{prefix}/complaints/{lease:016x}/{}/",
        accel_wire::keys::escape(job)
    )
}

/// Writes complaint `c` about `term` to etcd (at most every
/// [`SHARED_EVERY`] per node; every call bounded).
async fn share(client: &Client, prefix: &str, term: &Term, c: &Complaint, shared: &mut Shared) {
    let now = std::time::Instant::now();
    let who = (c.job.clone(), c.node.clone());
    if shared
        .written
        .get(&who)
        .is_some_and(|at| now.saturating_duration_since(*at) < SHARED_EVERY)
    {
        return;
    }
    if shared.written.len() >= SHARED_NODES {
        shared.written.clear();
    }
    shared.written.insert(who, now);
    let lease = match shared.lease {
        Some((id, at)) if now.saturating_duration_since(at) < SHARED_LEASE_USE => id,
        _ => match tokio::time::timeout(DEPOSE_CALL, client.lease_grant(SHARED_TTL)).await {
            Ok(Ok(l)) => {
                shared.lease = Some((l.id, now));
                l.id
            }
            _ => return,
        },
    };
    let key = format!(
        "{}{}",
        complaints_prefix(prefix, term.lease, &c.job),
        accel_wire::keys::escape(&c.node)
    );
    let mut value = c.session.clone();
    value.extend_from_slice(c.node.as_bytes());
    if let Ok(Err(e)) =
        tokio::time::timeout(DEPOSE_CALL, client.put_with_lease(key, value, lease)).await
    {
        tracing::debug!(error = %e, "cannot write a complaint to etcd");
    }
}

/// The complaints about `term` by nodes of `job` that etcd holds (written
/// by any replica), as (node, session secret).
async fn shared_complaints(
    client: &Client,
    prefix: &str,
    term: &Term,
    job: &str,
) -> Vec<(String, Vec<u8>)> {
    let options = accel_etcd::GetOptions::new()
        .with_prefix()
        .with_limit(SHARED_READ);
    let read = tokio::time::timeout(
        DEPOSE_CALL,
        client.get(complaints_prefix(prefix, term.lease, job), Some(options)),
    )
    .await;
    let Ok(Ok(resp)) = read else {
        return Vec::new();
    };
    resp.kvs
        .iter()
        .filter_map(|kv| {
            let (session, node) = kv.value.split_at_checked(crate::job::SESSION_BYTES)?;
            let node = std::str::from_utf8(node).ok()?;
            crate::limits::check_name("node_id", node).ok()?;
            Some((node.to_owned(), session.to_vec()))
        })
        .collect()
}

/// How a replica reaches etcd and what it announces.
#[derive(Clone)]
pub struct EtcdOptions {
    /// etcd client URLs (`http://h1:2379`, `https://…`).
    pub endpoints: Vec<String>,
    /// Key prefix of this server's election and jobs.
    pub prefix: String,
    /// Lease of a replica's election key: how long a leader that vanished
    /// keeps its place.
    pub lease: Duration,
    /// etcd user and password.
    pub user: Option<(String, String)>,
    /// TLS to etcd.
    pub tls: Option<TlsOptions>,
    /// The address agents reach this replica at (`HOST:PORT`).
    pub advertise: String,
    /// Whether the job's nodes keep presence keys under `<prefix>/presence/`
    /// (agent-only rendezvous): the leader then drops a member whose key
    /// is gone, its etcd lease expired ([`crate::presence`]).
    pub presence: bool,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls.is_some())
            .field("advertise", &self.advertise)
            .field("presence", &self.presence)
            .finish()
    }
}

impl EtcdOptions {
    fn election(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    fn lease_secs(&self) -> i64 {
        // etcd leases are whole seconds.
        i64::try_from(self.lease.as_secs().max(1)).unwrap_or(i64::MAX)
    }
}

/// What this replica is now, as the service sees it.
#[derive(Debug, Clone)]
pub enum Role {
    /// It serves the rendezvous with this registry (boxed: a registry
    /// is many handles, a follower one address).
    Leader(Box<Registry>),
    /// Another replica serves (at `leader`, once known).
    Follower {
        /// The leader's address.
        leader: Option<String>,
    },
}

impl Role {
    /// The registry to serve a call with, or the status that sends the
    /// caller to the leader.
    pub fn registry(&self) -> Result<&Registry, Status> {
        match self {
            Role::Leader(r) => Ok(r),
            Role::Follower { leader } => {
                let mut status = Status::unavailable(match leader {
                    Some(addr) => {
                        format!("this rdzv-server is a follower; the leader is at {addr}")
                    }
                    None => {
                        "this rdzv-server is a follower and no leader is elected yet; retry shortly"
                            .to_owned()
                    }
                });
                if let Some(addr) = leader.as_deref().and_then(|a| a.parse().ok()) {
                    status.metadata_mut().insert(LEADER_METADATA, addr);
                }
                Err(status)
            }
        }
    }
}

/// Connects to etcd with the options' credentials.
pub async fn connect(o: &EtcdOptions) -> Result<Client, accel_etcd::Error> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        // A member cut off from the others refuses instead of answering
        // from (or waiting on) a stale view.
        .with_require_leader(true);
    if let Some((user, password)) = &o.user {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &o.tls {
        options = options.with_tls(tls.clone());
    }
    Client::connect(&o.endpoints, Some(options)).await
}

/// TLS to etcd from PEM files: `ca` to verify the members, `cert` and
/// `key` (both or neither) to prove who this client is. Errors name the file.
pub fn tls_options(
    ca: Option<&std::path::Path>,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<TlsOptions, String> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = ca {
        tls = tls.ca_certificate(read(ca)?);
    }
    if let Some((cert, key)) = identity {
        tls = tls.identity(read(cert)?, read(key)?);
    }
    Ok(tls)
}

/// How a replica's rendezvous ends, beyond etcd.
#[derive(Debug, Clone)]
pub struct Tenure {
    /// How long finished jobs are remembered.
    pub ttl: Duration,
    /// What the registry holds at most.
    pub limits: Limits,
    /// Whether the replicas end with the job (agent-only rendezvous): a
    /// leader that shuts down deletes the jobs that are over (no later
    /// leader would forget them), and a node resuming a job the store does
    /// not hold is refused rather than relearned (the job ended, or was
    /// never written).
    pub ends_with_job: bool,
    /// What every term's registry counts into.
    pub metrics: crate::metrics::ServerMetrics,
}

/// What one term of a replica works with.
struct Replica<'a> {
    o: &'a EtcdOptions,
    tenure: Tenure,
    roles: &'a watch::Sender<Role>,
    stop: &'a CancellationToken,
    /// Complaints about the leader, heard while following.
    hearing: &'a tokio::sync::Mutex<Hearing>,
    /// Whether this term led (its end is then news, not a retry).
    led: AtomicBool,
}

/// Why a term ended.
#[derive(Debug)]
enum Ended {
    Shutdown,
    Lost(String),
}

/// Campaigns, leads and steps down, term after term, until `stop`; then
/// hands over (flush, close, resign) if leading. While following, it
/// counts the `complaints` its service hears and deposes a leader most
/// nodes of a job cannot reach ([`crate::depose`]).
pub async fn replicate(
    options: EtcdOptions,
    tenure: Tenure,
    roles: watch::Sender<Role>,
    stop: CancellationToken,
    complaints: mpsc::Receiver<Complaint>,
) {
    let hearing = tokio::sync::Mutex::new(Hearing {
        complaints,
        tally: Tally::new(),
        said: Quiet::every(Duration::from_secs(10)),
        shared: Shared::default(),
    });
    // etcd down or without quorum fails every attempt: said once, then
    // summed up every 10 s.
    let mut failing = Quiet::every(Duration::from_secs(10));
    // Leases of earlier terms that could not be revoked (etcd was down):
    // revoked first thing once etcd answers again, so this replica's old
    // election key does not name it leader for a further lease after an
    // etcd outage (etcd restores leases with a fresh TTL when it restarts).
    let mut unrevoked: Vec<i64> = Vec::new();
    loop {
        let replica = Replica {
            o: &options,
            tenure: tenure.clone(),
            roles: &roles,
            stop: &stop,
            hearing: &hearing,
            led: AtomicBool::new(false),
        };
        match term(&replica, &mut unrevoked).await {
            Ended::Shutdown => return,
            Ended::Lost(why) => {
                if replica.led.load(Ordering::Relaxed) {
                    warn!(reason = %why, "stepped down: no longer leading; campaigning again");
                    failing = Quiet::every(Duration::from_secs(10));
                } else {
                    match failing.hit(Instant::now()) {
                        Say::First => {
                            warn!(reason = %why, "cannot campaign; retrying every second")
                        }
                        Say::Summary(n, over) => {
                            warn!(reason = %why, attempts = n, over_s = over.as_secs(), "still cannot campaign")
                        }
                        Say::Nothing => tracing::debug!(reason = %why, "cannot campaign"),
                    }
                }
                roles.send_replace(Role::Follower { leader: None });
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }
}

async fn term(r: &Replica<'_>, unrevoked: &mut Vec<i64>) -> Ended {
    let lost = |what: &str, e: accel_etcd::Error| Ended::Lost(format!("{what}: {e}"));
    let client = match connect(r.o).await {
        Ok(c) => c,
        Err(e) => return lost("cannot reach etcd", e),
    };
    let mut left = Vec::new();
    for old in unrevoked.drain(..) {
        match tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(old)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.is_not_found() => {}
            _ => left.push(old),
        }
    }
    if !left.is_empty() {
        *unrevoked = left;
        return Ended::Lost("cannot revoke the lease of an earlier term".into());
    }
    let granted = Instant::now();
    let lease = match client.lease_grant(r.o.lease_secs()).await {
        Ok(l) => l.id,
        Err(e) => return lost("cannot get an etcd lease", e),
    };
    let ended = hold(r, &client, lease, granted).await;
    // However the term ended, its lease goes with it, so no key of this
    // replica outlives the term; its shared complaints neither.
    match tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(lease)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.is_not_found() => {}
        _ => unrevoked.push(lease),
    }
    withdraw_complaints(&client, r.hearing).await;
    ended
}

/// Campaigns with `lease`, then leads until the lease or a write is lost, or
/// `stop`.
async fn hold(r: &Replica<'_>, client: &Client, lease: i64, granted: Instant) -> Ended {
    let lost = |what: &str, e: accel_etcd::Error| Ended::Lost(format!("{what}: {e}"));
    let expired = CancellationToken::new();
    let clock = LeaseClock::granted(granted.into_std(), r.o.lease);
    let keeper = tokio::spawn(keep_lease(
        client.clone(),
        lease,
        clock.clone(),
        expired.clone(),
    ));
    let _keeper = AbortOnDrop(keeper);
    let follower = client.clone();
    let (leading, leader) = watch::channel(None);
    let won = tokio::select! {
        result = client.campaign(r.o.election(), r.o.advertise.clone(), lease) => result,
        _ = follow(follower, r.o.election(), r.roles, &leading) => unreachable!("following never ends"),
        _ = hear(client.clone(), &r.o.prefix, r.o.presence, leader, r.hearing, &r.tenure.metrics) => unreachable!("hearing never ends"),
        _ = expired.cancelled() => return Ended::Lost("the lease expired while campaigning".into()),
        _ = r.stop.cancelled() => return Ended::Shutdown,
    };
    // Won or not, the last leader's address is stale now.
    r.roles.send_replace(Role::Follower { leader: None });
    // Its complaints were about a leader that is gone.
    withdraw_complaints(client, r.hearing).await;
    let key = match won {
        Ok(campaign) => match campaign.leader {
            Some(k) => k,
            None => return Ended::Lost("etcd elected this replica without a key".into()),
        },
        Err(e) => return lost("the campaign failed", e),
    };
    // A shutdown that began while the campaign was being won (the last
    // leader resigned as its own node finished) takes nothing over: this
    // node is leaving too.
    if r.stop.is_cancelled() {
        resign(client, key).await;
        return Ended::Shutdown;
    }
    let fence = Fence {
        key: key.key.clone(),
        revision: key.rev,
    };
    let store = EtcdStore::new(client.clone(), &r.o.prefix, Some(fence.clone()));
    let mut registry = Registry::with_store(r.tenure.ttl, r.tenure.limits, Arc::new(store))
        .with_metrics(r.tenure.metrics.clone())
        .with_lease(clock);
    if r.tenure.ends_with_job {
        registry = registry.without_relearning();
    }
    let loaded = match registry.load().await {
        Ok(n) => n,
        Err(e) => {
            resign(client, key).await;
            return Ended::Lost(format!("cannot load the jobs: {e}"));
        }
    };
    if r.stop.is_cancelled() {
        resign(client, key).await;
        return Ended::Shutdown;
    }
    info!(jobs = loaded, advertise = %r.o.advertise, "leading: serving the rendezvous");
    r.led.store(true, Ordering::Relaxed);
    r.roles
        .send_replace(Role::Leader(Box::new(registry.clone())));
    let fenced = CancellationToken::new();
    let ticker = tokio::spawn(crate::tick_and_flush(
        registry.clone(),
        Some(fenced.clone()),
    ));
    let _ticker = AbortOnDrop(ticker);
    // A leader deposed by a follower (its lease revoked) learns at once,
    // not at its next keep-alive or write.
    let deposed = CancellationToken::new();
    let _watch = AbortOnDrop(tokio::spawn(watch_own_key(
        client.clone(),
        fence.clone(),
        deposed.clone(),
    )));
    // A node whose etcd lease expired is dead: dropped then, not at the
    // keep-alive limit (agent-only rendezvous).
    let _presence = r.o.presence.then(|| {
        AbortOnDrop(tokio::spawn(crate::presence::watch(
            client.clone(),
            r.o.prefix.clone(),
            registry.clone(),
            r.o.lease,
        )))
    });
    let ended = tokio::select! {
        _ = expired.cancelled() => Ended::Lost("the etcd lease could not be renewed in time".into()),
        _ = fenced.cancelled() => Ended::Lost("etcd refused a write: another replica leads".into()),
        _ = deposed.cancelled() => Ended::Lost(
            "its election key is gone: its etcd lease was revoked (a follower deposed it because most nodes of a job could not reach it, or an operator did)".into(),
        ),
        _ = r.stop.cancelled() => Ended::Shutdown,
    };
    r.roles.send_replace(Role::Follower { leader: None });
    match &ended {
        Ended::Shutdown => {
            if let Err(e) = registry.flush().await {
                warn!(error = %e, "cannot write the last job state to etcd");
            } else if r.tenure.ends_with_job && registry.forget_finished() > 0 {
                // Their outcome reached the nodes with the flush above.
                if let Err(e) = registry.flush().await {
                    warn!(error = %e, "cannot delete the finished job from etcd");
                }
            }
            registry.close_all("the rendezvous server is shutting down", true);
            resign(client, key).await;
        }
        Ended::Lost(_) => {
            registry.close_all(
                "this rdzv-server is no longer the leader; reconnect to the new one",
                true,
            );
        }
    }
    ended
}

/// Cancels `deposed` once the leader's election key (`fence`) is deleted
/// or replaced: its lease was revoked ([`crate::depose`]). Watches the key
/// first, then reads it, so a deletion between the two is not missed; a
/// watch that fails is set up again (the lease keeper and the fenced
/// writes still end the term meanwhile).
async fn watch_own_key(client: Client, fence: Fence, deposed: CancellationToken) {
    loop {
        if let Ok(mut changes) = client.watch(fence.key.clone()).await {
            let held = client
                .get(fence.key.clone(), None)
                .await
                .map(|r| r.kvs.iter().any(|kv| kv.create_revision == fence.revision));
            if let Ok(false) = held {
                deposed.cancel();
                return;
            }
            while let Ok(Some(r)) = changes.message().await {
                let gone = r.events.iter().any(|e| {
                    e.r#type == accel_etcd::EventType::Delete as i32
                        || e.kv
                            .as_ref()
                            .is_some_and(|kv| kv.create_revision != fence.revision)
                });
                if gone {
                    deposed.cancel();
                    return;
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Gives up leadership at once so another replica need not wait for the lease.
async fn resign(client: &Client, key: LeaderKey) {
    if let Err(e) = client.resign(key).await {
        warn!(error = %e, "cannot resign; another replica leads once the lease expires");
    }
}

/// Renews `lease` every third of it, moving `clock` on with the send time
/// of each keep-alive etcd answered; cancels `expired` once the clock says
/// the lease may have lapsed (two thirds of it after the last renewal was
/// sent), or etcd says it is gone. Every wait is bounded by that moment, so
/// a hung call cannot make the loss late.
pub(crate) async fn keep_lease(
    client: Client,
    lease: i64,
    clock: LeaseClock,
    expired: CancellationToken,
) {
    let every = clock.window() / 2;
    let mut renewed = Instant::now();
    let mut link = None;
    loop {
        let overdue = Instant::from_std(clock.until());
        if Instant::now() >= overdue {
            expired.cancel();
            return;
        }
        if link.is_none() {
            link = tokio::time::timeout_at(overdue, client.lease_keep_alive(lease))
                .await
                .ok()
                .and_then(Result::ok);
        }
        if let Some((keeper, stream)) = &mut link {
            let sent = Instant::now();
            let answer = tokio::time::timeout_at(overdue, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(r))) if r.ttl > 0 => {
                    clock.renewed(sent.into_std());
                    renewed = sent;
                }
                Ok(Ok(Some(_))) => {
                    expired.cancel();
                    return;
                }
                // The stream broke (its etcd member went away): a new one.
                Ok(_) => link = None,
                Err(_) => continue,
            }
        }
        tokio::time::sleep_until((renewed + every).min(overdue)).await;
    }
}

/// Keeps the follower's idea of the leader's address current. etcd streams
/// every change of leader (`Observe`), so a follower (every agent of an
/// agent-only job is one) costs etcd one stream, not a call every half
/// second (it asks every [`RECHECK`] as well, since a stream through a
/// member cut off from the others just goes silent); while no stream can
/// be had, it asks every [`FOLLOW_EVERY`].
async fn follow(
    client: Client,
    election: String,
    roles: &watch::Sender<Role>,
    terms: &watch::Sender<Option<Term>>,
) {
    let set = |kv: Option<&accel_etcd::KeyValue>| {
        let leader = address(kv);
        terms.send_replace(kv.and_then(|kv| {
            Some(Term {
                addr: leader.clone()?,
                lease: kv.lease,
            })
        }));
        roles.send_if_modified(|role| match role {
            Role::Follower { leader: known } if *known != leader => {
                *known = leader.clone();
                true
            }
            _ => false,
        });
    };
    loop {
        set(leader_now(&client, &election).await.as_ref());
        if let Ok(mut changes) = client.observe(election.clone()).await {
            loop {
                match tokio::time::timeout(RECHECK, changes.message()).await {
                    Ok(Ok(Some(r))) => set(r.kv.as_ref()),
                    Ok(_) => break,
                    // A stream through a member cut off from the others is
                    // silent: ask now and then all the same.
                    Err(_) => set(leader_now(&client, &election).await.as_ref()),
                }
            }
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// A leader key's value: the leader's address.
fn address(kv: Option<&accel_etcd::KeyValue>) -> Option<String> {
    kv.and_then(|kv| std::str::from_utf8(&kv.value).ok())
        .map(str::to_owned)
}

/// Who leads now, by asking: "no leader" is an error of the election API
/// (and Observe says nothing until there is one).
async fn leader_now(client: &Client, election: &str) -> Option<accel_etcd::KeyValue> {
    client.leader(election).await.ok()?.kv
}

/// Whether a complaint's `silent` replica is the leader at `addr` (the
/// same text, or the same socket address written otherwise).
fn same_replica(silent: &str, addr: &str) -> bool {
    silent == addr
        || matches!(
            (silent.parse::<std::net::SocketAddr>(), addr.parse::<std::net::SocketAddr>()),
            (Ok(a), Ok(b)) if a == b
        )
}

/// Counts the complaints the service hears about the current leader
/// (`leader`, as [`follow`] learns it) and deposes it when most nodes of a
/// job complained ([`crate::depose`]): reads the job's members from etcd
/// under `prefix`, revokes the leader's lease. Never ends.
async fn hear(
    client: Client,
    prefix: &str,
    shared: bool,
    leader: watch::Receiver<Option<Term>>,
    hearing: &tokio::sync::Mutex<Hearing>,
    metrics: &crate::metrics::ServerMetrics,
) {
    let mut guard = hearing.lock().await;
    let h = &mut *guard;
    let store = EtcdStore::new(client.clone(), prefix, None);
    while let Some(c) = h.complaints.recv().await {
        let now = std::time::Instant::now();
        if now.saturating_duration_since(c.at) > COMPLAINT_FRESH {
            continue;
        }
        let Some(term) = leader.borrow().clone() else {
            continue;
        };
        if !same_replica(&c.silent, &term.addr) {
            continue;
        }
        match h.said.hit(Instant::now()) {
            Say::First => info!(
                leader = %term.addr,
                "agents report the leader silent; counting their complaints (most nodes of a job complaining depose it)"
            ),
            Say::Summary(n, over) => info!(
                leader = %term.addr,
                complaints = n,
                over_s = over.as_secs(),
                jobs = h.tally.jobs(),
                "agents still report the leader silent"
            ),
            Say::Nothing => {}
        }
        if shared {
            share(&client, prefix, &term, &c, &mut h.shared).await;
        }
        let mut queue = h.tally.step(
            now,
            Event::Complaint {
                job: c.job,
                node: c.node,
                session: c.session,
                leader: term.clone(),
            },
        );
        while let Some(action) = queue.pop() {
            match action {
                Action::Fetch { job } => {
                    match tokio::time::timeout(DEPOSE_CALL, store.job(&job)).await {
                        Ok(Ok(record)) => {
                            let members = record.map(|r| Members {
                                nodes: r
                                    .members
                                    .into_iter()
                                    .map(|(id, m)| (id, m.session))
                                    .collect(),
                                drop_limit: r.config.dead_after,
                            });
                            let others = match shared {
                                true => shared_complaints(&client, prefix, &term, &job).await,
                                false => Vec::new(),
                            };
                            queue.extend(h.tally.step(
                                std::time::Instant::now(),
                                Event::Members {
                                    job: job.clone(),
                                    members,
                                },
                            ));
                            // The other replicas' complaints count as heard now.
                            for (node, session) in others {
                                queue.extend(h.tally.step(
                                    std::time::Instant::now(),
                                    Event::Complaint {
                                        job: job.clone(),
                                        node,
                                        session,
                                        leader: term.clone(),
                                    },
                                ));
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "cannot read a job's members to count complaints")
                        }
                        Err(_) => tracing::debug!("reading a job's members timed out"),
                    }
                }
                Action::Depose {
                    leader,
                    job,
                    complained,
                    of,
                } => {
                    // Its own task: the revoke elects this replica, which
                    // ends this loop (the campaign won) before the answer
                    // may be read here.
                    let client = client.clone();
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        let revoked =
                            tokio::time::timeout(DEPOSE_CALL, client.lease_revoke(leader.lease))
                                .await;
                        match revoked {
                            Ok(Ok(_)) => {
                                metrics.leader_deposed();
                                warn!(
                                    leader = %leader.addr,
                                    job = %accel_wire::keys::escape(&job),
                                    "deposing the leader: {complained} of {of} nodes of the job cannot reach it; \
                                     its etcd lease is revoked, the next replica in line leads now and the nodes resume there"
                                );
                            }
                            // Another replica counted the same complaints first.
                            Ok(Err(e)) if e.is_not_found() => info!(
                                leader = %leader.addr,
                                "{complained} of {of} nodes of a job cannot reach the leader; another replica deposed it already"
                            ),
                            Ok(Err(e)) => warn!(
                                leader = %leader.addr,
                                error = %e,
                                "{complained} of {of} nodes of a job cannot reach the leader, but revoking its etcd lease failed"
                            ),
                            Err(_) => warn!(
                                leader = %leader.addr,
                                "{complained} of {of} nodes of a job cannot reach the leader, but revoking its etcd lease timed out"
                            ),
                        }
                    });
                }
            }
        }
    }
    // The service holds the sender for as long as the process serves.
    std::future::pending::<()>().await;
}

/// Aborts a background task when its owner goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether a store error means another replica leads.
pub fn is_fenced(e: &StoreError) -> bool {
    matches!(e, StoreError::Fenced(_))
}

#[cfg(test)]
mod tests {
    use super::{same_replica, Role, LEADER_METADATA};

    #[test]
    fn a_complaint_names_the_leader_by_its_advertised_address_or_the_same_socket() {
        assert!(same_replica("head-1:29400", "head-1:29400"));
        assert!(same_replica("[::1]:29400", "[0:0:0:0:0:0:0:1]:29400"));
        assert!(!same_replica("head-1:29400", "head-2:29400"));
        assert!(!same_replica("head-1:29400", "head-1:29401"));
        assert!(!same_replica("", "head-1:29400"));
    }

    #[test]
    fn a_follower_names_the_leader_in_its_refusal() {
        let s = Role::Follower {
            leader: Some("head-2:29400".into()),
        }
        .registry()
        .expect_err("a follower serves nothing");
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.message().contains("head-2:29400"), "{s:?}");
        assert_eq!(
            s.metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some("head-2:29400")
        );
        let s = Role::Follower { leader: None }
            .registry()
            .expect_err("a follower serves nothing");
        assert!(s.message().contains("no leader"), "{s:?}");
    }
}
