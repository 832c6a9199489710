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
//! # A host benched again stays out longer
//! A host benched again within the window after its last own bench ended
//! is benched for twice as long as that one, up to [`MAX_DOUBLINGS`]
//! doublings (as Kubernetes backs off a crashing container). Without it a
//! short `--quarantine-for` lets a slow host back in time for the round
//! its bench re-formed, where it is found straggling again: uncounted
//! re-forms for ever, and a job that never gets through its work. An
//! operator's release forgets the count (the host was fixed).
//!
//! # Own benches and copies
//! With `--quarantine-scope server` a job also holds *copies* of the
//! benches other jobs made (the registry's `quarantine` module). A copy
//! only takes a free place; a bench of the job's own (its workers'
//! failures, its health check) takes the place of the least recent copy
//! when the table is full. So other jobs, whatever they bench (a token
//! holder's made-up hosts included), can never keep a job from benching a
//! host that fails in it.
//!
//! # Whether a job ran
//! A job *ran* once one of its rounds has been running for [`RAN_FOR`]:
//! its workers got past their start (imports, the process group, a
//! checkpoint), so what fails there later is the host as much as the
//! script. The server-wide table holds benches from such jobs firmly and
//! the others only while there is room (the registry's `quarantine`
//! module): a one-node job that fails at once says little about its host,
//! and anyone with the token can start one under any host name. Not
//! stored: a job a replica loads counts its running time from the load.
//!
//! # Bounds
//! At most [`MAX_HOSTS`] hosts are tracked (counts and benches each, copies
//! included); counts older than the window are forgotten. A network caller
//! cannot grow either: only a member of a running round can report a
//! failure, and a member's host name is bounded at join.

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
/// Most doublings of a host's hold when it is benched again and again
/// (see the module docs): at most 64 times `--quarantine-for`.
pub(super) const MAX_DOUBLINGS: u32 = 6;
/// How long one of its rounds must have run before a job counts as one
/// that ran (see the module docs).
pub const RAN_FOR: Duration = Duration::from_secs(600);

/// When a node is benched, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantinePolicy {
    /// Worker failures within `window` that bench a host (at least 1).
    pub after: u32,
    /// How far back failures count.
    pub window: Duration,
    /// How long a host stays benched.
    pub hold: Duration,
    /// Whether a straggler counts as a failure of its host, once a round
    /// (`--straggler-quarantine`; the `stragglers` module finds them).
    pub stragglers: bool,
}

impl QuarantinePolicy {
    /// The policy in words, for reasons and logs.
    pub fn describe(&self) -> String {
        let s = if self.after == 1 { "" } else { "s" };
        let window = accel_input::duration_words(self.window);
        match self.stragglers {
            false => format!(
                "{} worker failure{s} within {window} (--quarantine-after, --quarantine-window)",
                self.after
            ),
            true => format!(
                "{} worker failure{s} or straggler finding{s} within {window} \
                 (--quarantine-after, --quarantine-window, --straggler-quarantine)",
                self.after
            ),
        }
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
    /// A copy of another job's bench (a server-wide quarantine), not one
    /// of this job's own: it gives its place to an own bench when the
    /// table is full.
    pub shared: bool,
}

/// Per-host failure counts and benches: pure, clock-injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantine {
    /// Each host's failures within the window, oldest first (at most the
    /// policy's count).
    failures: BTreeMap<String, VecDeque<Instant>>,
    benched: BTreeMap<String, Bench>,
    /// Each host's own benches in a row (each begun within the window
    /// after the last one ended), and when the last one ends.
    repeats: BTreeMap<String, Repeat>,
}

/// A host's own benches in a row: how many, and when the last one ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeat {
    /// Benches in a row.
    pub times: u32,
    /// When the last one ends.
    pub until: Instant,
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
        self.bench_own(now, host, policy, &policy.describe())
            .then(|| self.benched.get(host))
            .flatten()
    }

    /// Benches `host` as one of this job's own benches, for `why`: for the
    /// policy's hold, doubled for each bench of it in a row (see the module
    /// docs). True if that is new (as for [`Quarantine::bench`]).
    pub fn bench_own(
        &mut self,
        now: Instant,
        host: &str,
        policy: &QuarantinePolicy,
        why: &str,
    ) -> bool {
        let times = match self.repeats.get(host) {
            Some(r) if now.saturating_duration_since(r.until) <= policy.window => {
                r.times.saturating_add(1)
            }
            _ => 1,
        };
        let doublings = (times - 1).min(MAX_DOUBLINGS);
        let hold = policy.hold.saturating_mul(1 << doublings);
        let until = now.checked_add(hold).unwrap_or(now);
        let words = accel_input::duration_words(hold);
        let reason = match doublings {
            0 => format!("{why}; out for {words} (--quarantine-for)"),
            _ => format!(
                "{why}; out for {words} (--quarantine-for ×{}: benched {times} times in a row within --quarantine-window)",
                1u32 << doublings
            ),
        };
        if !self.bench(now, host, until, reason) {
            return false;
        }
        self.remember(now, host, Repeat { times, until }, policy.window);
        true
    }

    /// Keeps `host`'s benches in a row, within [`MAX_HOSTS`]: those whose
    /// window has passed go first, then the one that ended longest ago.
    fn remember(&mut self, now: Instant, host: &str, repeat: Repeat, window: Duration) {
        if !self.repeats.contains_key(host) && self.repeats.len() >= MAX_HOSTS {
            self.repeats
                .retain(|_, r| now.saturating_duration_since(r.until) <= window);
            if self.repeats.len() >= MAX_HOSTS {
                let oldest = self
                    .repeats
                    .iter()
                    .min_by_key(|(_, r)| r.until)
                    .map(|(h, _)| h.clone());
                if let Some(h) = oldest {
                    self.repeats.remove(&h);
                }
            }
        }
        self.repeats.insert(host.to_owned(), repeat);
    }

    /// Each host's own benches in a row.
    pub fn repeats(&self) -> impl Iterator<Item = (&String, &Repeat)> {
        self.repeats.iter()
    }

    /// Restores a host's benches in a row (a record's), keeping the bound.
    pub fn restore_repeat(&mut self, host: String, repeat: Repeat) {
        if self.repeats.len() < MAX_HOSTS && repeat.times > 0 {
            self.repeats.insert(host, repeat);
        }
    }

    /// Benches `host` until `until`, for `reason`, as one of this job's own
    /// benches: true if that is new (a copy of another job's bench of it
    /// becomes the job's own). False if the job benched it already (the
    /// later release time is kept) or [`MAX_HOSTS`] own benches are held.
    /// A full table gives up its least recent copy for it.
    pub fn bench(&mut self, now: Instant, host: &str, until: Instant, reason: String) -> bool {
        self.insert(now, host, until, reason, false)
    }

    /// Holds a copy of another job's bench of `host` (a server-wide
    /// quarantine): true if it is new here. A copy takes only a free place;
    /// a host benched here already keeps its bench, with the later end.
    pub fn share(&mut self, now: Instant, host: &str, until: Instant, reason: String) -> bool {
        self.insert(now, host, until, reason, true)
    }

    /// A bench as a record keeps it: own or a copy.
    pub fn restore_bench(
        &mut self,
        since: Instant,
        host: &str,
        until: Instant,
        reason: String,
        shared: bool,
    ) {
        self.insert(since, host, until, reason, shared);
    }

    fn insert(
        &mut self,
        now: Instant,
        host: &str,
        until: Instant,
        reason: String,
        shared: bool,
    ) -> bool {
        let reason = || accel_wire::limits::truncated(&reason, MAX_REASON_BYTES).to_owned();
        if let Some(b) = self.benched.get_mut(host) {
            b.until = b.until.max(until);
            if shared || !b.shared {
                return false;
            }
            // The job's own evidence now: it holds the bench whatever
            // becomes of the copy.
            b.shared = false;
            b.reason = reason();
            return true;
        }
        if self.benched.len() >= MAX_HOSTS && (shared || !self.drop_least_recent_copy()) {
            return false;
        }
        self.benched.insert(
            host.to_owned(),
            Bench {
                since: now,
                until,
                reason: reason(),
                shared,
            },
        );
        true
    }

    /// Makes room for an own bench: drops the copy benched longest ago.
    fn drop_least_recent_copy(&mut self) -> bool {
        let oldest = self
            .benched
            .iter()
            .filter(|(_, b)| b.shared)
            .min_by_key(|(_, b)| b.since)
            .map(|(h, _)| h.clone());
        oldest.is_some_and(|h| self.benched.remove(&h).is_some())
    }

    /// Ends `host`'s bench if it is a copy (the server-wide table gave the
    /// host's place to another); `None`: it is not a copy here.
    pub fn unshare(&mut self, host: &str) -> Option<Bench> {
        match self.benched.get(host) {
            Some(b) if b.shared => self.benched.remove(host),
            _ => None,
        }
    }

    /// Ends `host`'s bench now (and forgets its count); `None`: it was not
    /// benched.
    pub fn release(&mut self, host: &str) -> Option<Bench> {
        self.failures.remove(host);
        let bench = self.benched.remove(host)?;
        self.repeats.remove(host);
        Some(bench)
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

    /// Whether this job benched a host since [`Job::take_new_benches`]
    /// last ran: a change its registry writes and spreads.
    pub fn has_new_benches(&self) -> bool {
        !self.new_benches.is_empty()
    }

    /// Hosts this job benched by its own count since the last call: a
    /// server-wide quarantine benches them in every other job too.
    pub fn take_new_benches(&mut self) -> Vec<String> {
        std::mem::take(&mut self.new_benches)
    }

    /// Counts a failure of `node_id`'s workers (or, with
    /// `--straggler-quarantine`, its finding as a straggler) against its
    /// host; `Some` with words for the restart's reason if this benches the
    /// host.
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

    /// With `--straggler-quarantine`, after an evaluation of the step
    /// times: each node newly found straggling this round counts once
    /// against its host, as a failure of its workers would. If that benches
    /// a host and a spare waits (a member outside the round, not benched),
    /// the running round re-forms at once with the spare in its place, as
    /// for a membership change (nothing of the restart budget: the
    /// straggler did not fail). Without a spare the round goes on: a round
    /// a third slower beats a smaller world plus a restart, and re-forming
    /// smaller would take the host back (a restart again) each time its
    /// bench ends; the bench applies from the next round.
    pub(super) fn quarantine_stragglers(&mut self, now: Instant) -> Vec<Outbound> {
        if !self.quarantine_policy.is_some_and(|p| p.stragglers) || self.phase != Phase::Running {
            return Vec::new();
        }
        let mut benched = None;
        for s in self.stragglers.take_new() {
            if let Some(words) = self.count_failure(now, &s.node_id) {
                benched.get_or_insert((s, words));
            }
        }
        let Some((s, words)) = benched else {
            return Vec::new();
        };
        let spare = self
            .members
            .iter()
            .any(|(id, m)| m.rank.is_none() && !super::is_placeholder(id) && !self.is_benched(m));
        if !spare {
            return Vec::new();
        }
        let s = self.straggler(&s);
        let ms = |us: u64| accel_proto::goodput::short(us / 1000);
        self.restart(
            now,
            format!(
                "rank {} on host '{}' is a straggler ({:.2}x the job's median step, {} against {}); {words}",
                s.rank,
                s.host,
                s.step_us as f64 / s.median_us.max(1) as f64,
                ms(s.step_us),
                ms(s.median_us)
            ),
            false,
        )
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
        let why = accel_input::excerpt(why).to_string();
        if self.quarantine.bench_own(now, &host, &policy, &why) {
            if self.new_benches.len() < MAX_HOSTS {
                self.new_benches.push(host);
            }
            self.recount_benched();
        }
    }

    /// Holds a copy of another job's bench of `host`, until `until` (a
    /// server-wide quarantine): a forming round goes on without its nodes;
    /// a running round keeps them until it ends. Its nodes that wait are
    /// told why. `None`: nothing changed (the job is over, the host was
    /// benched already, or the table has no free place for a copy).
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

    /// Holds a copy of another job's bench of `host` without deciding
    /// anything or telling anyone: for a job being created or loaded, whose
    /// first tick decides its round. False if nothing changed.
    pub fn bench_quietly(
        &mut self,
        now: Instant,
        host: &str,
        until: Instant,
        reason: String,
    ) -> bool {
        if self.phase.is_terminal() || !self.quarantine.share(now, host, until, reason) {
            return false;
        }
        self.recount_benched();
        true
    }

    /// Ends the copy of another job's bench of `host` (the server-wide
    /// table gave its place to a newer bench): its nodes count again. The
    /// job's own bench of it stays. `None`: the job holds no copy of it.
    pub fn drop_shared(&mut self, now: Instant, host: &str) -> Option<Vec<Outbound>> {
        if self.phase.is_terminal() {
            return None;
        }
        self.quarantine.unshare(host)?;
        Some(self.unbenched(
            now,
            host,
            "its server-wide quarantine gave its place to a newer one",
        ))
    }

    /// Whether this job ran: one of its rounds has been running for
    /// [`RAN_FOR`] (the running one, by `now`, included).
    pub fn ran(&self, now: Instant) -> bool {
        self.ran
            || self
                .running_since
                .is_some_and(|t| now.saturating_duration_since(t) >= RAN_FOR)
    }

    /// The running round ends at `now` (a restart, or the job's end):
    /// remembers whether it ran long enough for the job to count as one
    /// that ran.
    pub(super) fn round_ended(&mut self, now: Instant) {
        self.ran = self.ran(now);
        self.running_since = None;
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
                if waiting
                    && (self.participants.len() as u32) < self.usable()
                    && self.config.scale_up_settle.is_zero() =>
            {
                self.restart(
                    now,
                    format!("host '{host}' may take part again: {why}"),
                    false,
                )
            }
            Phase::Running if waiting => {
                self.settle_growth(now);
                self.tell_host(now, host)
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
            stragglers: false,
        }
    }

    #[test]
    fn a_host_benched_again_soon_after_stays_out_twice_as_long_up_to_a_bound() {
        let t = crate::clock::epoch();
        let mut q = Quarantine::default();
        let p = policy(1);
        let hold = p.hold;
        // Each bench begins as the last one ends: 1x, 2x, 4x ... 64x, 64x.
        let mut at = t;
        for factor in [1, 2, 4, 8, 16, 32, 64, 64] {
            let b = q.failure(at, "slow", &p).expect("benched").clone();
            assert_eq!(b.until - at, hold * factor, "factor {factor}");
            if factor > 1 {
                assert!(b.reason.contains(&format!("×{factor}")), "{}", b.reason);
            }
            assert_eq!(q.expire(b.until), ["slow"]);
            at = b.until;
        }
        // Past the window after the last bench ended, the count starts over.
        let later = at + p.window + Duration::from_secs(1);
        let b = q.failure(later, "slow", &p).expect("benched").clone();
        assert_eq!(b.until - later, hold);
        // Another host's benches are its own; a release forgets the count.
        let other = q.failure(later, "other", &p).expect("benched").until;
        assert_eq!(other - later, hold);
        q.release("slow");
        let b = q.failure(later, "slow", &p).expect("benched").clone();
        assert_eq!(b.until - later, hold, "released: a fresh start");
        assert_eq!(q.repeats().count(), 2);
    }

    #[test]
    fn benches_in_a_row_stay_bounded() {
        let t = crate::clock::epoch();
        let mut q = Quarantine::default();
        let p = policy(1);
        for i in 0..MAX_HOSTS + 10 {
            let at = t + Duration::from_millis(i as u64);
            assert!(q.failure(at, &format!("h{i}"), &p).is_some());
            // The bench ends at once (an operator's table is not the bound).
            q.benched.clear();
        }
        assert_eq!(q.repeats().count(), MAX_HOSTS);
        // The newest are kept.
        assert!(q
            .repeats()
            .any(|(h, _)| h == &format!("h{}", MAX_HOSTS + 9)));
        assert!(!q.repeats().any(|(h, _)| h == "h0"));
    }

    #[test]
    fn the_third_failure_within_the_window_benches_the_host() {
        let t = crate::clock::epoch();
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
        let t = crate::clock::epoch();
        let mut q = Quarantine::default();
        let p = policy(2);
        assert!(q.failure(t, "n", &p).is_none());
        assert!(q.failure(t + Duration::from_secs(61), "n", &p).is_none());
        assert!(q.failure(t + Duration::from_secs(62), "n", &p).is_some());
    }

    #[test]
    fn benches_end_when_their_time_is_up_or_on_release() {
        let t = crate::clock::epoch();
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
        let t = crate::clock::epoch();
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
    fn a_jobs_own_bench_takes_the_place_of_the_least_recent_copy_and_a_copy_takes_none() {
        let t = crate::clock::epoch();
        let s = |n: u64| t + Duration::from_secs(n);
        let mut q = Quarantine::default();
        // Full of copies of other jobs' benches (a token holder's fakes).
        for i in 0..MAX_HOSTS {
            assert!(q.share(s(i as u64), &format!("fake{i}"), s(600), "theirs".into()));
        }
        assert!(!q.share(s(300), "one-more", s(600), "theirs".into()));
        assert!(q.get("one-more").is_none(), "a copy displaces nothing");
        // The job's own bench still holds: the least recent copy goes.
        let p = policy(1);
        let b = q.failure(s(301), "real", &p).expect("benched").clone();
        assert!(!b.shared, "{b:?}");
        assert!(q.get("fake0").is_none() && q.get("fake1").is_some());
        assert_eq!(q.benched().count(), MAX_HOSTS);
        // Own benches never give their place to one another, nor to copies.
        let mut own = Quarantine::default();
        for i in 0..MAX_HOSTS {
            assert!(own.bench(t, &format!("h{i}"), s(600), "ours".into()));
        }
        assert!(!own.bench(t, "h-more", s(600), "ours".into()));
        assert!(!own.share(t, "h-copy", s(600), "theirs".into()));
    }

    #[test]
    fn only_copies_are_unshared_and_a_copy_the_job_benches_itself_becomes_its_own() {
        let t = crate::clock::epoch();
        let later = t + Duration::from_secs(600);
        let mut q = Quarantine::default();
        assert!(q.bench(t, "mine", later, "ours".into()));
        assert!(q.share(t, "theirs", later, "theirs".into()));
        assert!(!q.share(t, "mine", later, "theirs".into()), "held already");
        assert!(q.unshare("mine").is_none());
        assert!(q
            .get("mine")
            .is_some_and(|b| !b.shared && b.reason == "ours"));
        // Benched here too (a failed health check): the job's own now.
        assert!(q.bench(t, "theirs", later, "its check failed".into()));
        assert!(q.unshare("theirs").is_none());
        assert!(q.share(t, "copy", later, "theirs".into()));
        assert_eq!(q.unshare("copy").map(|b| b.shared), Some(true));
        assert!(q.get("copy").is_none());
    }

    #[test]
    fn off_with_a_count_of_zero() {
        let mut q = Quarantine::default();
        assert!(q.failure(crate::clock::epoch(), "n", &policy(0)).is_none());
        assert!(q.is_empty());
    }
}
