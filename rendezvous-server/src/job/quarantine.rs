//! Quarantine: keeping a node whose workers keep failing out of the job's
//! rounds for a while.
//!
//! # Why
//! On a large cluster a node that failed once tends to fail again (a GPU
//! with rising ECC errors, a flaky link). Restarting the job onto it spends
//! the restart budget on one bad machine while healthy spares wait. With a
//! [`QuarantinePolicy`] the server counts, per host name, the worker
//! failures each node's reports caused within a window; at the policy's
//! count the host is *benched* until a release time. A benched node stays a
//! member of its job (its agent keeps its connection and is told why it
//! waits), but no round places it: the job forms without it when `MIN:MAX`
//! allows, or waits for another node when it does not. When the bench ends
//! (the time passes, or an operator releases it) the node counts again, as
//! a node that just joined.
//!
//! # Keyed by host name
//! Node ids change with every start of an agent; the host is what is bad.
//! Several agents on one host (tests, odd deployments) share its count.
//!
//! # What is counted
//! The node whose report failed the running round: the first report of a
//! round, the one the job restarts for (later reports of that round are
//! ignored, as for the budget). Only dynamic rendezvous benches nodes: with
//! static ranks a node's place cannot go to another.
//!
//! # Bounds
//! At most [`MAX_HOSTS`] hosts are tracked (counts and benches each);
//! counts older than the window are forgotten. A network caller cannot grow
//! either: only a member of a running round can report a failure, and a
//! member's host name is bounded at join.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;

use super::{Job, Member, Outbound, Phase};

/// Most hosts whose failures are counted, and most hosts benched, per job
/// (or per server). They are stored in the job's record, which a store
/// writes on every change (and etcd takes at most 1.5 MiB a value): with
/// reasons of at most 256 bytes and at most 100 failures a host, the record's part
/// stays under half a megabyte, whatever token holders do.
pub const MAX_HOSTS: usize = 256;
/// Most bytes of a bench's reason.
pub(super) const MAX_REASON_BYTES: usize = 256;

/// When a node is benched, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantinePolicy {
    /// Worker failures within `window` that bench a host (at least 1).
    pub after: u32,
    /// How far back failures count.
    pub window: Duration,
    /// How long a host stays benched.
    pub hold: Duration,
}

impl QuarantinePolicy {
    /// The policy in words, for reasons and logs.
    pub fn describe(&self) -> String {
        format!(
            "{} worker failure{} within {} (--quarantine-after, --quarantine-window)",
            self.after,
            if self.after == 1 { "" } else { "s" },
            accel_input::duration_words(self.window)
        )
    }
}

/// Where a host's bench applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum QuarantineScope {
    /// In the job whose rounds it failed.
    #[default]
    Job,
    /// In every job of the server: a bad machine is bad for all.
    Server,
}

/// A server's quarantine: the policy and where a bench applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineSettings {
    /// When a host is benched.
    pub policy: QuarantinePolicy,
    /// Where.
    pub scope: QuarantineScope,
}

/// One benched host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bench {
    /// When it was benched.
    pub since: Instant,
    /// When it counts again.
    pub until: Instant,
    /// Why, in words.
    pub reason: String,
}

/// Per-host failure counts and benches: pure, clock-injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantine {
    /// Each host's failures within the window, oldest first (at most the
    /// policy's count).
    failures: BTreeMap<String, VecDeque<Instant>>,
    benched: BTreeMap<String, Bench>,
}

impl Quarantine {
    /// Counts a worker failure of `host` at `now`: `Some` with the bench if
    /// this failure benches it (its count is then cleared). A host already
    /// benched is not counted again.
    pub fn failure(
        &mut self,
        now: Instant,
        host: &str,
        policy: &QuarantinePolicy,
    ) -> Option<&Bench> {
        if policy.after == 0 || self.benched.contains_key(host) {
            return None;
        }
        let after = policy.after as usize;
        if !self.failures.contains_key(host) && self.failures.len() >= MAX_HOSTS {
            self.forget_stale(now, policy.window);
            if self.failures.len() >= MAX_HOSTS {
                // Every slot holds a recent count: drop the one whose latest
                // failure is oldest rather than refuse the newcomer.
                let oldest = self
                    .failures
                    .iter()
                    .min_by_key(|(_, at)| at.back().copied())
                    .map(|(h, _)| h.clone());
                if let Some(h) = oldest {
                    self.failures.remove(&h);
                }
            }
        }
        let at = self.failures.entry(host.to_owned()).or_default();
        at.push_back(now);
        while at
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > policy.window)
            || at.len() > after
        {
            at.pop_front();
        }
        if at.len() < after {
            return None;
        }
        self.failures.remove(host);
        let until = now.checked_add(policy.hold).unwrap_or(now);
        let reason = format!(
            "{}; out for {} (--quarantine-for)",
            policy.describe(),
            accel_input::duration_words(policy.hold)
        );
        self.bench(now, host, until, reason)
            .then(|| self.benched.get(host))
            .flatten()
    }

    /// Benches `host` until `until`, for `reason`; false if it is already
    /// benched (the later release time is kept) or [`MAX_HOSTS`] are.
    pub fn bench(&mut self, now: Instant, host: &str, until: Instant, reason: String) -> bool {
        if let Some(b) = self.benched.get_mut(host) {
            b.until = b.until.max(until);
            return false;
        }
        if self.benched.len() >= MAX_HOSTS {
            return false;
        }
        let reason = crate::limits::truncated(&reason, MAX_REASON_BYTES).to_owned();
        self.benched.insert(
            host.to_owned(),
            Bench {
                since: now,
                until,
                reason,
            },
        );
        true
    }

    /// Ends `host`'s bench now (and forgets its count); `None`: it was not
    /// benched.
    pub fn release(&mut self, host: &str) -> Option<Bench> {
        self.failures.remove(host);
        self.benched.remove(host)
    }

    /// Ends every bench whose time is up; returns those hosts.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let done: Vec<String> = self
            .benched
            .iter()
            .filter(|(_, b)| now >= b.until)
            .map(|(h, _)| h.clone())
            .collect();
        for h in &done {
            self.benched.remove(h);
        }
        done
    }

    /// When the next bench ends.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.benched.values().map(|b| b.until).min()
    }

    /// `host`'s bench, if it is benched.
    pub fn get(&self, host: &str) -> Option<&Bench> {
        self.benched.get(host)
    }

    /// Benched hosts, by name.
    pub fn benched(&self) -> impl Iterator<Item = (&String, &Bench)> {
        self.benched.iter()
    }

    /// Hosts with failures counted, each with its failure instants.
    pub fn counts(&self) -> impl Iterator<Item = (&String, &VecDeque<Instant>)> {
        self.failures.iter()
    }

    /// Whether nothing is counted or benched.
    pub fn is_empty(&self) -> bool {
        self.failures.is_empty() && self.benched.is_empty()
    }

    /// Restores a count (a record's), keeping the bounds.
    pub fn restore_count(&mut self, host: String, at: VecDeque<Instant>) {
        if self.failures.len() < MAX_HOSTS && !at.is_empty() {
            self.failures.insert(host, at);
        }
    }

    fn forget_stale(&mut self, now: Instant, window: Duration) {
        self.failures.retain(|_, at| {
            at.back()
                .is_some_and(|t| now.saturating_duration_since(*t) <= window)
        });
    }
}

impl Job {
    /// Whether `m`'s host is benched, so that no round places it. Nodes with
    /// a static rank are never benched.
    pub fn is_benched(&self, m: &Member) -> bool {
        m.requested_rank.is_none()
            && !self.quarantine.benched.is_empty()
            && self.quarantine.get(&m.hostname).is_some()
    }

    /// The job's failure counts and benches.
    pub fn quarantine(&self) -> &Quarantine {
        &self.quarantine
    }

    /// When this job benches a node, if it does.
    pub fn quarantine_policy(&self) -> Option<&QuarantinePolicy> {
        self.quarantine_policy.as_ref()
    }

    /// Hosts this job benched by its own count since the last call: a
    /// server-wide quarantine benches them in every other job too.
    pub fn take_new_benches(&mut self) -> Vec<String> {
        std::mem::take(&mut self.new_benches)
    }

    /// Counts a failure of `node_id`'s workers against its host; `Some`
    /// with words for the restart's reason if this benches the host.
    pub(super) fn count_failure(&mut self, now: Instant, node_id: &str) -> Option<String> {
        let policy = self.quarantine_policy?;
        let m = self.members.get(node_id)?;
        if m.requested_rank.is_some() || super::is_placeholder(node_id) {
            return None;
        }
        let host = m.hostname.clone();
        let bench = self.quarantine.failure(now, &host, &policy)?;
        let words = format!("host '{host}' is quarantined: {}", bench.reason);
        if self.new_benches.len() < MAX_HOSTS {
            self.new_benches.push(host);
        }
        self.recount_benched();
        Some(words)
    }

    /// `node_id` leaves because its health check failed (`why`): with a
    /// policy, its host is benched for the policy's hold, as if its
    /// workers had failed often enough, so that a node whose check passes
    /// again soon after is not placed at once. Nothing is sent: the node is
    /// leaving, and it hears why it waits when it joins again.
    pub fn bench_unhealthy(&mut self, now: Instant, node_id: &str, why: &str) {
        let Some(policy) = self.quarantine_policy else {
            return;
        };
        let Some(m) = self.members.get(node_id) else {
            return;
        };
        if m.requested_rank.is_some() || self.phase.is_terminal() {
            return;
        }
        let host = m.hostname.clone();
        let until = now.checked_add(policy.hold).unwrap_or(now);
        let reason = format!(
            "{}; out for {} (--quarantine-for)",
            accel_input::excerpt(why),
            accel_input::duration_words(policy.hold)
        );
        if self.quarantine.bench(now, &host, until, reason) {
            if self.new_benches.len() < MAX_HOSTS {
                self.new_benches.push(host);
            }
            self.recount_benched();
        }
    }

    /// Benches `host` until `until` (a server-wide quarantine, or an
    /// operator): a forming round goes on without its nodes; a running
    /// round keeps them until it ends. Its nodes that wait are told why.
    /// `None`: nothing changed (the job is over, or the host was benched
    /// already).
    pub fn bench_host(
        &mut self,
        now: Instant,
        host: &str,
        until: Instant,
        reason: String,
    ) -> Option<Vec<Outbound>> {
        if !self.bench_quietly(now, host, until, reason) {
            return None;
        }
        let mut out = self.step(now);
        out.extend(self.tell_host(now, host));
        Some(out)
    }

    /// Benches `host` without deciding anything or telling anyone: for a
    /// job being created or loaded, whose first tick decides its round.
    /// False if nothing changed.
    pub fn bench_quietly(
        &mut self,
        now: Instant,
        host: &str,
        until: Instant,
        reason: String,
    ) -> bool {
        if self.phase.is_terminal() || !self.quarantine.bench(now, host, until, reason) {
            return false;
        }
        self.recount_benched();
        true
    }

    /// Ends `host`'s bench now (an operator's release); `None`: it was not
    /// benched.
    pub fn release_host(&mut self, now: Instant, host: &str) -> Option<Vec<Outbound>> {
        self.quarantine.release(host)?;
        Some(self.unbenched(now, host, "an operator released it"))
    }

    /// `host` counts again (`why`: what ended its bench): a forming round
    /// may take it; a running round with free places re-forms with it, as
    /// for a node that joined, without spending the budget.
    pub(super) fn unbenched(&mut self, now: Instant, host: &str, why: &str) -> Vec<Outbound> {
        self.recount_benched();
        let waiting = self
            .members
            .values()
            .any(|m| m.hostname == host && m.rank.is_none());
        match self.phase {
            Phase::Forming => {
                let mut out = self.step(now);
                out.extend(self.tell_host(now, host));
                out
            }
            Phase::Running
                if waiting && (self.participants.len() as u32) < self.config.max_nodes =>
            {
                self.restart(
                    now,
                    format!("host '{host}' may take part again: {why}"),
                    false,
                )
            }
            Phase::Running => self.tell_host(now, host),
            _ => Vec::new(),
        }
    }

    /// Progress for `host`'s members that are not in a running round.
    fn tell_host(&self, now: Instant, host: &str) -> Vec<Outbound> {
        let running = self.phase == Phase::Running;
        self.members
            .iter()
            .filter(|(_, m)| m.hostname == host && !(running && m.rank.is_some()))
            .map(|(id, _)| Outbound {
                to: id.clone(),
                event: Kind::Waiting(self.waiting_of(now, id, running)),
            })
            .collect()
    }

    /// Progress for one node, saying why it waits if its host is benched.
    pub(super) fn waiting_of(&self, now: Instant, node_id: &str, spare: bool) -> pb::Waiting {
        let mut w = self.waiting(now, spare);
        let bench = self
            .members
            .get(node_id)
            .filter(|m| self.is_benched(m))
            .and_then(|m| self.quarantine.get(&m.hostname));
        if let Some(b) = bench {
            w.spare = true;
            w.last_call_ms = None;
            w.quarantine.clone_from(&b.reason);
            w.quarantine_left_ms = b.until.saturating_duration_since(now).as_millis() as u64;
        }
        w
    }

    /// Counts again the members whose host is benched, and the ready ones
    /// that are not: after a bench begins or ends. O(members).
    pub(super) fn recount_benched(&mut self) {
        let (mut ready, mut benched) = (0u32, 0u32);
        for m in self.members.values() {
            if self.is_benched(m) {
                benched += 1;
            } else if m.ready.is_some() {
                ready += 1;
            }
        }
        self.ready = ready;
        self.benched = benched;
    }

    /// Members whose host is benched.
    pub fn benched_count(&self) -> u32 {
        self.benched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(after: u32) -> QuarantinePolicy {
        QuarantinePolicy {
            after,
            window: Duration::from_secs(60),
            hold: Duration::from_secs(600),
        }
    }

    #[test]
    fn the_third_failure_within_the_window_benches_the_host() {
        let t = Instant::now();
        let mut q = Quarantine::default();
        let p = policy(3);
        assert!(q.failure(t, "node1", &p).is_none());
        assert!(q
            .failure(t + Duration::from_secs(10), "node1", &p)
            .is_none());
        // Another host's failures are its own.
        assert!(q
            .failure(t + Duration::from_secs(11), "node2", &p)
            .is_none());
        let b = q
            .failure(t + Duration::from_secs(20), "node1", &p)
            .expect("benched")
            .clone();
        assert_eq!(b.until, t + Duration::from_secs(620));
        assert!(
            b.reason.contains("3 worker failures within 1m"),
            "{}",
            b.reason
        );
        assert!(q.get("node1").is_some() && q.get("node2").is_none());
        // A benched host is not counted again.
        assert!(q
            .failure(t + Duration::from_secs(30), "node1", &p)
            .is_none());
        assert_eq!(q.next_expiry(), Some(b.until));
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let t = Instant::now();
        let mut q = Quarantine::default();
        let p = policy(2);
        assert!(q.failure(t, "n", &p).is_none());
        assert!(q.failure(t + Duration::from_secs(61), "n", &p).is_none());
        assert!(q.failure(t + Duration::from_secs(62), "n", &p).is_some());
    }

    #[test]
    fn benches_end_when_their_time_is_up_or_on_release() {
        let t = Instant::now();
        let mut q = Quarantine::default();
        assert!(q.bench(t, "a", t + Duration::from_secs(5), "why".into()));
        assert!(q.bench(t, "b", t + Duration::from_secs(9), "why".into()));
        // Benching again keeps the later end.
        assert!(!q.bench(t, "a", t + Duration::from_secs(1), "again".into()));
        assert!(q.expire(t + Duration::from_secs(4)).is_empty());
        assert_eq!(q.expire(t + Duration::from_secs(5)), ["a"]);
        assert_eq!(q.release("b").map(|b| b.reason), Some("why".into()));
        assert!(q.release("b").is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn counts_stay_bounded() {
        let t = Instant::now();
        let mut q = Quarantine::default();
        let p = policy(2);
        for i in 0..MAX_HOSTS + 10 {
            q.failure(t + Duration::from_millis(i as u64), &format!("h{i}"), &p);
        }
        assert_eq!(q.counts().count(), MAX_HOSTS);
        // The newest are kept.
        assert!(q.counts().any(|(h, _)| h == &format!("h{}", MAX_HOSTS + 9)));
        assert!(!q.counts().any(|(h, _)| h == "h0"));
    }

    #[test]
    fn off_with_a_count_of_zero() {
        let mut q = Quarantine::default();
        assert!(q.failure(Instant::now(), "n", &policy(0)).is_none());
        assert!(q.is_empty());
    }
}
