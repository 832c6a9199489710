//! How many connections a store holds, and how many bytes of requests that
//! have not arrived whole: the store's shared bounds, as a pure ledger (no
//! sockets, no clock) that the accept loop and the connection tasks consult
//! under the store's lock.
//!
//! # Connections
//! Each connection costs the agent a descriptor, a task and a read buffer,
//! so their number is bounded by the size of the job the store serves.
//! PyTorch opens about one store connection per worker process (the
//! `TCPStore` client, shared by `PrefixStore`s), a few more for the elastic
//! agent's barrier and for c10d's own `TCPStore`s, and benchmarks and tools
//! open many more from one process; so the bound is generous:
//! [`ConnLimits::for_world`]`(world_size)` = `max(2048, 8 × world_size + 64)`
//! connections in all. One source may hold at most three quarters of that,
//! so that a quarter (at least 512) always stays for the other nodes' workers;
//! every address of this host (loopback, or the address the connection was
//! made to) is one source, since a local process may pick any `127.x`
//! address. A connection over a bound is accepted and closed before a byte
//! is read, counted, and logged at most once a minute with a count.
//!
//! # Incomplete requests
//! A request is at most one maximal COMPARE_SET (≈ 16 MiB) and stays
//! buffered until it is whole, so many connections each holding most of
//! one could make the agent hold gigabytes. The bytes buffered and not yet
//! applied, across all connections, are bounded by [`DEFAULT_PENDING_BUDGET`]
//! (64 MiB, four maximal requests; real clients' requests are a few KiB and
//! arrive whole). When a connection's buffer takes the sum over it, the
//! connection holding the most is closed first (it is the one costing the
//! most, and an attacker's), then the next, until the sum fits: a client
//! sending a legitimate 8 MiB value finishes unless others already hold
//! most of the budget. A connection told to close still counts until its
//! task has run and freed its buffer, so the budget bounds memory actually
//! held, not only what the ledger has not yet given up on.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::admission::canonical;
use super::state::ConnId;

/// Bytes of incomplete requests held across all connections of a store.
pub(crate) const DEFAULT_PENDING_BUDGET: u64 = 64 << 20;

/// The least connection limit, whatever the job's size.
pub(crate) const MIN_CONNECTIONS: usize = 2048;

/// A store's connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections in all.
    pub total: usize,
    /// Connections from one source (this host, or one remote address).
    pub per_source: usize,
}

impl ConnLimits {
    /// The bounds for a job of `world_size` workers:
    /// `max(2048, 8 × world_size + 64)` in all, three quarters of that per source.
    pub fn for_world(world_size: u32) -> Self {
        let total = (world_size as usize)
            .saturating_mul(8)
            .saturating_add(64)
            .max(MIN_CONNECTIONS);
        Self {
            total,
            per_source: total - total / 4,
        }
    }
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self::for_world(0)
    }
}

/// Where a connection comes from, for the per-source bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    /// This host: a loopback address, or the address the connection was made to.
    ThisHost,
    /// Another host's address.
    Remote(IpAddr),
}

impl Source {
    /// The source of a connection from `peer` made to `local`.
    pub(crate) fn of(peer: IpAddr, local: Option<IpAddr>) -> Self {
        let peer = canonical(peer);
        if peer.is_loopback() || local.map(canonical) == Some(peer) {
            Self::ThisHost
        } else {
            Self::Remote(peer)
        }
    }
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Full {
    /// The store holds its limit of connections.
    #[error("the worker store holds its limit of {0} connections")]
    Total(usize),
    /// The source holds its share.
    #[error("this address holds its limit of {0} worker store connections")]
    Source(usize),
}

/// Connections and incomplete-request bytes of one store.
#[derive(Debug)]
pub(crate) struct Ledger {
    limits: ConnLimits,
    budget: u64,
    open: usize,
    by_source: HashMap<Source, usize>,
    /// Bytes buffered per connection, for connections holding any.
    pending: HashMap<ConnId, u64>,
    pending_total: u64,
    /// Connections told to close for the budget, until they have.
    evicted: HashSet<ConnId>,
}

impl Ledger {
    /// A ledger with these bounds.
    pub(crate) fn new(limits: ConnLimits, budget: u64) -> Self {
        Self {
            limits,
            budget,
            open: 0,
            by_source: HashMap::new(),
            pending: HashMap::new(),
            pending_total: 0,
            evicted: HashSet::new(),
        }
    }

    /// Takes a connection from `source`, unless a bound is reached.
    pub(crate) fn open(&mut self, source: Source) -> Result<(), Full> {
        if self.open >= self.limits.total {
            return Err(Full::Total(self.limits.total));
        }
        let n = self.by_source.entry(source).or_default();
        if *n >= self.limits.per_source {
            return Err(Full::Source(self.limits.per_source));
        }
        *n += 1;
        self.open += 1;
        Ok(())
    }

    /// Releases a connection taken by [`Self::open`], and what it buffered.
    pub(crate) fn close(&mut self, id: ConnId, source: Source) {
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
            self.open -= 1;
        }
        self.set_pending(id, 0);
        self.evicted.remove(&id);
    }

    /// Records that connection `id` now buffers `bytes` not yet applied, and
    /// returns the connections to close so that the sum fits the budget,
    /// largest first (`id` itself among them if it is the largest). A
    /// connection told to close still counts until it has closed
    /// ([`Self::close`]): its buffer is held until its task runs, and the
    /// budget is about memory held.
    pub(crate) fn pending(&mut self, id: ConnId, bytes: u64) -> Vec<ConnId> {
        if self.evicted.contains(&id) {
            return vec![id]; // told to close already
        }
        self.set_pending(id, bytes);
        let mut evict = Vec::new();
        // What connections told to close before still hold counts; what
        // those chosen now hold is as good as freed.
        let mut freed = 0;
        while self.pending_total - freed > self.budget {
            // Ties go to the lowest id, so the choice does not depend on hashing.
            let Some((&largest, &held)) = self
                .pending
                .iter()
                .filter(|(c, _)| !self.evicted.contains(c))
                .max_by_key(|&(&c, &b)| (b, std::cmp::Reverse(c)))
            else {
                break; // the rest is held by connections closing already
            };
            self.evicted.insert(largest);
            evict.push(largest);
            freed += held;
        }
        evict
    }

    fn set_pending(&mut self, id: ConnId, bytes: u64) {
        let old = match bytes {
            0 => self.pending.remove(&id),
            b => self.pending.insert(id, b),
        };
        self.pending_total = self.pending_total - old.unwrap_or(0) + bytes;
    }

    /// The budget for incomplete requests, in bytes.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// Open connections (the tests' view).
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.open
    }

    /// Bytes of incomplete requests held in all.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_limits_grow_with_the_job_and_leave_a_quarter_to_others() {
        assert_eq!(
            ConnLimits::for_world(1),
            ConnLimits {
                total: 2048,
                per_source: 1536
            }
        );
        assert_eq!(ConnLimits::for_world(248).total, 2048);
        let big = ConnLimits::for_world(1024);
        assert_eq!(big.total, 8 * 1024 + 64);
        assert_eq!(big.total - big.per_source, big.total / 4);
        assert!(ConnLimits::for_world(u32::MAX).total > 8 * 1_000_000);
    }

    #[test]
    fn this_host_is_one_source_whatever_its_address() {
        let local = Some(ip("10.0.0.1"));
        for peer in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "::ffff:127.0.0.1",
            "10.0.0.1",
        ] {
            assert_eq!(Source::of(ip(peer), local), Source::ThisHost, "{peer}");
        }
        assert_eq!(
            Source::of(ip("::ffff:10.0.0.2"), local),
            Source::Remote(ip("10.0.0.2"))
        );
    }

    #[test]
    fn one_source_is_cut_at_its_share_and_others_still_get_in() {
        let mut l = Ledger::new(
            ConnLimits {
                total: 8,
                per_source: 6,
            },
            100,
        );
        let (a, b) = (Source::Remote(ip("10.0.0.2")), Source::ThisHost);
        for _ in 0..6 {
            assert_eq!(l.open(a), Ok(()));
        }
        assert_eq!(l.open(a), Err(Full::Source(6)));
        assert_eq!(l.open(b), Ok(()));
        assert_eq!(l.open(b), Ok(()));
        assert_eq!(l.open(b), Err(Full::Total(8)));
        l.close(1, a);
        assert_eq!(l.connections(), 7);
        assert_eq!(l.open(b), Ok(()), "a closed connection frees its place");
        assert_eq!(l.open(a), Err(Full::Total(8)));
    }

    #[test]
    fn over_the_budget_the_largest_buffers_are_closed_first() {
        let mut l = Ledger::new(ConnLimits::default(), 100);
        assert!(l.pending(1, 40).is_empty());
        assert!(l.pending(2, 30).is_empty());
        assert!(l.pending(3, 30).is_empty(), "exactly the budget fits");
        assert_eq!(
            l.pending(3, 31),
            vec![1],
            "the largest goes, not the newest"
        );
        assert_eq!(
            l.pending(1, 5),
            vec![1],
            "told to close: it counts nothing new"
        );
        assert_eq!(
            l.pending_bytes(),
            101,
            "but what it holds counts until it closes"
        );
        // While it has not closed, growth elsewhere closes the next largest.
        assert_eq!(l.pending(2, 35), vec![2]);
        l.close(1, Source::ThisHost);
        l.close(2, Source::ThisHost);
        assert_eq!(l.pending_bytes(), 31);
        // A connection growing past all others is the one closed.
        assert_eq!(l.pending(4, 90), vec![4]);
        l.close(4, Source::ThisHost);
        assert!(l.pending(5, 39).is_empty());
        assert_eq!(l.pending(6, 35), vec![5], "growing, but not the largest");
        l.close(5, Source::ThisHost);
        assert_eq!(l.pending_bytes(), 66);
        // Applying a request releases its bytes; closing releases the rest.
        assert!(l.pending(3, 0).is_empty());
        assert_eq!(l.pending_bytes(), 35);
        l.close(6, Source::ThisHost);
        assert_eq!(l.pending_bytes(), 0);
        assert!(l.pending(1, 5).is_empty(), "an id is forgotten once closed");
        assert_eq!(
            l.connections(),
            0,
            "closing what was never opened counts nothing"
        );
    }

    #[test]
    fn connections_closing_already_are_not_chosen_again() {
        let mut l = Ledger::new(ConnLimits::default(), 10);
        assert!(l.pending(1, 10).is_empty());
        assert_eq!(l.pending(2, 4), vec![1]);
        // 1 still holds 10: 2 is the only one that can go.
        assert_eq!(l.pending(2, 5), vec![2]);
        assert_eq!(l.pending(3, 1), vec![3]);
        l.close(1, Source::ThisHost);
        l.close(2, Source::ThisHost);
        l.close(3, Source::ThisHost);
        assert!(l.pending(4, 10).is_empty(), "all closed: room again");
    }

    #[test]
    fn equal_buffers_are_closed_in_a_fixed_order() {
        let mut l = Ledger::new(ConnLimits::default(), 10);
        assert!(l.pending(7, 6).is_empty());
        assert_eq!(l.pending(3, 6), vec![3]);
    }
}
