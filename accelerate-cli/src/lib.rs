//! `accel`: Hugging Face Accelerate's command set, run on accel's agent.
//!
//! Each command reads and writes what its accelerate counterpart does (the
//! same configuration file, the same environment for training scripts), so a
//! project can switch by changing the command name. `launch` does not start
//! torchrun: it turns accelerate's flags and configuration into an agent
//! [`Config`](accel_agent::config::Config) and runs the same agent as `accel-agent`.
//!
//! It is its own crate so that the agent, and everything built on it (the
//! `worker-runtime` launcher, the tests' clients), compiles none of it: its
//! YAML reader, questionnaire and probes are used only by `accel`. What it
//! takes from the agent is narrow and one-way: the agent's flags and
//! [`Config`](accel_agent::config::Config), `parse_nnodes` and the GPU count
//! ([`accel_agent::config`]), and the store's client side for `accel test`.

#![forbid(unsafe_code)]

pub mod config_file;
pub mod env_cmd;
pub mod estimate;
pub mod launch;
pub mod python;
pub mod pyvalue;
pub mod questionnaire;
pub mod release;
pub mod test_cmd;
pub mod tpu;
pub mod vocab;
pub mod yaml;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use vocab::MixedPrecision;

/// accelerate's commands, on accel's agent.
#[derive(Debug, Parser)]
#[command(
    name = "accel",
    version,
    arg_required_else_help = true,
    after_help = "Shell completions: accel completions bash|zsh|fish|elvish|powershell\nMan page:          accel manpage"
)]
pub struct AccelArgs {
    /// The command.
    #[command(subcommand)]
    pub command: AccelCommand,
}

/// `accel` subcommands.
#[derive(Debug, Subcommand)]
pub enum AccelCommand {
    /// Create (interactively), or update, accelerate's configuration file.
    Config {
        /// The file (default: accelerate's default location, under HF_HOME).
        #[arg(long = "config_file", alias = "config-file")]
        config_file: Option<PathBuf>,
        /// `default` or `update`; none asks the questions.
        #[command(subcommand)]
        action: Option<ConfigAction>,
    },
    /// Launch a training script on accel's agent (accelerate's `launch` flags;
    /// `accel launch --help` lists them).
    #[command(disable_help_flag = true)]
    Launch {
        /// accelerate's launch flags, the script, and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Print the environment, for bug reports (accelerate's fields).
    Env {
        /// The configuration file to show (default: accelerate's default file).
        #[arg(long = "config_file", alias = "config-file")]
        config_file: Option<PathBuf>,
    },
    /// Check that distributed training works here: a real multi-process launch.
    Test {
        /// The configuration file to launch with (default: accelerate's default file).
        #[arg(long = "config_file", alias = "config-file")]
        config_file: Option<PathBuf>,
    },
    /// The worker `accel test` launches when no Python environment has accelerate.
    #[command(name = "test-worker", hide = true)]
    TestWorker,
    /// Estimate a model's memory use for inference and training.
    #[command(name = "estimate-memory")]
    EstimateMemory(estimate::EstimateArgs),
    /// Run commands on every worker of a TPU pod through gcloud.
    #[command(name = "tpu-config")]
    TpuConfig(tpu::TpuArgs),
}

/// `accel config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Write a basic configuration for this machine (as `accelerate config default`); an
    /// existing file is left alone.
    Default {
        /// Where to write it (default: accelerate's default location, under HF_HOME).
        #[arg(long = "config_file", alias = "config-file")]
        config_file: Option<PathBuf>,
        /// Mixed precision for the configuration.
        #[arg(long = "mixed_precision", alias = "mixed-precision", default_value = "no",
              value_parser = config_default_precision())]
        mixed_precision: MixedPrecision,
    },
    /// Rewrite an existing file in the current format (legacy keys migrated).
    Update {
        /// The file (default: accelerate's default location).
        #[arg(long = "config_file", alias = "config-file")]
        config_file: Option<PathBuf>,
    },
}

/// `config default --mixed_precision`: one of [`MixedPrecision::CONFIG_DEFAULT`],
/// listed in `--help` and in clap's error for anything else.
fn config_default_precision() -> impl clap::builder::TypedValueParser<Value = MixedPrecision> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(
        MixedPrecision::CONFIG_DEFAULT.map(MixedPrecision::name),
    )
    .try_map(|name| MixedPrecision::parse(&name).ok_or("not a mixed-precision mode"))
}

/// What the binary does after a command.
#[derive(Debug)]
pub enum Action {
    /// Print this and exit successfully.
    Print(String),
    /// Run the agent.
    Launch(Box<launch::LaunchPlan>),
}

/// Any command's failure.
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    /// A configuration file could not be written.
    #[error(transparent)]
    Write(#[from] config_file::ConfigFileError),
    /// A configuration file could not be read.
    #[error(transparent)]
    Load(#[from] config_file::LoadError),
    /// `config update` failed.
    #[error(transparent)]
    Update(#[from] config_file::UpdateError),
    /// `launch` was given something it cannot run.
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    /// `estimate-memory` failed.
    #[error(transparent)]
    Estimate(#[from] estimate::EstimateError),
    /// `tpu-config` failed.
    #[error(transparent)]
    Tpu(#[from] tpu::TpuError),
    /// The questionnaire stopped.
    #[error(transparent)]
    Questionnaire(#[from] questionnaire::QuestionnaireError),
    /// `env` failed.
    #[error(transparent)]
    Env(#[from] env_cmd::EnvError),
    /// `test` failed.
    #[error(transparent)]
    Test(#[from] test_cmd::TestError),
}

impl AccelError {
    /// What `accel` exits with: 2 for a usage error (as argparse), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            AccelError::Launch(launch::LaunchError::Usage(_)) => 2,
            _ => 1,
        }
    }
}

/// Runs `accel` with parsed arguments; `env` reads the environment.
pub fn run(args: AccelArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<Action, AccelError> {
    let print = |s: String| Ok(Action::Print(s));
    match args.command {
        AccelCommand::Config {
            action:
                Some(ConfigAction::Default {
                    config_file,
                    mixed_precision,
                }),
            ..
        } => {
            let path = config_file.unwrap_or_else(|| config_file::default_location(env));
            print(config_file::write_default(
                &path,
                mixed_precision,
                accel_agent::probe::cuda_devices(env),
            )?)
        }
        AccelCommand::Config {
            action: Some(ConfigAction::Update { config_file }),
            config_file: outer,
        } => print(config_file::update(config_file.or(outer).as_deref(), env)?),
        AccelCommand::Config {
            action: None,
            config_file,
        } => {
            let stdin = std::io::stdin();
            let release = release::Release::installed(env);
            if let Some(warning) = release.warning() {
                eprintln!("accel: warning: {warning}");
            }
            print(questionnaire::run(
                config_file.as_deref(),
                &mut stdin.lock(),
                &mut std::io::stdout(),
                release,
                env,
            )?)
        }
        AccelCommand::Env { config_file } => print(env_cmd::run(config_file.as_deref(), env)?),
        AccelCommand::Test { config_file } => {
            let argv = test_cmd::launch_args(config_file.as_deref(), env)?;
            match launch::plan(&argv, release::Release::installed(env), env)? {
                launch::Planned::Help(text) => print(text),
                launch::Planned::Run(mut plan) => {
                    plan.on_success = Some(test_cmd::SUCCESS.to_owned());
                    Ok(Action::Launch(plan))
                }
            }
        }
        AccelCommand::TestWorker => print(test_cmd::worker(env)?),
        AccelCommand::Launch { args } => {
            match launch::plan(&args, release::Release::installed(env), env)? {
                launch::Planned::Help(text) => print(text),
                launch::Planned::Run(plan) => Ok(Action::Launch(plan)),
            }
        }
        AccelCommand::EstimateMemory(a) => print(estimate::run(&a, env)?),
        AccelCommand::TpuConfig(a) => {
            let config = config_file::load_optional(a.config_file.as_deref(), env)?;
            print(tpu::run(&a, config.as_ref().map(|c| &c.fields), env)?)
        }
    }
}

/// The program `name` as `accel` would run it, searched on the `PATH` that
/// `env` gives ([`accel_agent::probe::find_program`]).
pub(crate) fn find_program(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    accel_agent::probe::find_program(name, env("PATH").as_deref().map(std::ffi::OsStr::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_default(words: &[&str]) -> Result<MixedPrecision, clap::Error> {
        let argv = ["accel", "config", "default"].iter().chain(words);
        match AccelArgs::try_parse_from(argv)?.command {
            AccelCommand::Config {
                action:
                    Some(ConfigAction::Default {
                        mixed_precision, ..
                    }),
                ..
            } => Ok(mixed_precision),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn config_default_takes_accelerates_three_precisions() {
        assert_eq!(config_default(&[]).expect("default"), MixedPrecision::No);
        assert_eq!(
            config_default(&["--mixed_precision", "bf16"]).expect("bf16"),
            MixedPrecision::Bf16
        );
        let e = config_default(&["--mixed_precision", "fp8"]).expect_err("fp8 is not offered");
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(
            e.to_string().contains("[possible values: no, fp16, bf16]"),
            "{e}"
        );
    }
}
