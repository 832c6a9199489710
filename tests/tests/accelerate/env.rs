//! `accel env` against `accelerate env`: same configuration file, same
//! Python environment, the same text except the lines that describe each
//! tool itself (accel's `` `accel` version `` and `` `accel` location ``,
//! accelerate's `` `accelerate` bash location ``).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use accel_tests::{bin, run_logged, scratch, AccelerateVenv, ACCELERATE_VERSIONS};

const LIMIT: Duration = Duration::from_secs(120);

/// Lines naming the tool's own version or location.
fn own_line(line: &str) -> bool {
    [
        "- `accel` version: ",
        "- `accel` location: ",
        "- `accelerate` bash location: ",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// Runs `tool env ARGS` with the venv first on PATH and HF_HOME=`hf`.
fn env_output(
    v: &AccelerateVenv,
    dir: &Path,
    name: &str,
    program: &Path,
    hf: &Path,
    args: &[&str],
) -> String {
    let mut c = Command::new(program);
    c.arg("env")
        .args(args)
        .env("PATH", v.path())
        .env("HF_HOME", hf)
        .env_remove("PYTHON_EXEC")
        .env_remove("XDG_CACHE_HOME");
    let out = run_logged(c, dir, name, LIMIT);
    assert!(out.status.success(), "{name}: {}", out.stderr);
    out.stdout
}

/// Both tools' output, checked line for line; returns accel's.
fn compare(v: &AccelerateVenv, dir: &Path, case: &str, hf: &Path, args: &[&str]) -> String {
    let case = &format!("{case}@{}", v.version);
    let accelerate = env_output(
        v,
        dir,
        &format!("accelerate-{case}"),
        &v.bin("accelerate"),
        hf,
        args,
    );
    let accel = env_output(v, dir, &format!("accel-{case}"), &bin("accel"), hf, args);
    let strip = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !own_line(l))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        strip(&accel),
        strip(&accelerate),
        "case {case}\naccel:\n{accel}\naccelerate:\n{accelerate}"
    );
    // The lines that differ are there, in accelerate's places.
    let lines: Vec<&str> = accel.lines().collect();
    assert_eq!(
        lines[..5],
        [
            "",
            "Copy-and-paste the text below in your GitHub issue",
            "",
            accelerate.lines().nth(3).expect("version line"),
            &format!("- `accel` version: {}", env!("CARGO_PKG_VERSION")),
        ]
    );
    let exe = bin("accel").canonicalize().expect("accel path");
    assert_eq!(lines[6], format!("- `accel` location: {}", exe.display()));
    assert!(accelerate
        .lines()
        .nth(5)
        .is_some_and(|l| l.starts_with("- `accelerate` bash location: ")));
    accel
}

#[test]
fn env_matches_accelerate_with_default_explicit_and_no_config() {
    for version in ACCELERATE_VERSIONS {
        env_matches(&AccelerateVenv::of(version));
    }
}

/// `accel env` against `v`'s `accelerate env`.
fn env_matches(v: &AccelerateVenv) {
    let dir = scratch(&format!("accel-env-{}", v.version));
    let hf = dir.join("hf");
    let default = hf.join("accelerate/default_config.yaml");
    std::fs::create_dir_all(default.parent().expect("dir")).expect("mkdir");

    // No configuration at all.
    let none = compare(v, &dir, "none", &hf, &[]);
    assert!(
        none.ends_with("- `Accelerate` default config:\n\tNot found\n"),
        "{none}"
    );

    // A default file with values of every kind: nested dictionaries, lists,
    // floats, quotes, legacy keys.
    std::fs::write(
        &default,
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 4\n\
         fp16: true\ndynamo_backend: INDUCTOR\ngpu_ids: 0,1,2,3\nmain_process_port: 29501\n\
         fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_min_num_params: 0\n  \
         fsdp_offload_params: false\n  fsdp_ratio: 1.0e-05\n  fsdp_big: 2.5e+20\n  fsdp_half: 0.5\n  \
         fsdp_names: [\"it's\", 'x\"y', plain]\n  fsdp_empty: {}\n  fsdp_none: null\n\
         tpu_env: [A=1, B=2]\ncommands: []\n",
    )
    .expect("write config");
    let with_default = compare(v, &dir, "default", &hf, &[]);
    assert!(
        with_default.contains("\t- mixed_precision: fp16\n"),
        "{with_default}"
    );
    assert!(
        with_default.contains("'fsdp_ratio': 1e-05"),
        "{with_default}"
    );

    // An explicit JSON file, SageMaker flavour.
    let json = dir.join("sm.json");
    std::fs::write(
        &json,
        r#"{"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "DATA_PARALLEL",
            "mixed_precision": "bf16", "ec2_instance_type": "ml.p3.16xlarge",
            "iam_role_name": "role", "additional_args": {"k": [1, 2.0, null, true]}}"#,
    )
    .expect("write json");
    let explicit = compare(
        v,
        &dir,
        "explicit",
        &hf,
        &["--config_file", json.to_str().expect("path")],
    );
    assert!(
        explicit.contains("- `Accelerate` config passed:\n"),
        "{explicit}"
    );
}

#[test]
fn env_without_python_reports_what_is_missing() {
    let dir = scratch("accel-env-nopy");
    let mut c = Command::new(bin("accel"));
    c.arg("env")
        .env("PYTHON_EXEC", dir.join("no-python"))
        .env("HF_HOME", dir.join("hf"));
    let out = run_logged(c, &dir, "accel", LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
    for line in [
        "- `Accelerate` version: not installed",
        "- Python version: not installed",
        "- Numpy version: not installed",
        "- PyTorch version: not installed",
        "- PyTorch accelerator: N/A",
        "- `Accelerate` default config:",
        "\tNot found",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "{line:?}:\n{}",
            out.stdout
        );
    }
    let ram = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("- System RAM: "))
        .expect("RAM line");
    assert!(ram.ends_with(" GB") && ram != "N/A", "{ram}");

    // A configuration file that does not exist is an error, as in accelerate.
    let mut c = Command::new(bin("accel"));
    c.args(["env", "--config_file"])
        .arg(dir.join("missing.yaml"))
        .env("PYTHON_EXEC", dir.join("no-python"));
    let out = run_logged(c, &dir, "accel-missing", LIMIT);
    assert!(!out.status.success());
    assert!(out.stderr.contains("missing.yaml"), "{}", out.stderr);
}
