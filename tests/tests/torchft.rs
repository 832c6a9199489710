//! torchft 0.2 (from the package registry, unmodified) with its lighthouse
//! in `rdzv-server --lighthouse`: two replica groups, each an accel-agent
//! job, train a DDP model on gloo; killing one group's worker lets the
//! other go on alone and the killed group rejoins and heals. The same run
//! against torchft's own lighthouse is the anchor: both must behave alike.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use accel_tests::{eventually, path_with, scratch, signal, venv, AgentCmd, Port, Server};
use serde_json::Value;

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(240);
/// Steps each group trains.
const STEPS: u64 = 120;
/// The step of group 1 at which its worker is killed.
const KILL_AT: u64 = 40;

/// The venv setup.sh made with torchft over the pinned torch.
fn torchft_venv() -> PathBuf {
    let root = venv().join("torchft-0.2.0");
    assert!(
        root.join(".complete").exists(),
        "no torchft venv at {}: run scripts/setup.sh",
        root.display()
    );
    root
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/torchft/train_ft.py")
}

/// One committed step of one group, as the example records it.
#[derive(Debug, Clone)]
struct Step {
    group: u64,
    step: u64,
    quorum_id: i64,
    participants: u64,
    time: f64,
    pid: u64,
    restart: u64,
    param_sum: f64,
}

fn steps(path: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| Step {
            group: v["group"].as_u64().unwrap_or(99),
            step: v["step"].as_u64().unwrap_or(0),
            quorum_id: v["quorum_id"].as_i64().unwrap_or(-1),
            participants: v["participants"].as_u64().unwrap_or(0),
            time: v["time"].as_f64().unwrap_or(0.0),
            pid: v["pid"].as_u64().unwrap_or(0),
            restart: v["restart"].as_u64().unwrap_or(0),
            param_sum: v["param_sum"].as_f64().unwrap_or(f64::NAN),
        })
        .collect()
}

/// What a run showed, compared between the two lighthouses.
#[derive(Debug, PartialEq, Eq)]
struct Behaviour {
    /// Both groups trained every step and their agents exited 0.
    finished: bool,
    /// The survivor committed steps alone while the other group was down.
    survivor_went_on_alone: bool,
    /// The killed group's restarted worker took part again (two
    /// participants) and had the survivor's weights at the same steps.
    rejoined_and_healed: bool,
}

/// Runs the two groups against `lighthouse` (`http://host:port`), kills
/// group 1's worker at [`KILL_AT`], and says what happened; `tag` names
/// the scratch directory.
fn run(tag: &str, lighthouse: &str) -> (Behaviour, Vec<Step>, Vec<Step>, f64) {
    let dir = scratch(tag);
    let tft = torchft_venv();
    let agents: Vec<_> = (0..2)
        .map(|g| {
            AgentCmd::standalone()
                .nproc(1)
                .max_restarts(3)
                .script(example())
                .env("PATH", path_with(&tft))
                .env("TORCHFT_LIGHTHOUSE", lighthouse)
                .env("REPLICA_GROUP_ID", g)
                .env("NUM_REPLICA_GROUPS", 2)
                .env("STEPS", STEPS)
                .env("STEP_SLEEP", "0.05")
                .env("RECORD", dir.join(format!("g{g}.jsonl")).display())
                .env("GLOO_SOCKET_IFNAME", "lo")
                .env("TORCHFT_HOSTNAME", "127.0.0.1")
                .env("RUST_LOG", "warn")
                .start(&dir, &format!("group{g}"))
        })
        .collect();
    let g1 = dir.join("g1.jsonl");
    assert!(
        eventually(Duration::from_secs(120), || steps(&g1)
            .iter()
            .any(|s| s.step >= KILL_AT)),
        "group 1 never reached step {KILL_AT}"
    );
    let victim = steps(&g1).last().expect("a step").pid;
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    signal(u32::try_from(victim).expect("pid"), "KILL");
    let mut finished = true;
    for a in agents {
        let out = a.wait(LIMIT);
        finished &= out.code() == 0;
        if out.code() != 0 {
            eprintln!(
                "[{tag}] a group's agent exited {}:\n{}",
                out.code(),
                out.stderr
            );
        }
    }
    let (s0, s1) = (steps(&dir.join("g0.jsonl")), steps(&g1));
    finished &=
        s0.last().is_some_and(|s| s.step >= STEPS) && s1.last().is_some_and(|s| s.step >= STEPS);
    let alone: Vec<&Step> = s0
        .iter()
        .filter(|s| s.time > killed_at && s.participants == 1)
        .collect();
    let back: Vec<&Step> = s1
        .iter()
        .filter(|s| s.restart >= 1 && s.participants == 2)
        .collect();
    // Healed: at every step both groups committed after the rejoin, the
    // weights are the same.
    let healed = !back.is_empty()
        && back.iter().all(|b| {
            s0.iter()
                .find(|a| a.step == b.step)
                .is_none_or(|a| (a.param_sum - b.param_sum).abs() < 1e-6)
        });
    let first_alone = alone.first().map_or(f64::NAN, |s| s.time - killed_at);
    (
        Behaviour {
            finished,
            survivor_went_on_alone: !alone.is_empty(),
            rejoined_and_healed: healed,
        },
        s0,
        s1,
        first_alone,
    )
}

/// torchft's own lighthouse, on `port`.
fn torchft_lighthouse(port: u16) -> Child {
    let child = Command::new(torchft_venv().join("bin/torchft_lighthouse"))
        .args([
            "--min_replicas",
            "1",
            "--join_timeout_ms",
            "1000",
            "--heartbeat_timeout_ms",
            "2000",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("torchft_lighthouse");
    assert!(
        eventually(Duration::from_secs(20), || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "torchft_lighthouse did not listen on {port}"
    );
    child
}

#[test]
fn torchft_groups_fail_and_heal_with_rdzv_server_as_their_lighthouse_as_with_torchft_s_own() {
    let _heavy = heavy();
    // The anchor: torchft's own lighthouse.
    let port = Port::lease();
    let mut own = torchft_lighthouse(port.get());
    let (anchor, ..) = run("torchft-own", &format!("http://127.0.0.1:{}", port.get()));
    let _ = own.kill();
    let _ = own.wait();
    // rdzv-server's, with the same settings.
    let lh = Port::lease();
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--lighthouse",
            &lh.loopback(),
            "--lighthouse-join-timeout",
            "1",
            "--lighthouse-heartbeat-timeout",
            "2",
        ],
        &[],
    );
    let started = Instant::now();
    let (ours, s0, s1, alone_after) = run("torchft-rdzv", &format!("http://{}", lh.loopback()));
    let expected = Behaviour {
        finished: true,
        survivor_went_on_alone: true,
        rejoined_and_healed: true,
    };
    assert_eq!(anchor, expected, "torchft's own lighthouse");
    assert_eq!(
        ours,
        expected,
        "rdzv-server's lighthouse:\n{}",
        server.stderr()
    );
    // Quorum ids only grow, in each group's eyes.
    for s in [&s0, &s1] {
        assert!(s
            .windows(2)
            .all(|w| w[0].quorum_id <= w[1].quorum_id || w[1].restart > w[0].restart));
        assert!(s.iter().all(|x| x.group <= 1));
    }
    eprintln!(
        "rdzv-server's lighthouse: the survivor went on alone {alone_after:.2} s after the kill; {} s in all",
        started.elapsed().as_secs()
    );
}
