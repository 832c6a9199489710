//! `accel`: Hugging Face Accelerate's command set, run on accel's agent.
//!
//! This version has `accel config default`, which writes the same
//! `default_config.yaml` as `accelerate config default`, where accelerate
//! looks for it. The rest of the command set (`config` prompts, `launch`,
//! `env`, `test`, `estimate-memory`, `tpu-config`) is not in this version.

pub mod config_file;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// accelerate's commands, on accel's agent.
#[derive(Debug, Parser)]
#[command(name = "accel", version)]
pub struct AccelArgs {
    /// The command.
    #[command(subcommand)]
    pub command: AccelCommand,
}

/// `accel` subcommands.
#[derive(Debug, Subcommand)]
pub enum AccelCommand {
    /// Create or update accelerate's configuration file.
    Config {
        /// What to do with it.
        #[command(subcommand)]
        action: ConfigAction,
    },
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
              value_parser = ["no", "fp16", "bf16"])]
        mixed_precision: String,
    },
}

/// Runs `accel` with parsed arguments; `env` reads the environment. Returns
/// the message to print.
pub fn run(
    args: AccelArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, config_file::ConfigFileError> {
    match args.command {
        AccelCommand::Config {
            action:
                ConfigAction::Default {
                    config_file,
                    mixed_precision,
                },
        } => {
            let path = config_file.unwrap_or_else(|| config_file::default_location(env));
            config_file::write_default(&path, &mixed_precision, crate::config::cuda_devices())
        }
    }
}
