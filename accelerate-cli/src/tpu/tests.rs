//! `accel tpu-config`: command building and gcloud handling.
use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: TpuArgs,
}

fn parse(argv: &[&str]) -> TpuArgs {
    Cli::try_parse_from(["tpu-config"].iter().chain(argv))
        .expect("valid arguments")
        .args
}

fn config(json: Value) -> Map<String, Value> {
    json.as_object().cloned().unwrap_or_default()
}

fn debug(argv: &[&str], cfg: Option<Value>) -> Result<String, TpuError> {
    let mut argv = argv.to_vec();
    argv.push("--debug");
    run(&parse(&argv), cfg.map(config).as_ref(), &|_| None)
}

#[test]
fn flags_build_accelerates_gcloud_command() {
    let out = debug(
        &[
            "--tpu_name",
            "pod",
            "--tpu-zone",
            "us-central1-a",
            "--command",
            "echo a",
            "b",
            "--command",
            "ls -l",
        ],
        None,
    );
    assert_eq!(
        out.expect("debug"),
        "Running gcloud compute tpus tpu-vm ssh pod --zone us-central1-a --command \
         cd /usr/share; echo a; b; ls -l --worker all"
    );
    let args = parse(&[
        "--tpu_name",
        "p",
        "--tpu_zone",
        "z",
        "--use-alpha",
        "--install_accelerate",
        "--command",
        "x",
    ]);
    let argv = gcloud_argv(&args, None).expect("argv");
    assert_eq!(argv[..2], ["gcloud", "alpha"]);
    assert_eq!(argv[10], "cd /usr/share; pip install accelerate -U; x");
    assert_eq!(argv.len(), 13);
}

#[test]
fn the_configuration_fills_in_with_accelerates_precedence() {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path().to_path_buf();
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("cmds.txt");
    std::fs::write(&file, "one\r\ntwo\n\nthree\n").expect("write");
    let file = file.to_str().expect("utf-8").to_owned();
    let cfg = serde_json::json!({"tpu_name": "cfg-pod", "tpu_zone": "cfg-zone",
        "commands": ["c1", "c2"], "command_file": null});
    let joined = |argv: &[&str], cfg: &Value| {
        let args = parse(argv);
        let argv = gcloud_argv(&args, Some(&config(cfg.clone()))).expect("argv");
        format!("{} {} {}", argv[5], argv[7], argv[9])
    };
    assert_eq!(joined(&[], &cfg), "cfg-pod cfg-zone cd /usr/share; c1; c2");
    assert_eq!(
        joined(&["--tpu_name", "p", "--command", "x"], &cfg),
        "p cfg-zone cd /usr/share; x"
    );
    // A command file, from a flag or from the file, replaces the commands.
    let expected = "cfg-pod cfg-zone cd /usr/share; one; two; ; three";
    assert_eq!(joined(&["--command_file", &file], &cfg), expected);
    let mut with_file = cfg.clone();
    with_file["command_file"] = Value::String(file.clone());
    assert_eq!(joined(&[], &with_file), expected);
    // ... but the file's command_file does not override --command.
    assert_eq!(
        joined(&["--command", "x"], &with_file),
        "cfg-pod cfg-zone cd /usr/share; x"
    );
}

#[test]
fn missing_or_wrong_values_are_clear_errors() {
    let zone = ["--tpu_zone", "z", "--tpu_name", "n"];
    assert!(matches!(debug(&zone, None), Err(TpuError::NoCommand)));
    let cfg = serde_json::json!({"commands": []});
    assert!(matches!(debug(&zone, Some(cfg)), Err(TpuError::NoCommand)));
    assert!(matches!(
        debug(&["--command", "x", "--tpu_zone", "z"], None),
        Err(TpuError::NoTpuName)
    ));
    assert!(matches!(
        debug(&["--command", "x", "--tpu_name", "n"], None),
        Err(TpuError::NoTpuZone)
    ));
    let cfg = serde_json::json!({"tpu_name": 3});
    let err = debug(&["--command", "x"], Some(cfg)).expect_err("bad config");
    assert_eq!(
        err.to_string(),
        "`tpu_name` in the configuration file must be a string"
    );
    let cfg = serde_json::json!({"commands": [1]});
    assert!(matches!(
        debug(&zone, Some(cfg)),
        Err(TpuError::BadConfig {
            key: "commands",
            ..
        })
    ));
    let bad = [
        "--command",
        "x",
        "--tpu_zone",
        "z",
        "--tpu_name",
        "n",
        "--accelerate_version",
        "foo",
    ];
    assert!(matches!(debug(&bad, None), Err(TpuError::BadVersion(_))));
    let missing = [
        "--command_file",
        "/nonexistent/cmds",
        "--tpu_zone",
        "z",
        "--tpu_name",
        "n",
    ];
    assert!(matches!(
        debug(&missing, None),
        Err(TpuError::CommandFile { .. })
    ));
}

#[test]
fn versions_map_as_in_accelerate() {
    assert_eq!(
        install_spec("dev").expect("dev"),
        "git+https://github.com/huggingface/accelerate.git"
    );
    assert_eq!(install_spec("latest").expect("latest"), "accelerate -U");
    assert_eq!(install_spec("0.20.3").expect("v"), "accelerate==0.20.3");
    // Accepted and refused by packaging.version.parse (packaging 26).
    for ok in [
        "1.0",
        "v1.0",
        " 1.0 ",
        "1.0a.",
        "1.0a--1",
        "1.0+abc.1",
        "1!2.0.post1.dev3",
        "1.0-1",
        "1.0rc",
        "1.0c1",
        "1.0-dev",
        "1.0_rc_1",
        "1.0alpha",
        "1.0.post",
    ] {
        assert!(is_pep440(ok), "{ok:?}");
    }
    for bad in ["foo", "1.0.", "1..0", "1.0+", "1.0ab", "", "!1", "1.0+a..b"] {
        assert!(!is_pep440(bad), "{bad:?}");
    }
}

#[test]
fn lines_split_as_python_splits_them() {
    assert_eq!(py_splitlines("a\r\nb\rc\u{2028}d\n"), ["a", "b", "c", "d"]);
    assert_eq!(py_splitlines("\n\nx"), ["", "", "x"]);
    assert!(py_splitlines("").is_empty());
}

#[test]
fn gcloud_is_found_on_path_and_its_failure_reported() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path().to_path_buf();
    std::fs::create_dir_all(&dir).expect("dir");
    let args = parse(&["--tpu_name", "n", "--tpu_zone", "z", "--command", "x"]);
    let path = dir.to_str().expect("utf-8").to_owned();
    let env = |k: &str| (k == "PATH").then(|| path.clone());
    assert!(matches!(run(&args, None, &env), Err(TpuError::NoGcloud)));
    let gcloud = dir.join("gcloud");
    for (script, ok) in [
        ("#!/bin/sh\nexit 0\n", true),
        ("#!/bin/sh\nexit 3\n", false),
    ] {
        std::fs::write(&gcloud, script).expect("write");
        std::fs::set_permissions(&gcloud, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        match run(&args, None, &env) {
            Ok(out) => assert!(ok && out == "Successfully setup pod."),
            Err(e) => assert!(!ok && matches!(e, TpuError::Failed(_)), "{e}"),
        }
    }
}
