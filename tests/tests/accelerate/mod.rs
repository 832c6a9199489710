//! `accel` against real `accelerate` from the pinned venv, one file per command.

mod config_default;
mod env;
mod estimate;
mod launch;
mod questionnaire;
mod test_cmd;
mod tpu;
