//! `accel config default` against `accelerate config default`.

use std::process::Command;
use std::time::Duration;

use accel_tests::{bin, run_logged, scratch, venv};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn config_default_writes_what_accelerate_writes_and_accelerate_reads_it() {
    let dir = scratch("accel-config");
    let accelerate = venv().join("bin/accelerate");
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
                    .env("HF_HOME", &home)
                    .env_remove("XDG_CACHE_HOME");
                run_logged(c, &dir, &format!("{tool}-{i}"), LIMIT)
            };
            let out = run();
            assert!(out.status.success(), "{tool} {args:?}: {}", out.stderr);
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
            "case {i}: accel writes accelerate's file byte for byte"
        );
        // accelerate loads accel's file as it loads its own.
        let python = venv().join("bin/python");
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
