//! The agent's validated configuration, derived from [`AgentArgs`] and the
//! environment by the same rules as torchrun's `run()` (reference: torchrun
//! §1 "Derivation rules"), with the deviations the README lists.
//!
//! The environment is read through an injected lookup, so tests never touch
//! the process environment.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use rendezvous_server::config::parse_duration;
use rendezvous_server::input::excerpt;

use crate::cli::AgentArgs;

mod rdzv_conf;
pub use rdzv_conf::{parse_bool, parse_bytes, PortRange, RdzvConf};

/// A configuration the agent cannot run with; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn bad(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Default port of a c10d rendezvous endpoint (torchrun's).
pub const C10D_PORT: u16 = 29400;
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
    pub token: Option<rendezvous_server::Token>,
    /// `ROLE_NAME`.
    pub role: String,
    /// What the workers run.
    pub entrypoint: Entrypoint,
    /// Base directory of per-attempt worker files.
    pub log_dir: Option<PathBuf>,
    /// This node's address for other nodes.
    pub local_addr: Option<String>,
    /// Signals forwarded to workers on shutdown.
    pub signals: Vec<Signal>,
    /// The `--signals-to-handle` text, exported to workers.
    pub signals_text: String,
    /// `--virtual-local-rank`.
    pub virtual_local_rank: bool,
    /// Where worker output goes.
    pub logs: crate::logs::LogSpec,
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
}

impl Config {
    /// The TLS files of the link to the rendezvous: none for a standalone
    /// job (its rendezvous is on loopback inside this agent).
    pub fn link_tls(&self) -> rendezvous_server::tls::ClientTlsFiles {
        match self.rendezvous {
            Rendezvous::Standalone => Default::default(),
            _ => self.rdzv.tls.clone(),
        }
    }

    /// Validates `args`; `env` looks up the agent's environment.
    pub fn from_args(
        args: &AgentArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut warnings = Vec::new();
        let (min_nodes, max_nodes) = parse_nnodes(&args.nnodes)?;
        let nproc_per_node = parse_nproc(&args.nproc_per_node)?;
        let mut rdzv = RdzvConf::parse(&args.rdzv_conf)?;
        rdzv.tls = std::mem::take(&mut rdzv.tls).or_env(env);
        rdzv.tls
            .check("rendezvous")
            .map_err(|e| bad(format!("--rdzv-conf tls_*: {e}")))?;
        let token = rendezvous_server::config::client_token(rdzv.token_file.as_deref(), env)
            .map_err(|e| bad(format!("--rdzv-conf token_file / ACCEL_RDZV_TOKEN: {e}")))?;
        let backend = args.rdzv_backend.as_str();
        let implicit_standalone = backend == "static"
            && args.rdzv_endpoint.is_empty()
            && args.master_port.is_none()
            && max_nodes == 1;
        let rendezvous = if args.standalone || implicit_standalone {
            if max_nodes != 1 {
                return Err(bad(format!(
                    "--standalone runs one node, but --nnodes is {}; drop --standalone and give --rdzv-backend c10d --rdzv-endpoint HOST:PORT",
                    excerpt(&args.nnodes)
                )));
            }
            Rendezvous::Standalone
        } else {
            match backend {
                "static" => {
                    let (host, port) = if args.rdzv_endpoint.is_empty() {
                        (args.master_addr.clone(), args.master_port.unwrap_or(STATIC_PORT))
                    } else {
                        let (h, p) = parse_endpoint(&args.rdzv_endpoint, None)?;
                        (h, p.unwrap_or(STATIC_PORT))
                    };
                    if min_nodes != max_nodes {
                        return Err(bad(format!(
                            "--nnodes {}: static rendezvous needs a fixed node count; use --rdzv-backend c10d for MIN:MAX",
                            excerpt(&args.nnodes)
                        )));
                    }
                    if args.node_rank >= max_nodes {
                        return Err(bad(format!(
                            "--node-rank {} is out of range for --nnodes {}; use 0 to {}",
                            args.node_rank,
                            max_nodes,
                            max_nodes - 1
                        )));
                    }
                    Rendezvous::Static { host, port, node_rank: args.node_rank }
                }
                "c10d" => {
                    let endpoint = if args.rdzv_endpoint.is_empty() { "localhost" } else { &args.rdzv_endpoint };
                    let (host, port) = parse_endpoint(endpoint, Some(C10D_PORT))?;
                    if args.rdzv_id == "none" {
                        warnings.push(
                            "no --rdzv-id given: the job id is 'none', and every job on this endpoint without one joins the same job".into(),
                        );
                    }
                    Rendezvous::C10d { host, port: port.unwrap_or(C10D_PORT) }
                }
                "etcd" | "etcd-v2" => {
                    return Err(bad(format!(
                        "--rdzv-backend {backend} is not available in this version; use c10d with rdzv-server, or static"
                    )))
                }
                other => {
                    return Err(bad(format!(
                        "--rdzv-backend '{}' is unknown; use static or c10d",
                        excerpt(other)
                    )))
                }
            }
        };
        if args.node_rank != 0 && !matches!(rendezvous, Rendezvous::Static { .. }) {
            warnings.push("--node-rank is used only by the static backend; ignoring it".into());
        }
        let run_id = match rendezvous {
            Rendezvous::Standalone => random_id(),
            _ => args.rdzv_id.clone(),
        };
        if run_id.is_empty() {
            return Err(bad("--rdzv-id must not be empty"));
        }
        if run_id.len() > MAX_RDZV_ID {
            // The rendezvous refuses longer ids, and it names a directory.
            return Err(bad(format!(
                "--rdzv-id '{}' is too long; at most {MAX_RDZV_ID} bytes",
                excerpt(&run_id)
            )));
        }
        if args.no_python && args.module {
            return Err(bad("--no-python and -m/--module cannot be used together"));
        }
        let entrypoint = if args.no_python && !args.run_path {
            Entrypoint {
                program: args.training_script.clone(),
                leading_args: Vec::new(),
                script_args: args.training_script_args.clone(),
            }
        } else {
            let mut leading_args = vec!["-u".to_owned()];
            if args.module {
                leading_args.push("-m".into());
            }
            leading_args.push(args.training_script.clone());
            Entrypoint {
                program: env("PYTHON_EXEC")
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "python3".into()),
                leading_args,
                script_args: args.training_script_args.clone(),
            }
        };
        let shutdown_timeout = match args.shutdown_timeout {
            Some(d) => d,
            None => match env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Some(v) => parse_duration(&v)
                    .map_err(|e| bad(format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: {e}")))?,
                None => Duration::from_secs(30),
            },
        };
        if args.monitor_interval.is_zero() {
            return Err(bad("--monitor-interval must be greater than 0"));
        }
        if nproc_per_node > 1 && env("OMP_NUM_THREADS").is_none() {
            warnings.push(format!(
                "OMP_NUM_THREADS is not set: each of the {nproc_per_node} workers gets OMP_NUM_THREADS=1 so they do not \
                 oversubscribe the CPUs; set it yourself to tune"
            ));
        }
        let signals = parse_signals(&args.signals_to_handle)?;
        let prefix_template = args
            .log_line_prefix_template
            .clone()
            .or_else(|| env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
            .filter(|t| !t.is_empty());
        if let Some(t) = prefix_template
            .as_ref()
            .filter(|t| t.len() > MAX_PREFIX_TEMPLATE)
        {
            // Every console line carries the prefix, and the console queues
            // 16,384 lines: a 100 KiB prefix would hold gigabytes.
            return Err(bad(format!(
                "--log-line-prefix-template is {} bytes; at most {MAX_PREFIX_TEMPLATE}",
                t.len()
            )));
        }
        if args.role.is_empty() {
            return Err(bad("--role must not be empty"));
        }
        Ok(Self {
            rendezvous,
            run_id,
            min_nodes,
            max_nodes,
            nproc_per_node,
            max_restarts: args.max_restarts,
            monitor_interval: args.monitor_interval,
            shutdown_timeout,
            exit_barrier_timeout: args.exit_barrier_timeout,
            token,
            rdzv,
            role: args.role.clone(),
            entrypoint,
            log_dir: args.log_dir.clone(),
            local_addr: args.local_addr.clone().filter(|a| !a.is_empty()),
            signals,
            signals_text: args.signals_to_handle.clone(),
            virtual_local_rank: args.virtual_local_rank,
            parent_error_file: env("TORCHELASTIC_ERROR_FILE")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            logs: crate::logs::LogSpec {
                redirects: crate::logs::StdSpec::parse("--redirects", &args.redirects)?,
                tee: crate::logs::StdSpec::parse("--tee", &args.tee)?,
                prefix_template,
                local_ranks: crate::logs::parse_ranks(
                    "--local-ranks-filter",
                    &args.local_ranks_filter,
                )?,
                ranks: crate::logs::parse_ranks("--ranks-filter", &args.ranks_filter)?,
            },
            warnings,
            base_env: Vec::new(),
            torchrun_env: true,
        })
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

/// Most workers one agent starts: far above any machine's accelerators or
/// cores, low enough that a typo (`--nproc-per-node 4000000000`) is an error
/// instead of an attempt to describe and spawn billions of workers.
pub const MAX_NPROC_PER_NODE: u32 = 65_536;

/// A number (at most [`MAX_NPROC_PER_NODE`]), `cpu`, `gpu` or `auto`.
pub fn parse_nproc(s: &str) -> Result<u32, ConfigError> {
    let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    match s {
        "cpu" => Ok(cpus()),
        "gpu" => match cuda_device_count() {
            0 => Err(bad(
                "--nproc-per-node gpu: no CUDA device found on this node; give a number or use cpu",
            )),
            n => Ok(n),
        },
        "auto" => Ok(match cuda_device_count() {
            0 => cpus(),
            n => n,
        }),
        n => match n.parse::<u32>() {
            Ok(n) if n > MAX_NPROC_PER_NODE => Err(bad(format!(
                "--nproc-per-node {n} is too many; at most {MAX_NPROC_PER_NODE} workers per node"
            ))),
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(format!(
                "--nproc-per-node '{}' is invalid; use a positive number, cpu, gpu or auto",
                excerpt(s)
            ))),
        },
    }
}

/// CUDA devices the NVIDIA driver exposes, honouring `CUDA_VISIBLE_DEVICES`
/// when it lists devices (without loading any CUDA library).
/// CUDA devices visible to this process (see `cuda_device_count`).
pub fn cuda_devices() -> u32 {
    cuda_device_count()
}

fn cuda_device_count() -> u32 {
    let present = std::fs::read_dir("/proc/driver/nvidia/gpus").map_or(0, |d| d.count() as u32);
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if present > 0 => {
            let listed = v.split(',').filter(|d| !d.trim().is_empty()).count() as u32;
            listed.min(present)
        }
        _ => present,
    }
}

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
    let (a, b) = (fastrand::u64(..), fastrand::u64(..));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        0x4000 | (a & 0x0fff),
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
