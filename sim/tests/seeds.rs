//! Randomized mode in the test command: as many seeds of small jobs under
//! seeded fault schedules as fit in a minute (at least 10,000, from seed 0
//! up; `ACCEL_SIM_SECONDS` sets the minute), every invariant checked after
//! every step; and the planted bugs (fencing off; a server that ends every
//! quarantine as soon as it begins; a server that sends a change's events
//! before its store holds it) caught among the first seeds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Seeds every run covers, however short its time.
const AT_LEAST: u64 = 10_000;
/// Seeds a thread takes at a time.
const CHUNK: u64 = 250;

/// Runs `seeds` on every core; the reports of seeds that broke something.
fn sweep(seeds: std::ops::Range<u64>, broken_fence: bool) -> Vec<accel_sim::random::Report> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let per = (seeds.end - seeds.start).div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let from = seeds.start + t * per;
                let to = (from + per).min(seeds.end);
                s.spawn(move || {
                    (from..to)
                        .map(|seed| accel_sim::random::run(seed, broken_fence, false))
                        .filter(|r| !r.violations.is_empty())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a sweep thread"))
            .collect()
    })
}

/// Runs seeds from 0 up on every core until `budget` has passed (and at
/// least [`AT_LEAST`] ran): how many ran, and the reports of those that
/// broke something.
fn sweep_for(budget: Duration) -> (u64, Vec<accel_sim::random::Report>) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let bad = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut bad = Vec::new();
                    loop {
                        let from = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if from >= AT_LEAST && started.elapsed() >= budget {
                            return bad;
                        }
                        bad.extend(
                            (from..from + CHUNK)
                                .map(|seed| accel_sim::random::run(seed, false, false))
                                .filter(|r| !r.violations.is_empty()),
                        );
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a sweep thread"))
            .collect::<Vec<_>>()
    });
    // Every chunk taken ran to its end; the last `threads` takes did not run.
    let ran = next.load(Ordering::Relaxed) - CHUNK * threads as u64;
    (ran, bad)
}

#[test]
fn a_minute_of_seeds_keeps_every_invariant() {
    let secs = std::env::var("ACCEL_SIM_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let started = Instant::now();
    let (ran, mut bad) = sweep_for(Duration::from_secs(secs));
    let took = started.elapsed();
    eprintln!(
        "{ran} seeds (0..{ran}) in {:.1} s ({:.0} seeds/s)",
        took.as_secs_f64(),
        ran as f64 / took.as_secs_f64()
    );
    bad.sort_by_key(|r| r.seed);
    if let Some(first) = bad.first() {
        // The first failure again, with its trace.
        let replay = accel_sim::random::run(first.seed, false, true);
        let trace = replay.trace.unwrap_or_default();
        let tail = &trace[trace.len().saturating_sub(80)..];
        panic!(
            "{} of {ran} seeds broke an invariant; the first:\n{}{}\n{}\nreplay: cargo run -p accel-sim -- seed {} --trace",
            bad.len(),
            first.summary,
            first
                .violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            tail.join("\n"),
            first.seed
        );
    }
}

#[test]
fn the_planted_fence_bug_is_caught_by_random_seeds() {
    let bad = sweep(0..500, true);
    let fencing = bad
        .iter()
        .filter(|r| {
            r.violations
                .iter()
                .any(|v| v.invariant == 'a' && v.what.starts_with("fencing"))
        })
        .count();
    assert!(
        fencing > 0,
        "no seed among the first 500 caught a node keeping its ranks with fencing off"
    );
    eprintln!("fencing off: {fencing} of the first 500 seeds break invariant (a)");
}

#[test]
fn the_planted_quarantine_bug_is_caught_by_random_seeds() {
    let planted = accel_sim::random::Planted {
        fence: false,
        quarantine: true,
        commit: false,
    };
    let caught = (0..500)
        .map(|seed| accel_sim::random::run_with(seed, planted, false))
        .filter(|r| {
            r.violations
                .iter()
                .any(|v| v.invariant == 'f' && v.what.starts_with("quarantine"))
        })
        .count();
    assert!(
        caught > 0,
        "no seed among the first 500 caught a round placing a benched host"
    );
    eprintln!("benches ended at once: {caught} of the first 500 seeds break invariant (f)");
}

#[test]
fn the_planted_commit_bug_is_caught_by_random_seeds() {
    let planted = accel_sim::random::Planted {
        fence: false,
        quarantine: false,
        commit: true,
    };
    let caught = (0..1000)
        .map(|seed| accel_sim::random::run_with(seed, planted, false))
        .filter(|r| {
            r.violations
                .iter()
                .any(|v| v.invariant == 'i' && v.what.starts_with("durability"))
        })
        .count();
    assert!(
        caught > 0,
        "no seed among the first 1,000 caught a server that sent a round before its store held it"
    );
    eprintln!("events before the write: {caught} of the first 1,000 seeds break invariant (i)");
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 77, 1234] {
        let a = accel_sim::random::run(seed, false, true);
        let b = accel_sim::random::run(seed, false, true);
        assert_eq!(a.summary, b.summary);
        assert_eq!(a.trace, b.trace, "seed {seed}");
    }
}

/// Seeds past the minute's range that found real bugs, kept as regressions:
/// 442134 (a silent server's held connection ended when the peers'
/// evidence lapsed, though the fence kept its latest word: `link::hold`
/// follows `peers::Shared::latest`), 911189 (a store-less server restarted
/// empty relearned a job from a node of an older round and formed a new
/// round beside a node still running a later one: `Job::hold_until` holds
/// relearned jobs too), and six more that failed with them. With workers
/// slow on SIGTERM (health seeds): 42978 (a re-forming round waited from the
/// restart's decision, not its delivery), 59178 and four more (a node
/// stopping its workers after its own failure vouched for a round the
/// rendezvous had ended: `Event::FailureTaken`), 96119 and eight more (a node
/// that learned of the restart from its rejoin was not waited for:
/// `Job::reattach`), 246666 (a node rejoining a store-less server restarted
/// empty stopped its workers within a fence of the rejoin, past the
/// server's hold: the stop now ends at the old fence), 351244 and 397822 (a
/// peer that heard the hub only since a moment ago counted towards a
/// majority before it had vouched: only steady peers count), 763778 and
/// 746966 (a stop for a restart kept its fence moving with later answers,
/// and a slow link made the restart arrive late: the stop now keeps the
/// fence it began with), 571657 (a hot spare left after join_timeout
/// while the round ran; and with that fixed, a slow host benched for
/// straggling came back in time for the round its bench re-formed, for
/// ever: a host benched again soon stays out twice as long).
#[test]
fn the_seeds_that_found_bugs_keep_every_invariant() {
    let seeds = [
        313327, 442134, 573663, 713067, 718725, 767454, 911189, 992399, 42978, 59178, 88576, 89207,
        92237, 169892, 96119, 114833, 129650, 173315, 189034, 227529, 249356, 275678, 280451,
        246666, 351244, 397822, 763778, 746966, 571657,
    ];
    for seed in seeds {
        let r = accel_sim::random::run(seed, false, false);
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}\nreplay: cargo run -p accel-sim -- seed {seed} --trace",
            r.violations
        );
    }
}
