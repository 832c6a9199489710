//! The worker environment contract, read once and validated.
//!
//! A launcher (`accel-agent`, `torchrun`) tells each worker who it is only
//! through environment variables (reference/torchrun.md §2). Python reads
//! them lazily and fails late — `int(os.environ["RANK"])` deep in
//! `init_process_group`, or never, if `RANK ≥ WORLD_SIZE` just hangs the
//! rendezvous. [`WorkerEnv`] reads them all at start-up, checks the values
//! against each other, and on failure names the variable, what was wrong
//! and how to fix it.
//!
//! The lookup is injected ([`WorkerEnv::from_lookup`]) so tests and
//! embedders (a function launcher that spawns threads, not processes) can
//! supply the values without touching the process environment.
//!
//! Required, as for PyTorch's `env://` plus the local layout every launcher
//! sets: `RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
//! MASTER_PORT`. Everything else is optional because hand-started or
//! non-elastic launches lack it. An empty value counts as missing, as in
//! PyTorch's `env://` handler.

use std::path::PathBuf;

/// Where to look for a fix, appended to every error.
const FIX: &str = "start the program with `accel-agent` (or `torchrun`), which sets it for every worker, or export it yourself";

/// A missing or invalid worker environment variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A required variable is unset or empty.
    #[error("{var} is not set: {hint}; {FIX}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What it should hold.
        hint: &'static str,
    },
    /// A variable has a value that cannot be used.
    #[error("{var}={value:?} is invalid: {reason}; {hint}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it is rejected.
        reason: String,
        /// What it should hold.
        hint: &'static str,
    },
}

/// This worker's place in the job, as its launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// `RANK`: global rank, `0..world_size`.
    pub rank: usize,
    /// `WORLD_SIZE`: number of workers in the job.
    pub world_size: usize,
    /// `LOCAL_RANK`: rank on this node, `0..local_world_size`.
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`: workers on this node.
    pub local_world_size: usize,
    /// `GROUP_RANK`: this node's rank, if the launcher set it.
    pub group_rank: Option<usize>,
    /// `GROUP_WORLD_SIZE`: nodes in this round, if set.
    pub group_world_size: Option<usize>,
    /// `ROLE_NAME`, if set.
    pub role_name: Option<String>,
    /// `ROLE_RANK`, if set.
    pub role_rank: Option<usize>,
    /// `ROLE_WORLD_SIZE`, if set.
    pub role_world_size: Option<usize>,
    /// `MASTER_ADDR`: host of the store the process group meets at.
    pub master_addr: String,
    /// `MASTER_PORT`: its port.
    pub master_port: u16,
    /// `TORCHELASTIC_RESTART_COUNT` (0 when unset): how many times the job restarted.
    pub restart_count: u32,
    /// `TORCHELASTIC_MAX_RESTARTS`, if set.
    pub max_restarts: Option<u32>,
    /// `TORCHELASTIC_RUN_ID`, if set (its presence means an elastic launcher).
    pub run_id: Option<String>,
    /// `TORCHELASTIC_USE_AGENT_STORE == "True"`: the launcher hosts the store
    /// at `MASTER_ADDR:MASTER_PORT`, so every rank is a client. Otherwise
    /// rank 0 hosts it, as PyTorch does.
    pub use_agent_store: bool,
    /// `TORCHELASTIC_ERROR_FILE`, if set and not empty: where to write a
    /// failure report.
    pub error_file: Option<PathBuf>,
    /// Where this node sits (`ACCEL_TOPOLOGY`, `ACCEL_SEGMENT*`): set by
    /// accel-agent, `None` under a launcher that does not set them.
    pub topology: Option<Topology>,
}

/// This node's topology path and its segment in the round: the run of
/// consecutive node ranks whose nodes share the path (accel-agent orders
/// node ranks so that each path is one run). For building process groups by
/// segment: its global ranks are `first_node * local_world_size` up to
/// `(first_node + nodes) * local_world_size`, exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// `ACCEL_TOPOLOGY`: the path, outermost part first (empty: none given).
    pub path: String,
    /// `ACCEL_SEGMENT`: the segment's index among the round's, in rank order.
    pub segment: usize,
    /// `ACCEL_SEGMENT_FIRST_NODE`: its first node rank.
    pub first_node: usize,
    /// `ACCEL_SEGMENT_NODES`: its number of nodes.
    pub nodes: usize,
}

impl WorkerEnv {
    /// Reads the process environment.
    pub fn from_process() -> Result<Self, EnvError> {
        Self::from_lookup(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the variables through `lookup` (name → value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let r = Reader { lookup: &lookup };
        let world_size = r.required_count("WORLD_SIZE", "the number of workers in the job")?;
        let rank = r.required_index(
            "RANK",
            "WORLD_SIZE",
            world_size,
            "this worker's global rank",
        )?;
        let local_world_size =
            r.required_count("LOCAL_WORLD_SIZE", "the number of workers on this node")?;
        if local_world_size > world_size {
            return Err(r.invalid(
                "LOCAL_WORLD_SIZE",
                format!("more workers on this node than WORLD_SIZE={world_size} in the job"),
                "the number of workers on this node",
            ));
        }
        let local_rank = r.required_index(
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            local_world_size,
            "this worker's rank on its node",
        )?;
        let group_world_size = r.optional_count("GROUP_WORLD_SIZE", "the number of nodes")?;
        let group_rank = r.optional_index(
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            group_world_size,
            "this node's rank",
        )?;
        let role_world_size = r.optional_count("ROLE_WORLD_SIZE", "workers with this role")?;
        let role_rank = r.optional_index(
            "ROLE_RANK",
            "ROLE_WORLD_SIZE",
            role_world_size,
            "rank among workers with this role",
        )?;

        let master_addr = r.get("MASTER_ADDR").ok_or(EnvError::Missing {
            var: "MASTER_ADDR",
            hint: "the host of the rank-0 store (a name or an IP address)",
        })?;
        let port_hint = "the port of the rank-0 store, 1..=65535";
        let master_port = match r.get("MASTER_PORT") {
            None => {
                return Err(EnvError::Missing {
                    var: "MASTER_PORT",
                    hint: port_hint,
                })
            }
            Some(v) => match v.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(r.invalid("MASTER_PORT", "not a port number".into(), port_hint)),
            },
        };

        let restart_count = r
            .optional_u32("TORCHELASTIC_RESTART_COUNT", "restarts so far")?
            .unwrap_or(0);
        let max_restarts = r.optional_u32("TORCHELASTIC_MAX_RESTARTS", "the restart budget")?;
        let topology = match r.number("ACCEL_SEGMENT", "this node's segment index")? {
            None => None,
            Some(segment) => {
                let hint = "the first node rank and node count of this node's segment";
                let first_node = r.number("ACCEL_SEGMENT_FIRST_NODE", hint)?.unwrap_or(0);
                let nodes = r.required_count("ACCEL_SEGMENT_NODES", hint)?;
                let end = first_node.saturating_add(nodes);
                if group_world_size.is_some_and(|n| end > n)
                    || group_rank.is_some_and(|g| g < first_node || g >= end)
                {
                    return Err(r.invalid(
                        "ACCEL_SEGMENT_NODES",
                        format!("the segment {first_node}+{nodes} does not hold GROUP_RANK within GROUP_WORLD_SIZE"),
                        hint,
                    ));
                }
                Some(Topology {
                    path: r.get("ACCEL_TOPOLOGY").unwrap_or_default(),
                    segment,
                    first_node,
                    nodes,
                })
            }
        };
        let use_agent_store = match r.get("TORCHELASTIC_USE_AGENT_STORE").as_deref() {
            None | Some("False") => false,
            Some("True") => true,
            Some(_) => {
                return Err(r.invalid(
                    "TORCHELASTIC_USE_AGENT_STORE",
                    "PyTorch compares it with \"True\" exactly".into(),
                    "\"True\" or \"False\" (Python's str(bool))",
                ))
            }
        };
        Ok(Self {
            rank,
            world_size,
            local_rank,
            local_world_size,
            group_rank,
            group_world_size,
            role_name: r.get("ROLE_NAME"),
            role_rank,
            role_world_size,
            master_addr,
            master_port,
            restart_count,
            max_restarts,
            run_id: r.get("TORCHELASTIC_RUN_ID"),
            use_agent_store,
            error_file: r.get("TORCHELASTIC_ERROR_FILE").map(PathBuf::from),
            topology,
        })
    }

    /// Whether this process must host the store itself: rank 0 when the
    /// launcher does not (PyTorch's `_create_c10d_store`).
    pub fn hosts_store(&self) -> bool {
        !self.use_agent_store && self.rank == 0
    }
}

/// Typed reads with errors that name the variable.
struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var).filter(|v| !v.is_empty())
    }

    fn invalid(&self, var: &'static str, reason: String, hint: &'static str) -> EnvError {
        EnvError::Invalid {
            var,
            value: self.get(var).unwrap_or_default(),
            reason,
            hint,
        }
    }

    fn number(&self, var: &'static str, hint: &'static str) -> Result<Option<usize>, EnvError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<usize>()
                .map(Some)
                .map_err(|_| self.invalid(var, "not a non-negative integer".into(), hint)),
        }
    }

    fn optional_count(
        &self,
        var: &'static str,
        hint: &'static str,
    ) -> Result<Option<usize>, EnvError> {
        match self.number(var, hint)? {
            Some(0) => Err(self.invalid(var, "must be at least 1".into(), hint)),
            n => Ok(n),
        }
    }

    fn required_count(&self, var: &'static str, hint: &'static str) -> Result<usize, EnvError> {
        self.optional_count(var, hint)?
            .ok_or(EnvError::Missing { var, hint })
    }

    /// An index that must be below `bound` (the value of `bound_var`), when both are set.
    fn optional_index(
        &self,
        var: &'static str,
        bound_var: &str,
        bound: Option<usize>,
        hint: &'static str,
    ) -> Result<Option<usize>, EnvError> {
        let value = self.number(var, hint)?;
        match (value, bound) {
            (Some(v), Some(b)) if v >= b => {
                Err(self.invalid(var, format!("must be below {bound_var}={b}"), hint))
            }
            _ => Ok(value),
        }
    }

    fn required_index(
        &self,
        var: &'static str,
        bound_var: &str,
        bound: usize,
        hint: &'static str,
    ) -> Result<usize, EnvError> {
        self.optional_index(var, bound_var, Some(bound), hint)?
            .ok_or(EnvError::Missing { var, hint })
    }

    fn optional_u32(&self, var: &'static str, hint: &'static str) -> Result<Option<u32>, EnvError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map(Some)
                .map_err(|_| self.invalid(var, "not a non-negative integer".into(), hint)),
        }
    }
}

#[cfg(test)]
mod tests;
