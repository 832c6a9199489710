//! `accel` against real `accelerate` from the pinned venv, one file per command.

mod config_default;
mod launch;
