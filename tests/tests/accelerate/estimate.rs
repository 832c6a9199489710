//! `accel estimate-memory` against accelerate's own numbers and formatting.
//!
//! The venv's Python builds small PyTorch models, saves them with safetensors
//! (as float16, to show that accel counts every element at float32 as
//! accelerate does), and prints the table accelerate's `estimate_command`
//! makes for the same model object (its `create_empty_model` replaced, since
//! these models are not on the Hub). accel reads only the saved headers; the
//! two outputs must be identical byte for byte. The models cover sizes from
//! bytes to megabytes, a largest layer that is a top-level tensor, tensors
//! held by a module that has children (counted in no layer), sharded
//! checkpoints, and titles of every width class.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use accel_tests::{bin, run_logged, scratch, venv, Finished, Port};

const LIMIT: Duration = Duration::from_secs(120);

/// Builds the models, saves them, and prints accelerate's tables.
const MODELS_PY: &str = r#"
import argparse, contextlib, io, json, os, sys
import torch
from torch import nn
from safetensors.torch import save_file


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)


class Holder(nn.Module):
    """Holds a tensor itself and has a child: its own tensor is in no layer."""
    def __init__(self, width, vocab, held):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(held))
        self.proj = nn.Linear(width, vocab, bias=False)


class Net(nn.Module):
    def __init__(self, vocab, width, depth, gate, held):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.gate = nn.Parameter(torch.zeros(gate))
        self.head = Holder(width, vocab, held)
        self.register_buffer("steps", torch.zeros(3))


SPECS = {
    "tiny": dict(vocab=5, width=2, depth=1, gate=3, held=7),
    "medium": dict(vocab=1000, width=64, depth=2, gate=10, held=100_000),
    "gated": dict(vocab=50, width=8, depth=1, gate=300_000, held=10),
    "large": dict(vocab=30_000, width=96, depth=1, gate=1, held=1),
}


def build(spec):
    return Net(**SPECS[spec])


def save(spec, folder, shards):
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in build(spec).state_dict().items()}
    os.makedirs(folder, exist_ok=True)
    if shards == 1:
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, os.path.join(folder, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def expected(spec, name, dtypes):
    import accelerate.commands.estimate as estimate
    estimate.create_empty_model = lambda *args, **kwargs: build(spec)
    args = argparse.Namespace(model_name=name, library_name=None, dtypes=dtypes, trust_remote_code=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        estimate.estimate_command(args)
    return out.getvalue()


if sys.argv[1] == "save":
    save(sys.argv[2], sys.argv[3], int(sys.argv[4]))
else:
    cases = json.loads(sys.argv[2])
    print(json.dumps([expected(c["spec"], c["name"], c["dtypes"]) for c in cases]))
"#;

/// A minimal Hub: `HEAD`/`GET` (with `Range`) of `/{org}/{repo}/resolve/{rev}/{file}`.
const HUB_PY: &str = r#"
import http.server, os, re, sys

root = sys.argv[1]


class Hub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, length, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"accel-test"')
        self.send_header("X-Repo-Commit", "0" * 40)
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()

    def found(self):
        match = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/([^?]+)", self.path)
        path = match and os.path.join(root, match.group(1), match.group(2))
        if path and os.path.isfile(path):
            return path
        self.reply(404, 0, [("X-Error-Code", "EntryNotFound")])
        return None

    def do_HEAD(self):
        path = self.found()
        if path:
            self.reply(200, os.path.getsize(path))

    def do_GET(self):
        path = self.found()
        if not path:
            return
        with open(path, "rb") as f:
            data = f.read()
        status, wanted = 200, self.headers.get("Range")
        if wanted:
            start, end = wanted.split("=")[1].split("-")
            data, status = data[int(start): int(end) + 1], 206
        self.reply(status, len(data))
        self.wfile.write(data)


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Hub).serve_forever()
"#;

fn python() -> PathBuf {
    venv().join("bin/python")
}

/// Runs the models script; panics on failure.
fn models_py(dir: &Path, name: &str, args: &[&str]) -> String {
    let script = dir.join("models.py");
    std::fs::write(&script, MODELS_PY).expect("write models.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script).args(args);
    let out = run_logged(cmd, dir, name, LIMIT);
    assert!(out.status.success(), "models.py {args:?}: {}", out.stderr);
    out.stdout
}

/// `accel estimate-memory ARGS` run in `dir`, with `env` added.
fn accel(dir: &Path, log: &str, args: &[&str], env: &[(&str, &str)]) -> Finished {
    let mut cmd = Command::new(bin("accel"));
    cmd.current_dir(dir).arg("estimate-memory").args(args);
    for key in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env_remove(key);
    }
    cmd.env("HF_HOME", dir.join("hf")).envs(env.iter().copied());
    run_logged(cmd, dir, log, LIMIT)
}

/// One comparison: a saved model, the name given on the command line, dtypes.
struct Case {
    spec: &'static str,
    name: String,
    dtypes: Vec<&'static str>,
    extra: Vec<&'static str>,
}

fn compare(dir: &Path, cases: &[Case], env: &[(&str, &str)]) {
    let json: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            let dtypes = match c.dtypes.is_empty() {
                true => vec!["float32", "float16", "int8", "int4"],
                false => c.dtypes.clone(),
            };
            serde_json::json!({"spec": c.spec, "name": c.name, "dtypes": dtypes})
        })
        .collect();
    let json = serde_json::to_string(&json).expect("json");
    let expected: Vec<String> =
        serde_json::from_str(&models_py(dir, "expect", &["expect", &json])).expect("tables");
    for (i, (case, expected)) in cases.iter().zip(expected).enumerate() {
        let mut args = vec![case.name.as_str()];
        if !case.dtypes.is_empty() {
            args.push("--dtypes");
            args.extend(&case.dtypes);
        }
        args.extend(&case.extra);
        let out = accel(dir, &format!("accel-{i}"), &args, env);
        assert!(out.status.success(), "accel {args:?}: {}", out.stderr);
        assert_eq!(out.stdout, expected, "accel {args:?} vs accelerate");
    }
}

fn case(spec: &'static str, name: &str, dtypes: &[&'static str]) -> Case {
    Case {
        spec,
        name: name.to_owned(),
        dtypes: dtypes.to_vec(),
        extra: Vec::new(),
    }
}

#[test]
fn local_folders_print_accelerates_table_byte_for_byte() {
    let dir = scratch("estimate-local");
    // Title of 52 characters: longer than the columns, shorter than the box.
    let padded = format!("./{}", "p".repeat(23));
    for (spec, folder, shards) in [
        ("tiny", "tiny", "1"),
        ("medium", "medium", "1"),
        ("medium", "medium-sharded", "2"),
        ("gated", "gated", "3"),
        ("large", &padded[2..], "1"),
    ] {
        let folder = dir.join(folder);
        models_py(
            &dir,
            &format!("save-{spec}"),
            &["save", spec, folder.to_str().expect("utf-8"), shards],
        );
    }
    let absolute = dir.join("medium").to_str().expect("utf-8").to_owned();
    let all: &[&str] = &[];
    let mut cases = vec![
        case("tiny", "tiny", all),
        case("medium", &absolute, all),
        case("medium", "./medium-sharded", &["int4", "float32"]),
        case(
            "medium",
            "medium-sharded/model.safetensors.index.json",
            &["float16", "int8"],
        ),
        case("gated", "gated", &["float16"]),
        case("large", &padded, all),
        case(
            "large",
            &format!("{padded}/model.safetensors"),
            &["float32", "float32"],
        ),
    ];
    let mut aliases = case("tiny", "tiny", all);
    aliases.extra = vec!["--library-name", "transformers", "--trust-remote-code"];
    cases.push(aliases);
    compare(&dir, &cases, &[]);
}

/// Waits until something listens on `port`.
fn wait_listening(port: u16, server: &mut Child) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            server.try_wait().expect("server").is_none(),
            "the mock Hub exited"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the mock Hub did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn hub_ids_are_read_through_huggingface_hub() {
    let dir = scratch("estimate-hub");
    for (spec, repo, shards) in [("medium", "org/medium", "1"), ("gated", "org/sharded", "2")] {
        let folder = dir.join("hub").join(repo);
        models_py(
            &dir,
            &format!("save-{spec}"),
            &["save", spec, folder.to_str().expect("utf-8"), shards],
        );
    }
    let script = dir.join("hub.py");
    std::fs::write(&script, HUB_PY).expect("write hub.py");
    let port = Port::lease();
    let mut server = Command::new(python())
        .arg(&script)
        .arg(dir.join("hub"))
        .arg(port.to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("start the mock Hub");
    wait_listening(port.get(), &mut server);
    let endpoint = format!("http://127.0.0.1:{port}");
    let python = python();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("PYTHON_EXEC", python.to_str().expect("utf-8")),
    ];
    let all: &[&str] = &[];
    let result = std::panic::catch_unwind(|| {
        compare(
            &dir,
            &[
                case("medium", "org/medium", all),
                case("gated", "org/sharded", &["int8"]),
            ],
            &env,
        );
        let out = accel(&dir, "missing", &["org/missing"], &env);
        assert!(!out.status.success());
        assert!(
            out.stderr.contains("`org/missing`") && out.stderr.contains("safetensors"),
            "{}",
            out.stderr
        );
    });
    let _ = server.kill();
    let _ = server.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn an_unreachable_hub_fails_fast_and_says_how_to_go_on() {
    let dir = scratch("estimate-offline");
    let python = python().to_str().expect("utf-8").to_owned();
    for (log, env) in [
        ("offline", ("HF_HUB_OFFLINE", "1")),
        ("refused", ("HF_ENDPOINT", "http://127.0.0.1:1")),
        // Unroutable: refused, dropped (the probe gives up after 3 s) or
        // intercepted (then Python's request fails).
        ("blackhole", ("HF_ENDPOINT", "https://10.255.255.1")),
    ] {
        let started = Instant::now();
        let out = accel(
            &dir,
            log,
            &["some-org/some-model"],
            &[env, ("PYTHON_EXEC", &python)],
        );
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{log}: took {:?}",
            started.elapsed()
        );
        assert!(!out.status.success(), "{log}: {}", out.stdout);
        let err = out.stderr;
        assert!(
            err.starts_with(
                "accel: error: cannot reach the Hugging Face Hub to read `some-org/some-model`"
            ) && err.contains("huggingface-cli download some-org/some-model")
                && err.contains("accel estimate-memory DIR"),
            "{log}: {err}"
        );
    }
    // A path that does not exist is not mistaken for a Hub id.
    let out = accel(&dir, "nopath", &["./no/such/model"], &[]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("not an existing path"),
        "{}",
        out.stderr
    );
}
