//! `accel config`: accelerate's questionnaire (in progress).

use std::io::{BufRead, Write};
use std::path::Path;

/// Why the questionnaire stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QuestionnaireError(pub String);

/// Asks the questions on `output`, reads answers from `input`, writes the
/// file (`config_file`, else accelerate's default location) and returns the
/// message to print.
pub fn run(
    _config_file: Option<&Path>,
    _input: &mut dyn BufRead,
    _output: &mut dyn Write,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, QuestionnaireError> {
    Err(QuestionnaireError(
        "the interactive `accel config` is not in this version; use `accel config default`".into(),
    ))
}
