//! The rendezvous client: what the agent and `rdzv-server status` need to
//! talk to a rendezvous server.
//!
//! # Why its own crate
//! The agent used to borrow these helpers from the server crate, so every
//! client change compiled the server and a reader could not tell which of
//! the server's modules a client relied on. Here is everything on the
//! client's side of the wire: the calls ([`client`]: connecting with
//! backoff, joining, following the leader of a replicated rendezvous, the
//! unary calls with deadlines) and the one way a channel to a server is
//! built ([`endpoint`]). What both ends share (the token, TLS files, the
//! bounds) is `accel-wire`'s.
//!
//! # One direction
//! `accel-rdzv-client` depends on `accel-proto` and `accel-wire` only among
//! accel's crates; the agent and `rdzv-server status` depend on it, and it
//! never depends on either (its tests against a real server are the
//! server's integration tests).
#![deny(unsafe_code)]

pub mod client;
mod walk;

pub use client::{JoinError, Leaders, Pace, RdzvClient, Taken};

use accel_wire::tls::{self, ClientTlsFiles, TlsError};
use tonic::transport::Endpoint;

/// Why [`endpoint`] could not build a channel's endpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// `host:port` does not make a URI.
    #[error("{0}")]
    Invalid(#[source] tonic::transport::Error),
    /// A TLS file cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The TLS settings were refused by the transport.
    #[error("{0}")]
    TlsConfig(#[source] tonic::transport::Error),
}

/// The endpoint of a rendezvous server at `host:port`: `https` with `tls`'s
/// files when TLS is on, else `http`. The one channel builder of every
/// client (the agent's calls and probe, `rdzv-server status`); callers add
/// their own timeouts and keep-alives.
pub fn endpoint(host: &str, port: u16, tls: &ClientTlsFiles) -> Result<Endpoint, EndpointError> {
    let uri = tls::endpoint_uri(host, port, tls.enabled());
    let endpoint = Endpoint::from_shared(uri).map_err(EndpointError::Invalid)?;
    match tls.config(host)? {
        Some(config) => endpoint
            .tls_config(config)
            .map_err(EndpointError::TlsConfig),
        None => Ok(endpoint),
    }
}
