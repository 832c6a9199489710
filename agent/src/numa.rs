//! `--numa-binding`: which CPUs each worker may run on, chosen as torch 2.13
//! chooses them for torchrun, from sysfs alone.
//!
//! # Why it is done this way
//! torchrun asks torch (`torch/numa/binding.py`) for a set of CPUs per local
//! rank and runs the worker under `numactl --physcpubind=LIST`, a binding of
//! the whole process from its first instruction. The agent runs no Python, so
//! the same choice is made here from the same files, and the worker's
//! affinity is set between `fork` and `exec` (or, for a fork of a zygote or a
//! notebook's fork server, first thing in the child): the same whole-process
//! binding without needing `numactl`.
//!
//! Local rank `i` is bound for GPU `i`, the `i`-th CUDA device the agent
//! sees. torch asks CUDA for that device's PCI address; here the devices are
//! the NVIDIA driver's `/proc/driver/nvidia/gpus/<pci address>` directories
//! in PCI address order (CUDA's order with `CUDA_DEVICE_ORDER=PCI_BUS_ID`,
//! and its default order on a node of identical GPUs), limited and reordered
//! by `CUDA_VISIBLE_DEVICES` as CUDA does ([`visible_gpus`]).
//!
//! From the GPU's PCI address on, the rules are torch's ([`Machine::cpus_for`]):
//! - its NUMA node is `/sys/bus/pci/devices/<addr>/numa_node`, where `-1`
//!   (a machine with one node) means node 0;
//! - a node's CPUs are its `cpulist`, limited to the CPUs the agent itself may
//!   run on (its affinity when it starts);
//! - `node`: the node's CPUs; `socket`: the CPUs of every node whose lowest
//!   CPU is in the same package (`physical_package_id`) as the GPU node's
//!   lowest CPU;
//! - `exclusive`: the node's physical cores (CPUs grouped by the lowest CPU of
//!   their `thread_siblings_list`, so hyperthreads stay together, in that
//!   order) divided among every visible GPU on that node in index order, the
//!   first `cores % gpus` GPUs getting one more core;
//! - `core-complex`: the node's CPUs grouped by the highest-level data or
//!   unified cache they share (`cache/index*/shared_cpu_list`), groups with
//!   more CPUs first, then by lowest CPU; the GPU's position among the node's
//!   GPUs picks the group, wrapping around.
//!
//! The reading is rooted at a directory given to [`Machine::new`] and
//! [`visible_gpus`], so tests build fake machines; `ACCEL_NUMA_ROOT` points the
//! agent at one (a testing knob, see [`ROOT_VARIABLE`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The variable that points `--numa-binding` at a fake machine: a directory
/// standing for `/` (with `sys/...` and `proc/driver/nvidia/gpus/...` under
/// it). For tests only; unset, the real files are read.
pub const ROOT_VARIABLE: &str = "ACCEL_NUMA_ROOT";

/// Highest CPU number accepted from sysfs (Linux's `NR_CPUS` is at most 8192);
/// a larger one is a corrupt file, not a machine.
const MAX_CPU: u32 = 1 << 16;

/// How a worker's CPUs are chosen (`--numa-binding`); torch's `AffinityMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AffinityMode {
    /// Every CPU of the NUMA node of the worker's GPU.
    Node,
    /// Every CPU of the socket (package) holding that node.
    Socket,
    /// A share of that node's physical cores no other GPU's worker gets.
    Exclusive,
    /// One group of that node's cores sharing a last-level cache.
    CoreComplex,
}

impl AffinityMode {
    /// The flag's value, as torchrun spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Socket => "socket",
            Self::Exclusive => "exclusive",
            Self::CoreComplex => "core-complex",
        }
    }
}

impl fmt::Display for AffinityMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of logical CPU numbers; shown as the kernel writes lists (`0-3,8`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuList(BTreeSet<u32>);

impl CpuList {
    /// The CPUs, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }

    fn and(&self, other: &CpuList) -> CpuList {
        CpuList(self.0.intersection(&other.0).copied().collect())
    }

    /// Parses a kernel CPU list (`0-3,8`, blanks and a trailing newline
    /// allowed; empty is the empty set).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (cpu_number(a)?, cpu_number(b)?),
                None => {
                    let n = cpu_number(part)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(format!("the range {part} runs backwards"));
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }
}

fn cpu_number(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= MAX_CPU => Ok(n),
        _ => Err(format!("'{}' is not a CPU number", s.trim())),
    }
}

impl FromIterator<u32> for CpuList {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut cpus = self.iter().peekable();
        let mut first = true;
        while let Some(lo) = cpus.next() {
            let mut hi = lo;
            while cpus.peek() == Some(&(hi + 1)) {
                hi += 1;
                cpus.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

/// Why no binding could be chosen. Every message names the flag and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NumaError {
    /// The machine has no NVIDIA GPU: torchrun fails here too ("Found no
    /// NVIDIA driver on your system").
    #[error(
        "--numa-binding binds each worker to the CPUs near its GPU, but this machine has no NVIDIA GPU \
         ({} does not exist; torchrun fails the same way: \"Found no NVIDIA driver on your system\"); \
         run without --numa-binding here",
        dir.display()
    )]
    NoGpus {
        /// The driver's directory that is missing.
        dir: PathBuf,
    },
    /// More local ranks than visible GPUs: local rank `rank` has no GPU.
    #[error(
        "--numa-binding binds local rank {rank} to the CPUs of GPU {rank}, but {visible} GPU(s) are visible\
         {}; use --nproc-per-node {visible} or fewer, or run without --numa-binding",
        cuda_visible_devices.as_ref().map(|v| format!(" (CUDA_VISIBLE_DEVICES={v})")).unwrap_or_default()
    )]
    TooFewGpus {
        /// The first local rank without a GPU.
        rank: u32,
        /// How many GPUs are visible.
        visible: usize,
        /// The agent's `CUDA_VISIBLE_DEVICES`, if set.
        cuda_visible_devices: Option<String>,
    },
    /// A `CUDA_VISIBLE_DEVICES` entry this module cannot place on a PCI address.
    #[error(
        "--numa-binding: CUDA_VISIBLE_DEVICES entry '{entry}' is a MIG instance, whose GPU cannot be \
         found without NVML; list GPUs by index or GPU-UUID, or run without --numa-binding"
    )]
    MigDevice {
        /// The entry.
        entry: String,
    },
    /// The agent's own CPU affinity could not be read.
    #[error("--numa-binding: cannot read this agent's CPU affinity: {0}")]
    Affinity(#[source] std::io::Error),
    /// A file that had to be read could not be.
    #[error("--numa-binding: cannot read {}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file held something else than expected.
    #[error("--numa-binding: {} holds '{text}': {why}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// An excerpt of what it holds.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// The GPU's NUMA node has no CPU the agent may run on (a CPU-less node,
    /// or an agent confined elsewhere by `taskset` or a cpuset).
    #[error(
        "--numa-binding {mode}: GPU {gpu} is on NUMA node {node}, which has no CPU this agent may run on \
         (the node's CPUs: {node_cpus}; the agent's: {allowed}); start the agent on CPUs that include \
         the node's, or run without --numa-binding"
    )]
    NoCpus {
        /// The mode.
        mode: AffinityMode,
        /// The GPU (local rank).
        gpu: usize,
        /// Its node.
        node: u32,
        /// Every CPU of the node.
        node_cpus: CpuList,
        /// The CPUs the agent may run on.
        allowed: CpuList,
    },
    /// `exclusive` with fewer physical cores than GPUs on a node.
    #[error(
        "--numa-binding exclusive: NUMA node {node} has {cores} physical core(s) this agent may use for its \
         {gpus} GPUs, fewer than one each; use --numa-binding node or core-complex instead"
    )]
    TooFewCores {
        /// The node.
        node: u32,
        /// Its physical cores (the agent may use).
        cores: usize,
        /// Its GPUs.
        gpus: usize,
    },
    /// `core-complex` and a CPU with no data or unified cache listed.
    #[error(
        "--numa-binding core-complex: CPU {cpu} lists no data or unified cache under {}; \
         use --numa-binding node instead",
        dir.display()
    )]
    NoCache {
        /// The CPU.
        cpu: u32,
        /// Its cache directory.
        dir: PathBuf,
    },
}

/// What is read of a machine for the binding: its files under `root`, its
/// GPUs' PCI addresses by CUDA index, and the CPUs the agent may run on.
#[derive(Debug, Clone)]
pub struct Machine {
    root: PathBuf,
    gpus: Vec<String>,
    allowed: CpuList,
}

impl Machine {
    /// A machine whose `/` is `root`, with the visible GPUs' PCI addresses in
    /// CUDA index order (from [`visible_gpus`]) and the agent's own CPUs.
    pub fn new(root: impl Into<PathBuf>, gpus: Vec<String>, allowed: CpuList) -> Self {
        Self {
            root: root.into(),
            gpus,
            allowed,
        }
    }

    /// The CPUs of every local rank `0..nproc`, or why not (the first
    /// failing rank's reason). `cuda_visible_devices` only words the error.
    pub fn plan(
        &self,
        mode: AffinityMode,
        nproc: u32,
        cuda_visible_devices: Option<&str>,
    ) -> Result<Vec<CpuList>, NumaError> {
        (0..nproc)
            .map(|rank| {
                let gpu = rank as usize;
                if gpu >= self.gpus.len() {
                    return Err(NumaError::TooFewGpus {
                        rank,
                        visible: self.gpus.len(),
                        cuda_visible_devices: cuda_visible_devices.map(str::to_owned),
                    });
                }
                self.cpus_for(mode, gpu)
            })
            .collect()
    }

    /// The CPUs torch binds GPU `gpu`'s worker to in `mode` (never empty).
    pub fn cpus_for(&self, mode: AffinityMode, gpu: usize) -> Result<CpuList, NumaError> {
        if gpu >= self.gpus.len() {
            return Err(NumaError::TooFewGpus {
                rank: u32::try_from(gpu).unwrap_or(u32::MAX),
                visible: self.gpus.len(),
                cuda_visible_devices: None,
            });
        }
        let node = self.gpu_node(gpu)?;
        let cpus = match mode {
            AffinityMode::Node => self.node_cpus(node)?,
            AffinityMode::Socket => self.socket_cpus(node)?,
            AffinityMode::Exclusive => self.exclusive_cpus(node, gpu)?,
            AffinityMode::CoreComplex => self.core_complex_cpus(node, gpu)?,
        };
        if cpus.is_empty() {
            return Err(NumaError::NoCpus {
                mode,
                gpu,
                node,
                node_cpus: self.all_node_cpus(node)?,
                allowed: self.allowed.clone(),
            });
        }
        Ok(cpus)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The NUMA node of GPU `gpu`: its PCI device's `numa_node`, where a
    /// negative value (no NUMA information) is node 0.
    fn gpu_node(&self, gpu: usize) -> Result<u32, NumaError> {
        let addr = self.gpus.get(gpu).map(String::as_str).unwrap_or_default();
        let path = self.path(&format!("sys/bus/pci/devices/{addr}/numa_node"));
        let text = read(&path)?;
        match text.trim().parse::<i64>() {
            Ok(n) if n < 0 => Ok(0),
            Ok(n) => u32::try_from(n).map_err(|_| parse_error(&path, &text, "not a node number")),
            Err(_) => Err(parse_error(&path, &text, "not a node number")),
        }
    }

    /// Every CPU of `node`, whether the agent may use it or not.
    fn all_node_cpus(&self, node: u32) -> Result<CpuList, NumaError> {
        self.cpu_list(&format!("sys/devices/system/node/node{node}/cpulist"))
    }

    /// The CPUs of `node` the agent may run on.
    fn node_cpus(&self, node: u32) -> Result<CpuList, NumaError> {
        Ok(self.all_node_cpus(node)?.and(&self.allowed))
    }

    fn cpu_list(&self, rel: &str) -> Result<CpuList, NumaError> {
        let path = self.path(rel);
        let text = read(&path)?;
        CpuList::parse(&text).map_err(|why| parse_error(&path, &text, &why))
    }

    fn package(&self, cpu: u32) -> Result<i64, NumaError> {
        let path = self.path(&format!(
            "sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
        ));
        let text = read(&path)?;
        text.trim()
            .parse()
            .map_err(|_| parse_error(&path, &text, "not a package number"))
    }

    fn socket_cpus(&self, node: u32) -> Result<CpuList, NumaError> {
        let Some(first) = self.node_cpus(node)?.first() else {
            return Ok(CpuList::default());
        };
        let socket = self.package(first)?;
        let mut cpus = BTreeSet::new();
        for other in self.cpu_list("sys/devices/system/node/possible")?.iter() {
            // A node without usable CPUs (GPU or CXL memory, or one the
            // kernel lists as possible but does not have) adds nothing;
            // torch stops with an error on it.
            let theirs = match self.node_cpus(other) {
                Ok(cpus) => cpus,
                Err(NumaError::Read { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(lowest) = theirs.first() else {
                continue;
            };
            if self.package(lowest)? == socket {
                cpus.extend(theirs.iter());
            }
        }
        Ok(CpuList(cpus))
    }

    /// The visible GPUs on `node`, in index order, and `gpu`'s place among them.
    fn place_on_node(&self, node: u32, gpu: usize) -> Result<(usize, usize), NumaError> {
        let mut count = 0;
        let mut place = 0;
        for other in 0..self.gpus.len() {
            if self.gpu_node(other)? == node {
                if other < gpu {
                    place += 1;
                }
                count += 1;
            }
        }
        Ok((place, count))
    }

    fn exclusive_cpus(&self, node: u32, gpu: usize) -> Result<CpuList, NumaError> {
        let (place, gpus) = self.place_on_node(node, gpu)?;
        let mut cores: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for cpu in self.node_cpus(node)?.iter() {
            let siblings = self.cpu_list(&format!(
                "sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
            ))?;
            let core = siblings.first().unwrap_or(cpu);
            cores.entry(core).or_default().insert(cpu);
        }
        let each = cores.len() / gpus;
        let extra = cores.len() % gpus;
        if each < 1 {
            return Err(NumaError::TooFewCores {
                node,
                cores: cores.len(),
                gpus,
            });
        }
        let start = place * each + place.min(extra);
        let take = each + usize::from(place < extra);
        Ok(cores
            .into_values()
            .skip(start)
            .take(take)
            .flatten()
            .collect())
    }

    fn core_complex_cpus(&self, node: u32, gpu: usize) -> Result<CpuList, NumaError> {
        let (place, _) = self.place_on_node(node, gpu)?;
        let mut groups: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for cpu in self.node_cpus(node)?.iter() {
            let sharing = self.last_level_cache(cpu)?;
            let key = sharing.first().unwrap_or(cpu);
            groups.entry(key).or_default().insert(cpu);
        }
        let mut groups: Vec<(u32, BTreeSet<u32>)> = groups.into_iter().collect();
        groups.sort_by_key(|(key, cpus)| (std::cmp::Reverse(cpus.len()), *key));
        if groups.is_empty() {
            return Ok(CpuList::default());
        }
        let (_, cpus) = groups.swap_remove(place % groups.len());
        Ok(CpuList(cpus))
    }

    /// The CPUs sharing `cpu`'s highest-level data or unified cache (the
    /// lowest-numbered `index*` of that level when several are).
    fn last_level_cache(&self, cpu: u32) -> Result<CpuList, NumaError> {
        let dir = self.path(&format!("sys/devices/system/cpu/cpu{cpu}/cache"));
        let entries = std::fs::read_dir(&dir).map_err(|source| NumaError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut indices: Vec<(u64, String)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let n = name.strip_prefix("index")?;
                (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| Some((n.parse().ok()?, name.clone())))?
            })
            .collect();
        indices.sort();
        let mut best: Option<(i64, CpuList)> = None;
        for (_, name) in indices {
            let index = dir.join(&name);
            let kind = read(&index.join("type"))?;
            if !matches!(kind.trim(), "Unified" | "Data") {
                continue;
            }
            let level_path = index.join("level");
            let level_text = read(&level_path)?;
            let level: i64 = level_text
                .trim()
                .parse()
                .map_err(|_| parse_error(&level_path, &level_text, "not a cache level"))?;
            if best.as_ref().is_some_and(|(l, _)| level <= *l) {
                continue;
            }
            let shared_path = index.join("shared_cpu_list");
            let shared_text = read(&shared_path)?;
            let shared = CpuList::parse(&shared_text)
                .map_err(|why| parse_error(&shared_path, &shared_text, &why))?;
            best = Some((level, shared));
        }
        match best {
            Some((_, shared)) if !shared.is_empty() => Ok(shared),
            _ => Err(NumaError::NoCache { cpu, dir }),
        }
    }
}

/// The CPUs of each local rank `0..nproc` for this agent: the machine at
/// `/` (or at [`ROOT_VARIABLE`]), the GPUs `CUDA_VISIBLE_DEVICES` leaves it
/// (from `env`, the agent's environment), the CPUs it may run on.
pub fn plan_for_agent(
    mode: AffinityMode,
    nproc: u32,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<CpuList>, NumaError> {
    let root = env(ROOT_VARIABLE)
        .filter(|r| !r.is_empty())
        .map_or_else(|| PathBuf::from("/"), PathBuf::from);
    let visible = env("CUDA_VISIBLE_DEVICES");
    let gpus = visible_gpus(&root, visible.as_deref())?;
    let allowed = crate::sys::allowed_cpus().map_err(NumaError::Affinity)?;
    Machine::new(root, gpus, allowed).plan(mode, nproc, visible.as_deref())
}

/// The PCI addresses of the GPUs CUDA numbers 0, 1, ... for a process with
/// `cuda_visible_devices`: the driver's devices under
/// `root/proc/driver/nvidia/gpus` in PCI address order, then, if the
/// variable is set, the ones it lists, in its order. An entry is an index
/// into that order or a `GPU-` UUID (or a unique prefix of one, from the
/// device's `information`); as in CUDA, the list ends at the first entry
/// that names no device or one already listed.
pub fn visible_gpus(
    root: &Path,
    cuda_visible_devices: Option<&str>,
) -> Result<Vec<String>, NumaError> {
    let dir = root.join("proc/driver/nvidia/gpus");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NumaError::NoGpus { dir });
        }
        Err(source) => return Err(NumaError::Read { path: dir, source }),
    };
    let mut all: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|name| pci_function_zero(&name.to_ascii_lowercase()))
        .collect();
    all.sort();
    all.dedup();
    if all.is_empty() {
        return Err(NumaError::NoGpus { dir });
    }
    let Some(list) = cuda_visible_devices else {
        return Ok(all);
    };
    let mut visible: Vec<String> = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let found = if entry.starts_with("MIG-") {
            return Err(NumaError::MigDevice {
                entry: entry.to_owned(),
            });
        } else if entry.starts_with("GPU-") {
            by_uuid(&dir, &all, entry)
        } else {
            entry
                .parse::<usize>()
                .ok()
                .and_then(|i| all.get(i).cloned())
        };
        match found {
            Some(addr) if !visible.contains(&addr) => visible.push(addr),
            _ => break,
        }
    }
    Ok(visible)
}

/// The device whose UUID `prefix` begins, if exactly one.
fn by_uuid(dir: &Path, all: &[String], prefix: &str) -> Option<String> {
    let mut matching = all.iter().filter(|addr| {
        std::fs::read_to_string(dir.join(addr).join("information")).is_ok_and(|info| {
            info.lines().any(|l| {
                l.split_once(':')
                    .is_some_and(|(k, v)| k.trim() == "GPU UUID" && v.trim().starts_with(prefix))
            })
        })
    });
    let one = matching.next()?;
    matching.next().is_none().then(|| one.clone())
}

/// `domain:bus:device.0`: torch builds the address of function 0 from the
/// device's domain, bus and device numbers.
fn pci_function_zero(addr: &str) -> String {
    match addr.rsplit_once('.') {
        Some((dev, _)) => format!("{dev}.0"),
        None => addr.to_owned(),
    }
}

fn read(path: &Path) -> Result<String, NumaError> {
    std::fs::read_to_string(path).map_err(|source| NumaError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse_error(path: &Path, text: &str, why: &str) -> NumaError {
    NumaError::Parse {
        path: path.to_owned(),
        text: accel_input::excerpt(text.trim()).to_string(),
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests;
