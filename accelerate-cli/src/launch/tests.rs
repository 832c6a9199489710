//! Decisions of `accel launch`, without starting anything.

use std::path::PathBuf;

use serde_json::json;

use super::flags::{parse, Dest as D, Parsed};
use super::merge::{merge, Machine};
use super::{agent_options, build, env::Launcher};
use crate::config_file::{process, AccelerateConfig};
use crate::yaml;
use accel_agent::config::{Backend, LaunchOptions, NodeCount, Nproc};

const CPU_BOX: Machine = Machine {
    gpus: 0,
    physical_cores: 8,
};

fn no_env(_: &str) -> Option<String> {
    None
}

fn config(text: &str) -> AccelerateConfig {
    let (sagemaker, fields) = process(yaml::load(text).expect("yaml")).expect("config");
    AccelerateConfig {
        path: PathBuf::from("test.yaml"),
        sagemaker,
        fields,
    }
}

fn merged(args: &str, file: Option<&str>) -> super::merge::Merged {
    let argv: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    let Parsed::Launch(ns) = parse(&argv, &|_| false).expect("parses") else {
        panic!("help")
    };
    merge(ns, file.map(config), CPU_BOX, &no_env).expect("merges")
}

fn options(args: &str, file: Option<&str>, launcher: Launcher) -> LaunchOptions {
    let m = merged(args, file);
    agent_options(&m.ns, launcher, &mut Vec::new(), &no_env)
        .expect("options")
        .0
}

#[test]
fn command_line_beats_file_and_file_beats_defaults() {
    let file = "distributed_type: FSDP\nnum_processes: 4\nmixed_precision: fp16\n\
                fsdp_config:\n  fsdp_offload_params: true\n  sharding_strategy: SHARD_GRAD_OP\n";
    let m = merged(
        "--fsdp_offload_params false --num_processes 2 t.py",
        Some(file),
    );
    assert_eq!(
        m.ns.get(D::fsdp_offload_params),
        "false",
        "command line wins over a dict key"
    );
    assert_eq!(
        m.ns.get(D::fsdp_sharding_strategy),
        "SHARD_GRAD_OP",
        "dict keys get their prefix"
    );
    assert_eq!(m.ns.get(D::num_processes), &json!(2));
    assert_eq!(m.ns.get(D::mixed_precision), "fp16");
    assert!(m.mp_from_config && m.ns.truthy(D::use_fsdp) && m.warning.is_none());
    let m = merged("t.py", Some(file));
    assert_eq!(
        m.ns.get(D::num_processes),
        &json!(4),
        "the file fills a flag not given"
    );
}

#[test]
fn file_rdzv_backend_and_same_network_count_unless_given() {
    let file = "distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 2\nrdzv_backend: c10d\nsame_network: false\n\
                main_process_ip: head\nmachine_rank: 1\n";
    let a = options("t.py", Some(file), Launcher::MultiGpu);
    assert_eq!(a.rdzv_backend, Backend::C10d);
    assert_eq!(a.rdzv_endpoint, "head:29500");
    assert_eq!(
        (a.nproc_per_node, a.nnodes),
        (Nproc::Count(2), NodeCount::fixed(2))
    );
    let b = options("--rdzv_backend static t.py", Some(file), Launcher::MultiGpu);
    assert_eq!((b.rdzv_backend, b.node_rank), (Backend::Static, 1));
    assert_eq!(
        (b.master_addr.as_str(), b.master_port),
        ("head", Some(29500))
    );
}

#[test]
fn elastic_machines_and_accel_extras() {
    let a = options(
        "--multi_gpu --num_processes 8 --num_machines 2:4 --rdzv_backend c10d --main_process_ip h \
         --main_process_port 29400 --rdzv_id job7 --max_restarts 3 t.py --x 1",
        None,
        Launcher::MultiGpu,
    );
    assert_eq!(a.nnodes, NodeCount { min: 2, max: 4 });
    assert_eq!(a.nproc_per_node, Nproc::Count(2));
    assert_eq!((a.rdzv_id.as_str(), a.max_restarts), ("job7", 3));
    assert_eq!(a.training_script, "t.py");
    assert_eq!(a.training_script_args, ["--x", "1"]);
}

#[test]
fn hot_restart_crash_loops_and_health_reach_the_agent() {
    use std::time::Duration;
    let a = options(
        "--multi_gpu --num_processes 2 --preload torch,transformers --restart_backoff 2:20 \
         --restart_backoff_window 90 --health_check nvidia-smi --gpu_free_timeout 5 t.py",
        None,
        Launcher::MultiGpu,
    );
    assert_eq!(a.preload, ["torch", "transformers"]);
    let b = a.restart_backoff;
    assert_eq!(
        (b.base, b.max, b.window),
        (
            Duration::from_secs(2),
            Duration::from_secs(20),
            Duration::from_secs(90)
        )
    );
    let check = a.health_check.expect("a check");
    assert_eq!(
        (check.command.as_str(), check.timeout),
        ("nvidia-smi", accel_agent::health::DEFAULT_TIMEOUT)
    );
    assert_eq!(a.gpu_free_timeout, Duration::from_secs(5));
    // Not given: the agent's defaults.
    let d = options("--cpu --num_processes 2 t.py", None, Launcher::MultiGpu);
    let agent = LaunchOptions::new("t.py");
    assert_eq!(d.preload, agent.preload);
    assert_eq!(d.restart_backoff, agent.restart_backoff);
    assert_eq!(d.health_check, None);
    assert_eq!(d.gpu_free_timeout, agent.gpu_free_timeout);
    // Bad values name the flag.
    let m = merged("--cpu --num_processes 2 --restart_backoff 9:1 t.py", None);
    let e =
        agent_options(&m.ns, Launcher::MultiGpu, &mut Vec::new(), &no_env).expect_err("MAX < BASE");
    assert!(
        e.contains("--restart_backoff") && e.contains("BASE:MAX"),
        "{e}"
    );
}

#[test]
fn one_machine_is_standalone_and_one_process_is_plain() {
    let m = merged("--cpu t.py", None);
    let (a, single) =
        agent_options(&m.ns, Launcher::Simple, &mut Vec::new(), &no_env).expect("options");
    assert!(single && a.standalone && a.nproc_per_node == Nproc::Count(1));
    let plan = build(m, "/w", &no_env).expect("plan");
    assert!(!plan.config.torchrun_env);
    assert!(plan
        .config
        .base_env
        .contains(&("ACCELERATE_USE_CPU".into(), "True".into())));
    let m = merged("--cpu --num_processes 3 t.py", None);
    let plan = build(m, "/w", &no_env).expect("plan");
    assert!(plan.config.torchrun_env && plan.config.nproc_per_node == 3);
}

#[test]
fn bad_combinations_are_errors() {
    let fails = |args: &str, file: Option<&str>| {
        let argv: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        let Parsed::Launch(ns) = parse(&argv, &|_| false).expect("parses") else {
            panic!("help")
        };
        match merge(ns, file.map(config), CPU_BOX, &no_env) {
            Err(e) => e,
            Ok(m) => match build(m, "/w", &no_env) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{args} should fail"),
            },
        }
    };
    assert!(fails("--cpu --multi_gpu t.py", None).contains("only one of"));
    assert!(fails("--multi_gpu --num_processes 1 t.py", None).contains("at least 2"));
    assert!(fails("--tpu t.py", None).contains("TPU"));
    assert!(fails("--mpirun_hostfile h t.py", None).contains("mpirun"));
    assert!(fails("t.py", Some("distributed_type: MULTI_GPU\n")).contains("num_processes"));
    assert!(fails(
        "t.py",
        Some("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: no\n")
    )
    .contains("mixed_precision: 'no'"));
    assert!(
        fails("--multi_gpu --num_processes 4 --num_machines 2 --machine_rank 0 --main_process_ip h --main_process_port 0 t.py", None)
            .contains("fixed port")
    );
}

#[test]
fn torchruns_flags_accelerate_lacks_keep_their_environment_fallback() {
    let m = merged("--cpu --num_processes 2 t.py", None);
    let env = |k: &str| match k {
        "PET_LOCAL_ADDR" => Some("10.0.0.7".to_owned()),
        "PET_EXIT_BARRIER_TIMEOUT" => Some("12".to_owned()),
        "PET_VIRTUAL_LOCAL_RANK" => Some("1".to_owned()),
        // accelerate has its own flags for these: the environment is ignored.
        "PET_MAX_RESTARTS" | "PET_MODULE" => Some("7".to_owned()),
        _ => None,
    };
    let (o, _) = agent_options(&m.ns, Launcher::Simple, &mut Vec::new(), &env).expect("options");
    assert_eq!(o.local_addr.as_deref(), Some("10.0.0.7"));
    assert_eq!(o.exit_barrier_timeout, std::time::Duration::from_secs(12));
    assert!(o.virtual_local_rank);
    assert_eq!(o.max_restarts, 0);
    assert!(!o.module);
    let bad = |k: &str| (k == "PET_SIGNALS_TO_HANDLE").then(|| "SIGNOPE".to_owned());
    let e = agent_options(&m.ns, Launcher::Simple, &mut Vec::new(), &bad).expect_err("bad signal");
    assert!(e.contains("PET_SIGNALS_TO_HANDLE"), "{e}");
}
