//! `--health-check-gpu`: every GPU as `nvidia-smi` reports it, and the
//! XID events the driver wrote to the kernel log since boot.
//!
//! One query, `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`,
//! one line per GPU. A GPU fails the check when
//! - persistence mode is off: the driver then unloads whenever no process
//!   holds the GPU (between rounds), and the volatile error counts below
//!   start again from zero, so this check would not see them (`nvidia-smi
//!   -pm 1`, or the `nvidia-persistenced` daemon, turns it on);
//! - it has uncorrectable ECC errors since the driver loaded
//!   (`ecc.errors.uncorrected.volatile.total` above 0): its memory returned
//!   bad data, and a job on it computes on garbage or dies with an XID;
//! - retired pages are pending (`retired_pages.pending`: Yes), or rows
//!   pending remapping or a remapping failure (`remapped_rows.pending`,
//!   `remapped_rows.failure`: Yes): bad memory is known but not yet taken
//!   out, which needs a GPU reset.
//!
//! A value the GPU does not support (`[N/A]`, `[Not Supported]`: no ECC on
//! a consumer card) passes. A driver too old for the remapping fields
//! (it refuses the whole query, naming the field) is asked again without
//! them. `nvidia-smi` failing (a GPU "fallen off the bus", a driver that
//! does not answer) fails the check with its own words.
//!
//! XID events are not in `nvidia-smi`'s answers but in the kernel log
//! (`NVRM: Xid (PCI:0000:3b:00): 79, ...`), read from
//! `--health-check-kernel-log` (`/dev/kmsg` by default; a file such as
//! `/var/log/kern.log` works too; `none` skips it). An XID that means the
//! GPU needs a reset or the node a reboot ([`FATAL_XIDS`]) fails its GPU
//! for as long as the kernel keeps the line, which is until the node
//! reboots unless the ring buffer overwrote it; XIDs of an application's
//! own faults (13, 31, 43, ...) pass. A kernel log the agent may not read
//! (`kernel.dmesg_restrict` without `CAP_SYSLOG`) is said once and the rest
//! of the check goes on.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::AsyncReadExt;

/// The fields asked for, in order.
const FIELDS: [&str; 7] = [
    "index",
    "pci.bus_id",
    "persistence_mode",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
];

/// How many of [`FIELDS`] an old driver answers.
const OLD_FIELDS: usize = 5;

/// How much of `nvidia-smi`'s output is read.
const OUTPUT_KEPT: usize = 64 * 1024;

/// How much of a kernel log that is a file (not `/dev/kmsg`) is read: its
/// end.
const LOG_FILE_KEPT: u64 = 16 * 1024 * 1024;

/// How many records of `/dev/kmsg` are read at most (its ring buffer holds
/// far fewer).
const KMSG_RECORDS: usize = 1 << 20;

/// XIDs that mean the GPU needs a reset or the node a reboot (NVIDIA's XID
/// catalogue), with what they mean.
pub const FATAL_XIDS: [(u32, &str); 9] = [
    (48, "double-bit ECC error"),
    (62, "internal micro-controller halt"),
    (64, "ECC page retirement or row remapping failed"),
    (74, "NVLink error"),
    (79, "fell off the bus"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (140, "unrecovered ECC error"),
];

/// The GPU check's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCheck {
    /// Where `nvidia-smi` is.
    pub smi: PathBuf,
    /// The kernel log read for XID events (`None`: not read).
    pub kernel_log: Option<PathBuf>,
}

/// Whether an unreadable kernel log was said already (once per agent).
static LOG_UNREADABLE_SAID: AtomicBool = AtomicBool::new(false);

impl GpuCheck {
    /// Checks the GPUs: `nvidia-smi`, then the kernel log's XIDs.
    pub async fn check(&self) -> Result<(), String> {
        let smi = check(&self.smi).await;
        let xids = match self.kernel_log.clone() {
            Some(path) => tokio::task::spawn_blocking(move || read_xids(&path))
                .await
                .unwrap_or_else(|e| Err(format!("the read failed: {e}"))),
            None => Ok(Vec::new()),
        };
        let xids = match xids {
            Ok(x) => x,
            Err(e) => {
                if !LOG_UNREADABLE_SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "--health-check-gpu: cannot read the kernel log, so XID events are not checked (run the agent as root or with CAP_SYSLOG, point --health-check-kernel-log at a readable copy, or pass --health-check-kernel-log none)");
                }
                Vec::new()
            }
        };
        let mut bad: Vec<String> = Vec::new();
        if let Err(e) = smi {
            bad.push(e);
        }
        if !xids.is_empty() {
            bad.push(format!("gpu: {}", judge_xids(&xids)));
        }
        match bad.is_empty() {
            true => Ok(()),
            false => Err(bad.join("; ")),
        }
    }
}

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

/// One fatal XID the kernel logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// The GPU's PCI address as the kernel wrote it (`0000:3b:00`).
    pub pci: String,
    /// The XID.
    pub xid: u32,
    /// The rest of the line, for the message.
    pub text: String,
}

/// Reads the fatal XIDs in the kernel log at `path`: `/dev/kmsg` record by
/// record without blocking (from the oldest record the kernel keeps), a
/// file by its last 16 MiB.
pub fn read_xids(path: &Path) -> Result<Vec<Xid>, String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut found = Vec::new();
    if meta.file_type().is_char_device() {
        // One record per read; EAGAIN at the end; EPIPE: a record was
        // overwritten while reading (go on).
        let mut buf = vec![0u8; 16 * 1024];
        for _ in 0..KMSG_RECORDS {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => found.extend(xid_of(&String::from_utf8_lossy(&buf[..n]))),
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
    } else {
        use std::io::Seek;
        let len = meta.len();
        if len > LOG_FILE_KEPT {
            f.seek(std::io::SeekFrom::Start(len - LOG_FILE_KEPT))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let mut text = Vec::new();
        f.take(LOG_FILE_KEPT)
            .read_to_end(&mut text)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        found.extend(String::from_utf8_lossy(&text).lines().filter_map(xid_of));
    }
    Ok(found)
}

/// The fatal XID a kernel log line reports, if any:
/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`
/// (older drivers: `NVRM: Xid (0000:3b:00): 79, ...`).
fn xid_of(line: &str) -> Option<Xid> {
    let at = line.find("NVRM: Xid (")?;
    let rest = &line[at + "NVRM: Xid (".len()..];
    let (pci, rest) = rest.split_once("): ")?;
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let xid: u32 = digits.parse().ok()?;
    FATAL_XIDS.iter().any(|(x, _)| *x == xid).then(|| Xid {
        pci: accel_wire::limits::printable(pci.trim()),
        xid,
        text: accel_input::excerpt(&accel_wire::limits::printable(
            rest[digits.len()..].trim_start_matches([',', ' ']).trim(),
        ))
        .to_string(),
    })
}

/// Names each GPU's fatal XIDs, the latest first: `gpu PCI 0000:3b:00:
/// Xid 79 (fell off the bus): ...`.
fn judge_xids(xids: &[Xid]) -> String {
    let mut by_gpu: Vec<(&str, Vec<&Xid>)> = Vec::new();
    for x in xids.iter().rev() {
        match by_gpu.iter_mut().find(|(p, _)| *p == x.pci) {
            Some((_, v)) => v.push(x),
            None => by_gpu.push((&x.pci, vec![x])),
        }
    }
    by_gpu
        .iter()
        .map(|(pci, v)| {
            let last = v[0];
            let what = FATAL_XIDS
                .iter()
                .find(|(x, _)| *x == last.xid)
                .map_or("", |(_, w)| *w);
            let more = match v.len() {
                1 => String::new(),
                n => format!(" ({n} fatal XIDs logged since boot)"),
            };
            format!(
                "PCI {pci}: Xid {} ({what}) in the kernel log: {}{more}; the GPU needs a reset or the node a reboot",
                last.xid, last.text
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
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
        if f.get(2).is_some_and(|v| v.eq_ignore_ascii_case("disabled")) {
            why.push(
                "persistence mode is off, so the driver unloads between rounds and its error counts start again (turn it on: nvidia-smi -pm 1, or the nvidia-persistenced daemon)"
                    .to_owned(),
            );
        }
        if let Some(ecc) = f.get(3).filter(|v| supported(v)) {
            match ecc.parse::<u64>() {
                Ok(0) => {}
                Ok(n) => why.push(format!(
                    "{n} uncorrectable ECC errors since the driver loaded"
                )),
                Err(_) => why.push(format!("unreadable ECC error count {ecc:?}")),
            }
        }
        for (i, what) in [
            (4, "retired pages pending (needs a GPU reset)"),
            (5, "rows pending remapping (needs a GPU reset)"),
            (6, "a row remapping failed"),
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
        let ok = "0, 00000000:18:00.0, Enabled, 0, No, No, No\n1, 00000000:2A:00.0, [N/A], [N/A], [N/A], [N/A], [N/A]\n";
        assert_eq!(judge(ok), Ok(()));
        let bad = "0, 00000000:18:00.0, Enabled, 0, No, No, No\n3, 00000000:9A:00.0, Enabled, 2, Yes, No, No\n";
        assert_eq!(
            judge(bad),
            Err("gpu 3 (00000000:9A:00.0): 2 uncorrectable ECC errors since the driver loaded, retired pages pending (needs a GPU reset)".into())
        );
        // An old driver's shorter lines.
        assert_eq!(judge("0, 00000000:18:00.0, Enabled, 0, No\n"), Ok(()));
        assert!(judge("").is_err());
        let off = judge("0, 00000000:18:00.0, Disabled, 0, No, No, No\n").expect_err("off");
        assert!(
            off.starts_with("gpu 0 (00000000:18:00.0): persistence mode is off"),
            "{off}"
        );
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
        write("echo '0, 00000000:18:00.0, Enabled, 0, No, No, No'");
        assert_eq!(check(&smi).await, Ok(()));
        write("echo '0, 00000000:18:00.0, Enabled, 5, No, No, No'");
        let e = check(&smi).await.expect_err("ecc");
        assert!(
            e.starts_with("gpu 0 (00000000:18:00.0): 5 uncorrectable ECC"),
            "{e}"
        );
        // An old driver: asked again without the remapping fields.
        write(
            "case \"$1\" in *remapped*) echo 'Field \"remapped_rows.pending\" is not a valid field to query.'; exit 2;; esac\n\
             echo '0, 00000000:18:00.0, Enabled, 0, No'",
        );
        assert_eq!(check(&smi).await, Ok(()));
        // An endless writer: read up to the bound, then it gets EPIPE.
        write("yes '0, 00000000:18:00.0, Enabled, 0, No, No, No'");
        let e = check(&smi).await.expect_err("cut off");
        assert!(e.contains("SIGPIPE") || e.contains("code 141"), "{e}");
        write("echo 'Unable to determine the device handle for GPU0000:9A:00.0: GPU is lost.' >&2; exit 15");
        let e = check(&smi).await.expect_err("lost");
        assert!(
            e.contains("exited with code 15") && e.contains("GPU is lost"),
            "{e}"
        );
    }

    #[test]
    fn fatal_xids_in_the_kernel_log_fail_their_gpu_and_others_pass() {
        let d = tempfile::tempdir().expect("dir");
        let log = d.path().join("kern.log");
        std::fs::write(
            &log,
            "Dec  7 10:00:01 n1 kernel: [ 12.5] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception\n\
             Dec  7 10:00:02 n1 kernel: [ 13.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n",
        )
        .expect("write");
        assert_eq!(
            read_xids(&log),
            Ok(Vec::new()),
            "an application's own fault passes"
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("open");
        std::io::Write::write_all(
            &mut f,
            b"6,1234,99123456,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n\
              Dec  7 10:03:00 n1 kernel: NVRM: Xid (0000:9a:00): 48, pid=2, name=python, An uncorrectable double bit error\n\
              Dec  7 10:04:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=3, GPU has fallen off the bus.\n",
        )
        .expect("append");
        let xids = read_xids(&log).expect("read");
        assert_eq!(
            xids.iter()
                .map(|x| (x.pci.as_str(), x.xid))
                .collect::<Vec<_>>(),
            [("0000:3b:00", 79), ("0000:9a:00", 48), ("0000:3b:00", 79)]
        );
        assert_eq!(
            judge_xids(&xids),
            "PCI 0000:3b:00: Xid 79 (fell off the bus) in the kernel log: pid=3, GPU has fallen off the bus. (2 fatal XIDs logged since boot); the GPU needs a reset or the node a reboot; \
             PCI 0000:9a:00: Xid 48 (double-bit ECC error) in the kernel log: pid=2, name=python, An uncorrectable double bit error; the GPU needs a reset or the node a reboot"
        );
        assert!(read_xids(&d.path().join("missing")).is_err());
    }

    #[tokio::test]
    async fn the_gpu_check_reports_nvidia_smi_and_the_kernel_log_together() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("dir");
        let smi = d.path().join("nvidia-smi");
        std::fs::write(
            &smi,
            "#!/bin/sh\necho '0, 00000000:3B:00.0, Enabled, 0, No, No, No'\n",
        )
        .expect("write");
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let log = d.path().join("kmsg");
        std::fs::write(&log, "").expect("write");
        let check = GpuCheck {
            smi: smi.clone(),
            kernel_log: Some(log.clone()),
        };
        assert_eq!(check.check().await, Ok(()));
        std::fs::write(
            &log,
            "4,88,5000000,-;NVRM: Xid (PCI:0000:3b:00): 95, pid=7, Uncontained: FBHUB.\n",
        )
        .expect("write");
        let e = check.check().await.expect_err("xid");
        assert!(
            e.starts_with("gpu: PCI 0000:3b:00: Xid 95 (uncontained ECC error)"),
            "{e}"
        );
        // An unreadable log is said once; the check goes on without it.
        let gone = GpuCheck {
            smi,
            kernel_log: Some(d.path().join("missing")),
        };
        assert_eq!(gone.check().await, Ok(()));
    }
}
