//! What `accel env` asks the Python environment: package versions, the
//! platform string, the accelerator and its device name.
//!
//! Everything is gathered by one Python program (below) that prints one JSON
//! line, so the report costs one interpreter start (about as long as
//! `accelerate env` itself, which imports the same packages). The program
//! never raises: a package that is missing is `null`, one that fails to
//! import carries the error in its version string. The accelerator is
//! detected with accelerate's own `is_*_available` helpers when accelerate
//! is installed (so the answer is accelerate's), else with torch's CUDA, XPU
//! and MPS checks.

use serde_json::Value;

/// The marker in front of the JSON line (imports may print other lines).
const MARKER: &str = "ACCEL_ENV ";

/// The program; prints `ACCEL_ENV {json}`.
pub const SCRIPT: &str = r#"
import json, platform

def version(name):
    try:
        module = __import__(name)
    except ImportError:
        return None
    except Exception as e:
        return "import failed: %s: %s" % (type(e).__name__, e)
    return str(getattr(module, "__version__", "unknown"))

def ok(check):
    try:
        return bool(check())
    except Exception:
        return False

out = {"python": platform.python_version(), "platform": platform.platform()}
for name in ("accelerate", "numpy", "torch"):
    out[name] = version(name)
try:
    import psutil
    out["ram"] = int(psutil.virtual_memory().total)
except Exception:
    pass

torch_ok = out["torch"] is not None and not out["torch"].startswith("import failed")
if torch_ok:
    import torch
    found = {"cuda": ok(torch.cuda.is_available)}
    try:
        import accelerate.utils as au
        for kind in ("xpu", "mlu", "sdaa", "musa", "npu", "neuron", "mps"):
            found[kind] = ok(lambda k=kind: getattr(au, "is_%s_available" % k)())
    except Exception:
        found["xpu"] = ok(lambda: torch.xpu.is_available())
        found["mps"] = ok(lambda: torch.backends.mps.is_available())
    out["accelerator"] = "N/A"
    for kind in ("cuda", "xpu", "mlu", "sdaa", "musa", "npu", "neuron", "mps"):
        if found.get(kind):
            out["accelerator"] = kind.upper()
            break

    def device_name(kind):
        if kind == "npu":
            return str(torch.version.cann)
        if kind == "mps":
            try:
                import subprocess
                cmd = ["sysctl", "-n", "machdep.cpu.brand_string"]
                return subprocess.check_output(cmd, text=True).strip()
            except Exception:
                return platform.processor() or "Apple Silicon"
        return str(getattr(torch, kind).get_device_name())

    # accelerate names the device in this order (NPU last).
    for kind in ("cuda", "xpu", "mlu", "sdaa", "musa", "neuron", "mps", "npu"):
        if found.get(kind):
            label = {"cuda": "GPU type", "npu": "CANN version"}.get(kind, kind.upper() + " type")
            try:
                out["device"] = [label, device_name(kind)]
            except Exception as e:
                out["device"] = [label, "unknown (%s)" % e]
            break

print("ACCEL_ENV " + json.dumps(out))
"#;

/// The program's answer; `None` fields were not found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    /// `platform.python_version()`.
    pub python: Option<String>,
    /// `platform.platform()`.
    pub platform: Option<String>,
    /// `accelerate.__version__`.
    pub accelerate: Option<String>,
    /// `numpy.__version__`.
    pub numpy: Option<String>,
    /// `torch.__version__`.
    pub torch: Option<String>,
    /// CUDA, XPU, ... or N/A (absent without torch).
    pub accelerator: Option<String>,
    /// psutil's total memory in bytes.
    pub ram: Option<u64>,
    /// accelerate's device line: (label, value), e.g. ("GPU type", "A100").
    pub device: Option<(String, String)>,
}

/// Why the program's output is not an answer.
#[derive(Debug, thiserror::Error)]
#[error("the Python probe printed no `{MARKER}` line with a JSON object")]
pub struct ParseError;

/// Reads the program's output.
pub fn parse(stdout: &str) -> Result<Probe, ParseError> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARKER))
        .ok_or(ParseError)?;
    let v: Value = serde_json::from_str(line).map_err(|_| ParseError)?;
    if !v.is_object() {
        return Err(ParseError);
    }
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let device = v.get("device").and_then(Value::as_array).and_then(|pair| {
        match (pair.first()?.as_str(), pair.get(1)?.as_str()) {
            (Some(label), Some(value)) => Some((label.to_owned(), value.to_owned())),
            _ => None,
        }
    });
    Ok(Probe {
        python: text("python"),
        platform: text("platform"),
        accelerate: text("accelerate"),
        numpy: text("numpy"),
        torch: text("torch"),
        accelerator: text("accelerator"),
        ram: v.get("ram").and_then(Value::as_u64),
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_last_marked_line() {
        let out = "warning: noise\nACCEL_ENV {\"python\": \"old\"}\nACCEL_ENV {\"python\": \"3.11.7\", \"platform\": \"Linux-x\", \"accelerate\": null, \"numpy\": \"2.0\", \"torch\": \"2.3\", \"accelerator\": \"CUDA\", \"ram\": 1073741824, \"device\": [\"GPU type\", \"A100\"]}\n";
        let p = parse(out).expect("parses");
        assert_eq!(p.python.as_deref(), Some("3.11.7"));
        assert_eq!(p.accelerate, None);
        assert_eq!(p.ram, Some(1 << 30));
        assert_eq!(p.device, Some(("GPU type".into(), "A100".into())));
        assert!(parse("nothing here\n").is_err());
        assert!(parse("ACCEL_ENV [1]\n").is_err());
        assert!(parse("ACCEL_ENV {bad\n").is_err());
    }
}
