//! Topology-aware node ranks (docs/src/topology.md): segments get
//! contiguous ranks with numbers compared as numbers, and a killed node's
//! rank goes to a spare of its own segment while every other node keeps its
//! rank.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use accel_tests::{as_host, eventually, records, scratch, Agent, AgentCmd, Record, Server};

const LIMIT: Duration = Duration::from_secs(60);

fn agent(server: &Server, dir: &std::path::Path, name: &str, topology: &str) -> Agent {
    AgentCmd::c10d(&server.addr, "topo")
        .nnodes("4:4")
        .nproc(2)
        .conf("keep_alive_interval=0.3,keep_alive_max_attempt=2")
        .flag("--topology", topology)
        .recording(dir, name)
        .env("RECORD_EACH_ROUND", "1")
        // Every round runs until the test stops the job.
        .env("RUN_FOR", "600")
        .start(dir, name)
}

/// The records of workers started after `since`, once there are `n` of them.
fn started_after(dir: &std::path::Path, since: f64, n: usize) -> Option<Vec<Record>> {
    let recs: Vec<Record> = records(dir)
        .into_iter()
        .filter(|r| r.start > since)
        .collect();
    (recs.len() == n).then_some(recs)
}

/// Each agent's node rank and segment variables in `recs`.
fn nodes(recs: &[Record]) -> BTreeMap<String, (u32, String, u32, u32, u32)> {
    let mut out = BTreeMap::new();
    for r in recs {
        let n = |k: &str| r.var(k).parse::<u32>().expect(k);
        let row = (
            n("GROUP_RANK"),
            r.var("ACCEL_TOPOLOGY").to_owned(),
            n("ACCEL_SEGMENT"),
            n("ACCEL_SEGMENT_FIRST_NODE"),
            n("ACCEL_SEGMENT_NODES"),
        );
        let prev = out.insert(r.var("AGENT_TAG").to_owned(), row.clone());
        assert!(
            prev.is_none_or(|p| p == row),
            "two ranks of one agent disagree: {recs:#?}"
        );
    }
    out
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

#[test]
fn segments_get_contiguous_ranks_and_a_killed_node_s_rank_goes_to_its_segment_s_spare() {
    let server = Server::start();
    let dir = scratch("topology");
    let t0 = now();
    // Joining in an order that is neither the racks' nor the text's.
    let mut agents: BTreeMap<&str, Agent> = [
        ("a", "dc/rack-10"),
        ("b", "dc/rack-9"),
        ("c", "dc/rack-10"),
        ("d", "dc/rack-9"),
    ]
    .into_iter()
    .map(|(name, topo)| (name, agent(&server, &dir, name, topo)))
    .collect();
    let mut first = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            first = started_after(&dir, t0, 8);
            first.is_some()
        }),
        "the first round ran 8 workers: {:#?}",
        records(&dir)
    );
    let first = nodes(&first.expect("first round"));
    // rack-9 before rack-10 (as numbers), each rack one run of two ranks.
    let mut by_rack: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (rank, topo, segment, first_node, count) in first.values() {
        by_rack.entry(topo).or_default().push(*rank);
        let expected = if topo == "dc/rack-9" { (0, 0) } else { (1, 2) };
        assert_eq!(
            (*segment, *first_node, *count),
            (expected.0, expected.1, 2),
            "{first:?}"
        );
    }
    for ranks in by_rack.values_mut() {
        ranks.sort();
    }
    assert_eq!(by_rack["dc/rack-9"], [0, 1], "{first:?}");
    assert_eq!(by_rack["dc/rack-10"], [2, 3], "{first:?}");

    // Spares of both racks wait beyond MAX.
    for (name, topo) in [("s10", "dc/rack-10"), ("s9", "dc/rack-9")] {
        let spare = agent(&server, &dir, name, topo);
        assert!(
            eventually(Duration::from_secs(10), || std::fs::read_to_string(
                &spare.stderr
            )
            .unwrap_or_default()
            .contains("waiting as a spare")),
            "{name} says it waits as a spare"
        );
        agents.insert(name, spare);
    }
    let killed_name = first
        .iter()
        .find(|(_, row)| row.1 == "dc/rack-9")
        .map(|(name, _)| name.clone())
        .expect("a rack-9 node");
    let killed_rank = first[&killed_name].0;
    let t1 = now();
    let killed = agents.remove(killed_name.as_str()).expect("agent");
    killed.signal("KILL");
    let _ = killed.wait(LIMIT);
    let mut second = None;
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || {
            second = started_after(&dir, t1, 8);
            second.is_some()
        }),
        "the job re-formed with 4 nodes after {:?}: {:#?}",
        started.elapsed(),
        records(&dir)
    );
    let second = nodes(&second.expect("second round"));
    assert_eq!(
        second.get("s9").map(|row| row.0),
        Some(killed_rank),
        "rack-9's spare took the rank of {killed_name}: first {first:?}, then {second:?}"
    );
    assert!(
        !second.contains_key("s10"),
        "rack-10's spare still waits: {second:?}"
    );
    for (name, row) in &first {
        if *name != killed_name {
            assert_eq!(second[name], *row, "{name} kept its rank and segment");
        }
    }
    for (_, agent) in agents {
        agent.signal("TERM");
        let _ = agent.wait(LIMIT);
    }
}

#[test]
fn a_malformed_topology_is_refused_at_start_with_the_rule() {
    let dir = scratch("topology-bad");
    let out = AgentCmd::standalone()
        .nproc(1)
        .flag("--topology", "rack 3")
        .no_python("true", &[])
        .start(&dir, "bad")
        .wait(LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("--topology") && out.stderr.contains("zone-a/rack-3/nvl-0"),
        "{}",
        out.stderr
    );
}

/// Writes, in a directory of its own under `dir`, an `nvidia-smi` that
/// answers `-q` as a node of two GPUs in NVLink domain `clique` of cluster
/// `cluster` would (State Completed, Status Success); returns a `PATH` with
/// that directory first, for the agent `name`.
fn fake_nvidia_smi(dir: &std::path::Path, name: &str, cluster: &str, clique: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join(format!("smi-{name}"));
    std::fs::create_dir_all(&bin).expect("bin dir");
    let gpu = |bus: &str| {
        format!(
            "GPU 00000008:{bus}:00.0\n    Product Name                          : NVIDIA GB200\n    \
             Fabric\n        State                             : Completed\n        \
             Status                            : Success\n        \
             CliqueId                          : {clique}\n        \
             ClusterUUID                       : {cluster}\n        \
             Health\n            Bandwidth                     : Full\n    \
             Processes                             : None\n"
        )
    };
    let script = format!(
        "#!/bin/sh\n\
         [ \"$*\" = -q ] || {{ echo \"fake nvidia-smi: unsupported: $*\" >&2; exit 2; }}\n\
         cat <<'EOF'\n\n==============NVSMI LOG==============\n\n\
         Attached GPUs                             : 2\n{}\n{}EOF\n",
        gpu("01"),
        gpu("02")
    );
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, script).expect("fake nvidia-smi");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn without_a_given_path_the_gpus_nvlink_domain_from_nvidia_smi_orders_the_ranks() {
    let server = Server::start();
    let dir = scratch("topology-nvl");
    let (one, two) = (
        "aaaaaaaa-0000-4000-8000-000000000001",
        "bbbbbbbb-0000-4000-8000-000000000002",
    );
    // Joining in an order that is not the domains'. a and d share a domain;
    // b has the same cluster but another clique; c the same clique id in
    // another cluster (a clique id is unique only within its cluster).
    let agents: Vec<(&str, Agent)> = [
        ("a", one, 32766),
        ("c", two, 4026),
        ("d", one, 32766),
        ("b", one, 4026),
    ]
    .into_iter()
    .map(|(name, cluster, clique)| {
        let agent = AgentCmd::c10d(&server.addr, "topo-nvl")
            .nnodes("4:4")
            .nproc(1)
            .env("PATH", fake_nvidia_smi(&dir, name, cluster, clique))
            .recording(&dir, name)
            .env("RUN_FOR", "0.5")
            .start(&dir, name);
        (name, agent)
    })
    .collect();
    for (name, agent) in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{name}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("topology path from the GPUs' NVLink domain"),
            "{name} says where its path came from: {}",
            out.stderr
        );
        // nvidia-smi ran before the agent hid its secrets, which it can
        // do only while it has one thread: none was left running.
        assert!(
            !out.stderr.contains("more than one thread"),
            "{name}: {}",
            out.stderr
        );
    }
    let nodes = nodes(&records(&dir));
    let row =
        |rank, topology: String, segment, first, count| (rank, topology, segment, first, count);
    // The clique ids compare as numbers: 4026 before 32766.
    assert_eq!(
        nodes["b"],
        row(0, format!("nvl-{one}/4026"), 0, 0, 1),
        "{nodes:?}"
    );
    assert_eq!(
        nodes["c"],
        row(3, format!("nvl-{two}/4026"), 2, 3, 1),
        "{nodes:?}"
    );
    let mut shared: Vec<_> = [&nodes["a"], &nodes["d"]].into_iter().cloned().collect();
    shared.sort();
    assert_eq!(
        shared,
        [
            row(1, format!("nvl-{one}/32766"), 1, 1, 2),
            row(2, format!("nvl-{one}/32766"), 1, 1, 2)
        ],
        "{nodes:?}"
    );
}

/// Hosts `node10`, `node2` and `node1` (each a host of its own) name one
/// segment three ways (a flag, a file, Slurm's variables): ranks follow the
/// host names as numbers, and a restart keeps them.
#[test]
fn one_segment_from_three_sources_orders_hosts_as_numbers_and_a_restart_keeps_the_order() {
    let server = Server::start();
    let dir = scratch("topology-hosts");
    let file = dir.join("topology");
    std::fs::write(&file, "dc/rack-1\n").expect("topology file");
    let start = |host: &str| {
        let cmd = AgentCmd::c10d(&server.addr, "hosts")
            .nnodes(3)
            .nproc(1)
            .max_restarts(1)
            .recording(&dir, host)
            .env("RUN_FOR", "1")
            // Global rank 0 fails once: one counted restart.
            .env("FAIL_RANKS", "0")
            .env("FAIL_UNTIL", "1");
        let cmd = match host {
            "node10" => cmd.flag("--topology", "dc/rack-1"),
            "node2" => cmd.flag("--topology-file", file.display()),
            _ => cmd
                .env("SLURM_TOPOLOGY_ADDR", "dc.rack-1.node1")
                .env("SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node"),
        };
        let prefix = as_host(host);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        cmd.start_with(&prefix, &dir, host)
    };
    let agents: Vec<_> = ["node10", "node2", "node1"]
        .into_iter()
        .map(|h| (h, start(h)))
        .collect();
    for (host, a) in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{host}: {}", out.stderr);
    }
    let recs = records(&dir);
    for attempt in ["0", "1"] {
        let round: Vec<Record> = recs
            .iter()
            .filter(|r| r.var("TORCHELASTIC_RESTART_COUNT") == attempt)
            .cloned()
            .collect();
        let ranks: BTreeMap<String, (u32, String, u32, u32, u32)> = nodes(&round);
        let order: Vec<(&str, u32)> = ranks.iter().map(|(h, row)| (h.as_str(), row.0)).collect();
        assert_eq!(
            order,
            [("node1", 0), ("node10", 2), ("node2", 1)],
            "attempt {attempt}: {ranks:?}"
        );
        for row in ranks.values() {
            assert_eq!(
                (row.1.as_str(), row.2, row.3, row.4),
                ("dc/rack-1", 0, 0, 3),
                "{ranks:?}"
            );
        }
    }
}
