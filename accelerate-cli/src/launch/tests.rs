//! Decisions of `accel launch`, without starting anything.

use std::path::PathBuf;

use serde_json::json;

use super::flags::{parse, Dest as D, Parsed};
use super::merge::{merge, Machine};
use super::{agent_options, build, env::Launcher};
use crate::config_file::{process, AccelerateConfig};
use crate::release::Release;
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

/// The pinned release (1.15.0), which these tests describe unless they say.
fn pinned() -> Release {
    Release::version(1, 15, 0)
}

fn merged(args: &str, file: Option<&str>) -> super::merge::Merged {
    merged_as(args, file, pinned())
}

fn merged_as(args: &str, file: Option<&str>, release: Release) -> super::merge::Merged {
    let argv: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
    let Parsed::Launch(ns) = parse(&argv, &|_| false, release).expect("parses") else {
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
    let check = a.health_check;
    assert_eq!(
        (check.command.as_deref(), check.timeout),
        (Some("nvidia-smi"), accel_agent::health::DEFAULT_TIMEOUT)
    );
    assert_eq!(a.gpu_free_timeout, Duration::from_secs(5));
    // The built-in checks and the interval.
    let h = options(
        "--multi_gpu --num_processes 2 --health_check_nic auto --health_check_storage /ckpt \
         --health_check_gpu --health_check_endpoint unix:/run/h.sock --health_check_interval 30 \
         --health_check_timeout 20 --health_check_kernel_log /var/log/kern.log \
         --health_check_sysfs /host/sys t.py",
        None,
        Launcher::MultiGpu,
    )
    .health_check;
    assert_eq!(h.sysfs, std::path::Path::new("/host/sys"));
    assert_eq!(
        h.kernel_log.as_deref(),
        Some(std::path::Path::new("/var/log/kern.log"))
    );
    assert_eq!(h.nic.as_deref(), Some("auto"));
    assert_eq!(h.storage.as_deref(), Some(std::path::Path::new("/ckpt")));
    assert!(h.gpu);
    assert_eq!(
        h.endpoint.map(|e| e.to_string()).as_deref(),
        Some("unix:/run/h.sock")
    );
    assert_eq!(h.interval, Some(Duration::from_secs(30)));
    assert_eq!(h.timeout, Duration::from_secs(20));
    // World sizes a model can use, and growth after a settle time.
    let w = options(
        "--multi_gpu --num_processes 16 --num_machines 2:8 --rdzv_backend c10d --main_process_ip h --main_process_port 29400 \
         --nnodes_multiple_of 2 --scale_up_settle 30 t.py",
        None,
        Launcher::MultiGpu,
    );
    assert_eq!(
        (w.nnodes_multiple_of, w.scale_up_settle),
        (2, Duration::from_secs(30))
    );
    let m = merged("--cpu --num_processes 2 --nnodes_multiple_of 0 t.py", None);
    let e = agent_options(&m.ns, Launcher::MultiGpu, &mut Vec::new(), &no_env).expect_err("K = 0");
    assert!(e.contains("--nnodes_multiple_of '0'"), "{e}");
    // Not given: the agent's defaults.
    let d = options("--cpu --num_processes 2 t.py", None, Launcher::MultiGpu);
    let agent = LaunchOptions::new("t.py");
    assert_eq!(d.preload, agent.preload);
    assert_eq!(d.restart_backoff, agent.restart_backoff);
    assert_eq!(d.health_check, agent.health_check);
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
        let Parsed::Launch(ns) = parse(&argv, &|_| false, pinned()).expect("parses") else {
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

/// The variables `accelerate_env` gives for `args`/`file` as `release` launches.
fn vars_as(
    args: &str,
    file: Option<&str>,
    launcher: Launcher,
    release: Release,
) -> std::collections::BTreeMap<String, String> {
    let m = merged_as(args, file, release);
    super::env::accelerate_env(&m.ns, launcher, &[], "/work", &no_env)
        .expect("vars")
        .into_iter()
        .collect()
}

/// What changed between the supported releases, each where the table says.
#[test]
fn each_release_exports_what_it_exports() {
    let (old, pinned_, new) = (
        Release::version(1, 10, 1),
        pinned(),
        Release::version(1, 16, 0),
    );
    let v13 = Release::version(1, 13, 0);
    // --cpu on a machine without GPUs: 1.16 counts one process and gives it
    // the physical cores; before, zero processes and one thread.
    let cpu = |r| vars_as("--cpu t.py", None, Launcher::Simple, r);
    assert_eq!(cpu(pinned_)["OMP_NUM_THREADS"], "1");
    assert_eq!(cpu(new)["OMP_NUM_THREADS"], "8");
    assert_eq!(
        merged_as("--cpu t.py", None, new).ns.get(D::num_processes),
        &json!(1)
    );
    // KMP_*: always before 1.13 (even on GPUs), never in 1.13/1.14, on CPU from 1.15.
    let single = |r| vars_as("--mixed_precision fp16 t.py", None, Launcher::Simple, r);
    assert!(single(old).contains_key("KMP_AFFINITY"));
    assert!(!single(v13).contains_key("KMP_AFFINITY"));
    assert!(!cpu(v13).contains_key("KMP_BLOCKTIME"));
    assert!(!single(pinned_).contains_key("KMP_AFFINITY"));
    assert_eq!(cpu(pinned_)["KMP_BLOCKTIME"], "1");
    // ACCELERATE_DYNAMO_USE_DYNAMIC: always before 1.16, then only when given.
    assert_eq!(single(pinned_)["ACCELERATE_DYNAMO_USE_DYNAMIC"], "False");
    assert!(!single(new).contains_key("ACCELERATE_DYNAMO_USE_DYNAMIC"));
    let given = vars_as("--dynamo_use_dynamic t.py", None, Launcher::Simple, new);
    assert_eq!(given["ACCELERATE_DYNAMO_USE_DYNAMIC"], "True");
    // FSDP: the float default before 1.13, the offload variable from 1.15.
    let fsdp = |r| {
        vars_as(
            "t.py",
            Some("distributed_type: FSDP\nnum_processes: 2\n"),
            Launcher::MultiGpu,
            r,
        )
    };
    assert_eq!(fsdp(old)["FSDP_MIN_NUM_PARAMS"], "100000000.0");
    assert_eq!(fsdp(pinned_)["FSDP_MIN_NUM_PARAMS"], "100000000");
    assert!(!fsdp(old).contains_key("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"));
    assert!(!fsdp(v13).contains_key("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"));
    assert_eq!(
        fsdp(pinned_)["FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"],
        "false"
    );
    // Several CPU processes: oneCCL's count before 1.13.
    let procs = |r| vars_as("--cpu --num_processes 2 t.py", None, Launcher::Simple, r);
    assert_eq!(procs(old)["CCL_WORKER_COUNT"], "0");
    assert!(!procs(pinned_).contains_key("CCL_WORKER_COUNT"));
    // Megatron-LM's always-set custom FSDP variable came with 1.13.
    let mlm = |r| {
        vars_as(
            "t.py",
            Some("distributed_type: MEGATRON_LM\nnum_processes: 2\n"),
            Launcher::MultiGpu,
            r,
        )
    };
    assert!(!mlm(old).contains_key("MEGATRON_LM_USE_CUSTOM_FSDP"));
    assert_eq!(mlm(v13)["MEGATRON_LM_USE_CUSTOM_FSDP"], "False");
    // ParallelismConfig: the sequence-parallel set from 1.12, DeepSpeed too.
    let pc =
        "--use_fsdp --fsdp_version 2 --use_parallelism_config --parallelism_config_cp_size 2 t.py";
    let old_pc = vars_as(pc, None, Launcher::MultiGpu, old);
    assert_eq!(old_pc["PARALLELISM_CONFIG_CP_COMM_STRATEGY"], "allgather");
    assert!(!old_pc.contains_key("PARALLELISM_CONFIG_SP_SIZE"));
    assert_eq!(
        vars_as(pc, None, Launcher::MultiGpu, pinned_)["PARALLELISM_CONFIG_SP_SIZE"],
        "1"
    );
    // A dynamo_config key without its prefix counts from 1.14.
    let dyn_file = Some("distributed_type: 'NO'\ndynamo_config:\n  backend: INDUCTOR\n");
    let dynamo =
        |r| vars_as("t.py", dyn_file, Launcher::Simple, r)["ACCELERATE_DYNAMO_BACKEND"].clone();
    assert_eq!(dynamo(v13), "NO");
    assert_eq!(dynamo(pinned_), "INDUCTOR");
}

/// A flag the installed release lacks is refused, naming the release.
#[test]
fn flags_follow_the_release() {
    let parse_as = |s: &str, r| {
        let argv: Vec<String> = s.split_whitespace().map(str::to_owned).collect();
        parse(&argv, &|_| false, r)
    };
    let e = parse_as("--fp8_opt_level O1 t.py", Release::version(1, 16, 0))
        .expect_err("removed in 1.16");
    assert!(e.contains("not a flag of accelerate 1.16.0"), "{e}");
    assert!(parse_as("--fp8_opt_level O1 t.py", pinned()).is_ok());
    let e = parse_as("--use_xpu t.py", pinned()).expect_err("removed in 1.13");
    assert!(e.contains("accelerate 1.15.0"), "{e}");
    assert!(parse_as("--use_xpu --mpirun_ccl 2 t.py", Release::version(1, 10, 1)).is_ok());
    let e = parse_as(
        "--parallelism_config_sp_size 2 t.py",
        Release::version(1, 11, 0),
    )
    .expect_err("added in 1.12");
    assert!(e.contains("1.11.0"), "{e}");
}
