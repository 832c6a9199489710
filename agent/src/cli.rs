//! `accel-agent`'s command line: torchrun's flags, in both spellings
//! (`--nproc-per-node` and `--nproc_per_node`), each with torchrun's `PET_*`
//! environment fallback. An explicit flag always wins over the environment.
//!
//! Each value is typed as it is parsed (its `value_parser`), so a bad value
//! is a usage error naming the flag; the result converts into
//! [`LaunchOptions`], whose `build` checks how the values combine.

use std::path::PathBuf;
use std::time::Duration;

use accel_input::DurationParser;
use clap::builder::BoolishValueParser;
use clap::Parser;

use crate::config::{
    rank_filter, std_spec, Backend, LaunchOptions, NodeCount, Nproc, RankFilter, RdzvConf, Signals,
};
use crate::events::EventHandler;
use crate::logs::filter::LineFilter;
use crate::logs::StdSpec;

/// Launches and supervises a node's training processes (a drop-in for torchrun).
///
/// One node, no server:   accel-agent --nproc-per-node 4 train.py ARGS
/// N nodes (c10d):        accel-agent --nnodes N --nproc-per-node 8 --rdzv-backend c10d
///                            --rdzv-endpoint HEAD:29400 --rdzv-id JOB train.py ARGS
#[derive(Debug, Clone, Parser)]
#[command(
    name = "accel-agent",
    version,
    verbatim_doc_comment,
    after_help = "Shell completions: accel-agent completions bash|zsh|fish|elvish|powershell\nMan page:          accel-agent manpage"
)]
pub struct AgentArgs {
    /// Number of nodes: `N`, or `MIN:MAX` for an elastic job (c10d), which
    /// starts with MIN nodes and takes up to MAX.
    #[arg(
        long,
        env = "PET_NNODES",
        default_value = "1:1",
        allow_hyphen_values = true,
        value_parser = str::parse::<NodeCount>
    )]
    pub nnodes: NodeCount,
    /// Rounds run only with a multiple of K nodes (tensor or pipeline parallelism needs one): with --nnodes MIN:MAX the largest multiple of K of the ready nodes runs, the others wait as spares ready to take a lost node's place. Default 1: any count.
    #[arg(
        long = "nnodes-multiple-of",
        env = "PET_NNODES_MULTIPLE_OF",
        value_name = "K",
        default_value = "1",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub nnodes_multiple_of: u32,
    /// With --nnodes MIN:MAX: how long nodes enough for a larger round wait before a running round re-forms to take them (nodes that arrive one by one cost one restart, not one each). Default 0: at once, as torchrun. The first node's value is the job's.
    #[arg(
        long = "scale-up-settle",
        env = "PET_SCALE_UP_SETTLE",
        value_name = "SECONDS",
        default_value = "0",
        value_parser = DurationParser
    )]
    pub scale_up_settle: Duration,
    /// Workers per node: a number, `cpu` (usable CPUs), `gpu` (CUDA devices) or `auto` (GPUs, else CPUs).
    #[arg(
        long = "nproc-per-node",
        alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1",
        allow_hyphen_values = true,
        value_parser = str::parse::<Nproc>
    )]
    pub nproc_per_node: Nproc,
    /// Rendezvous backend: `static` (node rank 0 hosts it), `c10d` (join an rdzv-server), or
    /// `etcd` (also `etcd-v2`: the job's agents elect a host through the etcd members at the endpoint).
    #[arg(
        long = "rdzv-backend",
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        default_value = "static",
        value_parser = str::parse::<Backend>
    )]
    pub rdzv_backend: Backend,
    /// Rendezvous endpoint `HOST[:PORT]` (c10d default port 29400; IPv6 as `[::1]:29400`);
    /// with c10d, several comma-separated for rdzv-server replicas (the agent finds the leader).
    #[arg(
        long = "rdzv-endpoint",
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        default_value = ""
    )]
    pub rdzv_endpoint: String,
    /// Job id: agents with the same id on the same endpoint form one job.
    #[arg(
        long = "rdzv-id",
        alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none"
    )]
    pub rdzv_id: String,
    /// Rendezvous settings `key=value,...` (join_timeout, last_call_timeout, close_timeout,
    /// keep_alive_interval, keep_alive_max_attempt, read_timeout, is_host, timeout).
    #[arg(
        long = "rdzv-conf",
        alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        default_value = "",
        value_parser = RdzvConf::parse
    )]
    pub rdzv_conf: RdzvConf,
    /// Single-node job with an embedded rendezvous on a free port (no server needed).
    #[arg(long, env = "PET_STANDALONE", value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub standalone: bool,
    /// Job-wide number of restarts after worker failures (held by the rendezvous server).
    #[arg(
        long = "max-restarts",
        alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub max_restarts: u32,
    /// How often (seconds) the agent re-checks its workers as a backstop; worker exits are
    /// seen at once regardless.
    #[arg(long = "monitor-interval", alias = "monitor_interval", env = "PET_MONITOR_INTERVAL", default_value = "0.1",
          value_parser = DurationParser, allow_hyphen_values = true)]
    pub monitor_interval: Duration,
    /// Accepted for torchrun compatibility; only function entrypoints use it, and
    /// scripts are always started as new processes.
    #[arg(long = "start-method", alias = "start_method", env = "PET_START_METHOD", default_value = "spawn",
          value_parser = ["spawn", "fork", "forkserver"])]
    pub start_method: String,
    /// Worker role name (ROLE_NAME).
    #[arg(long, env = "PET_ROLE", default_value = "default")]
    pub role: String,
    /// Run the script as a Python module (`python -u -m SCRIPT`).
    #[arg(short = 'm', long, env = "PET_MODULE", value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub module: bool,
    /// Execute SCRIPT directly instead of through Python.
    #[arg(long = "no-python", alias = "no_python", env = "PET_NO_PYTHON", value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub no_python: bool,
    /// Run the script through Python's runpy (same as the default Python launch here).
    #[arg(long = "run-path", alias = "run_path", env = "PET_RUN_PATH", value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub run_path: bool,
    /// Base directory for per-attempt worker files (error files); default: a new temporary directory.
    /// Refused if it is a symbolic link, another user's, or world-writable (group-writable for a
    /// root agent) without the sticky bit.
    #[arg(long = "log-dir", alias = "log_dir", env = "PET_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// Send worker output to `<log-dir>/.../attempt_N/<local_rank>/std{out,err}.log`:
    /// 0 none, 1 stdout, 2 stderr, 3 both; or per local rank, like `0:3,1:1`.
    #[arg(short = 'r', long, env = "PET_REDIRECTS", default_value = "0", value_parser = std_spec("--redirects"))]
    pub redirects: StdSpec,
    /// Like --redirects, and also copy the lines, prefixed, to this agent's console.
    #[arg(short = 't', long, env = "PET_TEE", default_value = "0", value_parser = std_spec("--tee"))]
    pub tee: StdSpec,
    /// Console prefix of tee'd lines: `${role_name}`, `${rank}`, `${local_rank}`, `${hostname}`,
    /// `${node_rank}` (default `[${role_name}${local_rank}]:`; also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).
    #[arg(
        long = "log-line-prefix-template",
        alias = "log_line_prefix_template",
        env = "PET_LOG_LINE_PREFIX_TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,
    /// Only these local ranks' output reaches the console, like `0,3` (files keep everything).
    #[arg(
        long = "local-ranks-filter",
        alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        default_value = "",
        value_parser = ranks("--local-ranks-filter")
    )]
    pub local_ranks_filter: Ranks,
    /// Only these global ranks' output reaches the console, like `0,8` (files keep everything).
    #[arg(
        long = "ranks-filter",
        alias = "ranks_filter",
        env = "PET_RANKS_FILTER",
        default_value = "",
        value_parser = ranks("--ranks-filter")
    )]
    pub ranks_filter: Ranks,
    /// Also write the tee'd stdout lines that contain any of these
    /// comma-separated strings (`,,` for a comma) to
    /// `<log-dir>/.../attempt_N/filtered_stdout.log`, prefixed as on the console.
    #[arg(
        long = "duplicate-stdout-filters",
        alias = "duplicate_stdout_filters",
        env = "PET_DUPLICATE_STDOUT_FILTERS",
        value_name = "FILTERS",
        value_parser = line_filter
    )]
    pub duplicate_stdout_filters: Option<LineFilter>,
    /// Likewise for stderr, to `filtered_stderr.log`.
    #[arg(
        long = "duplicate-stderr-filters",
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS",
        value_name = "FILTERS",
        value_parser = line_filter
    )]
    pub duplicate_stderr_filters: Option<LineFilter>,
    /// torchelastic's status events: `null` (none), `console` (one JSON
    /// line each on stderr, as torchrun prints them) or `dynamic_rendezvous` (none).
    #[arg(
        long = "event-log-handler",
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER",
        default_value = "null",
        value_parser = str::parse::<EventHandler>
    )]
    pub event_log_handler: EventHandler,
    /// Accepted for torchrun compatibility: only torchrun's built-in `default`
    /// (what --log-dir, --redirects, --tee and --local-ranks-filter configure).
    #[arg(
        long = "logs-specs",
        alias = "logs_specs",
        value_name = "NAME",
        value_parser = crate::logs::logs_specs
    )]
    pub logs_specs: Option<String>,
    /// Static rendezvous: this node's rank.
    #[arg(
        long = "node-rank",
        alias = "node_rank",
        env = "PET_NODE_RANK",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub node_rank: u32,
    /// Static rendezvous: address of the node-rank-0 host.
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        env = "PET_MASTER_ADDR",
        default_value = "127.0.0.1"
    )]
    pub master_addr: String,
    /// Static rendezvous: port the node-rank-0 agent serves the rendezvous on (default 29500).
    #[arg(long = "master-port", alias = "master_port", env = "PET_MASTER_PORT")]
    pub master_port: Option<u16>,
    /// This node's address as other nodes reach it (default: the host name).
    #[arg(long = "local-addr", alias = "local_addr", env = "PET_LOCAL_ADDR")]
    pub local_addr: Option<String>,
    /// The name the rendezvous knows this machine by: its quarantine, status, topology and failure reports (default: the host name). Under Kubernetes give the node's (the downward API's spec.nodeName): a pod's host name is its pod name, which a replacement pod on another machine keeps.
    #[arg(long = "node-identity", env = "PET_NODE_IDENTITY", value_name = "NAME")]
    pub node_identity: Option<String>,
    /// Where this node sits in the machine, outermost first (e.g. zone-a/rack-3/nvl-0): nodes with the same path get contiguous node ranks (default: from --topology-file, else Slurm's SLURM_TOPOLOGY_ADDR, else the GPUs' NVLink domain in nvidia-smi -q as nvl-CLUSTER_UUID/CLIQUE_ID, else none).
    #[arg(long = "topology", env = "PET_TOPOLOGY", value_name = "PATH")]
    pub topology: Option<String>,
    /// A file holding this node's topology path (see --topology).
    #[arg(long = "topology-file", env = "PET_TOPOLOGY_FILE", value_name = "FILE")]
    pub topology_file: Option<PathBuf>,
    /// Signals forwarded to the workers before the agent exits.
    #[arg(
        long = "signals-to-handle",
        alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE",
        default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        value_parser = str::parse::<Signals>
    )]
    pub signals_to_handle: Signals,
    /// Seconds between forwarding a stop signal and SIGKILL (default 30, or TORCH_ELASTIC_SHUTDOWN_TIMEOUT).
    #[arg(long = "shutdown-timeout", alias = "shutdown_timeout", env = "PET_SHUTDOWN_TIMEOUT",
          value_parser = DurationParser, allow_hyphen_values = true)]
    pub shutdown_timeout: Option<Duration>,
    /// Seconds a node whose workers all succeeded waits for the other nodes before exiting.
    #[arg(long = "exit-barrier-timeout", alias = "exit_barrier_timeout", env = "PET_EXIT_BARRIER_TIMEOUT",
          default_value = "300", value_parser = DurationParser, allow_hyphen_values = true)]
    pub exit_barrier_timeout: Duration,
    /// Give every worker LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES.
    #[arg(
        long = "virtual-local-rank",
        alias = "virtual_local_rank",
        env = "PET_VIRTUAL_LOCAL_RANK"
    , value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub virtual_local_rank: bool,
    /// Bind each worker to CPUs near its GPU (local rank i: GPU i), chosen
    /// as torch chooses them; needs NVIDIA GPUs.
    #[arg(long = "numa-binding", alias = "numa_binding", value_name = "MODE")]
    pub numa_binding: Option<crate::numa::AffinityMode>,
    /// Serve Prometheus metrics (`/metrics`), `/healthz` and `/readyz` over
    /// plain HTTP on IP:PORT (e.g. `0.0.0.0:29402`); `off` (the default) for nowhere.
    #[arg(
        long = "metrics-bind",
        alias = "metrics_bind",
        env = "PET_METRICS_BIND",
        default_value = "off",
        value_name = "ADDR|off"
    )]
    pub metrics_bind: accel_telemetry::Bind,
    /// The agent's own log lines: `text`, or `json` (one object per line).
    /// Worker output is not touched.
    #[arg(
        long = "log-format",
        alias = "log_format",
        env = "PET_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: accel_telemetry::logging::LogFormat,
    /// Start each worker as a fork of the process serving on this inherited
    /// Unix socket instead of executing the script (how the `accel` Python
    /// package's `notebook_launcher` runs a notebook's function; the
    /// protocol is in the `fork_server` module's documentation). The script
    /// argument then only names the job in reports.
    #[arg(long = "fork-server-fd", value_name = "FD", value_parser = clap::value_parser!(i32).range(3..))]
    pub fork_server_fd: Option<i32>,
    /// Node health: a shell command run before this node offers itself for
    /// each round; a non-zero exit or a timeout keeps the node out (it waits
    /// as a spare, re-checking) so an elastic job forms without it.
    #[arg(long = "health-check", env = "PET_HEALTH_CHECK", value_name = "CMD")]
    pub health_check: Option<String>,
    /// How long the health checks may run, together.
    #[arg(long = "health-check-timeout", env = "PET_HEALTH_CHECK_TIMEOUT",
          default_value = "60", value_parser = DurationParser)]
    pub health_check_timeout: Duration,
    /// Check the links NCCL/gloo use (sysfs: operstate, carrier, error
    /// counters; InfiniBand port state): `auto` (NCCL_SOCKET_IFNAME /
    /// GLOO_SOCKET_IFNAME / NCCL_IB_HCA, else every physical interface and
    /// InfiniBand port) or names (`eth0,mlx5_0`, a port `mlx5_0:1`).
    #[arg(
        long = "health-check-nic",
        env = "PET_HEALTH_CHECK_NIC",
        value_name = "IFACES|auto"
    )]
    pub health_check_nic: Option<String>,
    /// Where sysfs is mounted, for --health-check-nic.
    #[arg(
        long = "health-check-sysfs",
        env = "PET_HEALTH_CHECK_SYSFS",
        default_value = "/sys",
        value_name = "PATH"
    )]
    pub health_check_sysfs: PathBuf,
    /// Check that a file in this directory can be written, fsync'ed, read
    /// back and deleted (the checkpoint filesystem: full, read-only or hung
    /// storage keeps the node out).
    #[arg(
        long = "health-check-storage",
        env = "PET_HEALTH_CHECK_STORAGE",
        value_name = "PATH"
    )]
    pub health_check_storage: Option<PathBuf>,
    /// Check every GPU with nvidia-smi (persistence mode, uncorrectable ECC
    /// errors, retired pages or remapped rows pending, a GPU that does not
    /// answer) and the kernel log's fatal XID events.
    #[arg(long = "health-check-gpu", env = "PET_HEALTH_CHECK_GPU",
          value_parser = BoolishValueParser::new(), default_missing_value = "true",
          num_args = 0..=1, require_equals = true)]
    pub health_check_gpu: bool,
    /// The kernel log --health-check-gpu reads XID events from: /dev/kmsg,
    /// or a file (/var/log/kern.log); `none` skips them.
    #[arg(
        long = "health-check-kernel-log",
        env = "PET_HEALTH_CHECK_KERNEL_LOG",
        default_value = "/dev/kmsg",
        value_name = "PATH|none"
    )]
    pub health_check_kernel_log: PathBuf,
    /// Ask a node health daemon: `unix:/path.sock` (answers `ok` or `fail
    /// REASON` to `check HOST`) or `http://host:port/path` (2xx passes).
    #[arg(
        long = "health-check-endpoint",
        env = "PET_HEALTH_CHECK_ENDPOINT",
        value_name = "ADDR"
    )]
    pub health_check_endpoint: Option<crate::health::endpoint::Endpoint>,
    /// Run the health checks this often while the node waits as a spare or
    /// its workers run; a failure stops this node's workers and takes it
    /// out of the job (the others re-form, no restart counted). 0: only
    /// before each round.
    #[arg(long = "health-check-interval", env = "PET_HEALTH_CHECK_INTERVAL",
          default_value = "0", value_parser = DurationParser)]
    pub health_check_interval: Duration,
    /// On a GPU node (`nvidia-smi` on PATH): how long a round's workers wait
    /// for the previous round's processes to release the GPUs.
    #[arg(long = "gpu-free-timeout", env = "PET_GPU_FREE_TIMEOUT",
          default_value = "30", value_parser = DurationParser)]
    pub gpu_free_timeout: Duration,
    /// A worker exit code (1-255) that ends the job at once, failed, with that code on every node, whatever restart budget is left (e.g. 93, NVIDIA's resiliency extension's "do not requeue"; default: none).
    #[arg(long = "no-restart-exit-code", env = "PET_NO_RESTART_EXIT_CODE", value_name = "CODE",
          value_parser = clap::value_parser!(u8).range(1..))]
    pub no_restart_exit_code: Option<u8>,
    /// End the job when this many restarts in a row did not take training past the best step it reached (workers report steps with `accel.progress(step)`; the job then fails with --no-restart-exit-code, else 1, naming the step). 0, the default: never.
    #[arg(
        long = "max-no-progress-restarts",
        env = "PET_MAX_NO_PROGRESS_RESTARTS",
        value_name = "N",
        default_value = "0"
    )]
    pub max_no_progress_restarts: u32,
    /// A file holding the iteration of the job's last checkpoint (as NVIDIA's resiliency extension's --ft-checkpoint-iteration-file and Megatron-LM's latest_checkpointed_iteration.txt): read every second as progress of every worker, so --max-no-progress-restarts works without accel.progress() in the script.
    #[arg(
        long = "checkpoint-iteration-file",
        env = "PET_CHECKPOINT_ITERATION_FILE",
        value_name = "FILE"
    )]
    pub checkpoint_iteration_file: Option<PathBuf>,
    /// Hangs without a guessed timeout: a worker that reports its steps (`accel.progress(step)`) and then makes no progress for --hang-safety-factor times its own 99th-percentile step time (within --hang-timeout-floor and --hang-timeout-cap; --first-step-timeout before a round's first steps; `with accel.section(name):` blocks learn their own) hung: every rank's stacks go to its error file, it is killed and the job restarts, as for an expired FileTimer.
    #[arg(long = "learned-hang-timeouts", env = "PET_LEARNED_HANG_TIMEOUTS", value_parser = BoolishValueParser::new(), default_missing_value = "true", num_args = 0..=1, require_equals = true)]
    pub learned_hang_timeouts: bool,
    /// --learned-hang-timeouts: the timeout is this many times the learned step (or section) time.
    #[arg(long = "hang-safety-factor", env = "PET_HANG_SAFETY_FACTOR", value_name = "F",
          default_value = "3", value_parser = parse_factor)]
    pub hang_safety_factor: f64,
    /// --learned-hang-timeouts: the least timeout.
    #[arg(long = "hang-timeout-floor", env = "PET_HANG_TIMEOUT_FLOOR",
          default_value = "30", value_parser = DurationParser)]
    pub hang_timeout_floor: Duration,
    /// --learned-hang-timeouts: the largest timeout, and a section's the first time it runs.
    #[arg(long = "hang-timeout-cap", env = "PET_HANG_TIMEOUT_CAP",
          default_value = "3600", value_parser = DurationParser)]
    pub hang_timeout_cap: Duration,
    /// --learned-hang-timeouts: how long a round's workers may take to their first steps (start-up, loading a checkpoint, compiling).
    #[arg(long = "first-step-timeout", env = "PET_FIRST_STEP_TIMEOUT",
          default_value = "1800", value_parser = DurationParser)]
    pub first_step_timeout: Duration,
    /// Crash loops: the wait before a restart when the job failed within
    /// --restart-backoff-window of its round's start for the second time in
    /// a row: BASE, doubling for each further quick failure, at most MAX
    /// (durations; MAX defaults to 30 s). `0` restarts at once, always.
    #[arg(long = "restart-backoff", env = "PET_RESTART_BACKOFF", default_value = "1:30",
          value_name = "BASE[:MAX]", value_parser = backoff)]
    pub restart_backoff: (Duration, Duration),
    /// How soon after a round started a failure counts as part of a crash loop.
    #[arg(long = "restart-backoff-window", env = "PET_RESTART_BACKOFF_WINDOW",
          default_value = "60", value_parser = DurationParser)]
    pub restart_backoff_window: Duration,
    /// Hot restart: keep a Python interpreter that has imported these
    /// modules (comma-separated, e.g. `torch` or `torch,transformers`) and
    /// start every worker as a fork of it instead of a new `python`, so no
    /// round pays for the imports again. Falls back to executing the script,
    /// with a warning, if importing them started a thread or CUDA.
    #[arg(
        long = "preload",
        env = "PET_PRELOAD",
        value_name = "MODULES",
        value_delimiter = ','
    )]
    pub preload: Vec<String>,
    /// Print a completion script for SHELL (bash, zsh or tcsh: torchrun's
    /// flag) and exit. `accel-agent completions SHELL` also has fish,
    /// elvish and powershell.
    #[arg(
        long = "print-completion",
        alias = "print_completion",
        value_name = "SHELL",
        value_parser = ["bash", "zsh", "tcsh"]
    )]
    pub print_completion: Option<String>,
    /// The training script (or program, with --no-python; or module, with -m).
    #[arg(required_unless_present = "print_completion")]
    pub training_script: Option<String>,
    /// Arguments for the script; `${local_rank}` is replaced by each worker's local rank.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub training_script_args: Vec<String>,
}

/// `--duplicate-std*-filters`: every value is a valid list (torchrun's).
fn line_filter(s: &str) -> Result<LineFilter, std::convert::Infallible> {
    Ok(LineFilter::parse(s))
}

/// `--restart-backoff BASE[:MAX]`.
fn backoff(s: &str) -> Result<(Duration, Duration), String> {
    crate::config::RestartBackoff::parse_wait(s)
}

/// A rank filter as clap holds it: clap reads a bare `Option` field as "the
/// flag may be absent", so the filter's own `None` (every rank) is wrapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranks(pub RankFilter);

fn ranks(
    flag: &'static str,
) -> impl Fn(&str) -> Result<Ranks, crate::config::ConfigError> + Clone + Send + Sync + 'static {
    let parse = rank_filter(flag);
    move |s| parse(s).map(Ranks)
}

/// Every flag of `accel-agent` reaches the launch options here. Both sides
/// are spelled out: `AgentArgs` is taken apart without `..` and
/// `LaunchOptions` built without a default base, so a new flag that is not
/// carried over, or a new option that a flag does not fill, fails to
/// compile instead of being silently dropped or defaulted.
impl From<AgentArgs> for LaunchOptions {
    fn from(a: AgentArgs) -> Self {
        let AgentArgs {
            nnodes,
            nproc_per_node,
            rdzv_backend,
            rdzv_endpoint,
            rdzv_id,
            rdzv_conf,
            standalone,
            max_restarts,
            monitor_interval,
            // torchrun's, accepted for compatibility: accel always starts
            // workers its one way, and logs through `--log-dir`/`--tee`.
            start_method: _,
            logs_specs: _,
            role,
            module,
            no_python,
            run_path,
            log_dir,
            redirects,
            tee,
            log_line_prefix_template,
            local_ranks_filter,
            ranks_filter,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
            event_log_handler,
            node_rank,
            master_addr,
            master_port,
            local_addr,
            node_identity,
            topology,
            topology_file,
            signals_to_handle,
            shutdown_timeout,
            exit_barrier_timeout,
            virtual_local_rank,
            numa_binding,
            metrics_bind,
            // The process's own: read by `main` before the launch.
            log_format: _,
            print_completion: _,
            fork_server_fd,
            health_check,
            health_check_timeout,
            health_check_nic,
            health_check_sysfs,
            health_check_storage,
            health_check_gpu,
            health_check_kernel_log,
            health_check_endpoint,
            health_check_interval,
            gpu_free_timeout,
            no_restart_exit_code,
            max_no_progress_restarts,
            nnodes_multiple_of,
            scale_up_settle,
            checkpoint_iteration_file,
            learned_hang_timeouts,
            hang_safety_factor,
            hang_timeout_floor,
            hang_timeout_cap,
            first_step_timeout,
            restart_backoff,
            restart_backoff_window,
            preload,
            training_script,
            training_script_args,
        } = a;
        Self {
            nnodes,
            nproc_per_node,
            rdzv_backend,
            rdzv_endpoint,
            rdzv_id,
            rdzv_conf,
            standalone,
            max_restarts,
            monitor_interval,
            role,
            module,
            no_python,
            run_path,
            log_dir,
            redirects,
            tee,
            log_line_prefix_template,
            local_ranks_filter: local_ranks_filter.0,
            ranks_filter: ranks_filter.0,
            duplicate_stdout_filters,
            duplicate_stderr_filters,
            event_log_handler,
            node_rank,
            master_addr,
            master_port,
            local_addr,
            node_identity,
            topology,
            topology_file,
            signals_to_handle,
            shutdown_timeout,
            exit_barrier_timeout,
            virtual_local_rank,
            numa_binding,
            training_script: training_script.unwrap_or_default(),
            training_script_args,
            // The agent's own environment, read by `build` through its
            // lookup; torchrun's variables for the workers.
            base_env: Vec::new(),
            torchrun_env: true,
            warnings: Vec::new(),
            metrics_bind,
            fork_server_fd,
            preload,
            gpu_free_timeout,
            no_restart_exit_code,
            max_no_progress_restarts,
            nnodes_multiple_of,
            scale_up_settle,
            checkpoint_iteration_file,
            hang: learned_hang_timeouts.then_some(crate::hang::Settings {
                factor: hang_safety_factor,
                floor: hang_timeout_floor,
                cap: hang_timeout_cap,
                first_step: first_step_timeout,
            }),
            health_check: crate::health::HealthFlags {
                command: health_check,
                timeout: health_check_timeout,
                nic: health_check_nic,
                sysfs: health_check_sysfs,
                storage: health_check_storage,
                gpu: health_check_gpu,
                kernel_log: (health_check_kernel_log.as_os_str() != "none")
                    .then_some(health_check_kernel_log),
                endpoint: health_check_endpoint,
                interval: (!health_check_interval.is_zero()).then_some(health_check_interval),
            },
            restart_backoff: crate::config::RestartBackoff {
                base: restart_backoff.0,
                max: restart_backoff.1,
                window: restart_backoff_window,
            },
        }
    }
}

/// `--hang-safety-factor`: a finite number from 1 to 1000.
fn parse_factor(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && (1.0..=1000.0).contains(&f) => Ok(f),
        _ => Err(format!(
            "'{s}' is not a safety factor: write a number from 1 to 1000 (e.g. 3: three times the learned step time)"
        )),
    }
}
