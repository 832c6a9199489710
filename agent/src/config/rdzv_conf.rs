//! `--rdzv-conf`: torchrun's rendezvous settings (plus accel's
//! `reconnect_grace`, `store_ports` and `store_max_bytes`), parsed strictly:
//! an unknown key or a key without a value is an error that names it.

use std::time::Duration;

use accel_input::excerpt;
use accel_input::parse_duration;

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
    /// How long a node keeps its workers without any rendezvous while more
    /// than half of its round (itself included) hears each other through
    /// the round's peer hub: the longest control-plane outage a job rides
    /// out (accel's own key; the rendezvous holds the round's places as
    /// long).
    pub outage_timeout: Duration,
    /// torchrun 2.15's `cas_backoff_max_seconds` (its random wait after a
    /// lost write to the shared rendezvous state): here, the longest wait
    /// (before jitter) between attempts to reach a rendezvous that does
    /// not answer. `None` (or torchrun's default, 0): accel's 1 s.
    pub cas_backoff_max: Option<Duration>,
    /// How long a finished job's outcome is kept for nodes that come back
    /// late (accel's own key; 0: not kept). Served by the agent that hosts
    /// the rendezvous, and by agent-only leaders on etcd.
    pub tombstone_ttl: Duration,
    /// File holding the rendezvous token (accel's own key; else the
    /// variable `ACCEL_RDZV_TOKEN` holds it).
    pub token_file: Option<std::path::PathBuf>,
    /// TLS files (accel's keys `tls_ca`, `tls_cert`, `tls_key`; else the
    /// variables `ACCEL_RDZV_TLS_CA`, `_CERT`, `_KEY`).
    pub tls: accel_wire::tls::ClientTlsFiles,
    /// Ports the worker store may take, rotated through round by round
    /// (accel's own key; `None`: any free port).
    pub store_ports: Option<PortRange>,
    /// Most bytes of keys and values the worker store holds (accel's own key).
    pub store_max_bytes: u64,
    /// How etcd is reached (`--rdzv-backend etcd`).
    pub etcd: EtcdConf,
}

/// The etcd settings of an agent-only rendezvous: torchrun's keys for its
/// etcd backends (`protocol`, `cacert`, `cert`, `key` and `etcd_prefix`;
/// etcd-v2's `ca_cert`, `ssl_cert`, `ssl_cert_key` as well) and accel's
/// `etcd_lease`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConf {
    /// `https` (else `http`).
    pub https: bool,
    /// CA that signed the etcd members' certificates.
    pub ca: Option<std::path::PathBuf>,
    /// This agent's client certificate for etcd (with `key`).
    pub cert: Option<std::path::PathBuf>,
    /// The key of `cert`.
    pub key: Option<std::path::PathBuf>,
    /// Where in etcd the job's election and state live (the job id is
    /// appended).
    pub prefix: String,
    /// Lease of an agent's candidacy: how long a hosting agent that vanished
    /// keeps its place before another takes over (whole seconds).
    pub lease: Duration,
    /// Whether any key above was given (they mean nothing to other backends).
    pub given: bool,
}

impl Default for EtcdConf {
    fn default() -> Self {
        Self {
            https: false,
            ca: None,
            cert: None,
            key: None,
            prefix: "/accel/agents".into(),
            lease: Duration::from_secs(5),
            given: false,
        }
    }
}

impl EtcdConf {
    /// The URL scheme of the etcd endpoints.
    pub fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }
}

/// An inclusive range of at least two ports, `A-B`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// The first port.
    pub first: u16,
    /// The last port (greater than `first`).
    pub last: u16,
}

impl PortRange {
    /// Number of ports.
    pub fn ports(&self) -> u32 {
        u32::from(self.last - self.first) + 1
    }

    /// Parses `A-B`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let how = "write it as FIRST-LAST, e.g. store_ports=29500-29599";
        let (a, b) = s
            .split_once('-')
            .ok_or_else(|| format!("'{s}' is not a range; {how}"))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("'{}' is not a port (1-65535); {how}", p.trim()))
        };
        let (first, last) = (port(a)?, port(b)?);
        if first >= last {
            return Err(format!(
                "'{s}' must name at least two ports, the first below the last, so each round can take a fresh one; {how}"
            ));
        }
        Ok(Self { first, last })
    }
}

/// Parses a byte count: plain bytes, or with a binary suffix (`KiB`, `MiB`,
/// `GiB`, also written `K`, `M`, `G`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => {
            return Err(format!(
                "'{s}' has an unknown unit; use bytes or KiB, MiB, GiB"
            ))
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{s}' is not a positive byte count (e.g. 1073741824 or 1GiB)"))
}

/// The default `outage_timeout`: a job rides out a control-plane outage of
/// up to 15 minutes (a restart, a failover, an etcd quorum loss and repair).
pub(super) const DEFAULT_OUTAGE_TIMEOUT: Duration = Duration::from_secs(900);

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
            outage_timeout: DEFAULT_OUTAGE_TIMEOUT,
            cas_backoff_max: None,
            tombstone_ttl: accel_wire::limits::DEFAULT_TOMBSTONE_TTL,
            token_file: None,
            tls: Default::default(),
            store_ports: None,
            store_max_bytes: accel_worker_store::state::DEFAULT_MAX_BYTES,
            etcd: EtcdConf::default(),
        }
    }
}

const RDZV_KEYS: &str = "join_timeout, last_call_timeout, close_timeout, keep_alive_interval, \
                         keep_alive_max_attempt, read_timeout, is_host, timeout, reconnect_grace, \
                         outage_timeout, cas_backoff_max_seconds, store_type, tombstone_ttl, token_file, tls_ca, tls_cert, tls_key, store_ports, store_max_bytes; \
                         for --rdzv-backend etcd: protocol, cacert, cert, key, etcd_prefix, etcd_lease";

impl RdzvConf {
    /// Parses `k1=v1,k2=v2`; unknown keys and keys without a value are errors.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                let item = excerpt(item);
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
                "outage_timeout" => c.outage_timeout = dur(value)?,
                // torch's c10d backend keeps its state in a TCPStore
                // (`tcp`, its default) or a FileStore (`file`); accel's
                // rendezvous is its own server, reached over TCP.
                "store_type" => match value.to_ascii_lowercase().as_str() {
                    "tcp" => {}
                    other => {
                        return Err(bad(format!(
                            "--rdzv-conf store_type '{}' is not supported: accel's c10d rendezvous is an rdzv-server (or the agent hosting one) reached over TCP; use store_type=tcp or leave it out",
                            excerpt(other)
                        )))
                    }
                },
                "cas_backoff_max_seconds" => {
                    let d = dur(value)?;
                    c.cas_backoff_max = (!d.is_zero()).then_some(d);
                }
                "tombstone_ttl" => c.tombstone_ttl = dur(value)?,
                "store_ports" => {
                    c.store_ports = Some(
                        PortRange::parse(value)
                            .map_err(|e| bad(format!("--rdzv-conf store_ports: {e}")))?,
                    )
                }
                "store_max_bytes" => {
                    c.store_max_bytes = parse_bytes(value)
                        .map_err(|e| bad(format!("--rdzv-conf store_max_bytes: {e}")))?
                }
                "token_file" if value.is_empty() => {
                    return Err(bad("--rdzv-conf token_file needs a path"))
                }
                "token_file" => c.token_file = Some(value.into()),
                "tls_ca" | "tls_cert" | "tls_key" if value.is_empty() => {
                    return Err(bad(format!("--rdzv-conf {key} needs a path")))
                }
                "tls_ca" => c.tls.ca = Some(value.into()),
                "tls_cert" => c.tls.cert = Some(value.into()),
                "tls_key" => c.tls.key = Some(value.into()),
                "protocol" => {
                    c.etcd.given = true;
                    c.etcd.https = match value {
                        "http" => false,
                        "https" => true,
                        other => {
                            return Err(bad(format!(
                                "--rdzv-conf protocol '{}' is unknown; use http or https",
                                excerpt(other)
                            )))
                        }
                    }
                }
                "cacert" | "ca_cert" | "cert" | "ssl_cert" | "key" | "ssl_cert_key"
                    if value.is_empty() =>
                {
                    return Err(bad(format!("--rdzv-conf {key} needs a path")))
                }
                "cacert" | "ca_cert" => (c.etcd.ca, c.etcd.given) = (Some(value.into()), true),
                "cert" | "ssl_cert" => (c.etcd.cert, c.etcd.given) = (Some(value.into()), true),
                "key" | "ssl_cert_key" => (c.etcd.key, c.etcd.given) = (Some(value.into()), true),
                "etcd_prefix" => {
                    if !value.starts_with('/') || value.len() < 2 || value.ends_with('/') {
                        return Err(bad(format!(
                            "--rdzv-conf etcd_prefix '{}' must start with '/', name something and not end with '/', e.g. /accel/agents",
                            excerpt(value)
                        )));
                    }
                    (c.etcd.prefix, c.etcd.given) = (value.to_owned(), true);
                }
                "etcd_lease" => {
                    let lease = dur(value)?;
                    if lease < Duration::from_secs(1) || lease.subsec_nanos() != 0 {
                        return Err(bad(format!(
                            "--rdzv-conf etcd_lease '{}': etcd leases are whole seconds, at least 1",
                            excerpt(value)
                        )));
                    }
                    (c.etcd.lease, c.etcd.given) = (lease, true);
                }
                "keep_alive_max_attempt" => {
                    c.keep_alive_max_attempt =
                        value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            bad(format!(
                            "--rdzv-conf keep_alive_max_attempt: '{}' is not a positive integer",
                            excerpt(value)
                        ))
                        })?
                }
                "is_host" => {
                    c.is_host = Some(parse_bool(value).ok_or_else(|| {
                        bad(format!(
                            "--rdzv-conf is_host: '{}' is not a boolean; use true or false",
                            excerpt(value)
                        ))
                    })?)
                }
                other => {
                    return Err(bad(format!(
                        "--rdzv-conf: unknown key '{}'; known keys: {RDZV_KEYS}",
                        excerpt(other)
                    )))
                }
            }
        }
        if !c.etcd.https && (c.etcd.ca.is_some() || c.etcd.cert.is_some()) {
            return Err(bad(
                "--rdzv-conf cacert, cert and key are for TLS to etcd: add protocol=https",
            ));
        }
        if c.etcd.cert.is_some() != c.etcd.key.is_some() {
            return Err(bad(
                "--rdzv-conf cert and key go together: give both, or neither",
            ));
        }
        if c.read_timeout.is_zero() {
            return Err(bad("--rdzv-conf read_timeout must be greater than 0"));
        }
        if c.keep_alive_interval.is_zero() {
            return Err(bad(
                "--rdzv-conf keep_alive_interval must be greater than 0",
            ));
        }
        Ok(c)
    }

    /// How long the server may hear nothing from this node before dropping
    /// it: `keep_alive_interval × keep_alive_max_attempt`, at most the ten
    /// years the server accepts (each factor is bounded, their product is
    /// not: 100 days × 4e9 attempts once wrapped around as u64 ms).
    pub fn dead_after(&self) -> Duration {
        self.keep_alive_interval
            .saturating_mul(self.keep_alive_max_attempt)
            .min(accel_input::MAX_DURATION)
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
