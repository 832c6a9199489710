//! The registry's side of quarantine (the job's `quarantine` module has
//! the rule): giving every job the server's policy, spreading a host
//! benched in one job to every job when the scope is the server, and the
//! operator's `rdzv-server quarantine list|release`.
//!
//! # Server scope
//! Each job keeps its own benches, as with job scope; a host one job
//! benches is benched, with the same end, in every other job the server
//! holds and in every job created while the bench lasts (the registry's
//! [`ServerBenches`], copied into each job). So a job's record carries what
//! applies to it, and a replica that takes the jobs over keeps their
//! benches; the registry's table for jobs not yet created is rebuilt from
//! the jobs it loads.
//!
//! # Why the server-wide table is shared out
//! The table is bounded ([`MAX_HOSTS`] hosts: it is copied into every job's
//! record), and anyone with the token can make benches: 256 one-node jobs
//! on made-up host names whose workers fail once filled it, after which no
//! real host was benched anywhere (issue 50, B6). So:
//! - **each job has its own room**: a bench of the job's own always holds
//!   in that job, taking the place of a copy of another job's bench if
//!   need be (the job's `quarantine` module). What other jobs do cannot
//!   stop a job from keeping out a host that fails in it;
//! - **one job holds at most [`JOB_SHARE`] places** of the server-wide
//!   table, so no single job fills it for everyone;
//! - **benches from jobs that ran hold firm, the others give way.** A job
//!   *ran* once one of its rounds had been running for
//!   [`RAN_FOR`](crate::job::RAN_FOR) before it benched the host
//!   ([`Job::ran`]). A bench from a job that had not run (a script that
//!   fails at start, or a made-up one-node job) takes a free place; when
//!   none is left it takes the place of the least recent bench from a job
//!   that had not run. A bench finding every place held by benches from
//!   jobs that ran is refused.
//!
//! A refused or displaced bench still holds in the job that made it; each
//! one is counted (`accel_rdzv_quarantines_refused_total{reason}`), and
//! `accel_rdzv_quarantine_table_free` says how many places are left (the
//! `AccelQuarantineTableFull` alert). To fill the table so that a real
//! host's bench is refused, a token holder must run
//! `MAX_HOSTS / JOB_SHARE` jobs for [`RAN_FOR`](crate::job::RAN_FOR) each,
//! and the benches last `--quarantine-for`; an operator sees them in
//! `rdzv-server quarantine list` and can release them.

use std::collections::BTreeMap;
use std::time::Instant;

use accel_proto::v1 as pb;
use tracing::{info, warn};

use super::{Jobs, Registry};
use crate::error::Error;
use crate::job::{Bench, Job, QuarantineScope, MAX_QUARANTINED as MAX_HOSTS};

/// Most hosts one answer lists.
pub(super) const LIST_LIMIT: usize = 1000;

/// Most places of the server-wide table that benches of one job hold.
pub(super) const JOB_SHARE: usize = MAX_HOSTS / 8;

/// A host benched server-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shared {
    /// The bench: since, until, why.
    pub(super) bench: Bench,
    /// The job that benched it; `None`: rebuilt from a copy a loaded job
    /// held (the job that made it is not known).
    pub(super) job: Option<String>,
    /// Whether that job ran ([`Job::ran`]) when it benched the host.
    pub(super) ran: bool,
}

/// Why a bench got no place in the server-wide table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its job holds [`JOB_SHARE`] places already.
    JobShare,
    /// Every place holds a bench from a job that ran.
    Full,
}

impl Refused {
    /// The metric's label.
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::JobShare => "job_share",
            Self::Full => "full",
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::JobShare => write!(
                f,
                "this job holds {JOB_SHARE} places of the server-wide quarantine already"
            ),
            Self::Full => write!(
                f,
                "the server-wide quarantine is full ({MAX_HOSTS} hosts, each from a job that ran)"
            ),
        }
    }
}

/// What [`ServerBenches::admit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admitted {
    /// A new place; `evicted`: the host whose bench gave its place.
    Added {
        /// The least recent bench from a job that had not run, dropped.
        evicted: Option<String>,
    },
    /// The host was benched server-wide already: it keeps the later end.
    Extended,
    /// No place.
    Refused(Refused),
}

/// The hosts benched in every job (`--quarantine-scope server`): pure,
/// clock-injected, at most [`MAX_HOSTS`] (see the module docs for who
/// gets a place).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ServerBenches {
    hosts: BTreeMap<String, Shared>,
}

impl ServerBenches {
    /// Gives `host`, benched as `bench` by job `job` (which `ran` or not),
    /// a place if it may have one (see the module docs). A bench whose
    /// time is up holds no place.
    pub(super) fn admit(
        &mut self,
        now: Instant,
        host: &str,
        bench: &Bench,
        job: Option<&str>,
        ran: bool,
    ) -> Admitted {
        match self.hosts.get_mut(host) {
            Some(s) if s.bench.until > now => {
                s.bench.until = s.bench.until.max(bench.until);
                s.ran |= ran;
                return Admitted::Extended;
            }
            Some(_) => {
                self.hosts.remove(host);
            }
            None => {}
        }
        if let Some(job) = job {
            let held = self
                .hosts
                .values()
                .filter(|s| s.bench.until > now && s.job.as_deref() == Some(job))
                .count();
            if held >= JOB_SHARE {
                return Admitted::Refused(Refused::JobShare);
            }
        }
        if self.hosts.len() >= MAX_HOSTS {
            self.expire(now);
        }
        let mut evicted = None;
        if self.hosts.len() >= MAX_HOSTS {
            let least_recent = self
                .hosts
                .iter()
                .filter(|(_, s)| !s.ran)
                .min_by_key(|(h, s)| (s.bench.since, (*h).clone()))
                .map(|(h, _)| h.clone());
            let Some(h) = least_recent else {
                return Admitted::Refused(Refused::Full);
            };
            self.hosts.remove(&h);
            evicted = Some(h);
        }
        let bench = Bench {
            shared: false,
            ..bench.clone()
        };
        self.hosts.insert(
            host.to_owned(),
            Shared {
                bench,
                job: job.map(str::to_owned),
                ran,
            },
        );
        Admitted::Added { evicted }
    }

    /// Whether `host` has a place (its time may be up).
    pub(super) fn holds(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// Ends `host`'s server-wide bench now; `None`: it had none.
    pub(super) fn release(&mut self, host: &str) -> Option<Shared> {
        self.hosts.remove(host)
    }

    /// Ends every bench whose time is up; returns those hosts.
    pub(super) fn expire(&mut self, now: Instant) -> Vec<String> {
        let done: Vec<String> = self
            .hosts
            .iter()
            .filter(|(_, s)| now >= s.bench.until)
            .map(|(h, _)| h.clone())
            .collect();
        for h in &done {
            self.hosts.remove(h);
        }
        done
    }

    /// The hosts benched server-wide, by name.
    pub(super) fn benched(&self) -> impl Iterator<Item = (&String, &Shared)> {
        self.hosts.iter()
    }

    /// Places left at `now` (a bench whose time is up frees its place).
    pub(super) fn free(&self, now: Instant) -> usize {
        let live = self.hosts.values().filter(|s| s.bench.until > now).count();
        MAX_HOSTS.saturating_sub(live)
    }
}

impl Registry {
    /// Whether a bench in one job applies to all.
    fn server_scope(&self) -> bool {
        self.limits
            .quarantine
            .is_some_and(|q| q.scope == QuarantineScope::Server)
    }

    /// A job the server creates or loads, with the server's policy and,
    /// for a server-wide quarantine, copies of the hosts benched now.
    pub(super) fn equip(&self, jobs: &mut Jobs, job: Job, now: Instant) -> Job {
        let mut job = job.with_quarantine(self.limits.quarantine.map(|q| q.policy));
        if self.server_scope() {
            jobs.benches.expire(now);
            for (host, s) in jobs.benches.benched() {
                job.bench_quietly(now, host, s.bench.until, s.bench.reason.clone());
            }
            // And the other way: what a loaded job holds applies to all
            // (its own benches as its; the copies it held as copies).
            let id = job.id().to_owned();
            for (host, b) in job.quarantine().benched() {
                if b.shared && jobs.benches.holds(host) {
                    continue;
                }
                let made = (!b.shared).then_some(id.as_str());
                if let Admitted::Refused(why) = jobs.benches.admit(now, host, b, made, false) {
                    self.metrics.quarantine_refused(why.label());
                }
            }
        }
        job
    }

    /// Spreads the hosts job `job_id` just benched to every other job, for
    /// a server-wide quarantine, and logs each bench once.
    pub(super) fn spread_benches(&self, jobs: &mut Jobs, job_id: &str, now: Instant) {
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        let new = entry.job.take_new_benches();
        if new.is_empty() {
            return;
        }
        let ran = entry.job.ran(now);
        let benches: Vec<_> = new
            .into_iter()
            .filter_map(|h| entry.job.quarantine().get(&h).map(|b| (h, b.clone())))
            .collect();
        for (host, b) in &benches {
            self.metrics.quarantined();
            warn!(job = %job_id, host = %host, reason = %b.reason, "quarantined a host: no round of {} places it until its quarantine ends (rdzv-server quarantine release {host} ends it now)",
                if self.server_scope() { "any job" } else { "this job" });
        }
        if !self.server_scope() {
            return;
        }
        let others: Vec<String> = jobs
            .map
            .keys()
            .filter(|id| id.as_str() != job_id)
            .cloned()
            .collect();
        for (host, b) in benches {
            match jobs.benches.admit(now, &host, &b, Some(job_id), ran) {
                Admitted::Refused(why) => {
                    self.metrics.quarantine_refused(why.label());
                    warn!(job = %job_id, host = %host, "{why} (accel_rdzv_quarantines_refused_total): the host is quarantined in this job only");
                    continue;
                }
                Admitted::Added {
                    evicted: Some(gone),
                } => {
                    self.metrics.quarantine_refused("evicted");
                    info!(host = %gone, for_host = %host, "the server-wide quarantine is full: the least recent quarantine from a job that had not run gave its place (it still holds in the job that made it)");
                    self.unshare_everywhere(jobs, &gone, now);
                }
                Admitted::Added { evicted: None } | Admitted::Extended => {}
            }
            for id in &others {
                let Some(e) = jobs.map.get_mut(id) else {
                    continue;
                };
                if let Some(out) = e.job.bench_host(now, &host, b.until, b.reason.clone()) {
                    self.after(jobs, id, now, out);
                }
            }
        }
    }

    /// Drops every job's copy of `host`'s bench (the server-wide table gave
    /// its place to another); the job that made it keeps its own.
    fn unshare_everywhere(&self, jobs: &mut Jobs, host: &str, now: Instant) {
        let ids: Vec<String> = jobs.map.keys().cloned().collect();
        for id in ids {
            let Some(e) = jobs.map.get_mut(&id) else {
                continue;
            };
            if let Some(out) = e.job.drop_shared(now, host) {
                self.after(jobs, &id, now, out);
            }
        }
    }

    /// The quarantined hosts of `job_id` (empty: of every job, and the
    /// server-wide ones), after ending `release`'s quarantine there if
    /// given. A released host's nodes may take part in the next round.
    pub fn quarantine(
        &self,
        now: Instant,
        job_id: &str,
        release: &str,
    ) -> Result<pb::QuarantineResponse, Error> {
        self.acting()?;
        let mut guard = self.lock();
        let jobs = &mut *guard;
        if !job_id.is_empty() && !jobs.map.contains_key(job_id) {
            return Err(Error::UnknownJob(job_id.to_owned()));
        }
        let mut released = 0u32;
        if !release.is_empty() {
            if job_id.is_empty() && jobs.benches.release(release).is_some() {
                released += 1;
            }
            let ids: Vec<String> = match job_id.is_empty() {
                true => jobs.map.keys().cloned().collect(),
                false => vec![job_id.to_owned()],
            };
            for id in ids {
                let Some(e) = jobs
                    .map
                    .get_mut(&id)
                    .filter(|e| !e.job.phase().is_terminal())
                else {
                    continue;
                };
                if let Some(out) = e.job.release_host(now, release) {
                    released += 1;
                    self.after(jobs, &id, now, out);
                }
            }
            if released == 0 {
                return Err(Error::NotQuarantined(release.to_owned()));
            }
            info!(host = %release, job = %job_id, released, "an operator released a quarantined host");
        }
        let mut hosts = Vec::new();
        let entry = |job: &str, host: &str, b: &Bench| pb::QuarantinedHost {
            job_id: job.to_owned(),
            host: host.to_owned(),
            reason: b.reason.clone(),
            since_ms: now.saturating_duration_since(b.since).as_millis() as u64,
            left_ms: b.until.saturating_duration_since(now).as_millis() as u64,
        };
        if job_id.is_empty() && self.server_scope() {
            jobs.benches.expire(now);
            hosts.extend(jobs.benches.benched().map(|(h, s)| entry("", h, &s.bench)));
        } else {
            let scoped = jobs
                .map
                .iter()
                .filter(|(id, _)| job_id.is_empty() || id.as_str() == job_id);
            for (id, e) in scoped {
                if e.job.phase().is_terminal() {
                    continue;
                }
                hosts.extend(e.job.quarantine().benched().map(|(h, b)| entry(id, h, b)));
                if hosts.len() >= LIST_LIMIT {
                    break;
                }
            }
        }
        hosts.truncate(LIST_LIMIT);
        Ok(pb::QuarantineResponse { hosts, released })
    }

    /// Hosts benched now: server-wide ones once, else each job's.
    pub(super) fn quarantined_in(&self, jobs: &Jobs) -> u64 {
        if self.server_scope() {
            // The registry's table ends its benches lazily: count the live ones.
            return (MAX_HOSTS - jobs.benches.free(self.clock.instant())) as u64;
        }
        jobs.map
            .values()
            .filter(|e| !e.job.phase().is_terminal())
            .map(|e| e.job.quarantine().benched().count() as u64)
            .sum()
    }

    /// Places left in the server-wide table (all of them with job scope,
    /// which leaves it empty).
    pub(super) fn quarantine_free_in(&self, jobs: &Jobs) -> u64 {
        jobs.benches.free(self.clock.instant()) as u64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::job::{QuarantinePolicy, QuarantineSettings, Session, RAN_FOR, SESSION_BYTES};
    use crate::limits::Limits;

    fn bench(since: Instant) -> Bench {
        Bench {
            since,
            until: since + Duration::from_secs(3600),
            reason: "failed".into(),
            shared: false,
        }
    }

    #[test]
    fn one_job_holds_at_most_its_share() {
        let t = crate::clock::epoch();
        let mut table = ServerBenches::default();
        for i in 0..JOB_SHARE {
            let added = table.admit(t, &format!("h{i}"), &bench(t), Some("greedy"), true);
            assert_eq!(added, Admitted::Added { evicted: None });
        }
        assert_eq!(
            table.admit(t, "one-more", &bench(t), Some("greedy"), true),
            Admitted::Refused(Refused::JobShare)
        );
        // Another job, and a host benched already, are not refused.
        assert_eq!(
            table.admit(t, "other", &bench(t), Some("other"), false),
            Admitted::Added { evicted: None }
        );
        assert_eq!(
            table.admit(t, "h0", &bench(t), Some("greedy"), true),
            Admitted::Extended
        );
        assert_eq!(table.free(t), MAX_HOSTS - JOB_SHARE - 1);
    }

    #[test]
    fn a_full_table_gives_up_its_least_recent_bench_from_a_job_that_had_not_run() {
        let t = crate::clock::epoch();
        let at = |s: u64| t + Duration::from_secs(s);
        let mut table = ServerBenches::default();
        // One job each (as a token holder's one-node jobs), half of them ran.
        for i in 0..MAX_HOSTS {
            let ran = i % 2 == 1;
            let job = format!("job{i}");
            let added = table.admit(
                at(i as u64),
                &format!("h{i}"),
                &bench(at(i as u64)),
                Some(&job),
                ran,
            );
            assert_eq!(added, Admitted::Added { evicted: None });
        }
        assert_eq!(table.free(at(300)), 0);
        // h0 is the least recent from a job that had not run, then h2...
        let newcomer = |table: &mut ServerBenches, host: &str, ran: bool| {
            table.admit(at(300), host, &bench(at(300)), Some(host), ran)
        };
        assert_eq!(
            newcomer(&mut table, "real", true),
            Admitted::Added {
                evicted: Some("h0".into())
            }
        );
        assert_eq!(
            newcomer(&mut table, "fresh", false),
            Admitted::Added {
                evicted: Some("h2".into())
            }
        );
        assert!(table.holds("real") && table.holds("fresh") && table.holds("h1"));
        // Once every place holds a bench from a job that ran, a bench is
        // refused, whether or not its own job ran.
        let mut i = 0;
        while table.benched().any(|(_, s)| !s.ran) {
            let host = format!("ran{i}");
            assert!(matches!(
                newcomer(&mut table, &host, true),
                Admitted::Added { evicted: Some(_) }
            ));
            i += 1;
        }
        for ran in [true, false] {
            assert_eq!(
                newcomer(&mut table, "late", ran),
                Admitted::Refused(Refused::Full)
            );
        }
        // A bench whose time is up frees its place.
        // h1, benched at 1 s for an hour, is the first whose time is up.
        let gone = at(3601);
        assert_eq!(table.free(gone), 1);
        assert_eq!(
            table.admit(gone, "late", &bench(gone), Some("late"), false),
            Admitted::Added { evicted: None }
        );
        assert!(!table.holds("h1"));
    }

    fn session(n: u64) -> Session {
        let mut bytes = [0u8; SESSION_BYTES];
        bytes[..8].copy_from_slice(&n.to_le_bytes());
        Session::from_bytes(bytes)
    }

    /// Issue 50, B6: a token holder's one-node jobs on made-up hosts,
    /// each failing once, fill the server-wide table; a real host that
    /// fails afterwards is quarantined all the same, in its job and in
    /// every job, and a real job's quarantine that ran is not given up
    /// for more of them.
    #[test]
    fn made_up_hosts_filling_the_table_do_not_stop_a_real_hosts_quarantine() {
        let limits = Limits {
            quarantine: Some(QuarantineSettings {
                policy: QuarantinePolicy {
                    after: 1,
                    window: Duration::from_secs(600),
                    hold: Duration::from_secs(7200),
                    stragglers: false,
                },
                scope: QuarantineScope::Server,
            }),
            ..Limits::default()
        };
        let registry = Registry::new(Duration::from_secs(3600), limits);
        let t = crate::clock::epoch();
        let mut n = 0u64;
        let mut streams = Vec::new();
        let mut join = |now: Instant, job: &str, node: &str, host: &str, nodes: u32| {
            n += 1;
            let req = pb::JoinRequest {
                job_id: job.into(),
                node_id: node.into(),
                hostname: host.into(),
                min_nodes: nodes,
                max_nodes: nodes,
                nproc_per_node: 1,
                // The made-up jobs end at their failure; the real ones go on.
                max_restarts: if job.starts_with("fake") { 0 } else { 3 },
                dead_after_ms: 3_600_000,
                ..Default::default()
            };
            streams.push(registry.join(now, &req, None, session(n)).expect("joins"));
            n
        };
        let act = |now: Instant, job: &str, node: &str, s: u64, fail: bool| {
            registry
                .for_node(now, job, node, &session(s).to_vec(), |j| {
                    let out = match fail {
                        false => j.ready(now, node, j.round(), ("127.0.0.1".into(), 1), None),
                        true => j.failure(now, node, j.round(), "worker 0 exited 1".into(), None),
                    };
                    ((), out)
                })
                .expect("a member");
        };
        let fake = |join: &mut dyn FnMut(Instant, &str, &str, &str, u32) -> u64,
                    now: Instant,
                    i: usize| {
            let (job, host) = (format!("fake-job-{i}"), format!("fake-{i}"));
            let s = join(now, &job, "n", &host, 1);
            act(now, &job, "n", s, false);
            act(now, &job, "n", s, true);
        };
        for i in 0..MAX_HOSTS {
            fake(&mut join, t + Duration::from_millis(i as u64), i);
        }
        let listed = registry.quarantine(t, "", "").expect("list");
        assert_eq!(listed.hosts.len(), MAX_HOSTS);
        assert_eq!(registry.summary().quarantine_free, 0);

        // A real job, created after: it holds copies of all 256.
        let at = t + Duration::from_secs(1);
        let a = join(at, "real", "a", "bad", 2);
        let b = join(at, "real", "b", "good", 2);
        assert_eq!(
            registry
                .quarantine(at, "real", "")
                .expect("list")
                .hosts
                .len(),
            MAX_HOSTS
        );
        act(at, "real", "a", a, false);
        act(at, "real", "b", b, false);
        // Its round runs long enough for the job to have run; "bad" fails.
        let failed = at + RAN_FOR;
        act(failed, "real", "a", a, true);
        let everywhere = registry.quarantine(failed, "", "").expect("list");
        assert!(
            everywhere.hosts.iter().any(|h| h.host == "bad"),
            "{everywhere:?}"
        );
        assert!(
            !everywhere.hosts.iter().any(|h| h.host == "fake-0"),
            "the least recent made-up host gave its place"
        );
        let real = registry.quarantine(failed, "real", "").expect("list");
        assert!(real.hosts.iter().any(|h| h.host == "bad"));
        assert_eq!(real.hosts.len(), MAX_HOSTS);
        // A job that starts now keeps "bad" out too.
        let c = join(failed, "next", "c", "bad", 1);
        act(failed, "next", "c", c, false);
        let next = registry.status("next", 0, "").expect("status");
        assert_eq!(next.jobs[0].nodes[0].state, "quarantined", "{next:?}");

        // More made-up hosts take one another's places, never "bad"'s.
        for i in MAX_HOSTS..3 * MAX_HOSTS {
            fake(&mut join, failed + Duration::from_millis(i as u64), i);
        }
        let later = failed + Duration::from_secs(1);
        let everywhere = registry.quarantine(later, "", "").expect("list");
        assert_eq!(everywhere.hosts.len(), MAX_HOSTS);
        assert!(everywhere.hosts.iter().any(|h| h.host == "bad"));
        let next = registry.status("next", 0, "").expect("status");
        assert_eq!(next.jobs[0].nodes[0].state, "quarantined", "{next:?}");
        drop(streams);
    }
}
