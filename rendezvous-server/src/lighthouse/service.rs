//! The gRPC side of the lighthouse: torchft's `LighthouseService` on its
//! own listener (`--lighthouse ADDR`), the quorum tick, and who may call.
//!
//! torchft's client connects with a plain `http://` URL and sends no
//! credentials, so this port cannot ask for the rendezvous token or TLS;
//! instead it serves only addresses in its allow list
//! (`--lighthouse-allow`, loopback by default: other connections are closed
//! as they are accepted), and bounds what it holds (the [`super::limits`],
//! [`MAX_WAITING`] calls, keep-alives on idle connections).
//!
//! # Every replica answers; the leader decides
//! The quorums are the leader's alone. A follower passes each call on to
//! the leader (at the leader's advertised host and this replica's own
//! `--lighthouse` port: every replica serves the lighthouse on the same
//! port) and hands back its answer, so torchft's managers may point at any
//! replica, or at a Service over all of them, as the agents do. A call
//! passed on is marked ([`FORWARDED`]); a replica that does not lead
//! refuses a marked call rather than pass it on again. When the leader
//! dies, a follower holds the calls it passes on (retrying every
//! [`RETRY_EVERY`]) until a leader is elected, itself or another, and a
//! leader that loses the lead passes its waiting calls on to the new one:
//! a manager's call outlives a failover (lease + a tick), and one whose
//! connection died with the leader reconnects to a live replica
//! (`TORCHFT_QUORUM_RETRIES`). The server shutting down ends waiting calls
//! with `UNAVAILABLE`.
//!
//! The state and the sender of the quorums it forms share one lock: a
//! caller subscribes, joins and hears the quorums in the order they formed,
//! as with torchft's own lighthouse.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use accel_proto::torchft as pb;
use accel_proto::torchft::lighthouse_service_client::LighthouseServiceClient;
use accel_proto::torchft::lighthouse_service_server::{
    LighthouseService as Service, LighthouseServiceServer,
};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::{limits, Action, Event, Lighthouse, LighthouseConfig};
use crate::ha::Role;

/// The most `Quorum` calls waiting at once.
pub const MAX_WAITING: usize = 4 * super::MAX_GROUPS;

/// Quorums a slow waiter may fall behind before it is told to ask again.
const FORMED_QUEUE: usize = 64;

/// The metadata key a follower marks a call it passes on to the leader
/// with.
pub const FORWARDED: &str = "x-accel-lighthouse-forwarded";

/// How often a follower tries again to reach a leader for a call it holds.
pub const RETRY_EVERY: Duration = Duration::from_millis(200);

/// How long a follower waits to reach the leader for a heartbeat.
const HEARTBEAT_PASS_ON: Duration = Duration::from_secs(2);

/// Quorum ids a lead reserves in the job store at a time; it reserves more
/// when half are handed out.
pub const RESERVED_IDS: i64 = 1 << 20;

/// Networks allowed to call the lighthouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    nets: Vec<(IpAddr, u8)>,
}

impl Allow {
    /// Loopback only: the default.
    pub fn loopback() -> Self {
        Self {
            nets: vec![
                (IpAddr::from([127, 0, 0, 0]), 8),
                (IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]), 128),
            ],
        }
    }

    /// Whether `ip` may call (an IPv4 address mapped into IPv6 counts as
    /// itself).
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|(net, len)| within(ip, *net, *len))
    }
}

/// An IPv4 address mapped into IPv6 as itself.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl std::str::FromStr for Allow {
    type Err = String;

    /// `10.0.0.0/8,192.168.1.7,fd00::/8`; `any` for every address.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "any" {
                nets.push((IpAddr::from([0, 0, 0, 0]), 0));
                nets.push((IpAddr::from([0u16; 8]), 0));
                continue;
            }
            let (addr, len) = match part.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (part, None),
            };
            let ip: IpAddr = addr.parse().map_err(|_| {
                format!(
                    "'{}' is not an address or a network (10.0.0.0/8, fd00::/8, any)",
                    accel_input::excerpt(part)
                )
            })?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                None => max,
                Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(|| {
                    format!(
                        "'{}': a prefix length is 0 to {max}",
                        accel_input::excerpt(part)
                    )
                })?,
            };
            // An IPv4 network written IPv6-mapped is matched as IPv4, as
            // the callers' mapped addresses are.
            let net = match (canonical(ip), ip) {
                (IpAddr::V4(v4), IpAddr::V6(_)) if len >= 96 => (IpAddr::V4(v4), len - 96),
                (IpAddr::V4(_), IpAddr::V6(_)) => (ip, len),
                _ => (ip, len),
            };
            nets.push(net);
        }
        if nets.is_empty() {
            return Err("give the networks that may call the lighthouse (10.0.0.0/8, any)".into());
        }
        Ok(Self { nets })
    }
}

impl std::fmt::Display for Allow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.nets.iter().map(|(n, l)| format!("{n}/{l}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// The lighthouse as the handlers, the ticker and the status page share it.
#[derive(Debug, Clone)]
pub struct Shared {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    lighthouse: Mutex<Lighthouse>,
    formed: broadcast::Sender<Arc<pb::Quorum>>,
    allow: Allow,
    waiting: Semaphore,
    /// This replica's lead, once it has started afresh with its quorum ids
    /// reserved ([`Shared::take_lead`]); `None` while it does not lead, or
    /// has not reserved yet. Only a lead steps.
    lead: watch::Sender<Option<Lead>>,
    /// Leads this replica started.
    terms: AtomicU64,
    /// The id of the last quorum logged.
    said: AtomicI64,
}

/// A caller's receiver of the quorums formed.
type Formed = broadcast::Receiver<Arc<pb::Quorum>>;

/// One lead of this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lead {
    /// Which of this replica's leads (a call that joined one rejoins the
    /// next: the state starts afresh).
    term: u64,
    /// The end of the quorum ids reserved.
    end: i64,
}

/// The wall clock since the epoch (zero before it).
fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Milliseconds since the epoch, where quorum ids start.
fn now_ms() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX / 2)
}

impl Shared {
    /// A lighthouse with `config`, answering `allow`. Each lead reserves
    /// its quorum ids ([`RESERVED_IDS`] at a time) in the job store before
    /// it answers, above every id reserved before and above the time in
    /// milliseconds since the epoch (`Shared::take_lead`): a replica that
    /// takes over, or a restarted server, hands out ids above those handed
    /// out before, so no manager mistakes a new quorum for an old one
    /// (torchft keys a quorum's store prefix by its id). Without a store
    /// that keeps them (no etcd) the clock alone orders leads: one per
    /// membership change or failed commit grows far slower than the
    /// milliseconds, as long as the clock does not go back.
    pub fn new(config: LighthouseConfig, allow: Allow) -> Self {
        Self {
            inner: Arc::new(Inner {
                lighthouse: Mutex::new(Lighthouse::resuming(config, now_ms())),
                formed: broadcast::channel(FORMED_QUEUE).0,
                allow,
                waiting: Semaphore::new(MAX_WAITING),
                lead: watch::channel(None).0,
                terms: AtomicU64::new(0),
                said: AtomicI64::new(i64::MIN),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lighthouse> {
        self.inner
            .lighthouse
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the lighthouse's state.
    pub fn read<T>(&self, f: impl FnOnce(&Lighthouse) -> T) -> T {
        f(&self.lock())
    }

    /// Steps the lighthouse and hands out the quorums it formed, under its
    /// lock; with `subscribe`, the caller's receiver, taken under the same
    /// lock before the step (it hears exactly the quorums formed from then
    /// on, in order). Only a lead that has reserved its ids steps.
    fn step(&self, event: Event, subscribe: bool) -> Result<Option<Formed>, Status> {
        self.step_in(event, subscribe).map(|(rx, _)| rx)
    }

    /// [`Shared::step`], and the term of the lead that stepped.
    fn step_in(&self, event: Event, subscribe: bool) -> Result<(Option<Formed>, u64), Status> {
        let mut l = self.lock();
        let Some(lead) = *self.inner.lead.borrow() else {
            return Err(Status::unavailable(
                "this rdzv-server replica is taking the lead of the lighthouse; retry",
            ));
        };
        let rx = subscribe.then(|| self.inner.formed.subscribe());
        let actions = l
            .step(Instant::now(), event)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        for Action::Formed(mut quorum) in actions {
            let now = since_epoch();
            quorum.created = Some(pb::Timestamp {
                seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
            });
            // torchft asks for a quorum every step: said when it changes.
            let changed =
                self.inner.said.swap(quorum.quorum_id, Ordering::SeqCst) != quorum.quorum_id;
            if changed {
                info!(
                    quorum_id = quorum.quorum_id,
                    replica_groups = quorum.participants.len(),
                    "lighthouse: a new quorum"
                );
            } else {
                debug!(quorum_id = quorum.quorum_id, "lighthouse: quorum formed");
            }
            // Never blocks; nobody waiting is no error.
            let _ = self.inner.formed.send(Arc::new(quorum));
        }
        Ok((rx, lead.term))
    }

    /// This replica stopped leading: its next lead starts afresh.
    fn stopped_leading(&self) {
        self.inner.lead.send_if_modified(|l| l.take().is_some());
    }

    /// Whether this lead has started (its ids reserved), and until which
    /// id.
    fn lead_end(&self) -> Option<i64> {
        self.inner.lead.borrow().map(|l| l.end)
    }

    /// Waits until this lead has started.
    async fn lead_started(&self) {
        let mut lead = self.inner.lead.subscribe();
        // The sender lives as long as `self`.
        let _ = lead.wait_for(Option::is_some).await;
    }

    /// Starts this replica's lead: the state afresh (another replica may
    /// have led meanwhile; the managers ask again), its quorum ids from
    /// `first`, reserved below `end`.
    fn take_lead(&self, first: i64, end: i64) {
        let mut l = self.lock();
        let config = l.config().clone();
        *l = Lighthouse::resuming(config, first);
        let term = self.inner.terms.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.lead.send_replace(Some(Lead { term, end }));
    }

    /// Reserves ids in `registry`'s store: the first id a lead may hand
    /// out and the end of its reservation.
    async fn reserve(&self, registry: &crate::registry::Registry) -> Result<(i64, i64), String> {
        let current = self.read(Lighthouse::quorum_id);
        let at_least = current.saturating_add(1).max(now_ms());
        let first = registry
            .reserve_quorum_ids(at_least, RESERVED_IDS)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(at_least);
        Ok((first, first.saturating_add(RESERVED_IDS)))
    }

    /// Applies a reservation: a lead not started starts from its first id;
    /// a started one, whose ids ran towards the end of theirs, goes on
    /// with the later end.
    fn reserved(&self, (first, end): (i64, i64)) {
        match self.lead_end() {
            None => {
                info!(
                    first_quorum_id = first,
                    "lighthouse: leading, quorum ids reserved"
                );
                self.take_lead(first, end);
            }
            Some(_) => {
                self.inner.lead.send_modify(|l| {
                    if let Some(l) = l {
                        l.end = end;
                    }
                });
            }
        }
    }
}

/// The gRPC handlers.
#[derive(Debug, Clone)]
pub struct LighthouseHandlers {
    shared: Shared,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
    leader: Arc<LeaderChannel>,
}

/// What a call sees of this replica's role.
enum Seen {
    Leads,
    Follows(Option<String>),
}

/// The connection to the leader's lighthouse, kept while the leader stays.
#[derive(Debug)]
struct LeaderChannel {
    /// This replica's lighthouse port: the leader's too.
    port: u16,
    channel: Mutex<Option<(String, Channel)>>,
}

impl LeaderChannel {
    /// A channel to the lighthouse of the leader advertised as `leader`
    /// (`HOST:PORT`, the rendezvous address), at this replica's port.
    fn to(&self, leader: &str) -> Result<Channel, Status> {
        let url = leader_url(leader, self.port).ok_or_else(|| {
            Status::unavailable(format!(
                "the leader's advertised address '{}' is not HOST:PORT",
                accel_input::excerpt(leader)
            ))
        })?;
        let mut held = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((u, c)) = held.as_ref() {
            if *u == url {
                return Ok(c.clone());
            }
        }
        let channel = Endpoint::from_shared(url.clone())
            .map_err(|e| Status::unavailable(format!("the leader at {url}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .connect_lazy();
        *held = Some((url, channel.clone()));
        Ok(channel)
    }
}

/// `http://HOST:port` for a leader advertised as `HOST:PORT`.
pub fn leader_url(leader: &str, port: u16) -> Option<String> {
    let (host, p) = leader.rsplit_once(':')?;
    if host.is_empty() || p.parse::<u16>().is_err() {
        return None;
    }
    Some(format!("http://{host}:{port}"))
}

/// Whether a status the leader answered is its answer to the call (handed
/// back as it is) rather than a sign that the leader is gone or going.
fn is_answer(s: &Status) -> bool {
    use tonic::Code;
    !matches!(
        s.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Internal
    )
}

impl LighthouseHandlers {
    /// Handlers over `shared` that answer while `role` leads and pass calls
    /// on to the leader (at its host and `port`, this replica's lighthouse
    /// port) while it follows, until `stop`.
    pub fn new(
        shared: Shared,
        role: watch::Receiver<Role>,
        stop: CancellationToken,
        port: u16,
    ) -> Self {
        Self {
            shared,
            role,
            stop,
            leader: Arc::new(LeaderChannel {
                port,
                channel: Mutex::new(None),
            }),
        }
    }

    fn seen(role: &mut watch::Receiver<Role>) -> Seen {
        match &*role.borrow_and_update() {
            Role::Leader(_) => Seen::Leads,
            Role::Follower { leader } => Seen::Follows(leader.clone()),
        }
    }

    /// Waits for `role` to change, at most [`RETRY_EVERY`]; an error when
    /// the server shuts down.
    async fn wait_change(&self, role: &mut watch::Receiver<Role>) -> Result<(), Status> {
        tokio::select! {
            changed = role.changed() => changed.map_err(|_| shutting_down()),
            () = tokio::time::sleep(RETRY_EVERY) => Ok(()),
            () = self.stop.cancelled() => Err(shutting_down()),
        }
    }

    fn client(&self, leader: &str) -> Result<LighthouseServiceClient<Channel>, Status> {
        Ok(LighthouseServiceClient::new(self.leader.to(leader)?)
            .max_decoding_message_size(limits::MAX_QUORUM_BYTES + limits::MAX_REQUEST_BYTES)
            .max_encoding_message_size(limits::MAX_REQUEST_BYTES))
    }

    fn marked<T>(message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        request
    }

    /// Serves `member`'s quorum call while this replica leads: `None` when
    /// it stops leading before the call is answered (the caller passes it
    /// on to the new leader).
    async fn lead_quorum(
        &self,
        member: &pb::QuorumMember,
        role: &mut watch::Receiver<Role>,
    ) -> Result<Option<pb::LighthouseQuorumResponse>, Status> {
        tokio::select! {
            () = self.shared.lead_started() => {}
            led = role.wait_for(|r| !matches!(r, Role::Leader(_))) => {
                return match led {
                    Ok(_) => Ok(None),
                    Err(_) => Err(shutting_down()),
                };
            }
            () = self.stop.cancelled() => return Err(shutting_down()),
        }
        let id = member.replica_id.clone();
        let mut lead = self.shared.inner.lead.subscribe();
        let (mut formed, term) = match self.shared.step_in(Event::Join(member.clone()), true) {
            Ok((Some(formed), term)) => (formed, term),
            Ok((None, _)) => return Err(Status::internal("the lighthouse gave no receiver")),
            // The lead ended before the join: the caller asks the next.
            Err(_) if lead.borrow_and_update().is_none() => return Ok(None),
            Err(e) => return Err(e),
        };
        loop {
            let got = tokio::select! {
                got = formed.recv() => got,
                () = self.stop.cancelled() => return Err(shutting_down()),
                // The lead this call joined ended (a new term starts
                // afresh without it): it joins the next lead.
                _ = lead.wait_for(|l| l.is_none_or(|l| l.term != term)) => return Ok(None),
                led = role.wait_for(|r| !matches!(r, Role::Leader(_))) => {
                    return match led {
                        Ok(_) => Ok(None),
                        Err(_) => Err(shutting_down()),
                    };
                }
            };
            match got {
                Ok(q) if q.participants.iter().any(|p| p.replica_id == id) => {
                    return Ok(Some(pb::LighthouseQuorumResponse {
                        quorum: Some((*q).clone()),
                    }));
                }
                // A quorum without this group (it was computed before this
                // group joined, or without it): it joins the next one.
                Ok(_) => {
                    self.shared.step(Event::Rejoin(member.clone()), false)?;
                }
                // Quorums were missed, one of them perhaps with this group
                // in it: the caller asks again.
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Err(Status::aborted(format!(
                        "this call fell {n} quorums behind; ask again"
                    )));
                }
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(Status::unavailable("the lighthouse is shutting down"));
                }
            }
        }
    }

    fn admit<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let from = request.remote_addr().map(|a| a.ip());
        if !from.is_some_and(|ip| self.shared.inner.allow.allows(ip)) {
            let who = from.map_or_else(
                || "a caller of unknown address".to_owned(),
                |ip| ip.to_string(),
            );
            return Err(Status::permission_denied(format!(
                "the lighthouse does not answer {who} (--lighthouse-allow {}): add its network to --lighthouse-allow",
                self.shared.inner.allow
            )));
        }
        Ok(())
    }
}

fn shutting_down() -> Status {
    Status::unavailable("the rendezvous server is shutting down; retry against another replica")
}

/// A call passed on to this replica, which does not lead.
fn not_leading(leader: Option<&str>) -> Status {
    match leader {
        Some(l) => Status::unavailable(format!(
            "this rdzv-server replica does not lead (the leader is {l}); a call passed on is not passed on again"
        )),
        None => Status::unavailable(
            "no rdzv-server replica leads yet (an election, or etcd is unreachable); retry",
        ),
    }
}

#[tonic::async_trait]
impl Service for LighthouseHandlers {
    async fn quorum(
        &self,
        request: Request<pb::LighthouseQuorumRequest>,
    ) -> Result<Response<pb::LighthouseQuorumResponse>, Status> {
        self.admit(&request)?;
        let forwarded = request.metadata().contains_key(FORWARDED);
        let member = request
            .into_inner()
            .requester
            .ok_or_else(|| Status::invalid_argument("the quorum request has no requester"))?;
        limits::check_member(&member)?;
        let _slot = self.shared.inner.waiting.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!("{MAX_WAITING} quorum calls wait already; retry"))
        })?;
        let mut role = self.role.clone();
        loop {
            match Self::seen(&mut role) {
                Seen::Leads => {
                    if let Some(answer) = self.lead_quorum(&member, &mut role).await? {
                        return Ok(Response::new(answer));
                    }
                    // No longer leading: on to the new leader.
                }
                Seen::Follows(leader) if forwarded => {
                    return Err(not_leading(leader.as_deref()));
                }
                Seen::Follows(Some(leader)) => {
                    let mut client = self.client(&leader)?;
                    let call = client.quorum(Self::marked(pb::LighthouseQuorumRequest {
                        requester: Some(member.clone()),
                    }));
                    let passed = tokio::select! {
                        answer = call => Some(answer),
                        changed = role.changed() => {
                            changed.map_err(|_| shutting_down())?;
                            None
                        }
                        () = self.stop.cancelled() => return Err(shutting_down()),
                    };
                    match passed {
                        Some(Ok(answer)) => return Ok(answer),
                        Some(Err(s)) if is_answer(&s) => return Err(s),
                        Some(Err(s)) => {
                            debug!(leader = %leader, error = %s.message(), "lighthouse: the leader did not answer a call passed on; trying again");
                            self.wait_change(&mut role).await?;
                        }
                        None => {}
                    }
                }
                Seen::Follows(None) => self.wait_change(&mut role).await?,
            }
        }
    }

    async fn heartbeat(
        &self,
        request: Request<pb::LighthouseHeartbeatRequest>,
    ) -> Result<Response<pb::LighthouseHeartbeatResponse>, Status> {
        self.admit(&request)?;
        let forwarded = request.metadata().contains_key(FORWARDED);
        let id = request.into_inner().replica_id;
        limits::check_id(&id)?;
        let mut role = self.role.clone();
        match Self::seen(&mut role) {
            Seen::Leads => {
                let _ = tokio::time::timeout(HEARTBEAT_PASS_ON, self.shared.lead_started()).await;
                self.shared.step(Event::Heartbeat(id), false)?;
                Ok(Response::new(pb::LighthouseHeartbeatResponse {}))
            }
            Seen::Follows(leader) if forwarded => Err(not_leading(leader.as_deref())),
            Seen::Follows(None) => Err(not_leading(None)),
            Seen::Follows(Some(leader)) => {
                let mut client = self.client(&leader)?;
                let mut request = Self::marked(pb::LighthouseHeartbeatRequest { replica_id: id });
                request.set_timeout(HEARTBEAT_PASS_ON);
                match tokio::time::timeout(HEARTBEAT_PASS_ON, client.heartbeat(request)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(Status::unavailable(format!(
                        "the leader ({leader}) did not take the heartbeat within {HEARTBEAT_PASS_ON:?}"
                    ))),
                }
            }
        }
    }
}

/// Serves the lighthouse on `listener` until `stop`: the handlers and the
/// quorum tick (while this replica leads).
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let tick = shared.read(|l| l.config().quorum_tick);
    let ticker = {
        let (shared, stop, mut role) = (shared.clone(), stop.clone(), role.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Whether a failure to reserve ids was said (once per spell).
            let mut said = false;
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        // A change of role not seen yet ends the lead (a
                        // Leader is sent once per term: a lead never
                        // outlives its term).
                        if role.has_changed().unwrap_or(true) {
                            let _ = role.borrow_and_update();
                            shared.stopped_leading();
                        }
                        let registry = match &*role.borrow() {
                            Role::Leader(r) => Some((**r).clone()),
                            Role::Follower { .. } => None,
                        };
                        let Some(registry) = registry else {
                            shared.stopped_leading();
                            continue;
                        };
                        let running_out = shared.lead_end().is_none_or(|end| {
                            shared.read(Lighthouse::quorum_id) > end.saturating_sub(RESERVED_IDS / 2)
                        });
                        if running_out {
                            match shared.reserve(&registry).await {
                                // The role changed meanwhile: the next
                                // pass ends this lead and starts afresh.
                                Ok(_) if role.has_changed().unwrap_or(true) => continue,
                                Ok(reservation) => {
                                    said = false;
                                    shared.reserved(reservation);
                                }
                                Err(e) if !said => {
                                    said = true;
                                    warn!(error = %e, "lighthouse: cannot reserve quorum ids in the job store; not answering until it can");
                                }
                                Err(_) => {}
                            }
                        }
                        if shared.lead_end().is_some() {
                            if let Err(e) = shared.step(Event::Tick, false) {
                                warn!(error = %e.message(), "lighthouse tick");
                            }
                        }
                    }
                    changed = role.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        // A new term, or none: either way this lead ends.
                        let _ = role.borrow_and_update();
                        shared.stopped_leading();
                    }
                    () = stop.cancelled() => return,
                }
            }
        })
    };
    let at: Option<SocketAddr> = listener.local_addr().ok();
    let port = at.map_or(0, |a| a.port());
    info!(addr = ?at, allow = %shared.inner.allow, "lighthouse (torchft) listening");
    let allow = shared.inner.allow.clone();
    let service =
        LighthouseServiceServer::new(LighthouseHandlers::new(shared, role, stop.clone(), port))
            .max_decoding_message_size(limits::MAX_REQUEST_BYTES)
            .max_encoding_message_size(limits::MAX_QUORUM_BYTES + limits::MAX_REQUEST_BYTES);
    // Connections from outside the allow list are closed as they are
    // accepted, so they hold nothing (said once a minute).
    let refused = std::sync::atomic::AtomicU64::new(0);
    let said = Mutex::new(None::<Instant>);
    let incoming = tokio_stream::StreamExt::filter(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        move |conn| {
            let Ok(c) = conn else { return true };
            let peer = c.peer_addr().ok();
            if peer.is_some_and(|a| allow.allows(a.ip())) {
                return true;
            }
            let n = refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut last = said.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                *last = Some(Instant::now());
                warn!(peer = ?peer, refused_so_far = n, allow = %allow, "lighthouse: closed a connection from outside --lighthouse-allow");
            }
            false
        },
    );
    let result = tonic::transport::Server::builder()
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .concurrency_limit_per_connection(256)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    ticker.abort();
    result
}

#[cfg(test)]
mod tests;
