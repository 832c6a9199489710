//! The gRPC side of the lighthouse: torchft's `LighthouseService` on its
//! own listener (`--lighthouse ADDR`), the quorum tick, and who may call.
//!
//! torchft's client connects with a plain `http://` URL and sends no
//! credentials, so this port cannot ask for the rendezvous token or TLS;
//! instead it answers only addresses in its allow list
//! (`--lighthouse-allow`, loopback by default), and bounds what it holds
//! (the [`super::limits`], [`MAX_WAITING`] calls). Only the leading replica
//! answers; a follower refuses with `UNAVAILABLE`, naming the leader, so
//! torchft's retries (`TORCHFT_QUORUM_RETRIES`) or a Service that routes
//! to the ready replica find it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

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

/// Quorums a slow waiter may fall behind before it rejoins.
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
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.nets.iter().any(|(net, len)| within(ip, *net, *len))
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
            nets.push((ip, len));
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

impl Shared {
    /// A lighthouse with `config`, answering `allow`. Its quorum ids count
    /// on from its start time in milliseconds since the epoch: a restarted
    /// server (or a replica that takes over) hands out ids above those of
    /// the one before, which in practice handed out far fewer ids (one per
    /// membership change or failed commit) than milliseconds passed, so no
    /// manager mistakes a new quorum for an old one (torchft keys a
    /// quorum's store prefix by its id). Clocks must not be behind by more
    /// than that.
    pub fn new(config: LighthouseConfig, allow: Allow) -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let first = i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX / 2);
        Self {
            inner: Arc::new(Inner {
                lighthouse: Mutex::new(Lighthouse::resuming(config, first)),
                formed: broadcast::channel(FORMED_QUEUE).0,
                allow,
                waiting: Semaphore::new(MAX_WAITING),
            }),
        }
    }

    /// Reads the lighthouse's state.
    pub fn read<T>(&self, f: impl FnOnce(&Lighthouse) -> T) -> T {
        f(&self
            .inner
            .lighthouse
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Steps the lighthouse and hands out the quorums it formed.
    fn step(&self, event: Event) -> Result<(), Status> {
        let actions = {
            let mut l = self
                .inner
                .lighthouse
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            l.step(Instant::now(), event)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?
        };
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
            // Nobody waiting is no error.
            let _ = self.inner.formed.send(Arc::new(quorum));
        }
        Ok(())
    }
}

/// The gRPC handlers.
#[derive(Debug, Clone)]
pub struct LighthouseHandlers {
    shared: Shared,
    role: watch::Receiver<Role>,
}

impl LighthouseHandlers {
    /// Handlers over `shared` that answer while `role` leads.
    pub fn new(shared: Shared, role: watch::Receiver<Role>) -> Self {
        Self { shared, role }
    }

    fn admit<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if let Some(addr) = request.remote_addr() {
            if !self.shared.inner.allow.allows(addr.ip()) {
                return Err(Status::permission_denied(format!(
                    "the lighthouse does not answer {} (--lighthouse-allow {}): add its network to --lighthouse-allow",
                    addr.ip(),
                    self.shared.inner.allow
                )));
            }
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
        let mut formed = self.shared.inner.formed.subscribe();
        self.shared.step(Event::Join(member.clone()))?;
        loop {
            match formed.recv().await {
                Ok(q) if q.participants.iter().any(|p| p.replica_id == id) => {
                    return Ok(Response::new(pb::LighthouseQuorumResponse {
                        quorum: Some((*q).clone()),
                    }));
                }
                // A quorum without this group (it joined too late, or a
                // quorum was missed): it joins the next one.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.shared.step(Event::Rejoin(member.clone()))?;
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
        self.shared.step(Event::Heartbeat(id))?;
        Ok(Response::new(pb::LighthouseHeartbeatResponse {}))
    }
}

/// Serves the lighthouse on `listener` until `stop`: the handlers and the
/// quorum tick.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    role: watch::Receiver<Role>,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let tick = shared.read(|l| l.config().quorum_tick);
    let ticker = {
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        if let Err(e) = shared.step(Event::Tick) {
                            warn!(error = %e.message(), "lighthouse tick");
                        }
                    }
                    () = stop.cancelled() => return,
                }
            }
        })
    };
    let at: Option<SocketAddr> = listener.local_addr().ok();
    info!(addr = ?at, allow = %shared.inner.allow, "lighthouse (torchft) listening");
    let service = LighthouseServiceServer::new(LighthouseHandlers::new(shared, role))
        .max_decoding_message_size(limits::MAX_REQUEST_BYTES);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let result = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    ticker.abort();
    result
}
