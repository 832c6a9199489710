//! The chaos run: a multi-node job under a seeded schedule of faults,
//! checked against invariants on what its workers recorded
//! (`accel_tests::chaos`; the user guide's "Fault testing" page).
//!
//! ```text
//! chaos SECONDS [SEED] [--mode server|agents] [--faults all|control-plane]
//!       [--no-ddp] [--net N] [--dir DIR] [--scenario NAME] [--break-fence]
//! ```
//!
//! `--faults control-plane` draws control-plane outages only (replicas,
//! etcd, their links; server mode), and checks that none stopped a worker
//! (invariant (g)). `--scenario NAME` runs a fixed schedule instead of the seed's
//! (`schedule::scenario`: `fence`, `failure-while-cut-off`, `short-faults`,
//! `etcd-down`, `etcd-full`), for SECONDS at least its own. `--break-fence` starts the agents with
//! `ACCEL_TEST_BREAK_FENCE=1`, the debug build's test-only switch that
//! turns fencing off (`accel_agent::testing`): invariant (a) must catch it.
//! The hosts' segment is a subnet leased machine-wide (`accel_tests::Subnet`),
//! so runs side by side never collide; `--net N` asks for `10.N.0.0/24`
//! itself (refused if another run holds it).
//!
//! Run it through `scripts/chaos.sh`, which builds the binaries and runs it
//! as root in a private mount namespace. Prints the seed, the schedule, the
//! table and every violation with its history slice; exits 1 on any
//! violation, 2 on bad arguments. A scratch directory it made itself (no
//! `--dir`) is deleted after a run without violations (each is hundreds of
//! megabytes of etcd data and logs) and kept, for reading, after one with.

use std::path::PathBuf;
use std::process::ExitCode;

use accel_tests::chaos::run::{self, Options};
use accel_tests::chaos::schedule::{self, Class, Mode};

const USAGE: &str = "usage: chaos SECONDS [SEED] [--mode server|agents] [--faults all|control-plane] [--no-ddp] [--net N] [--dir DIR] [--scenario NAME] [--break-fence]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("chaos: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // A fixed scenario's name, or the seed.
    let what = match args.iter().position(|a| a == "--scenario") {
        Some(i) => format!("scenario {}", args[i + 1]),
        None => format!("seed {}", opts.seed),
    };
    println!(
        "chaos run: {} s, {what}, mode {}, faults {}{}; scratch {}",
        opts.seconds,
        opts.mode,
        opts.faults,
        if opts.ddp { ", with the DDP job" } else { "" },
        opts.dir.display()
    );
    let chosen_dir = args.iter().any(|a| a == "--dir");
    let out = run::run(&opts);
    println!("\nschedule ({what}; node i is the node holding group rank i when the fault is due):");
    for p in &out.schedule {
        println!("  {p}");
    }
    println!("\n{}", out.table);
    for v in &out.violations {
        println!("{what} mode {}: {v}", opts.mode);
    }
    if out.violations.is_empty() {
        if !chosen_dir {
            let _ = std::fs::remove_dir_all(&opts.dir);
        }
        ExitCode::SUCCESS
    } else {
        println!("repeat with: scripts/chaos.sh {}", args.join(" "));
        ExitCode::from(1)
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut pos = Vec::new();
    let mut mode = Mode::Server;
    let mut ddp = true;
    let mut net = None;
    let mut dir = None;
    let mut scenario = None;
    let mut faults = Class::All;
    let mut agent_env = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--mode" => {
                let v = value("--mode")?;
                mode = Mode::parse(&v).ok_or(format!("unknown mode {v:?}"))?;
            }
            "--faults" => {
                let v = value("--faults")?;
                faults = Class::parse(&v).ok_or(format!(
                    "unknown fault class {v:?} (known: all, control-plane)"
                ))?;
            }
            "--no-ddp" => ddp = false,
            "--scenario" => {
                let v = value("--scenario")?;
                scenario = Some(schedule::scenario(&v).ok_or(format!(
                    "unknown scenario {v:?} (known: {})",
                    schedule::SCENARIOS.join(", ")
                ))?);
            }
            "--break-fence" => {
                agent_env.push(("ACCEL_TEST_BREAK_FENCE".to_owned(), "1".to_owned()))
            }
            "--net" => {
                net = Some(
                    value("--net")?
                        .parse::<u8>()
                        .map_err(|e| format!("--net: {e}"))?,
                )
            }
            "--dir" => dir = Some(PathBuf::from(value("--dir")?)),
            s if s.starts_with("--") => return Err(format!("unknown flag {s}")),
            s => pos.push(s.to_owned()),
        }
    }
    let seconds: f64 = pos
        .first()
        .ok_or("SECONDS is missing")?
        .parse()
        .map_err(|e| format!("SECONDS: {e}"))?;
    if !(5.0..=86_400.0).contains(&seconds) {
        return Err("SECONDS is 5 to 86400".into());
    }
    if let Some((need, _)) = &scenario {
        if seconds < *need {
            return Err(format!("this scenario needs SECONDS of at least {need}"));
        }
    }
    let control_plane = faults == Class::ControlPlane
        || scenario.as_ref().is_some_and(|(_, plan)| {
            plan.iter().any(|p| p.fault == schedule::Fault::EtcdFull)
                || plan.iter().all(|p| p.fault.control_plane())
        });
    if control_plane && mode == Mode::Agents {
        return Err(
            "control-plane faults need --mode server: an agent-only rendezvous (--rdzv-backend etcd) has no peer hub and fences at the drop limit when etcd is lost"
                .into(),
        );
    }
    let seed: u64 = match pos.get(1) {
        Some(s) => s.parse().map_err(|e| format!("SEED: {e}"))?,
        None => 1,
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bins = exe.parent().ok_or("binary dir")?.to_path_buf();
    let dir = match dir {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("accel-chaos-")
            .tempdir()
            .map_err(|e| e.to_string())?
            .keep(),
    };
    Ok(Options {
        seconds,
        seed,
        mode,
        ddp,
        faults,
        schedule: scenario.map(|(_, plan)| plan),
        dir,
        bins,
        venv: std::env::var_os("ACCEL_VENV").map(PathBuf::from),
        net,
        agent_env,
    })
}
