//! Log set-up shared by `rdzv-server` and `accel-agent`: human-readable
//! lines on a terminal, or one JSON object per line for a log pipeline
//! (`--log-format json`), on stderr, filtered by an environment variable.

use std::fmt;
use std::str::FromStr;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A `--log-format` that is neither `text` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format {0:?}: use text or json")]
pub struct BadFormat(String);

impl FromStr for LogFormat {
    type Err = BadFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(BadFormat(s.chars().take(40).collect())),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Installs the process's log subscriber, unless it already has one (a
/// library caller's own wins): `filter_var` (e.g. `RUST_LOG`) overrides
/// `default_filter`; `targets` prints each line's module.
///
/// A line that cannot be written is dropped. A daemon's stderr can be a
/// pipe whose reader is gone (a notebook kernel that died, a closed SSH
/// session); by default the subscriber would then report the failure with
/// `eprintln!` to the same stderr, which panics, and a panic in the agent's
/// shutdown path would leave its workers running.
pub fn init(format: LogFormat, filter_var: &str, default_filter: &str, targets: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(filter_var)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_target(targets);
    let _ = match format {
        // A pipeline reads the fields; no colour codes in them.
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!("json".parse::<LogFormat>().expect("json"), LogFormat::Json);
        assert_eq!("Text".parse::<LogFormat>().expect("text"), LogFormat::Text);
        let e = "yaml".parse::<LogFormat>().expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown log format \"yaml\": use text or json"
        );
    }
}
