use std::collections::HashMap;
use std::thread;

use super::*;
use crate::test_cmd::client::tests::store;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| map.get(k).cloned()
}

fn worker_env(rank: u64, world: u64, port: u16, timeout: Duration) -> WorkerEnv {
    WorkerEnv {
        rank,
        world,
        host: "127.0.0.1".into(),
        port,
        attempt: 0,
        timeout,
    }
}

#[test]
fn reads_torchruns_environment() {
    let e = WorkerEnv::from_env(&env_of(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RESTART_COUNT", "1"),
        ("ACCEL_TEST_TIMEOUT", "2.5"),
    ]))
    .expect("valid");
    assert_eq!(
        (e.rank, e.world, e.host.as_str(), e.port, e.attempt),
        (2, 4, "10.0.0.1", 29500, 1)
    );
    assert_eq!(e.timeout, Duration::from_millis(2500));

    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ];
    let without = |var: &str| {
        let kept: Vec<(&str, &str)> = base.iter().copied().filter(|(k, _)| *k != var).collect();
        WorkerEnv::from_env(&env_of(&kept)).expect_err("missing")
    };
    for var in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        let msg = without(var).to_string();
        assert!(msg.starts_with(&format!("{var} is not set")), "{msg}");
        assert!(msg.contains("accel test"), "{msg}");
    }
    let with = |var: &'static str, value: &'static str| {
        let mut pairs: Vec<(&str, &str)> =
            base.iter().copied().filter(|(k, _)| *k != var).collect();
        pairs.push((var, value));
        WorkerEnv::from_env(&env_of(&pairs))
            .expect_err("bad")
            .to_string()
    };
    assert!(with("MASTER_PORT", "http").contains("MASTER_PORT is \"http\""));
    assert!(with("MASTER_PORT", "70000").contains("MASTER_PORT"));
    assert!(with("RANK", "2").contains("outside a WORLD_SIZE of 2"));
    assert!(with("ACCEL_TEST_TIMEOUT", "-1").contains("ACCEL_TEST_TIMEOUT"));
    assert!(with("ACCEL_TEST_TIMEOUT", "0").contains("is 0"));
    let huge = with("ACCEL_TEST_TIMEOUT", "1e300");
    assert!(huge.contains("is too long; at most 10 years"), "{huge}");
}

#[test]
fn every_rank_sees_every_other() {
    let (_rt, s) = store();
    let port = s.addr().port();
    let world = 4;
    let ranks: Vec<_> = (0..world)
        .map(|r| thread::spawn(move || run(&worker_env(r, world, port, Duration::from_secs(20)))))
        .collect();
    for (r, h) in ranks.into_iter().enumerate() {
        let msg = h.join().expect("thread").expect("check passes");
        assert_eq!(
            msg,
            format!(
                "rank {r} of 4: all 4 processes reached each other through the store at 127.0.0.1:{port}"
            )
        );
    }
    // A restarted attempt uses fresh keys on the same store.
    let again: Vec<_> = (0..2)
        .map(|r| {
            thread::spawn(move || {
                let mut e = worker_env(r, 2, port, Duration::from_secs(20));
                e.attempt = 1;
                run(&e)
            })
        })
        .collect();
    for h in again {
        h.join().expect("thread").expect("second attempt passes");
    }
}

#[test]
fn a_missing_rank_is_named() {
    let (_rt, s) = store();
    let port = s.addr().port();
    // Ranks 0 and 2 of 3 start; rank 1 never does.
    let ranks: Vec<_> = [0, 2]
        .into_iter()
        .map(|r| thread::spawn(move || run(&worker_env(r, 3, port, Duration::from_millis(500)))))
        .collect();
    for h in ranks {
        let msg = h
            .join()
            .expect("thread")
            .expect_err("times out")
            .to_string();
        assert!(
            msg.contains("rank 1 of 3 never reached the store at 127.0.0.1"),
            "{msg}"
        );
        assert!(msg.contains("ACCEL_TEST_TIMEOUT"), "{msg}");
    }
}

#[test]
fn disagreeing_world_sizes_are_caught() {
    let (_rt, s) = store();
    let port = s.addr().port();
    // Rank 1 believes the world has 3 processes, rank 0 believes 2.
    let a = thread::spawn(move || run(&worker_env(0, 2, port, Duration::from_secs(2))));
    let b = thread::spawn(move || run(&worker_env(1, 3, port, Duration::from_secs(2))));
    let a = a
        .join()
        .expect("thread")
        .expect_err("rank 0 fails")
        .to_string();
    let b = b
        .join()
        .expect("thread")
        .expect_err("rank 1 fails")
        .to_string();
    assert!(a.contains("disagree on WORLD_SIZE"), "{a}");
    assert!(b.starts_with("rank 1 of 3"), "{b}");
}
