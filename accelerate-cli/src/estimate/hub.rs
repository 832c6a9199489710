//! Tensor shapes of a Hub model, from the safetensors headers the Hub serves.
//!
//! The Hub is asked through `huggingface_hub.get_safetensors_metadata` in a
//! Python subprocess (`PYTHON_EXEC`, else `python3`), which reads only the
//! headers (HTTP range requests) and brings the user's token, endpoint, proxy
//! and cache settings along; accel itself has no HTTP client. Without a
//! network this must fail in seconds with a message that says what to do, not
//! hang on DNS or TCP retries, so the Hub endpoint is first probed with a
//! short TCP connect (skipped when a proxy is configured, since the proxy
//! then decides), `HF_HUB_OFFLINE` is honoured up front, and the subprocess
//! itself has a deadline.

use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::safetensors::Tensors;
use super::EstimateError;

/// How long the endpoint probe (name lookup and TCP connect) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the Python lookup may take once the Hub answered the probe.
const QUERY_TIMEOUT: Duration = Duration::from_secs(90);

/// The lookup run in Python: prints one JSON object, either
/// `{"tensors": {name: shape}}` or `{"error": kind, "message": text}`.
const LOOKUP: &str = r#"
import json
import sys


def kind_of(error):
    names, seen = set(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names.update(cls.__name__ for cls in type(error).__mro__)
        error = error.__cause__ or error.__context__
    if "GatedRepoError" in names:
        return "gated"
    if names & {"RepositoryNotFoundError", "RevisionNotFoundError"}:
        return "not_found"
    if "NotASafetensorsRepoError" in names:
        return "not_safetensors"
    words = ("Offline", "Connect", "Timeout", "Network", "Proxy", "SSL")
    if any(word in name for name in names for word in words):
        return "offline"
    return "other"


def lookup(repo):
    try:
        from huggingface_hub import get_safetensors_metadata
    except ImportError as error:
        return {"error": "no_hub_library", "message": str(error)}
    try:
        found = get_safetensors_metadata(repo)
    except Exception as error:
        return {"error": kind_of(error), "message": f"{type(error).__name__}: {error}"}
    shapes = {}
    for header in found.files_metadata.values():
        for name, info in header.tensors.items():
            shapes[name] = list(info.shape)
    return {"tensors": shapes}


print(json.dumps(lookup(sys.argv[1])))
"#;

/// Whether `name` has the form of a Hub repo id (`name` or `owner/name`, as
/// `huggingface_hub.validate_repo_id` accepts them).
pub(super) fn looks_like_repo_id(name: &str) -> bool {
    let part_ok = |p: &str| {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !p.is_empty()
            && p.chars().count() <= 96
            && p.chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && edge(p.chars().next())
            && edge(p.chars().last())
    };
    let parts: Vec<&str> = name.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| part_ok(p))
        && !name.contains("--")
        && !name.contains("..")
        && !name.ends_with(".git")
}

/// The tensors of Hub model `repo`.
pub(super) fn fetch(
    repo: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Tensors, EstimateError> {
    let unreachable = |reason: String| EstimateError::HubUnreachable {
        model: repo.to_owned(),
        reason,
    };
    let failed = |reason: String| EstimateError::Hub {
        model: repo.to_owned(),
        reason,
    };
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    if env("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    }) {
        return Err(unreachable("HF_HUB_OFFLINE is set".into()));
    }
    let proxied = [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .iter()
    .any(|k| set(k));
    if !proxied {
        let endpoint = env("HF_ENDPOINT")
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| "https://huggingface.co".into());
        probe(&endpoint).map_err(unreachable)?;
    }
    let python = crate::python::interpreter(env);
    let mut command = Command::new(&python);
    // A server that accepts connections and then stalls should not hold the
    // user for huggingface_hub's default 10 s per request.
    if env("HF_HUB_ETAG_TIMEOUT").is_none() {
        command.env("HF_HUB_ETAG_TIMEOUT", "5");
    }
    let child = command
        .args(["-c", LOOKUP, repo])
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            failed(format!(
                "cannot run `{python}` to query the Hub ({e}); set PYTHON_EXEC to a Python with \
                 huggingface_hub, or download the model folder and pass its path"
            ))
        })?;
    let (status, stdout, stderr) = crate::python::wait_with_deadline(child, QUERY_TIMEOUT)
        .map_err(|e| failed(format!("waiting for `{python}`: {e}")))?
        .ok_or_else(|| {
            unreachable(format!(
                "the Hub did not answer within {} s",
                QUERY_TIMEOUT.as_secs()
            ))
        })?;
    let reply: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            failed(format!(
                "`{python}` failed ({status}): {}",
                tail.join(" | ")
            ))
        })?;
    if let Some(kind) = reply.get("error").and_then(Value::as_str) {
        let message = reply
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Err(match kind {
            "offline" => unreachable(message.to_owned()),
            "gated" => failed(
                "the repo is gated: log in with `huggingface-cli login` (or set HF_TOKEN) with an \
                 account that has access, or download the model folder and pass its path"
                    .into(),
            ),
            "not_found" => failed(format!(
                "no such model on the Hub (for a private repo, log in with `huggingface-cli \
                 login`; for a local model, pass the path of its folder) [{message}]"
            )),
            "not_safetensors" => failed(
                "the repo has no model.safetensors or model.safetensors.index.json; accel \
                 estimates from safetensors headers only"
                    .into(),
            ),
            "no_hub_library" => failed(format!(
                "`{python}` cannot import huggingface_hub ({message}): install it with `pip \
                 install huggingface_hub` or set PYTHON_EXEC, or download the model folder and \
                 pass its path"
            )),
            _ => failed(message.to_owned()),
        });
    }
    let shapes = reply
        .get("tensors")
        .and_then(Value::as_object)
        .ok_or_else(|| failed("the lookup returned no tensors".into()))?;
    let mut tensors = Tensors::new();
    for (name, shape) in shapes {
        let numel = shape
            .as_array()
            .and_then(|dims| {
                dims.iter()
                    .try_fold(1u64, |n, d| d.as_u64().and_then(|d| n.checked_mul(d)))
            })
            .ok_or_else(|| failed(format!("tensor `{name}` has an invalid shape {shape}")))?;
        tensors.insert(name.clone(), numel);
    }
    Ok(tensors)
}

/// Resolves and connects to the endpoint's host within [`PROBE_TIMEOUT`].
fn probe(endpoint: &str) -> Result<(), String> {
    let target = host_port(endpoint);
    let (tx, rx) = mpsc::channel();
    let probed = target.clone();
    // Name lookup cannot be given a timeout, so it runs on a thread that is
    // left behind if it hangs; the process exits soon after anyway.
    thread::spawn(move || {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let result = match probed.to_socket_addrs() {
            Err(e) => Err(format!("cannot resolve {probed}: {e}")),
            Ok(addrs) => {
                let mut last = format!("{probed} has no address");
                for addr in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left) {
                        Ok(_) => return tx.send(Ok(())),
                        Err(e) => last = format!("cannot connect to {probed}: {e}"),
                    }
                }
                Err(last)
            }
        };
        tx.send(result)
    });
    rx.recv_timeout(PROBE_TIMEOUT + Duration::from_millis(200))
        .unwrap_or_else(|_| {
            Err(format!(
                "{target} did not answer within {} s",
                PROBE_TIMEOUT.as_secs()
            ))
        })
}

/// `host:port` of an endpoint URL (`https://host[:port][/path]`).
fn host_port(endpoint: &str) -> String {
    let (rest, default_port) = match endpoint.split_once("://") {
        Some(("http", rest)) => (rest, 80),
        Some((_, rest)) => (rest, 443),
        None => (endpoint, 443),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    match has_port {
        true => authority.to_owned(),
        false => format!("{authority}:{default_port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_recognised() {
        for ok in [
            "gpt2",
            "bert-base-cased",
            "meta-llama/Llama-3.1-8B",
            "a_b/c.d",
        ] {
            assert!(looks_like_repo_id(ok), "{ok}");
        }
        for bad in [
            "",
            "./model",
            "/abs/model",
            "a/b/c",
            "a--b",
            "a..b",
            "-a",
            "a/",
            "x.git",
            "a b",
        ] {
            assert!(!looks_like_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn endpoints_give_host_and_port() {
        assert_eq!(host_port("https://huggingface.co"), "huggingface.co:443");
        assert_eq!(host_port("http://mirror.local/hf"), "mirror.local:80");
        assert_eq!(host_port("https://127.0.0.1:8443/x"), "127.0.0.1:8443");
        assert_eq!(host_port("https://[::1]/"), "[::1]:443");
        assert_eq!(host_port("https://u:p@h:1"), "h:1");
    }

    #[test]
    fn offline_fails_fast_and_names_the_fix() {
        let started = Instant::now();
        let env = |k: &str| (k == "HF_HUB_OFFLINE").then(|| "1".to_owned());
        let err = fetch("org/model", &env).expect_err("offline");
        assert!(matches!(err, EstimateError::HubUnreachable { .. }), "{err}");
        // A closed local port is refused at once.
        let env = |k: &str| (k == "HF_ENDPOINT").then(|| "http://127.0.0.1:1".to_owned());
        let err = fetch("org/model", &env)
            .expect_err("unreachable")
            .to_string();
        assert!(
            err.contains("org/model") && err.contains("download"),
            "{err}"
        );
        assert!(
            started.elapsed() < PROBE_TIMEOUT,
            "took {:?}",
            started.elapsed()
        );
    }
}
