//! The settings every node of a job must agree on, and the check that a
//! joining node agrees: a node started with another `--nnodes`,
//! `--nproc-per-node`, `--max-restarts` or `--no-restart-exit-code` than the
//! job's is refused with both values named, rather than silently reshaping a
//! running job (or letting one node choose what ends it, and with which code).

use std::time::Duration;

use accel_proto::v1 as pb;

/// The settings every node of a job must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobConfig {
    /// Fewest nodes a round may run with.
    pub min_nodes: u32,
    /// Most nodes a round may hold.
    pub max_nodes: u32,
    /// Workers per node.
    pub nproc_per_node: u32,
    /// Job-wide restart budget.
    pub max_restarts: u32,
    /// A node silent this long is lost; `None`: never.
    pub dead_after: Option<Duration>,
    /// Once `min_nodes` are ready, how long a first round waits for more.
    pub last_call: Duration,
    /// The worker exit code that ends the job at once (`--no-restart-exit-code`).
    pub no_restart_exit_code: Option<u8>,
    /// How long its nodes keep their workers while most of a round cannot
    /// reach the rendezvous (`outage_timeout`); `None`: agents without peer
    /// fencing, which stop them at the drop limit (no mass-silence hold).
    pub outage: Option<Duration>,
    /// The nodes' keep-alive interval (a third of `dead_after` when the
    /// agent did not say).
    pub keep_alive: Option<Duration>,
    /// Restarts in a row without progress that end the job
    /// (`--max-no-progress-restarts`; 0: never; see the `progress` module).
    pub max_no_progress_restarts: u32,
    /// Rounds run with a multiple of this many nodes (`--nnodes-multiple-of`;
    /// 0 or 1: any count from `min_nodes` to `max_nodes`).
    pub nnodes_multiple_of: u32,
    /// How long nodes enough for a larger round wait before a running
    /// round re-forms to take them (`--scale-up-settle`; zero: at once).
    pub scale_up_settle: Duration,
}

impl JobConfig {
    /// The job settings a join request carries.
    pub fn from_join(req: &pb::JoinRequest) -> Self {
        Self {
            min_nodes: req.min_nodes,
            max_nodes: req.max_nodes,
            nproc_per_node: req.nproc_per_node,
            max_restarts: req.max_restarts,
            dead_after: (req.dead_after_ms > 0).then(|| Duration::from_millis(req.dead_after_ms)),
            last_call: Duration::from_millis(req.last_call_ms),
            no_restart_exit_code: u8::try_from(req.no_restart_exit_code)
                .ok()
                .filter(|c| *c > 0),
            // Bounded as the service bounds them (`limits::check_join`), so
            // that a stored record holds them exactly.
            outage: (req.outage_ms > 0)
                .then(|| Duration::from_millis(req.outage_ms).min(accel_input::MAX_DURATION)),
            keep_alive: (req.keep_alive_ms > 0)
                .then(|| Duration::from_millis(req.keep_alive_ms).min(accel_input::MAX_DURATION)),
            max_no_progress_restarts: req.max_no_progress_restarts,
            nnodes_multiple_of: req.nnodes_multiple_of,
            scale_up_settle: Duration::from_millis(req.scale_up_settle_ms)
                .min(accel_input::MAX_DURATION),
        }
    }

    /// How many of `ready` nodes a round runs with: the largest count no
    /// more than `ready` and `max_nodes`, at least `min_nodes` and a
    /// multiple of `nnodes_multiple_of`; 0 when no such count is. The rest
    /// wait as spares.
    pub fn allowed(&self, ready: u32) -> u32 {
        let top = ready.min(self.max_nodes);
        let k = self.nnodes_multiple_of.max(1);
        let n = top - top % k;
        if n >= self.min_nodes.max(1) {
            n
        } else {
            0
        }
    }

    /// The fewest ready nodes a round may start with: `min_nodes`, rounded
    /// up to a multiple of `nnodes_multiple_of`.
    pub fn needed(&self) -> u32 {
        let k = self.nnodes_multiple_of.max(1);
        self.min_nodes.max(1).div_ceil(k).saturating_mul(k)
    }

    /// How long a member of a round goes unheard before it counts as silent
    /// when the server asks whether most of the round is (a mass silence):
    /// one and a half keep-alive intervals, so a healthy node between two
    /// keep-alives never counts. `None`: no drop limit.
    pub fn silent_after(&self) -> Option<Duration> {
        let dead_after = self.dead_after?;
        let interval = self.keep_alive.unwrap_or(dead_after / 3);
        Some((interval * 3 / 2).min(dead_after))
    }
}

/// A setting on which a joining node disagrees with its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The agent flag that sets it.
    pub flag: &'static str,
    /// The job's value.
    pub job_value: String,
    /// The node's value.
    pub node_value: String,
}

impl JobConfig {
    /// The first setting on which `node` disagrees with this job's config.
    pub fn mismatch(&self, node: &JobConfig) -> Option<Mismatch> {
        let code = |c: Option<u8>| c.map_or_else(|| "none".to_owned(), |c| c.to_string());
        let nnodes = |c: &JobConfig| {
            if c.min_nodes == c.max_nodes {
                c.max_nodes.to_string()
            } else {
                format!("{}:{}", c.min_nodes, c.max_nodes)
            }
        };
        let checks = [
            ("--nnodes", nnodes(self), nnodes(node)),
            (
                "--nproc-per-node",
                self.nproc_per_node.to_string(),
                node.nproc_per_node.to_string(),
            ),
            (
                "--max-restarts",
                self.max_restarts.to_string(),
                node.max_restarts.to_string(),
            ),
            (
                "--no-restart-exit-code",
                code(self.no_restart_exit_code),
                code(node.no_restart_exit_code),
            ),
            (
                "--max-no-progress-restarts",
                self.max_no_progress_restarts.to_string(),
                node.max_no_progress_restarts.to_string(),
            ),
            (
                "--nnodes-multiple-of",
                self.nnodes_multiple_of.max(1).to_string(),
                node.nnodes_multiple_of.max(1).to_string(),
            ),
        ];
        checks
            .into_iter()
            .find(|(_, job_value, node_value)| job_value != node_value)
            .map(|(flag, job_value, node_value)| Mismatch {
                flag,
                job_value,
                node_value,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(min_nodes: u32, max_nodes: u32, nproc_per_node: u32) -> JobConfig {
        JobConfig {
            min_nodes,
            max_nodes,
            nproc_per_node,
            max_restarts: 3,
            dead_after: None,
            last_call: Duration::ZERO,
            no_restart_exit_code: None,
            outage: None,
            keep_alive: None,
            max_no_progress_restarts: 0,
            nnodes_multiple_of: 0,
            scale_up_settle: Duration::ZERO,
        }
    }

    #[test]
    fn a_round_runs_with_the_largest_allowed_count_of_the_ready_nodes() {
        let mut c = config(2, 8, 1);
        assert_eq!((c.allowed(1), c.allowed(5), c.allowed(9)), (0, 5, 8));
        assert_eq!(c.needed(), 2);
        c.nnodes_multiple_of = 2;
        assert_eq!(
            (c.allowed(1), c.allowed(5), c.allowed(7), c.allowed(9)),
            (0, 4, 6, 8)
        );
        c.nnodes_multiple_of = 4;
        assert_eq!((c.allowed(3), c.allowed(5), c.allowed(8)), (0, 4, 8));
        assert_eq!(c.needed(), 4);
        // MAX not a multiple: the largest multiple under it.
        let mut odd = config(1, 7, 1);
        odd.nnodes_multiple_of = 3;
        assert_eq!((odd.allowed(7), odd.allowed(2), odd.needed()), (6, 0, 3));
    }

    #[test]
    fn agreeing_nodes_pass_and_the_first_difference_is_named() {
        let job = config(2, 4, 8);
        assert_eq!(job.mismatch(&job), None);
        // Timing settings are the node's own: they may differ.
        let mut timing = job;
        timing.dead_after = Some(Duration::from_secs(1));
        assert_eq!(job.mismatch(&timing), None);
        assert_eq!(
            job.mismatch(&config(3, 3, 1)),
            Some(Mismatch {
                flag: "--nnodes",
                job_value: "2:4".into(),
                node_value: "3".into(),
            })
        );
        let m = job.mismatch(&config(2, 4, 1)).expect("differs");
        assert_eq!((m.flag, m.node_value.as_str()), ("--nproc-per-node", "1"));
        let mut fatal = job;
        fatal.no_restart_exit_code = Some(93);
        let m = job.mismatch(&fatal).expect("differs");
        assert_eq!(
            (m.flag, m.job_value.as_str(), m.node_value.as_str()),
            ("--no-restart-exit-code", "none", "93")
        );
    }
}
