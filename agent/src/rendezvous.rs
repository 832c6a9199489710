//! Where a job's rendezvous is, and serving it inside this agent when this
//! node hosts it: standalone (always), static (node rank 0), c10d (`is_host`,
//! or an endpoint naming this host with its port free), etcd (every agent
//! runs a replica; the one etcd elects serves). One state machine, the
//! `rendezvous-server` crate, serves every mode.
//!
//! # Agent-only rendezvous on etcd
//! With `--rdzv-backend etcd` there is no server to lose: each agent serves a
//! replica of the job's rendezvous on a free port and campaigns for it in
//! etcd (election `<etcd_prefix>/<job id>/leader`, its value the address
//! other agents reach it at), exactly as `rdzv-server` replicas do
//! ([`rendezvous_server::ha`]). The elected agent serves with the job's state
//! in etcd; the others' replicas answer with the leader's address, which is
//! where this agent's client goes ([`Leaders::Published`]). When the hosting
//! agent's node dies, its lease runs out, another agent is elected, loads the
//! state, and the nodes reconnect and resume within their drop limit. Each
//! agent keeps a presence key under the job's prefix on an etcd lease of
//! its own, written before it joins and revoked when it exits; the leader
//! drops a node whose key vanished (its lease expired: the dead host, say)
//! at once, not at the keep-alive limit ([`rendezvous_server::presence`]).
//! The last leader deletes the finished job's records when it exits, so
//! etcd keeps nothing of a job that is over.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Rendezvous};
use crate::error::AgentError;
use accel_rdzv_client::client::Leaders;

/// Where this agent joins the rendezvous, and the one it serves, if any.
pub(crate) struct Located {
    /// Every replica's `HOST:PORT`, in the order given.
    pub endpoints: Vec<(String, u16)>,
    /// Which leaders a join may follow.
    pub leaders: Leaders,
    /// The rendezvous this agent serves (until the stop token).
    pub server: Option<tokio::task::JoinHandle<()>>,
    /// Agent-only rendezvous: how the job's etcd is reached, where each
    /// node keeps its presence key ([`rendezvous_server::presence`]).
    pub etcd: Option<rendezvous_server::ha::EtcdOptions>,
}

impl Located {
    fn at(endpoints: Vec<(String, u16)>, server: Option<tokio::task::JoinHandle<()>>) -> Self {
        Self {
            endpoints,
            leaders: Leaders::Listed,
            server,
            etcd: None,
        }
    }
}

/// The address other nodes reach this one at: `--local-addr`, else the
/// loopback address for a job whose etcd is on loopback (one machine), else
/// the host name.
pub(crate) fn advertised_host(cfg: &Config, hostname: &str) -> String {
    if let Some(a) = &cfg.local_addr {
        return a.clone();
    }
    match &cfg.rendezvous {
        Rendezvous::Etcd { endpoints }
            if endpoints.iter().all(|url| {
                let host = url
                    .split_once("://")
                    .map_or(url.as_str(), |(_, rest)| rest)
                    .rsplit_once(':')
                    .map_or("", |(h, _)| h);
                is_local_loopback(host.trim_start_matches('[').trim_end_matches(']'))
            }) =>
        {
            "127.0.0.1".into()
        }
        _ => hostname.to_owned(),
    }
}

/// `localhost` or a loopback address, without DNS.
fn is_local_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An embedded rendezvous forgets finished jobs quickly, its shutdown ends
/// the job for every node, and it requires the agents' token if they have
/// one. With `tls`, it serves TLS with the agent's own certificate and key
/// (which must then be valid for the rendezvous host name) and requires the
/// other agents' certificates to chain to `tls_ca`.
/// The tokens an embedded rendezvous accepts: the agent's own, and, when
/// it came from a file, whatever that file holds as it is rotated (a
/// current and a next token, one a line).
fn accepted(cfg: &Config) -> Option<accel_wire::accepted::Accepted> {
    use accel_wire::accepted::Accepted;
    let token = cfg.token.clone()?;
    let from_file = cfg.rdzv.token_file.as_deref().map(Accepted::from_file);
    match from_file {
        Some(Ok(file)) => Some(file),
        // Read a moment ago for the agent's own token: a file gone since
        // keeps that one.
        _ => Some(Accepted::fixed(token)),
    }
}

fn embedded(
    max_nodes_per_job: u32,
    token: Option<accel_wire::accepted::Accepted>,
    tls: Option<accel_wire::tls::ServerTls>,
) -> rendezvous_server::ServeOptions {
    rendezvous_server::ServeOptions {
        finished_job_ttl: Duration::from_secs(5),
        may_rejoin_after_shutdown: false,
        tokens: rendezvous_server::auth::Tokens::agents(token),
        // It serves this node's one job.
        limits: rendezvous_server::Limits {
            max_jobs: 1,
            max_nodes_per_job,
            ..rendezvous_server::Limits::default()
        },
        tls,
        store: None,
        replication: None,
        ends_with_job: false,
        metrics: Default::default(),
        restarted: false,
    }
}

/// The TLS settings of a rendezvous this agent hosts for other nodes.
fn hosted_tls(cfg: &Config) -> Result<Option<accel_wire::tls::ServerTls>, AgentError> {
    let files = cfg.link_tls();
    if !files.enabled() {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
        return Err(AgentError::Config(
            "this agent hosts the rendezvous over TLS, so it needs its own certificate: give --rdzv-conf tls_cert=PEM,tls_key=PEM (valid for the rendezvous host name)".into(),
        ));
    };
    accel_wire::tls::ServerTls::from_files(Some(cert), Some(key), files.ca.as_deref())
        .map_err(|e| AgentError::Config(e.to_string()))
}

/// Where the rendezvous is, starting it inside this agent when this node
/// hosts it (or, on etcd, may be elected to).
pub(crate) async fn locate_rendezvous(
    cfg: &Config,
    stop: &CancellationToken,
) -> Result<Located, AgentError> {
    let host_at = |addr: SocketAddr, tls: Option<accel_wire::tls::ServerTls>| {
        let stop = stop.clone();
        let mut options = embedded(cfg.max_nodes, accepted(cfg), tls);
        options.limits.tombstone_ttl = cfg.rdzv.tombstone_ttl;
        async move {
            let listener = TcpListener::bind(addr).await?;
            let port = listener.local_addr()?.port();
            if !options.tokens.required() && !addr.ip().is_loopback() {
                warn!(port, "this agent serves the rendezvous without a token: anyone who reaches the port can join or stop the job; give every agent --rdzv-conf token_file=PATH or ACCEL_RDZV_TOKEN (notebook_launcher: rdzv_conf={{\"token_file\": PATH}})");
            }
            let task = tokio::spawn(async move {
                let shutdown = async move { stop.cancelled().await };
                if let Err(e) = rendezvous_server::serve(listener, options, shutdown).await {
                    warn!(error = %e, "embedded rendezvous failed");
                }
            });
            Ok::<_, std::io::Error>((port, task))
        }
    };
    match &cfg.rendezvous {
        Rendezvous::Standalone => {
            let (port, task) = host_at(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), None)
                .await
                .map_err(|e| {
                    AgentError::io("cannot start the embedded rendezvous on 127.0.0.1", e)
                })?;
            Ok(Located::at(vec![("127.0.0.1".into(), port)], Some(task)))
        }
        Rendezvous::Static {
            host,
            port,
            node_rank,
        } => {
            if *node_rank != 0 {
                return Ok(Located::at(vec![(host.clone(), *port)], None));
            }
            let tls = hosted_tls(cfg)?;
            let (_, task) = host_at(wildcard(host, *port), tls).await.map_err(|e| {
                AgentError::Config(format!(
                    "node rank 0 cannot serve the rendezvous on port {port}: {e}; pick a free --master-port"
                ))
            })?;
            info!(port, "node rank 0 serves the static rendezvous");
            Ok(Located::at(vec![(host.clone(), *port)], Some(task)))
        }
        Rendezvous::C10d {
            host,
            port,
            replicas,
        } => {
            let mut endpoints = vec![(host.clone(), *port)];
            endpoints.extend(replicas.iter().cloned());
            // A TLS agent without its own certificate cannot host: it joins;
            // several endpoints are rdzv-server replicas.
            let can_host =
                (!cfg.rdzv.tls.enabled() || cfg.rdzv.tls.cert.is_some()) && replicas.is_empty();
            let local = cfg
                .rdzv
                .is_host
                .unwrap_or_else(|| can_host && is_local_host(host));
            if local {
                let tls = hosted_tls(cfg)?;
                match host_at(wildcard(host, *port), tls).await {
                    Ok((_, task)) => {
                        info!(port, "this agent hosts the c10d rendezvous");
                        return Ok(Located::at(endpoints, Some(task)));
                    }
                    // Another process (rdzv-server, or an agent of this host) serves it.
                    Err(e) if cfg.rdzv.is_host.is_none() => {
                        tracing::debug!(error = %e, "rendezvous port taken; joining as a client")
                    }
                    Err(e) => {
                        return Err(AgentError::Config(format!(
                            "is_host=true but the rendezvous cannot be served on port {port}: {e}"
                        )))
                    }
                }
            }
            Ok(Located::at(endpoints, None))
        }
        Rendezvous::Etcd { endpoints } => serve_replica(cfg, endpoints, stop).await,
    }
}

/// Agent-only on etcd: serves this agent's replica of the job's rendezvous
/// on a free port, campaigning through etcd at `endpoints`, and says where
/// this agent asks who leads (see the module's docs).
async fn serve_replica(
    cfg: &Config,
    endpoints: &[String],
    stop: &CancellationToken,
) -> Result<Located, AgentError> {
    let host = advertised_host(cfg, &hostname());
    let tls = hosted_tls(cfg)?;
    let mut options = embedded(cfg.max_nodes, accepted(cfg), tls);
    options.ends_with_job = true;
    options.limits.tombstone_ttl = cfg.rdzv.tombstone_ttl;
    let etcd = &cfg.rdzv.etcd;
    let etcd_tls = if etcd.https {
        Some(
            rendezvous_server::ha::tls_options(
                etcd.ca.as_deref(),
                etcd.cert.as_deref().zip(etcd.key.as_deref()),
            )
            .map_err(|e| AgentError::Config(format!("--rdzv-conf cacert/cert/key: {e}")))?,
        )
    } else {
        None
    };
    // A literal address is bound as given (loopback stays loopback);
    // a name is served on every interface.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let bind = match bare.parse() {
        Ok(ip) => SocketAddr::new(ip, 0),
        Err(_) => wildcard(&host, 0),
    };
    let listener = TcpListener::bind(bind).await.map_err(|e| {
        AgentError::io(
            format!("cannot serve this agent's rendezvous replica on {bind}"),
            e,
        )
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| AgentError::io("cannot read the replica's port", e))?
        .port();
    let advertise = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    options.replication = Some(rendezvous_server::ha::EtcdOptions {
        endpoints: endpoints.to_vec(),
        prefix: format!("{}/{}", etcd.prefix, accel_wire::keys::escape(&cfg.run_id)),
        lease: etcd.lease,
        user: None,
        tls: etcd_tls,
        advertise: advertise.clone(),
        presence: true,
    });
    let replication = options.replication.clone();
    if !options.tokens.required() && !bind.ip().is_loopback() {
        warn!(port, "this agent may serve the rendezvous without a token: anyone who reaches the port can join or stop the job; give every agent --rdzv-conf token_file=PATH or ACCEL_RDZV_TOKEN (notebook_launcher: rdzv_conf={{\"token_file\": PATH}})");
    }
    let link_tls = cfg.link_tls().enabled();
    if !etcd.https && !link_tls && !bind.ip().is_loopback() {
        warn!("agents join the leader etcd names, over plain etcd and plain links: whoever can write to etcd can send them (and their token) elsewhere; use --rdzv-conf protocol=https with etcd client certificates, and tls_ca/tls_cert/tls_key");
    }
    let stop = stop.clone();
    let task = tokio::spawn(async move {
        let shutdown = async move { stop.cancelled().await };
        if let Err(e) = rendezvous_server::serve(listener, options, shutdown).await {
            warn!(error = %e, "this agent's rendezvous replica failed");
        }
    });
    info!(%advertise, etcd = %endpoints.join(","), "this agent runs a replica of the job's rendezvous on etcd");
    // The agent trusts what its own replica says: it reaches it on
    // this host, not through a name that might resolve elsewhere
    // (with TLS, by the name its certificate carries).
    let own = if link_tls {
        bare.to_owned()
    } else if bind.ip().is_unspecified() {
        match bind {
            SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.to_string(),
            SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.to_string(),
        }
    } else {
        bind.ip().to_string()
    };
    Ok(Located {
        endpoints: vec![(own, port)],
        leaders: Leaders::Published,
        server: Some(task),
        etcd: replication,
    })
}

fn wildcard(host: &str, port: u16) -> SocketAddr {
    if host.contains(':') {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

/// torchrun's is_host inference, without DNS: `localhost`, a loopback
/// address, or this machine's host name.
fn is_local_host(host: &str) -> bool {
    is_local_loopback(host) || host == hostname()
}

/// This machine's host name.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}
