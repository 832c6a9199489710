//! `accel tpu-config` against `accelerate tpu-config`.
//!
//! accelerate prints the `gcloud` command under `--debug` before looking for
//! `gcloud`, so both tools run side by side: the printed command must be the
//! same for flags, configuration files, command files and install options.
//! Without `--debug`, a fake `gcloud` on PATH records the argv each tool runs
//! it with; the two argvs must be the same.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use accel_tests::{bin, run_logged, scratch, venv, Finished};

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `tool tpu-config ARGS` in `dir` with no default configuration file.
fn tpu_config(dir: &Path, tool: &str, log: &str, args: &[String], path: Option<&str>) -> Finished {
    let program = match tool {
        "accelerate" => venv().join("bin/accelerate"),
        _ => bin("accel"),
    };
    let mut cmd = Command::new(program);
    cmd.current_dir(dir)
        .arg("tpu-config")
        .args(args)
        .env("HF_HOME", dir.join("hf-empty"))
        .env_remove("XDG_CACHE_HOME")
        .env("GCLOUD_LOG", dir.join(format!("{log}.gcloud")));
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    run_logged(cmd, dir, log, LIMIT)
}

fn strings(args: &[&str], dir: &Path) -> Vec<String> {
    let dir = dir.to_str().expect("utf-8");
    args.iter().map(|a| a.replace("DIR", dir)).collect()
}

#[test]
fn debug_prints_accelerates_command() {
    let dir = scratch("tpu-debug");
    std::fs::write(
        dir.join("pod.yaml"),
        "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\nmixed_precision: 'no'\n\
         tpu_name: cfg-pod\ntpu_zone: europe-west4-a\ncommands:\n- echo one\n- echo two\n",
    )
    .expect("config");
    std::fs::write(
        dir.join("file.yaml"),
        "compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\nmixed_precision: 'no'\n\
         tpu_name: file-pod\ntpu_zone: us-central2-b\ncommand_file: DIR/cmds.txt\n"
            .replace("DIR", dir.to_str().expect("utf-8")),
    )
    .expect("config");
    std::fs::write(dir.join("cmds.txt"), "one\r\ntwo\n\nthree --flag 'x y'\n").expect("commands");
    let cases: [&[&str]; 8] = [
        &["--config_file", "DIR/pod.yaml"],
        &[
            "--config_file",
            "DIR/pod.yaml",
            "--tpu_name",
            "flag-pod",
            "--command",
            "ls -l",
            "pwd",
        ],
        &[
            "--config-file",
            "DIR/pod.yaml",
            "--use_alpha",
            "--install_accelerate",
        ],
        &["--config_file", "DIR/file.yaml"],
        &["--config_file", "DIR/file.yaml", "--command", "only this"],
        &[
            "--config_file",
            "DIR/pod.yaml",
            "--command_file",
            "cmds.txt",
        ],
        &[
            "--tpu-name",
            "p",
            "--tpu-zone",
            "z",
            "--command-file",
            "DIR/cmds.txt",
            "--install-accelerate",
            "--accelerate-version",
            "dev",
        ],
        &[
            "--tpu_name",
            "p",
            "--tpu_zone",
            "z",
            "--command",
            "a",
            "--command",
            "b c",
            "--install_accelerate",
            "--accelerate_version",
            "0.20.3",
            "--use-alpha",
        ],
    ];
    for (i, case) in cases.iter().enumerate() {
        let mut args = strings(case, &dir);
        args.push("--debug".into());
        let want = tpu_config(&dir, "accelerate", &format!("accelerate-{i}"), &args, None);
        let got = tpu_config(&dir, "accel", &format!("accel-{i}"), &args, None);
        assert!(
            want.status.success(),
            "accelerate {args:?}: {}",
            want.stderr
        );
        assert!(got.status.success(), "accel {args:?}: {}", got.stderr);
        assert!(
            want.stdout.starts_with("Running gcloud "),
            "{}",
            want.stdout
        );
        assert_eq!(got.stdout, want.stdout, "accel {args:?} vs accelerate");
    }
}

#[test]
fn gcloud_gets_the_same_argv_and_missing_pieces_are_clear_errors() {
    let dir = scratch("tpu-run");
    let fake = dir.join("fakebin");
    std::fs::create_dir_all(&fake).expect("fakebin");
    let gcloud = fake.join("gcloud");
    std::fs::write(
        &gcloud,
        "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$GCLOUD_LOG\"\n",
    )
    .expect("fake gcloud");
    std::fs::set_permissions(&gcloud, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let args = strings(
        &[
            "--tpu_name",
            "pod",
            "--tpu_zone",
            "z",
            "--command",
            "echo \"$HOME\"; ls",
            "--install_accelerate",
        ],
        &dir,
    );
    let mut argvs = Vec::new();
    for tool in ["accelerate", "accel"] {
        let out = tpu_config(&dir, tool, tool, &args, Some(&path));
        assert!(out.status.success(), "{tool}: {}", out.stderr);
        assert_eq!(out.stdout, "Successfully setup pod.\n", "{tool}");
        argvs
            .push(std::fs::read_to_string(dir.join(format!("{tool}.gcloud"))).expect("gcloud ran"));
    }
    assert_eq!(argvs[1], argvs[0]);
    assert!(argvs[0].starts_with("compute\ntpus\ntpu-vm\nssh\npod\n--zone\nz\n--command\n"));

    // No gcloud on PATH: accel says what to install (accelerate raises FileNotFoundError).
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).expect("empty dir");
    let out = tpu_config(&dir, "accel", "no-gcloud", &args, empty.to_str());
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("`gcloud` was not found on PATH") && out.stderr.contains("--debug"),
        "{}",
        out.stderr
    );

    // A failing gcloud is not reported as success.
    std::fs::write(&gcloud, "#!/bin/sh\nexit 4\n").expect("failing gcloud");
    let out = tpu_config(&dir, "accel", "gcloud-fails", &args, Some(&path));
    assert!(
        !out.status.success() && !out.stdout.contains("Successfully"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("gcloud failed"), "{}", out.stderr);

    // Nothing to run: both refuse.
    let nothing = strings(&["--tpu_name", "pod", "--tpu_zone", "z", "--debug"], &dir);
    for tool in ["accelerate", "accel"] {
        let out = tpu_config(&dir, tool, &format!("{tool}-nothing"), &nothing, None);
        assert!(!out.status.success(), "{tool}");
        assert!(
            out.stderr.contains("either a command file or a command"),
            "{tool}: {}",
            out.stderr
        );
    }
}
