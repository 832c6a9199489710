//! The agent's validated configuration, built from [`LaunchOptions`] and the
//! environment by the same rules as torchrun's `run()` (reference: torchrun
//! §1 "Derivation rules"), with the deviations the user guide lists
//! (`docs/src/migrating-from-torchrun.md`).
//!
//! The environment is read through an injected lookup, so tests never touch
//! the process environment.

use std::path::PathBuf;
use std::time::Duration;

use accel_input::excerpt;
use nix::sys::signal::Signal;

pub mod conflicts;
mod options;
mod rdzv_conf;
pub mod slurm;
mod topology;
pub use options::{
    rank_filter, std_spec, Backend, LaunchOptions, NodeCount, Nproc, RankFilter, Signals,
};
pub use rdzv_conf::{parse_bool, parse_bytes, EtcdConf, PortRange, RdzvConf};

/// A configuration the agent cannot run with; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn bad(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Default port of a c10d rendezvous endpoint (torchrun's).
pub const C10D_PORT: u16 = 29400;
/// Default port of an etcd endpoint (etcd's client port).
pub const ETCD_PORT: u16 = 2379;
/// Default static master port (torchrun's).
pub const STATIC_PORT: u16 = 29500;

/// How this agent finds the job's rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// One node: the rendezvous runs inside this agent on a free loopback port.
    Standalone,
    /// Fixed node ranks; node rank 0 serves the rendezvous at `host:port`.
    Static {
        /// Address of the node-rank-0 host.
        host: String,
        /// Port the node-rank-0 agent serves the rendezvous on.
        port: u16,
        /// This node's rank.
        node_rank: u32,
    },
    /// Join the rendezvous server at `host:port` (hosting it here when `is_host`).
    C10d {
        /// Server host.
        host: String,
        /// Server port.
        port: u16,
        /// Further replicas of the same rendezvous (`--rdzv-endpoint A,B,C`,
        /// rdzv-server on etcd): the agent joins whichever leads, and moves
        /// to the new leader when it changes. Never hosted by an agent.
        replicas: Vec<(String, u16)>,
    },
    /// No rendezvous server (`--rdzv-backend etcd`): every agent of the job
    /// runs a replica of the rendezvous on etcd, one of them is elected to
    /// serve it, and when its node dies another takes over with the state
    /// etcd holds. `--rdzv-conf` `protocol`, `cacert`, `cert`, `key`,
    /// `etcd_prefix` and `etcd_lease` say how etcd is reached.
    Etcd {
        /// etcd client URLs (`http://host:2379`, or `https://` with `protocol=https`).
        endpoints: Vec<String>,
    },
}

/// What each worker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entrypoint {
    /// The program to execute.
    pub program: String,
    /// Arguments before the script's own (`-u`, `-m`, the script path).
    pub leading_args: Vec<String>,
    /// The script's arguments; `${local_rank}` is substituted per worker.
    pub script_args: Vec<String>,
}

/// Everything the agent needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// How the rendezvous is reached.
    pub rendezvous: Rendezvous,
    /// The job id (`TORCHELASTIC_RUN_ID`).
    pub run_id: String,
    /// Fewest nodes a round runs with (`--nnodes MIN:MAX`).
    pub min_nodes: u32,
    /// Most nodes a round runs with.
    pub max_nodes: u32,
    /// Workers on this node.
    pub nproc_per_node: u32,
    /// Job-wide restart budget.
    pub max_restarts: u32,
    /// Backstop period of the worker health check.
    pub monitor_interval: Duration,
    /// Grace between a stop signal and SIGKILL.
    pub shutdown_timeout: Duration,
    /// How long a succeeded node waits for the rest of the job.
    pub exit_barrier_timeout: Duration,
    /// `--rdzv-conf`.
    pub rdzv: RdzvConf,
    /// The rendezvous token (`token_file`, else `ACCEL_RDZV_TOKEN`): every
    /// call carries it, and an embedded rendezvous requires it.
    pub token: Option<accel_wire::auth::Token>,
    /// `ROLE_NAME`.
    pub role: String,
    /// What the workers run.
    pub entrypoint: Entrypoint,
    /// Base directory of per-attempt worker files.
    pub log_dir: Option<PathBuf>,
    /// This node's address for other nodes.
    pub local_addr: Option<String>,
    /// `--node-identity`: the name the rendezvous knows this machine by
    /// (quarantine, status, topology, failure reports); `None`: the host
    /// name.
    pub node_identity: Option<String>,
    /// Where this node sits in the machine (`--topology`, `--topology-file`,
    /// Slurm's topology address, the GPUs' NVLink domain; empty: unknown),
    /// sent when it joins.
    pub topology: String,
    /// Signals forwarded to workers on shutdown.
    pub signals: Vec<Signal>,
    /// The `--signals-to-handle` text, exported to workers.
    pub signals_text: String,
    /// `--virtual-local-rank`.
    pub virtual_local_rank: bool,
    /// Where worker output goes.
    pub logs: crate::logs::LogSpec,
    /// Where torchelastic's status events go (`--event-log-handler`).
    pub event_log_handler: crate::events::EventHandler,
    /// The `--rdzv-backend` name torchrun's events report (`c10d` for a
    /// standalone job, as torchrun makes one).
    pub rdzv_backend_name: &'static str,
    /// The agent's own `TORCHELASTIC_ERROR_FILE`, set by a parent launcher.
    pub parent_error_file: Option<PathBuf>,
    /// Warnings to print once logging is up.
    pub warnings: Vec<String>,
    /// Variables set for every worker under torchrun's (`accel launch` puts
    /// accelerate's here); later entries win.
    pub base_env: Vec<(String, String)>,
    /// Whether workers get torchrun's variables (`RANK`, ...). Off only for
    /// accelerate's single-process launch, whose script must not see them.
    pub torchrun_env: bool,
    /// Where the agent serves its metrics (`--metrics-bind`).
    pub metrics_bind: accel_telemetry::Bind,
    /// The inherited socket of a fork server (`--fork-server-fd`): workers
    /// are forks of that process, not executions of the entrypoint.
    pub fork_server_fd: Option<i32>,
    /// Waits between restarts in a crash loop.
    pub restart_backoff: RestartBackoff,
    /// The named pipe of torchrun's `FileTimer` protocol, when
    /// `TORCHELASTIC_ENABLE_FILE_TIMER=1` (workers get it as
    /// `TORCHELASTIC_TIMER_FILE`).
    pub file_timer: Option<PathBuf>,
    /// `--health-check`: passed before each round this node offers itself for.
    pub health_check: Option<crate::health::HealthCheck>,
    /// How long workers wait for the last round's processes to release the
    /// GPUs (`--gpu-free-timeout`).
    pub gpu_free_timeout: Duration,
    /// `--no-restart-exit-code`: a worker exiting with it ends the job at
    /// once (its failure report says so).
    pub no_restart_exit_code: Option<i32>,
    /// `--max-no-progress-restarts`: restarts in a row without progress
    /// that end the job (0: never; the rendezvous decides).
    pub max_no_progress_restarts: u32,
    /// `--nnodes-multiple-of`: rounds run with a multiple of this many
    /// nodes (1: any count; the rendezvous decides).
    pub nnodes_multiple_of: u32,
    /// `--scale-up-settle`.
    pub scale_up_settle: Duration,
    /// `--checkpoint-iteration-file`: read every second as every worker's
    /// checkpointed step (the `progress` module).
    pub checkpoint_iteration_file: Option<PathBuf>,
    /// `--learned-hang-timeouts`: hangs judged by timeouts learned from the
    /// workers' step times (the `hang` module; `None`: off).
    pub hang: Option<crate::hang::Settings>,
    /// `--preload`: the modules a zygote imports, whose forks the workers
    /// are (empty: workers are executed).
    pub preload: Vec<String>,
    /// `--numa-binding`: the CPUs of each local rank, by local rank.
    pub numa_binding: Option<Vec<crate::numa::CpuList>>,
}

impl Config {
    /// The name the rendezvous knows this machine by (its quarantine,
    /// status, topology, failure reports): `--node-identity`, else
    /// `hostname`. The host name stays for what is about the network (the
    /// store's address, log prefixes).
    pub fn identity<'a>(&'a self, hostname: &'a str) -> &'a str {
        self.node_identity.as_deref().unwrap_or(hostname)
    }

    /// The TLS files of the link to the rendezvous: none for a standalone
    /// job (its rendezvous is on loopback inside this agent).
    pub fn link_tls(&self) -> accel_wire::tls::ClientTlsFiles {
        match self.rendezvous {
            Rendezvous::Standalone => Default::default(),
            _ => self.rdzv.tls.clone(),
        }
    }

    /// How long a node that lost the rendezvous keeps trying to rejoin:
    /// `reconnect_grace`, but never shorter than an agent-only rendezvous's
    /// failover ([`conflicts::rejoin_grace`]).
    pub fn reconnect_grace(&self) -> Duration {
        conflicts::rejoin_grace(&self.rendezvous, &self.rdzv)
    }

    /// How long a round may take to form before the agent gives up.
    pub fn join_timeout(&self) -> Duration {
        match self.rendezvous {
            Rendezvous::Static { .. } => self.rdzv.timeout,
            _ => self.rdzv.join_timeout,
        }
    }
}

/// `N` or `MIN:MAX`, with `0 < MIN <= MAX`.
pub fn parse_nnodes(s: &str) -> Result<(u32, u32), ConfigError> {
    let err = || {
        bad(format!(
            "--nnodes '{}' is invalid; use N or MIN:MAX with 0 < MIN <= MAX",
            excerpt(s)
        ))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let (min, max) = match parts.as_slice() {
        [n] => {
            let n: u32 = n.trim().parse().map_err(|_| err())?;
            (n, n)
        }
        [a, b] => (
            a.trim().parse().map_err(|_| err())?,
            b.trim().parse().map_err(|_| err())?,
        ),
        _ => return Err(err()),
    };
    if min == 0 || min > max {
        return Err(err());
    }
    Ok((min, max))
}

/// Longest `--rdzv-id` accepted (the rendezvous server's limit on ids).
pub const MAX_RDZV_ID: usize = 256;

/// Longest `--log-line-prefix-template` accepted.
pub const MAX_PREFIX_TEMPLATE: usize = 1024;

/// Waits between restarts in a crash loop (`--restart-backoff BASE[:MAX]`,
/// `--restart-backoff-window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartBackoff {
    /// The first wait; zero turns waiting off.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
    /// A failure this soon after its round started is part of a loop.
    pub window: Duration,
}

impl RestartBackoff {
    /// `--restart-backoff`'s `BASE[:MAX]` (durations; `MAX` defaults to
    /// 30 s; a zero `BASE` turns waiting off).
    pub fn parse_wait(s: &str) -> Result<(Duration, Duration), String> {
        let parse = |part: &str, what: &str| {
            accel_input::parse_duration(part.trim()).map_err(|e| format!("{what}: {e}"))
        };
        let (base, max) = match s.split_once(':') {
            Some((b, m)) => (parse(b, "BASE")?, parse(m, "MAX")?),
            None => (parse(s, "BASE")?, Duration::from_secs(30)),
        };
        if !base.is_zero() && max < base {
            return Err(format!(
                "MAX ({max:?}) is shorter than BASE ({base:?}); write BASE:MAX, e.g. 1:30"
            ));
        }
        Ok((base, max))
    }
}

impl Default for RestartBackoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(30),
            window: Duration::from_secs(60),
        }
    }
}

impl RestartBackoff {
    /// The wait before the restart after the `crashes`-th quick failure in
    /// a row: none for the first, then `base`, doubling, at most `max`.
    pub fn wait(&self, crashes: u32) -> Duration {
        if crashes < 2 || self.base.is_zero() {
            return Duration::ZERO;
        }
        let doublings = (crashes - 2).min(32);
        self.base
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }
}

/// Most modules `--preload` may name.
pub const MAX_PRELOAD: usize = 64;

/// Most workers one agent starts: far above any machine's accelerators or
/// cores, low enough that a typo (`--nproc-per-node 4000000000`) is an error
/// instead of an attempt to describe and spawn billions of workers.
pub const MAX_NPROC_PER_NODE: u32 = 65_536;

/// `HOST[:PORT]`, `[V6]:PORT` or a bare IPv6 address.
pub fn parse_endpoint(
    s: &str,
    default_port: Option<u16>,
) -> Result<(String, Option<u16>), ConfigError> {
    let err = || {
        bad(format!(
            "--rdzv-endpoint '{}' is invalid; use HOST[:PORT], with IPv6 as [::1]:29400",
            excerpt(s)
        ))
    };
    let port = |p: &str| p.parse::<u16>().map(Some).map_err(|_| err());
    let (host, p) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(err)?;
        match tail {
            "" => (h.to_owned(), None),
            t => (h.to_owned(), port(t.strip_prefix(':').ok_or_else(err)?)?),
        }
    } else if s.matches(':').count() > 1 {
        (s.to_owned(), None)
    } else if let Some((h, p)) = s.split_once(':') {
        (h.to_owned(), port(p)?)
    } else {
        (s.to_owned(), None)
    };
    if host.is_empty() {
        return Err(err());
    }
    Ok((host, p.or(default_port)))
}

fn parse_signals(s: &str) -> Result<Vec<Signal>, ConfigError> {
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let full = if name.starts_with("SIG") {
                name.to_owned()
            } else {
                format!("SIG{name}")
            };
            full.parse::<Signal>()
                .ok()
                .filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGCHLD))
                .ok_or_else(|| {
                    bad(format!(
                        "--signals-to-handle: '{}' is not a signal the agent can handle",
                        excerpt(name)
                    ))
                })
        })
        .collect()
}

/// A random version-4 UUID (standalone run ids, as torchrun's `uuid4()`).
pub fn random_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
