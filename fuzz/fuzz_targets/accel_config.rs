//! `accel`'s reading of an accelerate configuration file, as
//! `accel launch --config_file FILE` and `accel config update` do it: the
//! YAML reader (PyYAML's dialect) or JSON, accelerate's checks and
//! migrations ([`config_file::process`]), then the launch decisions that
//! consume the values (`merge`, `build`). Besides "no panic" it checks that
//! what `config update` would write back reads as the same configuration.
//!
//! # Input
//! The file's text (UTF-8; the reader refuses anything else), read both as
//! a `.yaml` and as a `.json` file. The launch decisions follow the
//! accelerate release of the table row the input's length picks, so every
//! row of [`accel_cli::release::RELEASES`] is exercised.

#![no_main]

use std::path::PathBuf;

use accel_cli::config_file::{self, AccelerateConfig};
use accel_cli::launch::{build, flags, merge};
use accel_cli::release::{Release, RELEASES};
use accel_cli::yaml;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let release = Release::of(Some(RELEASES[data.len() % RELEASES.len()].since));
    match yaml::load(text) {
        Ok(v) => check(v, "config.yaml", release),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        check(v, "config.json", release);
    }
});

fn check(value: Value, name: &str, release: Release) {
    let (sagemaker, fields) = match config_file::process(value) {
        Ok(ok) => ok,
        Err(message) => {
            assert!(!message.is_empty(), "a refusal without a message");
            return;
        }
    };
    round_trip(sagemaker, &fields);
    let config = AccelerateConfig {
        path: PathBuf::from(name),
        sagemaker,
        fields,
    };
    launch(config, release);
}

/// `accel config update` writes `to_dict(fields)` as YAML. Every value it
/// writes must read back as itself; a `null` is not written (accelerate's
/// `to_dict` drops it too) and reads back as the field's default, so from
/// the second update on the file must not change.
fn round_trip(sagemaker: bool, fields: &Map<String, Value>) {
    let (written, sagemaker2, fields2) = update(fields);
    assert_eq!(sagemaker, sagemaker2);
    let dict = config_file::to_dict(fields);
    let dict2 = config_file::to_dict(&fields2);
    for (key, value) in &dict {
        assert_eq!(
            dict2.get(key),
            Some(value),
            "{key} reads back as another value from:\n{written}"
        );
    }
    let (written2, _, fields3) = update(&fields2);
    let (written3, _, _) = update(&fields3);
    assert_eq!(written2, written3, "every update changes the file");
}

/// Writes `fields` as `config update` does and reads the text back.
fn update(fields: &Map<String, Value>) -> (String, bool, Map<String, Value>) {
    let written = yaml::dump(&Value::Object(config_file::to_dict(fields)));
    let reread = yaml::load(&written)
        .unwrap_or_else(|e| panic!("the written file does not read back ({e}):\n{written}"));
    let (sagemaker, fields) = config_file::process(reread)
        .unwrap_or_else(|e| panic!("the written file is refused ({e}):\n{written}"));
    (written, sagemaker, fields)
}

/// `accel launch --config_file FILE train.py`, up to the agent's
/// configuration (nothing is started).
fn launch(config: AccelerateConfig, release: Release) {
    let args = ["train.py".to_owned()];
    let ns = match flags::parse(&args, &|_| false, release) {
        Ok(flags::Parsed::Launch(ns)) => ns,
        other => panic!("plain `accel launch train.py` does not parse: {other:?}"),
    };
    let machine = merge::Machine {
        gpus: 0,
        physical_cores: 4,
    };
    let no_env = |_: &str| None;
    let merged = match merge::merge(ns, Some(config), machine, &no_env) {
        Ok(m) => m,
        Err(message) => {
            assert!(!message.is_empty());
            return;
        }
    };
    if let Err(e) = build(merged, "/work", &no_env) {
        assert!(!e.to_string().is_empty());
    }
}
