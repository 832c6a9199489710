//! Command-line and environment configuration of `rdzv-server`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

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
    #[arg(long, env = "RDZV_FINISHED_JOB_TTL", default_value = "30", value_parser = parse_duration)]
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

/// The longest duration [`parse_duration`] accepts: every deadline computed
/// from a flag (`now + duration`) then fits the clock.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses plain seconds (`30`, `0.5`) or a number with a unit (`500ms`, `30s`,
/// `2m`, `1h`), up to [`MAX_DURATION`] (10 years).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("'{s}' is not a duration; use seconds like 30 or 0.5, or 500ms, 2m, 1h")
    })?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit '{other}' in '{s}'; use ms, s, m or h"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("'{s}' is not a non-negative duration"));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "'{s}' is longer than the longest duration accepted, 10 years ({} s)",
            MAX_DURATION.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("3 fortnights").is_err());
        assert_eq!(parse_duration("87600h"), Ok(MAX_DURATION));
    }

    /// Found by fuzzing (agent_flags): `--monitor-interval 100000000000000000000`
    /// panicked in `Duration::from_secs_f64`.
    #[test]
    fn huge_durations_are_refused() {
        for s in ["100000000000000000000", "10000000000000000000", "87601h", "315360000.5"] {
            let e = parse_duration(s).expect_err(s);
            assert!(e.contains("10 years"), "{s}: {e}");
        }
    }
}
