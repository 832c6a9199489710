use super::*;

/// A fake machine's `/` in a temporary directory.
struct Fake {
    dir: tempfile::TempDir,
}

const GPUS: [&str; 4] = [
    "0000:1a:00.0",
    "0000:3b:00.0",
    "0000:88:00.0",
    "0000:b1:00.0",
];

impl Fake {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn file(&self, rel: &str, text: &str) {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    fn gpu(&self, addr: &str, node: i64, uuid: &str) {
        self.file(
            &format!("proc/driver/nvidia/gpus/{addr}/information"),
            &format!("Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nBus Location: \t {addr}\n"),
        );
        self.file(
            &format!("sys/bus/pci/devices/{addr}/numa_node"),
            &format!("{node}\n"),
        );
    }

    fn node(&self, node: u32, cpus: &str) {
        self.file(
            &format!("sys/devices/system/node/node{node}/cpulist"),
            &format!("{cpus}\n"),
        );
    }

    /// CPU `cpu` in `package`, sharing its core with `siblings` and its
    /// last-level (L3) cache with `l3`; L1 and L2 are per core.
    fn cpu(&self, cpu: u32, package: u32, siblings: &str, l3: &str) {
        let base = format!("sys/devices/system/cpu/cpu{cpu}");
        self.file(
            &format!("{base}/topology/physical_package_id"),
            &format!("{package}\n"),
        );
        self.file(
            &format!("{base}/topology/thread_siblings_list"),
            &format!("{siblings}\n"),
        );
        for (index, level, kind, shared) in [
            (0, 1, "Data", siblings),
            (1, 1, "Instruction", siblings),
            (2, 2, "Unified", siblings),
            (3, 3, "Unified", l3),
        ] {
            let dir = format!("{base}/cache/index{index}");
            self.file(&format!("{dir}/level"), &format!("{level}\n"));
            self.file(&format!("{dir}/type"), &format!("{kind}\n"));
            self.file(&format!("{dir}/shared_cpu_list"), &format!("{shared}\n"));
        }
        self.file(&format!("{base}/cache/uevent"), "");
    }

    /// Two sockets, one NUMA node each, 4 cores with 2 hyperthreads per
    /// node (core k is CPUs k and k+8), two L3 groups per node, and two GPUs
    /// per node (`GPUS`, the first two on node 0).
    fn two_sockets() -> Self {
        let f = Self::new();
        f.file("sys/devices/system/node/possible", "0-1\n");
        f.node(0, "0-3,8-11");
        f.node(1, "4-7,12-15");
        for core in 0..8u32 {
            let package = core / 4;
            let siblings = format!("{core},{}", core + 8);
            let first = core - core % 2;
            let l3 = format!("{first}-{},{}-{}", first + 1, first + 8, first + 9);
            f.cpu(core, package, &siblings, &l3);
            f.cpu(core + 8, package, &siblings, &l3);
        }
        for (i, addr) in GPUS.iter().enumerate() {
            f.gpu(addr, (i / 2) as i64, &format!("GPU-{i}{i}{i}-uuid"));
        }
        f
    }

    fn machine(&self, allowed: &str) -> Machine {
        let gpus = visible_gpus(self.root(), None).expect("gpus");
        Machine::new(self.root(), gpus, CpuList::parse(allowed).expect("allowed"))
    }
}

fn list(s: &str) -> CpuList {
    CpuList::parse(s).expect("cpu list")
}

fn plan(m: &Machine, mode: AffinityMode, nproc: u32) -> Vec<String> {
    m.plan(mode, nproc, None)
        .expect("plan")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn cpu_lists_read_and_print_as_the_kernel_writes_them() {
    assert_eq!(list("0-2,4,6-7\n").to_string(), "0-2,4,6-7");
    assert_eq!(list(" 3 , 1 ").to_string(), "1,3");
    assert_eq!(list("\n"), CpuList::default());
    assert_eq!(CpuList::default().to_string(), "(none)");
    assert!(CpuList::parse("3-1").is_err());
    assert!(CpuList::parse("a").is_err());
    assert!(
        CpuList::parse("0-99999999").is_err(),
        "a corrupt range is refused, not allocated"
    );
}

#[test]
fn node_binds_each_rank_to_its_gpus_node() {
    let f = Fake::two_sockets();
    let m = f.machine("0-15");
    assert_eq!(
        plan(&m, AffinityMode::Node, 4),
        ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]
    );
}

#[test]
fn only_cpus_the_agent_may_use_are_given() {
    let f = Fake::two_sockets();
    let m = f.machine("0-7");
    assert_eq!(plan(&m, AffinityMode::Node, 3), ["0-3", "0-3", "4-7"]);
}

#[test]
fn socket_takes_every_node_of_the_gpus_package() {
    let f = Fake::two_sockets();
    assert_eq!(
        plan(&f.machine("0-15"), AffinityMode::Socket, 4),
        ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"],
        "one node per socket: as node"
    );
    // Both nodes in package 0, plus a CPU-less node and one the kernel
    // lists as possible but does not have: those add nothing.
    for cpu in 0..16 {
        f.file(
            &format!("sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
            "0\n",
        );
    }
    f.file("sys/devices/system/node/possible", "0-3\n");
    f.node(2, "");
    assert_eq!(
        plan(&f.machine("0-15"), AffinityMode::Socket, 3),
        ["0-15", "0-15", "0-15"]
    );
}

#[test]
fn exclusive_divides_a_nodes_physical_cores_keeping_hyperthreads_together() {
    let f = Fake::two_sockets();
    assert_eq!(
        plan(&f.machine("0-15"), AffinityMode::Exclusive, 4),
        ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]
    );
    // A third GPU on node 0: 4 cores for 3 GPUs, the first gets the extra one.
    f.gpu("0000:1b:00.0", 0, "GPU-x");
    let m = f.machine("0-15");
    assert_eq!(
        plan(&m, AffinityMode::Exclusive, 5),
        ["0-1,8-9", "2,10", "3,11", "4-5,12-13", "6-7,14-15"]
    );
}

#[test]
fn exclusive_counts_every_visible_gpu_on_the_node_not_only_local_ranks() {
    let f = Fake::two_sockets();
    // One worker, but GPU 1 is on the same node: GPU 0 gets half the cores.
    assert_eq!(
        plan(&f.machine("0-15"), AffinityMode::Exclusive, 1),
        ["0-1,8-9"]
    );
}

#[test]
fn exclusive_needs_a_core_per_gpu() {
    let f = Fake::two_sockets();
    let m = f.machine("0,8");
    let err = m
        .plan(AffinityMode::Exclusive, 1, None)
        .expect_err("one core, two GPUs");
    assert!(
        matches!(
            err,
            NumaError::TooFewCores {
                node: 0,
                cores: 1,
                gpus: 2
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("--numa-binding node"), "{err}");
}

#[test]
fn core_complex_gives_each_gpu_a_last_level_cache_group() {
    let f = Fake::two_sockets();
    assert_eq!(
        plan(&f.machine("0-15"), AffinityMode::CoreComplex, 4),
        ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]
    );
    // Larger groups first; a third GPU on the node wraps around to the first.
    f.gpu("0000:1b:00.0", 0, "GPU-x");
    let m = f.machine("0-2,8-10");
    assert_eq!(
        plan(&m, AffinityMode::CoreComplex, 3),
        ["0-1,8-9", "2,10", "0-1,8-9"]
    );
}

#[test]
fn core_complex_needs_a_data_or_unified_cache() {
    let f = Fake::two_sockets();
    for index in [0, 2, 3] {
        f.file(
            &format!("sys/devices/system/cpu/cpu0/cache/index{index}/type"),
            "Instruction\n",
        );
    }
    let err = f
        .machine("0-15")
        .plan(AffinityMode::CoreComplex, 1, None)
        .expect_err("no cache");
    assert!(matches!(err, NumaError::NoCache { cpu: 0, .. }), "{err:?}");
}

#[test]
fn a_gpu_without_numa_information_is_on_node_0() {
    let f = Fake::new();
    f.node(0, "0-1");
    f.gpu("0000:01:00.0", -1, "GPU-a");
    assert_eq!(plan(&f.machine("0-1"), AffinityMode::Node, 1), ["0-1"]);
}

#[test]
fn no_gpu_is_a_clear_error() {
    let f = Fake::new();
    let err = visible_gpus(f.root(), None).expect_err("no driver");
    assert!(matches!(err, NumaError::NoGpus { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("--numa-binding") && text.contains("no NVIDIA GPU"),
        "{text}"
    );
    assert!(
        text.contains("Found no NVIDIA driver on your system"),
        "{text}"
    );
    std::fs::create_dir_all(f.root().join("proc/driver/nvidia/gpus")).expect("mkdir");
    assert!(matches!(
        visible_gpus(f.root(), None),
        Err(NumaError::NoGpus { .. })
    ));
}

#[test]
fn more_ranks_than_gpus_is_a_clear_error() {
    let f = Fake::two_sockets();
    let gpus = visible_gpus(f.root(), Some("3")).expect("gpus");
    let m = Machine::new(f.root(), gpus, list("0-15"));
    let err = m
        .plan(AffinityMode::Node, 2, Some("3"))
        .expect_err("two ranks, one GPU");
    assert!(
        matches!(
            err,
            NumaError::TooFewGpus {
                rank: 1,
                visible: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("--nproc-per-node 1") && text.contains("CUDA_VISIBLE_DEVICES=3"),
        "{text}"
    );
    assert!(matches!(
        m.cpus_for(AffinityMode::Socket, 1),
        Err(NumaError::TooFewGpus {
            rank: 1,
            visible: 1,
            ..
        })
    ));
}

#[test]
fn cuda_visible_devices_picks_and_orders_gpus_as_cuda_does() {
    let f = Fake::two_sockets();
    let visible = |v: &str| visible_gpus(f.root(), Some(v)).expect("gpus");
    assert_eq!(visible("2,0"), [GPUS[2], GPUS[0]]);
    assert_eq!(
        visible("1,7,0"),
        [GPUS[1]],
        "the list ends at an index with no device"
    );
    assert_eq!(visible("3,3"), [GPUS[3]], "and at a repeated one");
    assert_eq!(
        visible("GPU-222,GPU-0"),
        [GPUS[2], GPUS[0]],
        "UUID prefixes"
    );
    assert_eq!(
        visible("GPU-"),
        Vec::<String>::new(),
        "an ambiguous prefix names nothing"
    );
    assert!(visible("").is_empty());
    assert!(matches!(
        visible_gpus(f.root(), Some("MIG-abc")),
        Err(NumaError::MigDevice { .. })
    ));
    // The worker of local rank 0 is bound for the first visible GPU.
    let m = Machine::new(f.root(), visible("2,0"), list("0-15"));
    assert_eq!(plan(&m, AffinityMode::Node, 2), ["4-7,12-15", "0-3,8-11"]);
}

#[test]
fn missing_or_bad_files_name_the_file() {
    let f = Fake::two_sockets();
    std::fs::remove_file(f.root().join("sys/devices/system/node/node1/cpulist")).expect("rm");
    let err = f
        .machine("0-15")
        .plan(AffinityMode::Node, 3, None)
        .expect_err("no cpulist");
    assert!(
        matches!(&err, NumaError::Read { path, .. } if path.ends_with("node1/cpulist")),
        "{err:?}"
    );
    f.file(
        &format!("sys/bus/pci/devices/{}/numa_node", GPUS[0]),
        "zero\n",
    );
    let err = f
        .machine("0-15")
        .plan(AffinityMode::Node, 1, None)
        .expect_err("bad node");
    assert!(
        matches!(&err, NumaError::Parse { text, .. } if text == "zero"),
        "{err:?}"
    );
    assert!(err.to_string().contains("numa_node"), "{err}");
}

#[test]
fn a_node_without_cpus_for_the_agent_is_a_clear_error() {
    let f = Fake::two_sockets();
    let err = f
        .machine("4-7")
        .plan(AffinityMode::Node, 1, None)
        .expect_err("confined");
    assert!(
        matches!(
            err,
            NumaError::NoCpus {
                node: 0,
                gpu: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("the agent's: 4-7"), "{err}");
}

#[test]
fn modes_are_spelled_as_torchrun_spells_them() {
    use clap::ValueEnum;
    let names: Vec<String> = AffinityMode::value_variants()
        .iter()
        .map(|m| {
            let name = m.to_possible_value().expect("value").get_name().to_owned();
            assert_eq!(name, m.as_str());
            name
        })
        .collect();
    assert_eq!(names, ["node", "socket", "exclusive", "core-complex"]);
}
