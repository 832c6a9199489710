//! Who may connect to the worker store.
//!
//! PyTorch's TCPStore protocol carries no credential, so the store decides
//! by where the connection comes from, before reading a byte. By address, a
//! connection is served if it comes from
//! * a loopback address, or the address it was made to (a connection from
//!   this host to one of its own addresses; a remote host cannot complete a
//!   handshake with a forged local source address): this host;
//! * an address of one of the round's members, as the rendezvous reports
//!   them in node rank 0's `RoundComplete.member_addrs` (the address each
//!   offered, and the one its calls came from).
//!
//! # Local users
//! An address does not tell the users of one host apart: on a shared node,
//! every local user's processes connect from loopback too. Another user's
//! process cannot read the agent's memory or its workers' (they are not
//! its processes), so without a further check the store would hand it every
//! key of the job (and let it overwrite them). So a connection whose other
//! end is a socket on this host (in the agent's network namespace) is
//! served only if the kernel says that socket belongs to the agent's user
//! or to root ([`owner_admits`]; the lookup is `owner`). The
//! workers run as the agent's user, so they are always admitted; a process
//! of another user gets the connection closed unread. A connection from
//! this host whose other end the kernel no longer knows (already closed) is
//! refused; one from another host (no socket here) is decided by address
//! alone.
//!
//! Anything refused is accepted and closed at once; refusals are logged once
//! per minute at most, with a count. Entries that are host names are resolved
//! when the store starts, concurrently and within [`RESOLVE_LIMIT`]; a
//! connection from an address that is not yet known waits for that (never
//! longer) instead of being refused early, since a PyTorch client that is
//! refused after connecting fails instead of retrying. Until the store has
//! the round's list, nothing but this host is admitted.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::warn;

/// How long resolving the members' host names may take in all.
pub const RESOLVE_LIMIT: Duration = Duration::from_secs(10);

/// Host-name lookups in flight at once (each holds a blocking thread).
const LOOKUPS_IN_FLIGHT: usize = 16;

/// Whom a store admits besides this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// The round's members: IP literals or host names. Empty: this host only.
    Members(Vec<String>),
    /// Any address. Only for a rendezvous that does not report the members
    /// (an `rdzv-server` older than this agent); the agent warns when it
    /// falls back to this.
    Anyone,
}

impl Default for Admit {
    fn default() -> Self {
        Self::Members(Vec::new())
    }
}

pub use accel_telemetry::peer::canonical;

/// An entry as an IP literal (`10.0.0.1`, `fd00::1`, `[fd00::1]`), if it is one.
pub fn literal(entry: &str) -> Option<IpAddr> {
    let e = entry.trim();
    let e = e
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .unwrap_or(e);
    e.parse::<IpAddr>().ok().map(canonical)
}

/// What to do with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Serve it.
    Admit,
    /// Close it unread.
    Refuse,
    /// Decide once the members' host names are resolved.
    AfterResolution,
}

/// The admission rule of one store.
#[derive(Debug)]
pub struct Admission {
    anyone: bool,
    /// Members given as IP literals.
    literals: HashSet<IpAddr>,
    /// Members given as host names.
    names: Vec<String>,
    /// The names' addresses, once resolved.
    resolved: OnceCell<HashSet<IpAddr>>,
}

impl Admission {
    /// The rule for `admit`; host names are resolved by [`Self::resolve`].
    pub fn new(admit: &Admit) -> Self {
        let (anyone, entries) = match admit {
            Admit::Anyone => (true, &[][..]),
            Admit::Members(m) => (false, &m[..]),
        };
        let mut literals = HashSet::new();
        let mut names = HashSet::new();
        for e in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            match literal(e) {
                Some(ip) => {
                    literals.insert(ip);
                }
                None => {
                    names.insert(e.to_ascii_lowercase());
                }
            }
        }
        let mut names: Vec<String> = names.into_iter().collect();
        names.sort();
        Self {
            anyone,
            literals,
            names,
            resolved: OnceCell::new(),
        }
    }

    /// The decision for a connection from `peer` made to `local`, before the
    /// host names are resolved if they are not yet.
    pub fn decide(&self, peer: IpAddr, local: impl FnOnce() -> Option<IpAddr>) -> Decision {
        let peer = canonical(peer);
        if self.anyone || peer.is_loopback() || self.literals.contains(&peer) {
            return Decision::Admit;
        }
        if local().map(canonical) == Some(peer) {
            return Decision::Admit;
        }
        match self.resolved.get() {
            Some(ips) if ips.contains(&peer) => Decision::Admit,
            None if !self.names.is_empty() => Decision::AfterResolution,
            _ => Decision::Refuse,
        }
    }

    /// Whether `peer` is a member once host names are resolved (waiting for
    /// that, within [`RESOLVE_LIMIT`]).
    pub async fn admits_resolved(&self, peer: IpAddr) -> bool {
        self.resolve().await.contains(&canonical(peer))
    }

    /// Resolves the members' host names once; later calls wait for the first.
    pub async fn resolve(&self) -> &HashSet<IpAddr> {
        self.resolved
            .get_or_init(|| resolve_all(self.names.clone(), RESOLVE_LIMIT))
            .await
    }
}

/// Resolves `names` concurrently within `limit`; names that fail or are not
/// answered in time are left out, with one warning naming them.
async fn resolve_all(names: Vec<String>, limit: Duration) -> HashSet<IpAddr> {
    let deadline = Instant::now() + limit;
    let mut ips = HashSet::new();
    let mut failed: Vec<String> = Vec::new();
    let mut pending = names.into_iter();
    let mut lookups = JoinSet::new();
    let lookup = |name: String| async move {
        let found = tokio::time::timeout_at(deadline, tokio::net::lookup_host((name.as_str(), 0)))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|addrs| addrs.map(|a| canonical(a.ip())).collect::<Vec<_>>());
        (name, found)
    };
    loop {
        while lookups.len() < LOOKUPS_IN_FLIGHT && Instant::now() < deadline {
            let Some(name) = pending.next() else { break };
            lookups.spawn(lookup(name));
        }
        let Some(done) = lookups.join_next().await else {
            break;
        };
        match done {
            Ok((_, Some(found))) if !found.is_empty() => ips.extend(found),
            Ok((name, _)) => failed.push(name),
            Err(_) => {}
        }
    }
    failed.extend(pending);
    if !failed.is_empty() {
        let shown: Vec<&str> = failed.iter().take(8).map(String::as_str).collect();
        warn!(
            unresolved = failed.len(),
            names = %shown.join(", "),
            limit_s = limit.as_secs_f64(),
            "the worker store could not resolve some members' host names; connections from their addresses are refused unless the rendezvous also reported them by IP"
        );
    }
    ips
}

/// Whether a connection the addresses admit may be served, given the owner
/// the kernel reports for its other end (`None`: no such socket here) and
/// the agent's own uid: the agent's user and root are; another user is not;
/// an unknown owner is refused from this host (`this_host`) and left to the
/// address rule otherwise (a remote peer has no socket here).
pub fn owner_admits(this_host: bool, owner: Option<u32>, me: u32) -> Result<(), Stranger> {
    match owner {
        Some(uid) if uid == me || uid == 0 => Ok(()),
        Some(uid) => Err(Stranger::OtherUser(uid)),
        None if this_host => Err(Stranger::Unknown),
        None => Ok(()),
    }
}

/// Why a connection from this host was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stranger {
    /// Its socket belongs to another user.
    #[error("its socket belongs to uid {0}, not the agent's user (or root)")]
    OtherUser(u32),
    /// The kernel knows no owner (the client closed already).
    #[error("the kernel knows no owner of its socket")]
    Unknown,
}

/// Shared so connection tasks can wait for the resolution.
pub type SharedAdmission = Arc<Admission>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn loopback_self_and_literal_members_are_admitted() {
        let a = Admission::new(&Admit::Members(vec![
            "10.0.0.2".into(),
            "[fd00::5]".into(),
            " ".into(),
        ]));
        let local = || Some(ip("10.0.0.1"));
        assert_eq!(a.decide(ip("127.0.0.1"), local), Decision::Admit);
        assert_eq!(a.decide(ip("::1"), local), Decision::Admit);
        assert_eq!(
            a.decide(ip("::ffff:127.0.0.1"), local),
            Decision::Admit,
            "IPv4-mapped loopback"
        );
        assert_eq!(a.decide(ip("10.0.0.2"), local), Decision::Admit);
        assert_eq!(
            a.decide(ip("::ffff:10.0.0.2"), local),
            Decision::Admit,
            "a mapped member"
        );
        assert_eq!(a.decide(ip("fd00::5"), local), Decision::Admit);
        assert_eq!(
            a.decide(ip("10.0.0.1"), local),
            Decision::Admit,
            "from this host's own address"
        );
        assert_eq!(a.decide(ip("10.0.0.3"), local), Decision::Refuse);
        assert_eq!(a.decide(ip("fd00::6"), local), Decision::Refuse);
    }

    #[test]
    fn with_no_list_only_this_host_is_admitted_and_anyone_admits_all() {
        let a = Admission::new(&Admit::default());
        assert_eq!(a.decide(ip("127.0.0.1"), || None), Decision::Admit);
        assert_eq!(a.decide(ip("192.0.2.9"), || None), Decision::Refuse);
        let any = Admission::new(&Admit::Anyone);
        assert_eq!(any.decide(ip("192.0.2.9"), || None), Decision::Admit);
    }

    #[test]
    fn canonical_and_literal_forms() {
        assert_eq!(
            canonical(IpAddr::V6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped())),
            IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4))
        );
        assert_eq!(
            canonical(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
        assert_eq!(literal("[::1]"), Some(ip("::1")));
        assert_eq!(literal("node-3.cluster"), None);
    }

    #[test]
    fn local_sockets_of_other_users_are_refused() {
        let me = 1000;
        assert_eq!(owner_admits(true, Some(me), me), Ok(()));
        assert_eq!(owner_admits(true, Some(0), me), Ok(()), "root");
        assert_eq!(owner_admits(false, Some(0), me), Ok(()));
        assert_eq!(owner_admits(true, Some(0), 0), Ok(()));
        assert_eq!(
            owner_admits(true, Some(1001), me),
            Err(Stranger::OtherUser(1001))
        );
        assert_eq!(
            owner_admits(true, Some(1001), 0),
            Err(Stranger::OtherUser(1001)),
            "a root agent refuses other users too"
        );
        assert_eq!(
            owner_admits(false, Some(1001), me),
            Err(Stranger::OtherUser(1001)),
            "a local socket on a member's address"
        );
        assert_eq!(owner_admits(true, None, me), Err(Stranger::Unknown));
        assert_eq!(owner_admits(false, None, me), Ok(()), "another host");
    }

    #[tokio::test]
    async fn host_names_are_decided_after_resolution() {
        let a = Admission::new(&Admit::Members(vec!["LocalHost".into()]));
        // 192.0.2.1 is neither loopback nor a literal: the decision waits.
        assert_eq!(
            a.decide(ip("192.0.2.1"), || None),
            Decision::AfterResolution
        );
        assert!(!a.admits_resolved(ip("192.0.2.1")).await);
        assert_eq!(a.decide(ip("192.0.2.1"), || None), Decision::Refuse);
        assert!(
            a.resolve().await.contains(&ip("127.0.0.1")),
            "localhost resolved"
        );
    }
}
