//! The pump and the console writer, with pipes given as byte slices.

use super::*;

/// A console whose lines a test can read.
fn test_console() -> (Console, Receiver<Line>) {
    let (tx, rx) = sync_channel(CONSOLE_QUEUE);
    (
        Console {
            tx,
            dropped: Default::default(),
        },
        rx,
    )
}

fn to(console: Console, prefix: &[u8], err: bool) -> Option<ToConsole> {
    Some(ToConsole {
        console,
        prefix: prefix.to_vec(),
        err,
        filtered: None,
    })
}

/// [`pump`] into the file at `path`, opened as `open` does.
async fn pump(
    pipe: impl AsyncRead + Unpin,
    path: &Path,
    rank: &RankFiles,
    console: Option<ToConsole>,
) -> io::Result<()> {
    let owned = path.to_path_buf();
    pump_into(pipe, path, move || open(&owned), rank, console).await
}

fn open(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

#[tokio::test]
async fn the_log_file_is_created_private_and_new() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let at = FileAt::new(
        Arc::new(crate::files::Dir::open_base(dir.path(), "--log-dir").expect("open")),
        "stdout.log",
    );
    let rank = RankFiles::new(0);
    super::pump(&b"secret\n"[..], &at, &rank, None)
        .await
        .expect("pump");
    assert!(!rank.failed());
    let meta = std::fs::metadata(at.path()).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!(std::fs::read(at.path()).expect("log"), b"secret\n");
    // A second pump into the same name does not truncate nor follow: it
    // reports the file once and drains the pipe.
    let rank = RankFiles::new(0);
    super::pump(&b"more\n"[..], &at, &rank, None)
        .await
        .expect("drained");
    assert!(rank.failed());
    assert_eq!(std::fs::read(at.path()).expect("log"), b"secret\n");
}

/// A path for one test's log file, in a fresh directory (kept: a failing
/// test's file can be read).
fn tmp(name: &str) -> std::path::PathBuf {
    tempfile::Builder::new()
        .prefix("accel-tee-")
        .tempdir()
        .expect("scratch dir")
        .keep()
        .join(name)
}

#[tokio::test]
async fn lines_stay_whole_and_files_get_every_byte() {
    let (console, rx) = test_console();
    let input: &[u8] = b"one\ntw\xffo\nthree without newline";
    let file = tmp("whole");
    pump(
        input,
        &file,
        &RankFiles::new(0),
        to(console, b"[p]:", false),
    )
    .await
    .expect("pump");
    let lines: Vec<Vec<u8>> = rx.try_iter().map(|l| l.bytes).collect();
    assert_eq!(
        lines,
        vec![
            b"[p]:one\n".to_vec(),
            b"[p]:tw\xffo\n".to_vec(),
            b"[p]:three without newline\n".to_vec()
        ]
    );
    assert_eq!(
        std::fs::read(&file).expect("log"),
        input,
        "the file is the raw stream"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn an_endless_line_reaches_the_console_in_bounded_pieces() {
    let (console, rx) = test_console();
    let input = vec![b'x'; 3 * MAX_LINE + 10];
    let file = tmp("long");
    pump(
        &input[..],
        &file,
        &RankFiles::new(0),
        to(console, b">", true),
    )
    .await
    .expect("pump");
    let sizes: Vec<usize> = rx.try_iter().map(|l| l.bytes.len()).collect();
    assert_eq!(
        sizes,
        vec![MAX_LINE + 2, MAX_LINE + 2, MAX_LINE + 2, 10 + 2]
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_full_console_drops_and_counts_but_the_file_keeps_all() {
    let (tx, _rx) = sync_channel(2);
    let console = Console {
        tx,
        dropped: Default::default(),
    };
    let input = b"a\nb\nc\nd\ne\n";
    let file = tmp("drop");
    pump(
        &input[..],
        &file,
        &RankFiles::new(0),
        to(console.clone(), b"", false),
    )
    .await
    .expect("pump");
    assert_eq!(console.dropped(), 3);
    assert_eq!(std::fs::read(&file).expect("log"), input);
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_full_disk_costs_the_file_not_the_stream() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    let (console, rx) = test_console();
    // More than one read's worth, fewer lines than the console queue holds.
    let input: Vec<u8> = (0..10_000)
        .flat_map(|i| format!("line {i}\n").into_bytes())
        .collect();
    let rank = RankFiles::new(3);
    pump(
        &input[..],
        Path::new("/dev/full"),
        &rank,
        to(console, b"", false),
    )
    .await
    .expect("the pipe is read to its end");
    assert!(rank.failed(), "the failure is reported");
    let shown: Vec<u8> = rx.try_iter().flat_map(|l| l.bytes).collect();
    assert!(shown == input, "every line still reaches the console");
    // Redirected only (no console): still read to the end.
    let rank = RankFiles::new(4);
    pump(&input[..], Path::new("/dev/full"), &rank, None)
        .await
        .expect("drained");
    assert!(rank.failed());
}

#[tokio::test]
async fn a_file_that_cannot_be_created_costs_the_file_only() {
    let (console, rx) = test_console();
    let rank = RankFiles::new(0);
    let missing = tmp("no-such-dir").join("stdout.log");
    pump(&b"a\nb\n"[..], &missing, &rank, to(console, b"> ", false))
        .await
        .expect("drained");
    assert!(rank.failed());
    let shown: Vec<Vec<u8>> = rx.try_iter().map(|l| l.bytes).collect();
    assert_eq!(shown, vec![b"> a\n".to_vec(), b"> b\n".to_vec()]);
}

#[tokio::test]
async fn a_writable_file_is_not_reported() {
    let rank = RankFiles::new(0);
    let file = tmp("fine");
    pump(&b"ok\n"[..], &file, &rank, None).await.expect("pump");
    assert!(!rank.failed());
    assert_eq!(std::fs::read(&file).expect("log"), b"ok\n");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn matching_lines_are_marked_for_the_filtered_file() {
    use crate::logs::filter::{Filtered, FilteredFile, LineFilter};
    let (console, rx) = test_console();
    let scratch = tempfile::tempdir().expect("tempdir");
    let at = FileAt::new(
        Arc::new(crate::files::Dir::open_base(scratch.path(), "--log-dir").expect("open")),
        "filtered_stdout.log",
    );
    let path = at.path();
    let filtered = Filtered {
        filter: Arc::new(LineFilter::parse("loss,,x,NaN")),
        file: FilteredFile::create(&at),
    };
    let input: &[u8] = b"step 1 loss,x=3\nplain\nNaN at the end";
    let mut to = to(console, b"[default1]:", false).expect("console");
    to.filtered = Some(filtered);
    pump(input, &tmp("stdout.log"), &RankFiles::new(1), Some(to))
        .await
        .expect("pump");
    let lines: Vec<Line> = rx.try_iter().collect();
    let marked: Vec<bool> = lines.iter().map(|l| l.dup.is_some()).collect();
    assert_eq!(marked, [true, false, true], "matched without the prefix");
    // What the writer thread does with a marked line.
    for line in &lines {
        if let Some(file) = &line.dup {
            file.write(&line.bytes);
        }
    }
    assert_eq!(
        std::fs::read(&path).expect("filtered file"),
        b"[default1]:step 1 loss,x=3\n[default1]:NaN at the end\n"
    );
}
