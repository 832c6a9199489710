//! What both ends of the rendezvous share, below the client and the server.
//!
//! # Why its own crate
//! The server's TLS setup, the token and the bounds on what a client sends
//! used to live in the client crate, which the server then built on and
//! re-exported; the agent took key escaping, stack rendering and time
//! formatting from the server crate. Here is what is neither a client nor
//! a server: the token ([`auth`]) and the tokens a server accepts, re-read
//! as they rotate ([`accepted`]), TLS files for both sides ([`tls`]), the
//! bounds on what crosses the wire ([`limits`]), a node's topology path
//! ([`topology`]), ids as key segments ([`keys`]), stacks as text
//! ([`stacks`]) and wall-clock times ([`time`]).
//!
//! # One direction
//! `accel-wire` depends on `accel-proto` only among accel's crates; the
//! client, the server and the agent depend on it and import from it
//! directly (no crate re-exports it).
#![deny(unsafe_code)]

pub mod accepted;
pub mod auth;
pub mod keys;
pub mod limits;
pub mod stacks;
mod stamp;
pub mod time;
pub mod tls;
pub mod topology;

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
