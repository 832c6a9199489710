//! The words the node machine ([`super::machine`]) speaks that other code
//! produces: a node's place in a round, and a worker's end.
//!
//! They live apart from the code that produces them (the supervisor reaps
//! workers, `worker_env` turns a round into variables) so that the machine,
//! its driver and the simulator (`sim/`) share one vocabulary without
//! depending on processes, logs or configuration: this module imports
//! nothing of the agent's.

pub use accel_process::Ended;

/// One node's place in a completed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundInfo {
    /// Round number (job-wide).
    pub round: u64,
    /// This node's rank (`GROUP_RANK`).
    pub node_rank: u32,
    /// Nodes in the round (`GROUP_WORLD_SIZE`).
    pub nnodes: u32,
    /// Workers in the round (`WORLD_SIZE`).
    pub world_size: u32,
    /// Global rank of this node's local rank 0.
    pub base_rank: u32,
    /// Job-wide restarts so far (`TORCHELASTIC_RESTART_COUNT`).
    pub restart_count: u32,
    /// Job-wide budget (`TORCHELASTIC_MAX_RESTARTS`).
    pub max_restarts: u32,
    /// `MASTER_ADDR`.
    pub master_addr: String,
    /// `MASTER_PORT`.
    pub master_port: u32,
    /// This node's topology segment in the round (`ACCEL_SEGMENT*`).
    pub segment: Segment,
    /// The round's peer key (the `peers` module's hub); empty from a
    /// rendezvous that gives none.
    pub peer_key: Vec<u8>,
}

/// A node's segment: the run of consecutive node ranks whose nodes share its
/// topology path (the server orders ranks so that each path is one run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segment {
    /// Its index among the round's segments, in node-rank order.
    pub index: u32,
    /// Its first node rank.
    pub first_node: u32,
    /// Its number of nodes.
    pub nodes: u32,
}

/// A worker's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Local rank of the worker.
    pub local_rank: u32,
    /// Global rank of the worker.
    pub global_rank: u32,
    /// Its process id.
    pub pid: u32,
    /// How it ended.
    pub ended: Ended,
}
