//! `--numa-binding`: the CPUs accel chooses equal the ones torch 2.13's own
//! code chooses for the same fake machines (`workers/numa_oracle.py` runs
//! `torch.numa.binding` with its reads moved under the fake root); real
//! workers, executed and forked from a zygote, run bound to them; and a
//! machine without GPUs is refused as torchrun refuses it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use accel_agent::numa::{AffinityMode, CpuList, Machine};
use accel_tests::{
    read_json, run_logged, scratch, venv, venv_path, with_private_hosts, worker, AgentCmd,
};
use serde_json::{json, Value};

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(240);

/// A fake machine's `/`: sysfs and the NVIDIA driver's GPU directories.
struct Fake {
    root: PathBuf,
}

impl Fake {
    fn new(root: PathBuf) -> Self {
        std::fs::create_dir_all(&root).expect("root");
        Self { root }
    }

    fn file(&self, rel: &str, text: &str) {
        let path = self.root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// A GPU at PCI address `addr` whose device says NUMA node `node`.
    fn gpu(&self, addr: &str, node: i64) {
        self.file(
            &format!("proc/driver/nvidia/gpus/{addr}/information"),
            &format!("GPU UUID: \t GPU-{addr}\nBus Location: \t {addr}\n"),
        );
        self.file(
            &format!("sys/bus/pci/devices/{addr}/numa_node"),
            &format!("{node}\n"),
        );
    }

    fn nodes(&self, cpulists: &[&str]) {
        self.file(
            "sys/devices/system/node/possible",
            &format!("0-{}\n", cpulists.len() - 1),
        );
        for (node, cpus) in cpulists.iter().enumerate() {
            self.file(
                &format!("sys/devices/system/node/node{node}/cpulist"),
                &format!("{cpus}\n"),
            );
        }
    }

    /// CPU `cpu` in `package`, its core shared with `siblings`, its L3 with
    /// `l3` (L1 data and instruction and L2 per core, listed first).
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
    }
}

/// Two sockets of one node each; 4 cores of 2 hyperthreads per node (core
/// k is CPUs k and k+8); two L3 groups per node; two GPUs per node.
fn two_sockets(root: PathBuf, possible_nodes: usize) -> (Fake, Vec<String>) {
    let f = Fake::new(root);
    let mut lists = vec!["0-3,8-11", "4-7,12-15"];
    lists.resize(possible_nodes, "");
    f.nodes(&lists);
    for core in 0..8u32 {
        let siblings = format!("{core},{}", core + 8);
        let first = core - core % 2;
        let l3 = format!("{first}-{},{}-{}", first + 1, first + 8, first + 9);
        f.cpu(core, core / 4, &siblings, &l3);
        f.cpu(core + 8, core / 4, &siblings, &l3);
    }
    let gpus = [
        "0000:1a:00.0",
        "0000:3b:00.0",
        "0000:88:00.0",
        "0000:b1:00.0",
    ];
    for (i, addr) in gpus.iter().enumerate() {
        f.gpu(addr, (i / 2) as i64);
    }
    (f, gpus.iter().map(|g| g.to_string()).collect())
}

/// One package, two nodes (AMD's NPS2): node 0 has 7 cores without
/// hyperthreads in L3 groups of 3, 2 and 2, node 1 has 9 in groups of 4 and
/// 5; four GPUs on node 0 (one whose device says -1) and one on node 1.
fn one_socket_two_nodes(root: PathBuf) -> (Fake, Vec<String>) {
    let f = Fake::new(root);
    f.nodes(&["0-6", "7-15"]);
    for (l3, cpus) in [
        ("0-2", 0..=2),
        ("3-4", 3..=4),
        ("5-6", 5..=6),
        ("7-10", 7..=10),
        ("11-15", 11..=15),
    ] {
        for cpu in cpus {
            f.cpu(cpu, 0, &cpu.to_string(), l3);
        }
    }
    let gpus = [
        ("0000:01:00.0", 0),
        ("0000:02:00.0", -1),
        ("0000:41:00.0", 1),
        ("0000:81:00.0", 0),
        ("0000:c1:00.0", 0),
    ];
    for (addr, node) in gpus {
        f.gpu(addr, node);
    }
    (f, gpus.iter().map(|(g, _)| g.to_string()).collect())
}

const MODES: [AffinityMode; 4] = [
    AffinityMode::Node,
    AffinityMode::Socket,
    AffinityMode::Exclusive,
    AffinityMode::CoreComplex,
];

#[test]
fn the_cpus_chosen_are_the_ones_torchs_own_code_chooses() {
    let _heavy = heavy();
    let dir = scratch("numa-oracle");
    let cases: Vec<(&str, Fake, Vec<String>, &str)> = {
        let (a, ga) = two_sockets(dir.join("a"), 2);
        let (b, gb) = two_sockets(dir.join("b"), 2);
        let (c, gc) = two_sockets(dir.join("c"), 2);
        let (d, gd) = one_socket_two_nodes(dir.join("d"));
        let (e, ge) = one_socket_two_nodes(dir.join("e"));
        let (g, gg) = two_sockets(dir.join("g"), 4);
        vec![
            ("two sockets", a, ga, "0-15"),
            (
                "two sockets, the agent on some CPUs and hyperthreads",
                b,
                gb,
                "1-5,8-13",
            ),
            ("two sockets, one core per node for the agent", c, gc, "0,4"),
            ("one socket, two nodes", d, gd, "0-15"),
            (
                "one socket, two nodes, the agent on some CPUs",
                e,
                ge,
                "1-5,7-9,12",
            ),
            ("two sockets and CPU-less nodes", g, gg, "0-15"),
        ]
    };
    let input: Vec<Value> = cases
        .iter()
        .map(|(_, f, gpus, allowed)| {
            let allowed: Vec<u32> = CpuList::parse(allowed).expect("list").iter().collect();
            json!({"root": f.root, "gpus": gpus, "allowed": allowed})
        })
        .collect();
    let mut oracle = Command::new(venv().join("bin/python"))
        .arg(worker("numa_oracle.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the oracle");
    serde_json::to_writer(oracle.stdin.take().expect("stdin"), &input).expect("write cases");
    let out = oracle.wait_with_output().expect("oracle");
    assert!(out.status.success(), "the oracle failed");
    let answers: Vec<Value> = serde_json::from_slice(&out.stdout).expect("oracle's JSON");
    assert_eq!(answers.len(), cases.len());

    let mut compared = 0;
    for ((name, f, gpus, allowed), torch) in cases.iter().zip(&answers) {
        let machine = Machine::new(
            &f.root,
            gpus.clone(),
            CpuList::parse(allowed).expect("list"),
        );
        for mode in MODES {
            for (gpu, theirs) in torch[mode.as_str()]
                .as_array()
                .expect("one answer per GPU")
                .iter()
                .enumerate()
            {
                let ours = machine.cpus_for(mode, gpu);
                let what = format!("{name}, {mode}, GPU {gpu}: torch {theirs}, accel {ours:?}");
                let deviation =
                    *name == "two sockets and CPU-less nodes" && mode == AffinityMode::Socket;
                match (&ours, theirs.get("error")) {
                    (Ok(cpus), None) => {
                        let cpus: Vec<u32> = cpus.iter().collect();
                        assert_eq!(json!(cpus), *theirs, "{what}");
                    }
                    (Err(_), Some(_)) => {}
                    // torch fails on a node without CPUs in the GPU's socket;
                    // accel leaves such a node out (it adds no CPU anyway).
                    (Ok(cpus), Some(e)) if deviation => {
                        assert!(
                            e.as_str().is_some_and(|e| e.starts_with("ValueError")),
                            "{what}"
                        );
                        let node = machine.cpus_for(AffinityMode::Node, gpu).expect("node");
                        assert_eq!(*cpus, node, "{what}: one node per socket here");
                    }
                    _ => panic!("{what}"),
                }
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 4 * (4 + 4 + 4 + 5 + 5 + 4));
    // The comparison covered successes and failures alike.
    let errors = answers
        .iter()
        .flat_map(|a| a.as_object().expect("modes").values())
        .flat_map(|v| v.as_array().expect("list"))
        .filter(|v| v.get("error").is_some())
        .count();
    assert!(
        (4..compared / 2).contains(&errors),
        "{errors} of {compared} answers are errors"
    );
}

/// Runs `accel-agent FLAGS --nproc-per-node 2 workers/affinity.py OUT` on the
/// fake machine at `root` and returns each rank's record and the agent's stderr.
fn bound_workers(dir: &Path, root: &Path, name: &str, flags: &[&str]) -> (Vec<Value>, String) {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).expect("out");
    let cmd = AgentCmd::standalone()
        .nproc(2)
        .flags(flags)
        .env("ACCEL_NUMA_ROOT", root.display())
        .env("OMP_NUM_THREADS", 1)
        .program(worker("affinity.py"), &[out.to_str().expect("path")]);
    let mut c = cmd.command();
    c.env("PATH", venv_path()).env("ACCEL_LOG", "info");
    let done = run_logged(c, dir, name, LIMIT);
    assert!(done.status.success(), "{name}:\n{}", done.stderr);
    let records = (0..2)
        .map(|r| read_json(&out.join(format!("affinity_{r}.json"))))
        .collect();
    (records, done.stderr)
}

fn bound_to(cpu: u32) -> Value {
    json!({"affinity": [cpu], "cpus_allowed_list": cpu.to_string(), "thread": [cpu]})
}

#[test]
fn workers_run_bound_to_their_gpus_node_executed_or_forked() {
    let dir = scratch("numa-bind");
    // The first two CPUs this agent may use (0 and 1 here): GPU 0 on
    // node 0 = {a}, GPU 1 on node 1 = {b}.
    let all = own_cpus();
    let [a, b, ..] = all[..] else {
        panic!("this test needs an agent allowed on two CPUs or more, this one has {all:?}");
    };
    let fake = Fake::new(dir.join("root"));
    fake.nodes(&[&a.to_string(), &b.to_string()]);
    fake.gpu("0000:07:00.0", 0);
    fake.gpu("0000:09:00.0", 1);
    let (records, stderr) = bound_workers(&dir, &fake.root, "cold", &["--numa-binding", "node"]);
    assert_eq!(records, [bound_to(a), bound_to(b)], "{stderr}");
    let logged = format!("--numa-binding: local rank 0: CPUs {a}; local rank 1: CPUs {b}");
    assert!(stderr.contains(&logged), "{stderr}");

    // The other way round, hot-started from a zygote, the other spelling.
    fake.gpu("0000:07:00.0", 1);
    fake.gpu("0000:09:00.0", 0);
    let (records, stderr) = bound_workers(
        &dir,
        &fake.root,
        "hot",
        &["--numa_binding=node", "--preload", "json"],
    );
    assert!(
        stderr.contains("zygote ready") && !stderr.contains("start cold"),
        "{stderr}"
    );
    assert_eq!(records, [bound_to(b), bound_to(a)], "{stderr}");

    // Without the flag, workers keep the agent's CPUs.
    let (records, _) = bound_workers(&dir, &fake.root, "unbound", &[]);
    for r in &records {
        assert_eq!(r["affinity"], json!(all));
    }
}

/// This process's CPUs, from the kernel's status file.
fn own_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list");
    CpuList::parse(list).expect("list").iter().collect()
}

#[test]
fn without_gpus_numa_binding_is_refused_as_torchrun_refuses_it() {
    let _heavy = heavy();
    let dir = scratch("numa-no-gpu");
    assert!(
        !Path::new("/proc/driver/nvidia/gpus").exists(),
        "this test checks a machine without NVIDIA GPUs"
    );
    let ran = dir.join("ran");
    let cmd = AgentCmd::standalone()
        .nproc(2)
        .flag("--numa-binding", "exclusive")
        .no_python("touch", &[ran.to_str().expect("path")]);
    let out = run_logged(cmd.command(), &dir, "accel", LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(!ran.exists(), "no worker starts");
    assert!(
        out.stderr.contains("accel-agent: error: --numa-binding")
            && out.stderr.contains("no NVIDIA GPU")
            && out.stderr.contains("run without --numa-binding"),
        "{}",
        out.stderr
    );
    // torchrun: the same machine, the same refusal (as a traceback, exit 1).
    let script = dir.join("w.py");
    std::fs::write(&script, "").expect("script");
    let torchrun = venv().join("bin/torchrun");
    let mut c = with_private_hosts(
        &dir,
        &[
            torchrun.to_str().expect("path"),
            "--standalone",
            "--nproc-per-node",
            "2",
            "--numa-binding",
            "exclusive",
            script.to_str().expect("path"),
        ],
    );
    c.env("PATH", venv_path());
    let theirs = run_logged(c, &dir, "torchrun", LIMIT);
    assert_ne!(theirs.code(), 0);
    assert!(
        theirs
            .stderr
            .contains("Found no NVIDIA driver on your system"),
        "{}",
        theirs.stderr
    );
}
