//! Node health: checks a node passes before it offers itself for a round
//! and, with `--health-check-interval`, while it waits as a spare or its
//! workers run, so a node with a broken GPU, NIC or filesystem is taken out
//! of the job instead of joining rounds only to fail them.
//!
//! # The checks
//! Each is on by its flag; all that are on run at once, together bounded by
//! `--health-check-timeout`, and the node is healthy when every one passes.
//! A failure names its check and what it saw.
//! - `--health-check CMD`: the user's command ([`command`]).
//! - `--health-check-nic IFACES|auto`: link state and errors of the network
//!   interfaces and InfiniBand ports the collectives use, read from sysfs
//!   ([`nic`]).
//! - `--health-check-storage PATH`: a write, fsync, read-back and delete of
//!   a file in `PATH` ([`storage`]).
//! - `--health-check-gpu`: `nvidia-smi`'s view of every GPU (persistence
//!   mode, uncorrectable ECC errors, retired or remapped memory waiting for
//!   a reset) and the fatal XID events in the kernel log ([`gpu`]).
//! - `--health-check-endpoint ADDR`: a node health daemon's verdict, over a
//!   Unix socket or HTTP ([`endpoint`]).
//!
//! # When they run
//! - **Before joining**: a node that fails waits outside the job,
//!   re-checking with a doubling wait ([`RECHECK_FIRST`] to
//!   [`RECHECK_MAX`]), and joins once every check passes.
//! - **Between rounds**: before a node that is already a member offers
//!   itself for the next round; a failure makes it leave the job first, so
//!   an elastic (`MIN:MAX`) job re-forms without it.
//! - **Periodically** (`--health-check-interval`): while the node forms,
//!   waits as a spare or runs a round. A failure mid-round is first told
//!   to the rendezvous (the round re-forms at once: for the others a
//!   membership change, no restart of `--max-restarts` spent), then stops
//!   this node's workers (SIGTERM, then SIGKILL after `--shutdown-timeout`
//!   or the drop limit less its margin, whichever is shorter: the
//!   re-formed round forms without this node no sooner than a drop limit
//!   after the restart, so its workers are gone before a spare takes its
//!   node rank), then leaves the job, saying why; with a quarantine policy
//!   its host is benched. At most one check runs at a time (the check
//!   before an offer takes over a periodic run in flight): the next starts
//!   an interval after the last one ended.
//!
//! Leaving with a reason puts the reason where operators look: the other
//! nodes' restart line, `rdzv-server status`, the status page and a
//! quarantine's reason. The agent counts every check's results
//! (`accel_agent_health_checks`) and shows which fail now
//! (`accel_agent_health_check_failing`).

pub mod command;
pub mod endpoint;
pub mod gpu;
pub mod nic;
pub mod storage;

use std::path::PathBuf;
use std::time::Duration;

/// How long the checks may run unless `--health-check-timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The first wait before checking an unhealthy node again.
pub const RECHECK_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between checks.
pub const RECHECK_MAX: Duration = Duration::from_secs(30);

/// The health flags as given; [`HealthFlags::resolve`] checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthFlags {
    /// `--health-check CMD`.
    pub command: Option<String>,
    /// `--health-check-timeout`.
    pub timeout: Duration,
    /// `--health-check-nic IFACES|auto`.
    pub nic: Option<String>,
    /// `--health-check-sysfs`.
    pub sysfs: PathBuf,
    /// `--health-check-storage PATH`.
    pub storage: Option<PathBuf>,
    /// `--health-check-gpu`.
    pub gpu: bool,
    /// `--health-check-kernel-log` (`None`: `none`, not read).
    pub kernel_log: Option<PathBuf>,
    /// `--health-check-endpoint ADDR`.
    pub endpoint: Option<endpoint::Endpoint>,
    /// `--health-check-interval` (`None`: off).
    pub interval: Option<Duration>,
}

impl Default for HealthFlags {
    fn default() -> Self {
        Self {
            command: None,
            timeout: DEFAULT_TIMEOUT,
            nic: None,
            sysfs: "/sys".into(),
            storage: None,
            gpu: false,
            kernel_log: Some("/dev/kmsg".into()),
            endpoint: None,
            interval: None,
        }
    }
}

impl HealthFlags {
    /// The checks these flags turn on (`None`: none is), or what is wrong
    /// with them; `env` looks up the agent's environment (`auto` NIC
    /// selection) and `PATH`.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<HealthCheck>, String> {
        let nic = match self.nic.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(spec) => Some(nic::NicCheck::new(spec, &self.sysfs, env)?),
        };
        let gpu = match self.gpu {
            false => None,
            true => Some(gpu::GpuCheck {
                smi: crate::probe::find_program(
                    "nvidia-smi",
                    env("PATH").as_deref().map(std::ffi::OsStr::new),
                ).ok_or(
                    "--health-check-gpu: nvidia-smi is not on PATH (install the NVIDIA driver's tools, or drop the flag on nodes without GPUs)",
                )?,
                kernel_log: self.kernel_log.clone(),
            }),
        };
        if let Some(p) = &self.storage {
            if !p.is_absolute() {
                return Err(format!(
                    "--health-check-storage {}: give an absolute path (the check writes a test file there)",
                    p.display()
                ));
            }
        }
        let check = HealthCheck {
            command: self.command.clone().filter(|c| !c.trim().is_empty()),
            nic,
            storage: self.storage.clone(),
            gpu,
            endpoint: self.endpoint.clone(),
            timeout: self.timeout,
            interval: self.interval.filter(|i| !i.is_zero()),
        };
        if !check.any() {
            if check.interval.is_some() {
                return Err("--health-check-interval needs a check to run (--health-check, --health-check-nic, --health-check-storage, --health-check-gpu or --health-check-endpoint)".into());
            }
            return Ok(None);
        }
        if let Some(i) = check.interval {
            if i < MIN_INTERVAL {
                return Err(format!(
                    "--health-check-interval {:.1} s: at least {} s (each check costs a process, a file or a query)",
                    i.as_secs_f64(),
                    MIN_INTERVAL.as_secs()
                ));
            }
        }
        Ok(Some(check))
    }
}

/// The shortest `--health-check-interval`.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The checks a node passes (those that are on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `--health-check`: the shell command.
    pub command: Option<String>,
    /// `--health-check-nic`.
    pub nic: Option<nic::NicCheck>,
    /// `--health-check-storage`.
    pub storage: Option<PathBuf>,
    /// `--health-check-gpu`.
    pub gpu: Option<gpu::GpuCheck>,
    /// `--health-check-endpoint`.
    pub endpoint: Option<endpoint::Endpoint>,
    /// How long all of them may take.
    pub timeout: Duration,
    /// `--health-check-interval`: how often they run while the node is a
    /// member (`None`: only before it offers itself).
    pub interval: Option<Duration>,
}

impl HealthCheck {
    /// No check, for `timeout`: the flags fill it in.
    pub fn none(timeout: Duration) -> Self {
        Self {
            command: None,
            nic: None,
            storage: None,
            gpu: None,
            endpoint: None,
            timeout,
            interval: None,
        }
    }

    /// Only `--health-check CMD`.
    pub fn command(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: Some(command.into()),
            ..Self::none(timeout)
        }
    }

    /// Whether any check is on.
    pub fn any(&self) -> bool {
        self.command.is_some()
            || self.nic.is_some()
            || self.storage.is_some()
            || self.gpu.is_some()
            || self.endpoint.is_some()
    }

    /// Runs every check that is on, at once, within the timeout.
    pub async fn run(&self) -> Verdict {
        let t = self.timeout;
        let (a, b, c, d, e) = tokio::join!(
            async {
                match &self.command {
                    // The command's runner bounds it itself (and kills it).
                    Some(cmd) => Some(("command", command::run(cmd, t).await)),
                    None => None,
                }
            },
            async {
                match &self.nic {
                    Some(n) => {
                        // sysfs reads block (a FUSE mount at
                        // --health-check-sysfs could hang them).
                        let n = n.clone();
                        let read = async move {
                            tokio::task::spawn_blocking(move || n.check())
                                .await
                                .unwrap_or_else(|e| Err(format!("nic: the check failed: {e}")))
                        };
                        Some(bounded("nic", t, read).await)
                    }
                    None => None,
                }
            },
            async {
                match &self.storage {
                    Some(p) => Some(bounded("storage", t, storage::check(p.clone())).await),
                    None => None,
                }
            },
            async {
                match &self.gpu {
                    Some(g) => Some(bounded("gpu", t, g.check()).await),
                    None => None,
                }
            },
            async {
                match &self.endpoint {
                    Some(ep) => Some(bounded("endpoint", t, ep.check()).await),
                    None => None,
                }
            },
        );
        Verdict {
            results: [a, b, c, d, e].into_iter().flatten().collect(),
        }
    }
}

/// `f`, or a failure naming `name` if it does not finish within `t`.
async fn bounded(
    name: &'static str,
    t: Duration,
    f: impl std::future::Future<Output = Result<(), String>>,
) -> (&'static str, Result<(), String>) {
    match tokio::time::timeout(t, f).await {
        Ok(r) => (name, r),
        Err(_) => (
            name,
            Err(format!(
                "{name}: no answer within {:.0} s (--health-check-timeout)",
                t.as_secs_f64()
            )),
        ),
    }
}

/// What one run of the checks found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Each check that ran, by name, and how it went.
    pub results: Vec<(&'static str, Result<(), String>)>,
}

impl Verdict {
    /// `Ok` when every check passed, else every failure, `; `-separated.
    pub fn overall(&self) -> Result<(), String> {
        let failed: Vec<&str> = self
            .results
            .iter()
            .filter_map(|(_, r)| r.as_ref().err().map(String::as_str))
            .collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join("; ")),
        }
    }
}

/// The wait before check number `failed + 1` after `failed` failures.
pub fn recheck_after(failed: u32) -> Duration {
    RECHECK_FIRST
        .saturating_mul(1u32 << failed.saturating_sub(1).min(16))
        .min(RECHECK_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rechecks_back_off_to_a_bound() {
        assert_eq!(recheck_after(1), Duration::from_secs(1));
        assert_eq!(recheck_after(2), Duration::from_secs(2));
        assert_eq!(recheck_after(3), Duration::from_secs(4));
        assert_eq!(recheck_after(100), RECHECK_MAX);
    }

    #[tokio::test]
    async fn every_check_that_is_on_runs_and_every_failure_is_said() {
        let dir = tempfile::tempdir().expect("dir");
        let mut check = HealthCheck::command("echo the fan stopped; exit 1", DEFAULT_TIMEOUT);
        check.storage = Some(dir.path().join("missing"));
        let v = check.run().await;
        assert_eq!(
            v.results.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["command", "storage"]
        );
        let e = v.overall().expect_err("both fail");
        assert!(
            e.contains("the fan stopped") && e.contains("; storage "),
            "{e}"
        );
        check.command = Some("true".into());
        check.storage = Some(dir.path().into());
        assert_eq!(check.run().await.overall(), Ok(()));
    }

    #[tokio::test]
    async fn a_check_that_does_not_answer_in_time_fails_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        let sock = dir.path().join("quiet.sock");
        // A daemon that accepts and never answers.
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let mut check = HealthCheck::none(Duration::from_millis(300));
        check.endpoint = Some(endpoint::Endpoint::Unix(sock));
        let e = check.run().await.overall().expect_err("silent");
        assert!(
            e.starts_with("endpoint") && e.contains("--health-check-timeout"),
            "{e}"
        );
    }
}
