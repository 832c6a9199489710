//! `accel test`: checks that distributed training can start here, with a
//! real multi-process launch (reference: accelerate §4.2).
//!
//! When the Python environment a launch would use (`PYTHON_EXEC`, else
//! `python3`) has accelerate and torch, the test is accelerate's own:
//! `accel launch [--config_file F] <accelerate>/test_utils/scripts/test_script.py`,
//! the script `accelerate test` runs, so both tools test the same thing.
//!
//! Without them accel still has something to check, since it launches
//! without Python: the launch runs this binary as its workers
//! (`accel test-worker`, see [`worker()`]) in at least two processes, which
//! must all find each other through the launch's store, as the processes of
//! a training job do before their first collective. The number of processes
//! is the configuration's per-machine count when it has two or more, else
//! two; `--multi_gpu` and `--num_machines 1` make the launch start them on
//! this machine with torchrun's environment whatever the configuration's
//! distributed type (which accelerate's own flags would also override).
//!
//! Either way the configuration is read first, so a bad file is reported
//! before anything starts. Deviation from accelerate: `--config_file` is
//! passed as its own argument, so paths with spaces work.

pub mod client;
pub mod worker;

use std::path::Path;
use std::time::Duration;

use super::config_file::{self, AccelerateConfig, LoadError};
use super::python;

/// Why `accel test` cannot run, or why a test worker failed.
#[derive(Debug, thiserror::Error)]
pub enum TestError {
    /// The configuration file cannot be used.
    #[error(transparent)]
    Config(#[from] LoadError),
    /// This binary's path is unknown, so it cannot be launched as the worker.
    #[error("cannot find the accel binary to launch as the test worker: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// torchrun's environment is missing or malformed in a test worker.
    #[error("{var} {problem}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A test worker could not use the store.
    #[error("rank {rank} of {world}: {source}")]
    Store {
        /// This process's rank.
        rank: u64,
        /// Number of processes.
        world: u64,
        /// The store error.
        #[source]
        source: client::ClientError,
    },
    /// A test worker saw the processes disagree.
    #[error("rank {rank} of {world}: {problem}")]
    Check {
        /// This process's rank.
        rank: u64,
        /// Number of processes.
        world: u64,
        /// What went wrong.
        problem: String,
    },
}

/// The message printed when the test launch succeeds.
pub const SUCCESS: &str = "Test is a success! You are ready for your distributed training!";

/// How long the Python look-up may take.
const LOOKUP_LIMIT: Duration = Duration::from_secs(60);

/// Prints where accelerate's test script is, if accelerate and torch are
/// installed (found without importing them, so it is quick).
const FIND_SCRIPT: &str = r#"
import importlib.util, os
spec = importlib.util.find_spec("accelerate")
if spec and spec.origin and importlib.util.find_spec("torch"):
    print(os.path.join(os.path.dirname(spec.origin), "test_utils", "scripts", "test_script.py"))
"#;

/// The `accel launch` arguments that run the test: accelerate's own test
/// script when a Python environment has accelerate, else the built-in
/// worker (`accel test-worker`, this binary).
pub fn launch_args(
    config_file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, TestError> {
    let config = config_file::load_optional(config_file, env)?;
    let mut args = Vec::new();
    if let Some(f) = config_file {
        args.push("--config_file".to_owned());
        args.push(f.display().to_string());
    }
    if let Some(script) = accelerate_test_script(env) {
        args.push(script);
        return Ok(args);
    }
    let exe = std::env::current_exe().map_err(TestError::CurrentExe)?;
    args.extend(builtin_args(config.as_ref(), &exe.display().to_string()));
    Ok(args)
}

/// accelerate's test script in the launch's Python environment, if any.
fn accelerate_test_script(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let out = python::run(&python::interpreter(env), FIND_SCRIPT, LOOKUP_LIMIT).ok()?;
    let path = out.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Path::new(path).is_file().then(|| path.to_owned())
}

/// The launch flags and command of the built-in check.
fn builtin_args(config: Option<&AccelerateConfig>, exe: &str) -> Vec<String> {
    let n = processes(config).to_string();
    [
        "--multi_gpu",
        "--num_machines",
        "1",
        "--num_processes",
        &n,
        "--no_python",
        exe,
        "test-worker",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The configuration's processes per machine, at least two.
fn processes(config: Option<&AccelerateConfig>) -> u64 {
    let Some(c) = config.filter(|c| !c.sagemaker) else {
        return 2;
    };
    let total = c.get("num_processes").as_i64().unwrap_or(1);
    let machines = c.get("num_machines").as_i64().unwrap_or(1).max(1);
    (total / machines).max(2) as u64
}

/// The built-in worker (`accel test-worker`): runs in every launched
/// process; returns what to print.
pub fn worker(env: &dyn Fn(&str) -> Option<String>) -> Result<String, TestError> {
    worker::run(&worker::WorkerEnv::from_env(env)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;

    fn config(text: &str) -> AccelerateConfig {
        let (sagemaker, fields) =
            config_file::process(yaml::load(text).expect("yaml")).expect("valid");
        AccelerateConfig {
            path: "c.yaml".into(),
            sagemaker,
            fields,
        }
    }

    #[test]
    fn builtin_launch_has_at_least_two_local_processes() {
        let args = builtin_args(None, "/bin/accel");
        assert_eq!(
            args,
            [
                "--multi_gpu",
                "--num_machines",
                "1",
                "--num_processes",
                "2",
                "--no_python",
                "/bin/accel",
                "test-worker"
            ]
        );
        let one = config("distributed_type: 'NO'\n");
        assert_eq!(processes(Some(&one)), 2);
        let eight = config("distributed_type: MULTI_GPU\nnum_processes: 8\n");
        assert_eq!(processes(Some(&eight)), 8);
        let two_nodes = config("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 2\n");
        assert_eq!(processes(Some(&two_nodes)), 8);
    }

    #[test]
    fn without_python_the_builtin_check_runs() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        let hf = dir.to_string_lossy().into_owned();
        let env = move |k: &str| match k {
            "PYTHON_EXEC" => Some("/nonexistent/python".to_owned()),
            "HF_HOME" => Some(hf.clone()),
            _ => None,
        };
        let args = launch_args(None, &env).expect("args");
        assert_eq!(args.last().map(String::as_str), Some("test-worker"));
        assert!(args.contains(&"--no_python".to_owned()), "{args:?}");
        let e = launch_args(Some(&dir.join("missing.yaml")), &env).expect_err("missing file");
        assert!(matches!(e, TestError::Config(LoadError::Missing(_))), "{e}");
    }

    #[test]
    fn with_a_config_file_it_is_passed_through() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("my config.yaml");
        std::fs::write(&file, "distributed_type: MULTI_GPU\nnum_processes: 3\n").expect("write");
        let env = |k: &str| (k == "PYTHON_EXEC").then(|| "/nonexistent/python".to_owned());
        let args = launch_args(Some(&file), &env).expect("args");
        assert_eq!(
            args[..2],
            ["--config_file".to_owned(), file.display().to_string()]
        );
        assert!(
            args.windows(2).any(|w| w == ["--num_processes", "3"]),
            "{args:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
