//! Why a node may not join a job.

/// Why a join was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JoinRefused {
    /// The node disagrees with the job on a setting.
    #[error("job '{job}' runs with {flag} {job_value}, but this node was started with {flag} {node_value}; start every node of a job with the same {flag}")]
    Mismatch {
        /// The job id.
        job: String,
        /// The flag that differs.
        flag: &'static str,
        /// The job's value.
        job_value: String,
        /// The joining node's value.
        node_value: String,
    },
    /// Static rendezvous: another node holds this node rank.
    #[error("node rank {rank} is already taken by host '{holder}' in job '{job}'; give every node a distinct --node-rank")]
    DuplicateRank {
        /// The job id.
        job: String,
        /// The contested rank.
        rank: u32,
        /// Host name of the node that holds it.
        holder: String,
    },
    /// A node rank outside `0..nnodes`.
    #[error("node rank {rank} is out of range for job '{job}' with {nnodes} nodes; use --node-rank between 0 and {}", nnodes - 1)]
    RankOutOfRange {
        /// The job id.
        job: String,
        /// The requested rank.
        rank: u32,
        /// The job's node count.
        nnodes: u32,
    },
    /// The node id is already a member.
    #[error("node id '{node}' already joined job '{job}'")]
    DuplicateNode {
        /// The job id.
        job: String,
        /// The node id.
        node: String,
    },
    /// A reconnecting member did not present its session secret.
    #[error("node id '{node}' is a member of job '{job}', but this request does not carry its session secret; a node can only resume itself")]
    WrongSession {
        /// The job id.
        job: String,
        /// The node id.
        node: String,
    },
    /// The job is over.
    #[error("job '{job}' has already {outcome}; start new jobs with a new --rdzv-id")]
    Finished {
        /// The job id.
        job: String,
        /// `succeeded` or `failed`.
        outcome: &'static str,
    },
}

/// Why a call may not act for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The node is not a member of the job.
    #[error("the node is not a member of the job")]
    NotMember,
    /// The call does not carry the node's session secret.
    #[error("the request does not carry the node's session secret")]
    WrongSession,
}
