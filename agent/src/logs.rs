//! Where each worker's stdout and stderr go: torchrun's `--redirects`,
//! `--tee`, `--log-dir`, `--log-line-prefix-template` and
//! `--local-ranks-filter`, plus a global-ranks filter.
//!
//! Per stream of a worker, the pure [`LogSpec::sinks`] picks one [`Sink`]:
//! - tee'd (`--tee`) or redirected (`--redirects`): a pipe the agent reads
//!   ([`tee`]); every byte goes to `<attempt>/<local_rank>/std{out,err}.log`,
//!   and, when tee'd, whole lines, prefixed, to the agent's console unless a
//!   filter hides the rank;
//! - neither: the agent's console, inherited, or nothing for filtered ranks
//!   (as torchrun).
//!
//! Prefixes apply only to console lines, never to the log files.
//!
//! Redirected streams go through the agent too, not straight to the file as
//! torchrun does, so a log file that cannot be written (a full disk, a quota)
//! costs the logs and never the job: the agent says so once per worker and
//! keeps draining the pipe. A worker writing to a full disk itself gets
//! `ENOSPC` on `print` and fails; a worker whose reader stops dies of SIGPIPE
//! (torchrun's tee did that, and reported SIGPIPE as the root cause).

pub mod filter;
pub mod tee;

use std::collections::BTreeSet;

use accel_input::excerpt;

use crate::config::ConfigError;

/// Which of a worker's streams a flag applies to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streams {
    /// stdout (bit 1).
    pub out: bool,
    /// stderr (bit 2).
    pub err: bool,
}

impl Streams {
    fn from_bits(b: u8) -> Self {
        Self {
            out: b & 1 != 0,
            err: b & 2 != 0,
        }
    }
}

/// A `--redirects`/`--tee` value: `0`–`3` for every local rank, or a map
/// `LOCAL_RANK:BITS,...` (any rank number; ranks not listed get 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdSpec {
    all: u8,
    per_rank: Vec<(u32, u8)>,
}

impl StdSpec {
    /// Parses the flag value; `flag` names the flag in errors.
    pub fn parse(flag: &str, s: &str) -> Result<Self, ConfigError> {
        let bad = || {
            ConfigError(format!(
                "{flag} '{}' is invalid; use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank like 0:3,1:1",
                excerpt(s)
            ))
        };
        let bits = |v: &str| {
            v.trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= 3)
                .ok_or_else(bad)
        };
        let s = s.trim();
        if s.is_empty() {
            return Ok(Self::default());
        }
        if !s.contains(':') {
            return Ok(Self {
                all: bits(s)?,
                per_rank: Vec::new(),
            });
        }
        let mut per_rank = Vec::new();
        for item in s.split(',') {
            let (rank, b) = item.split_once(':').ok_or_else(bad)?;
            let rank: u32 = rank.trim().parse().map_err(|_| bad())?;
            per_rank.push((rank, bits(b)?));
        }
        Ok(Self { all: 0, per_rank })
    }

    /// The streams this applies to for `local_rank`.
    pub fn for_rank(&self, local_rank: u32) -> Streams {
        let b = self
            .per_rank
            .iter()
            .find(|(r, _)| *r == local_rank)
            .map_or(self.all, |(_, b)| *b);
        Streams::from_bits(b)
    }
}

/// Where one stream of one worker goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    /// The agent's own stream.
    Inherit,
    /// Nowhere (a filtered rank that is not redirected).
    Null,
    /// A pipe read by the agent: everything to `file`, and prefixed lines to
    /// the console when `prefix` is set (tee'd and shown).
    Pipe {
        /// The log file, created (0600, never through a link) by the pump.
        file: crate::files::FileAt,
        /// The console prefix; `None`: the rank is filtered from the console.
        prefix: Option<Vec<u8>>,
    },
}

/// What the `${...}` placeholders of a prefix template stand for.
#[derive(Debug, Clone)]
pub struct PrefixVars<'a> {
    /// `${role_name}`.
    pub role_name: &'a str,
    /// `${rank}`: the global rank.
    pub rank: u32,
    /// `${local_rank}`.
    pub local_rank: u32,
    /// `${hostname}`.
    pub hostname: &'a str,
    /// `${node_rank}` (accel's addition).
    pub node_rank: u32,
}

/// torchrun's default console prefix.
pub const DEFAULT_PREFIX: &str = "[${role_name}${local_rank}]:";

/// Substitutes the placeholders; unknown ones stay as written (as Python's
/// `string.Template.safe_substitute`).
pub fn render_prefix(template: &str, v: &PrefixVars<'_>) -> String {
    template
        .replace("${role_name}", v.role_name)
        .replace("${rank}", &v.rank.to_string())
        .replace("${local_rank}", &v.local_rank.to_string())
        .replace("${hostname}", v.hostname)
        .replace("${node_rank}", &v.node_rank.to_string())
}

/// torchrun's built-in `--logs-specs` entry point (`torchrun.logs_specs`
/// group, `DefaultLogsSpecs`), the only one accel has.
pub const DEFAULT_LOGS_SPECS: &str = "default";

/// `--logs-specs NAME`: torchrun loads a Python class registered under that
/// name; the agent runs no Python, so only the built-in one is accepted.
pub fn logs_specs(name: &str) -> Result<String, ConfigError> {
    if name == DEFAULT_LOGS_SPECS {
        return Ok(name.to_owned());
    }
    Err(ConfigError(format!(
        "--logs-specs '{}' names a custom LogsSpecs, a Python class that torchrun loads from the \
         'torchrun.logs_specs' entry points; accel-agent runs no Python, so it cannot load one. \
         Drop the flag (or give '{DEFAULT_LOGS_SPECS}', torchrun's built-in layout, which accel writes) \
         and say where logs go with --log-dir, --redirects, --tee, --local-ranks-filter \
         and --log-line-prefix-template",
        excerpt(name)
    )))
}

/// The logging flags, validated.
#[derive(Debug, Clone, Default)]
pub struct LogSpec {
    /// `--redirects`.
    pub redirects: StdSpec,
    /// `--tee`.
    pub tee: StdSpec,
    /// `--log-line-prefix-template` (or its environment fallback).
    pub prefix_template: Option<String>,
    /// `--local-ranks-filter`: local ranks whose output reaches the console.
    pub local_ranks: Option<BTreeSet<u32>>,
    /// `--ranks-filter`: global ranks whose output reaches the console.
    pub ranks: Option<BTreeSet<u32>>,
    /// `--duplicate-stdout-filters` (`None`: not given).
    pub stdout_filter: Option<filter::LineFilter>,
    /// `--duplicate-stderr-filters` (`None`: not given).
    pub stderr_filter: Option<filter::LineFilter>,
}

/// Parses a comma-separated rank list (empty: no filter).
pub fn parse_ranks(flag: &str, s: &str) -> Result<Option<BTreeSet<u32>>, ConfigError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.split(',')
        .map(|r| {
            r.trim().parse::<u32>().map_err(|_| {
                ConfigError(format!(
                    "{flag} '{}' is invalid: '{}' is not a rank; give ranks like 0,3",
                    excerpt(s),
                    excerpt(r)
                ))
            })
        })
        .collect::<Result<BTreeSet<u32>, _>>()
        .map(Some)
}

impl LogSpec {
    /// Whether a rank's output may reach the console.
    pub fn shown(&self, local_rank: u32, rank: u32) -> bool {
        self.local_ranks
            .as_ref()
            .is_none_or(|s| s.contains(&local_rank))
            && self.ranks.as_ref().is_none_or(|s| s.contains(&rank))
    }

    /// Where the stdout and stderr of the worker `v` describes go, with its
    /// log files in `dir`.
    pub fn sinks(
        &self,
        dir: &std::sync::Arc<crate::files::Dir>,
        v: &PrefixVars<'_>,
    ) -> (Sink, Sink) {
        let (redirect, tee) = (
            self.redirects.for_rank(v.local_rank),
            self.tee.for_rank(v.local_rank),
        );
        let shown = self.shown(v.local_rank, v.rank);
        let prefix = shown.then(|| {
            render_prefix(self.prefix_template.as_deref().unwrap_or(DEFAULT_PREFIX), v).into_bytes()
        });
        let pick = |redirected: bool, teed: bool, name: &str| {
            let file = crate::files::FileAt::new(dir.clone(), name);
            if teed || redirected {
                Sink::Pipe {
                    file,
                    prefix: prefix.clone().filter(|_| teed),
                }
            } else if shown {
                Sink::Inherit
            } else {
                Sink::Null
            }
        };
        (
            pick(redirect.out, tee.out, "stdout.log"),
            pick(redirect.err, tee.err, "stderr.log"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(local_rank: u32, rank: u32) -> PrefixVars<'static> {
        PrefixVars {
            role_name: "trainer",
            rank,
            local_rank,
            hostname: "node7",
            node_rank: 3,
        }
    }

    #[test]
    fn std_specs() {
        let s = StdSpec::parse("--tee", "3").expect("valid");
        assert_eq!(
            s.for_rank(12),
            Streams {
                out: true,
                err: true
            }
        );
        let s = StdSpec::parse("--redirects", "0:1,11:2").expect("valid");
        assert_eq!(
            s.for_rank(0),
            Streams {
                out: true,
                err: false
            }
        );
        assert_eq!(
            s.for_rank(11),
            Streams {
                out: false,
                err: true
            },
            "ranks above 9 work"
        );
        assert_eq!(s.for_rank(5), Streams::default());
        for bad in ["4", "x", "0:", "a:1", "0:1,", "1:7"] {
            let e = StdSpec::parse("--tee", bad).expect_err(bad);
            assert!(e.0.contains("--tee"), "{}", e.0);
        }
    }

    #[test]
    fn prefixes() {
        assert_eq!(render_prefix(DEFAULT_PREFIX, &vars(2, 10)), "[trainer2]:");
        let t = "${hostname}/${node_rank}/${rank}/${local_rank} ${role_name} ${unknown}|";
        assert_eq!(
            render_prefix(t, &vars(1, 9)),
            "node7/3/9/1 trainer ${unknown}|"
        );
    }

    #[test]
    fn sinks_follow_torchrun() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let dir = std::sync::Arc::new(
            crate::files::Dir::open_base(scratch.path(), "--log-dir").expect("open"),
        );
        let at = |name: &str| crate::files::FileAt::new(dir.clone(), name);
        let mut spec = LogSpec {
            tee: StdSpec::parse("--tee", "1").expect("ok"),
            ..Default::default()
        };
        spec.redirects = StdSpec::parse("--redirects", "2").expect("ok");
        let (out, err) = spec.sinks(&dir, &vars(1, 5));
        assert_eq!(
            out,
            Sink::Pipe {
                file: at("stdout.log"),
                prefix: Some(b"[trainer1]:".to_vec())
            }
        );
        assert_eq!(
            err,
            Sink::Pipe {
                file: at("stderr.log"),
                prefix: None
            },
            "redirected only: through the agent to the file, not to the console"
        );
        // Filtered ranks: tee'd output still reaches the file, plain output nothing.
        spec.local_ranks = parse_ranks("--local-ranks-filter", "0").expect("ok");
        let (out, _) = spec.sinks(&dir, &vars(1, 5));
        assert_eq!(
            out,
            Sink::Pipe {
                file: at("stdout.log"),
                prefix: None
            }
        );
        let plain = LogSpec {
            ranks: parse_ranks("--ranks-filter", "0,4").expect("ok"),
            ..Default::default()
        };
        assert_eq!(plain.sinks(&dir, &vars(1, 5)).0, Sink::Null);
        assert_eq!(plain.sinks(&dir, &vars(0, 4)).0, Sink::Inherit);
        assert!(parse_ranks("--local-ranks-filter", "0,x").is_err());
    }
}
