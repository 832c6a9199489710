//! torchrun's `--duplicate-stdout-filters` / `--duplicate-stderr-filters`:
//! the tee'd lines of a stream that contain any of the filter strings are
//! also written, prefixed as on the console, to
//! `<attempt>/filtered_stdout.log` / `filtered_stderr.log`, one file per
//! attempt for all of the node's workers.
//!
//! torchrun 2.13 (`run.py` `comma_separated_list`, `multiprocessing/api.py`
//! `PContext`) decides what the flag means, and accel follows it exactly:
//! - the value is split at commas, `,,` standing for a comma inside a
//!   filter (so `a,,b` is the one filter `a,b`);
//! - empty items are kept, and an empty filter is contained in every line:
//!   `--duplicate-stdout-filters ""` or `"a,"` copies every line;
//! - only tee'd streams of ranks whose output reaches the console feed the
//!   file (torchrun tails the same files for both), so without `--tee` the
//!   file is created and stays empty;
//! - a line is matched without its prefix, with its newline.
//!
//! The copy rides on the console line that is already made: the pump tests
//! the line once and marks it, and the console writer thread writes the same
//! bytes to the file, so the tee path gains no allocation and no task.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::warn;

/// The filter strings of one `--duplicate-std*-filters` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineFilter {
    needles: Vec<Vec<u8>>,
}

impl LineFilter {
    /// Parses torchrun's comma list (`,,` escapes a comma). Every value is
    /// valid, as in torchrun: an empty item matches every line.
    pub fn parse(s: &str) -> Self {
        // Left to right, as Python's `str.replace(",,", ...)`: `a,,,b` is
        // `a,` and `b`.
        let mut needles = Vec::new();
        let mut current = Vec::new();
        let mut rest = s.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            match (b, tail.first()) {
                (b',', Some(b',')) => {
                    current.push(b',');
                    rest = &tail[1..];
                    continue;
                }
                (b',', _) => needles.push(std::mem::take(&mut current)),
                _ => current.push(b),
            }
            rest = tail;
        }
        needles.push(current);
        Self { needles }
    }

    /// The filter strings, as torchrun lists them.
    pub fn needles(&self) -> impl Iterator<Item = &[u8]> {
        self.needles.iter().map(Vec::as_slice)
    }

    /// Whether `line` contains any of the filter strings.
    pub fn matches(&self, line: &[u8]) -> bool {
        self.needles.iter().any(|n| contains(line, n))
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    match needle.split_first() {
        None => true,
        Some((first, rest)) => hay
            .iter()
            .enumerate()
            .filter(|(_, b)| *b == first)
            .any(|(i, _)| hay[i + 1..].starts_with(rest)),
    }
}

/// One attempt's `filtered_stdout.log` or `filtered_stderr.log`, shared by
/// the pumps of every worker of the attempt and written by the console
/// writer thread.
#[derive(Debug)]
pub struct FilteredFile {
    file: Option<std::fs::File>,
    path: PathBuf,
    warned: AtomicBool,
}

impl FilteredFile {
    /// Creates the file (new, 0600, never through a link: see
    /// `crate::files`). A file that cannot be created is reported once and
    /// then skipped, like a worker's log file: it costs the copy, never the
    /// job.
    pub fn create(at: &crate::files::FileAt) -> Arc<Self> {
        let path = at.path();
        let file = match at.create() {
            Ok(f) => Some(f),
            Err(e) => {
                warn!(file = %path.display(), error = %e, "cannot create the filtered log file (--duplicate-std*-filters); its lines are not copied");
                None
            }
        };
        Arc::new(Self {
            warned: AtomicBool::new(file.is_none()),
            file,
            path,
        })
    }

    /// Appends one whole (prefixed) line. Unbuffered, as torchrun's
    /// line-buffered file: a reader sees each line as it comes.
    pub(crate) fn write(&self, line: &[u8]) {
        let Some(mut file) = self.file.as_ref() else {
            return;
        };
        if self.warned.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = file.write_all(line) {
            self.report(&e);
        }
    }

    fn report(&self, error: &io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(file = %self.path.display(), %error, "cannot write the filtered log file (--duplicate-std*-filters), so it ends here");
        }
    }
}

/// What the pump of one tee'd stream copies into a filtered file.
#[derive(Debug, Clone)]
pub struct Filtered {
    /// Which lines.
    pub filter: Arc<LineFilter>,
    /// Where to.
    pub file: Arc<FilteredFile>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needles(s: &str) -> Vec<String> {
        LineFilter::parse(s)
            .needles()
            .map(|n| String::from_utf8(n.to_vec()).expect("utf-8"))
            .collect()
    }

    #[test]
    fn parsing_follows_torchrun() {
        // Each case as torchrun 2.13's comma_separated_list returns it.
        assert_eq!(needles("apple,orange"), ["apple", "orange"]);
        assert_eq!(needles("a,,b"), ["a,b"]);
        assert_eq!(needles("a,,,b"), ["a,", "b"]);
        assert_eq!(needles("a,,,,b"), ["a,,b"]);
        assert_eq!(needles(",,"), [","]);
        assert_eq!(needles(""), [""]);
        assert_eq!(needles("a,"), ["a", ""]);
        assert_eq!(needles(",a"), ["", "a"]);
        assert_eq!(needles("a,,"), ["a,"]);
        assert_eq!(needles("é,ü"), ["é", "ü"]);
    }

    #[test]
    fn matching() {
        let f = LineFilter::parse("loss,,acc,NaN");
        assert!(f.matches(b"step 3 loss,acc 0.1\n"));
        assert!(f.matches(b"got NaN\n"));
        assert!(
            !f.matches(b"loss 0.1 acc 0.2\n"),
            "the escaped comma is part of the filter"
        );
        assert!(!f.matches(b"nan\n"), "case matters");
        assert!(!f.matches(b""));
        // An empty item matches everything (torchrun: `"" in line`).
        assert!(LineFilter::parse("x,").matches(b"anything\n"));
        assert!(LineFilter::parse("").matches(b""));
        // Bytes that are not UTF-8 around a match do not hide it.
        assert!(LineFilter::parse("ok").matches(b"\xff\xfeok\xff\n"));
        // A needle can end at the newline.
        assert!(LineFilter::parse("end\n").matches(b"the end\n"));
        assert!(!LineFilter::parse("end\n").matches(b"the end"));
        // Repeated first bytes.
        assert!(LineFilter::parse("aab").matches(b"aaab"));
    }

    #[test]
    fn a_file_that_cannot_be_created_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("filtered_stdout.log"), b"there").expect("write");
        let at = crate::files::FileAt::new(
            Arc::new(crate::files::Dir::open_base(dir.path(), "--log-dir").expect("open")),
            "filtered_stdout.log",
        );
        let f = FilteredFile::create(&at);
        f.write(b"line\n");
        assert!(f.warned.load(Ordering::Relaxed));
        assert_eq!(std::fs::read(at.path()).expect("read"), b"there");
    }
}
