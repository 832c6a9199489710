//! `accel tpu-config`: run setup commands on every worker of a TPU pod
//! through `gcloud`, as `accelerate tpu-config` does (reference: accelerate
//! §1.8).
//!
//! The command is accelerate's, argument for argument, so scripts and docs
//! written for accelerate keep working: `gcloud [alpha] compute tpus tpu-vm
//! ssh NAME --zone ZONE --command "cd /usr/share; [pip install …;] cmd1; …"
//! --worker all`. Values come from the flags, else from the configuration
//! file (`tpu_name`, `tpu_zone`, `commands`, `command_file`), with
//! accelerate's precedence: a command file (flag or file) replaces any
//! commands; each `--command` value is one command; a command file gives one
//! command per line. `--debug` prints `Running <argv joined by spaces>`
//! exactly as accelerate prints it, without running anything.
//!
//! Where accel is stricter than accelerate, on purpose: a missing TPU name or
//! zone, a missing `gcloud` and a failing `gcloud` are errors that say what
//! to do (accelerate raises a Python `TypeError` or `FileNotFoundError`, and
//! reports success whatever `gcloud` returned).

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Map, Value};

/// `accel tpu-config` arguments (accelerate's spellings).
#[derive(Debug, Clone, clap::Args)]
pub struct TpuArgs {
    /// accelerate's configuration file.
    #[arg(long = "config_file", alias = "config-file")]
    pub config_file: Option<PathBuf>,
    /// The TPU's name (default: `tpu_name` from the configuration file).
    #[arg(long = "tpu_name", alias = "tpu-name")]
    pub tpu_name: Option<String>,
    /// The TPU's zone (default: `tpu_zone` from the configuration file).
    #[arg(long = "tpu_zone", alias = "tpu-zone")]
    pub tpu_zone: Option<String>,
    /// Use `gcloud alpha` instead of `gcloud`.
    #[arg(long = "use_alpha", alias = "use-alpha")]
    pub use_alpha: bool,
    /// A file with the commands to run on the pod, one per line.
    #[arg(long = "command_file", alias = "command-file")]
    pub command_file: Option<PathBuf>,
    /// A command to run on the pod; may be given several times, each value is
    /// one command.
    #[arg(long, num_args = 1.., action = clap::ArgAction::Append)]
    pub command: Vec<String>,
    /// Install accelerate on the pod first.
    #[arg(long = "install_accelerate", alias = "install-accelerate")]
    pub install_accelerate: bool,
    /// The accelerate to install: `latest`, `dev` (from GitHub) or a version.
    #[arg(
        long = "accelerate_version",
        alias = "accelerate-version",
        default_value = "latest"
    )]
    pub accelerate_version: String,
    /// Print the command instead of running it.
    #[arg(long)]
    pub debug: bool,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub enum TpuError {
    /// Nothing to run.
    #[error("you must specify either a command file or a command to run on the pod (--command, --command_file, or `commands`/`command_file` in the configuration file)")]
    NoCommand,
    /// No TPU name from the flags or the configuration file.
    #[error("no TPU name: pass --tpu_name or set tpu_name in the configuration file")]
    NoTpuName,
    /// No TPU zone from the flags or the configuration file.
    #[error("no TPU zone: pass --tpu_zone or set tpu_zone in the configuration file")]
    NoTpuZone,
    /// A configuration value of the wrong type.
    #[error("`{key}` in the configuration file must be {expected}")]
    BadConfig {
        /// The key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// `--accelerate_version` that is not `latest`, `dev` nor a PEP 440 version.
    #[error("invalid --accelerate_version `{0}`: use `latest`, `dev` or a version such as 1.2.0")]
    BadVersion(String),
    /// The command file could not be read.
    #[error("cannot read the command file {}: {source}", path.display())]
    CommandFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No `gcloud` on PATH.
    #[error("`gcloud` was not found on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or pass --debug to print the command instead")]
    NoGcloud,
    /// `gcloud` could not be started.
    #[error("cannot run {}: {source}", path.display())]
    Spawn {
        /// The `gcloud` found on PATH.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `gcloud` ran and failed.
    #[error("gcloud failed ({0}); the pod was not set up")]
    Failed(std::process::ExitStatus),
}

/// Runs the command; returns the text to print.
pub fn run(
    args: &TpuArgs,
    config: Option<&Map<String, Value>>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, TpuError> {
    let argv = gcloud_argv(args, config)?;
    if args.debug {
        return Ok(format!("Running {}", argv.join(" ")));
    }
    let gcloud = super::find_program("gcloud", env).ok_or(TpuError::NoGcloud)?;
    let status = Command::new(&gcloud)
        .args(&argv[1..])
        .status()
        .map_err(|source| TpuError::Spawn {
            path: gcloud.clone(),
            source,
        })?;
    if !status.success() {
        return Err(TpuError::Failed(status));
    }
    Ok("Successfully setup pod.".into())
}

/// The `gcloud` argv accelerate builds for these flags and configuration.
fn gcloud_argv(
    args: &TpuArgs,
    config: Option<&Map<String, Value>>,
) -> Result<Vec<String>, TpuError> {
    let given = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let mut name = given(&args.tpu_name);
    let mut zone = given(&args.tpu_zone);
    let mut command_file = args
        .command_file
        .clone()
        .filter(|p| !p.as_os_str().is_empty());
    let mut commands = args.command.clone();
    if let Some(config) = config {
        if command_file.is_none() && commands.is_empty() {
            command_file = config_str(config, "command_file")?.map(PathBuf::from);
        }
        if commands.is_empty() {
            commands = config_commands(config)?;
        }
        name = name.or(config_str(config, "tpu_name")?);
        zone = zone.or(config_str(config, "tpu_zone")?);
    }
    let package = install_spec(&args.accelerate_version)?;
    if command_file.is_none() && commands.is_empty() {
        return Err(TpuError::NoCommand);
    }
    if let Some(path) = command_file {
        let text = std::fs::read_to_string(&path)
            .map_err(|source| TpuError::CommandFile { path, source })?;
        commands = py_splitlines(&text);
    }
    let mut steps = vec!["cd /usr/share".to_owned()];
    if args.install_accelerate {
        steps.push(format!("pip install {package}"));
    }
    steps.extend(commands);
    let mut argv = vec!["gcloud".to_owned()];
    if args.use_alpha {
        argv.push("alpha".into());
    }
    argv.extend(["compute", "tpus", "tpu-vm", "ssh"].map(String::from));
    argv.push(name.ok_or(TpuError::NoTpuName)?);
    argv.push("--zone".into());
    argv.push(zone.ok_or(TpuError::NoTpuZone)?);
    argv.push("--command".into());
    argv.push(steps.join("; "));
    argv.extend(["--worker", "all"].map(String::from));
    Ok(argv)
}

/// A string value of the configuration (empty and `null` count as absent).
fn config_str(config: &Map<String, Value>, key: &'static str) -> Result<Option<String>, TpuError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
        Some(_) => Err(TpuError::BadConfig {
            key,
            expected: "a string",
        }),
    }
}

/// The configuration's `commands`: a list of commands (a lone string is one).
fn config_commands(config: &Map<String, Value>) -> Result<Vec<String>, TpuError> {
    let bad = TpuError::BadConfig {
        key: "commands",
        expected: "a list of strings",
    };
    match config.get("commands") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or(bad),
        Some(_) => Err(bad),
    }
}

/// What `pip install` gets for `--accelerate_version`, as accelerate maps it.
fn install_spec(version: &str) -> Result<String, TpuError> {
    match version {
        "dev" => Ok("git+https://github.com/huggingface/accelerate.git".into()),
        "latest" => Ok("accelerate -U".into()),
        v if is_pep440(v) => Ok(format!("accelerate=={v}")),
        v => Err(TpuError::BadVersion(v.to_owned())),
    }
}

/// Whether `text` is a version `packaging.version.parse` accepts (PEP 440,
/// case-insensitive, optional `v` prefix and surrounding whitespace).
fn is_pep440(text: &str) -> bool {
    text.trim().parse::<pep440_rs::Version>().is_ok()
}

/// The characters Python's `str.splitlines()` ends lines at (`\r\n` aside).
const LINE_ENDS: [char; 10] = [
    '\n', '\r', '\x0b', '\x0c', '\x1c', '\x1d', '\x1e', '\u{85}', '\u{2028}', '\u{2029}',
];

/// Python's `str.splitlines()`: lines without their ends, no empty last line.
fn py_splitlines(text: &str) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    let mut lines: Vec<String> = text.split(LINE_ENDS).map(str::to_owned).collect();
    if text.is_empty() || text.ends_with(LINE_ENDS) {
        lines.pop();
    }
    lines
}

#[cfg(test)]
mod tests;
