//! The registry's side of quarantine (the job's `quarantine` module has
//! the rule): giving every job the server's policy, spreading a host
//! benched in one job to every job when the scope is the server, and the
//! operator's `rdzv-server quarantine list|release`.
//!
//! # Server scope
//! Each job keeps its own benches, as with job scope; a host one job
//! benches is benched, with the same end, in every other job the server
//! holds and in every job created while the bench lasts (the registry's
//! copy). So a job's record carries what applies to it, and a replica that
//! takes the jobs over keeps their benches; the registry's copy for jobs
//! not yet created is rebuilt from the jobs it loads.

use std::time::Instant;

use accel_proto::v1 as pb;
use tracing::{info, warn};

use super::{Jobs, Registry};
use crate::error::Error;
use crate::job::{Job, QuarantineScope};

/// Most hosts one answer lists.
pub(super) const LIST_LIMIT: usize = 1000;

impl Registry {
    /// Whether a bench in one job applies to all.
    fn server_scope(&self) -> bool {
        self.limits
            .quarantine
            .is_some_and(|q| q.scope == QuarantineScope::Server)
    }

    /// A job the server creates or loads, with the server's policy and,
    /// for a server-wide quarantine, the hosts benched now.
    pub(super) fn equip(&self, jobs: &mut Jobs, job: Job, now: Instant) -> Job {
        let mut job = job.with_quarantine(self.limits.quarantine.map(|q| q.policy));
        if self.server_scope() {
            jobs.benches.expire(now);
            for (host, b) in jobs.benches.benched() {
                job.bench_quietly(now, host, b.until, b.reason.clone());
            }
            // And the other way: what a loaded job holds applies to all.
            for (host, b) in job.quarantine().benched() {
                jobs.benches.bench(b.since, host, b.until, b.reason.clone());
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
            jobs.benches
                .bench(b.since, &host, b.until, b.reason.clone());
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
        let entry = |job: &str, host: &str, b: &crate::job::Bench| pb::QuarantinedHost {
            job_id: job.to_owned(),
            host: host.to_owned(),
            reason: b.reason.clone(),
            since_ms: now.saturating_duration_since(b.since).as_millis() as u64,
            left_ms: b.until.saturating_duration_since(now).as_millis() as u64,
        };
        if job_id.is_empty() && self.server_scope() {
            jobs.benches.expire(now);
            hosts.extend(jobs.benches.benched().map(|(h, b)| entry("", h, b)));
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
            // The registry's copy ends its benches lazily: count the live ones.
            let now = Instant::now();
            return jobs
                .benches
                .benched()
                .filter(|(_, b)| b.until > now)
                .count() as u64;
        }
        jobs.map
            .values()
            .filter(|e| !e.job.phase().is_terminal())
            .map(|e| e.job.quarantine().benched().count() as u64)
            .sum()
    }
}
