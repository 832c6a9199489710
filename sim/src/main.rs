//! `accel-sim`: runs scenario scripts or seed ranges of the simulator and
//! prints what failed, so a failure found in CI replays here.
//!
//! ```text
//! accel-sim run sim/scenarios/restart_budget.sim [more.sim ...]
//! accel-sim seeds 0..10000 [--broken-fence] [--broken-quarantine]
//! accel-sim seed 1234 [--trace] [--broken-fence] [--broken-quarantine]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use rendezvous_server::job::Category;

const USAGE: &str = "usage: accel-sim run FILE.sim... | seeds A..B [--broken-fence] [--broken-quarantine] [--broken-commit] | seed N [--trace] [--broken-fence] [--broken-quarantine] [--broken-commit]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let planted = accel_sim::random::Planted {
        fence: flag("--broken-fence"),
        quarantine: flag("--broken-quarantine"),
        commit: flag("--broken-commit"),
    };
    match args.first().map(String::as_str) {
        Some("run") if args.len() > 1 => {
            let mut failed = false;
            for file in args[1..].iter().filter(|a| !a.starts_with("--")) {
                let text = match std::fs::read_to_string(file) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("{file}: {e}");
                        return ExitCode::from(2);
                    }
                };
                match accel_sim::script::run(file, &text) {
                    Ok(w) => println!("{file}: ok ({:.1} s virtual)", w.now().as_secs_f64()),
                    Err(e) => {
                        failed = true;
                        eprintln!("{e}");
                    }
                }
            }
            ExitCode::from(u8::from(failed))
        }
        Some("seeds") => {
            let Some((a, b)) = args
                .get(1)
                .and_then(|r| r.split_once(".."))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
            else {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            };
            let started = std::time::Instant::now();
            let mut bad = 0u64;
            let (mut ok, mut failed, mut never, mut faulted) = (0u64, 0u64, 0u64, 0u64);
            let mut virtual_s = 0.0;
            let mut spent = [Duration::ZERO; 5];
            for seed in a..b {
                let r = accel_sim::random::run_with(seed, planted, false);
                match r.outcome {
                    Some(true) => ok += 1,
                    Some(false) => failed += 1,
                    None => never += 1,
                }
                faulted += u64::from(r.faults > 0);
                virtual_s += r.took.as_secs_f64();
                for (c, t) in Category::ALL.iter().zip(&mut spent) {
                    *t += r.goodput.map_or(Duration::ZERO, |g| g.of(*c));
                }
                if !r.violations.is_empty() {
                    bad += 1;
                    eprint!("{}", r.summary);
                    for v in &r.violations {
                        eprintln!("  {v}");
                    }
                    eprintln!(
                        "  replay: accel-sim seed {seed} --trace{}{}",
                        if planted.fence { " --broken-fence" } else { "" },
                        if planted.quarantine {
                            " --broken-quarantine"
                        } else {
                            ""
                        }
                    );
                }
            }
            let took = started.elapsed();
            let total: Duration = spent.iter().sum();
            let shares: Vec<String> = Category::ALL
                .iter()
                .zip(&spent)
                .map(|(c, t)| {
                    let share = t.as_secs_f64() * 100.0 / total.as_secs_f64().max(1e-9);
                    format!("{} {share:.1} %", c.name())
                })
                .collect();
            println!(
                "goodput of the jobs held at the end: {} of {:.0} s",
                shares.join(", "),
                total.as_secs_f64()
            );
            println!(
                "jobs: {ok} succeeded, {failed} failed, {never} never ended; {faulted} runs with faults; {virtual_s:.0} s of virtual time"
            );
            println!(
                "{} seeds, {bad} failed, in {:.1} s ({:.0} seeds/s)",
                b.saturating_sub(a),
                took.as_secs_f64(),
                b.saturating_sub(a) as f64 / took.as_secs_f64().max(1e-9)
            );
            ExitCode::from(u8::from(bad > 0))
        }
        Some("seed") => {
            let Some(seed) = args.get(1).and_then(|s| s.parse::<u64>().ok()) else {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            };
            let r = accel_sim::random::run_with(seed, planted, flag("--trace"));
            print!("{}", r.summary);
            for line in r.trace.unwrap_or_default() {
                println!("{line}");
            }
            for v in &r.violations {
                println!("{v}");
            }
            ExitCode::from(u8::from(!r.violations.is_empty()))
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
