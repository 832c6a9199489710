//! What this machine has: CUDA devices, physical cores, programs on `PATH`.
//!
//! The agent and `accel` ask the same questions of the machine (how many
//! GPUs for `--nproc-per-node gpu` and `config default`, how many cores for
//! accelerate's `OMP_NUM_THREADS`, whether `nvidia-smi`, `py-spy` or
//! `gcloud` can be run), and their answers must agree, so both ask them
//! here. Every probe is read-only, loads no library and starts no process.
//! (What the GPUs are is a different question: `accel launch`'s RTX 40
//! check runs `nvidia-smi` itself, as accelerate does.)

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// CUDA devices visible to this process, without loading any CUDA library
/// (which would make a later `fork` unsafe): see [`cuda_devices_in`].
pub fn cuda_devices(env: &dyn Fn(&str) -> Option<String>) -> u32 {
    cuda_devices_in(Path::new("/"), env)
}

/// CUDA devices visible to a process whose `/` is `root`:
/// - the device nodes it may open, `/dev/nvidia0`, `/dev/nvidia1`, ...: in
///   a container, the ones its runtime gave it. The driver's
///   `/proc/driver/nvidia/gpus` lists every GPU of the host, and under CDI
///   injection (the GPU Operator's default) a container sees all of them
///   there, not only its own;
/// - only when there is no such node and `NVIDIA_VISIBLE_DEVICES` is unset
///   (a host whose nodes are not made yet), the driver's list;
/// - at most as many as `NVIDIA_VISIBLE_DEVICES` lists (`all`: no limit;
///   `none`, `void` or empty: none), then as `CUDA_VISIBLE_DEVICES` lists.
pub fn cuda_devices_in(root: &Path, env: &dyn Fn(&str) -> Option<String>) -> u32 {
    let listed = |v: &str| v.split(',').filter(|d| !d.trim().is_empty()).count() as u32;
    let runtime = env("NVIDIA_VISIBLE_DEVICES").map(|v| v.trim().to_owned());
    let nodes = device_nodes(&root.join("dev"));
    let mut present = match (nodes, &runtime) {
        (0, None) => {
            std::fs::read_dir(root.join("proc/driver/nvidia/gpus")).map_or(0, |d| d.count() as u32)
        }
        (n, _) => n,
    };
    match runtime.as_deref() {
        None | Some("all") => {}
        Some("" | "none" | "void") => present = 0,
        Some(list) => present = present.min(listed(list)),
    }
    match env("CUDA_VISIBLE_DEVICES") {
        Some(v) if present > 0 => listed(&v).min(present),
        _ => present,
    }
}

/// `dev/nvidiaN` entries this process may read and write.
fn device_nodes(dev: &Path) -> u32 {
    use nix::unistd::{access, AccessFlags};
    let Ok(entries) = std::fs::read_dir(dev) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                && access(&e.path(), AccessFlags::R_OK | AccessFlags::W_OK).is_ok()
        })
        .count() as u32
}

/// Physical cores (distinct core ids per package), as psutil counts them;
/// the logical count when the topology is not readable. Hand-written rather
/// than `num_cpus::get_physical`: that one reads `/proc/cpuinfo`, whose
/// package fields ARM servers lack (it then counts logical CPUs), while
/// accelerate's thread count follows psutil's sysfs topology.
pub fn physical_cores() -> u32 {
    let mut cores = std::collections::BTreeSet::new();
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_cpu = name
                .strip_prefix("cpu")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !is_cpu {
                continue;
            }
            let topology = e.path().join("topology");
            if let Ok(list) = std::fs::read_to_string(topology.join("core_cpus_list"))
                .or_else(|_| std::fs::read_to_string(topology.join("thread_siblings_list")))
            {
                cores.insert(list.trim().to_owned());
            }
        }
    }
    match u32::try_from(cores.len()) {
        Ok(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    }
}

/// The first executable `name` in `path` (a `PATH` value), or, for a name
/// with a `/`, that file (made absolute against the current directory) if
/// it may be executed. Unset, `PATH` means `/bin:/usr/bin`, as `execvp` and
/// Python's `subprocess` assume, so a program in `/usr/bin` is found even
/// from an empty environment. A file of that name without the execute bit
/// is passed over, as the shell does.
pub fn find_program(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let path = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    which::which_in(name, Some(path), cwd).ok()
}

/// [`find_program`] on this process's own `PATH` (whatever its encoding).
pub fn program(name: &str) -> Option<PathBuf> {
    find_program(name, std::env::var_os("PATH").as_deref())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file(dir: &std::path::Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    }

    #[test]
    fn a_program_is_the_first_executable_of_its_name_on_path() {
        let first = tempfile::tempdir().expect("tempdir");
        let second = tempfile::tempdir().expect("tempdir");
        // Readable but not executable: the shell would skip it, and so do we.
        file(first.path(), "py-spy", 0o644);
        let runnable = file(second.path(), "py-spy", 0o755);
        let path = format!("{}:{}", first.path().display(), second.path().display());
        assert_eq!(find_program("py-spy", Some(path.as_ref())), Some(runnable));
        assert_eq!(find_program("nvidia-smi", Some(path.as_ref())), None);
        let only_plain = first.path().display().to_string();
        assert_eq!(find_program("py-spy", Some(only_plain.as_ref())), None);
    }

    /// A fake root with `gpus` GPUs in the driver's list and `nodes` device
    /// nodes (plain files stand for them: only their names and modes count).
    fn machine(gpus: u32, nodes: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for i in 0..gpus {
            let d = root
                .path()
                .join(format!("proc/driver/nvidia/gpus/0000:{i:02x}:00.0"));
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let dev = root.path().join("dev");
        std::fs::create_dir_all(&dev).expect("mkdir");
        for n in nodes {
            std::fs::write(dev.join(n), "").expect("node");
        }
        root
    }

    fn env_of<'a>(
        vars: &'a [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn gpus_are_the_device_nodes_a_container_was_given_not_the_host_s() {
        // CDI: the host's eight GPUs in /proc, two nodes in the container.
        let cdi = machine(
            8,
            &[
                "nvidia0",
                "nvidia5",
                "nvidiactl",
                "nvidia-uvm",
                "nvidia-caps",
            ],
        );
        assert_eq!(cuda_devices_in(cdi.path(), &env_of(&[])), 2);
        assert_eq!(
            cuda_devices_in(cdi.path(), &env_of(&[("CUDA_VISIBLE_DEVICES", "1")])),
            1
        );
        // The runtime's list limits what is counted.
        let all = machine(8, &["nvidia0", "nvidia1", "nvidia2", "nvidia3"]);
        let visible = |v| cuda_devices_in(all.path(), &env_of(&[("NVIDIA_VISIBLE_DEVICES", v)]));
        assert_eq!(visible("all"), 4);
        assert_eq!(visible("0,1"), 2);
        assert_eq!(visible("GPU-8f6c,GPU-1d2e,GPU-77aa"), 3);
        assert_eq!(visible("none"), 0);
        assert_eq!(visible("void"), 0);
        // A bare host whose nodes are not made yet: the driver's list.
        let bare = machine(4, &["nvidiactl"]);
        assert_eq!(cuda_devices_in(bare.path(), &env_of(&[])), 4);
        // In a container given no node, the host's list does not count.
        assert_eq!(
            cuda_devices_in(bare.path(), &env_of(&[("NVIDIA_VISIBLE_DEVICES", "all")])),
            0
        );
        // No GPU at all.
        let none = machine(0, &[]);
        assert_eq!(cuda_devices_in(none.path(), &env_of(&[])), 0);
    }

    #[test]
    fn a_device_node_this_process_may_not_open_is_not_counted() {
        let m = machine(2, &["nvidia0", "nvidia1"]);
        let locked = m.path().join("dev/nvidia1");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
        // A process that may override file modes (root with its
        // capabilities) may open it after all: then it counts.
        use nix::unistd::{access, AccessFlags};
        let may = access(&locked, AccessFlags::R_OK | AccessFlags::W_OK).is_ok();
        assert_eq!(cuda_devices_in(m.path(), &env_of(&[])), 1 + u32::from(may));
    }

    #[test]
    fn a_directory_is_not_a_program() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("nvidia-smi")).expect("mkdir");
        let path = dir.path().display().to_string();
        assert_eq!(find_program("nvidia-smi", Some(path.as_ref())), None);
    }

    #[test]
    fn a_path_with_a_slash_is_checked_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runnable = file(dir.path(), "run", 0o755);
        let plain = file(dir.path(), "plain", 0o644);
        let name = runnable.display().to_string();
        assert_eq!(find_program(&name, Some("".as_ref())), Some(runnable));
        assert_eq!(
            find_program(&plain.display().to_string(), Some("".as_ref())),
            None
        );
    }

    #[test]
    fn an_unset_path_searches_where_execvp_does() {
        assert!(find_program("sh", None).is_some());
    }

    #[test]
    fn a_path_that_is_not_utf8_is_still_searched() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let odd = dir.path().join(OsStr::from_bytes(b"bin-\xff"));
        std::fs::create_dir(&odd).expect("mkdir");
        let runnable = file(&odd, "nvidia-smi", 0o755);
        assert_eq!(
            find_program("nvidia-smi", Some(odd.as_os_str())),
            Some(runnable)
        );
    }

    #[test]
    fn physical_cores_are_counted_and_never_more_than_logical_ones() {
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let physical = physical_cores();
        assert!((1..=logical).contains(&physical), "{physical} of {logical}");
    }

    #[test]
    fn cuda_visible_devices_limits_only_devices_the_driver_has() {
        let present = cuda_devices(&|_| None);
        let one = cuda_devices(&|k| (k == "CUDA_VISIBLE_DEVICES").then(|| "0".to_owned()));
        assert_eq!(one, present.min(1));
        let none = cuda_devices(&|k| (k == "CUDA_VISIBLE_DEVICES").then(String::new));
        assert_eq!(none, 0);
    }
}
