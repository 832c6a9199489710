//! The guide's commands run as written: every code block of `README.md`,
//! `python/README.md` and `docs/src/**/*.md` marked, on the line right
//! before its opening fence, with
//!
//! ```text
//! <!-- runs as written: tests/tests/guide.rs -->
//! ```
//!
//! (an HTML comment: mdBook and GitHub show nothing) is run here as a user
//! would paste it, and must exit 0. `sh`/`bash` blocks run with
//! `bash -euo pipefail`, `python` blocks with the pinned venv's Python.
//!
//! Each block runs in a fresh scratch directory that is also its `HOME`
//! (so `~/.config/...` is the scratch's), with a `PATH` that holds the built
//! `accel-agent`, `rdzv-server` and `accel` first, then the venv's `bin/`
//! (`python3`, `torch`, `accelerate`), and with the Python package `accel`
//! importable from `python/` (as `pip install .` would make it). Besides
//! that, the scratch directory holds what a guide block may take for granted
//! in a user's own directory ([`FIXTURES`]):
//! - `train.py`: the user's training script; it prints its rank and its
//!   arguments, and needs no torch.
//!
//! A block has [`TIMEOUT`] to finish; whatever it leaves running (a server
//! in the background of a failed block) is killed with its process group.
//! Blocks that bind fixed ports (the guide picks ones below 10000, which the
//! harness never leases to other tests, see `accel_tests::lease`) run one
//! at a time machine-wide, under a lock file, so two clones running the
//! suite do not meet on them.

use std::fs;
use std::os::unix::io::AsRawFd as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use accel_tests::{bin, scratch, venv};

/// The marker line, right before a block's opening fence.
const MARKER: &str = "<!-- runs as written: tests/tests/guide.rs -->";

/// How many marked blocks the guide holds at least: the test fails with
/// fewer, so it cannot pass by finding none (a marker misspelt, a page
/// moved out of `docs/src`). Raise it when marking more.
const MIN_BLOCKS: usize = 3;

/// How long one block may run (on a loaded two-core machine, the multi-node
/// block starts four PyTorch processes).
const TIMEOUT: Duration = Duration::from_secs(300);

/// Files in every block's scratch directory before it runs: what the guide
/// calls the user's own (see the module's docs).
const FIXTURES: &[(&str, &str)] = &[(
    "train.py",
    "import os\nimport sys\n\n\
     print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: train.py {' '.join(sys.argv[1:])}\", flush=True)\n",
)];

/// One marked block.
#[derive(Debug)]
struct Block {
    /// The Markdown file, relative to the repository's root.
    file: PathBuf,
    /// The opening fence's line (1-based).
    line: usize,
    /// The fence's language (`sh`, `bash`, `python`).
    lang: String,
    body: String,
}

impl Block {
    fn place(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository's root")
        .to_owned()
}

/// The Markdown files searched for marked blocks.
fn guide_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root.join("README.md"), root.join("python/README.md")];
    walk(&root.join("docs/src"), &mut files);
    files
}

/// The opening fence of a code block: its character (a backtick or a
/// tilde), how many (three or more), and its language.
fn fence(line: &str) -> Option<(char, usize, String)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let ch = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = rest.chars().take_while(|c| *c == ch).count();
    if indent > 3 || len < 3 {
        return None;
    }
    let lang = rest[len..].split_whitespace().next().unwrap_or("");
    Some((ch, len, lang.to_lowercase()))
}

/// Whether `line` closes a block opened with `len` times `ch`: only that
/// character, at least as many times.
fn closes(line: &str, ch: char, len: usize) -> bool {
    let t = line.trim();
    t.len() >= len && t.chars().all(|c| c == ch)
}

/// The marked blocks of one Markdown text; a marker that is not followed
/// by a fence is an error (naming its line).
fn marked_blocks(file: &Path, text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut marked_at: Option<usize> = None;
    let mut i = 0;
    while i < lines.len() {
        let Some((ch, len, lang)) = fence(lines[i]) else {
            if let Some(at) = marked_at.take() {
                return Err(format!(
                    "{}:{}: the marker is not right before a code block's opening fence",
                    file.display(),
                    at + 1
                ));
            }
            if lines[i].trim() == MARKER {
                marked_at = Some(i);
            }
            i += 1;
            continue;
        };
        // The block's body, to its closing fence (or the end of the file).
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() {
            if closes(lines[i], ch, len) {
                break;
            }
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        i += 1;
        if marked_at.take().is_some() {
            blocks.push(Block {
                file: file.to_owned(),
                line: start + 1,
                lang,
                body,
            });
        }
    }
    if let Some(at) = marked_at {
        return Err(format!(
            "{}:{}: the marker is not followed by a code block",
            file.display(),
            at + 1
        ));
    }
    Ok(blocks)
}

/// Holds an exclusive lock (machine-wide, every clone's runs) until dropped.
struct MachineLock {
    _file: fs::File,
}

impl MachineLock {
    fn take() -> MachineLock {
        let path = std::env::temp_dir().join("accel-tests-guide.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        // Every user's runs share it (only its owner can widen it).
        let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        // SAFETY: flock on a descriptor this struct owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(
            rc,
            0,
            "flock {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        MachineLock { _file: file }
    }
}

/// Runs one block in a fresh scratch directory; `Err` says why it failed.
fn run(block: &Block, root: &Path) -> Result<(), String> {
    let dir = scratch("guide");
    let home = dir.join("home");
    fs::create_dir(&home).expect("create the block's directory");
    for (name, text) in FIXTURES {
        fs::write(home.join(name), text).expect("write a fixture");
    }
    let (script, program, args): (PathBuf, PathBuf, Vec<&str>) = match block.lang.as_str() {
        "sh" | "bash" | "shell" => (
            dir.join("block.sh"),
            PathBuf::from("bash"),
            vec!["-euo", "pipefail"],
        ),
        "python" => (dir.join("block.py"), venv().join("bin/python"), vec![]),
        other => {
            return Err(format!(
                "{}: a ```{other} block is marked, and only sh, bash and python blocks can run",
                block.place()
            ))
        }
    };
    fs::write(&script, &block.body).expect("write the block");
    let log_path = dir.join("output.log");
    let log = fs::File::create(&log_path).expect("create the block's log");
    let agent = bin("accel-agent");
    for other in ["rdzv-server", "accel"] {
        bin(other);
    }
    let bins = agent.parent().expect("the binaries' directory");
    let path = format!(
        "{}:{}:{}",
        bins.display(),
        venv().join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(&program);
    cmd.args(&args)
        .arg(&script)
        .current_dir(&home)
        // A user's shell: none of this run's own settings (tokens, PET_*,
        // the test harness's variables) leak in.
        .env_clear()
        .env("PATH", path)
        .env("HOME", &home)
        .env("PYTHONPATH", root.join("python"))
        // The launchers' agent is the built one, whatever the venv holds.
        .env("ACCEL_AGENT", &agent)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .process_group(0);
    for keep in ["TMPDIR", "LANG", "LC_ALL", "USER", "LOGNAME"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
    let pid = child.id() as libc::pid_t;
    // Waits for the block without reaping it, so that its process group
    // (whose id is its pid) cannot be reused before it is killed.
    let exited = loop {
        // SAFETY: siginfo_t is plain data, for which all zeroes is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`, which lives on this stack.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
        // SAFETY: si_pid is set by waitid (0 while the child runs).
        if unsafe { info.si_pid() } != 0 {
            break true;
        }
        if started.elapsed() > TIMEOUT {
            break false;
        }
        thread::sleep(Duration::from_millis(100));
    };
    // What the block left in the background goes with it (and the block
    // itself, on a timeout).
    // SAFETY: killpg takes plain integers and touches no memory.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    let status = child.wait().expect("reap the block");
    let took = started.elapsed().as_secs_f64();
    if exited && status.success() {
        eprintln!("guide: {} ran in {took:.1} s", block.place());
        return Ok(());
    }
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = output.lines().rev().take(60).collect();
    let how = if !exited {
        format!("did not finish within {} s", TIMEOUT.as_secs())
    } else if let Some(code) = status.code() {
        format!("exited with {code} after {took:.1} s")
    } else {
        format!(
            "was killed by signal {} after {took:.1} s",
            status.signal().unwrap_or(0)
        )
    };
    let mut shown = vec![program.display().to_string()];
    shown.extend(args.iter().map(|a| (*a).to_owned()));
    shown.push(script.display().to_string());
    Err(format!(
        "{}: the ```{} block marked \"runs as written\" {how} (run as `{}` in {}, its HOME); \
         the last lines of its output:\n{}",
        block.place(),
        block.lang,
        shown.join(" "),
        home.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

#[test]
fn the_guides_marked_blocks_run_as_written() {
    let root = root();
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    for path in guide_files(&root) {
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let rel = path.strip_prefix(&root).unwrap_or(&path);
        match marked_blocks(rel, &text) {
            Ok(found) => blocks.extend(found),
            Err(e) => errors.push(e),
        }
    }
    assert!(
        blocks.len() >= MIN_BLOCKS,
        "found {} block(s) marked `{MARKER}` in README.md, python/README.md and docs/src, \
         expected at least {MIN_BLOCKS}: {blocks:#?}",
        blocks.len()
    );
    // Blocks start PyTorch processes, and bind the guide's fixed ports.
    let _heavy = crate::heavy();
    let _lock = MachineLock::take();
    for block in &blocks {
        if let Err(e) = run(block, &root) {
            errors.push(e);
        }
    }
    assert!(
        errors.is_empty(),
        "{} of {} marked block(s) failed:\n\n{}",
        errors.len(),
        blocks.len(),
        errors.join("\n\n")
    );
}

#[test]
fn markers_are_found_only_before_a_fence_and_outside_code() {
    let text = format!(
        "# Page\n\n{MARKER}\n```sh\necho one\n```\n\n````markdown\n{MARKER}\n```sh\nnot run\n```\n````\n\n\
         {MARKER}\n~~~python\nprint(2)\n~~~\n"
    );
    let blocks = marked_blocks(Path::new("page.md"), &text).expect("well-formed");
    let found: Vec<(usize, &str, &str)> = blocks
        .iter()
        .map(|b| (b.line, b.lang.as_str(), b.body.as_str()))
        .collect();
    assert_eq!(
        found,
        [(4, "sh", "echo one\n"), (16, "python", "print(2)\n")]
    );
    let stray = format!("text\n{MARKER}\n\n```sh\ntrue\n```\n");
    let err = marked_blocks(Path::new("page.md"), &stray).expect_err("a gap after the marker");
    assert!(err.starts_with("page.md:2: "), "{err}");
}
