//! A Rust rank's failure report, in the file torchrun's `@record` writes.
//!
//! The launcher gives each worker `TORCHELASTIC_ERROR_FILE`; when a Python
//! rank fails under `@record`, that file holds its exception, and the
//! launcher's failure summary (accel's and torchrun's) shows it as the
//! root cause instead of "To enable traceback see ...". [`record_error`]
//! writes the same JSON for a Rust rank, so a mixed job's summary names the
//! failing rank's error whichever language it ran. The function launcher
//! records a failed function's error itself.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::env::WorkerEnv;

/// Writes `message` (and `details`, shown as the traceback) to the worker's
/// error file, if the launcher set one. Returns whether a file was written.
pub fn record_error(env: &WorkerEnv, message: &str, details: &str) -> std::io::Result<bool> {
    match &env.error_file {
        Some(path) => write_error_file(path, message, details, SystemTime::now()).map(|()| true),
        None => Ok(false),
    }
}

/// The JSON torchrun's error handler writes: `{"message": {"message": ...,
/// "extraInfo": {"py_callstack": ..., "timestamp": "<unix seconds>"}}}`.
pub fn error_json(message: &str, details: &str, at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    serde_json::json!({
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": details, "timestamp": secs.to_string()},
        }
    })
    .to_string()
}

fn write_error_file(
    path: &Path,
    message: &str,
    details: &str,
    at: SystemTime,
) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, error_json(message, details, at))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn same_shape_as_torchruns_error_file() {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let v: serde_json::Value =
            serde_json::from_str(&error_json("boom \"x\"", "rank 3: step 17", at)).expect("json");
        assert_eq!(v["message"]["message"], "boom \"x\"");
        assert_eq!(v["message"]["extraInfo"]["py_callstack"], "rank 3: step 17");
        assert_eq!(v["message"]["extraInfo"]["timestamp"], "1700000000");
    }
}
