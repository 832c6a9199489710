//! Per-job and per-attempt worker files, in torchrun's layout:
//! `<log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/error.json`, where
//! `<log_dir>` defaults to a new `torchelastic_*` directory under the system
//! temporary directory and `N` is the job-wide restart count (see
//! [`Dir::attempt_dir`] for rounds that share one).
//!
//! # Private, whatever the umask
//! Worker logs hold what workers print (tokens, passwords), so everything
//! made here is private to the job's user: directories 0700, files 0600,
//! as torchrun's `mkdtemp` run directory is. The mode is set exactly with
//! `fchmod` after creation; the umask can neither widen nor narrow it.
//!
//! # Never through a link someone planted
//! A [`Dir`] is an open directory handle. Everything below the log
//! directory is created relative to such a handle (`mkdirat`, `openat`)
//! with `O_NOFOLLOW` and `O_EXCL`, so renaming a directory of the job and
//! planting a symbolic link in its place between rounds redirects nothing:
//! the agent keeps writing into the directory it created.
//!
//! The base directory (`--log-dir`, or the temporary directory the
//! `torchelastic_*` directory is made in) is checked when it is opened
//! ([`Dir::open_base`]); it is refused when
//! - its last component is a symbolic link (pass the real path);
//! - it belongs to another user than the agent's and not to root: that user
//!   could swap the job's directories for links, and the paths given to
//!   workers (`TORCHELASTIC_ERROR_FILE`) are followed by the workers. A root
//!   agent refuses it too: root must never write where another user decides;
//! - others may write into it without the sticky bit, for the same reason
//!   (with the sticky bit, as on `/tmp`, only the owner of an entry may
//!   rename it): world-writable always; group-writable when the agent is
//!   root (its workers run as root and follow paths). A group-writable
//!   project directory of an unprivileged agent is accepted: its group's
//!   members are trusted with the user's files there anyway.
//!
//! The parents of the base directory are not checked: whoever can rename
//! one of them can move the log directory after the agent opened it. The
//! agent's own writes still land in the directory it opened; the workers'
//! (which follow paths) may not. Use a log directory whose parents only
//! root and the job's user can write.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode, SFlag};

use crate::error::AgentError;

/// Mode of every directory the agent makes for a job.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file the agent makes for a job.
pub(crate) const FILE_MODE: u32 = 0o600;

/// An open directory: a handle to create beneath without following links,
/// and its path, for messages and for the paths workers are given.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A file in a [`Dir`], created on demand ([`FileAt::create`]).
#[derive(Debug, Clone)]
pub struct FileAt {
    dir: Arc<Dir>,
    name: String,
}

impl PartialEq for FileAt {
    fn eq(&self, other: &Self) -> bool {
        self.path() == other.path()
    }
}

impl Eq for FileAt {}

impl FileAt {
    /// The file `name` in `dir`.
    pub fn new(dir: Arc<Dir>, name: impl Into<String>) -> Self {
        Self {
            dir,
            name: name.into(),
        }
    }

    /// Its path (as workers and messages see it).
    pub fn path(&self) -> PathBuf {
        self.dir.path.join(&self.name)
    }

    /// Its directory.
    pub fn dir(&self) -> &Arc<Dir> {
        &self.dir
    }

    /// Its name in the directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates it: a new file, 0600, open for writing (see
    /// [`Dir::create_file`]).
    pub fn create(&self) -> io::Result<File> {
        self.dir.create_file(&self.name)
    }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Flags of a directory opened to create in: never a link.
fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

impl Dir {
    /// Opens the base directory the job's directories are created in,
    /// creating it (and its parents) when missing, and refuses it if it
    /// is not safe to write into (see the module docs). `what` names it in
    /// messages (`--log-dir`, `TMPDIR`).
    pub fn open_base(path: &Path, what: &str) -> Result<Self, AgentError> {
        // Without a trailing slash, which would make open() follow a link.
        let path: PathBuf = path.components().collect();
        if path.symlink_metadata().is_err() {
            // Missing directories are made private (0700 less the umask),
            // not 0777 less the umask as torchrun's `os.makedirs`.
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(&path)
                .map_err(|e| {
                    AgentError::io(format!("cannot create {what} {}", path.display()), e)
                })?;
        }
        let fd = match nix::fcntl::open(&path, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR)
                if path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                return Err(AgentError::Config(format!(
                    "{what} {} is a symbolic link; the agent does not write through links (someone could point it elsewhere): pass the directory it names (`realpath {}`)",
                    path.display(),
                    path.display()
                )))
            }
            Err(e) => {
                return Err(AgentError::io(
                    format!("cannot open {what} {}", path.display()),
                    errno(e),
                ))
            }
        };
        let st = fstat(&fd).map_err(|e| {
            AgentError::io(format!("cannot stat {what} {}", path.display()), errno(e))
        })?;
        if let Some(why) = unsafe_base(st.st_uid, st.st_mode, nix::unistd::geteuid().as_raw()) {
            return Err(AgentError::Config(format!(
                "{what} {} {why}",
                path.display()
            )));
        }
        Ok(Self { fd, path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the directory `name` (0700) and opens it. An existing entry
    /// of that name (directory, file or link) is an `AlreadyExists` error.
    pub fn create_dir(&self, name: &str) -> io::Result<Self> {
        mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(DIR_MODE)).map_err(errno)?;
        let fd = openat(self.fd.as_fd(), name, dir_flags(), Mode::empty()).map_err(errno)?;
        fchmod(&fd, Mode::from_bits_truncate(DIR_MODE)).map_err(errno)?;
        Ok(Self {
            fd,
            path: self.path.join(name),
        })
    }

    /// Creates the file `name` (0600) and opens it for writing. It must not
    /// exist: an existing file, or a link, is an `AlreadyExists` error.
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        let fd = openat(
            self.fd.as_fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(FILE_MODE),
        )
        .map_err(errno)?;
        fchmod(&fd, Mode::from_bits_truncate(FILE_MODE)).map_err(errno)?;
        Ok(File::from(fd))
    }

    /// Replaces the file `name` by one holding `bytes`, whole or not at all
    /// (written to a new temporary file, 0600, then renamed over it): a
    /// reader never sees half of it, and a link at `name` is replaced, not
    /// followed.
    pub fn replace_file(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write as _;
        let tmp = format!(".{name}.accel-{:016x}", fastrand::u64(..));
        let mut f = self.create_file(&tmp)?;
        let written = f.write_all(bytes).and_then(|()| {
            nix::fcntl::renameat(self.fd.as_fd(), tmp.as_str(), self.fd.as_fd(), name)
                .map_err(errno)
        });
        if written.is_err() {
            let _ = nix::unistd::unlinkat(
                self.fd.as_fd(),
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written
    }

    /// A new directory `<prefix><random>` in this one, 0700, a name nobody
    /// else held (as Python's `tempfile.mkdtemp`). It is kept: the worker
    /// files outlive the agent.
    fn fresh_dir(&self, prefix: &str) -> Result<Self, AgentError> {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for _ in 0..100 {
            let name: String = std::iter::once(prefix.to_owned())
                .chain((0..8).map(|_| (CHARS[fastrand::usize(..CHARS.len())] as char).to_string()))
                .collect();
            match self.create_dir(&name) {
                Ok(d) => return Ok(d),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(AgentError::io(
                        format!(
                            "cannot create a directory {prefix}* in {}",
                            self.path.display()
                        ),
                        e,
                    ))
                }
            }
        }
        Err(AgentError::io(
            format!(
                "cannot create a fresh directory {prefix}* in {}",
                self.path.display()
            ),
            io::Error::from(io::ErrorKind::AlreadyExists),
        ))
    }

    /// A new directory for one round's worker files: `attempt_<N>` for the
    /// first round with restart count N, then `attempt_<N>.1`,
    /// `attempt_<N>.2`, … for rounds that re-formed without a counted restart
    /// (membership changes). An existing attempt directory is never reused,
    /// emptied or deleted.
    pub fn attempt_dir(&self, attempt: u32) -> Result<Self, AgentError> {
        for k in 0u32..10_000 {
            let name = match k {
                0 => format!("attempt_{attempt}"),
                k => format!("attempt_{attempt}.{k}"),
            };
            match self.create_dir(&name) {
                Ok(d) => return Ok(d),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(AgentError::io(
                        format!("cannot create {}", self.path.join(name).display()),
                        e,
                    ))
                }
            }
        }
        Err(AgentError::io(
            format!(
                "cannot create a fresh attempt directory in {}",
                self.path.display()
            ),
            io::Error::from(io::ErrorKind::AlreadyExists),
        ))
    }

    /// The directory of `local_rank` in an attempt, created.
    pub fn rank_dir(&self, local_rank: u32) -> Result<Self, AgentError> {
        let name = local_rank.to_string();
        self.create_dir(&name).map_err(|e| {
            AgentError::io(
                format!("cannot create {}", self.path.join(&name).display()),
                e,
            )
        })
    }
}

/// Why a base directory owned by `uid` with `mode` must not be written by
/// an agent running as `euid`, if it must not.
fn unsafe_base(uid: u32, mode: u32, euid: u32) -> Option<String> {
    if uid != euid && uid != 0 {
        return Some(format!(
            "belongs to user {uid}, not to this agent's user ({euid}) or root: that user could swap the job's directories for links to files the agent or its workers would then write; pass a directory of your own"
        ));
    }
    let sticky = mode & 0o1000 != 0;
    // World-writable: anyone. Group-writable: the group's members, whom a
    // root agent (whose workers run as root) must not trust either; a shared
    // project directory (`drwxrwsr-x`) is fine for an unprivileged agent.
    let others_write = mode & 0o002 != 0 || (euid == 0 && mode & 0o020 != 0);
    if others_write && !sticky {
        return Some(format!(
            "is writable by others (mode {:o}) without the sticky bit: they could swap the job's directories for links{}; use a directory only you can write (`chmod go-w`), or set the sticky bit (`chmod +t`)",
            mode & 0o7777,
            if mode & 0o002 == 0 { " that this root agent's workers would follow" } else { "" }
        ));
    }
    None
}

/// Checks `--log-dir` at start-up (before the job forms), so that a refused
/// directory fails the agent at once with a clear message.
pub(crate) fn check_log_dir(log_dir: Option<&Path>) -> Result<(), AgentError> {
    match log_dir {
        Some(d) => Dir::open_base(d, "--log-dir").map(drop),
        None => Dir::open_base(&std::env::temp_dir(), "the temporary directory (TMPDIR)").map(drop),
    }
}

/// Creates this agent's run directory under `log_dir` (or a new
/// `torchelastic_*` directory in the temporary directory).
pub(crate) fn run_dir(log_dir: Option<&Path>, run_id: &str) -> Result<Arc<Dir>, AgentError> {
    let base = match log_dir {
        Some(d) => Dir::open_base(d, "--log-dir")?,
        None => Dir::open_base(&std::env::temp_dir(), "the temporary directory (TMPDIR)")?
            .fresh_dir("torchelastic_")?,
    };
    let safe: String = run_id
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    base.fresh_dir(&format!("{safe}_")).map(Arc::new)
}

/// What a worker's file (its error file) is, read without ever blocking:
/// `Some(file)` open for reading if it is a regular file, `None` if it does
/// not exist, and `Err(kind)` naming what it is otherwise (a FIFO, a link, a
/// device, a directory), which is not read.
///
/// Opened with `O_NONBLOCK` (a FIFO does not wait for a writer),
/// `O_NOFOLLOW` (a link is not followed) and `O_NOCTTY`, then checked with
/// `fstat`.
pub(crate) fn open_worker_file(path: &Path) -> Result<Option<File>, &'static str> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NONBLOCK
        | OFlag::O_NOFOLLOW
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => return Ok(None),
        Err(Errno::ELOOP) => return Err("a symbolic link"),
        Err(_) => return Err("not readable"),
    };
    let st = fstat(&fd).map_err(|_| "not readable")?;
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Ok(Some(File::from(fd))),
        SFlag::S_IFIFO => Err("a named pipe (FIFO)"),
        SFlag::S_IFDIR => Err("a directory"),
        SFlag::S_IFCHR | SFlag::S_IFBLK => Err("a device"),
        SFlag::S_IFSOCK => Err("a socket"),
        _ => Err("not a regular file"),
    }
}

/// Writes `bytes` to a file whose path someone else gave (a parent
/// launcher's `TORCHELASTIC_ERROR_FILE`): created 0600 if new, never through
/// a link (`O_NOFOLLOW`), never waiting on a named pipe (`O_NONBLOCK`), and
/// only if it is a regular file.
pub(crate) fn write_given_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    let fd = nix::fcntl::open(
        path,
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(errno)?;
    let st = fstat(&fd).map_err(errno)?;
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file; not written",
        ));
    }
    // The umask may have narrowed it; a file of another owner keeps its mode.
    let _ = fchmod(&fd, Mode::from_bits_truncate(FILE_MODE));
    let mut file = File::from(fd);
    file.set_len(0)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt as _};

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    #[test]
    fn a_symlinked_base_is_refused_naming_the_flag_and_the_fix() {
        let s = scratch();
        let real = s.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = s.path().join("link");
        symlink(&real, &link).expect("symlink");
        for given in [link.clone(), PathBuf::from(format!("{}/", link.display()))] {
            let err = Dir::open_base(&given, "--log-dir").expect_err("a link is refused");
            let msg = err.to_string();
            assert!(
                msg.contains("--log-dir")
                    && msg.contains("symbolic link")
                    && msg.contains("realpath"),
                "{msg}"
            );
            assert_eq!(err.exit_code(), 2);
        }
        assert!(Dir::open_base(&real, "--log-dir").is_ok());
        assert_eq!(
            std::fs::read_dir(&real).expect("ls").count(),
            0,
            "nothing written"
        );
    }

    #[test]
    fn bases_others_control_are_refused() {
        // Another non-root user's: refused, also for root.
        for euid in [0, 1000] {
            assert!(unsafe_base(4242, 0o40700, euid)
                .expect("refused")
                .contains("user 4242"));
        }
        // Own or root's, private: fine.
        assert_eq!(unsafe_base(1000, 0o40755, 1000), None);
        assert_eq!(unsafe_base(0, 0o40755, 1000), None);
        // World writable: refused, unless sticky (as /tmp).
        for mode in [0o40757, 0o40777] {
            assert!(unsafe_base(1000, mode, 1000)
                .expect("refused")
                .contains("chmod"));
        }
        // Group writable: a shared project directory, fine for a user's
        // agent; refused for root's, unless sticky.
        assert_eq!(unsafe_base(1000, 0o42775, 1000), None);
        assert!(unsafe_base(0, 0o42775, 0)
            .expect("refused")
            .contains("root agent"));
        assert_eq!(unsafe_base(0, 0o43775, 0), None);
        assert_eq!(unsafe_base(0, 0o41777, 1000), None);
    }

    #[test]
    fn nothing_is_created_through_a_link_or_over_an_existing_entry() {
        let s = scratch();
        let target = s.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        let base = s.path().join("base");
        std::fs::create_dir(&base).expect("mkdir");
        let dir = Dir::open_base(&base, "--log-dir").expect("open");
        symlink(&target, base.join("linked")).expect("symlink");
        symlink(target.join("f"), base.join("f")).expect("symlink");
        std::fs::write(base.join("existing"), b"keep").expect("write");
        let e = dir
            .create_dir("linked")
            .expect_err("a link is not a directory to use");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let e = dir
            .create_file("f")
            .expect_err("O_EXCL: a link is not followed");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let e = dir.create_file("existing").expect_err("O_EXCL");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(base.join("existing")).expect("read"), b"keep");
        // A replaced file replaces the link, the target stays untouched.
        dir.replace_file("f", b"new").expect("replace");
        assert!(!base
            .join("f")
            .symlink_metadata()
            .expect("stat")
            .is_symlink());
        assert_eq!(std::fs::read_dir(&target).expect("ls").count(), 0);
    }

    #[test]
    fn a_renamed_directory_keeps_receiving_the_writes() {
        // The run directory swapped for a link between rounds: the handle
        // still names the directory the agent made.
        let s = scratch();
        let base = Dir::open_base(s.path(), "--log-dir").expect("open");
        let run = base.fresh_dir("job_").expect("run dir");
        let name = run.path().file_name().expect("name").to_owned();
        assert!(name.to_string_lossy().starts_with("job_") && name.len() == 12);
        let target = s.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::rename(run.path(), s.path().join("moved")).expect("rename");
        symlink(&target, run.path()).expect("symlink");
        let attempt = run.attempt_dir(1).expect("attempt");
        attempt
            .rank_dir(0)
            .expect("rank")
            .create_file("stdout.log")
            .expect("log");
        assert_eq!(std::fs::read_dir(&target).expect("ls").count(), 0);
        assert!(s.path().join("moved/attempt_1/0/stdout.log").is_file());
    }

    #[test]
    fn attempt_dirs_are_never_reused() {
        let s = scratch();
        let base = Dir::open_base(s.path(), "--log-dir").expect("open");
        let names: Vec<String> = (0..3)
            .map(|_| {
                let d = base.attempt_dir(2).expect("attempt");
                d.path()
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["attempt_2", "attempt_2.1", "attempt_2.2"]);
    }

    #[test]
    fn a_given_file_is_written_private_never_through_a_link_nor_a_fifo() {
        let s = scratch();
        let p = s.path();
        let file = p.join("parent_error.json");
        std::fs::write(&file, b"a longer old content").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_given_file(&file, b"{}").expect("write");
        assert_eq!(std::fs::read(&file).expect("read"), b"{}");
        let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o600);
        symlink(&file, p.join("link")).expect("symlink");
        assert!(write_given_file(&p.join("link"), b"x").is_err());
        nix::unistd::mkfifo(&p.join("fifo"), Mode::from_bits_truncate(0o600)).expect("mkfifo");
        // No reader: O_NONBLOCK fails at once instead of waiting for one.
        assert!(write_given_file(&p.join("fifo"), b"x").is_err());
        assert_eq!(std::fs::read(&file).expect("read"), b"{}");
    }

    #[test]
    fn worker_files_are_read_only_when_regular() {
        let s = scratch();
        let p = s.path();
        std::fs::write(p.join("regular"), b"{}").expect("write");
        nix::unistd::mkfifo(&p.join("fifo"), Mode::from_bits_truncate(0o600)).expect("mkfifo");
        symlink(p.join("regular"), p.join("link")).expect("symlink");
        std::fs::create_dir(p.join("dir")).expect("mkdir");
        assert!(matches!(open_worker_file(&p.join("regular")), Ok(Some(_))));
        assert!(matches!(open_worker_file(&p.join("missing")), Ok(None)));
        assert_eq!(
            open_worker_file(&p.join("fifo")).err(),
            Some("a named pipe (FIFO)")
        );
        assert_eq!(
            open_worker_file(&p.join("link")).err(),
            Some("a symbolic link")
        );
        assert_eq!(open_worker_file(&p.join("dir")).err(), Some("a directory"));
        assert_eq!(
            open_worker_file(Path::new("/dev/null")).err(),
            Some("a device")
        );
    }
}
