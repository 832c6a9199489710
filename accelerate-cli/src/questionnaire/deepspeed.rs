//! The DeepSpeed questions (asked for an accelerator type or "No
//! distributed training"); a "yes" makes the type `DEEPSPEED`. Their answers
//! go to `deepspeed_config` under the names `accelerate launch` reads.

use serde_json::{json, Map, Value};

use super::cluster::Dist;
use super::prompt::Prompter;
use super::QuestionnaireError;

/// Where ZeRO can offload to.
const DEVICES: [&str; 3] = ["none", "cpu", "nvme"];

/// DeepSpeed's multi-node launchers; all but "standard" use a hostfile.
const LAUNCHERS: [&str; 7] = [
    "pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm",
];

/// The DeepSpeed answers.
#[derive(Debug, Default)]
pub(super) struct DeepSpeed {
    /// `deepspeed_config`.
    pub(super) config: Map<String, Value>,
    /// A DeepSpeed JSON file was given (then mixed precision is not asked).
    pub(super) json_file: bool,
}

/// Asks whether to use DeepSpeed and, if so, how.
pub(super) fn ask(
    p: &mut Prompter<'_>,
    dist: &mut Dist,
    num_machines: i64,
) -> Result<DeepSpeed, QuestionnaireError> {
    let mut ds = DeepSpeed::default();
    if !p.yes_no("Do you want to use DeepSpeed? [yes/NO]: ", false)? {
        return Ok(ds);
    }
    if *dist == Dist::MultiNeuron {
        return Err(QuestionnaireError::Refused(
            "DeepSpeed is not supported on Neuron devices (accelerate refuses it too): answer `no` to DeepSpeed",
        ));
    }
    *dist = Dist::DeepSpeed;
    let c = &mut ds.config;
    ds.json_file = p.yes_no(
        "Do you want to specify a json file to a DeepSpeed config? [yes/NO]: ",
        false,
    )?;
    if ds.json_file {
        let file = p.text(
            "Please enter the path to the json DeepSpeed config file: ",
            Some("none"),
        )?;
        c.insert("deepspeed_config_file".into(), json!(file));
    } else {
        zero(p, c)?;
    }
    let init = p.yes_no("Do you want to enable `deepspeed.zero.Init` when using ZeRO Stage-3 for constructing massive models? [yes/NO]: ", false)?;
    c.insert("zero3_init_flag".into(), json!(init));
    if p.yes_no(
        "Do you want to enable Mixture-of-Experts training (MoE)? [yes/NO]: ",
        false,
    )? {
        let names = p.text("Specify the comma-separated list of transformers MoE layer class names (case-sensitive), e.g :  `MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`, `JetMoEAttention,JetMoEBlock` ... : ", None)?;
        c.insert("deepspeed_moe_layer_cls_names".into(), json!(names));
    }
    if num_machines > 1 {
        multinode(p, c)?;
    }
    Ok(ds)
}

/// ZeRO stage, offloading, accumulation and clipping (without a JSON file).
fn zero(p: &mut Prompter<'_>, c: &mut Map<String, Value>) -> Result<(), QuestionnaireError> {
    let stage = p.choose(
        "What should be your DeepSpeed's ZeRO optimization stage?",
        &["0", "1", "2", "3"],
        2,
    )?;
    c.insert("zero_stage".into(), json!(stage));
    if stage >= 2 {
        let optimizer = DEVICES[p.choose("Where to offload optimizer states?", &DEVICES, 0)?];
        let param = DEVICES[p.choose("Where to offload parameters?", &DEVICES, 0)?];
        c.insert("offload_optimizer_device".into(), json!(optimizer));
        c.insert("offload_param_device".into(), json!(param));
        if param == "nvme" {
            let path = p.text("Nvme Path to offload parameters?", Some("/nvme"))?;
            c.insert("offload_param_nvme_path".into(), json!(path));
        }
        if optimizer == "nvme" {
            let path = p.text("Nvme Path to offload optimizer states?", Some("/nvme"))?;
            c.insert("offload_optimizer_nvme_path".into(), json!(path));
        }
    }
    let steps = p.int(
        "How many gradient accumulation steps you're passing in your script? [1]: ",
        Some(1),
        None,
    )?;
    c.insert("gradient_accumulation_steps".into(), json!(steps));
    if p.yes_no("Do you want to use gradient clipping? [yes/NO]: ", false)? {
        let clip = p.float("What is the gradient clipping value? [1.0]: ", 1.0)?;
        c.insert("gradient_clipping".into(), json!(clip));
    }
    if stage == 3 {
        let save = p.yes_no(
            "Do you want to save 16-bit model weights when using ZeRO Stage-3? [yes/NO]: ",
            false,
        )?;
        c.insert("zero3_save_16bit_model".into(), json!(save));
    }
    Ok(())
}

/// The launcher and hostfile for several machines.
fn multinode(p: &mut Prompter<'_>, c: &mut Map<String, Value>) -> Result<(), QuestionnaireError> {
    let launcher =
        LAUNCHERS[p.choose("Which Type of launcher do you want to use?", &LAUNCHERS, 0)?];
    c.insert("deepspeed_multinode_launcher".into(), json!(launcher));
    if launcher == "standard" {
        return Ok(());
    }
    let hostfile = p.text("DeepSpeed configures multi-node compute resources with hostfile. Each row is of the format `hostname slots=[num_gpus]`, e.g., `localhost slots=2`; for more information please refer official [documentation](https://www.deepspeed.ai/getting-started/#resource-configuration-multi-node). Please specify the location of hostfile: ", None)?;
    c.insert("deepspeed_hostfile".into(), json!(hostfile));
    for (kind, key) in [
        ("exclusion", "deepspeed_exclusion_filter"),
        ("inclusion", "deepspeed_inclusion_filter"),
    ] {
        if p.yes_no(
            &format!("Do you want to specify {kind} filter string? [yes/NO]: "),
            false,
        )? {
            let filter = p.text(&format!("DeepSpeed {kind} filter string: "), None)?;
            c.insert(key.into(), json!(filter));
        }
    }
    Ok(())
}
