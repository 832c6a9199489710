//! Where this node's candidate worker store listens: which address it
//! offers as `MASTER_ADDR`, which address it binds, and which port.
//!
//! # Address
//! The store binds the address it offers, so it is reachable where the
//! workers are told to go and nowhere else:
//! * a job on loopback (standalone, or a rendezvous endpoint that is a
//!   loopback address or `localhost`) offers and binds `127.0.0.1`, unless
//!   `--local-addr` names another address;
//! * otherwise it offers `--local-addr`, else this host's name, and binds
//!   the address that resolves to (an IP literal as is; a name's first
//!   non-loopback address that binds);
//! * a static job's node rank 0 offers and binds `--master-addr`; the other
//!   static nodes' offers are never used, so they bind loopback.
//!
//! When the offered name resolves to no usable address here (a host whose
//! `/etc/hosts` maps its own name to `127.0.1.1`, while other nodes resolve
//! it through DNS), the store binds every interface as before and the agent
//! says so once (at info level when the name is a loopback address here, as
//! on most Debian and Ubuntu hosts; a warning when it does not resolve to
//! this host at all), naming `--local-addr`; address admission still
//! applies.
//!
//! # Admission
//! Node rank 0 admits to its store the addresses the rendezvous reports for
//! the round's members ([`store_options`]). A rendezvous that reports none for a
//! job of several nodes predates that field: the store then admits anyone
//! for the round and the agent warns.
//!
//! The store's connection limit follows the round's size
//! ([`ConnLimits::for_world`]: `max(2048, 8 × world_size + 64)`, three
//! quarters of it from one address).
//!
//! # Port
//! With `--rdzv-conf store_ports=A-B` the port comes from that range: each
//! offer takes the next free port after the last one taken (wrapping), so
//! consecutive rounds get different ports and ports another process holds
//! are skipped. If every port in the range is busy the round cannot be
//! offered and the error says so. Without a range the kernel picks a free
//! ephemeral port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tracing::{info, warn};

use super::round::RoundInfo;
use crate::config::{Config, PortRange, Rendezvous};
use crate::error::AgentError;
use accel_worker_store::admission::literal;
use accel_worker_store::{Admit, ConnLimits, StoreOptions};

/// How long resolving the offered host name may take.
const RESOLVE_LIMIT: Duration = Duration::from_secs(5);

/// What to bind, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// Exactly this address.
    Ip(IpAddr),
    /// What this name resolves to (dropping loopback addresses unless the job is on loopback).
    Name {
        /// The host name.
        name: String,
        /// Whether the whole job runs on this host's loopback.
        loopback_job: bool,
    },
}

/// Whether `host` means this host's loopback without asking a resolver.
pub(super) fn is_loopback_host(host: &str) -> bool {
    let h = host.trim().to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost") || literal(&h).is_some_and(|ip| ip.is_loopback())
}

/// The address to offer and what to bind for it.
pub(super) fn plan(cfg: &Config, hostname: &str) -> (String, Target) {
    let loopback = IpAddr::from(Ipv4Addr::LOCALHOST);
    let offered_target = |offered: String, loopback_job: bool| {
        let target = match literal(&offered) {
            Some(ip) => Target::Ip(ip),
            None => Target::Name {
                name: offered.clone(),
                loopback_job,
            },
        };
        (offered, target)
    };
    match &cfg.rendezvous {
        Rendezvous::Standalone => ("127.0.0.1".into(), Target::Ip(loopback)),
        Rendezvous::Static {
            host, node_rank, ..
        } if *node_rank == 0 => offered_target(host.clone(), is_loopback_host(host)),
        Rendezvous::Static { host, .. } => (host.clone(), Target::Ip(loopback)),
        Rendezvous::Etcd { .. } => {
            let offered = crate::rendezvous::advertised_host(cfg, hostname);
            let loopback_job = is_loopback_host(&offered);
            offered_target(offered, loopback_job)
        }
        Rendezvous::C10d { host, .. } => {
            let loopback_job = is_loopback_host(host);
            let offered = match (&cfg.local_addr, loopback_job) {
                (Some(a), _) => a.clone(),
                (None, true) => "127.0.0.1".into(),
                (None, false) => hostname.to_owned(),
            };
            offered_target(offered, loopback_job)
        }
    }
}

/// Binds the store listeners of successive rounds.
#[derive(Debug)]
pub(super) struct StoreBinder {
    ports: Option<PortRange>,
    /// The next port of the range to try first.
    next: u16,
    /// Whether the every-interface fallback has been reported.
    warned_any: bool,
}

impl StoreBinder {
    pub(super) fn new(ports: Option<PortRange>) -> Self {
        Self {
            ports,
            next: ports.map_or(0, |r| r.first),
            warned_any: false,
        }
    }

    /// The address to offer for the next round and a listener for its store.
    pub(super) async fn bind(
        &mut self,
        cfg: &Config,
        hostname: &str,
    ) -> Result<(String, TcpListener), AgentError> {
        let (offered, target) = plan(cfg, hostname);
        let listener = match target {
            Target::Ip(ip) => self.bind_ip(ip).await.map_err(|e| {
                AgentError::io(
                    format!("cannot bind the worker store (MASTER_ADDR:MASTER_PORT) to {ip}, the address this node offers; pass --local-addr with an address of this host"),
                    e,
                )
            })?,
            Target::Name { name, loopback_job } => {
                self.bind_name(&name, loopback_job).await?
            }
        };
        Ok((offered, listener))
    }

    async fn bind_name(
        &mut self,
        name: &str,
        loopback_job: bool,
    ) -> Result<TcpListener, AgentError> {
        let found: Vec<IpAddr> =
            tokio::time::timeout(RESOLVE_LIMIT, tokio::net::lookup_host((name, 0)))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|a| a.map(|a| a.ip()).collect())
                .unwrap_or_default();
        let mut candidates: Vec<IpAddr> = Vec::new();
        let only_loopback = !found.is_empty() && found.iter().all(IpAddr::is_loopback);
        for ip in found {
            if (loopback_job || !ip.is_loopback()) && !candidates.contains(&ip) {
                candidates.push(ip);
            }
        }
        for ip in candidates {
            match self.bind_ip(ip).await {
                Ok(l) => return Ok(l),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Err(self.busy(ip, e)),
                Err(_) => continue, // not an address of this host
            }
        }
        if !self.warned_any {
            self.warned_any = true;
            if only_loopback {
                // The usual /etc/hosts of a Debian or Ubuntu host (its own
                // name on 127.0.1.1): nothing is wrong, and other hosts
                // reach the store by the name's DNS address.
                info!(
                    name,
                    "'{name}' (MASTER_ADDR) is a loopback address here, so the worker store listens on every interface for the job's other hosts and admits only the job's addresses; --local-addr binds one address instead"
                );
            } else {
                warn!(
                    name,
                    "the worker store listens on every interface: '{name}', the address this node offers as MASTER_ADDR, resolves to no address of this host; pass --local-addr with this node's address to bind only that (connections are admitted by address either way)"
                );
            }
        }
        let any = IpAddr::from(Ipv6Addr::UNSPECIFIED);
        self.bind_ip(any).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => self.busy(any, e),
            _ => AgentError::io("cannot bind a port for the worker store (MASTER_PORT)", e),
        })
    }

    fn busy(&self, ip: IpAddr, e: std::io::Error) -> AgentError {
        let what = match self.ports {
            Some(r) => format!(
                "every port of --rdzv-conf store_ports={}-{} is in use on {ip}; free one or widen the range",
                r.first, r.last
            ),
            None => format!("cannot bind a port for the worker store on {ip}"),
        };
        AgentError::io(what, e)
    }

    /// Binds `ip` on the next free port of the range (or any free port).
    async fn bind_ip(&mut self, ip: IpAddr) -> std::io::Result<TcpListener> {
        let Some(range) = self.ports else {
            return bind_one(ip, 0).await;
        };
        let mut last = None;
        for i in 0..range.ports() {
            let offset = (u32::from(self.next - range.first) + i) % range.ports();
            let port = range.first + offset as u16;
            match bind_one(ip, port).await {
                Ok(l) => {
                    self.next = if port == range.last {
                        range.first
                    } else {
                        port + 1
                    };
                    return Ok(l);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
    }
}

/// The bounds and admission of a round's store (node rank 0 only), given
/// where the rendezvous says the round's members are.
pub(super) fn store_options(cfg: &Config, info: &RoundInfo, members: Vec<String>) -> StoreOptions {
    let admit = if members.is_empty() && info.nnodes > 1 {
        // A server that reports the members always names node rank 0 itself.
        warn!(round = info.round, "the rendezvous did not say where this round's members are (an older rdzv-server?): the worker store admits every address this round; upgrade rdzv-server to admit only the members");
        Admit::Anyone
    } else {
        Admit::Members(members)
    };
    StoreOptions {
        max_bytes: cfg.rdzv.store_max_bytes,
        admit,
        connections: ConnLimits::for_world(info.world_size),
        ..StoreOptions::default()
    }
}

/// Binds `(ip, port)`; every interface means IPv6 and IPv4 where the host has
/// IPv6, else IPv4.
async fn bind_one(ip: IpAddr, port: u16) -> std::io::Result<TcpListener> {
    match TcpListener::bind(SocketAddr::new(ip, port)).await {
        Err(e)
            if ip.is_unspecified() && ip.is_ipv6() && e.kind() != std::io::ErrorKind::AddrInUse =>
        {
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await
        }
        r => r,
    }
}

#[cfg(test)]
mod tests;
