//! What accel's long-running programs show an operator, besides their logs:
//! Prometheus metrics, liveness and readiness over plain HTTP ([`http`]),
//! the one way both binaries set up their logs ([`logging`]), and logging a
//! recurring problem once per episode ([`quiet`]; the rendezvous server and
//! the worker store both refuse connections in floods).
//!
//! Each program owns its metrics (the rendezvous server's in
//! `rendezvous_server::metrics`, the agent's in its `metrics` module, the worker store's in `accel_worker_store::metrics`) and
//! registers them in a [`prometheus_client`] registry; this crate only
//! serves a registry, so both endpoints behave alike: the same paths, the
//! same bounds on what a scraper may hold, the same shutdown.
#![forbid(unsafe_code)]

pub mod http;
pub mod logging;
pub mod peer;
pub mod quiet;

pub use http::{Bind, Endpoint, Readiness};
pub use prometheus_client;
