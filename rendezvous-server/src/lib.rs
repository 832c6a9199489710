//! accel's rendezvous: decides when a job's nodes form a round, which node
//! gets which rank, and when the job restarts, fails or succeeds.
//!
//! The same service runs as the `rdzv-server` daemon (c10d-style rendezvous
//! across nodes) and embedded in `accel-agent` (standalone and static modes),
//! so every mode shares one state machine.
//!
//! # Layout
//! - [`job`]: one job's state machine and the pure [`job::decide`] function;
//! - [`service`]: the gRPC handlers and the registry of jobs by `rdzv_id`;
//! - [`config`]: `rdzv-server`'s flags;
//! - [`input`]: bounded parsing of what people type (durations, excerpts);
//! - [`status`]: `rdzv-server status`, a client of the `JobStatus` call;
//! - [`error`]: typed errors and their gRPC status codes.
#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod input;
pub mod job;
pub mod service;
pub mod signal;
pub mod status;

use std::future::Future;
use std::time::{Duration, Instant};

use accel_proto::v1::rendezvous_server::RendezvousServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tracing::info;

pub use error::Error;
pub use service::{Registry, RendezvousService};

/// How often lost nodes and finished jobs are looked for.
const TICK: Duration = Duration::from_millis(100);

/// How a rendezvous is served.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long a finished job is remembered after its last node left.
    pub finished_job_ttl: Duration,
    /// Whether nodes may rejoin after a shutdown: true for the daemon (it may
    /// be restarted and relearn the jobs), false inside an agent (its job is over).
    pub may_rejoin_after_shutdown: bool,
}

/// Serves the rendezvous on `listener` until `shutdown` resolves; then tells
/// every connected node the server is going away and drains.
pub async fn serve(
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let registry = Registry::new(options.finished_job_ttl);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<RendezvousServer<RendezvousService>>()
        .await;
    let ticker = {
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                registry.tick(Instant::now());
            }
        })
    };
    let incoming = TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            // Events are small and latency matters more than packet count.
            let _ = s.set_nodelay(true);
        }
        s
    });
    let closing = registry.clone();
    let result = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RendezvousServer::new(RendezvousService::new(registry)))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            info!("shutting down: closing every job's streams");
            closing.close_all(
                "the rendezvous server is shutting down",
                options.may_rejoin_after_shutdown,
            );
        })
        .await;
    ticker.abort();
    result.map_err(Error::from)
}
