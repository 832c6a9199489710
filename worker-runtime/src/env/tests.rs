use std::collections::HashMap;

use super::{EnvError, WorkerEnv};

/// The environment accel-agent gives rank 5 of 2 nodes × 4 workers.
fn full() -> HashMap<&'static str, String> {
    [
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("GROUP_RANK", "1"),
        ("GROUP_WORLD_SIZE", "2"),
        ("ROLE_NAME", "default"),
        ("ROLE_RANK", "5"),
        ("ROLE_WORLD_SIZE", "8"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RESTART_COUNT", "2"),
        ("TORCHELASTIC_MAX_RESTARTS", "3"),
        ("TORCHELASTIC_RUN_ID", "job42"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

fn read(vars: &HashMap<&'static str, String>) -> Result<WorkerEnv, EnvError> {
    WorkerEnv::from_lookup(|k| vars.get(k).cloned())
}

fn with(k: &'static str, v: &str) -> HashMap<&'static str, String> {
    let mut vars = full();
    vars.insert(k, v.to_owned());
    vars
}

fn without(k: &str) -> HashMap<&'static str, String> {
    let mut vars = full();
    vars.remove(k);
    vars
}

#[test]
fn reads_every_variable() {
    let env = read(&full()).expect("valid");
    assert_eq!((env.rank, env.world_size), (5, 8));
    assert_eq!((env.local_rank, env.local_world_size), (1, 4));
    assert_eq!((env.group_rank, env.group_world_size), (Some(1), Some(2)));
    assert_eq!(env.role_name.as_deref(), Some("default"));
    assert_eq!((env.role_rank, env.role_world_size), (Some(5), Some(8)));
    assert_eq!(
        (env.master_addr.as_str(), env.master_port),
        ("node0", 29500)
    );
    assert_eq!((env.restart_count, env.max_restarts), (2, Some(3)));
    assert_eq!(env.run_id.as_deref(), Some("job42"));
    assert!(env.use_agent_store);
    assert!(!env.hosts_store());
    assert_eq!(
        env.error_file.as_deref(),
        Some(std::path::Path::new("/tmp/x/error.json"))
    );
}

#[test]
fn minimal_environment_uses_pytorch_defaults() {
    let vars: HashMap<&'static str, String> = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    let env = read(&vars).expect("valid");
    assert_eq!(env.restart_count, 0);
    assert_eq!(env.group_rank, None);
    assert!(!env.use_agent_store);
    assert!(
        env.hosts_store(),
        "rank 0 hosts the store without an agent store"
    );
}

#[test]
fn missing_variables_are_named_with_the_fix() {
    for var in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        let err = read(&without(var)).expect_err(var);
        assert!(
            matches!(err, EnvError::Missing { var: v, .. } if v == var),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.starts_with(&format!("{var} is not set")), "{text}");
        assert!(text.contains("accel-agent"), "{text}");
    }
    // Empty counts as unset, as in PyTorch's env:// handler.
    let err = read(&with("MASTER_ADDR", "")).expect_err("empty");
    assert!(matches!(
        err,
        EnvError::Missing {
            var: "MASTER_ADDR",
            ..
        }
    ));
}

#[test]
fn invalid_values_are_named() {
    let cases = [
        ("RANK", "8", "must be below WORLD_SIZE=8"),
        ("RANK", "-1", "not a non-negative integer"),
        ("WORLD_SIZE", "0", "must be at least 1"),
        ("WORLD_SIZE", "four", "not a non-negative integer"),
        ("LOCAL_RANK", "4", "must be below LOCAL_WORLD_SIZE=4"),
        (
            "LOCAL_WORLD_SIZE",
            "9",
            "more workers on this node than WORLD_SIZE=8",
        ),
        ("GROUP_RANK", "2", "must be below GROUP_WORLD_SIZE=2"),
        ("MASTER_PORT", "0", "not a port number"),
        ("MASTER_PORT", "70000", "not a port number"),
        (
            "TORCHELASTIC_RESTART_COUNT",
            "x",
            "not a non-negative integer",
        ),
        ("TORCHELASTIC_USE_AGENT_STORE", "true", "\"True\" exactly"),
    ];
    for (var, value, reason) in cases {
        let err = read(&with(var, value)).expect_err(var);
        let text = err.to_string();
        assert!(
            matches!(&err, EnvError::Invalid { var: v, value: got, .. } if *v == var && got == value),
            "{var}={value}: {err:?}"
        );
        assert!(
            text.starts_with(&format!("{var}={value:?} is invalid")),
            "{text}"
        );
        assert!(text.contains(reason), "{var}={value}: {text}");
    }
}

#[test]
fn agent_store_false_makes_rank_zero_host() {
    let mut vars = with("TORCHELASTIC_USE_AGENT_STORE", "False");
    vars.insert("RANK", "0".into());
    vars.insert("LOCAL_RANK", "0".into());
    let env = read(&vars).expect("valid");
    assert!(env.hosts_store());
}

#[test]
fn accel_s_segment_is_read_and_checked_against_the_node_rank() {
    let mut vars = full();
    assert_eq!(
        read(&vars).expect("env").topology,
        None,
        "torchrun sets no segment"
    );
    for (k, v) in [
        ("ACCEL_TOPOLOGY", "dc/rack-9"),
        ("ACCEL_SEGMENT", "1"),
        ("ACCEL_SEGMENT_FIRST_NODE", "1"),
        ("ACCEL_SEGMENT_NODES", "1"),
    ] {
        vars.insert(k, v.to_owned());
    }
    let t = read(&vars).expect("env").topology.expect("a segment");
    assert_eq!(
        (t.path.as_str(), t.segment, t.first_node, t.nodes),
        ("dc/rack-9", 1, 1, 1)
    );
    // GROUP_RANK 1 outside a segment of nodes 0..1.
    vars.insert("ACCEL_SEGMENT_FIRST_NODE", "0".to_owned());
    let e = read(&vars).expect_err("refused").to_string();
    assert!(e.contains("ACCEL_SEGMENT_NODES"), "{e}");
}
