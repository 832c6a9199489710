//! `accel config` (the interactive questionnaire) against `accelerate config`
//! given the same answers.
//!
//! accelerate's menus need a terminal, so its questionnaire runs in the venv
//! with `input()` and the menu's `run` replaced by readers of the same answer
//! file (a menu answer is the row index, empty = the menu's default, as
//! accel takes it). The optional packages accelerate checks for before
//! writing their options (DeepSpeed, an FP8 backend) are reported present,
//! as accel assumes. Then: the same questions in the same order, the same
//! file byte for byte, the same refusals, and accelerate reads accel's files.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use accel_tests::{
    bin, read_json, run_logged, scratch, AccelerateVenv, Finished, ACCELERATE_VERSIONS,
    PINNED_ACCELERATE,
};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);

/// One answer script; `file` is the `--config_file` name (`None`: the default location).
struct Case {
    name: &'static str,
    file: Option<&'static str>,
    /// The answers, one per question, separated by `|`.
    answers: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "no-distributed-cpu",
        file: Some("cfg.yaml"),
        answers: "0|0|yes|no|no|",
    },
    Case {
        // Two machines on different networks with the default (static)
        // rendezvous; "x" and "maybe" are asked again.
        name: "multi-gpu-2-machines-static",
        file: Some("cfg.yaml"),
        answers: "0|4|x|2|1|10.0.0.1|29500|no||maybe|no|no|no|no|no|16|0,1,2,3,4,5,6,7|yes|1",
    },
    Case {
        name: "multi-cpu-mpirun-dynamo",
        file: Some("cfg.yaml"),
        answers: "0|1|||yes||yes||yes|1|yes|no|YES|4|2",
    },
    Case {
        name: "fsdp2-parallelism",
        file: Some("cfg.yaml"),
        answers: "0|4||no|no|no|yes|||no|0|no|LlamaDecoderLayer|||yes|yes|1|2|1|2|1|4|2",
    },
    Case {
        name: "deepspeed-zero2-offload",
        file: Some("cfg.yaml"),
        answers: "0|4||no|no|yes|no||1|2||4|yes|0.5|no|no|2|1",
    },
    Case {
        name: "deepspeed-json-multinode",
        file: Some("cfg.json"),
        answers: "0|4|2|0|10.1.1.1|6000||||yes|yes|/ds.json|no|yes|MixtralSparseMoeBlock||/job/hostfile|yes|worker-1:0|no|8",
    },
    Case {
        name: "fsdp1-size-wrap",
        file: Some("cfg.yaml"),
        answers: "0|4||||no|yes|0|3|yes|1||1|2|yes|no|no|no||2|",
    },
    Case {
        name: "megatron-dynamo",
        file: Some("cfg.yaml"),
        answers: "0|4|||yes|5|no|no|no|yes|2||2|4|no||0|4|0",
    },
    Case {
        name: "tpu-commands",
        file: Some("cfg.yaml"),
        answers: "0|10||8|train|yes|my-tpu|us-central1-a|yes|yes|no|pip install x|yes|echo hi||vm1,vm2|A=1,B=2",
    },
    Case {
        name: "tpu-command-file",
        file: Some("cfg.yaml"),
        answers: "0|10||||yes||z||yes|yes|scripts/../setup.sh||",
    },
    Case {
        name: "fp8-te",
        file: Some("cfg.yaml"),
        answers: "0|0|no|no|no|||3|1||2||2||1|yes|yes||no",
    },
    Case {
        name: "fp8-msamp-neuron",
        file: Some("cfg.yaml"),
        answers: "0|9||||no|no|2||3|2|",
    },
    Case {
        name: "fp8-ao-npu",
        file: Some("cfg.yaml"),
        answers: "0|5||||no|no|2||3||no|",
    },
    Case {
        name: "xpu",
        file: Some("sub/dir/cfg.yml"),
        answers: "0|2|||no|no|no|3|1|0",
    },
    Case {
        name: "default-location-one-gpu",
        file: None,
        answers: "0|0|no|no|no|0|no|2",
    },
    Case {
        name: "multi-gpu-one-process-refused",
        file: Some("cfg.yaml"),
        answers: "0|4||||no|no|no|1",
    },
];

/// accelerate's questionnaire on answer files (see the module doc).
const DRIVER: &str = r#"
import argparse, builtins, contextlib, json, sys
import accelerate.commands.config.cluster as cluster
from accelerate.commands.config.config import config_command
from accelerate.commands.menu.selection_menu import BulletMenu

prompts = []

def answer(prompt):
    prompts.append(prompt)
    line = sys.stdin.readline()
    if not line:
        raise EOFError(prompt)
    return line[:-1] if line.endswith("\n") else line

def ask(prompt=""):
    print(prompt, end="")
    return answer(prompt)

def menu(self, default_choice=0):
    line = answer(self.prompt).strip()
    return default_choice if line == "" else int(line)

builtins.input = ask
BulletMenu.run = menu
for name in ("is_deepspeed_available", "is_transformers_available", "is_fp8_available",
             "is_transformer_engine_available", "is_msamp_available", "is_torchao_available"):
    setattr(cluster, name, lambda: True)

for case in json.loads(sys.argv[1]):
    prompts.clear()
    error = None
    with open(case["answers"]) as answers, open(case["log"] + ".stdout", "w") as out:
        sys.stdin = answers
        with contextlib.redirect_stdout(out):
            try:
                config_command(argparse.Namespace(config_file=case["out"]))
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
    with open(case["log"], "w") as f:
        json.dump({"prompts": prompts, "error": error}, f)
"#;

/// Runs `accel config [--config_file FILE]` with `answers` on stdin.
fn accel_config(
    v: &AccelerateVenv,
    dir: &Path,
    name: &str,
    answers: &Path,
    file: Option<&Path>,
) -> Finished {
    let mut c = Command::new("sh");
    c.args(["-c", r#"f=$1; shift; exec "$0" "$@" < "$f""#])
        .arg(bin("accel"))
        .arg(answers)
        .arg("config");
    if let Some(file) = file {
        c.arg("--config_file").arg(file);
    }
    c.current_dir(dir.join("work"))
        .env("PATH", v.path())
        .env("HOME", dir.join("home"))
        .env("HF_HOME", dir.join("accel-hf"))
        .env_remove("XDG_CACHE_HOME");
    run_logged(c, dir, name, LIMIT)
}

fn python(v: &AccelerateVenv, dir: &Path, name: &str, args: &[&str]) -> Finished {
    let mut c = Command::new(v.bin("python"));
    c.args(args)
        .current_dir(dir.join("work"))
        .env("HOME", dir.join("home"))
        .env("HF_HOME", dir.join("accelerate-hf"))
        .env_remove("XDG_CACHE_HOME");
    let out = run_logged(c, dir, name, LIMIT);
    assert!(out.status.success(), "{name}: {}", out.stderr);
    out
}

/// accel asked `prompts` (accelerate's questions) in this order, each as
/// many times as accelerate did.
fn assert_asked_the_same(case: &str, printed: &str, prompts: &[Value]) {
    let prompts: Vec<&str> = prompts
        .iter()
        .map(|p| p.as_str().expect("prompt text"))
        .collect();
    let mut rest = printed;
    for p in &prompts {
        let at = rest.find(p).unwrap_or_else(|| {
            panic!("{case}: accel did not ask {p:?} (in this order); it printed:\n{printed}")
        });
        rest = &rest[at + p.len()..];
    }
    for p in &prompts {
        let times = prompts.iter().filter(|q| q == &p).count();
        assert_eq!(
            printed.matches(p).count(),
            times,
            "{case}: times asked {p:?}"
        );
    }
}

/// The pinned release and the newest (which asks the same questions but
/// for the FP8 backends). Releases before 1.13 ask about IPEX on CPU, which
/// these answer scripts do not answer; the unit tests of the flow cover them.
#[test]
fn questionnaire_writes_what_accelerate_writes_for_the_same_answers() {
    for version in [PINNED_ACCELERATE, ACCELERATE_VERSIONS[2]] {
        questionnaire_matches(&AccelerateVenv::of(version));
    }
}

fn questionnaire_matches(v: &AccelerateVenv) {
    let dir = scratch(&format!("accel-questionnaire-{}", v.version));
    // MS-AMP is no FP8 backend of 1.16 (its menu has two rows: no answer
    // picks a third), so that case is one of the older releases only.
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| !(c.name.contains("msamp") && v.version == ACCELERATE_VERSIONS[2]))
        .collect();
    for sub in ["work", "home"] {
        fs::create_dir_all(dir.join(sub)).expect("mkdir");
    }
    let target = |tool: &str, case: &Case| -> PathBuf {
        match case.file {
            Some(f) => dir.join(format!("{tool}-{}", case.name)).join(f),
            None => dir.join(format!("{tool}-hf/accelerate/default_config.yaml")),
        }
    };
    let mut jobs = Vec::new();
    for &case in &cases {
        let answers = dir.join(format!("{}.answers", case.name));
        fs::write(&answers, case.answers.replace('|', "\n") + "\n").expect("answers");
        if let Some(parent) = case.file.map(|_| target("accelerate", case)) {
            // accelerate does not create the directory of an explicit file.
            fs::create_dir_all(parent.parent().expect("dir")).expect("mkdir");
        }
        jobs.push(json!({
            "answers": answers,
            "out": case.file.map(|_| target("accelerate", case)),
            "log": dir.join(format!("{}.accelerate.json", case.name)),
        }));
    }
    python(
        v,
        &dir,
        "accelerate",
        &["-c", DRIVER, &Value::Array(jobs).to_string()],
    );

    let mut written = Vec::new();
    for &case in &cases {
        let log = read_json(&dir.join(format!("{}.accelerate.json", case.name)));
        let answers = dir.join(format!("{}.answers", case.name));
        let path = target("accel", case);
        let out = accel_config(
            v,
            &dir,
            case.name,
            &answers,
            case.file.map(|_| path.as_path()),
        );
        if let Some(error) = log["error"].as_str() {
            assert!(
                !out.status.success(),
                "{}: accelerate refused ({error}), accel did not",
                case.name
            );
            assert!(!path.exists(), "{}: no file after a refusal", case.name);
            assert!(
                error.contains("only using 1 GPU")
                    && out.stderr.contains("`No distributed training`"),
                "{}: {error} / {}",
                case.name,
                out.stderr
            );
            continue;
        }
        assert!(out.status.success(), "{}: {}", case.name, out.stderr);
        let prompts = log["prompts"].as_array().expect("prompts");
        assert_eq!(
            prompts.len(),
            case.answers.split('|').count(),
            "{}: the script answers accelerate's questions exactly",
            case.name
        );
        assert_asked_the_same(case.name, &out.stdout, prompts);
        assert!(
            out.stdout.ends_with(&format!(
                "accelerate configuration saved at {}\n",
                path.display()
            )),
            "{}: {}",
            case.name,
            out.stdout
        );
        let ours = fs::read_to_string(&path).expect("accel wrote the file");
        let theirs = fs::read_to_string(target("accelerate", case)).expect("accelerate wrote");
        assert_eq!(
            ours, theirs,
            "{}: accel's file (left) vs accelerate's",
            case.name
        );
        written.push(path);
    }
    assert_eq!(written.len(), cases.len() - 1, "{}", v.version);

    // accelerate's loader takes every file accel wrote.
    let paths: Vec<Value> = written.iter().map(|p| json!(p)).collect();
    python(
        v,
        &dir,
        "load",
        &[
            "-c",
            "import json, sys\nfrom accelerate.commands.config.config_args import load_config_from_file\nfor p in json.loads(sys.argv[1]): load_config_from_file(p)",
            &Value::Array(paths).to_string(),
        ],
    );
}

#[test]
fn questionnaire_stops_at_end_of_input_naming_the_question() {
    let dir = scratch("accel-questionnaire-eof");
    for sub in ["work", "home"] {
        fs::create_dir_all(dir.join(sub)).expect("mkdir");
    }
    let answers = dir.join("answers");
    fs::write(&answers, "0\n4\n2\n1\n10.0.0.1\n").expect("answers");
    let path = dir.join("cfg.yaml");
    let pinned = AccelerateVenv::of(PINNED_ACCELERATE);
    let out = accel_config(&pinned, &dir, "eof", &answers, Some(&path));
    assert!(!out.status.success(), "{}", out.stdout);
    assert!(
        out.stderr.contains(
            "no answer for: What is the port you will use to communicate with the main process?"
        ),
        "{}",
        out.stderr
    );
    assert!(!path.exists());
    // Nothing at all on stdin: the first question is named.
    fs::write(&answers, "").expect("answers");
    let out = accel_config(&pinned, &dir, "empty", &answers, Some(&path));
    assert!(
        !out.status.success()
            && out
                .stderr
                .contains("no answer for: In which compute environment are you running?"),
        "{}",
        out.stderr
    );
}
