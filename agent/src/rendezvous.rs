//! Where a job's rendezvous is, and serving it inside this agent when this
//! node hosts it: standalone (always), static (node rank 0), c10d (`is_host`,
//! or an endpoint naming this host with its port free). One state machine,
//! the `rendezvous-server` crate, serves every mode.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{Config, Rendezvous};
use crate::error::AgentError;

/// An embedded rendezvous forgets finished jobs quickly, its shutdown ends
/// the job for every node, and it requires the agents' token if they have
/// one. With `tls`, it serves TLS with the agent's own certificate and key
/// (which must then be valid for the rendezvous host name) and requires the
/// other agents' certificates to chain to `tls_ca`.
fn embedded(
    max_nodes_per_job: u32,
    token: Option<rendezvous_server::Token>,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> rendezvous_server::ServeOptions {
    rendezvous_server::ServeOptions {
        finished_job_ttl: Duration::from_secs(5),
        may_rejoin_after_shutdown: false,
        token,
        // It serves this node's one job.
        limits: rendezvous_server::Limits {
            max_jobs: 1,
            max_nodes_per_job,
            ..rendezvous_server::Limits::default()
        },
        tls,
        store: None,
        replication: None,
    }
}

/// The TLS settings of a rendezvous this agent hosts for other nodes.
fn hosted_tls(cfg: &Config) -> Result<Option<tonic::transport::ServerTlsConfig>, AgentError> {
    let files = cfg.link_tls();
    if !files.enabled() {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
        return Err(AgentError::Config(
            "this agent hosts the rendezvous over TLS, so it needs its own certificate: give --rdzv-conf tls_cert=PEM,tls_key=PEM (valid for the rendezvous host name)".into(),
        ));
    };
    rendezvous_server::tls::server_config(Some(cert), Some(key), files.ca.as_deref())
        .map_err(|e| AgentError::Config(e.to_string()))
}

/// Where the rendezvous is (every replica's `HOST:PORT`, in the order given),
/// starting it inside this agent when this node hosts it.
pub(crate) async fn locate_rendezvous(
    cfg: &Config,
    stop: &CancellationToken,
) -> Result<(Vec<(String, u16)>, Option<tokio::task::JoinHandle<()>>), AgentError> {
    let host_at = |addr: SocketAddr, tls: Option<tonic::transport::ServerTlsConfig>| {
        let stop = stop.clone();
        let options = embedded(cfg.max_nodes, cfg.token.clone(), tls);
        async move {
            let listener = TcpListener::bind(addr).await?;
            let port = listener.local_addr()?.port();
            if options.token.is_none() && !addr.ip().is_loopback() {
                warn!(port, "this agent serves the rendezvous without a token: anyone who reaches the port can join or stop the job; give every agent --rdzv-conf token_file=PATH or ACCEL_RDZV_TOKEN");
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
            Ok((vec![("127.0.0.1".into(), port)], Some(task)))
        }
        Rendezvous::Static {
            host,
            port,
            node_rank,
        } => {
            if *node_rank != 0 {
                return Ok((vec![(host.clone(), *port)], None));
            }
            let tls = hosted_tls(cfg)?;
            let (_, task) = host_at(wildcard(host, *port), tls).await.map_err(|e| {
                AgentError::Config(format!(
                    "node rank 0 cannot serve the rendezvous on port {port}: {e}; pick a free --master-port"
                ))
            })?;
            info!(port, "node rank 0 serves the static rendezvous");
            Ok((vec![(host.clone(), *port)], Some(task)))
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
                        return Ok((endpoints, Some(task)));
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
            Ok((endpoints, None))
        }
    }
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
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        || host == hostname()
}

/// This machine's host name.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}
