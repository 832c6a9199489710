//! The release table and the on-disk lookup.

use std::fs;
use std::path::{Path, PathBuf};

use super::installed::{find, find_in, metadata_version, search_path};
use super::*;

fn v(text: &str) -> Version {
    Version::parse(text).expect(text)
}

#[test]
fn versions_parse_and_order() {
    assert_eq!(v("1.16.0"), Version::new(1, 16, 0));
    assert_eq!(v("1.10"), Version::new(1, 10, 0));
    assert_eq!(v("1.17.0rc1"), Version::new(1, 17, 0));
    assert_eq!(v("1.17.0.dev0"), Version::new(1, 17, 0));
    assert_eq!(v("2.0.1.post3"), Version::new(2, 0, 1));
    for bad in ["", "1", "foo", "x.1.2", "1.x"] {
        assert_eq!(Version::parse(bad), None, "{bad}");
    }
    assert!(v("1.9.0") < v("1.10.0") && v("1.10.1") < v("1.16.0"));
    assert_eq!(v("1.10.1").to_string(), "1.10.1");
}

#[test]
fn the_table_is_ordered_and_ends_at_the_newest_known() {
    for pair in RELEASES.windows(2) {
        assert!(pair[0].since < pair[1].since, "{:?}", pair[1].since);
    }
    assert_eq!(RELEASES[0].since, Version::new(1, 10, 0));
    assert_eq!(RELEASES[RELEASES.len() - 1].since, NEWEST_KNOWN);
}

/// Each known release maps to the behaviour its sources have.
#[test]
fn each_known_release_behaves_as_its_sources() {
    let b = |x, y, z| Release::version(x, y, z).behaviour;
    for (x, y, z) in [(1, 10, 0), (1, 10, 1), (1, 11, 0)] {
        let r = b(x, y, z);
        assert_eq!(r.since, Version::new(1, 10, 0));
        assert_eq!(r.kmp_vars, KmpVars::Always);
        assert!(r.fsdp_min_num_params_float && r.ipex_questions && !r.parallelism_sequence);
        assert!(r.absent_flags.contains(&Dest::parallelism_config_sp_size));
        assert!(r.absent_flags.contains(&Dest::megatron_lm_use_custom_fsdp));
        assert!(!r.absent_flags.contains(&Dest::use_xpu));
        assert_eq!(r.fp8_backends, ["te", "msamp"]);
    }
    let r = b(1, 12, 0);
    assert!(r.parallelism_sequence && r.fsdp_min_num_params_float);
    assert!(!r.absent_flags.contains(&Dest::parallelism_config_sp_size));
    for (x, y, z) in [(1, 13, 0), (1, 14, 0)] {
        let r = b(x, y, z);
        assert_eq!(r.kmp_vars, KmpVars::Never);
        assert!(!r.fsdp_min_num_params_float && !r.ipex_questions);
        assert!(r.absent_flags.contains(&Dest::use_xpu));
        assert!(r
            .absent_flags
            .contains(&Dest::fsdp_activation_checkpointing_offload));
        assert_eq!(r.fp8_backends, ["ao", "te", "msamp"]);
        assert_eq!(r.dynamo_config_prefix, y == 14);
    }
    let r = b(1, 15, 0);
    assert_eq!(r.kmp_vars, KmpVars::OnCpu);
    assert_eq!(r.process_default, ProcessDefault::Devices);
    assert!(!r.dynamo_dynamic_optional && r.notebook_plain_mixed_precision);
    assert_eq!(r.absent_flags, [Dest::use_xpu, Dest::mpirun_ccl]);
    for (x, y, z) in [(1, 16, 0), (1, 16, 3)] {
        let r = b(x, y, z);
        assert_eq!(r.process_default, ProcessDefault::AtLeastOne);
        assert!(r.dynamo_dynamic_optional && !r.notebook_plain_mixed_precision);
        assert!(r.absent_flags.contains(&Dest::fp8_opt_level));
        assert_eq!(r.fp8_backends, ["ao", "te"]);
    }
}

#[test]
fn unknown_releases_warn_once_and_take_the_nearest_row() {
    // Known (patches included): no warning.
    for (x, y, z) in [(1, 10, 0), (1, 15, 0), (1, 16, 0), (1, 16, 9)] {
        assert_eq!(Release::version(x, y, z).warning(), None);
    }
    let newer = Release::version(1, 17, 0);
    assert_eq!(newer.behaviour.since, NEWEST_KNOWN);
    let w = newer.warning().expect("newer warns");
    assert!(
        w.contains("accelerate 1.17.0 is newer") && w.contains("1.16.0"),
        "{w}"
    );
    let older = Release::version(1, 9, 0);
    assert_eq!(older.behaviour.since, Version::new(1, 10, 0));
    let w = older.warning().expect("older warns");
    assert!(w.contains("1.9.0") && w.contains("oldest"), "{w}");
    // None installed: the newest behaviour, nothing to say.
    let none = Release::of(None);
    assert_eq!(none.behaviour.since, NEWEST_KNOWN);
    assert_eq!(none.warning(), None);
    assert_eq!(none.name(), NEWEST_KNOWN);
}

#[test]
fn metadata_names() {
    assert_eq!(
        metadata_version("accelerate-1.16.0.dist-info"),
        Some(v("1.16.0"))
    );
    assert_eq!(
        metadata_version("Accelerate-1.10.1.dist-info"),
        Some(v("1.10.1"))
    );
    assert_eq!(
        metadata_version("accelerate-1.12.0-py3.11.egg-info"),
        Some(v("1.12.0"))
    );
    assert_eq!(
        metadata_version("accelerate-1.17.0.dev0.dist-info"),
        Some(v("1.17.0"))
    );
    for bad in [
        "accelerate-foo.dist-info",
        "accelerate.dist-info",
        "accelerate-.dist-info",
        "accelerated-1.0.0.dist-info",
        "accelerate-1.16.0",
        "torch-2.13.0.dist-info",
        "accelerate.egg-info",
    ] {
        assert_eq!(metadata_version(bad), None, "{bad}");
    }
}

fn mkdirs(root: &Path, dirs: &[&str]) {
    for d in dirs {
        fs::create_dir_all(root.join(d)).expect("mkdir");
    }
}

/// A virtual environment: `bin/python3` (a file), `pyvenv.cfg`, and site-packages.
fn venv(root: &Path, cfg: &str) -> PathBuf {
    mkdirs(root, &["bin", "lib/python3.11/site-packages"]);
    fs::write(root.join("pyvenv.cfg"), cfg).expect("cfg");
    let py = root.join("bin/python3");
    fs::write(&py, "").expect("python");
    py
}

#[test]
fn venv_present_absent_several_and_malformed() {
    let t = tempfile::tempdir().expect("tmp");
    let py = venv(t.path(), "home = /nonexistent/bin\n");
    let site = t.path().join("lib/python3.11/site-packages");
    let found = |py: &Path| find_in(&search_path(py, "", None)).map(|f| f.version);
    // Absent.
    assert_eq!(found(&py), None);
    // A malformed name alone is no accelerate.
    mkdirs(
        &site,
        &[
            "accelerate-foo.dist-info",
            "accelerate",
            "torch-2.13.0.dist-info",
        ],
    );
    assert_eq!(found(&py), None);
    // Present.
    mkdirs(&site, &["accelerate-1.10.1.dist-info"]);
    assert_eq!(found(&py), Some(v("1.10.1")));
    // Several in one directory: the higher.
    mkdirs(&site, &["accelerate-1.16.0.dist-info"]);
    let f = find_in(&search_path(&py, "", None)).expect("found");
    assert_eq!(f.version, v("1.16.0"));
    assert_eq!(f.metadata, site.join("accelerate-1.16.0.dist-info"));
}

#[test]
fn order_pythonpath_then_site_then_pth() {
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("venv");
    let py = venv(
        &root,
        "home = /usr/bin\ninclude-system-site-packages = false\n",
    );
    let site = root.join("lib/python3.11/site-packages");
    // A .pth adds another environment's packages after the venv's own.
    let base = t.path().join("base-site");
    mkdirs(&base, &["accelerate-1.15.0.dist-info"]);
    fs::write(
        site.join("zz.pth"),
        format!("# comment\nimport os\n{}\nmissing-dir\n", base.display()),
    )
    .expect("pth");
    let found = |pp: &str| find_in(&search_path(&py, pp, None)).map(|f| f.version);
    assert_eq!(found(""), Some(v("1.15.0")));
    mkdirs(&site, &["accelerate-1.16.0.dist-info"]);
    assert_eq!(
        found(""),
        Some(v("1.16.0")),
        "the venv's own wins over .pth"
    );
    let pp = t.path().join("pp");
    mkdirs(&pp, &["accelerate-1.12.0.dist-info"]);
    assert_eq!(
        found(&format!("{}:", pp.display())),
        Some(v("1.12.0")),
        "PYTHONPATH first"
    );
    let dirs = search_path(&py, "", None);
    assert_eq!(dirs, vec![site.clone(), base.clone()]);
}

#[test]
fn system_site_packages_and_plain_installations() {
    let t = tempfile::tempdir().expect("tmp");
    // A base installation: prefix/bin/python3.11, prefix/lib/python3.11/site-packages.
    let prefix = t.path().join("usr");
    mkdirs(
        &prefix,
        &[
            "bin",
            "lib/python3.11/site-packages/accelerate-1.13.0.dist-info",
        ],
    );
    let base_py = prefix.join("bin/python3.11");
    fs::write(&base_py, "").expect("python");
    // python3 -> python3.11, as distributions link it.
    std::os::unix::fs::symlink("python3.11", prefix.join("bin/python3")).expect("link");
    let found =
        |py: &Path, home: Option<&Path>| find_in(&search_path(py, "", home)).map(|f| f.version);
    assert_eq!(found(&prefix.join("bin/python3"), None), Some(v("1.13.0")));
    // The user's site comes first.
    let home = t.path().join("home");
    mkdirs(
        &home,
        &[".local/lib/python3.11/site-packages/accelerate-1.14.0.dist-info"],
    );
    assert_eq!(
        found(&prefix.join("bin/python3"), Some(&home)),
        Some(v("1.14.0"))
    );
    // A venv sees the base only with include-system-site-packages.
    let cfg = |inc: &str| {
        format!(
            "home = {}\ninclude-system-site-packages = {inc}\nversion = 3.11.2\n",
            prefix.join("bin").display()
        )
    };
    let closed = venv(&t.path().join("closed"), &cfg("false"));
    assert_eq!(found(&closed, None), None);
    let open = venv(&t.path().join("open"), &cfg("true"));
    assert_eq!(found(&open, None), Some(v("1.13.0")));
}

#[test]
fn find_uses_the_interpreter_accel_launch_would_run() {
    let t = tempfile::tempdir().expect("tmp");
    let root = t.path().join("v");
    let py = venv(&root, "home = /nonexistent\n");
    mkdirs(
        &root,
        &["lib/python3.11/site-packages/accelerate-1.16.0.dist-info"],
    );
    fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let bin = root.join("bin").display().to_string();
    let on_path = |k: &str| (k == "PATH").then(|| bin.clone());
    assert_eq!(find(&on_path).map(|f| f.version), Some(v("1.16.0")));
    let exec = py.display().to_string();
    let explicit = |k: &str| (k == "PYTHON_EXEC").then(|| exec.clone());
    assert_eq!(find(&explicit).map(|f| f.version), Some(v("1.16.0")));
    assert_eq!(find(&|_| None), None, "no python3 on an empty PATH");
    assert_eq!(
        Release::installed(&on_path).behaviour.since,
        Version::new(1, 16, 0)
    );
}

/// The Python launchers (which run without this binary) keep the table's
/// numbers for what concerns them.
#[test]
fn python_launchers_agree_with_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/accel/launchers.py");
    let text = fs::read_to_string(path).expect("launchers.py");
    let constant = |name: &str| -> (u32, u32) {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} = (")))
            .unwrap_or_else(|| panic!("{name} in launchers.py"));
        let inner = line
            .split_once('(')
            .and_then(|(_, r)| r.split_once(')'))
            .expect("tuple")
            .0;
        let (a, b) = inner.split_once(',').expect("pair");
        (
            a.trim().parse().expect("major"),
            b.trim().parse().expect("minor"),
        )
    };
    let minor = |v: Version| (v.major, v.minor);
    assert_eq!(constant("_OLDEST_SUPPORTED"), minor(RELEASES[0].since));
    assert_eq!(constant("_NEWEST_KNOWN"), minor(NEWEST_KNOWN));
    let first_without = RELEASES
        .iter()
        .find(|r| !r.notebook_plain_mixed_precision)
        .expect("a release sets ACCELERATE_MIXED_PRECISION");
    assert_eq!(
        constant("_ACCELERATE_MIXED_PRECISION_SINCE"),
        minor(first_without.since)
    );
    assert!(RELEASES
        .iter()
        .all(|r| r.notebook_plain_mixed_precision == (r.since < first_without.since)));
}
