//! `accel config default` against `accelerate config default`.

use std::process::Command;
use std::time::Duration;

use accel_tests::{bin, run_logged, scratch, venv, AccelerateVenv, ACCELERATE_VERSIONS};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn config_default_writes_what_accelerate_writes_and_accelerate_reads_it() {
    for version in ACCELERATE_VERSIONS {
        config_default_matches(&AccelerateVenv::of(version));
    }
}

/// `accel config default` against `v`'s, with `v` first on `PATH`.
fn config_default_matches(v: &AccelerateVenv) {
    let version = v.version;
    let dir = scratch(&format!("accel-config-{version}"));
    let accelerate = v.bin("accelerate");
    let cases: [&[&str]; 3] = [
        &[],
        &["--mixed_precision", "bf16"],
        &[
            "--config_file",
            "CUSTOM/sub/cfg.json",
            "--mixed_precision",
            "fp16",
        ],
    ];
    for (i, extra) in cases.iter().enumerate() {
        let mut written = Vec::new();
        for (tool, program) in [("accelerate", accelerate.clone()), ("accel", bin("accel"))] {
            let home = dir.join(format!("{tool}-{i}"));
            let args: Vec<String> = extra
                .iter()
                .map(|a| a.replace("CUSTOM", home.to_str().expect("path")))
                .collect();
            let run = || {
                let mut c = Command::new(&program);
                c.args(["config", "default"])
                    .args(&args)
                    .env("PATH", v.path())
                    .env("HF_HOME", &home)
                    .env_remove("XDG_CACHE_HOME");
                run_logged(c, &dir, &format!("{tool}-{i}"), LIMIT)
            };
            let out = run();
            assert!(
                out.status.success(),
                "{tool} {args:?} ({version}): {}",
                out.stderr
            );
            let path = match args.iter().position(|a| a == "--config_file") {
                Some(k) => std::path::PathBuf::from(&args[k + 1]),
                None => home.join("accelerate/default_config.yaml"),
            };
            assert_eq!(
                out.stdout.trim(),
                format!("accelerate configuration saved at {}", path.display()),
                "{tool}"
            );
            let text = std::fs::read_to_string(&path).expect("config written");
            // A second run leaves the file alone and still exits 0.
            let again = run();
            assert!(
                again.status.success() && again.stdout.contains("already exists"),
                "{tool}: {}",
                again.stdout
            );
            assert_eq!(std::fs::read_to_string(&path).expect("config"), text);
            written.push((path, text));
        }
        assert_eq!(
            written[0].1, written[1].1,
            "case {i} ({version}): accel writes accelerate's file byte for byte"
        );
        // accelerate loads accel's file as it loads its own.
        let python = v.bin("python");
        let load = |p: &std::path::Path| {
            let out = Command::new(&python)
                .args(["-c", "import sys; from accelerate.commands.config.config_args import load_config_from_file as l; print(sorted(l(sys.argv[1]).to_dict().items()))"])
                .arg(p)
                .output()
                .expect("python");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(load(&written[1].0), load(&written[0].0));
    }
}

/// The reverse direction: files accelerate wrote (its own `config default`,
/// a legacy file, quoted YAML-1.1 words, JSON) are read by accel as accelerate
/// reads them; `config update` from both tools writes the same bytes.
#[test]
fn config_update_reads_accelerates_files_as_accelerate_does() {
    let dir = scratch("accel-config-update");
    let accelerate = venv().join("bin/accelerate");
    let generated = dir.join("generated");
    let made = Command::new(&accelerate)
        .args(["config", "default", "--mixed_precision", "fp16"])
        .env("HF_HOME", &generated)
        .output()
        .expect("accelerate config default");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let default_file =
        std::fs::read_to_string(generated.join("accelerate/default_config.yaml")).expect("written");
    let cases: [(&str, &str); 5] = [
        ("default.yaml", default_file.as_str()),
        (
            "legacy.yaml",
            "distributed_type: MULTI_GPU\nnum_processes: 2\nfp16: true\ndynamo_backend: INDUCTOR\ngpu_ids: 0,1\n",
        ),
        (
            "yaml11.yaml",
            "distributed_type: 'NO'\nmixed_precision: 'no'\ndowncast_bf16: 'no'\nuse_cpu: yes\ntpu_env: []\n\
             fsdp_config:\n  fsdp_min_num_params: 1e8\n  fsdp_offload_params: off\n",
        ),
        (
            "nested.json",
            "{\"distributed_type\": \"FSDP\", \"num_processes\": 4, \"fsdp_config\": {\"fsdp_version\": 2, \"fsdp_reshard_after_forward\": true}, \"commands\": [\"a b\", \"c\"]}",
        ),
        (
            "sagemaker.yaml",
            "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nec2_instance_type: ml.p3.2xlarge\niam_role_name: role\nmixed_precision: bf16\n",
        ),
    ];
    for (name, text) in cases {
        let mut updated = Vec::new();
        for (tool, program) in [("accelerate", accelerate.clone()), ("accel", bin("accel"))] {
            let path = dir.join(format!("{tool}-{name}"));
            std::fs::write(&path, text).expect("config");
            let mut c = Command::new(&program);
            c.args(["config", "update", "--config_file"]).arg(&path);
            let out = run_logged(c, &dir, &format!("{tool}-{name}"), LIMIT);
            assert!(out.status.success(), "{tool} {name}: {}", out.stderr);
            assert_eq!(
                out.stdout.trim(),
                format!(
                    "Successfully updated the configuration file at {}.",
                    path.display()
                ),
                "{tool} {name}"
            );
            updated.push(std::fs::read_to_string(&path).expect("updated"));
        }
        assert_eq!(
            updated[1], updated[0],
            "{name}: accel (left) and accelerate (right) rewrite it differently"
        );
    }
}
