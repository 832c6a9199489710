//! The last questions: the TPU ones for a TPU (which always runs without
//! mixed precision, as accelerate sets it), else mixed precision and the FP8
//! recipe (not asked after a DeepSpeed JSON file, which holds precision).

use crate::release::Release;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::cluster::Dist;
use super::prompt::Prompter;
use super::QuestionnaireError;
use crate::vocab::MixedPrecision;

const FP8_FORMATS: [&str; 3] = ["HYBRID", "E4M3", "E5M2"];

/// The TPU-pod fields, accelerate's defaults when not asked.
#[derive(Debug)]
pub(super) struct Tpu {
    pub(super) use_cluster: bool,
    pub(super) name: Option<String>,
    pub(super) zone: Option<String>,
    /// accelerate keeps this answer unconverted: `false` or the text typed.
    pub(super) use_sudo: Value,
    pub(super) command_file: Option<String>,
    pub(super) commands: Option<Vec<String>>,
    pub(super) vm: Option<Vec<String>>,
    pub(super) env: Vec<String>,
}

impl Default for Tpu {
    fn default() -> Self {
        Self {
            use_cluster: false,
            name: None,
            zone: None,
            use_sudo: Value::Bool(false),
            command_file: None,
            commands: None,
            vm: None,
            env: Vec::new(),
        }
    }
}

/// What the last questions decided.
#[derive(Debug)]
pub(super) struct Tail {
    pub(super) mixed_precision: Option<MixedPrecision>,
    pub(super) main_training_function: String,
    pub(super) fp8: Map<String, Value>,
    pub(super) tpu: Tpu,
}

/// Asks the TPU questions or the precision ones.
pub(super) fn ask(
    p: &mut Prompter<'_>,
    dist: Dist,
    deepspeed_json: bool,
    release: Release,
) -> Result<Tail, QuestionnaireError> {
    if dist == Dist::Xla {
        let main = p.text("What is the name of the function in your script that should be launched in all parallel scripts? [main]: ", Some("main"))?;
        return Ok(Tail {
            mixed_precision: Some(MixedPrecision::No),
            main_training_function: main,
            fp8: Map::new(),
            tpu: tpu(p)?,
        });
    }
    let mut tail = Tail {
        mixed_precision: None,
        main_training_function: "main".into(),
        fp8: Map::new(),
        tpu: Tpu::default(),
    };
    if !deepspeed_json {
        let chosen = p.choose(
            "Do you wish to use mixed precision?",
            &MixedPrecision::CHOICES,
            0,
        )?;
        let mp = MixedPrecision::ALL[chosen];
        tail.mixed_precision = Some(mp);
        if mp == MixedPrecision::Fp8 {
            tail.fp8 = fp8(p, release)?;
        }
    }
    Ok(tail)
}

/// The TPU cluster questions.
fn tpu(p: &mut Prompter<'_>) -> Result<Tpu, QuestionnaireError> {
    let mut t = Tpu {
        use_cluster: p.yes_no("Are you using a TPU cluster? [yes/NO]: ", false)?,
        ..Tpu::default()
    };
    if !t.use_cluster {
        return Ok(t);
    }
    t.name = Some(p.text("What is the name of your TPU cluster? ", None)?);
    t.zone = Some(p.text("What is the zone of your TPU cluster? ", None)?);
    // accelerate does not convert this answer to a boolean: it writes the text.
    t.use_sudo = p.field(
        "To run a python script in a TPU pod, should `sudo` be used? [yes/NO]: ",
        Some(Value::Bool(false)),
        None,
        |s| Some(json!(s)),
    )?;
    if p.yes_no(
        "Do you have code you wish to run on startup in each pod? [yes/NO]: ",
        false,
    )? {
        if p.yes_no("Is this code located in a bash script? [yes/NO]: ", false)? {
            let file = p.text("What is the path to your bash script? ", None)?;
            let cwd = std::env::current_dir().map_err(|source| QuestionnaireError::CurrentDir {
                path: file.clone(),
                source,
            })?;
            t.command_file = Some(abspath(&file, &cwd));
        } else {
            p.say(
                "Please enter each command separately you wish to run on startup in each pod.\n",
            )?;
            let mut commands = Vec::new();
            loop {
                commands.push(p.text("Please enter a single command to be ran ", None)?);
                if !p.yes_no("Do you wish to add another command? [yes/NO]: ", false)? {
                    break;
                }
            }
            t.commands = Some(commands);
        }
    }
    let split = |s: String| s.split(',').map(str::to_owned).collect::<Vec<_>>();
    t.vm = Some(split(p.text("If not using an instance group, what are the names of the Compute VM instances to be used, separated by a comma: ", Some(""))?));
    t.env = split(p.text(
        "What environment variables do you wish to set in each pod, separated by a comma: ",
        Some(""),
    )?);
    Ok(t)
}

/// The FP8 backend (among those `release` offers) and its recipe.
fn fp8(p: &mut Prompter<'_>, release: Release) -> Result<Map<String, Value>, QuestionnaireError> {
    let mut c = Map::new();
    let offered = release.behaviour.fp8_backends;
    let backend =
        offered[p.choose("Which FP8 backend do you want to use?", offered, 0)?].to_uppercase();
    c.insert("backend".into(), json!(backend));
    match backend.as_str() {
        "TE" => {
            let autocast = p.yes_no_quiet("Do you want to use FP8 autocast during eval mode? Generally better metrics are found when this is disabled [yes/NO]: ", false)?;
            c.insert("use_autocast_during_eval".into(), json!(autocast));
            let margin = p.int(
                "What margin should be used for gradient scaling? [0]: ",
                Some(0),
                None,
            )?;
            c.insert("margin".into(), json!(margin));
            let interval = p.int("What interval should be used for how often the scaling factor is recomputed? [1]: ", Some(1), None)?;
            c.insert("interval".into(), json!(interval));
            let format = p.choose("Which weight format should be used?", &FP8_FORMATS, 0)?;
            c.insert("fp8_format".into(), json!(FP8_FORMATS[format]));
            let history = p.int("What length of history should be used for the amax scaling factor computation? [1024]: ", Some(1024), None)?;
            c.insert("amax_history_length".into(), json!(history));
            let algorithms = ["max", "most_recent"];
            let algorithm = p.choose(
                "Which algorithm should be used for the amax scaling factor computation?",
                &algorithms,
                0,
            )?;
            c.insert(
                "amax_compute_algorithm".into(),
                json!(algorithms[algorithm]),
            );
            let mut higher = [false; 3];
            if p.yes_no_quiet("Do you want to execute `fprop`, `dgrad`, and `wgrad` GEMMS in higher precision? [yes/NO]: ", false)? {
                for (slot, gemm) in higher.iter_mut().zip(["fprop", "dgrad", "wgrad"]) {
                    *slot = p.yes_no_quiet(
                        &format!("Should `{gemm}` be executed in higher precision? [yes/NO]: "),
                        false,
                    )?;
                }
            }
            c.insert("override_linear_precision".into(), json!(higher));
        }
        "MSAMP" => {
            let levels = ["O1", "O2"];
            let level = p.choose("Which optimization level should be used?", &levels, 1)?;
            c.insert("optimization_level".into(), json!(levels[level]));
        }
        _ => {
            let gather = p.yes_no_quiet("Do you want to enable FSDP2 float8 all gather? This is recommended for better performance if using FSDP2. [YES/no]: ", true)?;
            c.insert("enable_fsdp_float8_all_gather".into(), json!(gather));
            let pad = p.yes_no_quiet("Do you want to pad the inner dimension of weight matrices before float8 matmuls? This is required for _scaled_mm which has strict alignment requirements. Note: padding may cause memory spikes. [YES/no]: ", true)?;
            c.insert("pad_inner_dim".into(), json!(pad));
        }
    }
    Ok(c)
}

/// Python's `os.path.abspath` on POSIX: joined to `cwd`, then normalised
/// lexically (`.`/`..`/repeated slashes; exactly two leading slashes kept).
pub(super) fn abspath(path: &str, cwd: &Path) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{}/{path}", cwd.to_string_lossy().trim_end_matches('/'))
    };
    let lead = if joined.starts_with("//") && !joined.starts_with("///") {
        "//"
    } else {
        "/"
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("{lead}{}", parts.join("/"))
}
