//! Running one short Python program in the user's Python environment.
//!
//! `accel` itself needs no Python, but `accel env` reports the versions of
//! the Python packages a training script would use, `accel test` runs
//! accelerate's own test script when it is installed, and `accel
//! estimate-memory` asks huggingface_hub about Hub models. They ask the
//! interpreter `accel launch` would start (`PYTHON_EXEC`, else `python3` on
//! `PATH`), in one subprocess with a time limit, so a missing or broken
//! Python never makes them hang or fail.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

use wait_timeout::ChildExt;

/// Why the Python program gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// No such interpreter.
    #[error("no Python interpreter `{0}` (set PYTHON_EXEC to choose one)")]
    NotFound(String),
    /// It could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The interpreter.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It ran longer than allowed and was killed.
    #[error("`{program}` did not finish within {limit:?}")]
    TimedOut {
        /// The interpreter.
        program: String,
        /// The limit.
        limit: Duration,
    },
    /// It exited unsuccessfully.
    #[error("`{program}` failed ({status}): {stderr}")]
    Failed {
        /// The interpreter.
        program: String,
        /// Its exit status.
        status: String,
        /// The end of its standard error.
        stderr: String,
    },
}

/// The interpreter `accel launch` would run scripts with.
pub fn interpreter(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("PYTHON_EXEC")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// Runs `program -c script` with no input; returns its standard output.
/// Killed after `limit`.
pub fn run(program: &str, script: &str, limit: Duration) -> Result<String, PythonError> {
    let child = Command::new(program)
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => PythonError::NotFound(program.to_owned()),
            _ => PythonError::Spawn {
                program: program.to_owned(),
                source,
            },
        })?;
    let (status, stdout, stderr) = wait_with_deadline(child, limit)
        .map_err(|source| PythonError::Spawn {
            program: program.to_owned(),
            source,
        })?
        .ok_or_else(|| PythonError::TimedOut {
            program: program.to_owned(),
            limit,
        })?;
    if status.success() {
        Ok(stdout)
    } else {
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        Err(PythonError::Failed {
            program: program.to_owned(),
            status: status.to_string(),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
        })
    }
}

/// Waits for `child` until `limit`, collecting its standard output and
/// error (drained while it runs, so a chatty child cannot block on a full
/// pipe); `None` when it ran too long and was killed.
pub fn wait_with_deadline(
    mut child: Child,
    limit: Duration,
) -> std::io::Result<Option<(ExitStatus, String, String)>> {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    // The child's exit wakes the wait (SIGCHLD), not a polling loop.
    let status = match child.wait_timeout(limit)? {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
    };
    Ok(Some((
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_interpreter_is_a_clear_error() {
        let e = run("/nonexistent/python", "print(1)", Duration::from_secs(5))
            .expect_err("no such program");
        assert!(matches!(e, PythonError::NotFound(_)), "{e}");
        assert!(e.to_string().contains("PYTHON_EXEC"), "{e}");
    }

    #[test]
    fn output_failure_and_timeout() {
        // `sh -c SCRIPT` stands in for an interpreter: same calling convention.
        assert_eq!(
            run("sh", "echo hi", Duration::from_secs(5)).expect("runs"),
            "hi\n"
        );
        let e = run("sh", "echo boom >&2; exit 3", Duration::from_secs(5)).expect_err("fails");
        assert!(e.to_string().contains("boom"), "{e}");
        let e = run("sh", "sleep 5", Duration::from_millis(200)).expect_err("killed");
        assert!(matches!(e, PythonError::TimedOut { .. }), "{e}");
    }

    #[test]
    fn interpreter_choice() {
        assert_eq!(interpreter(&|_| None), "python3");
        assert_eq!(
            interpreter(&|k| (k == "PYTHON_EXEC").then(|| "/v/bin/python".into())),
            "/v/bin/python"
        );
    }
}
