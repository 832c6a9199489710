//! Worker failures as torchrun reports them: the error file a worker's
//! `@record` wrote, the failure summary (root cause first), and the error
//! file the agent itself writes for a parent launcher.
//!
//! The summary's layout and field names are torchrun's (reference: torchrun
//! §4.7); times are shown in UTC, as `YYYY-MM-DD_HH:MM:SS`.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::sys::Ended;

/// What a worker's error file says, if it wrote one.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ErrorFile {
    /// `message.message` (or a top-level string message).
    pub message: String,
    /// `message.extraInfo.py_callstack`.
    pub traceback: String,
    /// `message.extraInfo.timestamp` (or a top-level `timestamp`).
    pub timestamp: Option<f64>,
    /// The file as written.
    pub raw: Value,
}

/// The largest error file read: a worker writes a message and a traceback,
/// not megabytes; a larger file is not read (and not forwarded).
pub(crate) const MAX_ERROR_FILE_BYTES: u64 = 4 << 20;

/// Reads a worker's error file; `None` if it wrote none (or nothing readable,
/// or more than [`MAX_ERROR_FILE_BYTES`]).
pub(crate) fn read_error_file(path: &Path) -> Option<ErrorFile> {
    let text = read_error_text(path)?;
    let raw: Value = serde_json::from_str(&text).ok()?;
    let num = |v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    };
    let m = &raw["message"];
    let (message, traceback, timestamp) = match m {
        Value::String(s) => (s.clone(), String::new(), num(&raw["timestamp"])),
        _ => (
            m["message"].as_str().unwrap_or_default().to_owned(),
            m["extraInfo"]["py_callstack"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            num(&m["extraInfo"]["timestamp"]),
        ),
    };
    Some(ErrorFile {
        message,
        traceback,
        timestamp,
        raw,
    })
}

/// The text of a worker's error file, if it is a regular file of at most
/// [`MAX_ERROR_FILE_BYTES`]. Never blocks: the worker may have put a named
/// pipe, a link or a device there ([`crate::files::open_worker_file`]);
/// such a file is not read, with one warning per agent (later ones are
/// debug lines: a worker doing it every round does not flood the log).
pub(crate) fn read_error_text(path: &Path) -> Option<String> {
    use std::io::Read as _;
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let file = match crate::files::open_worker_file(path) {
        Ok(f) => f?,
        Err(what) => {
            if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::debug!(file = %path.display(), what, "a worker's error file is not a regular file; not read");
            } else {
                tracing::warn!(file = %path.display(), what, "a worker's error file is not a regular file, so it is not read (said once; later ones are debug lines)");
            }
            return None;
        }
    };
    let mut text = String::new();
    file.take(MAX_ERROR_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .ok()?;
    if text.len() as u64 > MAX_ERROR_FILE_BYTES {
        tracing::warn!(file = %path.display(), "the worker's error file is larger than 4 MiB; it is not read");
        return None;
    }
    Some(text)
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// torchrun's exit-code convention: the code, or minus the signal.
fn torch_exitcode(ended: Ended) -> i32 {
    match ended {
        Ended::Exited(c) => c,
        Ended::Signaled(s) => -s,
    }
}

/// Describes one failed worker from its exit and its error file.
pub(crate) fn describe(
    host: &str,
    rank: u32,
    local_rank: u32,
    pid: u32,
    ended: Ended,
    error_file: &Path,
) -> pb::Failure {
    let recorded = read_error_file(error_file);
    let exitcode = torch_exitcode(ended);
    let (message, traceback) = match &recorded {
        Some(e) => (e.message.clone(), e.traceback.clone()),
        None if exitcode < 0 => (
            format!(
                "Signal {} ({}) received by PID {pid}",
                -exitcode,
                signal_name(-exitcode)
            ),
            String::new(),
        ),
        None => (
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
                .to_owned(),
            String::new(),
        ),
    };
    pb::Failure {
        host: host.to_owned(),
        rank,
        local_rank,
        exitcode,
        pid,
        timestamp: recorded
            .as_ref()
            .and_then(|e| e.timestamp)
            .unwrap_or_else(now_secs),
        error_file: if recorded.is_some() {
            error_file.display().to_string()
        } else {
            "<N/A>".to_owned()
        },
        message,
        traceback,
    }
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| format!("signal {sig}"), |s| s.to_string())
}

/// `YYYY-MM-DD_HH:MM:SS` in UTC (torchrun's summary format).
pub(crate) fn format_time(ts: f64) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] =
        time::macros::format_description!("[year]-[month]-[day]_[hour]:[minute]:[second]");
    let secs = ts.max(0.0) as i64;
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_else(|| format!("{secs} s after 1970"))
}

fn block(out: &mut Vec<String>, idx: usize, f: &pb::Failure) {
    let signal = if f.exitcode < 0 {
        // The exit code comes from another node's report: never negate i32::MIN.
        format!(" ({})", signal_name(f.exitcode.saturating_neg()))
    } else {
        String::new()
    };
    let trace = if f.traceback.is_empty() {
        f.message.clone()
    } else {
        f.traceback.trim_end().to_owned()
    };
    out.push(format!("[{idx}]:"));
    out.push(format!("  time      : {}", format_time(f.timestamp)));
    out.push(format!("  host      : {}", f.host));
    out.push(format!(
        "  rank      : {} (local_rank: {})",
        f.rank, f.local_rank
    ));
    out.push(format!(
        "  exitcode  : {} (pid: {}){signal}",
        f.exitcode, f.pid
    ));
    out.push(format!("  error_file: {}", f.error_file));
    let mut lines = trace.lines();
    out.push(format!(
        "  traceback : {}",
        lines.next().unwrap_or_default()
    ));
    out.extend(lines.map(|l| format!("    {l}")));
}

/// torchrun's failure summary: `title FAILED`, the other failures, then the
/// root cause (the job-wide first failure, from whichever node).
pub(crate) fn summary(title: &str, root: &pb::Failure, others: &[pb::Failure]) -> String {
    let mut failures = vec!["Failures:".to_owned()];
    if others.is_empty() {
        failures.push("  <NO_OTHER_FAILURES>".to_owned());
    }
    for (i, f) in others.iter().enumerate() {
        block(&mut failures, i + 1, f);
    }
    let mut root_lines = vec!["Root Cause (first observed failure):".to_owned()];
    block(&mut root_lines, 0, root);
    let title = format!("{title} FAILED");
    let width = failures
        .iter()
        .chain(&root_lines)
        .chain(std::iter::once(&title))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    let (eq, dash) = ("=".repeat(width), "-".repeat(width));
    let mut out = vec![eq.clone(), title, dash.clone()];
    out.extend(failures);
    out.push(dash);
    out.extend(root_lines);
    out.push(eq);
    out.join("\n") + "\n"
}

/// What the agent writes to its own `TORCHELASTIC_ERROR_FILE` (set by a
/// parent launcher): the root cause's error file as the worker wrote it, if
/// it is one of this agent's (under `run_dir`: a path in another node's
/// report names nothing of this host's, and is never read here), else one
/// built from the report; with `errorCode`.
/// Under `accel`, the failures themselves (`root`, and this node's `others`:
/// host, ranks, pid, torch's exit code, error file, message, traceback), so
/// a parent can rebuild torch's `ChildFailedError`; torch's readers look
/// only at `message`.
pub(crate) fn parent_error_file(
    root: &pb::Failure,
    others: &[pb::Failure],
    run_dir: Option<&Path>,
) -> Value {
    let path = Path::new(&root.error_file);
    let ours = run_dir.is_some_and(|dir| {
        path.starts_with(dir)
            && path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir))
    });
    let file = if ours { read_error_file(path) } else { None };
    let mut v = file.map(|e| e.raw).unwrap_or_else(|| {
        serde_json::json!({"message": {
            "message": root.message,
            "extraInfo": {"py_callstack": root.traceback, "timestamp": format!("{}", root.timestamp as i64)},
        }})
    });
    if let Some(m) = v.get_mut("message").and_then(Value::as_object_mut) {
        m.insert("errorCode".into(), Value::from(root.exitcode));
    }
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "accel".into(),
            serde_json::json!({
                "root": failure_json(root),
                "others": others.iter().map(failure_json).collect::<Vec<_>>(),
            }),
        );
    }
    v
}

fn failure_json(f: &pb::Failure) -> Value {
    serde_json::json!({
        "host": f.host,
        "rank": f.rank,
        "local_rank": f.local_rank,
        "pid": f.pid,
        "exitcode": f.exitcode,
        "timestamp": f.timestamp as i64,
        "error_file": f.error_file,
        "message": f.message,
        "traceback": f.traceback,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_error_file_is_not_read() {
        // Each test its own directory: tests run in parallel, and each
        // removes its directory at the end.
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("error.json");
        std::fs::write(&f, r#"{"message": "boom"}"#).expect("write");
        assert_eq!(read_error_file(&f).expect("read").message, "boom");
        let big = format!(r#"{{"message": "{}"}}"#, "x".repeat(5 << 20));
        std::fs::write(&f, big).expect("write");
        assert!(read_error_file(&f).is_none());
        std::fs::remove_dir_all(&dir).ok();
    }

    fn failure(rank: u32, exitcode: i32, traceback: &str) -> pb::Failure {
        pb::Failure {
            host: "node1".into(),
            rank,
            local_rank: rank % 2,
            exitcode,
            pid: 4240 + rank,
            timestamp: 1_735_732_801.0,
            error_file: "<N/A>".into(),
            message: "ValueError: boom".into(),
            traceback: traceback.into(),
        }
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(format_time(0.0), "1970-01-01_00:00:00");
        assert_eq!(format_time(1_735_732_801.0), "2025-01-01_12:00:01");
        assert_eq!(format_time(951_825_600.0), "2000-02-29_12:00:00");
    }

    #[test]
    fn summary_layout() {
        let root = failure(
            4,
            1,
            "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: boom\n",
        );
        let text = summary("train.py", &root, &[failure(5, -15, "")]);
        let lines: Vec<&str> = text.lines().collect();
        // Borders are as wide as the longest line, at most 60.
        let width = lines
            .iter()
            .skip(1)
            .map(|l| l.len())
            .max()
            .unwrap_or(0)
            .min(60);
        assert_eq!(lines[0], "=".repeat(width));
        assert_eq!(lines[1], "train.py FAILED");
        assert_eq!(lines[2], "-".repeat(width));
        assert_eq!(lines[3], "Failures:");
        assert_eq!(lines[4], "[1]:");
        assert!(
            text.contains("  exitcode  : -15 (pid: 4245) (SIGTERM)\n"),
            "{text}"
        );
        assert!(text.contains("Root Cause (first observed failure):\n[0]:\n  time      : 2025-01-01_12:00:01\n  host      : node1\n  rank      : 4 (local_rank: 0)\n  exitcode  : 1 (pid: 4244)\n"), "{text}");
        assert!(text.contains("  traceback : Traceback (most recent call last):\n      File \"t.py\", line 1\n    ValueError: boom\n"), "{text}");
        assert!(text.ends_with(&format!("{}\n", "=".repeat(width))));
        assert!(summary("t", &root, &[]).contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
    }

    #[test]
    fn error_files_are_read_in_both_layouts() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).expect("dir");
        let nested = dir.join("nested.json");
        std::fs::write(&nested, r#"{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "tb", "timestamp": "1700000000"}}}"#).expect("write");
        let e = read_error_file(&nested).expect("read");
        assert_eq!(
            (e.message.as_str(), e.traceback.as_str(), e.timestamp),
            ("ValueError: boom", "tb", Some(1.7e9))
        );
        let flat = dir.join("flat.json");
        std::fs::write(&flat, r#"{"message": "plain", "timestamp": 12}"#).expect("write");
        assert_eq!(read_error_file(&flat).expect("read").timestamp, Some(12.0));
        assert!(read_error_file(&dir.join("missing.json")).is_none());
        let f = describe("h", 3, 1, 99, Ended::Signaled(9), &dir.join("missing.json"));
        assert_eq!((f.exitcode, f.error_file.as_str()), (-9, "<N/A>"));
        assert_eq!(f.message, "Signal 9 (SIGKILL) received by PID 99");
        let mut root = describe("h", 3, 1, 99, Ended::Exited(2), &nested);
        assert_eq!(
            parent_error_file(&root, &[], Some(&dir))["message"]["errorCode"],
            2
        );
        let with = parent_error_file(&root, std::slice::from_ref(&f), Some(&dir));
        assert_eq!(
            (
                &with["accel"]["root"]["rank"],
                &with["accel"]["root"]["pid"]
            ),
            (&serde_json::json!(3), &serde_json::json!(99))
        );
        assert_eq!(with["accel"]["others"][0]["exitcode"], -9);
        assert_eq!(
            parent_error_file(&root, &[], Some(&dir))["message"]["extraInfo"]["py_callstack"],
            "tb"
        );
        root.error_file = "<N/A>".into();
        assert_eq!(
            parent_error_file(&root, &[], Some(&dir))["message"]["message"],
            "ValueError: boom"
        );
        // Only this agent's own files are read: a path in a report names a
        // file on the reporting node, and may name anything here.
        root.error_file = nested.to_string_lossy().into_owned();
        std::fs::write(&nested, r#"{"message": {"message": "rewritten", "extraInfo": {"py_callstack": "", "timestamp": "1"}}}"#).expect("write");
        let read_as = |root: &pb::Failure, run_dir: Option<&Path>| {
            parent_error_file(root, &[], run_dir)["message"]["message"]
                .as_str()
                .map(str::to_owned)
        };
        assert_eq!(read_as(&root, Some(&dir)).as_deref(), Some("rewritten"));
        assert_eq!(
            read_as(&root, None).as_deref(),
            Some("ValueError: boom"),
            "the report's"
        );
        let elsewhere = tempfile::tempdir().expect("another dir");
        assert_eq!(
            read_as(&root, Some(elsewhere.path())).as_deref(),
            Some("ValueError: boom")
        );
        root.error_file = format!("{}/sub/../nested.json", dir.display());
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        assert_eq!(
            read_as(&root, Some(&dir)).as_deref(),
            Some("ValueError: boom"),
            "no `..`"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
