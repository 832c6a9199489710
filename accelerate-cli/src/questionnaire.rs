//! `accel config`: accelerate's interactive questionnaire (`accelerate
//! config`, reference: accelerate §1.2, §2.3–§2.6), for "This machine".
//!
//! Users move between `accelerate config` and `accel config`, and the file
//! is read by both `accelerate launch` and `accel launch`, so the same
//! answers must give the same questions in the same order, with the same
//! defaults, and the same file byte for byte (accelerate 1.15's
//! `commands/config/cluster.py`; where the installed release asks otherwise,
//! the [`crate::release`] table says so: the IPEX and oneCCL questions
//! before 1.13, the FP8 backends offered). The question texts are accelerate's.
//!
//! Differences in the asking, not in the result:
//! * menus are line-based (see `questionnaire/prompt.rs`): the 0-based
//!   index accelerate's menu shows, or the option's text, or an empty line
//!   for the default;
//! * end of input stops with "no answer for: QUESTION" (accelerate raises
//!   `EOFError`); an unknown menu answer is asked again.
//!
//! Answers are read as accelerate converts them: yes/no questions take
//! exactly `yes` or `no` in any case (not `y`/`n`, which accelerate asks
//! again), numbers as Python's `int()`/`float()` read them (within `i64`;
//! a NaN or infinite float is asked again, having no JSON form), text
//! unchanged; `~` in the mpirun hostfile is expanded from `HOME`, and the
//! TPU bash script is made absolute from the current directory, as
//! `os.path.expanduser`/`abspath` do.
//!
//! accelerate asks some questions only when Python can see some hardware or
//! package. A Rust binary cannot ask that Python, so accel decides as
//! accelerate does on a CPU-only Linux machine without the optional
//! packages, where the answer changes which questions are asked or how:
//! * `is_mps_available()` is false (Apple only): the DeepSpeed, GPU-id and
//!   NUMA questions are asked as accelerate asks them without MPS;
//! * no NPU/MLU/SDAA/MUSA/XPU/HPU/Neuron runtime: the GPU-id question says
//!   "GPU(s)" whatever the machine type, as accelerate's does there.
//!
//! No question depends on CUDA devices being present (accelerate's flow
//! does not probe CUDA), so the same questions come on a GPU machine.
//!
//! accelerate also refuses some answers when a package is missing
//! (DeepSpeed; Transformers for `deepspeed.zero.Init`; an FP8 backend). Those
//! checks only stop accelerate's questionnaire, they change no question, and
//! the file is often written for another machine (the one that trains), so
//! accel does not repeat them: it asks on and writes what accelerate writes
//! where the package is installed.
//!
//! Where accelerate 1.15 cannot finish, accel differs on purpose:
//! * the dynamo option `torhchxla_trace_once` (misspelt in accelerate's
//!   list) makes accelerate crash; accel writes `TORCHXLA_TRACE_ONCE`;
//! * choosing "AWS (Amazon SageMaker)" stops with an error: accel configures
//!   local machines only and says to use `accelerate config` for SageMaker.
//!
//! accelerate's TPU bf16 "downcast" question follows the mixed-precision
//! answer, which accelerate never asks for TPUs (it sets "no"), so it is
//! never asked there and `downcast_bf16` is always `'no'`; the same here.

use std::io::{BufRead, Write};
use std::path::Path;

use super::config_file::{self, ConfigFileError};
use crate::release::Release;

mod cluster;
mod deepspeed;
#[cfg(test)]
mod flow_tests;
mod fsdp;
mod precision;
mod prompt;

use prompt::Prompter;

/// Why the questionnaire stopped.
#[derive(Debug, thiserror::Error)]
pub enum QuestionnaireError {
    /// The input ended before this question was answered.
    #[error("no answer for: {0}")]
    NoAnswer(String),
    /// The answers could not be read.
    #[error("cannot read the answers: {0}")]
    Read(#[source] std::io::Error),
    /// The questions could not be written.
    #[error("cannot write the questions: {0}")]
    Write(#[source] std::io::Error),
    /// "AWS (Amazon SageMaker)" was chosen.
    #[error("accel configures local machines only (\"This machine\"); to configure Amazon SageMaker, run `accelerate config`")]
    SageMaker,
    /// A combination accelerate refuses; the text says what to choose instead.
    #[error("{0}")]
    Refused(&'static str),
    /// A relative path could not be made absolute.
    #[error("cannot make {path} absolute: the current directory is unavailable ({source})")]
    CurrentDir {
        /// The answer.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be written.
    #[error(transparent)]
    Save(#[from] ConfigFileError),
}

/// The first question: accelerate's compute environments.
const ENVIRONMENTS: [&str; 2] = ["This machine", "AWS (Amazon SageMaker)"];

/// Asks the questions on `output` as `release`'s `accelerate config` does,
/// reads answers from `input`, writes the file (`config_file`, else
/// accelerate's default location) and returns the message to print.
pub fn run(
    config_file: Option<&Path>,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    release: Release,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, QuestionnaireError> {
    let mut p = Prompter::new(input, output);
    if p.choose(
        "In which compute environment are you running?",
        &ENVIRONMENTS,
        0,
    )? != 0
    {
        return Err(QuestionnaireError::SageMaker);
    }
    let fields = cluster::ask(&mut p, release, env)?;
    let path = config_file.map_or_else(|| config_file::default_location(env), Path::to_path_buf);
    config_file::save(&path, &fields)?;
    Ok(format!(
        "accelerate configuration saved at {}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "HOME").then(|| "/home/u".to_owned())
    }

    #[test]
    fn writes_the_file_and_says_where() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        let path = dir.join("sub/cfg.yaml");
        let mut input = "\n0\nyes\nno\nno\n\n".as_bytes();
        let mut output = Vec::new();
        let msg = run(
            Some(&path),
            &mut input,
            &mut output,
            Release::of(None),
            &env,
        )
        .expect("runs");
        assert_eq!(
            msg,
            format!("accelerate configuration saved at {}", path.display())
        );
        let text = std::fs::read_to_string(&path).expect("written");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            text,
            "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: 'NO'\n\
             downcast_bf16: 'no'\nenable_cpu_affinity: false\nmachine_rank: 0\n\
             main_training_function: main\nmixed_precision: 'no'\nnum_machines: 1\n\
             num_processes: 1\nrdzv_backend: static\nsame_network: true\ntpu_env: []\n\
             tpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: true\n"
        );
    }

    #[test]
    fn sagemaker_and_eof_stop_with_clear_errors() {
        let mut output = Vec::new();
        let err = run(
            None,
            &mut "1\n".as_bytes(),
            &mut output,
            Release::of(None),
            &env,
        )
        .expect_err("sagemaker");
        assert!(matches!(err, QuestionnaireError::SageMaker));
        assert!(err.to_string().contains("`accelerate config`"), "{err}");
        let err = run(
            None,
            &mut "0\n".as_bytes(),
            &mut output,
            Release::of(None),
            &env,
        )
        .expect_err("eof");
        assert_eq!(
            err.to_string(),
            "no answer for: Which type of machine are you using?"
        );
    }
}
