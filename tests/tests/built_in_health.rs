//! The built-in health checks (`--health-check-nic`, `-storage`, `-gpu`,
//! `-endpoint`) and `--health-check-interval`, run by real agents against
//! fakes they read the same way as the real thing: a sysfs tree, an
//! `nvidia-smi` on PATH, a full filesystem, a health daemon.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use accel_tests::{bin, eventually, records, scratch, Agent, AgentCmd, Server};

const LIMIT: Duration = Duration::from_secs(60);

/// A sysfs tree with one physical interface `eth0` in `state`.
fn fake_sysfs(dir: &Path, state: &str) -> PathBuf {
    let root = dir.to_path_buf();
    let eth = root.join("class/net/eth0");
    std::fs::create_dir_all(eth.join("statistics")).expect("fake sysfs");
    std::fs::create_dir_all(eth.join("device")).expect("fake sysfs");
    std::fs::write(eth.join("statistics/rx_errors"), "0\n").expect("fake sysfs");
    std::fs::write(eth.join("statistics/tx_errors"), "0\n").expect("fake sysfs");
    set_link(&root, state);
    root
}

/// Sets the fake `eth0`'s operstate (and its carrier with it).
fn set_link(sysfs: &Path, state: &str) {
    let eth = sysfs.join("class/net/eth0");
    let carrier = if state == "up" { "1\n" } else { "0\n" };
    std::fs::write(eth.join("carrier"), carrier).expect("fake sysfs");
    std::fs::write(eth.join("operstate"), format!("{state}\n")).expect("fake sysfs");
}

fn stderr_of(agent: &Agent) -> String {
    std::fs::read_to_string(&agent.stderr).unwrap_or_default()
}

/// Five agents, `--nnodes 2:8 --nnodes-multiple-of 2`, each checking its
/// own fake NIC every second: four run, one waits as a spare. One running
/// node's NIC goes down: within an interval it stops its workers and leaves;
/// the spare takes its node rank; nothing of the restart budget is spent.
/// When its NIC is back the node joins again (as the spare now), and the
/// job ends 0 on every node.
#[test]
fn a_node_whose_nic_goes_down_mid_round_leaves_and_the_spare_takes_its_rank() {
    let server = Server::start();
    let dir = scratch("nic-down");
    let conf = "last_call_timeout=1,keep_alive_interval=0.3,keep_alive_max_attempt=2";
    let tags = ["a", "b", "c", "d", "e"];
    let sysfs: Vec<PathBuf> = tags
        .iter()
        .map(|t| fake_sysfs(&dir.join(format!("sysfs-{t}")), "up"))
        .collect();
    let agents: Vec<Agent> = tags
        .iter()
        .zip(&sysfs)
        .map(|(t, s)| {
            AgentCmd::c10d(&server.addr, "nic")
                .nnodes("2:8")
                .flag("--nnodes-multiple-of", 2)
                .flag("--health-check-nic", "eth0")
                .flag("--health-check-sysfs", s.display())
                .flag("--health-check-interval", 1)
                .nproc(2)
                .conf(conf)
                .recording(&dir, t)
                .env("RECORD_EACH_ROUND", "1")
                .env("RUN_FOR", "12")
                .env("ON_SIGTERM", "exit")
                .start(&dir, t)
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || records(&dir).len() == 8),
        "four nodes run"
    );
    let recs = records(&dir);
    let running: std::collections::BTreeSet<String> =
        recs.iter().map(|r| r.var("AGENT_TAG").to_owned()).collect();
    assert_eq!(running.len(), 4, "{running:?}");
    let spare = tags
        .iter()
        .position(|t| !running.contains(*t))
        .expect("a spare");
    assert!(
        eventually(Duration::from_secs(10), || stderr_of(&agents[spare])
            .contains("waiting as a spare")),
        "the fifth waits as a spare"
    );
    let victim = tags
        .iter()
        .position(|t| running.contains(*t))
        .expect("a running node");
    let victim_rank = recs
        .iter()
        .find(|r| r.var("AGENT_TAG") == tags[victim])
        .expect("its record")
        .var("GROUP_RANK")
        .to_owned();
    let down = Instant::now();
    set_link(&sysfs[victim], "down");
    assert!(
        eventually(Duration::from_secs(10), || records(&dir)
            .iter()
            .any(|r| r.var("AGENT_TAG") == tags[spare])),
        "the spare runs in the lost node's place"
    );
    let took = down.elapsed();
    eprintln!("nic-down: the spare's workers ran {took:?} after the link went down");
    // One interval to notice, a stop, a re-formed round.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let recs = records(&dir);
    let spare_recs: Vec<_> = recs
        .iter()
        .filter(|r| r.var("AGENT_TAG") == tags[spare])
        .collect();
    assert!(
        spare_recs
            .iter()
            .all(|r| r.var("GROUP_RANK") == victim_rank),
        "the spare took node rank {victim_rank}: {:?}",
        spare_recs
            .iter()
            .map(|r| r.var("GROUP_RANK"))
            .collect::<Vec<_>>()
    );
    let said = stderr_of(&agents[victim]);
    assert!(
        said.contains("failed its health check") && said.contains("nic eth0: operstate down"),
        "{said}"
    );
    // Its workers were stopped (SIGTERM), not left running beside the spare.
    let victim_recs: Vec<_> = records(&dir)
        .into_iter()
        .filter(|r| r.var("AGENT_TAG") == tags[victim])
        .collect();
    assert!(
        !victim_recs.is_empty() && victim_recs.iter().all(|r| r.signal == Some(15)),
        "{victim_recs:?}"
    );
    let others = stderr_of(&agents[(victim + 1) % 5]) + &stderr_of(&agents[(victim + 2) % 5]);
    assert!(
        others.contains("failed its health check (nic eth0: operstate down)"),
        "the others hear why: {others}"
    );
    // The node keeps checking and joins again once its link is back.
    set_link(&sysfs[victim], "up");
    assert!(
        eventually(Duration::from_secs(15), || stderr_of(&agents[victim])
            .contains("the health check passes")),
        "{}",
        stderr_of(&agents[victim])
    );
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert!(
        recs.iter().all(|r| r.var("WORLD_SIZE") == "8"),
        "every round ran with four nodes"
    );
    assert!(
        recs.iter()
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"),
        "no restart counted"
    );
}

/// Writes an executable `nvidia-smi` into `dir` that answers the query with
/// `line`.
fn fake_nvidia_smi(dir: &Path, line: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("dir");
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            "#!/bin/sh\ncase \"$1\" in --query-gpu=*) echo '{line}';; --query-compute-apps=*) ;; esac\n"
        ),
    )
    .expect("write");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir.to_path_buf()
}

fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A node whose `nvidia-smi` reports an uncorrectable ECC error never
/// joins, nor does one whose kernel log has a fatal XID: the job forms and
/// runs with the healthy node alone, and the sick ones say why they stay
/// out.
#[test]
fn a_gpu_with_an_uncorrectable_ecc_error_keeps_its_node_out_before_it_joins() {
    let server = Server::start();
    let dir = scratch("gpu-ecc");
    let good = fake_nvidia_smi(
        &dir.join("good"),
        "0, 00000000:18:00.0, Enabled, 0, No, No, No",
    );
    let bad = fake_nvidia_smi(
        &dir.join("bad"),
        "0, 00000000:18:00.0, Enabled, 2, No, No, No",
    );
    // The kernel log as /dev/kmsg gives it, and as syslog keeps it.
    let (clean_log, xid_log) = (dir.join("kmsg-clean"), dir.join("kern.log"));
    std::fs::write(
        &clean_log,
        "6,100,1000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n",
    )
    .expect("log");
    std::fs::write(
        &xid_log,
        "Dec  7 10:04:00 n1 kernel: [ 88.2] NVRM: Xid (PCI:0000:18:00): 79, pid=3120, GPU has fallen off the bus.\n",
    )
    .expect("log");
    let agent = |tag: &str, smi: &Path, log: &Path| {
        AgentCmd::c10d(&server.addr, "ecc")
            .nnodes("1:3")
            .arg("--health-check-gpu")
            .arg(&format!("--health-check-kernel-log={}", log.display()))
            .nproc(1)
            .conf("last_call_timeout=2")
            .recording(&dir, tag)
            .env("PATH", path_with(smi))
            .env("RUN_FOR", "1")
            .start(&dir, tag)
    };
    let sick = agent("sick", &bad, &clean_log);
    let xid = agent("xid", &good, &xid_log);
    for a in [&sick, &xid] {
        assert!(
            eventually(Duration::from_secs(20), || stderr_of(a)
                .contains("this node is unhealthy")),
            "{}",
            stderr_of(a)
        );
    }
    let well = agent("well", &good, &clean_log);
    let out = well.wait(LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let recs = records(&dir);
    assert!(
        !recs.is_empty() && recs.iter().all(|r| r.var("AGENT_TAG") == "well"),
        "only the healthy node ran"
    );
    assert!(recs.iter().all(|r| r.var("WORLD_SIZE") == "1"));
    sick.signal("TERM");
    let out = sick.wait(LIMIT);
    assert!(
        out.stderr.contains(
            "gpu 0 (00000000:18:00.0): 2 uncorrectable ECC errors since the driver loaded"
        ),
        "{}",
        out.stderr
    );
    xid.signal("TERM");
    let out = xid.wait(LIMIT);
    assert!(
        out.stderr
            .contains("PCI 0000:18:00: Xid 79 (fell off the bus) in the kernel log"),
        "{}",
        out.stderr
    );
    // No nvidia-smi at all: the flag is refused at start, naming the fix.
    let out = Command::new(bin("accel-agent"))
        .args(["--standalone", "--health-check-gpu", "--no-python", "true"])
        .env("PATH", "/nonexistent")
        .output()
        .expect("agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--health-check-gpu: nvidia-smi is not on PATH"),
        "{err}"
    );
}

/// A storage check against a full filesystem (a 64 KiB tmpfs, filled, in a
/// private mount namespace: needs root) keeps the node out with a message
/// naming the path and the error.
#[test]
fn a_storage_check_on_a_full_filesystem_names_the_path() {
    let dir = scratch("storage-full");
    let mnt = dir.join("ckpt");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let script = "mount -t tmpfs -o size=64k accel-full \"$0\" || exit 90; \
                  head -c 65536 /dev/zero > \"$0/fill\" 2>/dev/null; \
                  timeout -s TERM 8 \"$@\"; exit 0";
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .arg(&mnt)
        .arg(bin("accel-agent"))
        .args([
            "--standalone",
            "--nproc-per-node",
            "1",
            "--health-check-storage",
        ])
        .arg(&mnt)
        .args(["--no-python", "true"])
        .output()
        .expect("unshare");
    assert_ne!(out.status.code(), Some(90), "cannot mount a tmpfs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this node is unhealthy")
            && err.contains(&format!("storage {}:", mnt.display()))
            && err.contains("No space left on device"),
        "{err}"
    );
}

/// A node health daemon on a Unix socket: `fail REASON` keeps the node out
/// in the daemon's words; once it says `ok` the node joins and the job runs.
#[test]
fn a_health_daemon_s_verdict_keeps_the_node_out_until_it_says_ok() {
    use std::io::{BufRead, BufReader, Write};
    let dir = scratch("health-daemon");
    let sock = dir.join("node-health.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let verdict = std::sync::Arc::new(std::sync::Mutex::new("fail XID 79 on GPU 2".to_owned()));
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    {
        let (verdict, asked) = (verdict.clone(), asked.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                if line.starts_with("check ") {
                    asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let v = verdict.lock().expect("verdict").clone();
                let _ = writeln!(conn, "{v}");
            }
        });
    }
    let port = accel_tests::Port::lease();
    let metrics = port.loopback();
    let agent = AgentCmd::standalone()
        .nproc(1)
        .flag(
            "--health-check-endpoint",
            format!("unix:{}", sock.display()),
        )
        .flag("--metrics-bind", &metrics)
        .recording(&dir, "node")
        .env("RUN_FOR", "0.5")
        .start(&dir, "node");
    assert!(
        eventually(Duration::from_secs(20), || stderr_of(&agent)
            .contains("XID 79 on GPU 2")),
        "{}",
        stderr_of(&agent)
    );
    assert!(records(&dir).is_empty(), "no worker ran on the sick node");
    // /readyz says why; the metrics say which check fails.
    let (code, body) = accel_tests::http_get(&metrics, "/readyz").expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("unhealthy") && body.contains("XID 79 on GPU 2"),
        "{body}"
    );
    let (_, text) = accel_tests::http_get(&metrics, "/metrics").expect("metrics");
    assert!(
        text.contains("accel_agent_health_check_failing{check=\"endpoint\"} 1")
            && text.contains("accel_agent_health_checks_total{check=\"endpoint\",result=\"fail\"}"),
        "{text}"
    );
    *verdict.lock().expect("verdict") = "ok".into();
    let out = agent.wait(LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(records(&dir).len(), 1);
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

/// A real DDP job (torch, gloo; two nodes, `--max-restarts 0`, a third agent
/// waiting as a spare): one node's NIC goes down mid-training. It tells the
/// rendezvous before it stops its workers, so its peers' collectives breaking
/// is not counted as their failure: the job re-forms with the spare, resumes
/// from its checkpoint and succeeds with a budget of zero restarts.
#[test]
fn a_ddp_job_goes_on_with_the_spare_when_a_node_s_nic_goes_down_spending_nothing() {
    let _heavy = crate::heavy();
    let server = Server::start();
    let dir = scratch("nic-ddp");
    let script = accel_tests::worker("ddp_train.py");
    let (ck, out, stamps) = (dir.join("ckpt"), dir.join("out"), dir.join("stamps"));
    for d in [&ck, &out, &stamps] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let (ck, out, stamps_arg) = (path(&ck), path(&out), path(&stamps));
    let start = |tag: &str| {
        let sysfs = fake_sysfs(&dir.join(format!("sysfs-{tag}")), "up");
        let agent = AgentCmd::c10d(&server.addr, "nic-ddp")
            .nnodes("2:2")
            .nproc(1)
            .max_restarts(0)
            .flag("--health-check-nic", "eth0")
            .flag("--health-check-sysfs", sysfs.display())
            .flag("--health-check-interval", 1)
            .conf("keep_alive_interval=0.3,keep_alive_max_attempt=3")
            .env("PATH", accel_tests::venv_path())
            .program(
                &script,
                &[
                    &ck,
                    &out,
                    "--steps",
                    "40",
                    "--ckpt-every",
                    "5",
                    "--step-sleep",
                    "0.2",
                    "--stamps",
                    &stamps_arg,
                ],
            )
            .start(&dir, tag);
        (agent, sysfs)
    };
    let loops = || {
        std::fs::read_to_string(stamps.join("stamps"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("loop "))
            .count()
    };
    let (a, a_sysfs) = start("a");
    let (b, _) = start("b");
    assert!(
        eventually(Duration::from_secs(120), || loops() == 2),
        "both ranks train"
    );
    let (c, _) = start("c");
    assert!(
        eventually(Duration::from_secs(20), || stderr_of(&c)
            .contains("waiting as a spare")),
        "{}",
        stderr_of(&c)
    );
    // Some steps and a checkpoint first.
    std::thread::sleep(Duration::from_secs(3));
    set_link(&a_sysfs, "down");
    assert!(
        eventually(Duration::from_secs(60), || loops() == 4),
        "the re-formed round trains: {}",
        std::fs::read_to_string(stamps.join("stamps")).unwrap_or_default()
    );
    set_link(&a_sysfs, "up");
    for (tag, agent) in [("a", a), ("b", b), ("c", c)] {
        let o = agent.wait(Duration::from_secs(240));
        assert_eq!(o.code(), 0, "{tag}: {}", o.stderr);
    }
    for r in 0..2 {
        let f = accel_tests::read_json(&Path::new(&out).join(format!("final_{r}.json")));
        assert_eq!(f["restart"], 0, "no restart counted: {f}");
        assert!(
            f["start"].as_u64().is_some_and(|s| s > 0),
            "resumed from a checkpoint: {f}"
        );
    }
    let lines = std::fs::read_to_string(stamps.join("stamps")).unwrap_or_default();
    assert!(
        lines
            .lines()
            .filter(|l| l.starts_with("loop "))
            .all(|l| l.split(' ').nth(2) == Some("0")),
        "{lines}"
    );
}
