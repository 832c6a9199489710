//! `accel`: accelerate's command set on accel's agent (see `accel_agent::accelerate`).

use std::process::ExitCode;

use accel_agent::accelerate::{run, AccelArgs};
use clap::Parser;

fn main() -> ExitCode {
    let args = AccelArgs::parse();
    match run(args, &|k| std::env::var(k).ok()) {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("accel: error: {e}");
            ExitCode::FAILURE
        }
    }
}
