//! The gRPC side of the lighthouse: torchft's `LighthouseService` on its
//! own listener (`--lighthouse ADDR`), the quorum tick, and who may call.
//!
//! torchft's client connects with a plain `http://` URL and sends no
//! credentials, so this port cannot ask for the rendezvous token or TLS;
//! instead it serves only addresses in its allow list
//! (`--lighthouse-allow`, loopback by default: other connections are closed
//! as they are accepted), and bounds what it holds (the [`super::limits`],
//! [`MAX_WAITING`] calls, keep-alives on idle connections). Only the
//! leading replica answers; a follower refuses with `UNAVAILABLE`, naming
//! the leader, and calls waiting when a replica stops leading (or the
//! server shuts down) end with `UNAVAILABLE`, so torchft's retries
//! (`TORCHFT_QUORUM_RETRIES`) or a Service that routes to the ready replica
//! find the new leader.
//!
//! The state and the sender of the quorums it forms share one lock: a
//! caller subscribes, joins and hears the quorums in the order they formed,
//! as with torchft's own lighthouse.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use accel_proto::torchft as pb;
use accel_proto::torchft::lighthouse_service_server::{
    LighthouseService as Service, LighthouseServiceServer,
};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::{limits, Action, Event, Lighthouse, LighthouseConfig};
use crate::ha::Role;

/// The most `Quorum` calls waiting at once.
pub const MAX_WAITING: usize = 4 * super::MAX_GROUPS;

/// Quorums a slow waiter may fall behind before it is told to ask again.
const FORMED_QUEUE: usize = 64;

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
}

/// Milliseconds since the epoch, where quorum ids start.
fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX / 2)
}

impl Shared {
    /// A lighthouse with `config`, answering `allow`. Its quorum ids count
    /// on from the time in milliseconds since the epoch when it starts or
    /// takes the lead (`Shared::lead_afresh`): a restarted server, or a
    /// replica that takes over, hands out ids above those handed out before
    /// (one per membership change or failed commit: far fewer than the
    /// milliseconds that passed), so no manager mistakes a new quorum for an
    /// old one (torchft keys a quorum's store prefix by its id). The hosts'
    /// clocks must not go back.
    pub fn new(config: LighthouseConfig, allow: Allow) -> Self {
        Self {
            inner: Arc::new(Inner {
                lighthouse: Mutex::new(Lighthouse::resuming(config, now_ms())),
                formed: broadcast::channel(FORMED_QUEUE).0,
                allow,
                waiting: Semaphore::new(MAX_WAITING),
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
    /// on, in order).
    fn step(
        &self,
        event: Event,
        subscribe: bool,
    ) -> Result<Option<broadcast::Receiver<Arc<pb::Quorum>>>, Status> {
        let mut l = self.lock();
        let rx = subscribe.then(|| self.inner.formed.subscribe());
        let actions = l
            .step(Instant::now(), event)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        for Action::Formed(mut quorum) in actions {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            quorum.created = Some(pb::Timestamp {
                seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
            });
            info!(
                quorum_id = quorum.quorum_id,
                replica_groups = quorum.participants.len(),
                "lighthouse: quorum formed"
            );
            // Never blocks; nobody waiting is no error.
            let _ = self.inner.formed.send(Arc::new(quorum));
        }
        Ok(rx)
    }

    /// This replica took the lead: the state starts afresh (another
    /// replica may have led meanwhile), its quorum ids above those it
    /// handed out and above the time in milliseconds.
    fn lead_afresh(&self) {
        let mut l = self.lock();
        let config = l.config().clone();
        let first = l.quorum_id().max(now_ms());
        *l = Lighthouse::resuming(config, first);
    }
}

/// The gRPC handlers.
#[derive(Debug, Clone)]
pub struct LighthouseHandlers {
    shared: Shared,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
}

impl LighthouseHandlers {
    /// Handlers over `shared` that answer while `role` leads, until `stop`.
    pub fn new(shared: Shared, role: watch::Receiver<Role>, stop: CancellationToken) -> Self {
        Self { shared, role, stop }
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
        match &*self.role.borrow() {
            Role::Leader(_) => Ok(()),
            Role::Follower { leader: Some(l) } => Err(Status::unavailable(format!(
                "this rdzv-server replica does not lead; the lighthouse is served by the leader ({l}): point TORCHFT_LIGHTHOUSE at a Service that routes to the ready replica, and set TORCHFT_QUORUM_RETRIES"
            ))),
            Role::Follower { leader: None } => Err(Status::unavailable(
                "no rdzv-server replica leads yet (an election, or etcd is unreachable); retry",
            )),
        }
    }
}

#[tonic::async_trait]
impl Service for LighthouseHandlers {
    async fn quorum(
        &self,
        request: Request<pb::LighthouseQuorumRequest>,
    ) -> Result<Response<pb::LighthouseQuorumResponse>, Status> {
        self.admit(&request)?;
        let member = request
            .into_inner()
            .requester
            .ok_or_else(|| Status::invalid_argument("the quorum request has no requester"))?;
        limits::check_member(&member)?;
        let _slot = self.shared.inner.waiting.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!("{MAX_WAITING} quorum calls wait already; retry"))
        })?;
        let id = member.replica_id.clone();
        let Some(mut formed) = self.shared.step(Event::Join(member.clone()), true)? else {
            return Err(Status::internal("the lighthouse gave no receiver"));
        };
        let mut role = self.role.clone();
        loop {
            let got = tokio::select! {
                got = formed.recv() => got,
                () = self.stop.cancelled() => {
                    return Err(Status::unavailable(
                        "the rendezvous server is shutting down; retry against the next leader",
                    ));
                }
                _ = role.wait_for(|r| !matches!(r, Role::Leader(_))) => {
                    return Err(Status::unavailable(
                        "this rdzv-server replica no longer leads; retry against the new leader",
                    ));
                }
            };
            match got {
                Ok(q) if q.participants.iter().any(|p| p.replica_id == id) => {
                    return Ok(Response::new(pb::LighthouseQuorumResponse {
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

    async fn heartbeat(
        &self,
        request: Request<pb::LighthouseHeartbeatRequest>,
    ) -> Result<Response<pb::LighthouseHeartbeatResponse>, Status> {
        self.admit(&request)?;
        let id = request.into_inner().replica_id;
        limits::check_id(&id)?;
        self.shared.step(Event::Heartbeat(id), false)?;
        Ok(Response::new(pb::LighthouseHeartbeatResponse {}))
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
        let (shared, stop, role) = (shared.clone(), stop.clone(), role.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut led = matches!(*role.borrow(), Role::Leader(_));
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        let leads = matches!(*role.borrow(), Role::Leader(_));
                        if leads && !led {
                            shared.lead_afresh();
                        }
                        led = leads;
                        if leads {
                            if let Err(e) = shared.step(Event::Tick, false) {
                                warn!(error = %e.message(), "lighthouse tick");
                            }
                        }
                    }
                    () = stop.cancelled() => return,
                }
            }
        })
    };
    let at: Option<SocketAddr> = listener.local_addr().ok();
    info!(addr = ?at, allow = %shared.inner.allow, "lighthouse (torchft) listening");
    let allow = shared.inner.allow.clone();
    let service = LighthouseServiceServer::new(LighthouseHandlers::new(shared, role, stop.clone()))
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
