//! `--health-check-gpu`: every GPU as `nvidia-smi` reports it.
//!
//! One query, `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`,
//! one line per GPU. A GPU fails the check when it has
//! - uncorrectable ECC errors since the driver loaded
//!   (`ecc.errors.uncorrected.volatile.total` above 0): its memory returned
//!   bad data, and a job on it computes on garbage or dies with an XID;
//! - retired pages pending (`retired_pages.pending`: Yes), or rows pending
//!   remapping or a remapping failure (`remapped_rows.pending`,
//!   `remapped_rows.failure`: Yes): bad memory is known but not yet taken
//!   out, which needs a GPU reset.
//!
//! A value the GPU does not support (`[N/A]`, `[Not Supported]`: no ECC on
//! a consumer card) passes. A driver too old for the remapping fields
//! (it refuses the whole query, naming the field) is asked again without
//! them. `nvidia-smi` failing (a GPU "fallen off the bus", a driver that
//! does not answer) fails the check with its own words.
//!
//! XID events are in the kernel log, not in `nvidia-smi`'s answers: a node
//! health daemon (DCGM, node-problem-detector) reports them through
//! `--health-check-endpoint`.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncReadExt;

/// The fields asked for, in order.
const FIELDS: [&str; 6] = [
    "index",
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
];

/// How many of [`FIELDS`] an old driver answers.
const OLD_FIELDS: usize = 4;

/// How much of `nvidia-smi`'s output is read.
const OUTPUT_KEPT: usize = 64 * 1024;

/// Checks the GPUs with the `nvidia-smi` at `smi`.
pub async fn check(smi: &Path) -> Result<(), String> {
    let mut out = query(smi, &FIELDS).await;
    if let Err(e) = &out {
        if e.contains("remapped_rows") {
            out = query(smi, &FIELDS[..OLD_FIELDS]).await;
        }
    }
    let text = out.map_err(|e| format!("gpu: {e}"))?;
    judge(&text)
}

/// Runs one query; `Err` quotes what went wrong.
async fn query(smi: &Path, fields: &[&str]) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(smi);
    cmd.arg(format!("--query-gpu={}", fields.join(",")))
        .arg("--format=csv,noheader,nounits")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // The caller bounds the wait; a dropped query kills nvidia-smi.
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", smi.display()))?;
    // At most OUTPUT_KEPT of each stream; past it the pipes close (an
    // endless writer gets EPIPE) and nvidia-smi is waited for.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read_out = async {
        if let Some(p) = stdout {
            let _ = p.take(OUTPUT_KEPT as u64).read_to_end(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(p) = stderr {
            let _ = p.take(OUTPUT_KEPT as u64).read_to_end(&mut err).await;
        }
    };
    tokio::join!(read_out, read_err);
    let status = child
        .wait()
        .await
        .map_err(|e| format!("cannot wait for {}: {e}", smi.display()))?;
    let text = |b: &[u8]| accel_wire::limits::printable(String::from_utf8_lossy(b).trim());
    if !status.success() {
        let mut said = text(&out);
        let err = text(&err);
        if !err.is_empty() {
            if !said.is_empty() {
                said.push_str(" | ");
            }
            said.push_str(&err);
        }
        return Err(format!(
            "nvidia-smi {}: {}",
            crate::Ended::from(status),
            accel_input::excerpt(&said)
        ));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Whether a field holds a value the GPU supports.
fn supported(v: &str) -> bool {
    !(v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("N/A"))
}

/// Reads the query's lines: `Err` names every bad GPU and why
/// (`gpu 3 (BUS): ...; gpu 5 (BUS): ...`).
fn judge(text: &str) -> Result<(), String> {
    let mut bad = Vec::new();
    let mut gpus = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        gpus += 1;
        let name = match (f.first(), f.get(1)) {
            (Some(i), Some(bus)) if supported(bus) => format!("{i} ({bus})"),
            (Some(i), _) => (*i).to_owned(),
            _ => continue,
        };
        let mut why = Vec::new();
        if let Some(ecc) = f.get(2).filter(|v| supported(v)) {
            match ecc.parse::<u64>() {
                Ok(0) => {}
                Ok(n) => why.push(format!(
                    "{n} uncorrectable ECC errors since the driver loaded"
                )),
                Err(_) => why.push(format!("unreadable ECC error count {ecc:?}")),
            }
        }
        for (i, what) in [
            (3, "retired pages pending (needs a GPU reset)"),
            (4, "rows pending remapping (needs a GPU reset)"),
            (5, "a row remapping failed"),
        ] {
            if f.get(i).is_some_and(|v| v.eq_ignore_ascii_case("yes")) {
                why.push(what.to_owned());
            }
        }
        if !why.is_empty() {
            bad.push(format!("{name}: {}", why.join(", ")));
        }
    }
    if gpus == 0 {
        return Err("gpu: nvidia-smi lists no GPU".into());
    }
    match bad.is_empty() {
        true => Ok(()),
        false => Err(format!("gpu {}", bad.join("; gpu "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecc_errors_and_pending_retirements_fail_by_gpu() {
        let ok =
            "0, 00000000:18:00.0, 0, No, No, No\n1, 00000000:2A:00.0, [N/A], [N/A], [N/A], [N/A]\n";
        assert_eq!(judge(ok), Ok(()));
        let bad = "0, 00000000:18:00.0, 0, No, No, No\n3, 00000000:9A:00.0, 2, Yes, No, No\n";
        assert_eq!(
            judge(bad),
            Err("gpu 3 (00000000:9A:00.0): 2 uncorrectable ECC errors since the driver loaded, retired pages pending (needs a GPU reset)".into())
        );
        // An old driver's shorter lines.
        assert_eq!(judge("0, 00000000:18:00.0, 0, No\n"), Ok(()));
        assert!(judge("").is_err());
    }

    #[tokio::test]
    async fn a_fake_nvidia_smi_is_read_as_the_real_one() {
        let d = tempfile::tempdir().expect("dir");
        let smi = d.path().join("nvidia-smi");
        let write = |body: &str| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(&smi, format!("#!/bin/sh\n{body}\n")).expect("write");
            std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        write("echo '0, 00000000:18:00.0, 0, No, No, No'");
        assert_eq!(check(&smi).await, Ok(()));
        write("echo '0, 00000000:18:00.0, 5, No, No, No'");
        let e = check(&smi).await.expect_err("ecc");
        assert!(
            e.starts_with("gpu 0 (00000000:18:00.0): 5 uncorrectable ECC"),
            "{e}"
        );
        // An old driver: asked again without the remapping fields.
        write(
            "case \"$1\" in *remapped*) echo 'Field \"remapped_rows.pending\" is not a valid field to query.'; exit 2;; esac\n\
             echo '0, 00000000:18:00.0, 0, No'",
        );
        assert_eq!(check(&smi).await, Ok(()));
        // An endless writer: read up to the bound, then it gets EPIPE.
        write("yes '0, 00000000:18:00.0, 0, No, No, No'");
        let e = check(&smi).await.expect_err("cut off");
        assert!(e.contains("SIGPIPE") || e.contains("code 141"), "{e}");
        write("echo 'Unable to determine the device handle for GPU0000:9A:00.0: GPU is lost.' >&2; exit 15");
        let e = check(&smi).await.expect_err("lost");
        assert!(
            e.contains("exited with code 15") && e.contains("GPU is lost"),
            "{e}"
        );
    }
}
