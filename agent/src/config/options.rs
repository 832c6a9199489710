//! [`LaunchOptions`]: what a launcher asks of the agent, typed, and the one
//! way to a validated [`Config`] ([`LaunchOptions::build`]).
//!
//! Three front ends start the agent: `accel-agent`'s flags
//! ([`AgentArgs`](crate::cli::AgentArgs), converted with `From`),
//! `accel launch` (accelerate's flags and configuration file) and
//! `worker-runtime`'s function launcher. Each fills a `LaunchOptions` from
//! its own inputs and calls `build`; none renders a command line to be
//! parsed again, and nobody edits a `Config` once it is validated. Values
//! are typed when they are read (a flag's text is parsed by its
//! `value_parser`); `build` checks how they combine (backend and node
//! count, node rank, entry point) and reads the environment only through
//! the lookup it is given, so a launcher controls what the agent sees.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use accel_input::excerpt;
use accel_input::parse_duration;
use nix::sys::signal::Signal;

use super::{
    bad, parse_endpoint, parse_nnodes, random_id, Config, ConfigError, Entrypoint, RdzvConf,
    Rendezvous, C10D_PORT, ETCD_PORT, MAX_NPROC_PER_NODE, MAX_PREFIX_TEMPLATE, MAX_PRELOAD,
    MAX_RDZV_ID, STATIC_PORT,
};
use crate::events::EventHandler;
use crate::logs::filter::LineFilter;
use crate::logs::{parse_ranks, LogSpec, StdSpec};

/// `--nnodes`: `N` or `MIN:MAX`, with `0 < MIN <= MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    /// Fewest nodes a round runs with.
    pub min: u32,
    /// Most nodes a round runs with.
    pub max: u32,
}

impl NodeCount {
    /// Exactly `n` nodes.
    pub fn fixed(n: u32) -> Self {
        Self { min: n, max: n }
    }
}

impl FromStr for NodeCount {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        parse_nnodes(s).map(|(min, max)| Self { min, max })
    }
}

impl std::fmt::Display for NodeCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.max)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

/// `--nproc-per-node`: a count, or a rule resolved on this node when the
/// configuration is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nproc {
    /// This many workers.
    Count(u32),
    /// One per usable CPU.
    Cpu,
    /// One per CUDA device (an error without any).
    Gpu,
    /// One per CUDA device, else one per CPU.
    Auto,
}

impl FromStr for Nproc {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "gpu" => Ok(Self::Gpu),
            "auto" => Ok(Self::Auto),
            n => match n.parse::<u32>() {
                Ok(n) => Self::count(n, s).map(Self::Count),
                Err(_) => Err(invalid_nproc(s)),
            },
        }
    }
}

fn invalid_nproc(s: &str) -> ConfigError {
    bad(format!(
        "--nproc-per-node '{}' is invalid; use a positive number, cpu, gpu or auto",
        excerpt(s)
    ))
}

impl Nproc {
    /// `n` (written `as_written`) if it is a worker count the agent
    /// accepts: 1 to [`MAX_NPROC_PER_NODE`].
    fn count(n: u32, as_written: &str) -> Result<u32, ConfigError> {
        match n {
            0 => Err(invalid_nproc(as_written)),
            n if n > MAX_NPROC_PER_NODE => Err(bad(format!(
                "--nproc-per-node {n} is too many; at most {MAX_NPROC_PER_NODE} workers per node"
            ))),
            n => Ok(n),
        }
    }

    /// The number of workers on this node; `env` supplies
    /// `CUDA_VISIBLE_DEVICES`.
    pub fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<u32, ConfigError> {
        let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        match self {
            // Options may be built without parsing text: the same bounds.
            Self::Count(n) => Self::count(n, &n.to_string()),
            Self::Cpu => Ok(cpus()),
            Self::Gpu => match crate::probe::cuda_devices(env) {
                0 => Err(bad(
                    "--nproc-per-node gpu: no CUDA device found on this node; give a number or use cpu",
                )),
                n => Ok(n),
            },
            Self::Auto => Ok(match crate::probe::cuda_devices(env) {
                0 => cpus(),
                n => n,
            }),
        }
    }
}

/// `--rdzv-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Fixed node ranks; node rank 0 hosts the rendezvous.
    Static,
    /// An `rdzv-server` (or this agent, with `is_host`).
    C10d,
    /// No server: the agents elect one of themselves through etcd to host
    /// the rendezvous (etcd's v3 API).
    Etcd,
    /// torchrun's `etcd-v2` spelling of the same (accel speaks etcd's v3 API,
    /// the one etcd 3.6 still has).
    EtcdV2,
}

impl FromStr for Backend {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "static" => Ok(Self::Static),
            "c10d" => Ok(Self::C10d),
            "etcd" => Ok(Self::Etcd),
            "etcd-v2" => Ok(Self::EtcdV2),
            other => Err(bad(format!(
                "--rdzv-backend '{}' is unknown; use static, c10d or etcd",
                excerpt(other)
            ))),
        }
    }
}

impl Backend {
    /// The name as torchrun spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::C10d => "c10d",
            Self::Etcd => "etcd",
            Self::EtcdV2 => "etcd-v2",
        }
    }
}

/// `--signals-to-handle`: the signals, and the text workers are given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signals {
    /// Signals forwarded to the workers.
    pub list: Vec<Signal>,
    /// As written (exported to workers as torchrun does).
    pub text: String,
}

impl FromStr for Signals {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            list: super::parse_signals(s)?,
            text: s.to_owned(),
        })
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self {
            list: vec![
                Signal::SIGTERM,
                Signal::SIGINT,
                Signal::SIGHUP,
                Signal::SIGQUIT,
            ],
            text: "SIGTERM,SIGINT,SIGHUP,SIGQUIT".into(),
        }
    }
}

/// `--local-ranks-filter` / `--ranks-filter`: `None` shows every rank.
pub type RankFilter = Option<BTreeSet<u32>>;

/// A rank filter from its flag's text.
pub fn rank_filter(
    flag: &'static str,
) -> impl Fn(&str) -> Result<RankFilter, ConfigError> + Clone + Send + Sync + 'static {
    move |s| parse_ranks(flag, s)
}

/// A `--redirects`/`--tee` value from its flag's text.
pub fn std_spec(
    flag: &'static str,
) -> impl Fn(&str) -> Result<StdSpec, ConfigError> + Clone + Send + Sync + 'static {
    move |s| StdSpec::parse(flag, s)
}

/// Most bytes of `--node-identity`: the rendezvous takes host names of up
/// to 256 bytes, and node ids (the identity, the process id and a random
/// suffix) too.
pub(super) const MAX_NODE_IDENTITY_BYTES: usize = 200;

/// Everything a launcher asks of the agent. [`LaunchOptions::new`] gives
/// `accel-agent`'s defaults; set what differs, then [`build`](Self::build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// `--nnodes`.
    pub nnodes: NodeCount,
    /// `--nproc-per-node`.
    pub nproc_per_node: Nproc,
    /// `--rdzv-backend`.
    pub rdzv_backend: Backend,
    /// `--rdzv-endpoint` (`HOST[:PORT]`; empty: none given).
    pub rdzv_endpoint: String,
    /// `--rdzv-id`.
    pub rdzv_id: String,
    /// `--rdzv-conf`.
    pub rdzv_conf: RdzvConf,
    /// `--standalone`.
    pub standalone: bool,
    /// `--max-restarts`.
    pub max_restarts: u32,
    /// `--monitor-interval`.
    pub monitor_interval: Duration,
    /// `--role`.
    pub role: String,
    /// `-m`/`--module`.
    pub module: bool,
    /// `--no-python`.
    pub no_python: bool,
    /// `--run-path`.
    pub run_path: bool,
    /// `--log-dir`.
    pub log_dir: Option<PathBuf>,
    /// `--redirects`.
    pub redirects: StdSpec,
    /// `--tee`.
    pub tee: StdSpec,
    /// `--log-line-prefix-template` (else the environment's
    /// `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`).
    pub log_line_prefix_template: Option<String>,
    /// `--local-ranks-filter`.
    pub local_ranks_filter: RankFilter,
    /// `--ranks-filter`.
    pub ranks_filter: RankFilter,
    /// `--duplicate-stdout-filters` (`None`: not given).
    pub duplicate_stdout_filters: Option<LineFilter>,
    /// `--duplicate-stderr-filters` (`None`: not given).
    pub duplicate_stderr_filters: Option<LineFilter>,
    /// `--event-log-handler`.
    pub event_log_handler: EventHandler,
    /// `--node-rank`.
    pub node_rank: u32,
    /// `--master-addr`.
    pub master_addr: String,
    /// `--master-port`.
    pub master_port: Option<u16>,
    /// `--local-addr`.
    pub local_addr: Option<String>,
    /// `--node-identity`.
    pub node_identity: Option<String>,
    /// `--topology`: this node's topology path.
    pub topology: Option<String>,
    /// `--topology-file`: a file holding it.
    pub topology_file: Option<PathBuf>,
    /// `--signals-to-handle`.
    pub signals_to_handle: Signals,
    /// `--shutdown-timeout` (else `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, else 30 s).
    pub shutdown_timeout: Option<Duration>,
    /// `--exit-barrier-timeout`.
    pub exit_barrier_timeout: Duration,
    /// `--virtual-local-rank`.
    pub virtual_local_rank: bool,
    /// The script, program (`no_python`) or module (`module`).
    pub training_script: String,
    /// Its arguments.
    pub training_script_args: Vec<String>,
    /// Not a flag: variables every worker gets under torchrun's (later
    /// entries win); `accel launch` puts accelerate's here.
    pub base_env: Vec<(String, String)>,
    /// Not a flag: whether workers get torchrun's variables; off only for
    /// accelerate's single plain process.
    pub torchrun_env: bool,
    /// Not a flag: the launcher's own warnings, printed with the agent's.
    pub warnings: Vec<String>,
    /// Where to serve the agent's metrics, `/healthz` and `/readyz`.
    pub metrics_bind: accel_telemetry::Bind,
    /// `--fork-server-fd`.
    pub fork_server_fd: Option<i32>,
    /// `--preload`: modules the zygote imports.
    pub preload: Vec<String>,
    /// `--restart-backoff`, `--restart-backoff-window`.
    pub restart_backoff: crate::config::RestartBackoff,
    /// `--health-check*`.
    pub health_check: crate::health::HealthFlags,
    /// `--gpu-free-timeout`.
    pub gpu_free_timeout: Duration,
    /// `--no-restart-exit-code`.
    pub no_restart_exit_code: Option<u8>,
    /// `--max-no-progress-restarts` (0: never).
    pub max_no_progress_restarts: u32,
    /// `--nnodes-multiple-of` (1: any node count).
    pub nnodes_multiple_of: u32,
    /// `--scale-up-settle` (zero: at once).
    pub scale_up_settle: Duration,
    /// `--checkpoint-iteration-file`.
    pub checkpoint_iteration_file: Option<PathBuf>,
    /// `--learned-hang-timeouts` and its settings (`None`: off).
    pub hang: Option<crate::hang::Settings>,
    /// `--numa-binding`: how workers are bound to the CPUs near their GPUs.
    pub numa_binding: Option<crate::numa::AffinityMode>,
}

impl LaunchOptions {
    /// `accel-agent SCRIPT` with every flag at its default.
    pub fn new(training_script: impl Into<String>) -> Self {
        Self {
            nnodes: NodeCount::fixed(1),
            nproc_per_node: Nproc::Count(1),
            rdzv_backend: Backend::Static,
            rdzv_endpoint: String::new(),
            rdzv_id: "none".into(),
            rdzv_conf: RdzvConf::default(),
            standalone: false,
            max_restarts: 0,
            monitor_interval: Duration::from_millis(100),
            role: "default".into(),
            module: false,
            no_python: false,
            run_path: false,
            log_dir: None,
            redirects: StdSpec::default(),
            tee: StdSpec::default(),
            log_line_prefix_template: None,
            local_ranks_filter: None,
            ranks_filter: None,
            duplicate_stdout_filters: None,
            duplicate_stderr_filters: None,
            event_log_handler: EventHandler::Null,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            local_addr: None,
            node_identity: None,
            topology: None,
            topology_file: None,
            signals_to_handle: Signals::default(),
            shutdown_timeout: None,
            exit_barrier_timeout: Duration::from_secs(300),
            virtual_local_rank: false,
            training_script: training_script.into(),
            training_script_args: Vec::new(),
            base_env: Vec::new(),
            torchrun_env: true,
            warnings: Vec::new(),
            metrics_bind: accel_telemetry::Bind::Off,
            fork_server_fd: None,
            preload: Vec::new(),
            restart_backoff: crate::config::RestartBackoff::default(),
            health_check: crate::health::HealthFlags::default(),
            gpu_free_timeout: Duration::from_secs(30),
            no_restart_exit_code: None,
            max_no_progress_restarts: 0,
            nnodes_multiple_of: 1,
            scale_up_settle: Duration::ZERO,
            checkpoint_iteration_file: None,
            hang: None,
            numa_binding: None,
        }
    }

    /// Validates the options into a configuration; `env` looks up the
    /// agent's environment (and nothing else is read from it).
    pub fn build(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        let NodeCount {
            min: min_nodes,
            max: max_nodes,
        } = self.nnodes;
        let nproc_per_node = self.nproc_per_node.resolve(env)?;
        let mut rdzv = self.rdzv_conf.clone();
        rdzv.tls = std::mem::take(&mut rdzv.tls).or_env(env);
        rdzv.tls
            .check("rendezvous")
            .map_err(|e| bad(format!("--rdzv-conf tls_*: {e}")))?;
        let token = accel_wire::auth::client_token(rdzv.token_file.as_deref(), env)
            .map_err(|e| bad(format!("--rdzv-conf token_file / ACCEL_RDZV_TOKEN: {e}")))?;
        let rendezvous = self.rendezvous(&mut warnings)?;
        let nnodes_multiple_of = self.nnodes_multiple_of.max(1);
        if nnodes_multiple_of > 1 {
            if matches!(rendezvous, Rendezvous::Static { .. }) {
                return Err(bad(
                    "--nnodes-multiple-of needs a dynamic rendezvous (c10d or etcd): with the static backend every node has a fixed rank, so none can wait as a spare",
                ));
            }
            let first = min_nodes.max(1).div_ceil(nnodes_multiple_of) * nnodes_multiple_of;
            if first > max_nodes {
                return Err(bad(format!(
                    "--nnodes {min_nodes}:{max_nodes} holds no multiple of --nnodes-multiple-of {nnodes_multiple_of}; \
                     give a range that does (e.g. --nnodes {first}:{first})"
                )));
            }
        }
        let health_check = self.health_check.resolve(env).map_err(bad)?;
        if self.node_rank != 0 && !matches!(rendezvous, Rendezvous::Static { .. }) {
            warnings.push("--node-rank is used only by the static backend; ignoring it".into());
        }
        let run_id = match rendezvous {
            Rendezvous::Standalone => random_id(),
            _ => self.rdzv_id.clone(),
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
        let entrypoint = self.entrypoint(env)?;
        // Chosen once: the topology and the agent's own CPUs do not change
        // between rounds (torchrun chooses the same CPUs at each start).
        let numa_binding = match self.numa_binding {
            Some(mode) => Some(
                crate::numa::plan_for_agent(mode, nproc_per_node, env)
                    .map_err(|e| bad(e.to_string()))?,
            ),
            None => None,
        };
        // torchrun fails each worker past the mapping at its start; the
        // agent says so before anything runs.
        if self.virtual_local_rank {
            if let Some((var, devices)) = crate::worker_env::parent_devices(env) {
                if (devices.len() as u64) < u64::from(nproc_per_node) {
                    return Err(bad(format!(
                        "--virtual-local-rank: --nproc-per-node {nproc_per_node} needs a device per worker, but {var}='{}' lists {}; list more devices or start fewer workers",
                        excerpt(&devices.join(",")),
                        devices.len()
                    )));
                }
            }
        }
        let preload = self.preload()?;
        // A one-node job has no ranks to order: nvidia-smi is not asked.
        let nvidia_smi = || match max_nodes {
            1 => Err(super::topology::SmiError::NotRun),
            _ => super::topology::nvidia_smi_q(),
        };
        let topology = super::topology::resolve(
            self.topology.as_deref(),
            self.topology_file.as_deref(),
            env,
            &nvidia_smi,
            &mut warnings,
        )
        .map_err(bad)?;
        let node_identity = match self.node_identity.as_deref() {
            None | Some("") => None,
            Some(id) if id.len() > MAX_NODE_IDENTITY_BYTES || id.chars().any(char::is_control) => {
                return Err(bad(format!(
                    "--node-identity '{}' must be at most {MAX_NODE_IDENTITY_BYTES} bytes without control characters (the machine's name, e.g. Kubernetes' spec.nodeName)",
                    excerpt(id)
                )));
            }
            Some(id) => Some(id.to_owned()),
        };
        let shutdown_timeout = match self.shutdown_timeout {
            Some(d) => d,
            None => match env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Some(v) => parse_duration(&v)
                    .map_err(|e| bad(format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: {e}")))?,
                None => Duration::from_secs(30),
            },
        };
        if self.monitor_interval.is_zero() {
            return Err(bad("--monitor-interval must be greater than 0"));
        }
        if nproc_per_node > 1 && env("OMP_NUM_THREADS").is_none() {
            warnings.push(format!(
                "OMP_NUM_THREADS is not set: each of the {nproc_per_node} workers gets OMP_NUM_THREADS=1 so they do not \
                 oversubscribe the CPUs; set it yourself to tune"
            ));
        }
        let prefix_template = self
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
        if self.role.is_empty() {
            return Err(bad("--role must not be empty"));
        }
        warnings.extend(self.warnings.iter().cloned());
        warnings.extend(super::conflicts::conflicts(&rendezvous, &rdzv));
        let mut base_env = self.base_env.clone();
        // torchrun's switch and path for its FileTimer server.
        let file_timer =
            (env("TORCHELASTIC_ENABLE_FILE_TIMER").as_deref() == Some("1")).then(|| {
                env("TORCHELASTIC_TIMER_FILE")
                    .filter(|p| !p.is_empty())
                    .map_or_else(
                        || {
                            std::env::temp_dir()
                                .join(format!("watchdog_timer_{}", uuid::Uuid::new_v4()))
                        },
                        PathBuf::from,
                    )
            });
        if let Some(path) = &file_timer {
            base_env.push((
                "TORCHELASTIC_TIMER_FILE".into(),
                path.to_string_lossy().into_owned(),
            ));
        }
        let rdzv_backend_name = match (&rendezvous, self.rdzv_backend) {
            (Rendezvous::Standalone, _) | (_, Backend::C10d) => "c10d",
            (_, Backend::Static) => "static",
            (_, Backend::Etcd) => "etcd",
            (_, Backend::EtcdV2) => "etcd-v2",
        };
        Ok(Config {
            rendezvous,
            run_id,
            min_nodes,
            max_nodes,
            nproc_per_node,
            max_restarts: self.max_restarts,
            monitor_interval: self.monitor_interval,
            shutdown_timeout,
            exit_barrier_timeout: self.exit_barrier_timeout,
            token,
            rdzv,
            role: self.role.clone(),
            entrypoint,
            log_dir: self.log_dir.clone(),
            local_addr: self.local_addr.clone().filter(|a| !a.is_empty()),
            node_identity,
            topology,
            signals: self.signals_to_handle.list.clone(),
            signals_text: self.signals_to_handle.text.clone(),
            virtual_local_rank: self.virtual_local_rank,
            parent_error_file: env("TORCHELASTIC_ERROR_FILE")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            logs: LogSpec {
                redirects: self.redirects.clone(),
                tee: self.tee.clone(),
                prefix_template,
                local_ranks: self.local_ranks_filter.clone(),
                ranks: self.ranks_filter.clone(),
                stdout_filter: self.duplicate_stdout_filters.clone(),
                stderr_filter: self.duplicate_stderr_filters.clone(),
            },
            event_log_handler: self.event_log_handler,
            rdzv_backend_name,
            warnings,
            base_env,
            torchrun_env: self.torchrun_env,
            metrics_bind: self.metrics_bind,
            fork_server_fd: self.fork_server_fd,
            preload,
            restart_backoff: self.restart_backoff,
            file_timer,
            health_check,
            gpu_free_timeout: self.gpu_free_timeout,
            no_restart_exit_code: self.no_restart_exit_code.map(i32::from),
            max_no_progress_restarts: self.max_no_progress_restarts,
            nnodes_multiple_of,
            scale_up_settle: self.scale_up_settle,
            checkpoint_iteration_file: self.checkpoint_iteration_file.clone(),
            hang: self.hang,
            numa_binding,
        })
    }

    /// `--preload`'s modules, checked: dotted Python names, with a Python
    /// entrypoint of the agent's own.
    fn preload(&self) -> Result<Vec<String>, ConfigError> {
        let modules: Vec<String> = self
            .preload
            .iter()
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .collect();
        if modules.is_empty() {
            return Ok(modules);
        }
        if self.no_python {
            return Err(bad(
                "--preload forks workers from a Python interpreter; it cannot be used with --no-python",
            ));
        }
        if self.fork_server_fd.is_some() {
            return Err(bad(
                "--preload and --fork-server-fd both choose what workers are forked from; use one",
            ));
        }
        if modules.len() > MAX_PRELOAD {
            return Err(bad(format!(
                "--preload names {} modules; at most {MAX_PRELOAD}",
                modules.len()
            )));
        }
        let identifier = |s: &str| {
            let mut chars = s.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        if let Some(m) = modules
            .iter()
            .find(|m| m.len() > 200 || !m.split('.').all(identifier))
        {
            return Err(bad(format!(
                "--preload '{}' is not a module name (e.g. torch, torch.distributed; comma-separated)",
                excerpt(m)
            )));
        }
        Ok(modules)
    }

    /// How the rendezvous is reached, by torchrun's rules: one node with no
    /// endpoint is standalone, static keeps a fixed node count.
    fn rendezvous(&self, warnings: &mut Vec<String>) -> Result<Rendezvous, ConfigError> {
        let NodeCount { min, max } = self.nnodes;
        let implicit_standalone = self.rdzv_backend == Backend::Static
            && self.rdzv_endpoint.is_empty()
            && self.master_port.is_none()
            && max == 1;
        if self.rdzv_conf.etcd.given
            && !matches!(self.rdzv_backend, Backend::Etcd | Backend::EtcdV2)
        {
            return Err(bad(format!(
                "--rdzv-conf protocol, cacert, cert, key, etcd_prefix and etcd_lease are for --rdzv-backend etcd, not {}",
                self.rdzv_backend.name()
            )));
        }
        if self.standalone || implicit_standalone {
            if max != 1 {
                return Err(bad(format!(
                    "--standalone runs one node, but --nnodes is {}; drop --standalone and give --rdzv-backend c10d --rdzv-endpoint HOST:PORT",
                    self.nnodes
                )));
            }
            return Ok(Rendezvous::Standalone);
        }
        match self.rdzv_backend {
            Backend::Static => {
                let (host, port) = if self.rdzv_endpoint.is_empty() {
                    (
                        self.master_addr.clone(),
                        self.master_port.unwrap_or(STATIC_PORT),
                    )
                } else {
                    let (h, p) = parse_endpoint(&self.rdzv_endpoint, None)?;
                    (h, p.unwrap_or(STATIC_PORT))
                };
                if min != max {
                    return Err(bad(format!(
                        "--nnodes {}: static rendezvous needs a fixed node count; use --rdzv-backend c10d for MIN:MAX",
                        self.nnodes
                    )));
                }
                if self.node_rank >= max {
                    return Err(bad(format!(
                        "--node-rank {} is out of range for --nnodes {}; use 0 to {}",
                        self.node_rank,
                        max,
                        max - 1
                    )));
                }
                Ok(Rendezvous::Static {
                    host,
                    port,
                    node_rank: self.node_rank,
                })
            }
            Backend::C10d => {
                let endpoint = if self.rdzv_endpoint.is_empty() {
                    "localhost"
                } else {
                    &self.rdzv_endpoint
                };
                let mut endpoints = Vec::new();
                for one in endpoint.split(',').map(str::trim) {
                    let (host, port) = parse_endpoint(one, Some(C10D_PORT))?;
                    endpoints.push((host, port.unwrap_or(C10D_PORT)));
                }
                let (host, port) = endpoints.remove(0);
                if !endpoints.is_empty() && self.rdzv_conf.is_host == Some(true) {
                    return Err(bad(
                        "--rdzv-conf is_host=true needs one --rdzv-endpoint: several endpoints are rdzv-server replicas, which no agent hosts",
                    ));
                }
                if self.rdzv_id == "none" {
                    warnings.push(
                        "no --rdzv-id given: the job id is 'none', and every job on this endpoint without one joins the same job".into(),
                    );
                }
                Ok(Rendezvous::C10d {
                    host,
                    port,
                    replicas: endpoints,
                })
            }
            Backend::Etcd | Backend::EtcdV2 => {
                if self.rdzv_endpoint.is_empty() {
                    return Err(bad(format!(
                        "--rdzv-backend {} needs the etcd cluster: give --rdzv-endpoint HOST:PORT[,HOST:PORT...] (etcd's client port, 2379)",
                        self.rdzv_backend.name()
                    )));
                }
                if self.rdzv_conf.is_host.is_some() {
                    return Err(bad(
                        "--rdzv-conf is_host is for c10d: with etcd, the agents elect the one that hosts the rendezvous",
                    ));
                }
                let scheme = self.rdzv_conf.etcd.scheme();
                let mut endpoints = Vec::new();
                for one in self.rdzv_endpoint.split(',').map(str::trim) {
                    let one = match one.split_once("://") {
                        Some((given, rest)) if given == scheme => rest,
                        Some((given, _)) => {
                            return Err(bad(format!(
                                "--rdzv-endpoint '{}' says {given}:// but --rdzv-conf protocol is {scheme}; write HOST:PORT and set protocol=http or protocol=https",
                                excerpt(one)
                            )))
                        }
                        None => one,
                    };
                    let (host, port) = parse_endpoint(one, Some(ETCD_PORT))?;
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        host
                    };
                    endpoints.push(format!("{scheme}://{host}:{}", port.unwrap_or(ETCD_PORT)));
                }
                if self.rdzv_id == "none" {
                    warnings.push(
                        "no --rdzv-id given: the job id is 'none', and every job on this etcd without one joins the same job".into(),
                    );
                }
                Ok(Rendezvous::Etcd { endpoints })
            }
        }
    }

    /// What each worker runs: the program itself (`--no-python`), or
    /// `python -u [-m] SCRIPT` with `PYTHON_EXEC` as the interpreter.
    fn entrypoint(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Entrypoint, ConfigError> {
        if self.no_python && self.module {
            return Err(bad("--no-python and -m/--module cannot be used together"));
        }
        if self.no_python && !self.run_path {
            return Ok(Entrypoint {
                program: self.training_script.clone(),
                leading_args: Vec::new(),
                script_args: self.training_script_args.clone(),
            });
        }
        let mut leading_args = vec!["-u".to_owned()];
        if self.module {
            leading_args.push("-m".into());
        }
        leading_args.push(self.training_script.clone());
        Ok(Entrypoint {
            program: env("PYTHON_EXEC")
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".into()),
            leading_args,
            script_args: self.training_script_args.clone(),
        })
    }
}
