//! What is left of a finished job: its tombstone.
//!
//! A finished job is forgotten after `--finished-job-ttl` (and at once in
//! agent-only mode, when the agent hosting the rendezvous exits with the
//! job). A node that belonged to the job but was cut off when it ended, or
//! whose agent was restarted (by systemd, say) afterwards, would then find
//! nothing: it would start the job anew and wait alone for `join_timeout`, or
//! be told its job "is not in the store". So the end leaves a small record —
//! the outcome, the agents' exit code, the round, the finish time, and which
//! nodes took part (node ids and host names) — kept for `tombstone_ttl`
//! (ten minutes by default, at most [`crate::Limits::max_tombstones`] of
//! them, the oldest dropped first). With a job store it is written with the
//! job's final state, under its own key, so that a later leader (another
//! replica, or in agent-only mode the next agent to lead) knows it too.
//!
//! A node joining a tombstoned job is answered at once:
//! - a node of the job (its node id) gets `Joined` carrying the outcome
//!   and exits with the job's result (0 when it succeeded);
//! - an agent started after the job finished is a new run of the id (a
//!   user who fixed a bug and typed the same command again, as torchrun
//!   users do): the finished job makes room for a new one, and the agent is
//!   told the earlier run's outcome only to say so. The earlier run's own
//!   nodes are still told its outcome while the new run goes on;
//! - an agent started before the job finished is a late node of that run:
//!   on a host that took part (a node restarted by its supervisor while the
//!   job ran) it is told the outcome; elsewhere it is refused, naming the
//!   job, its outcome and the fix (another `--rdzv-id`, or running the
//!   command again). Agents that send no start time are taken as late.
//!
//! "Started" is the agent's wall clock, compared with the server's: clocks
//! more apart than the time between a job's end and a re-run blur the
//! line, which only matters for an agent started within that skew of the
//! end.
//!
//! Who took part: the members at the end, the last round's participants,
//! and every node that joined through this server (a spare or member
//! dropped before the end, for being cut off, included). Nodes that joined
//! through an earlier leader and were dropped before the end are not in a
//! job's stored state; such a node is known by its host if another node of
//! that host stayed.
//!
//! Every field is bounded: at most [`MAX_NODES`] node ids and as many host
//! names are kept (a larger job keeps the first ones in id order: a node
//! beyond them is told the job is over, without the outcome), and the
//! failure reason is cut to [`MAX_REASON`] bytes. A stored tombstone is
//! untrusted input like any other: one that does not parse is ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use accel_proto::v1 as pb;
use serde_json::{json, Value};

use crate::job::{is_placeholder, Job, Phase};

/// Most node ids (and, separately, host names) a tombstone keeps.
pub const MAX_NODES: usize = 1024;
/// Longest failure reason a tombstone keeps, in bytes.
pub const MAX_REASON: usize = 4096;

/// A finished job's outcome and who took part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// The job id.
    pub job_id: String,
    /// Whether it succeeded (else it failed).
    pub succeeded: bool,
    /// What its agents exited with: 0; for a failed job 1, or the
    /// `--no-restart-exit-code` that ended it.
    pub exit_code: i32,
    /// Why it failed (empty when it succeeded).
    pub reason: String,
    /// Its last round.
    pub round: u64,
    /// When it finished, Unix milliseconds (wall clock: shared by replicas).
    pub finished_ms: u64,
    /// Node ids that took part (members and spares at the end, and the
    /// last round's participants), sorted.
    pub nodes: Vec<String>,
    /// Their host names, sorted, without repeats.
    pub hosts: Vec<String>,
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl Tombstone {
    /// The tombstone of `job`, if it is over; `finished_ms`: now, on the
    /// wall clock; `also`: nodes that joined it but may have left (node id
    /// → host name).
    pub fn of(job: &Job, finished_ms: u64, also: &BTreeMap<String, String>) -> Option<Self> {
        let (succeeded, reason) = match job.phase() {
            Phase::Succeeded => (true, String::new()),
            Phase::Failed(r) => (false, cut(r, MAX_REASON)),
            _ => return None,
        };
        // A relearned job's placeholders stand for nobody.
        let nodes: BTreeSet<&str> = job
            .members()
            .keys()
            .chain(job.participants())
            .chain(also.keys())
            .map(String::as_str)
            .filter(|n| !is_placeholder(n))
            .collect();
        let hosts: BTreeSet<&str> = job
            .members()
            .iter()
            .filter(|(id, _)| !is_placeholder(id))
            .map(|(_, m)| m.hostname.as_str())
            .chain(also.values().map(String::as_str))
            .collect();
        Some(Self {
            job_id: job.id().to_owned(),
            succeeded,
            exit_code: job.exit_code(),
            reason,
            round: job.round(),
            finished_ms,
            nodes: nodes
                .into_iter()
                .take(MAX_NODES)
                .map(str::to_owned)
                .collect(),
            hosts: hosts
                .into_iter()
                .take(MAX_NODES)
                .map(str::to_owned)
                .collect(),
        })
    }

    /// Whether the node `node_id` on `hostname` took part in the job.
    pub fn belongs(&self, node_id: &str, hostname: &str) -> bool {
        self.took_part(node_id)
            || self
                .hosts
                .binary_search_by(|h| h.as_str().cmp(hostname))
                .is_ok()
    }

    /// Whether the node `node_id` itself took part (not merely its host).
    pub fn took_part(&self, node_id: &str) -> bool {
        self.nodes
            .binary_search_by(|n| n.as_str().cmp(node_id))
            .is_ok()
    }

    /// Whether a fresh join (no `resume`) by `node_id`, from an agent that
    /// started at wall-clock `started_ms` (0: unknown), is a new run of the
    /// id rather than a late node of this one: the agent started after the
    /// job finished and the node took no part in it.
    pub fn starts_new_run(&self, node_id: &str, resuming: bool, started_ms: u64) -> bool {
        !resuming && started_ms > self.finished_ms && !self.took_part(node_id)
    }

    /// `succeeded` or `failed`.
    pub fn outcome(&self) -> &'static str {
        if self.succeeded {
            "succeeded"
        } else {
            "failed"
        }
    }

    /// When it finished, as UTC text (`2026-12-05 12:34:56 UTC`).
    pub fn finished_text(&self) -> String {
        accel_wire::time::utc(self.finished_ms)
    }

    /// Whether it has outlived `ttl` at wall-clock `now_ms`.
    pub fn expired(&self, now_ms: u64, ttl: Duration) -> bool {
        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        now_ms.saturating_sub(self.finished_ms) >= ttl
    }

    /// What a node of the job is told when it joins.
    pub fn over(&self) -> pb::JobOver {
        pb::JobOver {
            succeeded: self.succeeded,
            exit_code: self.exit_code,
            reason: self.reason.clone(),
            round: self.round,
            finished_unix_ms: self.finished_ms,
        }
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        json!({
            "job": self.job_id,
            "succeeded": self.succeeded,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "round": self.round,
            "finished_ms": self.finished_ms,
            "nodes": self.nodes,
            "hosts": self.hosts,
        })
        .to_string()
        .into_bytes()
    }

    /// Reads a stored tombstone back; `None` if it is not one (or breaks a bound).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        let names = |key: &str| -> Option<Vec<String>> {
            let list = v.get(key)?.as_array()?;
            if list.len() > MAX_NODES {
                return None;
            }
            let mut out: Vec<String> = list
                .iter()
                .map(|x| x.as_str().map(str::to_owned))
                .collect::<Option<_>>()?;
            out.sort();
            out.dedup();
            Some(out)
        };
        let job_id = v.get("job")?.as_str()?.to_owned();
        if job_id.is_empty() || job_id.len() > crate::limits::MAX_NAME_BYTES {
            return None;
        }
        let succeeded = v.get("succeeded")?.as_bool()?;
        let exit_code = i32::try_from(v.get("exit_code")?.as_i64()?).ok()?;
        // An agent's exit status, and 0 exactly when the job succeeded.
        if succeeded != (exit_code == 0) || !(0..=255).contains(&exit_code) {
            return None;
        }
        Some(Self {
            job_id,
            succeeded,
            exit_code,
            reason: cut(v.get("reason")?.as_str()?, MAX_REASON),
            round: v.get("round")?.as_u64()?,
            finished_ms: v.get("finished_ms")?.as_u64()?,
            nodes: names("nodes")?,
            hosts: names("hosts")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stone() -> Tombstone {
        Tombstone {
            job_id: "j".into(),
            succeeded: false,
            exit_code: 1,
            reason: "worker rank 3 failed".into(),
            round: 4,
            finished_ms: 1_796_473_296_000,
            nodes: vec!["a-1".into(), "b-2".into()],
            hosts: vec!["a".into(), "b".into()],
        }
    }

    #[test]
    fn a_tombstone_reads_back_and_knows_its_nodes() {
        let t = stone();
        assert_eq!(Tombstone::decode(&t.encode()), Some(t.clone()));
        assert!(t.belongs("a-1", "elsewhere"));
        assert!(
            t.belongs("a-9", "b"),
            "a late (restarted) agent on a host of the job"
        );
        assert!(!t.belongs("c-3", "c"));
        assert!(Tombstone::decode(b"{\"job\":\"x\"}").is_none());
        assert!(Tombstone::decode(b"\xff").is_none());
    }

    #[test]
    fn an_agent_started_after_the_end_is_a_new_run_and_one_before_is_late() {
        let t = stone();
        let end = t.finished_ms;
        assert!(
            t.starts_new_run("c-3", false, end + 1),
            "the command typed again"
        );
        assert!(
            t.starts_new_run("a-9", false, end + 1),
            "on a host of the job too"
        );
        assert!(
            !t.starts_new_run("a-1", false, end + 1),
            "a node of the run"
        );
        assert!(
            !t.starts_new_run("a-9", false, end),
            "started before the end"
        );
        assert!(!t.starts_new_run("c-3", true, end + 1), "a resuming node");
        assert!(!t.starts_new_run("c-3", false, 0), "no start time: late");
    }

    #[test]
    fn expiry_and_text() {
        let t = stone();
        assert!(!t.expired(t.finished_ms + 599_999, Duration::from_secs(600)));
        assert!(t.expired(t.finished_ms + 600_000, Duration::from_secs(600)));
        assert_eq!(t.finished_text(), "2026-12-05 12:21:36 UTC");
    }
}
