//! The rendezvous client: what the agent and `rdzv-server status` need to
//! talk to a rendezvous server.
//!
//! # Why its own crate
//! The agent used to borrow these helpers from the server crate, so every
//! client change compiled the server and a reader could not tell which of
//! the server's modules a client relied on. Here is everything on the
//! client's side of the wire: the calls ([`client`]: connecting with
//! backoff, joining, following the leader of a replicated rendezvous, the
//! unary calls with deadlines), the one way a channel to a server is built
//! ([`endpoint`]), TLS files ([`tls`]), the token ([`auth`]) the bounds
//! on what a client sends ([`limits`]) and the syntax of a node's topology
//! path ([`topology`]).
//!
//! # One direction
//! `accel-rdzv-client` depends on `accel-proto` only among accel's crates.
//! The server depends on it (for what both ends share: the token, TLS
//! files, text bounds, the leader's metadata key), and so does the agent;
//! it never depends on either. (Its tests against a real server are
//! integration tests, `tests/`, which may use the server.)
#![deny(unsafe_code)]

pub mod auth;
pub mod client;
pub mod limits;
pub mod tls;
pub mod topology;

use tonic::transport::Endpoint;

pub use auth::{AttachToken, Token, TokenError};
pub use client::{JoinError, Leaders, Pace, RdzvClient, Taken};
pub use tls::{ClientTlsFiles, TlsError};

/// The response metadata in which a follower names the leader's address.
pub const LEADER_METADATA: &str = "accel-leader";

/// `e` and its sources, joined: a transport error's own text is often only
/// "transport error".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        // Wrappers often repeat their source's text; say it once.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

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

/// Raises this process's soft limit on open files to its hard limit (each
/// agent holds a connection to the server, each worker one to the agent's
/// store), returning the new limit. systemd and most shells start services
/// at 1,024.
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    }
    Some(hard.max(soft))
}
