//! Command-line and environment configuration of `rdzv-server`.
//!
//! Durations are parsed by [`crate::input`], bounded, and re-exported here
//! for the agent, which shares them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

pub use crate::input::{parse_duration, DurationError, DurationParser, MAX_DURATION};

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
    },
}
