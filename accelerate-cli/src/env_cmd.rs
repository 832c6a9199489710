//! `accel env`: the environment report users paste into bug reports
//! (reference: accelerate §4.1).
//!
//! The text has accelerate's layout and field names, so maintainers read it
//! as they read `accelerate env`: a blank line, the "Copy-and-paste" line,
//! `- key: value` lines, then the configuration as tab-indented items in the
//! order of accelerate's config class, each value spelled as Python prints
//! it ([`crate::pyvalue`]). Dictionary values keep the file's key order, as Python's
//! dicts do (serde_json's `preserve_order`, enabled for the workspace).
//!
//! The versions come from the Python environment a launched script would
//! use (`PYTHON_EXEC`, else `python3`), asked once through [`probe`]. accel
//! runs without Python, so nothing here may fail for lack of it: absent
//! packages read `not installed`, the accelerator `N/A`, and the platform
//! and memory come from the kernel (`/proc`) instead.
//!
//! Two lines differ from accelerate's, because they describe the tool
//! itself: `` - `accel` version: `` follows accelerate's version line, and
//! `` - `accel` location: `` (this binary) replaces accelerate's
//! `` - `accelerate` bash location: `` (what `which accelerate` finds).

pub mod probe;

use crate::{python, pyvalue};
use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::config_file::{self, AccelerateConfig, LoadError};

/// Why `accel env` failed: only an unusable configuration file (accelerate
/// fails there too); a missing Python is reported in the text instead.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// `--config_file` (or the default file) could not be loaded.
    #[error(transparent)]
    Config(#[from] LoadError),
}

/// How long the Python probe may take (importing torch on a slow disk).
const PROBE_LIMIT: Duration = Duration::from_secs(120);

/// What a missing package or interpreter reads as.
const NOT_INSTALLED: &str = "not installed";

/// Returns the text to print.
pub fn run(
    config_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EnvError> {
    let config = config_file::load_optional(config_file, env)?;
    let program = python::interpreter(env);
    let probe = python::run(&program, probe::SCRIPT, PROBE_LIMIT)
        .map_err(|e| match e {
            python::PythonError::NotFound(_) => None,
            other => Some(other.to_string()),
        })
        .and_then(|out| probe::parse(&out).map_err(|e| Some(e.to_string())));
    let facts = Facts::new(probe, &Host::current());
    Ok(render(&facts, config.as_ref(), config_file.is_some()))
}

/// What accel knows without Python.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// `<OS>-<kernel release>-<machine>`, like Python's platform string
    /// without the C library part.
    pub platform: String,
    /// Total memory in bytes, from `/proc/meminfo`.
    pub ram: Option<u64>,
    /// This binary.
    pub location: Option<String>,
}

impl Host {
    /// This machine and binary.
    pub fn current() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        let os = read("/proc/sys/kernel/ostype").unwrap_or_else(|| std::env::consts::OS.into());
        let platform = match read("/proc/sys/kernel/osrelease") {
            Some(release) => format!("{os}-{release}-{}", std::env::consts::ARCH),
            None => format!("{os}-{}", std::env::consts::ARCH),
        };
        let ram = read("/proc/meminfo").and_then(|m| meminfo_total(&m));
        let location = std::env::current_exe()
            .ok()
            .map(|p| p.display().to_string());
        Self {
            platform,
            ram,
            location,
        }
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes (what psutil reports on Linux).
fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The report's `- key: value` lines, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// (key, value) pairs.
    pub lines: Vec<(String, String)>,
}

impl Facts {
    /// Combines the probe's answer (`Err(None)`: no Python; `Err(Some(why))`:
    /// Python failed) with what accel knows itself.
    pub fn new(probe: Result<probe::Probe, Option<String>>, host: &Host) -> Self {
        let missing = match &probe {
            Err(Some(why)) => format!("unknown ({why})"),
            _ => NOT_INSTALLED.to_owned(),
        };
        let p = probe.unwrap_or_default();
        let or_missing = |v: Option<String>| v.unwrap_or_else(|| missing.clone());
        let ram = p.ram.or(host.ram).map_or_else(
            || "N/A".to_owned(),
            |b| format!("{:.2} GB", b as f64 / 1024f64.powi(3)),
        );
        let accelerator = p.accelerator.unwrap_or_else(|| "N/A".into());
        let location = host.location.clone().unwrap_or_else(|| "Not found".into());
        let mut lines: Vec<(String, String)> = [
            ("`Accelerate` version", or_missing(p.accelerate)),
            ("`accel` version", env!("CARGO_PKG_VERSION").to_owned()),
            (
                "Platform",
                p.platform.unwrap_or_else(|| host.platform.clone()),
            ),
            ("`accel` location", location),
            ("Python version", or_missing(p.python)),
            ("Numpy version", or_missing(p.numpy)),
            ("PyTorch version", or_missing(p.torch)),
            ("PyTorch accelerator", accelerator),
            ("System RAM", ram),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let Some(device) = p.device {
            lines.push(device);
        }
        Self { lines }
    }
}

/// The printed text (without the final newline).
pub fn render(facts: &Facts, config: Option<&AccelerateConfig>, explicit: bool) -> String {
    let mut out = vec![
        String::new(),
        "Copy-and-paste the text below in your GitHub issue".to_owned(),
        String::new(),
    ];
    out.extend(facts.lines.iter().map(|(k, v)| format!("- {k}: {v}")));
    out.push(
        if explicit {
            "- `Accelerate` config passed:"
        } else {
            "- `Accelerate` default config:"
        }
        .to_owned(),
    );
    match config {
        None => out.push("\tNot found".to_owned()),
        Some(c) => out.extend(
            ordered(c)
                .into_iter()
                .map(|(k, v)| format!("\t- {k}: {}", pyvalue::str_of(&v))),
        ),
    }
    out.join("\n")
}

/// `to_dict()` items in the class's field order (accelerate iterates a
/// Python dict, which keeps the order the dataclass set its fields in).
fn ordered(config: &AccelerateConfig) -> Vec<(String, Value)> {
    let mut dict: Map<String, Value> = config.to_dict();
    let fields = if config.sagemaker {
        config_file::SAGEMAKER_FIELDS
    } else {
        config_file::CLUSTER_FIELDS
    };
    let mut items: Vec<(String, Value)> = fields
        .iter()
        .filter_map(|(name, _)| dict.remove(*name).map(|v| ((*name).to_owned(), v)))
        .collect();
    // Nothing else should be left; keep it visible if it is.
    items.extend(dict);
    items
}

#[cfg(test)]
mod tests;
