//! The "This machine" flow on scripted answers: which questions come, in
//! which order, and the fields they give (after accelerate's `to_dict`).
//! Every script must be used up exactly, so a missing or extra question fails.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::cluster::{self, expand_user};
use super::precision::abspath;
use super::prompt::Prompter;
use super::QuestionnaireError;
use crate::config_file::to_dict;
use crate::release::Release;

fn env(k: &str) -> Option<String> {
    (k == "HOME").then(|| "/home/u".to_owned())
}

/// Runs the flow as the pinned release (1.15) asks it; the fields
/// (to_dict'ed) or the error, and what was printed.
fn flow(answers: &[&str]) -> (Result<Map<String, Value>, QuestionnaireError>, String) {
    flow_as(answers, Release::version(1, 15, 0))
}

/// Runs the flow as `release` asks it.
fn flow_as(
    answers: &[&str],
    release: Release,
) -> (Result<Map<String, Value>, QuestionnaireError>, String) {
    let text: String = answers.iter().map(|a| format!("{a}\n")).collect();
    let mut input = text.as_bytes();
    let mut output = Vec::new();
    let r = cluster::ask(&mut Prompter::new(&mut input, &mut output), release, &env);
    let printed = String::from_utf8(output).expect("utf-8");
    if r.is_ok() {
        assert!(
            input.is_empty(),
            "answers left over: {:?}\n{printed}",
            String::from_utf8_lossy(input)
        );
    }
    (r.map(|f| to_dict(&f)), printed)
}

fn fields(answers: &[&str]) -> Map<String, Value> {
    let (r, printed) = flow(answers);
    r.unwrap_or_else(|e| panic!("{e}\n{printed}"))
}

#[test]
fn one_gpu_asks_ids_and_numa() {
    let f = fields(&["0", "no", "no", "no", "1", "yes", "2"]);
    assert_eq!(f["distributed_type"], "NO");
    assert_eq!(f["gpu_ids"], "1");
    assert_eq!(f["enable_cpu_affinity"], true);
    assert_eq!(f["mixed_precision"], "bf16");
    assert_eq!(f["use_cpu"], false);
    assert_eq!(f["num_processes"], 1);
    assert_eq!(f["same_network"], true);
    assert_eq!(f["tpu_env"], json!([]));
    assert_eq!(f.len(), 17, "{f:?}");
}

#[test]
fn multi_node_gpu() {
    let (r, printed) = flow(&[
        "4", "x", "2", "1", "10.0.0.1", "", "29500", "no", "c10d", "maybe", "yes", "no", "no",
        "no", "no", "16", "", "no", "1",
    ]);
    let f = r.expect("flow");
    assert_eq!(f["distributed_type"], "MULTI_GPU");
    assert_eq!(f["num_machines"], 2);
    assert_eq!(f["machine_rank"], 1);
    assert_eq!(f["main_process_ip"], "10.0.0.1");
    assert_eq!(f["main_process_port"], 29500);
    assert_eq!(f["same_network"], false);
    assert_eq!(f["rdzv_backend"], "c10d");
    assert_eq!(f["debug"], true);
    assert_eq!(f["num_processes"], 16);
    assert_eq!(f["gpu_ids"], "all");
    assert_eq!(f["mixed_precision"], "fp16");
    // "x" and "" are not ints: asked again without a message (accelerate has none).
    let machines =
        "How many different machines will you use (use more than 1 for multi-node training)? [1]: ";
    assert_eq!(printed.matches(machines).count(), 2);
    assert_eq!(printed.matches("Please enter yes or no.\n").count(), 1);
    assert!(printed.contains("How many GPU(s) should be used for distributed training? [1]:"));
}

#[test]
fn multi_gpu_with_one_process_is_refused() {
    let (r, _) = flow(&["4", "", "", "", "no", "no", "no", "1"]);
    let e = r.expect_err("refused");
    assert!(e.to_string().contains("`No distributed training`"), "{e}");
}

#[test]
fn neuron_refuses_deepspeed_and_fsdp_and_counts_cores() {
    let (r, _) = flow(&["9", "", "", "", "yes"]);
    assert!(r
        .expect_err("ds")
        .to_string()
        .contains("DeepSpeed is not supported on Neuron"));
    let (r, _) = flow(&["9", "", "", "", "no", "yes"]);
    assert!(r
        .expect_err("fsdp")
        .to_string()
        .contains("FSDP is not currently supported on Neuron"));
    let (r, printed) = flow(&["9", "", "", "", "no", "no", "2", "", ""]);
    assert_eq!(r.expect("flow")["distributed_type"], "MULTI_NEURON");
    assert!(
        printed.contains("How many NEURON cores should be used"),
        "{printed}"
    );
    // No NUMA question for Neuron; GPU ids are asked as "GPU(s)".
    assert!(printed.contains("What GPU(s) (by id)") && !printed.contains("numa"));
}

#[test]
fn multi_cpu_with_mpirun_and_dynamo() {
    let (r, printed) = flow(&[
        "1",
        "",
        "",
        "yes",
        " ~/hosts ",
        "yes",
        "",
        "yes",
        "2",
        "yes",
        "",
        "no",
        "4",
        "0",
    ]);
    let f = r.expect("flow");
    assert_eq!(f["distributed_type"], "MULTI_CPU");
    assert_eq!(f["use_cpu"], true);
    assert_eq!(
        f["mpirun_config"],
        json!({"mpirun_hostfile": "/home/u/hosts"})
    );
    assert_eq!(
        f["dynamo_config"],
        json!({"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune",
               "dynamo_use_fullgraph": true, "dynamo_use_dynamic": false,
               "dynamo_use_regional_compilation": false})
    );
    assert!(printed.contains("How many processes should be used"));
    // On CPU there is no TF32 note.
    assert!(!printed.contains("TF32"));
    assert!(!f.contains_key("gpu_ids"));
}

#[test]
fn dynamo_without_mixed_precision_notes_tf32_and_fixes_the_misspelt_backend() {
    let (r, printed) = flow(&["0", "no", "yes", "11", "no", "no", "", "", ""]);
    let f = r.expect("flow");
    assert_eq!(
        f["dynamo_config"],
        json!({"dynamo_backend": "TORCHXLA_TRACE_ONCE"})
    );
    assert!(printed.contains(" 11: torhchxla_trace_once\n"));
    assert!(
        printed.ends_with("Accelerate will enable it by default when launching your scripts.\n")
    );
}

#[test]
fn deepspeed_json_file_multinode_skips_precision() {
    let f = fields(&[
        "4", "2", "0", "h", "1", "", "", "", "yes", "yes", "", "no", "no", "1", "8",
    ]);
    assert_eq!(f["distributed_type"], "DEEPSPEED");
    assert_eq!(
        f["deepspeed_config"],
        json!({"deepspeed_config_file": "none", "zero3_init_flag": false,
               "deepspeed_multinode_launcher": "standard"})
    );
    assert!(!f.contains_key("mixed_precision") && !f.contains_key("gpu_ids"));
}

#[test]
fn deepspeed_zero3_with_nvme_and_hostfile() {
    let f = fields(&[
        "4", "2", "1", "h", "1", "", "", "", "yes", "no", "3", "2", "nvme", "/a", "", "", "yes",
        "", "yes", "yes", "yes", "Moe", "", "/hosts", "yes", "w1", "no", "8", "fp16",
    ]);
    assert_eq!(
        f["deepspeed_config"],
        json!({"zero_stage": 3, "offload_optimizer_device": "nvme", "offload_param_device": "nvme",
               "offload_param_nvme_path": "/a", "offload_optimizer_nvme_path": "/nvme",
               "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
               "zero3_save_16bit_model": true, "zero3_init_flag": true,
               "deepspeed_moe_layer_cls_names": "Moe", "deepspeed_multinode_launcher": "pdsh",
               "deepspeed_hostfile": "/hosts", "deepspeed_exclusion_filter": "w1"})
    );
    assert_eq!(f["mixed_precision"], "fp16");
}

#[test]
fn fsdp1_and_megatron() {
    let f = fields(&[
        "4", "", "", "", "no", "yes", "0", "3", "yes", "1", "", "1", "2", "yes", "no", "no", "no",
        "", "2", "",
    ]);
    assert_eq!(
        f["fsdp_config"],
        json!({"fsdp_version": 1, "fsdp_reshard_after_forward": "HYBRID_SHARD",
               "fsdp_offload_params": true, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
               "fsdp_min_num_params": 100000000, "fsdp_backward_prefetch": "BACKWARD_POST",
               "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_forward_prefetch": true,
               "fsdp_use_orig_params": false, "fsdp_cpu_ram_efficient_loading": false,
               "fsdp_sync_module_states": false, "fsdp_activation_checkpointing": false})
    );
    assert_eq!(f["distributed_type"], "FSDP");
    let f = fields(&[
        "4", "", "", "", "no", "no", "yes", "2", "", "2", "4", "no", "", "0.5", "4", "",
    ]);
    assert_eq!(f["distributed_type"], "MEGATRON_LM");
    assert_eq!(
        f["megatron_lm_config"],
        json!({"megatron_lm_tp_degree": 2, "megatron_lm_sequence_parallelism": true,
               "megatron_lm_pp_degree": 2, "megatron_lm_num_micro_batches": 4,
               "megatron_lm_recompute_activations": false,
               "megatron_lm_use_distributed_optimizer": true, "megatron_lm_gradient_clipping": 0.5})
    );
}

#[test]
fn fsdp2_parallelism_config() {
    let f = fields(&[
        "4", "", "", "", "no", "yes", "", "", "", "2", "", "", "", "yes", "2", "1", "1", "1", "4",
        "",
    ]);
    assert_eq!(
        f["fsdp_config"],
        json!({"fsdp_version": 2, "fsdp_reshard_after_forward": true,
               "fsdp_offload_params": false, "fsdp_auto_wrap_policy": "NO_WRAP",
               "fsdp_state_dict_type": "SHARDED_STATE_DICT",
               "fsdp_cpu_ram_efficient_loading": true, "fsdp_activation_checkpointing": false})
    );
    assert_eq!(
        f["parallelism_config"],
        json!({"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 1,
               "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1})
    );
}

#[test]
fn tpu_cluster() {
    let (r, printed) = flow(&[
        "10",
        "",
        "8",
        "train",
        "yes",
        "pod",
        "zone",
        "YES",
        "yes",
        "no",
        "pip install x",
        "yes",
        "",
        "",
        "vm1,vm2",
        "",
    ]);
    let f = r.expect("flow");
    assert!(
        printed.contains("How many XLA(s) should be used"),
        "{printed}"
    );
    assert_eq!(f["distributed_type"], "XLA");
    assert_eq!(f["mixed_precision"], "no");
    assert_eq!(f["downcast_bf16"], "no");
    assert_eq!(f["main_training_function"], "train");
    assert_eq!(f["tpu_use_sudo"], "YES", "accelerate keeps the text");
    assert_eq!(f["commands"], json!(["pip install x", ""]));
    assert_eq!(f["tpu_vm"], json!(["vm1", "vm2"]));
    assert_eq!(f["tpu_env"], json!([""]));
    assert_eq!(f["tpu_name"], "pod");
    let f = fields(&[
        "10",
        "",
        "",
        "",
        "yes",
        "",
        "z",
        "",
        "yes",
        "yes",
        "/s/../run.sh",
        "",
        "",
    ]);
    assert_eq!(f["command_file"], "/run.sh");
    assert_eq!(f["tpu_use_sudo"], false);
    assert_eq!(f["tpu_name"], "");
}

#[test]
fn fp8_recipes() {
    let gpu = ["0", "no", "no", "no", "", "", "3"];
    let te = [
        &gpu[..],
        &["te", "", "2", "", "2", "", "1", "yes", "yes", "", "no"],
    ]
    .concat();
    assert_eq!(
        fields(&te)["fp8_config"],
        json!({"backend": "TE", "use_autocast_during_eval": false, "margin": 2, "interval": 1,
               "fp8_format": "E5M2", "amax_history_length": 1024,
               "amax_compute_algorithm": "most_recent",
               "override_linear_precision": [true, false, false]})
    );
    let msamp = [&gpu[..], &["2", ""]].concat();
    assert_eq!(
        fields(&msamp)["fp8_config"],
        json!({"backend": "MSAMP", "optimization_level": "O2"})
    );
    let ao = [&gpu[..], &["", "no", ""]].concat();
    assert_eq!(
        fields(&ao)["fp8_config"],
        json!({"backend": "AO", "enable_fsdp_float8_all_gather": false, "pad_inner_dim": true})
    );
}

#[test]
fn paths_as_python_expands_them() {
    assert_eq!(expand_user("~/hostfile", &env), "/home/u/hostfile");
    assert_eq!(expand_user("~", &env), "/home/u");
    assert_eq!(expand_user("~bob/x", &env), "~bob/x");
    assert_eq!(expand_user("/x/~", &env), "/x/~");
    assert_eq!(expand_user("~/x", &|_| None), "~/x");
    assert_eq!(expand_user("~/x", &|_| Some("/".into())), "/x");
    let cwd = Path::new("/w/d");
    assert_eq!(abspath("run.sh", cwd), "/w/d/run.sh");
    assert_eq!(abspath("", cwd), "/w/d");
    assert_eq!(abspath("../../../a/./b//c/", cwd), "/a/b/c");
    assert_eq!(abspath("//net/x", cwd), "//net/x");
    assert_eq!(abspath("///x", cwd), "/x");
    assert_eq!(abspath("f", Path::new("/")), "/f");
}

/// Before 1.13 a CPU configuration is asked about IPEX, and mpirun about
/// oneCCL's threads; the FP8 backends each release offers.
#[test]
fn questions_follow_the_release() {
    let old = Release::version(1, 10, 1);
    // One CPU process: the IPEX question after "CPU only".
    let (r, printed) = flow_as(&["0", "yes", "yes", "no", "no", "0"], old);
    let f = r.unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert!(
        printed.contains("Intel PyTorch Extension (IPEX)"),
        "{printed}"
    );
    assert_eq!(f["ipex_config"], json!({"ipex": true}));
    let (r, printed) = flow_as(&["0", "yes", "no", "no", "0"], Release::version(1, 13, 0));
    assert!(r.is_ok() && !printed.contains("IPEX"), "{printed}");
    // mpirun: the thread count stays text when typed, the number 1 by default.
    let mpirun = |ccl: &str| {
        let (r, printed) = flow_as(
            &[
                "1", "", "", "no", "yes", "~/hosts", ccl, "no", "no", "4", "0",
            ],
            old,
        );
        r.unwrap_or_else(|e| panic!("{e}\n{printed}"))["mpirun_config"].clone()
    };
    assert_eq!(
        mpirun("4"),
        json!({"mpirun_hostfile": "/home/u/hosts", "mpirun_ccl": "4"})
    );
    assert_eq!(
        mpirun(""),
        json!({"mpirun_hostfile": "/home/u/hosts", "mpirun_ccl": 1})
    );
    // FP8: te/msamp before 1.13, ao/te from 1.16.
    let gpu = ["0", "no", "no", "no", "", "", "3"];
    let first = |r| fields_as(&[&gpu[..], &["", "no", ""]].concat(), r);
    assert_eq!(
        first(Release::version(1, 16, 0))["fp8_config"]["backend"],
        "AO"
    );
    let (r, printed) = flow_as(&[&gpu[..], &["", "", "", "", "", "", "", ""]].concat(), old);
    assert_eq!(r.expect("te")["fp8_config"]["backend"], "TE", "{printed}");
    let (r, _) = flow_as(&[&gpu[..], &["1", ""]].concat(), old);
    assert_eq!(r.expect("msamp")["fp8_config"]["backend"], "MSAMP");
    // 1.16 names the devices after the accelerator: none here.
    let plain = ["0", "no", "no", "no", "", "", "0"];
    let (r, printed) = flow_as(&plain, Release::version(1, 16, 0));
    assert!(
        r.is_ok() && printed.contains("What CPU(s) (by id)"),
        "{printed}"
    );
    let (r, _) = flow_as(&[&gpu[..], &["2"]].concat(), Release::version(1, 16, 0));
    assert!(r.is_err(), "1.16 offers no third backend");
}

fn fields_as(answers: &[&str], release: Release) -> Map<String, Value> {
    let (r, printed) = flow_as(answers, release);
    r.unwrap_or_else(|e| panic!("{e}\n{printed}"))
}
