//! Command-line and environment configuration of `rdzv-server`.
//!
//! Durations are parsed by [`accel_input`], as every accel program parses
//! them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::job::{QuarantinePolicy, QuarantineScope, QuarantineSettings};
use crate::limits::Limits;
use accel_input::DurationParser;
use accel_telemetry::logging::LogFormat;
use accel_telemetry::Bind;
use accel_wire::accepted::Accepted;
use accel_wire::auth::TokenError;

use crate::auth::Tokens;

/// accel's rendezvous server: run one on the head node; agents join it with
/// `--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "rdzv-server",
    version,
    after_help = "Shell completions: rdzv-server completions bash|zsh|fish|elvish|powershell\nMan page:          rdzv-server manpage"
)]
pub struct ServerArgs {
    /// Address to listen on (IPv6 `[::]` also accepts IPv4 where the system allows).
    #[arg(long, env = "RDZV_BIND", default_value = "[::]:29400")]
    pub bind: SocketAddr,
    /// How long a finished job is remembered after its last node left, so late
    /// joiners are told it finished (seconds, or with a unit: 500ms, 2m).
    #[arg(long, env = "RDZV_FINISHED_JOB_TTL", default_value = "30", value_parser = DurationParser)]
    pub finished_job_ttl: Duration,
    /// How long a finished job's outcome is kept after that, so that a node
    /// of the job that comes back late (cut off at the end, or restarted) is
    /// told it and exits with the job's result, and any other node joining
    /// that id is refused (0: not kept; at most 10,000 jobs' outcomes).
    #[arg(long, env = "RDZV_TOMBSTONE_TTL", default_value = "600", value_parser = DurationParser)]
    pub tombstone_ttl: Duration,
    /// Log format: `text`, or `json` (one object per line).
    #[arg(long, env = "RDZV_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Where to serve Prometheus metrics (`/metrics`), `/healthz` and
    /// `/readyz` over plain HTTP, as IP:PORT; `off` for nowhere (default:
    /// --bind's address, port 29401). It needs no token and shows counts,
    /// states and job ids, never tokens or failure texts: keep it on a
    /// network only operators and Prometheus reach.
    #[arg(long, env = "RDZV_METRICS_BIND", value_name = "ADDR|off")]
    pub metrics_bind: Option<Bind>,
    /// File holding the token every agent must present (else the variable
    /// RDZV_TOKEN holds it). Agents take the same token from
    /// `--rdzv-conf token_file=PATH` or ACCEL_RDZV_TOKEN.
    /// It may hold two tokens, one a line (a current and a next, both
    /// accepted while they rotate), and is re-read when it changes.
    #[arg(long, env = "RDZV_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// File holding the read token: `status`, `quarantine` (listing) and
    /// the status page, nothing else. Needs --token-file.
    #[arg(long, env = "RDZV_READ_TOKEN_FILE", value_name = "PATH")]
    pub read_token_file: Option<PathBuf>,
    /// File holding the operate token: reading, collecting stacks and
    /// releasing quarantined hosts. Once it is set, the agents' token
    /// (which training code can read) only joins. Needs --token-file.
    #[arg(long, env = "RDZV_OPERATE_TOKEN_FILE", value_name = "PATH")]
    pub operate_token_file: Option<PathBuf>,
    /// Serve a non-loopback address without a token: anyone who reaches the
    /// port can then join, fail or stop any job. Only for isolated networks.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Certificate chain (PEM) to serve TLS with; needs --tls-key.
    #[arg(long, env = "RDZV_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "RDZV_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) every agent's client certificate must chain to (mutual TLS).
    #[arg(long, env = "RDZV_TLS_CLIENT_CA", value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
    /// Most jobs held at once; joins of new jobs beyond it are refused.
    #[arg(long, env = "RDZV_MAX_JOBS", default_value_t = Limits::default().max_jobs)]
    pub max_jobs: usize,
    /// Most nodes of one job (spares included); joins beyond it are refused.
    #[arg(long, env = "RDZV_MAX_NODES_PER_JOB", default_value_t = Limits::default().max_nodes_per_job)]
    pub max_nodes_per_job: u32,
    /// Most connections one client address may hold at once; more are closed
    /// as they are accepted (agents hold one each).
    #[arg(long, env = "RDZV_MAX_CONNECTIONS_PER_IP", default_value_t = Limits::default().max_connections_per_ip,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_ip: u32,
    /// How long a new connection has to make its first authenticated call
    /// (any call, without a token) before it is closed. Health checks do not count.
    #[arg(long, env = "RDZV_AUTH_TIMEOUT", default_value = "30",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, positive))]
    pub auth_timeout: Duration,
    /// etcd client URLs, comma-separated (`http://h1:2379,http://h2:2379`):
    /// run as one of several replicas. They elect a leader through etcd, which
    /// serves with every job's state in etcd; the others send agents to it and
    /// take over if it goes.
    #[arg(
        long,
        env = "RDZV_ETCD_ENDPOINTS",
        value_delimiter = ',',
        value_name = "URLS"
    )]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of this cluster's election and job state in etcd.
    #[arg(long, env = "RDZV_ETCD_PREFIX", default_value = "/accel")]
    pub etcd_prefix: String,
    /// Lease of the leader's election key: a leader that vanished (host down,
    /// network cut) is replaced after about this long. Whole seconds, at least 1.
    #[arg(long, env = "RDZV_ETCD_LEASE", default_value = "5",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, whole_seconds))]
    pub etcd_lease: Duration,
    /// etcd user (with --etcd-password-file).
    #[arg(long, env = "RDZV_ETCD_USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(
        long,
        env = "RDZV_ETCD_PASSWORD_FILE",
        value_name = "PATH",
        requires = "etcd_user"
    )]
    pub etcd_password_file: Option<PathBuf>,
    /// CA (PEM) of etcd's server certificates (https:// endpoints).
    #[arg(long, env = "RDZV_ETCD_CA", value_name = "PEM")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS; needs --etcd-key.
    #[arg(
        long,
        env = "RDZV_ETCD_CERT",
        value_name = "PEM",
        requires = "etcd_key"
    )]
    pub etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(
        long,
        env = "RDZV_ETCD_KEY",
        value_name = "PEM",
        requires = "etcd_cert"
    )]
    pub etcd_key: Option<PathBuf>,
    /// The address agents reach this replica at, announced to the others
    /// (default: --bind, or this host's name with --bind's port when --bind
    /// is a wildcard address).
    #[arg(long, env = "RDZV_ADVERTISE", value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// Once listening, write the bound addresses to this file (replaced
    /// atomically, mode 0644), one `KEY=IP:PORT` line each: `grpc=`, then
    /// `metrics=` if metrics are served. With `--bind HOST:0` it is how a
    /// supervisor or script learns the port the system chose.
    #[arg(long, env = "RDZV_ADDRESS_FILE", value_name = "PATH")]
    pub address_file: Option<PathBuf>,
    /// Where this server notes that it ran (default: systemd's
    /// $STATE_DIRECTORY, if set). A server that follows an earlier one on
    /// the same port, without etcd, forms no round of a job it does not know
    /// for one drop limit after it starts, so that a job whose workers still
    /// run is relearned from its nodes, not formed anew beside them. Without
    /// it, a restart cannot be told from a first start.
    #[arg(long, env = "RDZV_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Serve torchft's lighthouse protocol on this address (IP:PORT; off by
    /// default): torchft's managers, pointed at it with
    /// TORCHFT_LIGHTHOUSE=http://IP:PORT, get their quorums from this server.
    /// torchft's client sends no token and speaks no TLS: only
    /// --lighthouse-allow's networks are answered.
    #[arg(long, env = "RDZV_LIGHTHOUSE", value_name = "ADDR")]
    pub lighthouse: Option<SocketAddr>,
    /// Networks whose torchft managers the lighthouse answers, comma-separated
    /// (`10.0.0.0/8,fd00::/8`, `any`). Default: loopback only.
    #[arg(
        long,
        env = "RDZV_LIGHTHOUSE_ALLOW",
        value_name = "NETS",
        default_value = "127.0.0.0/8,::1/128",
        requires = "lighthouse"
    )]
    pub lighthouse_allow: crate::lighthouse::service::Allow,
    /// The fewest replica groups a lighthouse quorum has (torchft's
    /// --min_replicas).
    #[arg(long, env = "RDZV_LIGHTHOUSE_MIN_REPLICAS", default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lighthouse_min_replicas: u64,
    /// How long a lighthouse quorum waits for replica groups that heartbeat
    /// but have not asked to join, from the first that asked.
    #[arg(long, env = "RDZV_LIGHTHOUSE_JOIN_TIMEOUT", default_value = "60", value_parser = DurationParser)]
    pub lighthouse_join_timeout: Duration,
    /// How often the lighthouse looks for a quorum besides on each call.
    #[arg(long, env = "RDZV_LIGHTHOUSE_QUORUM_TICK", default_value = "100ms",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, at_least_10ms))]
    pub lighthouse_quorum_tick: Duration,
    /// How long a replica group counts as alive after its last heartbeat.
    #[arg(long, env = "RDZV_LIGHTHOUSE_HEARTBEAT_TIMEOUT", default_value = "5",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, positive))]
    pub lighthouse_heartbeat_timeout: Duration,
    /// Quarantine a host whose workers failed this many times within
    /// --quarantine-window: no round places it for --quarantine-for (it
    /// waits as a spare, told why). 0: never.
    #[arg(long, env = "RDZV_QUARANTINE_AFTER", default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub quarantine_after: u32,
    /// How far back worker failures count towards a quarantine.
    #[arg(long, env = "RDZV_QUARANTINE_WINDOW", default_value = "1h",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, positive))]
    pub quarantine_window: Duration,
    /// How long a quarantined host stays out (`rdzv-server quarantine release` ends it sooner).
    #[arg(long, env = "RDZV_QUARANTINE_FOR", default_value = "1h",
          value_parser = clap::builder::TypedValueParser::try_map(DurationParser, positive))]
    pub quarantine_for: Duration,
    /// Count a straggler (a rank persistently slower per step than the
    /// job's median) against its host as a worker failure, once a round; a
    /// host this quarantines leaves the running round at once when the job
    /// can form without it. Needs --quarantine-after.
    #[arg(long, env = "RDZV_STRAGGLER_QUARANTINE", requires = "quarantine_after")]
    pub straggler_quarantine: bool,
    /// Where a quarantine applies: `job`, the job whose rounds the host
    /// failed; `server`, every job of this server.
    #[arg(long, env = "RDZV_QUARANTINE_SCOPE", default_value = "job", value_enum)]
    pub quarantine_scope: QuarantineScope,
    /// Without a subcommand, serve the rendezvous.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `rdzv-server` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the jobs a running rdzv-server knows: phase, round, restarts, nodes, last failure.
    Status {
        /// Which server, and how to reach it.
        #[command(flatten)]
        client: ClientArgs,
        /// Only this job.
        #[arg(long = "rdzv-id", alias = "rdzv_id", alias = "job")]
        job: Option<String>,
        /// Print one JSON document (`{"jobs": [...]}`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the Python stacks of every worker of a running job (`py-spy dump`
    /// on each node), grouped by identical stacks, the fewest ranks first: the
    /// odd rank out of a hung job leads.
    Stacks {
        /// The job: its --rdzv-id.
        job: String,
        /// Which server, and how to reach it.
        #[command(flatten)]
        client: ClientArgs,
        /// Native (C/C++) frames too (py-spy --native; slower).
        #[arg(long)]
        native: bool,
        /// How long to wait for the nodes' answers (at most 60s); nodes that
        /// have not answered by then are named.
        #[arg(long, default_value = "10s", value_parser = DurationParser)]
        timeout: Duration,
        /// Print one JSON document (`{"groups": [...]}`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the quarantined hosts of a running rdzv-server (--quarantine-after), or release one.
    Quarantine {
        /// What to do.
        #[command(subcommand)]
        action: QuarantineAction,
    },
}

/// `rdzv-server quarantine` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum QuarantineAction {
    /// Print each quarantined host: its job (`*`: server-wide), why, and the time left.
    List {
        /// Which server, and how to reach it.
        #[command(flatten)]
        client: ClientArgs,
        /// Only this job's.
        #[arg(long = "rdzv-id", alias = "rdzv_id", alias = "job")]
        job: Option<String>,
        /// Print one JSON document (`{"hosts": [...]}`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// End a host's quarantine now: its nodes may take part in the next round.
    Release {
        /// The host name, as `list` shows it.
        host: String,
        /// Which server, and how to reach it.
        #[command(flatten)]
        client: ClientArgs,
        /// Only in this job (default: every job, and server-wide).
        #[arg(long = "rdzv-id", alias = "rdzv_id", alias = "job")]
        job: Option<String>,
    },
}

/// How a subcommand reaches a running server.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The server to ask.
    #[arg(
        long = "rdzv-endpoint",
        alias = "rdzv_endpoint",
        alias = "endpoint",
        default_value = "127.0.0.1:29400"
    )]
    pub endpoint: String,
    /// File holding the server's token (else ACCEL_RDZV_TOKEN or RDZV_TOKEN).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// CA (PEM) of a TLS server's certificate (else ACCEL_RDZV_TLS_CA).
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (else ACCEL_RDZV_TLS_CERT).
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS (else ACCEL_RDZV_TLS_KEY).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
}

/// A time a client is given to do something: zero would close every
/// connection before its first call.
fn positive(d: Duration) -> Result<Duration, &'static str> {
    if d.is_zero() {
        Err("must be more than 0 s: a client needs time to make its first call")
    } else {
        Ok(d)
    }
}

/// An etcd lease: whole seconds (etcd's unit), at least one.
fn at_least_10ms(d: Duration) -> Result<Duration, &'static str> {
    match d >= Duration::from_millis(10) {
        true => Ok(d),
        false => Err("at least 10ms"),
    }
}

fn whole_seconds(d: Duration) -> Result<Duration, &'static str> {
    if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
        Err("must be whole seconds, at least 1 (etcd leases are counted in seconds)")
    } else {
        Ok(d)
    }
}

/// The metrics port when `--metrics-bind` is not given.
pub const METRICS_PORT: u16 = 29401;

impl ServerArgs {
    /// The lighthouse's settings (`--lighthouse-*`).
    pub fn lighthouse_config(&self) -> crate::lighthouse::LighthouseConfig {
        crate::lighthouse::LighthouseConfig {
            min_replicas: self.lighthouse_min_replicas,
            join_timeout: self.lighthouse_join_timeout,
            quorum_tick: self.lighthouse_quorum_tick,
            heartbeat_timeout: self.lighthouse_heartbeat_timeout,
        }
    }

    /// Where the metrics endpoint listens: `--metrics-bind`, else
    /// `--bind`'s address on [`METRICS_PORT`] (a loopback server keeps its
    /// metrics on loopback too).
    pub fn metrics(&self) -> Bind {
        self.metrics_bind
            .unwrap_or_else(|| Bind::At(SocketAddr::new(self.bind.ip(), METRICS_PORT)))
    }

    /// Replication on etcd, if `--etcd-endpoints` asks for it; `bound`: the
    /// address the server listens on. Errors name the flag to fix.
    pub fn etcd(&self, bound: SocketAddr) -> Result<Option<crate::ha::EtcdOptions>, String> {
        if self.etcd_endpoints.is_empty() {
            return Ok(None);
        }
        let mut tls_needed = false;
        for url in &self.etcd_endpoints {
            match url.split_once("://") {
                Some(("http", rest)) | Some(("https", rest)) if rest.contains('@') => {
                    return Err(
                        "--etcd-endpoints: give etcd credentials with --etcd-user and --etcd-password-file, not in the URL (it would be logged)"
                            .into(),
                    )
                }
                Some(("http", rest)) | Some(("https", rest)) if !rest.is_empty() => {
                    tls_needed |= url.starts_with("https");
                }
                _ => {
                    return Err(format!(
                        "--etcd-endpoints: '{}' is not an etcd client URL; write http://HOST:PORT or https://HOST:PORT",
                        accel_input::excerpt(url)
                    ))
                }
            }
        }
        if !self.etcd_prefix.starts_with('/') || self.etcd_prefix.len() < 2 {
            return Err(format!(
                "--etcd-prefix '{}' must start with '/' and name something, e.g. /accel",
                accel_input::excerpt(&self.etcd_prefix)
            ));
        }
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
        };
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => {
                let password = String::from_utf8(read("--etcd-password-file", file)?)
                    .map_err(|_| "--etcd-password-file does not hold UTF-8 text".to_owned())?;
                Some((
                    user.clone(),
                    password.trim_end_matches(['\n', '\r']).to_owned(),
                ))
            }
            _ => None,
        };
        let tls = match (tls_needed, &self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
            (false, None, None, None) => None,
            (false, ..) => {
                return Err(
                    "--etcd-ca, --etcd-cert and --etcd-key are for https:// endpoints; the endpoints are http://"
                        .into(),
                )
            }
            (true, ca, cert, key) => Some(
                crate::ha::tls_options(ca.as_deref(), cert.as_deref().zip(key.as_deref()))
                    .map_err(|e| format!("--etcd-ca/--etcd-cert/--etcd-key: {e}"))?,
            ),
        };
        let advertise = match &self.advertise {
            Some(a) => {
                if a.rsplit_once(':')
                    .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
                {
                    return Err(format!(
                        "--advertise '{}' is not HOST:PORT",
                        accel_input::excerpt(a)
                    ));
                }
                a.clone()
            }
            None if bound.ip().is_unspecified() => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .ok_or("cannot read this host's name; give --advertise HOST:PORT")?;
                format!("{host}:{}", bound.port())
            }
            None => bound.to_string(),
        };
        Ok(Some(crate::ha::EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.trim_end_matches('/').to_owned(),
            lease: self.etcd_lease,
            user,
            tls,
            advertise,
            // Agents of a server's jobs keep no presence keys.
            presence: false,
        }))
    }

    /// The server's tokens: `--token-file` (one a line, a current and a
    /// next while they rotate; re-read when it changes), else `RDZV_TOKEN`
    /// from `env`.
    pub fn token(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Accepted>, TokenError> {
        Accepted::resolve(self.token_file.as_deref(), "RDZV_TOKEN", env)
    }

    /// Every token the server accepts, by who holds it ([`Tokens`]): the
    /// agents' ([`ServerArgs::token`]), and the read and operate tokens
    /// of `--read-token-file` and `--operate-token-file`.
    pub fn tokens(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Tokens, String> {
        let agents = self
            .token(env)
            .map_err(|e| format!("--token-file / RDZV_TOKEN: {e}"))?;
        let scoped = |flag: &str, file: &Option<PathBuf>| -> Result<Option<Accepted>, String> {
            let Some(file) = file else {
                return Ok(None);
            };
            if agents.is_none() {
                return Err(format!(
                    "{flag} needs --token-file (or RDZV_TOKEN) too: without the agents' token anyone could join"
                ));
            }
            Accepted::from_file(file)
                .map(Some)
                .map_err(|e| format!("{flag}: {e}"))
        };
        let read = scoped("--read-token-file", &self.read_token_file)?;
        let operate = scoped("--operate-token-file", &self.operate_token_file)?;
        Ok(Tokens::agents(agents).with_read(read).with_operate(operate))
    }

    /// The TLS settings the flags give (`None`: plain).
    pub fn tls(&self) -> Result<Option<accel_wire::tls::ServerTls>, accel_wire::tls::TlsError> {
        accel_wire::tls::ServerTls::from_files(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_client_ca.as_deref(),
        )
    }

    /// The limits the flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            max_jobs: self.max_jobs,
            max_nodes_per_job: self.max_nodes_per_job,
            max_connections_per_ip: self.max_connections_per_ip,
            auth_timeout: self.auth_timeout,
            tombstone_ttl: self.tombstone_ttl,
            quarantine: (self.quarantine_after > 0).then_some(QuarantineSettings {
                policy: QuarantinePolicy {
                    after: self.quarantine_after,
                    window: self.quarantine_window,
                    hold: self.quarantine_for,
                    stragglers: self.straggler_quarantine,
                },
                scope: self.quarantine_scope,
            }),
            ..Limits::default()
        }
    }

    /// Refuses to serve a non-loopback address without a token, unless
    /// `--allow-unauthenticated` says so (then warns once); warns once when
    /// a token would travel there without TLS.
    pub fn check_exposure(&self, tokens: &Tokens, tls: bool) -> Result<(), String> {
        if self.bind.ip().is_loopback() {
            return Ok(());
        }
        if tokens.required() {
            if !tls {
                tracing::warn!(bind = %self.bind, "the token travels in clear text: give --tls-cert and --tls-key, or keep the network private");
            }
            return Ok(());
        }
        if self.allow_unauthenticated {
            tracing::warn!(bind = %self.bind, "serving without a token (--allow-unauthenticated): anyone who reaches this port can join, fail or stop any job");
            return Ok(());
        }
        Err(format!(
            "refusing to serve {} without a token: anyone who reaches it could join, fail or stop any job. \
             Give --token-file PATH (or RDZV_TOKEN) and the same token to the agents, bind a loopback address, \
             or pass --allow-unauthenticated on an isolated network",
            self.bind
        ))
    }
}

/// The text of `--address-file`: `grpc=ADDR`, then `metrics=ADDR` when
/// metrics are served, one per line. Key=value lines (not JSON) so that a
/// shell reads it with `sed -n 's/^grpc=//p'`; a reader ignores keys it
/// does not know, so keys may be added.
pub fn address_file_text(
    grpc: SocketAddr,
    metrics: Option<SocketAddr>,
    lighthouse: Option<SocketAddr>,
) -> String {
    let mut text = format!("grpc={grpc}\n");
    if let Some(m) = metrics {
        text.push_str(&format!("metrics={m}\n"));
    }
    if let Some(l) = lighthouse {
        text.push_str(&format!("lighthouse={l}\n"));
    }
    text
}

/// Writes `text` to `path` so that a reader never sees a partial file: to a
/// temporary file beside it (mode 0644: the addresses are no secret), then
/// renamed over `path`.
pub fn write_address_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        // The umask may have narrowed the mode given at creation.
        f.set_permissions(
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644),
        )?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{address_file_text, write_address_file, ServerArgs};

    #[test]
    fn the_address_file_names_each_bound_address_and_is_replaced_whole() {
        let grpc = "127.0.0.1:4321".parse().expect("addr");
        let metrics = "[::1]:9090".parse().expect("addr");
        assert_eq!(address_file_text(grpc, None, None), "grpc=127.0.0.1:4321\n");
        let text = address_file_text(grpc, Some(metrics), None);
        assert_eq!(text, "grpc=127.0.0.1:4321\nmetrics=[::1]:9090\n");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("addr");
        std::fs::write(&path, "old, longer contents than the new ones\n").expect("old");
        write_address_file(&path, &text).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, ["addr"], "no temporary file is left behind");
        let missing = dir.path().join("no/such/dir/addr");
        assert!(write_address_file(&missing, &text).is_err());
    }

    fn etcd(args: &[&str]) -> Result<Option<crate::ha::EtcdOptions>, String> {
        let argv = std::iter::once("rdzv-server").chain(args.iter().copied());
        let parsed = ServerArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
        parsed.etcd("10.0.0.5:29400".parse().expect("addr"))
    }

    #[test]
    fn replication_is_off_without_endpoints_and_defaults_sensibly_with_them() {
        assert!(etcd(&[]).expect("valid").is_none());
        let o = etcd(&["--etcd-endpoints", "http://a:2379,http://b:2379"])
            .expect("valid")
            .expect("replicated");
        assert_eq!(o.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!((o.prefix.as_str(), o.lease.as_secs()), ("/accel", 5));
        assert_eq!(o.advertise, "10.0.0.5:29400", "the bound address");
        let o = etcd(&[
            "--etcd-endpoints",
            "http://a:2379",
            "--etcd-prefix",
            "/team/",
            "--advertise",
            "head-1:29400",
        ])
        .expect("valid")
        .expect("replicated");
        assert_eq!(
            (o.prefix.as_str(), o.advertise.as_str()),
            ("/team", "head-1:29400")
        );
    }

    #[test]
    fn bad_replication_flags_name_the_flag_and_the_fix() {
        let cases: &[(&[&str], &str)] = &[
            (&["--etcd-endpoints", "a:2379"], "http://HOST:PORT"),
            (
                &["--etcd-endpoints", "http://root:pw@a:2379"],
                "--etcd-user",
            ),
            (
                &[
                    "--etcd-endpoints",
                    "http://a:2379",
                    "--etcd-prefix",
                    "accel",
                ],
                "--etcd-prefix",
            ),
            (
                &["--etcd-endpoints", "http://a:2379", "--etcd-lease", "500ms"],
                "whole seconds",
            ),
            (
                &["--etcd-endpoints", "http://a:2379", "--etcd-lease", "0"],
                "at least 1",
            ),
            (
                &["--etcd-endpoints", "http://a:2379", "--advertise", "head"],
                "HOST:PORT",
            ),
            (
                &["--etcd-endpoints", "http://a:2379", "--etcd-ca", "/ca.pem"],
                "https://",
            ),
            (
                &["--etcd-endpoints", "http://a:2379", "--etcd-user", "root"],
                "--etcd-password-file",
            ),
            (
                &[
                    "--etcd-endpoints",
                    "http://a:2379",
                    "--etcd-user",
                    "u",
                    "--etcd-password-file",
                    "/nonexistent/pw",
                ],
                "/nonexistent/pw",
            ),
        ];
        for (args, expected) in cases {
            let e = etcd(args).expect_err("refused");
            assert!(e.contains(expected), "{args:?}: {e}");
        }
    }
}
