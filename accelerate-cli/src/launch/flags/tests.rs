//! Parsing `accel launch`'s command line.

use super::*;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

fn ns(s: &str) -> Namespace {
    match parse(&args(s), &|_| false).expect("parses") {
        Parsed::Launch(ns) => ns,
        Parsed::Help => panic!("help"),
    }
}

#[test]
fn both_spellings_values_and_remainder() {
    let n =
        ns("--num-processes 4 --mixed_precision=bf16 -m --fsdp-version 2 pkg.train --lr 3 --cpu");
    assert_eq!(n.get("num_processes"), &Value::from(4));
    assert_eq!(n.get("mixed_precision"), "bf16");
    assert_eq!(n.get("module"), &Value::Bool(true));
    assert_eq!(n.get("fsdp_version"), "2");
    assert_eq!(n.script, "pkg.train");
    assert_eq!(n.script_args, args("--lr 3 --cpu"));
    assert_eq!(n.get("cpu"), &Value::Bool(false));
    assert!(n.nondefault.contains("num_processes") && !n.nondefault.contains("cpu"));
}

#[test]
fn typed_values() {
    let n = ns(
        "--vm a --vm b --megatron_lm_use_custom_fsdp False --fp8_pad_inner_dim no \
                --fp8_override_linear_precision true,false,1 -t 3 s.py",
    );
    assert_eq!(n.get("vm"), &serde_json::json!(["a", "b"]));
    assert_eq!(n.get("megatron_lm_use_custom_fsdp"), &Value::Bool(true));
    assert_eq!(n.get("fp8_pad_inner_dim"), &Value::from(0));
    assert_eq!(
        n.get("fp8_override_linear_precision"),
        &serde_json::json!([1, 0, 1])
    );
    assert_eq!(n.get("tee"), "3");
    assert_eq!(n.get("fp8_enable_fsdp_float8_all_gather"), &Value::from(1));
}

#[test]
fn mistakes_are_errors() {
    let err = |s: &str| parse(&args(s), &|p| p == "true").expect_err(s);
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
    let ok = parse(&args("--no_python --cpu true"), &|p| p == "true").expect("program");
    assert!(matches!(ok, Parsed::Launch(n) if n.script == "true"));
    let ok = parse(&args("--cpu --no_python true"), &|p| p == "true").expect("program");
    assert!(matches!(ok, Parsed::Launch(n) if n.script == "true"));
    assert_eq!(parse(&args("--cpu --help"), &|_| false), Ok(Parsed::Help));
}

#[test]
fn help_lists_every_flag() {
    let h = help();
    for f in FLAGS {
        assert!(h.contains(&format!("--{}", f.name)), "{}", f.name);
    }
}

/// Every flag name the launcher reads by a literal is a destination in the
/// table: a misspelt name would read `null` (accelerate's `Namespace` raises
/// on one), so it is caught here, for every literal, whichever paths the
/// other tests take.
#[test]
fn every_name_read_is_a_flag() {
    let sources = [
        ("launch.rs", include_str!("../../launch.rs")),
        ("launch/env.rs", include_str!("../env.rs")),
        ("launch/merge.rs", include_str!("../merge.rs")),
    ];
    let mut read = 0;
    for (file, text) in sources {
        for opener in [
            "ns.get(\"",
            "ns.truthy(\"",
            " s(\"",
            "(s(\"",
            " lc(\"",
            "(lc(\"",
            "text(\"",
        ] {
            for (at, _) in text.match_indices(opener) {
                let rest = &text[at + opener.len()..];
                let name = &rest[..rest.find('"').expect("a closing quote")];
                assert!(
                    is_destination(name),
                    "{file} reads '{name}', which no flag has as its destination"
                );
                read += 1;
            }
        }
    }
    // The tables of (flag, VARIABLE) pairs the environment is built from.
    let env = include_str!("../env.rs");
    let mut pairs = 0;
    let mut rest = env;
    while let Some(open) = rest.find('(') {
        rest = &rest[open + 1..];
        let t = rest.trim_start();
        let Some(t) = t.strip_prefix('"') else {
            continue;
        };
        let Some(end) = t.find('"') else { break };
        let (name, after) = (&t[..end], t[end + 1..].trim_start());
        let Some(after) = after.strip_prefix(',') else {
            continue;
        };
        let var = after.trim_start();
        let is_var = var.strip_prefix('"').is_some_and(|v| {
            v.split('"').next().is_some_and(|v| {
                !v.is_empty()
                    && v.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            })
        });
        let is_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if is_var && is_name {
            assert!(
                is_destination(name),
                "launch/env.rs maps '{name}', which no flag has as its destination"
            );
            pairs += 1;
        }
    }
    assert!(
        read > 50 && pairs > 10,
        "the scan found the reads ({read}) and pairs ({pairs})"
    );
}
