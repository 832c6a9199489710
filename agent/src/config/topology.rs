//! This node's topology path, from the first source that names one:
//!
//! | source | example |
//! |---|---|
//! | `--topology PATH` (`PET_TOPOLOGY`) | `zone-a/rack-3/nvl-0` |
//! | `--topology-file FILE` (`PET_TOPOLOGY_FILE`): the file's text, trimmed | an operator's per-host file |
//! | Slurm's `SLURM_TOPOLOGY_ADDR`, its switch parts (by `SLURM_TOPOLOGY_ADDR_PATTERN`) joined by `/` | `s0.s3.node17` with `switch.switch.node` gives `s0/s3` |
//! | the GPUs' NVLink domain in `nvidia-smi -q`: `nvl-<ClusterUUID>/<CliqueId>` | `nvl-9c6f5af3-53bf-49b5-a436-b66766c413c3/4026` |
//! | none | empty: the node's place is unknown |
//!
//! The rendezvous orders node ranks by it (the server's `job::placement`).
//! A path given on purpose (a flag, a file) that is not valid stops the
//! agent with the reason; one found in the environment (Slurm) that is
//! not valid is left out with a warning, since the job can run without it,
//! and the next source is asked (so is it when Slurm's address has no
//! switch part, as under `topology/flat`).
//!
//! ## The NVLink domain
//!
//! On a multi-node NVLink system (GB200 NVL72 and the like) each GPU's
//! block in `nvidia-smi -q` has a `Fabric` section:
//!
//! ```text
//! GPU 00000008:01:00.0
//!     ...
//!     Fabric
//!         State                             : Completed
//!         Status                            : Success
//!         CliqueId                          : 4026
//!         ClusterUUID                       : 9c6f5af3-53bf-49b5-a436-b66766c413c3
//!         Health
//!             ...
//! ```
//!
//! GPUs of one NVLink domain share the cluster UUID and the clique id (the
//! id alone is unique only within a cluster), so the path is both:
//! `nvl-<ClusterUUID>/<CliqueId>`, the UUID in lower case, the id in
//! decimal. Its characters (hex digits, `-`, `/`) and length (at most 61
//! bytes) pass [`check`]; the cluster first, so the partitions of one
//! NVLink system sit side by side.
//!
//! A GPU names no domain when its section is missing (an older driver),
//! says `N/A` (no NVLink fabric: PCIe cards, most machines), or shows the
//! all-zero UUID (an NVSwitch machine of 8 GPUs, like HGX H100, reports
//! `Completed` with `00000000-0000-0000-0000-000000000000`): the node joins
//! without a path, and the agent says why at debug level. A GPU with a real
//! UUID whose `State` is not `Completed` or `Status` not `Success`, or one
//! still registering (`State` like `In Progress`), is a fabric not ready:
//! that is a warning. Every GPU of a node should name the same domain; if
//! they do not, the first GPU (in `nvidia-smi`'s order) that names one wins,
//! with a warning listing the others.
//!
//! `nvidia-smi` is looked up on `PATH` as for the GPU release wait
//! (`crate::gpu`), run as `nvidia-smi -q` for at most [`SMI_TIMEOUT`]
//! (then killed, with its process group), and at most [`SMI_MAX_BYTES`] of
//! its output are read. Not found, or failing (no driver, no device): no
//! path, a debug line. Too slow or too verbose: no path, a warning. It is
//! asked only when no earlier source named a path, and not for a one-node
//! job (`--nnodes 1`, `--standalone`: there is no order to choose, and
//! `nvidia-smi -q` takes a second or more on a large node).

use std::path::Path;
use std::time::{Duration, Instant};

use accel_wire::topology::check;

/// Most bytes read from a `--topology-file`.
const MAX_FILE_BYTES: u64 = 4096;

/// How long `nvidia-smi -q` may run.
pub(super) const SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes of `nvidia-smi -q` output read (about 12 KiB a GPU).
pub(super) const SMI_MAX_BYTES: u64 = 1 << 20;

/// Why `nvidia-smi -q` gave no text to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SmiError {
    /// Not run: not on `PATH`, or not asked (a one-node job).
    NotRun,
    /// It could not start, or failed (no driver, no device): a debug line.
    Failed(String),
    /// It ran too long or printed too much: a warning.
    Stuck(String),
}

/// The path this node joins with; `warnings` gets what was left out.
/// `nvidia_smi` gives `nvidia-smi -q`'s output ([`nvidia_smi_q`] on a
/// node); it is asked only when no earlier source names a path.
pub(super) fn resolve(
    flag: Option<&str>,
    file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    nvidia_smi: &dyn Fn() -> Result<String, SmiError>,
    warnings: &mut Vec<String>,
) -> Result<String, String> {
    if let Some(path) = flag.map(str::trim).filter(|p| !p.is_empty()) {
        check(path).map_err(|e| format!("--topology: {e}"))?;
        return Ok(path.to_owned());
    }
    if let Some(file) = file.filter(|f| !f.as_os_str().is_empty()) {
        let path = read_file(file)?;
        check(&path).map_err(|e| format!("--topology-file {}: {e}", file.display()))?;
        return Ok(path);
    }
    if let Some(addr) = env("SLURM_TOPOLOGY_ADDR").filter(|a| !a.is_empty()) {
        let pattern = env("SLURM_TOPOLOGY_ADDR_PATTERN").unwrap_or_default();
        let path = from_slurm(&addr, &pattern);
        match check(&path) {
            Ok(()) if !path.is_empty() => return Ok(path),
            // No switch above the node (topology/flat): nothing named.
            Ok(()) => {}
            Err(e) => warnings.push(format!(
                "SLURM_TOPOLOGY_ADDR '{}' does not make a topology path ({e}); \
                 leaving it out (pass --topology to set one)",
                accel_input::excerpt(&addr)
            )),
        }
    }
    let text = match nvidia_smi() {
        Ok(text) => text,
        Err(SmiError::NotRun) => return Ok(String::new()),
        Err(SmiError::Failed(why)) => {
            tracing::debug!(%why, "no topology path from nvidia-smi -q");
            return Ok(String::new());
        }
        Err(SmiError::Stuck(why)) => {
            warnings.push(format!(
                "nvidia-smi -q {why}; joining without a topology path (pass --topology to set it)"
            ));
            return Ok(String::new());
        }
    };
    match from_nvidia_smi(&text, warnings) {
        Ok(path) => {
            tracing::info!(topology = %path, "topology path from the GPUs' NVLink domain (nvidia-smi -q)");
            Ok(path)
        }
        Err(why) => {
            tracing::debug!(%why, "no topology path from nvidia-smi -q");
            Ok(String::new())
        }
    }
}

/// Reads the topology file as an agent may read a file a flag names
/// (the agent may run as root and publishes what it reads): not through a
/// symbolic link (a planted link to a secret would publish the secret), a
/// regular file only (a FIFO would hang the agent), owned by the agent's
/// user or root and writable by no one else, at most [`MAX_FILE_BYTES`].
fn read_file(file: &Path) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let name = || format!("--topology-file {}", file.display());
    let f = std::fs::OpenOptions::new()
        .read(true)
        // Not followed, and a FIFO does not block the open.
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(file)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => format!(
                "{}: is a symbolic link; name the file itself (links are not followed, so a planted one cannot point the agent at another file)",
                name()
            ),
            _ => format!("{}: {e}", name()),
        })?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", name()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", name()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "{}: owned by uid {}, not this agent's user or root; the agent reads only files that no other user controls",
            name(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: other users may write it (mode {:o}); chmod go-w it",
            name(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", name()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "--topology-file {}: more than {MAX_FILE_BYTES} bytes; it should hold one path, like zone-a/rack-3/nvl-0",
            file.display()
        ));
    }
    Ok(text.trim().to_owned())
}

/// The switch parts of a Slurm topology address: the parts whose pattern
/// entry is not `node` (without a pattern, every part but the last, the
/// node's own name), joined by `/`.
pub(super) fn from_slurm(addr: &str, pattern: &str) -> String {
    let parts: Vec<&str> = addr.split('.').collect();
    let kinds: Vec<&str> = pattern.split('.').collect();
    let switches: Vec<&str> = if pattern.is_empty() || kinds.len() != parts.len() {
        parts[..parts.len().saturating_sub(1)].to_vec()
    } else {
        parts
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k != "node")
            .map(|(p, _)| *p)
            .collect()
    };
    switches.join("/")
}

/// What one GPU's `Fabric` section says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fabric {
    /// In NVLink domain `clique` of cluster `cluster` (a lower-case UUID).
    Domain { cluster: String, clique: u64 },
    /// Not on a multi-node NVLink fabric: why (for a debug line).
    Outside(String),
    /// On one that is not ready, or says something unexpected: why (a warning).
    NotReady(String),
}

impl std::fmt::Display for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fabric::Domain { cluster, clique } => write!(f, "cluster {cluster} clique {clique}"),
            Fabric::Outside(why) | Fabric::NotReady(why) => f.write_str(why),
        }
    }
}

/// The topology path of the NVLink domain `nvidia-smi -q`'s `text` names
/// (see the module doc), or why there is none. Fabrics not ready and GPUs
/// that disagree are added to `warnings`.
pub(super) fn from_nvidia_smi(text: &str, warnings: &mut Vec<String>) -> Result<String, String> {
    let gpus: Vec<(&str, Fabric)> = fabric_sections(text)
        .into_iter()
        .map(|(gpu, fields)| {
            let fabric = match fields {
                Some(fields) => classify(&fields),
                None => Fabric::Outside("no Fabric section".into()),
            };
            (gpu, fabric)
        })
        .collect();
    let Some((first_gpu, first)) = gpus.first() else {
        return Err("nvidia-smi -q lists no GPU".into());
    };
    let Some((gpu, domain)) = gpus
        .iter()
        .find(|(_, f)| matches!(f, Fabric::Domain { .. }))
    else {
        let not_ready: Vec<String> = gpus
            .iter()
            .filter(|(_, f)| matches!(f, Fabric::NotReady(_)))
            .map(|(gpu, f)| format!("GPU {gpu}: {f}"))
            .collect();
        if !not_ready.is_empty() {
            warnings.push(format!(
                "the GPUs' NVLink fabric is not ready ({}); joining without a topology path \
                 (pass --topology to set it)",
                not_ready.join("; ")
            ));
        }
        return Err(format!("GPU {first_gpu}: {first}"));
    };
    let others: Vec<String> = gpus
        .iter()
        .filter(|(_, f)| f != domain)
        .map(|(gpu, f)| format!("GPU {gpu}: {f}"))
        .collect();
    if !others.is_empty() {
        warnings.push(format!(
            "the GPUs of this node do not share one NVLink domain: GPU {gpu} is in {domain}, \
             but {}; joining with GPU {gpu}'s",
            others.join("; ")
        ));
    }
    let Fabric::Domain { cluster, clique } = domain else {
        unreachable!("found as a domain")
    };
    let path = format!("nvl-{cluster}/{clique}");
    check(&path).map_err(|e| format!("{path}: {e}"))?;
    Ok(path)
}

/// A GPU's name and its `Fabric` section's `(key, value)` lines, if it has one.
type GpuFabric<'a> = (&'a str, Option<Vec<(&'a str, &'a str)>>);

/// Each GPU of `nvidia-smi -q`'s text, in its order: the GPU's name (its
/// PCI address, from the `GPU 00000000:04:00.0` line that opens its block)
/// and the `key : value` lines directly under its `Fabric` line, if it has
/// one. Indentation tells what is inside what, whatever its width.
fn fabric_sections(text: &str) -> Vec<GpuFabric<'_>> {
    // The open GPU block, the indentation of its lines, and of its Fabric
    // section's lines while inside one.
    struct Open {
        indent: usize,
        level: Option<usize>,
        fabric: Option<(usize, Option<usize>)>,
    }
    let mut gpus: Vec<GpuFabric<'_>> = Vec::new();
    let mut open: Option<Open> = None;
    for line in text.lines() {
        let body = line.trim();
        if body.is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        // `GPU 00000000:04:00.0`, not `GPU UUID : GPU-…`.
        if let Some(name) = body
            .strip_prefix("GPU ")
            .filter(|n| n.contains(':') && !n.contains(char::is_whitespace))
        {
            gpus.push((name, None));
            open = Some(Open {
                indent,
                level: None,
                fabric: None,
            });
            continue;
        }
        let Some(gpu) = open.as_mut().filter(|g| indent > g.indent) else {
            open = None;
            continue;
        };
        let level = *gpu.level.get_or_insert(indent);
        let Some((_, fields)) = gpus.last_mut() else {
            continue;
        };
        if let Some((at, inner)) = gpu.fabric.as_mut() {
            if indent > *at {
                if indent == *inner.get_or_insert(indent) {
                    if let Some((key, value)) = body.split_once(':') {
                        if let Some(fields) = fields.as_mut() {
                            fields.push((key.trim(), value.trim()));
                        }
                    }
                }
                continue;
            }
            gpu.fabric = None;
        }
        if indent == level && body == "Fabric" && fields.is_none() {
            *fields = Some(Vec::new());
            gpu.fabric = Some((indent, None));
        }
    }
    gpus
}

/// What one GPU's `Fabric` fields say (see the module doc).
fn classify(fields: &[(&str, &str)]) -> Fabric {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    };
    let absent = |v: &str| v.is_empty() || v == "N/A" || v.eq_ignore_ascii_case("Not Supported");
    let state = field("State").unwrap_or("");
    let completed = state.eq_ignore_ascii_case("Completed");
    let uuid = field("ClusterUUID").unwrap_or("");
    if absent(uuid) || uuid::Uuid::try_parse(uuid).is_ok_and(|u| u.is_nil()) {
        // Still registering (`In Progress`, `Not Started`) is worth saying;
        // `N/A` or `Completed` without a cluster is a node outside any.
        return if absent(state) || completed {
            Fabric::Outside(format!(
                "State {}, ClusterUUID {}",
                or_absent(state),
                or_absent(uuid)
            ))
        } else {
            Fabric::NotReady(format!("State {}", accel_input::excerpt(state)))
        };
    }
    let Ok(cluster) = uuid::Uuid::try_parse(uuid) else {
        return Fabric::NotReady(format!(
            "ClusterUUID '{}' is not a UUID",
            accel_input::excerpt(uuid)
        ));
    };
    if !completed {
        return Fabric::NotReady(format!("State {}", accel_input::excerpt(or_absent(state))));
    }
    if let Some(status) = field("Status").filter(|s| !s.eq_ignore_ascii_case("Success")) {
        return Fabric::NotReady(format!("Status {}", accel_input::excerpt(status)));
    }
    let clique = field("CliqueId").unwrap_or("");
    match clique.parse::<u64>() {
        Ok(clique) => Fabric::Domain {
            cluster: cluster.hyphenated().to_string(),
            clique,
        },
        Err(_) => Fabric::NotReady(format!(
            "CliqueId '{}' is not a number",
            accel_input::excerpt(clique)
        )),
    }
}

fn or_absent(v: &str) -> &str {
    if v.is_empty() {
        "(missing)"
    } else {
        v
    }
}

/// `nvidia-smi -q`'s output on this node, `nvidia-smi` found on `PATH` as
/// the GPU release wait finds it.
pub(super) fn nvidia_smi_q() -> Result<String, SmiError> {
    let smi = crate::gpu::nvidia_smi().ok_or(SmiError::NotRun)?;
    run_bounded(&smi, &["-q"], SMI_TIMEOUT, SMI_MAX_BYTES)
}

/// Runs `program args` in a process group of its own and returns its
/// standard output, if it exits with 0 within `timeout` having printed at
/// most `max_bytes`; otherwise its group is killed. On the calling thread
/// alone: the agent hides its secrets and forks its guard after building
/// its configuration, which it may do only while it has one thread.
fn run_bounded(
    program: &Path,
    args: &[&str],
    timeout: Duration,
    max_bytes: u64,
) -> Result<String, SmiError> {
    use std::io::Read as _;
    use std::os::fd::AsFd as _;
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};

    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    let deadline = Instant::now() + timeout;
    let mut command = Command::new(program);
    // The probe needs no secret: its environment (readable by this user's
    // processes) carries none.
    for secret in crate::supervisor::SECRET_VARIABLES {
        command.env_remove(secret);
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| SmiError::Failed(format!("cannot run {}: {e}", program.display())))?;
    let pgid = child.id() as i32;
    // Killed before it is reaped, so the group id is still its own; a
    // child it left behind in the group (holding the pipe) goes too.
    let give_up = |child: &mut std::process::Child, why: SmiError| {
        accel_process::sys::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        Err(why)
    };
    let late = || SmiError::Stuck(format!("did not finish within {} s", timeout.as_secs_f64()));
    let Some(mut stdout) = child.stdout.take() else {
        return give_up(&mut child, SmiError::Failed("no output pipe".into()));
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return give_up(&mut child, late());
        }
        let wait = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        let ready = poll(&mut [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)], wait);
        match ready {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                return give_up(
                    &mut child,
                    SmiError::Failed(format!("cannot read its output: {e}")),
                )
            }
        }
        // Readable (or closed): this read does not block.
        match stdout.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() as u64 > max_bytes {
                    return give_up(
                        &mut child,
                        SmiError::Stuck(format!("printed more than {max_bytes} bytes")),
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return give_up(
                    &mut child,
                    SmiError::Failed(format!("cannot read its output: {e}")),
                )
            }
        }
    }
    drop(stdout);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => return give_up(&mut child, late()),
            Err(e) => {
                return give_up(
                    &mut child,
                    SmiError::Failed(format!("cannot wait for it: {e}")),
                )
            }
        }
    };
    let text = String::from_utf8_lossy(&out).into_owned();
    if !status.success() {
        // nvidia-smi says why on standard output ("No devices were found").
        let said = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("");
        return Err(SmiError::Failed(format!(
            "it ended with {status}: {}",
            accel_input::excerpt(said)
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn no_smi() -> Result<String, SmiError> {
        Err(SmiError::NotRun)
    }

    const CLUSTER: &str = "4f2d8c1a-7b3e-4c59-9a60-d1e2f3a4b5c6";
    const OTHER_CLUSTER: &str = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9";

    /// One GPU's block of `nvidia-smi -q`, abridged, with its Fabric
    /// section's four fields (`None`: no Fabric section, an older driver).
    fn gpu(bus: &str, fabric: Option<(&str, &str, &str, &str)>) -> String {
        let mut b = format!(
            "GPU 00000000:{bus}:00.0\n\
             \x20   Product Name                          : NVIDIA GB200\n\
             \x20   GPU UUID                              : GPU-1a2b3c4d-0000-1111-2222-{bus}3344556677\n\
             \x20   GPU Fabric GUID                       : 0x8c1d2e3f4a5b6c7d\n\
             \x20   Inforom Version\n\
             \x20       State                             : Completed\n\
             \x20       CliqueId                          : 1\n"
        );
        if let Some((state, status, clique, uuid)) = fabric {
            b.push_str(&format!(
                "    Fabric\n\
                 \x20       State                             : {state}\n\
                 \x20       Status                            : {status}\n\
                 \x20       CliqueId                          : {clique}\n\
                 \x20       ClusterUUID                       : {uuid}\n\
                 \x20       Health\n\
                 \x20           Summary                       : Healthy\n\
                 \x20           Status                        : Degraded\n\
                 \x20           Bandwidth                     : Full\n"
            ));
        }
        b.push_str(
            "    Processes                             : None\n\
             \x20   Capabilities\n\
             \x20       State                             : Ready\n\
             \x20       ClusterUUID                       : ffffffff-ffff-ffff-ffff-ffffffffffff\n",
        );
        b
    }

    /// `nvidia-smi -q` of the GPUs `gpus`.
    fn smi(gpus: &[String]) -> String {
        format!(
            "\n==============NVSMI LOG==============\n\n\
             Timestamp                                 : Mon Jan  5 10:00:00 2026\n\
             Driver Version                            : 570.124.06\n\
             CUDA Version                              : 12.8\n\n\
             Attached GPUs                             : {}\n{}\n",
            gpus.len(),
            gpus.join("\n")
        )
    }

    fn registered(
        clique: &str,
        uuid: &str,
    ) -> Option<(&'static str, &'static str, String, String)> {
        Some(("Completed", "Success", clique.to_owned(), uuid.to_owned()))
    }

    fn gpu_of(bus: &str, f: Option<(&str, &str, String, String)>) -> String {
        gpu(
            bus,
            f.as_ref()
                .map(|(a, b, c, d)| (*a, *b, c.as_str(), d.as_str())),
        )
    }

    fn path_of(text: &str) -> (Result<String, String>, Vec<String>) {
        let mut w = Vec::new();
        let r = from_nvidia_smi(text, &mut w);
        (r, w)
    }

    #[test]
    fn one_gpu_in_a_domain_names_its_cluster_and_clique() {
        let text = smi(&[gpu_of("01", registered("4026", CLUSTER))]);
        let (path, w) = path_of(&text);
        assert_eq!(path, Ok(format!("nvl-{CLUSTER}/4026")));
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(check(path.as_deref().expect("path")), Ok(()));
        // The UUID in lower case, whatever the case printed.
        let upper = smi(&[gpu_of("01", registered("7", &CLUSTER.to_uppercase()))]);
        assert_eq!(path_of(&upper).0, Ok(format!("nvl-{CLUSTER}/7")));
    }

    #[test]
    fn four_gpus_of_one_domain_agree() {
        let gpus: Vec<String> = ["01", "02", "03", "04"]
            .iter()
            .map(|bus| gpu_of(bus, registered("32766", CLUSTER)))
            .collect();
        let (path, w) = path_of(&smi(&gpus));
        assert_eq!(path, Ok(format!("nvl-{CLUSTER}/32766")));
        assert!(w.is_empty(), "{w:?}");
        // The longest path there can be passes the check.
        let max = format!("nvl-{CLUSTER}/{}", u64::MAX);
        assert_eq!((max.len(), check(&max)), (61, Ok(())));
    }

    #[test]
    fn no_fabric_names_no_path_and_warns_of_nothing() {
        let na = || Some(("N/A", "N/A", "N/A".to_owned(), "N/A".to_owned()));
        let zero = "00000000-0000-0000-0000-000000000000";
        for (what, text) in [
            (
                "N/A (PCIe cards)",
                smi(&[gpu_of("01", na()), gpu_of("02", na())]),
            ),
            (
                "no Fabric section (an older driver)",
                smi(&[gpu_of("01", None)]),
            ),
            // An 8-GPU NVSwitch machine (HGX H100).
            (
                "the all-zero UUID",
                smi(&[gpu_of("01", registered("0", zero))]),
            ),
            (
                "the all-zero UUID, failed",
                smi(&[gpu_of(
                    "01",
                    Some((
                        "Completed",
                        "Insufficient Resources",
                        "0".into(),
                        zero.into(),
                    )),
                )]),
            ),
            (
                "no ClusterUUID line",
                smi(&[gpu("01", Some(("Completed", "Success", "3", "")))
                    .replace("ClusterUUID                       : \n", "")]),
            ),
            ("no GPU", "No devices were found\n".to_owned()),
            ("nothing", String::new()),
        ] {
            let (path, w) = path_of(&text);
            assert!(path.is_err(), "{what}: {path:?}");
            assert!(w.is_empty(), "{what}: {w:?}");
        }
        let (path, _) = path_of(&smi(&[gpu_of("01", na())]));
        assert_eq!(
            path,
            Err("GPU 00000000:01:00.0: State N/A, ClusterUUID N/A".into())
        );
    }

    #[test]
    fn a_fabric_not_ready_names_no_path_with_a_warning() {
        for (fabric, said) in [
            (
                Some(("In Progress", "N/A", "N/A".to_owned(), "N/A".to_owned())),
                "State In Progress",
            ),
            (
                Some((
                    "Not Started",
                    "N/A",
                    "0".to_owned(),
                    "00000000-0000-0000-0000-000000000000".to_owned(),
                )),
                "State Not Started",
            ),
            (
                Some((
                    "Completed",
                    "Insufficient Resources",
                    "5".to_owned(),
                    CLUSTER.to_owned(),
                )),
                "Status Insufficient Resources",
            ),
            (
                Some(("In Progress", "N/A", "5".to_owned(), CLUSTER.to_owned())),
                "State In Progress",
            ),
            (
                Some(("Completed", "Success", "N/A".to_owned(), CLUSTER.to_owned())),
                "CliqueId 'N/A' is not a number",
            ),
            (
                Some((
                    "Completed",
                    "Success",
                    "5".to_owned(),
                    "cluster 9".to_owned(),
                )),
                "ClusterUUID 'cluster 9' is not a UUID",
            ),
        ] {
            let (path, w) = path_of(&smi(&[gpu_of("01", fabric.clone()), gpu_of("02", fabric)]));
            assert!(path.is_err(), "{said}: {path:?}");
            assert_eq!(w.len(), 1, "{said}: {w:?}");
            assert!(
                w[0].contains(&format!(
                    "GPU 00000000:01:00.0: {said}; GPU 00000000:02:00.0: {said}"
                )) && w[0].contains("--topology"),
                "{said}: {w:?}"
            );
        }
    }

    #[test]
    fn gpus_that_disagree_join_with_the_first_domain_and_a_warning() {
        let text = smi(&[
            gpu_of("01", registered("11", CLUSTER)),
            gpu_of("02", registered("11", CLUSTER)),
            gpu_of("03", registered("12", CLUSTER)),
            gpu_of("04", registered("11", OTHER_CLUSTER)),
        ]);
        let (path, w) = path_of(&text);
        assert_eq!(path, Ok(format!("nvl-{CLUSTER}/11")));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains(&format!(
                "GPU 00000000:01:00.0 is in cluster {CLUSTER} clique 11"
            )) && w[0].contains(&format!(
                "GPU 00000000:03:00.0: cluster {CLUSTER} clique 12"
            )) && w[0].contains(&format!(
                "GPU 00000000:04:00.0: cluster {OTHER_CLUSTER} clique 11"
            )) && !w[0].contains("00000000:02:00.0"),
            "{w:?}"
        );
        // The first GPU that names a domain wins; the others are listed.
        let text = smi(&[
            gpu_of(
                "01",
                Some(("In Progress", "N/A", "N/A".into(), "N/A".into())),
            ),
            gpu_of("02", registered("9", CLUSTER)),
        ]);
        let (path, w) = path_of(&text);
        assert_eq!(path, Ok(format!("nvl-{CLUSTER}/9")));
        assert!(
            w.len() == 1 && w[0].contains("GPU 00000000:01:00.0: State In Progress"),
            "{w:?}"
        );
    }

    #[test]
    fn only_the_fabric_section_of_each_gpu_is_read() {
        // Indented as a whole (pasted into a report), with tabs for the
        // fields: nesting is read from indentation, not from its width.
        let text = smi(&[gpu_of("01", registered("21", CLUSTER))])
            .lines()
            .map(|l| {
                let body = l.trim_start_matches(' ');
                let tabs = "\t".repeat((l.len() - body.len()) / 4);
                format!("  {tabs}{body}")
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(path_of(&text).0, Ok(format!("nvl-{CLUSTER}/21")));
        // Fields of the same names elsewhere, `Health`'s `Status` and the
        // `GPU Fabric GUID` line are not the Fabric section's.
        let text = smi(&[gpu_of("01", registered("21", CLUSTER)), gpu_of("02", None)]);
        let sections = fabric_sections(&text);
        assert_eq!(
            sections,
            [
                (
                    "00000000:01:00.0",
                    Some(vec![
                        ("State", "Completed"),
                        ("Status", "Success"),
                        ("CliqueId", "21"),
                        ("ClusterUUID", CLUSTER),
                    ])
                ),
                ("00000000:02:00.0", None),
            ]
        );
    }

    #[test]
    fn nvidia_smi_is_asked_last_and_only_its_stalls_warn() {
        let asked = std::cell::Cell::new(0);
        let domain = || {
            asked.set(asked.get() + 1);
            Ok(smi(&[gpu_of("01", registered("4", CLUSTER))]))
        };
        let slurm = env_of(&[("SLURM_TOPOLOGY_ADDR", "s0.n1")]);
        let none = env_of(&[]);
        let mut w = Vec::new();
        assert_eq!(
            resolve(Some("rack-1"), None, &none, &domain, &mut w).as_deref(),
            Ok("rack-1")
        );
        assert_eq!(
            resolve(None, None, &slurm, &domain, &mut w).as_deref(),
            Ok("s0")
        );
        assert_eq!(asked.get(), 0, "nvidia-smi is not run when a path is known");
        let expected = format!("nvl-{CLUSTER}/4");
        assert_eq!(
            resolve(None, None, &none, &domain, &mut w).as_ref(),
            Ok(&expected)
        );
        assert_eq!(asked.get(), 1);
        assert!(w.is_empty(), "{w:?}");
        // A Slurm address without switches names no path; nvidia-smi does.
        let flat = env_of(&[
            ("SLURM_TOPOLOGY_ADDR", "n1"),
            ("SLURM_TOPOLOGY_ADDR_PATTERN", "node"),
        ]);
        assert_eq!(
            resolve(None, None, &flat, &domain, &mut w).as_ref(),
            Ok(&expected)
        );
        assert!(w.is_empty(), "{w:?}");
        // Nor does one that is not valid (with its warning).
        let odd = env_of(&[("SLURM_TOPOLOGY_ADDR", "sw 1.n1")]);
        assert_eq!(resolve(None, None, &odd, &domain, &mut w), Ok(expected));
        assert_eq!(asked.get(), 3);
        assert!(
            w.len() == 1 && w[0].contains("SLURM_TOPOLOGY_ADDR"),
            "{w:?}"
        );
        w.clear();
        let failed = || Err(SmiError::Failed("it ended with exit status: 9".into()));
        assert_eq!(
            resolve(None, None, &none, &failed, &mut w).as_deref(),
            Ok("")
        );
        assert_eq!(
            resolve(None, None, &none, &no_smi, &mut w).as_deref(),
            Ok("")
        );
        let na = || Ok(smi(&[gpu_of("01", None)]));
        assert_eq!(resolve(None, None, &none, &na, &mut w).as_deref(), Ok(""));
        assert!(w.is_empty(), "{w:?}");
        let stuck = || Err(SmiError::Stuck("did not finish within 5 s".into()));
        assert_eq!(
            resolve(None, None, &none, &stuck, &mut w).as_deref(),
            Ok("")
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("nvidia-smi -q did not finish within 5 s; "),
            "{w:?}"
        );
    }

    #[test]
    fn the_command_is_bounded_in_time_and_output() {
        let sh = Path::new("/bin/sh");
        let run = |script: &str, timeout_ms: u64, max: u64| {
            run_bounded(sh, &["-c", script], Duration::from_millis(timeout_ms), max)
        };
        assert_eq!(run("echo hi", 5000, 16), Ok("hi\n".into()));
        assert_eq!(
            run("printf 0123456789abcdef", 5000, 16),
            Ok("0123456789abcdef".into())
        );
        assert_eq!(
            run("head -c 100000 /dev/zero", 5000, 16),
            Err(SmiError::Stuck("printed more than 16 bytes".into()))
        );
        let e = run("echo 'No devices were found'; exit 6", 5000, 1024).expect_err("fails");
        assert!(
            matches!(&e, SmiError::Failed(why) if why.contains("6") && why.contains("No devices were found")),
            "{e:?}"
        );
        assert!(matches!(
            run_bounded(
                Path::new("/nonexistent/nvidia-smi"),
                &["-q"],
                Duration::from_secs(1),
                16
            ),
            Err(SmiError::Failed(_))
        ));
        // A hung command, and one whose background child keeps the output
        // open after it exits: both killed at the timeout, with their group.
        for script in ["sleep 30", "sleep 30 & echo started"] {
            let started = Instant::now();
            let e = run(script, 300, 1024).expect_err("stuck");
            assert!(
                matches!(&e, SmiError::Stuck(why) if why.contains("0.3 s")),
                "{script}: {e:?}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{script}: {:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn slurm_addresses_keep_their_switches() {
        assert_eq!(from_slurm("s0.s3.node17", "switch.switch.node"), "s0/s3");
        assert_eq!(from_slurm("s0.s3.node17", ""), "s0/s3");
        assert_eq!(from_slurm("node17", "node"), "");
        assert_eq!(from_slurm("b2.node17", "block.node"), "b2");
    }

    #[test]
    fn the_flag_comes_first_then_the_file_then_slurm() {
        let slurm = env_of(&[
            ("SLURM_TOPOLOGY_ADDR", "s0.s1.n1"),
            ("SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node"),
        ]);
        let mut w = Vec::new();
        assert_eq!(
            resolve(Some("zone-a/rack-1"), None, &slurm, &no_smi, &mut w).as_deref(),
            Ok("zone-a/rack-1")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("topology");
        std::fs::write(&file, "zone-b/rack-2\n").expect("write");
        assert_eq!(
            resolve(None, Some(&file), &slurm, &no_smi, &mut w).as_deref(),
            Ok("zone-b/rack-2")
        );
        assert_eq!(
            resolve(None, None, &slurm, &no_smi, &mut w).as_deref(),
            Ok("s0/s1")
        );
        assert_eq!(
            resolve(None, None, &env_of(&[]), &no_smi, &mut w).as_deref(),
            Ok("")
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_topology_file_is_read_only_when_no_one_else_controls_it() {
        use std::os::unix::fs::PermissionsExt;
        let none = env_of(&[]);
        let mut w = Vec::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("token");
        std::fs::write(&secret, "0123456789abcdef\n").expect("write");
        // A planted link to a secret: not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        let e = resolve(None, Some(&link), &none, &no_smi, &mut w).expect_err("a link");
        assert!(e.contains("symbolic link") && !e.contains("0123"), "{e}");
        // A FIFO: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = resolve(None, Some(&fifo), &none, &no_smi, &mut w).expect_err("a fifo");
        assert!(e.contains("not a regular file"), "{e}");
        // Writable by others: refused with the fix.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let e = resolve(None, Some(&secret), &none, &no_smi, &mut w).expect_err("writable");
        assert!(e.contains("chmod go-w"), "{e}");
    }

    #[test]
    fn a_bad_path_given_on_purpose_stops_one_found_is_left_out() {
        let none = env_of(&[]);
        let mut w = Vec::new();
        let e = resolve(Some("rack 3"), None, &none, &no_smi, &mut w).expect_err("refused");
        assert!(e.starts_with("--topology: ") && e.contains("' '"), "{e}");
        let e = resolve(
            None,
            Some(Path::new("/nonexistent/topology")),
            &none,
            &no_smi,
            &mut w,
        )
        .expect_err("refused");
        assert!(e.contains("/nonexistent/topology"), "{e}");
        let odd = env_of(&[("SLURM_TOPOLOGY_ADDR", "sw 1.n1")]);
        assert_eq!(
            resolve(None, None, &odd, &no_smi, &mut w).as_deref(),
            Ok("")
        );
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("SLURM_TOPOLOGY_ADDR"), "{w:?}");
    }
}
