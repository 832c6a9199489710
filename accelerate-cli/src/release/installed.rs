//! Finding the installed accelerate's version on disk, without Python.
//!
//! The interpreter is the one `accel launch` would start
//! ([`crate::python::interpreter`]: `PYTHON_EXEC`, else `python3` on
//! `PATH`). Its package directories are worked out the way Python's `site`
//! module builds `sys.path`, as far as installed packages go:
//! `PYTHONPATH` first; in a virtual environment (a `pyvenv.cfg` beside or
//! above its `bin/`), the environment's `lib/pythonX.Y/site-packages`, then,
//! with `include-system-site-packages = true`, the base installation's;
//! outside one, the user's `~/.local/lib/pythonX.Y/site-packages` and the
//! installation's `site-packages`/`dist-packages` (Debian's layout too).
//! Each site directory's `.pth` files add the directories they list (lines
//! that are not comments or `import` statements), after the site
//! directories, as `site` does.
//!
//! The first directory holding an `accelerate-X.Y.Z.dist-info` (or a
//! versioned `.egg-info`) decides, as `importlib.metadata` finds the first;
//! two in one directory (a stale one left behind) resolve to the higher.
//! Every read is a `read_dir` or a small file: microseconds, where starting
//! Python to ask would cost a good part of a second.

use std::fs;
use std::path::{Path, PathBuf};

use super::Version;

/// An accelerate found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its version.
    pub version: Version,
    /// Its metadata directory (`.../site-packages/accelerate-1.16.0.dist-info`).
    pub metadata: PathBuf,
}

/// The accelerate that `env`'s interpreter would import, if any.
pub fn find(env: &dyn Fn(&str) -> Option<String>) -> Option<Found> {
    let program = crate::python::interpreter(env);
    let interpreter = if program.contains('/') {
        PathBuf::from(&program)
    } else {
        crate::find_program(&program, env)?
    };
    let home = env("HOME").map(PathBuf::from);
    let pythonpath = env("PYTHONPATH").unwrap_or_default();
    find_in(&search_path(&interpreter, &pythonpath, home.as_deref()))
}

/// The directories, in `sys.path` order, where `interpreter` looks for
/// installed packages.
pub fn search_path(interpreter: &Path, pythonpath: &str, home: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = pythonpath
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    let mut sites = Vec::new();
    let bin = interpreter.parent().unwrap_or(Path::new("."));
    let venv = [Some(bin), bin.parent()]
        .into_iter()
        .flatten()
        .find(|d| d.join("pyvenv.cfg").is_file())
        .map(Path::to_path_buf);
    let xy = python_xy(interpreter);
    match venv {
        Some(root) => {
            let cfg = fs::read_to_string(root.join("pyvenv.cfg")).unwrap_or_default();
            sites.extend(lib_dirs(&root, xy.as_deref(), &["site-packages"]));
            if cfg_value(&cfg, "include-system-site-packages")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
            {
                if let Some(base_bin) = cfg_value(&cfg, "home") {
                    let base_xy = xy.clone().or_else(|| cfg_version(&cfg));
                    sites.extend(system_sites(Path::new(&base_bin), base_xy.as_deref(), home));
                }
            }
        }
        None => {
            let real = fs::canonicalize(interpreter).unwrap_or_else(|_| interpreter.to_path_buf());
            let xy = python_xy(&real).or(xy);
            let real_bin = real.parent().unwrap_or(Path::new("."));
            sites.extend(system_sites(real_bin, xy.as_deref(), home));
        }
    }
    let mut added = Vec::new();
    for site in &sites {
        added.extend(pth_dirs(site));
    }
    dirs.extend(sites);
    dirs.extend(added);
    dirs
}

/// The base installation's site directories for the interpreter in `bin`:
/// the user's first, then the prefix's (`bin/..`).
fn system_sites(bin: &Path, xy: Option<&str>, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let (Some(home), Some(xy)) = (home, xy) {
        out.push(home.join(format!(".local/lib/python{xy}/site-packages")));
    }
    let prefix = bin.parent().unwrap_or(Path::new("/"));
    out.extend(lib_dirs(&prefix.join("local"), xy, &["dist-packages"]));
    out.extend(lib_dirs(prefix, xy, &["site-packages", "dist-packages"]));
    if prefix.join("lib/python3/dist-packages").is_dir() {
        out.push(prefix.join("lib/python3/dist-packages"));
    }
    out
}

/// `root/lib/pythonX.Y/<leaf>` for the interpreter's X.Y, or for every
/// `python3.*` directory there when the version is unknown (a venv's
/// `python` symlink says nothing); `lib64` too (Fedora's layout).
fn lib_dirs(root: &Path, xy: Option<&str>, leaves: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let lib = root.join(lib);
        let versions: Vec<String> = match xy {
            Some(xy) => vec![format!("python{xy}")],
            None => {
                let mut names: Vec<String> = fs::read_dir(&lib)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with("python3.") && python_xy_of(n).is_some())
                    .collect();
                names.sort();
                names
            }
        };
        for v in versions {
            for leaf in leaves {
                let dir = lib.join(&v).join(leaf);
                if dir.is_dir() && !out.contains(&dir) {
                    out.push(dir);
                }
            }
        }
    }
    out
}

/// `3.11` from an interpreter named `python3.11`.
fn python_xy(interpreter: &Path) -> Option<String> {
    python_xy_of(interpreter.file_name()?.to_str()?)
}

fn python_xy_of(name: &str) -> Option<String> {
    let rest = name.strip_prefix("python")?;
    let (major, minor) = rest.split_once('.')?;
    (major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok()).then(|| rest.to_owned())
}

/// A `key = value` line of `pyvenv.cfg`.
fn cfg_value(cfg: &str, key: &str) -> Option<String> {
    cfg.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// `3.11` from `pyvenv.cfg`'s `version = 3.11.2` (or `version_info`).
fn cfg_version(cfg: &str) -> Option<String> {
    let v = cfg_value(cfg, "version").or_else(|| cfg_value(cfg, "version_info"))?;
    let mut parts = v.split('.');
    Some(format!("{}.{}", parts.next()?, parts.next()?))
}

/// The directories a site directory's `.pth` files add, in file-name order
/// (as `site` reads them); relative lines are relative to the site directory.
fn pth_dirs(site: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(site)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pth"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        // A .pth file is a few lines; a huge one is not worth reading.
        let Ok(meta) = fs::metadata(&file) else {
            continue;
        };
        if meta.len() > 64 * 1024 {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty()
                || line.starts_with('#')
                || line.starts_with("import ")
                || line.starts_with("import\t")
            {
                continue;
            }
            let dir = site.join(line);
            if dir.is_dir() && !out.contains(&dir) {
                out.push(dir);
            }
        }
    }
    out
}

/// The first of `dirs` that holds accelerate's metadata.
pub fn find_in(dirs: &[PathBuf]) -> Option<Found> {
    dirs.iter().find_map(|d| in_dir(d))
}

/// accelerate's metadata in one directory: the highest version when there
/// are several; names that are not `accelerate-<version>.dist-info` (or
/// `.egg-info`) with a readable version are ignored.
fn in_dir(dir: &Path) -> Option<Found> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = metadata_version(&name)?;
            Some(Found {
                version,
                metadata: e.path(),
            })
        })
        .max_by_key(|f| f.version)
}

/// The version in `accelerate-1.16.0.dist-info` or
/// `accelerate-1.16.0-py3.11.egg-info` (the project name in any case).
pub fn metadata_version(name: &str) -> Option<Version> {
    let stem = name
        .strip_suffix(".dist-info")
        .or_else(|| name.strip_suffix(".egg-info"))?;
    let (project, rest) = stem.split_once('-')?;
    if !project.eq_ignore_ascii_case("accelerate") {
        return None;
    }
    let version = rest.split('-').next()?;
    // The whole version text must be a version (`accelerate-foo.dist-info` is not).
    if !version.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Version::parse(version)
}
