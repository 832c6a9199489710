//! What accel's long-running programs show an operator, besides their logs:
//! Prometheus metrics, liveness and readiness over plain HTTP ([`http`]),
//! and the one way both binaries set up their logs ([`logging`]).
//!
//! Each program owns its metrics (the rendezvous server's in
//! `rendezvous_server::metrics`, the agent's in `accel_agent::metrics`) and
//! registers them in a [`prometheus_client`] registry; this crate only
//! serves a registry, so both endpoints behave alike: the same paths, the
//! same bounds on what a scraper may hold, the same shutdown.
#![forbid(unsafe_code)]

pub mod http;
pub mod logging;

pub use http::{Bind, Endpoint, Readiness};
pub use prometheus_client;
