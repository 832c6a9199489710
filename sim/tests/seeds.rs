//! Randomized mode in the test command: 10,000 seeds of small jobs under
//! seeded fault schedules, every invariant checked after every step; and
//! the planted bugs (fencing off; a server that ends every quarantine as
//! soon as it begins) caught among the first seeds.

use std::time::Instant;

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

#[test]
fn ten_thousand_seeds_keep_every_invariant() {
    let started = Instant::now();
    let bad = sweep(0..10_000, false);
    let took = started.elapsed();
    eprintln!(
        "10000 seeds in {:.1} s ({:.0} seeds/s)",
        took.as_secs_f64(),
        10_000.0 / took.as_secs_f64()
    );
    if let Some(first) = bad.first() {
        // The first failure again, with its trace.
        let replay = accel_sim::random::run(first.seed, false, true);
        let trace = replay.trace.unwrap_or_default();
        let tail = &trace[trace.len().saturating_sub(80)..];
        panic!(
            "{} of 10000 seeds broke an invariant; the first:\n{}{}\n{}\nreplay: cargo run -p accel-sim -- seed {} --trace",
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
fn a_seed_replays_exactly() {
    for seed in [3, 77, 1234] {
        let a = accel_sim::random::run(seed, false, true);
        let b = accel_sim::random::run(seed, false, true);
        assert_eq!(a.summary, b.summary);
        assert_eq!(a.trace, b.trace, "seed {seed}");
    }
}
