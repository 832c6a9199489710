//! accel's rendezvous: decides when a job's nodes form a round, which node
//! gets which rank, and when the job restarts, fails or succeeds.
//!
//! The same service runs as the `rdzv-server` daemon (c10d-style rendezvous
//! across nodes) and embedded in `accel-agent` (standalone and static modes),
//! so every mode shares one state machine.
//!
//! # Layout
//! - [`job`]: one job's state machine and the pure [`job::decide`] function;
//! - [`registry`]: every job by `rdzv_id`, their streams and deadlines;
//! - [`store`]: the seam through which job state outlives the process, and
//!   its etcd implementation;
//! - [`ha`]: replicas on etcd: election, leading, stepping down;
//! - [`presence`]: agent-only rendezvous: nodes' presence keys, and the
//!   leader dropping a node whose etcd lease expired;
//! - [`service`]: the gRPC handlers;
//! - [`auth`]: checking the token every call carries, and nodes' session secrets;
//! - [`accept`], [`admission`]: accepting connections, and which ones are kept;
//! - [`limits`]: bounds on every request, and escaping of stored text;
//! - [`outbox`]: each node's bounded event queue;
//! - TLS for every link, the token and the text bounds both ends share are
//!   [`accel_wire`]'s;
//! - [`config`]: `rdzv-server`'s flags
//!   (durations and excerpted errors come from [`accel_input`], shared by all three binaries);
//! - [`status`]: `rdzv-server status`, a client of the `JobStatus` call on the
//!   client crate's channel builder;
//! - [`tombstone`]: what a finished job leaves for its late nodes;
//! - [`error`]: typed errors and their gRPC status codes;
//! - [`lighthouse`]: torchft's lighthouse protocol (`--lighthouse`), served
//!   beside the rendezvous.
//!
//! What both ends of a link share lives below this crate, in
//! `accel-rdzv-client`: the token and its client-side interceptor, TLS
//! files, the bounds on a failure report's text and its escaping, the
//! leader's metadata key, the open-file limit; the modules here re-export
//! them where the server used to define them. The server depends on the
//! client crate, never the reverse; a recurring problem is logged once per
//! episode through `accel_telemetry::quiet`, shared with the worker store.
#![forbid(unsafe_code)]

pub mod accept;
pub mod admission;
pub mod auth;
pub mod clock;
pub mod config;
pub mod depose;
pub mod error;
pub mod ha;
pub mod incarnation;
pub mod job;
pub mod lease;
pub mod lighthouse;
pub mod limits;
pub mod metrics;
pub mod outbox;
pub mod presence;
pub mod registry;
pub mod service;
pub mod signal;
pub mod stacks;
pub mod status;
pub mod store;

pub mod tombstone;
pub mod ui;
pub mod version;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1::rendezvous_server::RendezvousServer;
use tokio::net::TcpListener;
use tracing::{info, warn};

pub use error::Error;
pub use limits::Limits;
pub use registry::Registry;
pub use service::RendezvousService;

/// How often lost nodes and finished jobs are looked for.
const TICK: Duration = Duration::from_millis(100);

/// How a rendezvous is served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long a finished job (or one without members) is remembered.
    pub finished_job_ttl: Duration,
    /// Whether nodes may rejoin after a shutdown: true for the daemon (it may
    /// be restarted and relearn the jobs), false inside an agent (its job is over).
    pub may_rejoin_after_shutdown: bool,
    /// The tokens a call may carry, by who holds them, each re-read as it
    /// rotates (none: any caller is admitted).
    pub tokens: auth::Tokens,
    /// How much the server holds at most.
    pub limits: Limits,
    /// TLS (`None`: plain HTTP/2), its files re-read as they change.
    pub tls: Option<accel_wire::tls::ServerTls>,
    /// Where job state is kept beyond this process (`None`: memory only).
    /// The server loads the jobs it holds before serving, and writes every
    /// change before sending the events it causes.
    pub store: Option<Arc<dyn store::JobStore>>,
    /// Run as one replica of several, on etcd ([`ha`]); `store` is then unused.
    pub replication: Option<ha::EtcdOptions>,
    /// Replicated: whether the replicas end with the job (an agent-only
    /// rendezvous): a leader that shuts down deletes the jobs that are over
    /// instead of leaving them for the next leader to forget after
    /// `finished_job_ttl`, and a node resuming a job the store does not hold
    /// is refused instead of relearned ([`ha::Tenure::ends_with_job`]).
    pub ends_with_job: bool,
    /// What is counted for Prometheus (served with
    /// [`serve_with_metrics`]; counted regardless).
    pub metrics: metrics::ServerMetrics,
    /// Without a store: this server follows an earlier one that may have
    /// left workers running ([`incarnation`]), so a job it creates afresh
    /// forms no round for one drop limit ([`Registry::holding_fresh_jobs`]).
    pub restarted: bool,
}

/// Serves the rendezvous on `listener` until `shutdown` resolves; then tells
/// every connected node the server is going away and drains. With
/// [`ServeOptions::replication`], this process is one replica ([`ha`]): it
/// serves only while it leads.
pub async fn serve(
    listener: TcpListener,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    serve_with_metrics(listener, None, options, shutdown).await
}

/// [`serve`], and serve the metrics, `/healthz` and `/readyz` on
/// `metrics` ([`accel_telemetry::http`]). Ready means this process does
/// its part: it serves the rendezvous, or it is a replica that follows a
/// known leader (and sends callers there).
pub async fn serve_with_metrics(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    serve_all(listener, metrics, None, options, shutdown).await
}

/// [`serve_with_metrics`], and torchft's lighthouse on its own listener
/// ([`lighthouse`]), answered while this process leads.
pub async fn serve_all(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    lighthouse: Option<(TcpListener, lighthouse::service::Shared)>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let (roles, seat) = tokio::sync::watch::channel(ha::Role::Follower { leader: None });
    let stop = tokio_util::sync::CancellationToken::new();
    // Whatever ends this (an error included), what it spawned stops.
    let _stopping = stop.clone().drop_guard();
    let counters = options.metrics.clone();
    // A follower's service hands the complaints of agents that left a
    // silent leader to its replica's tally ([`depose`]).
    let mut complain = None;
    let background = match options.replication.clone() {
        None => {
            let registry = match options.store.clone() {
                Some(store) => {
                    let registry =
                        Registry::with_store(options.finished_job_ttl, options.limits, store)
                            .with_metrics(counters.clone());
                    let loaded = registry.load().await?;
                    if loaded > 0 {
                        info!(jobs = loaded, "continuing the jobs the job store holds");
                    }
                    registry
                }
                None => {
                    let registry = Registry::new(options.finished_job_ttl, options.limits);
                    match options.restarted {
                        true => registry.holding_fresh_jobs(),
                        false => registry,
                    }
                    .with_metrics(counters.clone())
                }
            };
            roles.send_replace(ha::Role::Leader(Box::new(registry.clone())));
            counters.set_leader(true);
            health_reporter
                .set_serving::<RendezvousServer<RendezvousService>>()
                .await;
            let ticker = tokio::spawn(tick_and_flush(registry.clone(), None));
            let stop = stop.clone();
            let may_rejoin = options.may_rejoin_after_shutdown;
            tokio::spawn(async move {
                stop.cancelled().await;
                ticker.abort();
                if let Err(e) = registry.flush().await {
                    warn!(error = %e, "cannot write the last job state to the job store");
                }
                registry.close_all("the rendezvous server is shutting down", may_rejoin);
            })
        }
        Some(etcd) => {
            health_reporter
                .set_not_serving::<RendezvousServer<RendezvousService>>()
                .await;
            // Health and accel_rdzv_leader follow the role: NOT_SERVING
            // while following.
            let mut watching = seat.clone();
            let reporter = health_reporter.clone();
            let gauge = counters.clone();
            tokio::spawn(async move {
                while watching.changed().await.is_ok() {
                    let leading = matches!(*watching.borrow_and_update(), ha::Role::Leader(_));
                    gauge.set_leader(leading);
                    if leading {
                        reporter
                            .set_serving::<RendezvousServer<RendezvousService>>()
                            .await;
                    } else {
                        reporter
                            .set_not_serving::<RendezvousServer<RendezvousService>>()
                            .await;
                    }
                }
            });
            info!(endpoints = %etcd.endpoints.join(","), prefix = %etcd.prefix, advertise = %etcd.advertise, "replica: campaigning for leadership through etcd");
            let tenure = ha::Tenure {
                ttl: options.finished_job_ttl,
                limits: options.limits,
                ends_with_job: options.ends_with_job,
                metrics: counters.clone(),
            };
            let (complaints, heard) = tokio::sync::mpsc::channel(ha::COMPLAINTS_QUEUED);
            complain = Some(complaints);
            tokio::spawn(ha::replicate(etcd, tenure, roles, stop.clone(), heard))
        }
    };
    // The page and the metrics once this replica knows its role (a
    // standalone server leads from here on): a request that came as the
    // listener opened waits in its backlog instead of hearing "follower".
    if let Some(listener) = metrics {
        let shared = lighthouse.as_ref().map(|(_, s)| s.clone());
        tokio::spawn(accel_telemetry::http::serve(
            listener,
            metrics_endpoint(&counters, &seat, shared.clone()).with_pages(ui::pages(
                seat.clone(),
                options.tokens.clone(),
                shared,
            )),
            stop.clone(),
        ));
    }
    let reported = lighthouse.as_ref().map(|(_, s)| s.clone());
    if let Some((listener, shared)) = lighthouse {
        let (seat, stop) = (seat.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = lighthouse::service::serve(listener, shared, seat, stop).await {
                warn!(error = %e, "the lighthouse stopped serving");
            }
        });
    }
    let admission = admission::Admission::new(
        options.limits.max_connections_per_ip,
        options.limits.auth_timeout,
    );
    let incoming = accept::incoming(listener, admission, options.tls.clone());
    let mut service = RendezvousService::seated(seat);
    if let Some(complaints) = complain {
        service = service.hearing(complaints);
    }
    if let Some(shared) = reported {
        service = service.reporting(shared);
    }
    let rendezvous =
        RendezvousServer::new(service).max_decoding_message_size(limits::MAX_MESSAGE_BYTES);
    let rendezvous = tonic::service::interceptor::InterceptedService::new(
        rendezvous,
        auth::RequireToken::new(options.tokens.clone()),
    );
    // TLS, when set, is done as connections are accepted (`accept`).
    let builder = tonic::transport::Server::builder();
    let drained = std::sync::Arc::new(tokio::sync::Notify::new());
    let draining = drained.clone();
    let serving = builder
        .layer(metrics::CountRpcs(counters))
        .add_service(health_service)
        .add_service(rendezvous)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            info!("shutting down: closing every job's streams");
            stop.cancel();
            if let Err(e) = background.await {
                warn!(error = %e, "the rendezvous did not shut down cleanly");
            }
            draining.notify_one();
        });
    // Every job's stream is closed by now; a client that keeps another call
    // open (a health watch) does not hold the shutdown beyond DRAIN_LIMIT.
    tokio::select! {
        result = serving => result.map_err(Error::from),
        () = async {
            drained.notified().await;
            tokio::time::sleep(DRAIN_LIMIT).await;
        } => {
            warn!(limit_s = DRAIN_LIMIT.as_secs(), "connections still open after the shutdown's drain limit; closing them");
            Ok(())
        }
    }
}

/// How long a shutting-down server waits for its clients' open calls to
/// end once every job's stream is closed.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The metrics endpoint: the counters, the states of whichever registry
/// serves, and readiness from the role.
fn metrics_endpoint(
    counters: &metrics::ServerMetrics,
    seat: &tokio::sync::watch::Receiver<ha::Role>,
    lighthouse: Option<lighthouse::service::Shared>,
) -> accel_telemetry::Endpoint {
    let mut registry = prometheus_client::registry::Registry::default();
    counters.register(&mut registry);
    registry.register_collector(Box::new(metrics::States::new(seat.clone())));
    if let Some(l) = lighthouse {
        registry.register_collector(Box::new(lighthouse::report::Gauges(l)));
    }
    let seat = seat.clone();
    let ready: accel_telemetry::Readiness = std::sync::Arc::new(move || match &*seat.borrow() {
        ha::Role::Leader(_) => Ok(()),
        ha::Role::Follower { leader: Some(_) } => Ok(()),
        ha::Role::Follower { leader: None } => Err(
            "no leader is known yet (starting, or etcd is unreachable or without quorum)".into(),
        ),
    });
    accel_telemetry::Endpoint::new(registry, ready)
}

/// The registry's periodic work, and writing its changes as they come.
/// A store that refuses a write because another replica leads cancels
/// `fenced` and ends this (the replica steps down); other store errors are
/// logged, quietly, and retried.
pub(crate) async fn tick_and_flush(
    registry: Registry,
    fenced: Option<tokio_util::sync::CancellationToken>,
) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = accel_telemetry::quiet::Quiet::every(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = interval.tick() => registry.tick(registry.instant()),
            // With a store, changes are written (and their events
            // sent) at once, not at the next tick.
            _ = registry.changes() => {}
        }
        match registry.flush().await {
            Ok(0) => {}
            Ok(_) => registry.metrics().store_write(true),
            Err(e) if ha::is_fenced(&e) && fenced.is_some() => {
                warn!(error = %e, "stepping down");
                if let Some(f) = fenced {
                    f.cancel();
                }
                return;
            }
            Err(e) => {
                registry.metrics().store_write(false);
                match failing.hit(tokio::time::Instant::now()) {
                    accel_telemetry::quiet::Say::First => {
                        warn!(error = %e, "cannot write job state to the job store; retrying")
                    }
                    accel_telemetry::quiet::Say::Summary(n, over) => {
                        warn!(error = %e, failures = n, over_s = over.as_secs(), "still cannot write job state to the job store")
                    }
                    accel_telemetry::quiet::Say::Nothing => {}
                }
            }
        }
    }
}
