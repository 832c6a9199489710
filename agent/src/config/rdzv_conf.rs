//! `--rdzv-conf`: torchrun's rendezvous settings (plus accel's
//! `reconnect_grace`), parsed strictly: an unknown key or a key without a
//! value is an error that names it.

use std::time::Duration;

use rendezvous_server::config::{parse_duration, MAX_DURATION};

use super::{bad, ConfigError};

/// `--rdzv-conf` settings (torchrun names and defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdzvConf {
    /// How long to wait for a round to form.
    pub join_timeout: Duration,
    /// Elastic: extra wait for more nodes once MIN joined.
    pub last_call_timeout: Duration,
    /// Elastic: how long a closing rendezvous lingers.
    pub close_timeout: Duration,
    /// How often the agent proves it is alive.
    pub keep_alive_interval: Duration,
    /// Missed keep-alives after which the server drops the node.
    pub keep_alive_max_attempt: u32,
    /// Deadline of each call to the rendezvous.
    pub read_timeout: Duration,
    /// c10d: whether this agent hosts the rendezvous (`None`: decide from the endpoint).
    pub is_host: Option<bool>,
    /// Static: how long to wait for all nodes.
    pub timeout: Duration,
    /// How long an agent that lost the rendezvous keeps its workers while it
    /// reconnects (accel's own key).
    pub reconnect_grace: Duration,
}

impl Default for RdzvConf {
    fn default() -> Self {
        Self {
            join_timeout: Duration::from_secs(600),
            last_call_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_max_attempt: 3,
            read_timeout: Duration::from_secs(60),
            is_host: None,
            timeout: Duration::from_secs(900),
            reconnect_grace: Duration::from_secs(60),
        }
    }
}

const RDZV_KEYS: &str = "join_timeout, last_call_timeout, close_timeout, keep_alive_interval, \
                         keep_alive_max_attempt, read_timeout, is_host, timeout, reconnect_grace";

impl RdzvConf {
    /// Parses `k1=v1,k2=v2`; unknown keys and keys without a value are errors.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(bad(format!(
                    "--rdzv-conf: '{item}' has no value; write it as {item}=VALUE"
                )));
            };
            let (key, value) = (key.trim(), value.trim());
            let dur =
                |v: &str| parse_duration(v).map_err(|e| bad(format!("--rdzv-conf {key}: {e}")));
            match key {
                "join_timeout" => c.join_timeout = dur(value)?,
                "last_call_timeout" => c.last_call_timeout = dur(value)?,
                "close_timeout" => c.close_timeout = dur(value)?,
                "keep_alive_interval" => c.keep_alive_interval = dur(value)?,
                "read_timeout" => c.read_timeout = dur(value)?,
                "timeout" => c.timeout = dur(value)?,
                "reconnect_grace" => c.reconnect_grace = dur(value)?,
                "keep_alive_max_attempt" => {
                    c.keep_alive_max_attempt = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad(format!("--rdzv-conf keep_alive_max_attempt: '{value}' is not a positive integer"))
                    })?
                }
                "is_host" => c.is_host = Some(parse_bool(value).ok_or_else(|| {
                    bad(format!("--rdzv-conf is_host: '{value}' is not a boolean; use true or false"))
                })?),
                other => {
                    return Err(bad(format!(
                        "--rdzv-conf: unknown key '{other}'; known keys: {RDZV_KEYS}"
                    )))
                }
            }
        }
        if c.read_timeout.is_zero() {
            return Err(bad("--rdzv-conf read_timeout must be greater than 0"));
        }
        if c.keep_alive_interval.is_zero() {
            return Err(bad(
                "--rdzv-conf keep_alive_interval must be greater than 0",
            ));
        }
        // The server is told this limit in milliseconds (a u64).
        if c
            .keep_alive_interval
            .checked_mul(c.keep_alive_max_attempt)
            .is_none_or(|limit| limit > MAX_DURATION)
        {
            return Err(bad(format!(
                "--rdzv-conf keep_alive_interval {:?} x keep_alive_max_attempt {} is longer than 10 years; lower one of them",
                c.keep_alive_interval, c.keep_alive_max_attempt
            )));
        }
        Ok(c)
    }
}

/// torchrun's boolean spellings.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Some(true),
        "0" | "false" | "f" | "no" | "n" => Some(false),
        _ => None,
    }
}
