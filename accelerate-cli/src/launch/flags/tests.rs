//! Parsing `accel launch`'s command line.

use super::*;
use crate::release::Release;
use Dest as D;

/// The pinned release (1.15.0), which these tests describe unless they say.
fn pinned() -> Release {
    Release::version(1, 15, 0)
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

fn ns(s: &str) -> Namespace {
    match parse(&args(s), &|_| false, pinned()).expect("parses") {
        Parsed::Launch(ns) => ns,
        Parsed::Help => panic!("help"),
    }
}

#[test]
fn both_spellings_values_and_remainder() {
    let n =
        ns("--num-processes 4 --mixed_precision=bf16 -m --fsdp-version 2 pkg.train --lr 3 --cpu");
    assert_eq!(n.get(D::num_processes), &Value::from(4));
    assert_eq!(n.get(D::mixed_precision), "bf16");
    assert_eq!(n.get(D::module), &Value::Bool(true));
    assert_eq!(n.get(D::fsdp_version), "2");
    assert_eq!(n.script, "pkg.train");
    assert_eq!(n.script_args, args("--lr 3 --cpu"));
    assert_eq!(n.get(D::cpu), &Value::Bool(false));
    assert!(n.nondefault.contains("num_processes") && !n.nondefault.contains("cpu"));
}

#[test]
fn typed_values() {
    let n = ns(
        "--vm a --vm b --megatron_lm_use_custom_fsdp False --fp8_pad_inner_dim no \
                --fp8_override_linear_precision true,false,1 -t 3 s.py",
    );
    assert_eq!(n.get(D::vm), &serde_json::json!(["a", "b"]));
    assert_eq!(n.get(D::megatron_lm_use_custom_fsdp), &Value::Bool(true));
    assert_eq!(n.get(D::fp8_pad_inner_dim), &Value::from(0));
    assert_eq!(
        n.get(D::fp8_override_linear_precision),
        &serde_json::json!([1, 0, 1])
    );
    assert_eq!(n.get(D::tee), "3");
    assert_eq!(n.get(D::fp8_enable_fsdp_float8_all_gather), &Value::from(1));
}

#[test]
fn mistakes_are_errors() {
    let err = |s: &str| parse(&args(s), &|p| p == "true", pinned()).expect_err(s);
    assert!(err("--same_network false train.py").contains("on/off flag"));
    assert!(err("--same_network=true train.py").contains("takes no value"));
    assert!(err("--num_processes x train.py").contains("invalid int"));
    assert!(err("--mixed_precision fp32 t.py").contains("invalid choice"));
    assert!(err("--num_procs 2 t.py").contains("unrecognized"));
    assert!(err("--num_processes").contains("expects a value"));
    assert!(err("--cpu").contains("training_script"));
    assert!(err("--monitor_interval nan t.py").contains("invalid (finite) float value 'nan'"));
    assert!(err("--monitor_interval inf t.py").contains("invalid (finite) float"));
    let long = format!("--num_processes {} t.py", "x".repeat(100_000));
    let e = err(&long);
    assert!(e.len() < 400 && e.contains("(100000 bytes)"), "{e}");
    let e = err(&format!("--{} t.py", "y".repeat(100_000)));
    assert!(
        e.len() < 600 && e.starts_with("unrecognized argument"),
        "{e}"
    );
    // With --no_python, a program named `true` is a program.
    let ok = parse(&args("--no_python --cpu true"), &|p| p == "true", pinned()).expect("program");
    assert!(matches!(ok, Parsed::Launch(n) if n.script == "true"));
    let ok = parse(&args("--cpu --no_python true"), &|p| p == "true", pinned()).expect("program");
    assert!(matches!(ok, Parsed::Launch(n) if n.script == "true"));
    assert_eq!(
        parse(&args("--cpu --help"), &|_| false, pinned()),
        Ok(Parsed::Help)
    );
}

#[test]
fn help_lists_every_flag() {
    // Each release's help lists its flags and only those.
    for release in [
        pinned(),
        Release::version(1, 10, 1),
        Release::version(1, 16, 0),
    ] {
        let h = help(release);
        for f in FLAGS {
            let listed =
                h.contains(&format!("--{} ", f.name)) || h.contains(&format!("--{}\n", f.name));
            assert_eq!(
                listed,
                release.has_flag(f.dest),
                "{} in {}",
                f.name,
                release.name()
            );
        }
    }
}

/// [`Dest`] lists exactly the table's destinations, in its order, then the
/// merge's; each is found by its name (the configuration file's keys are
/// matched to flags by name).
#[test]
fn the_destinations_are_the_tables() {
    let mut expected: Vec<Dest> = Vec::new();
    for f in FLAGS {
        if !expected.contains(&f.dest) {
            expected.push(f.dest);
        }
    }
    expected.extend(MERGED);
    assert_eq!(Dest::ALL, expected.as_slice());
    let named = |name: &str| Dest::ALL.iter().copied().find(|d| d.name() == name);
    for &d in Dest::ALL {
        assert_eq!(named(d.name()), Some(d));
    }
    assert_eq!(named("num_process"), None);
    assert_eq!(D::tpu_use_cluster.name(), "tpu_use_cluster");
}
