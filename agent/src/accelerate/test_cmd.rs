//! `accel test` (in progress).

use std::path::Path;

/// Why `accel test` cannot run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TestError(pub String);

/// The message printed when the test launch succeeds.
pub const SUCCESS: &str = "Test is a success! You are ready for your distributed training!";

/// The `accel launch` arguments that run the test: accelerate's own test
/// script when a Python environment has accelerate, else the built-in
/// worker (`accel test-worker`, this binary).
pub fn launch_args(
    _config_file: Option<&Path>,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, TestError> {
    Err(TestError("accel test is not implemented yet".into()))
}

/// The built-in worker (`accel test-worker`): runs in every launched
/// process; returns what to print.
pub fn worker(_env: &dyn Fn(&str) -> Option<String>) -> Result<String, TestError> {
    Err(TestError("accel test-worker is not implemented yet".into()))
}
