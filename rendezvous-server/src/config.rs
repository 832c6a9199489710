//! Command-line and environment configuration of `rdzv-server`.
//!
//! Durations are parsed by [`crate::input`], bounded, and re-exported here
//! for the agent, which shares them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::auth::{Token, TokenError};
pub use crate::input::{parse_duration, DurationError, DurationParser, MAX_DURATION};
use crate::limits::Limits;

/// accel's rendezvous server: run one on the head node; agents join it with
/// `--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB`.
#[derive(Debug, Clone, Parser)]
#[command(name = "rdzv-server", version)]
pub struct ServerArgs {
    /// Address to listen on (IPv6 `[::]` also accepts IPv4 where the system allows).
    #[arg(long, env = "RDZV_BIND", default_value = "[::]:29400")]
    pub bind: SocketAddr,
    /// How long a finished job is remembered after its last node left, so late
    /// joiners are told it finished (seconds, or with a unit: 500ms, 2m).
    #[arg(long, env = "RDZV_FINISHED_JOB_TTL", default_value = "30", value_parser = DurationParser)]
    pub finished_job_ttl: Duration,
    /// Log format.
    #[arg(long, env = "RDZV_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// File holding the token every agent must present (else the variable
    /// RDZV_TOKEN holds it). Agents take the same token from
    /// `--rdzv-conf token_file=PATH` or ACCEL_RDZV_TOKEN.
    #[arg(long, env = "RDZV_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
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
    /// Without a subcommand, serve the rendezvous.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `rdzv-server` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the jobs a running rdzv-server knows: phase, round, restarts, nodes, last failure.
    Status {
        /// The server to ask.
        #[arg(
            long = "rdzv-endpoint",
            alias = "rdzv_endpoint",
            alias = "endpoint",
            default_value = "127.0.0.1:29400"
        )]
        endpoint: String,
        /// Only this job.
        #[arg(long = "rdzv-id", alias = "rdzv_id", alias = "job")]
        job: Option<String>,
        /// File holding the server's token (else ACCEL_RDZV_TOKEN or RDZV_TOKEN).
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// CA (PEM) of a TLS server's certificate (else ACCEL_RDZV_TLS_CA).
        #[arg(long, value_name = "PEM")]
        tls_ca: Option<PathBuf>,
        /// Client certificate (PEM) for mutual TLS (else ACCEL_RDZV_TLS_CERT).
        #[arg(long, value_name = "PEM")]
        tls_cert: Option<PathBuf>,
        /// Client key (PEM) for mutual TLS (else ACCEL_RDZV_TLS_KEY).
        #[arg(long, value_name = "PEM")]
        tls_key: Option<PathBuf>,
    },
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

impl ServerArgs {
    /// The server's token: `--token-file`, else `RDZV_TOKEN` from `env`.
    pub fn token(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Token>, TokenError> {
        Token::resolve(self.token_file.as_deref(), "RDZV_TOKEN", env)
    }

    /// The TLS settings the flags give (`None`: plain).
    pub fn tls(&self) -> Result<Option<tonic::transport::ServerTlsConfig>, crate::tls::TlsError> {
        crate::tls::server_config(
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
        }
    }

    /// Refuses to serve a non-loopback address without a token, unless
    /// `--allow-unauthenticated` says so (then warns once); warns once when
    /// a token would travel there without TLS.
    pub fn check_exposure(&self, token: Option<&Token>, tls: bool) -> Result<(), String> {
        if self.bind.ip().is_loopback() {
            return Ok(());
        }
        if token.is_some() {
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

/// The token a client (`status`, an agent) presents: `file` if given, else
/// `ACCEL_RDZV_TOKEN`, else `RDZV_TOKEN`, looked up through `env`.
pub fn client_token(
    file: Option<&std::path::Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Token>, TokenError> {
    match Token::resolve(file, "ACCEL_RDZV_TOKEN", env)? {
        Some(t) => Ok(Some(t)),
        None => Token::resolve(None, "RDZV_TOKEN", env),
    }
}
