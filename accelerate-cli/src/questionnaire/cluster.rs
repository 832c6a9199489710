//! The "This machine" flow (accelerate's `get_cluster_input`): the machine
//! type and the questions every type shares, in accelerate's order, calling
//! out to the DeepSpeed/FSDP/Megatron and precision/TPU parts, then the
//! fields of accelerate's `ClusterConfig` for those answers.

use crate::release::Release;
use serde_json::{json, Map, Value};

use super::prompt::Prompter;
use super::{deepspeed, fsdp, precision, QuestionnaireError};

/// accelerate's `DistributedType`: what the questionnaire ends with.
pub(super) use crate::vocab::DistributedType as Dist;
use crate::vocab::{DynamoBackend, MixedPrecision};

/// The machine-type menu, in accelerate's order.
const MACHINES: [(&str, Dist); 11] = [
    ("No distributed training", Dist::No),
    ("multi-CPU", Dist::MultiCpu),
    ("multi-XPU", Dist::MultiXpu),
    ("multi-HPU", Dist::MultiHpu),
    ("multi-GPU", Dist::MultiGpu),
    ("multi-NPU", Dist::MultiNpu),
    ("multi-MLU", Dist::MultiMlu),
    ("multi-SDAA", Dist::MultiSdaa),
    ("multi-MUSA", Dist::MultiMusa),
    ("multi-NEURON", Dist::MultiNeuron),
    ("TPU", Dist::Xla),
];

impl Dist {
    /// The multi-process types, CPU included (asked about machines).
    fn is_multi(self) -> bool {
        self == Dist::MultiCpu || self.is_multi_device()
    }

    /// What "How many ... should be used" counts: accelerate derives it from
    /// the type's name (`MULTI_GPU` → "GPU(s)", `XLA` → "XLA(s)").
    fn process_noun(self) -> String {
        match self {
            Dist::MultiCpu => "processes".into(),
            Dist::MultiNeuron => "NEURON cores".into(),
            Dist::DeepSpeed | Dist::Fsdp | Dist::MegatronLm => "GPU(s)".into(),
            other => format!("{}(s)", other.name().trim_start_matches("MULTI_")),
        }
    }
}

/// `torch.compile` modes.
const DYNAMO_MODES: [&str; 3] = ["default", "reduce-overhead", "max-autotune"];

/// The multi-node answers (accelerate's defaults for one machine).
struct Nodes {
    num_machines: i64,
    machine_rank: i64,
    main_process_ip: Option<String>,
    main_process_port: Option<i64>,
    same_network: bool,
    rdzv_backend: String,
    debug: bool,
}

impl Nodes {
    /// One machine (the questionnaire writes `same_network: true` for it).
    fn single() -> Self {
        Self {
            num_machines: 1,
            machine_rank: 0,
            main_process_ip: None,
            main_process_port: None,
            same_network: true,
            rdzv_backend: "static".into(),
            debug: false,
        }
    }
}

/// Runs the "This machine" questions; returns every `ClusterConfig` field.
pub(super) fn ask(
    p: &mut Prompter<'_>,
    release: Release,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Map<String, Value>, QuestionnaireError> {
    let labels = MACHINES.map(|(label, _)| label);
    let mut dist = MACHINES[p.choose("Which type of machine are you using?", &labels, 0)?].1;
    let nodes = if dist.is_multi() {
        nodes(p)?
    } else {
        Nodes::single()
    };
    let use_cpu = match dist {
        Dist::No => p.yes_no("Do you want to run your training on CPU only (even if a GPU / Apple Silicon / Ascend NPU device is available)? [yes/NO]:", false)?,
        Dist::MultiCpu => true,
        _ => false,
    };
    let mut ipex = Map::new();
    // Before 1.13, on CPU (or XPU, which accel does not detect).
    if release.behaviour.ipex_questions && use_cpu {
        let answer = p.yes_no("Do you want to use Intel PyTorch Extension (IPEX) to speed up training on CPU/XPU? [yes/NO]:", false)?;
        ipex.insert("ipex".into(), json!(answer));
    }
    let mut mpirun = Map::new();
    if dist == Dist::MultiCpu
        && p.yes_no("Do you want accelerate to launch mpirun? [yes/NO]: ", false)?
    {
        let hostfile = p.text(
            "Please enter the path to the hostfile to use with mpirun [~/hostfile]: ",
            Some("~/hostfile"),
        )?;
        mpirun.insert(
            "mpirun_hostfile".into(),
            json!(expand_user(hostfile.trim(), env)),
        );
        if release.behaviour.ipex_questions {
            // No conversion: an answer stays text, the default is the number 1.
            let ccl = p.field(
                "Enter the number of oneCCL worker threads [1]: ",
                Some(json!(1)),
                None,
                |s| Some(json!(s)),
            )?;
            mpirun.insert("mpirun_ccl".into(), ccl);
        }
    }
    let dynamo = dynamo(p)?;
    // No MPS here: DeepSpeed is offered to every accelerator type and NO.
    let ds = if dist.is_multi_device() || dist == Dist::No {
        deepspeed::ask(p, &mut dist, nodes.num_machines)?
    } else {
        deepspeed::DeepSpeed::default()
    };
    let fsdp = if dist.is_multi_device() {
        fsdp::ask(p, &mut dist)?
    } else {
        Map::new()
    };
    let parallelism = if fsdp.get("fsdp_version") == Some(&json!(2)) {
        fsdp::parallelism(p)?
    } else {
        Map::new()
    };
    let megatron = if dist == Dist::MultiGpu {
        fsdp::megatron(p, &mut dist)?
    } else {
        Map::new()
    };
    // Every type but NO (one process) asks; DeepSpeed/FSDP/Megatron count GPUs.
    let num_processes = if dist != Dist::No {
        p.int(
            &format!(
                "How many {} should be used for distributed training? [1]:",
                dist.process_noun()
            ),
            Some(1),
            Some("Please enter an integer."),
        )?
    } else {
        1
    };
    if dist == Dist::MultiGpu && nodes.num_machines == 1 && num_processes == 1 {
        return Err(QuestionnaireError::Refused(
            "multi-GPU with 1 GPU on a single machine is not distributed training (accelerate refuses it too): run `accel config` again and choose `No distributed training` as the type of machine",
        ));
    }
    let on_device = (dist.is_multi_device() || dist == Dist::No) && !use_cpu;
    let gpu_ids = if on_device {
        // From 1.16 the devices are named after the accelerator torch finds:
        // CPU(s) when there is none (accel sees CUDA devices only).
        let devices = if release.behaviour.ids_named_by_accelerator
            && accel_agent::probe::cuda_devices(env) == 0
        {
            "CPU(s)"
        } else {
            "GPU(s)"
        };
        Some(p.text(
            &format!("What {devices} (by id) should be used for training on this machine as a comma-separated list? [all]:"),
            Some("all"),
        )?)
    } else {
        None
    };
    let cpu_affinity = matches!(dist, Dist::No | Dist::MultiGpu)
        && !use_cpu
        && p.yes_no("Would you like to enable numa efficiency? (Currently only supported on NVIDIA hardware). [yes/NO]: ", false)?;
    let tail = precision::ask(p, dist, ds.json_file, release)?;
    if dynamo.is_some() && tail.mixed_precision == Some(MixedPrecision::No) && !use_cpu {
        p.say("Torch dynamo used without mixed precision requires TF32 to be efficient. Accelerate will enable it by default when launching your scripts.\n")?;
    }
    let tpu = tail.tpu;
    let mut f = Map::new();
    let mut put = |k: &str, v: Value| {
        f.insert(k.to_owned(), v);
    };
    put("compute_environment", json!("LOCAL_MACHINE"));
    put("distributed_type", json!(dist.name()));
    put("num_processes", json!(num_processes));
    put("gpu_ids", json!(gpu_ids));
    put(
        "mixed_precision",
        json!(tail.mixed_precision.map(MixedPrecision::name)),
    );
    put("downcast_bf16", json!("no"));
    put("machine_rank", json!(nodes.machine_rank));
    put("num_machines", json!(nodes.num_machines));
    put("main_process_ip", json!(nodes.main_process_ip));
    put("main_process_port", json!(nodes.main_process_port));
    put("main_training_function", json!(tail.main_training_function));
    put("fp8_config", Value::Object(tail.fp8));
    put("deepspeed_config", Value::Object(ds.config));
    put("fsdp_config", Value::Object(fsdp));
    put("parallelism_config", Value::Object(parallelism));
    put("megatron_lm_config", Value::Object(megatron));
    put("mpirun_config", Value::Object(mpirun));
    put("ipex_config", Value::Object(ipex));
    put("use_cpu", json!(use_cpu));
    put("rdzv_backend", json!(nodes.rdzv_backend));
    put("same_network", json!(nodes.same_network));
    put("commands", json!(tpu.commands));
    put("command_file", json!(tpu.command_file));
    put("tpu_env", json!(tpu.env));
    put("tpu_name", json!(tpu.name));
    put("tpu_vm", json!(tpu.vm));
    put("tpu_zone", json!(tpu.zone));
    put("tpu_use_sudo", tpu.use_sudo);
    put("tpu_use_cluster", json!(tpu.use_cluster));
    put("dynamo_config", Value::Object(dynamo.unwrap_or_default()));
    put("debug", json!(nodes.debug));
    put("enable_cpu_affinity", json!(cpu_affinity));
    Ok(f)
}

/// How many machines, and where the main one is.
fn nodes(p: &mut Prompter<'_>) -> Result<Nodes, QuestionnaireError> {
    let num_machines = p.int(
        "How many different machines will you use (use more than 1 for multi-node training)? [1]: ",
        Some(1),
        None,
    )?;
    let mut n = Nodes {
        num_machines,
        ..Nodes::single()
    };
    if num_machines > 1 {
        let ranks: Vec<String> = (0..num_machines).map(|r| r.to_string()).collect();
        n.machine_rank = i64::try_from(p.choose("What is the rank of this machine?", &ranks, 0)?)
            .unwrap_or_default();
        n.main_process_ip = Some(p.text(
            "What is the IP address of the machine that will host the main process? ",
            None,
        )?);
        n.main_process_port = Some(p.int(
            "What is the port you will use to communicate with the main process? ",
            None,
            None,
        )?);
        n.same_network = p.yes_no("Are all the machines on the same local network? Answer `no` if nodes are on the cloud and/or on different network hosts [YES/no]: ", true)?;
        if !n.same_network {
            n.rdzv_backend = p.text(
                "What rendezvous backend will you use? ('static', 'c10d', ...): ",
                Some("static"),
            )?;
        }
    }
    n.debug = p.yes_no("Should distributed operations be checked while running for errors? This can avoid timeout issues but will be slower. [yes/NO]: ", false)?;
    Ok(n)
}

/// The torch dynamo questions; `None` when dynamo is not wanted.
fn dynamo(p: &mut Prompter<'_>) -> Result<Option<Map<String, Value>>, QuestionnaireError> {
    if !p.yes_no(
        "Do you wish to optimize your script with torch dynamo?[yes/NO]:",
        false,
    )? {
        return Ok(None);
    }
    // accelerate's menu misspells one backend and crashes on it; the
    // backend meant is written.
    let labels = DynamoBackend::MENU.map(|b| b.offered_name().to_lowercase());
    let backend = DynamoBackend::MENU
        [p.choose("Which dynamo backend would you like to use?", &labels, 2)?]
    .name();
    let mut d = Map::new();
    d.insert("dynamo_backend".into(), json!(backend));
    if p.yes_no(
        "Do you want to customize the defaults sent to torch.compile? [yes/NO]: ",
        false,
    )? {
        let mode = p.choose("Which mode do you want to use?", &DYNAMO_MODES, 0)?;
        d.insert("dynamo_mode".into(), json!(DYNAMO_MODES[mode]));
        for (key, question) in [
            ("dynamo_use_fullgraph", "Do you want the fullgraph mode or it is ok to break model into several subgraphs? [yes/NO]: "),
            ("dynamo_use_dynamic", "Do you want to enable dynamic shape tracing? [yes/NO]: "),
            ("dynamo_use_regional_compilation", "Do you want to enable regional compilation? [yes/NO]: "),
        ] {
            d.insert(key.into(), json!(p.yes_no(question, false)?));
        }
    }
    Ok(Some(d))
}

/// Python's `os.path.expanduser` for `~` and `~/...` (from `HOME`); other
/// forms (`~user`, or no `HOME`) are left as they are.
pub(super) fn expand_user(path: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let Some(rest) = path.strip_prefix('~') else {
        return path.to_owned();
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return path.to_owned();
    }
    match env("HOME") {
        Some(home) => {
            let out = format!("{}{rest}", home.trim_end_matches('/'));
            if out.is_empty() {
                "/".into()
            } else {
                out
            }
        }
        None => path.to_owned(),
    }
}
