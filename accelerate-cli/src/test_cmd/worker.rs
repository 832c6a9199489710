//! `accel test-worker`: the check every launched process runs when no
//! Python environment has accelerate.
//!
//! It exercises what a training script depends on before any tensor moves:
//! torchrun's environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`) and the launch's store at that address, which every
//! process must reach and through which all of them must see each other.
//! Each rank counts itself in, writes its own key, waits for every rank's
//! key, reads them all back and checks their values (a rank that disagrees
//! on the world size shows up here), then passes a final barrier so no rank
//! leaves, and no launch ends, before all have finished. Keys live under
//! `accel-test/attempt_<TORCHELASTIC_RESTART_COUNT>/`, so a restarted
//! attempt does not see the previous one's keys.
//!
//! Every store call is limited to 60 s (`ACCEL_TEST_TIMEOUT`, in seconds,
//! changes it); a rank that never arrives becomes an error naming it.

use std::time::Duration;

use accel_input::parse_duration;

use super::client::{Client, ClientError};
use super::TestError;

/// Default limit for each store call.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment the worker reads.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEnv {
    /// This process's global rank.
    pub rank: u64,
    /// Number of processes.
    pub world: u64,
    /// Store host.
    pub host: String,
    /// Store port.
    pub port: u16,
    /// `TORCHELASTIC_RESTART_COUNT` (0 when unset).
    pub attempt: u64,
    /// Limit for each store call.
    pub timeout: Duration,
}

impl WorkerEnv {
    /// Reads torchrun's variables; a missing or malformed one is an error
    /// that says who sets it.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, TestError> {
        let required = |var: &'static str| {
            env(var).filter(|v| !v.trim().is_empty()).ok_or_else(|| TestError::Env {
                var,
                problem: "is not set; `accel test-worker` runs inside a launch (`accel test`, or \
                          `accel launch --no_python --multi_gpu --num_processes N accel test-worker`), \
                          which sets torchrun's environment"
                    .into(),
            })
        };
        fn number<T: std::str::FromStr>(var: &'static str, v: &str) -> Result<T, TestError> {
            v.trim().parse().map_err(|_| TestError::Env {
                var,
                problem: format!("is {v:?}, not a non-negative integer"),
            })
        }
        let rank: u64 = number("RANK", &required("RANK")?)?;
        let world: u64 = number("WORLD_SIZE", &required("WORLD_SIZE")?)?;
        let host = required("MASTER_ADDR")?.trim().to_owned();
        let port: u16 = number("MASTER_PORT", &required("MASTER_PORT")?)?;
        if world == 0 || rank >= world {
            return Err(TestError::Env {
                var: "RANK",
                problem: format!("is {rank}, outside a WORLD_SIZE of {world}"),
            });
        }
        let attempt = match env("TORCHELASTIC_RESTART_COUNT") {
            Some(v) if !v.trim().is_empty() => number("TORCHELASTIC_RESTART_COUNT", &v)?,
            _ => 0,
        };
        let timeout = match env("ACCEL_TEST_TIMEOUT") {
            // Bounded like every duration (a huge one once overflowed a deadline).
            Some(v) if !v.trim().is_empty() => match parse_duration(&v) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    return Err(TestError::Env {
                        var: "ACCEL_TEST_TIMEOUT",
                        problem: "is 0; give a positive number of seconds".into(),
                    })
                }
                Err(e) => {
                    return Err(TestError::Env {
                        var: "ACCEL_TEST_TIMEOUT",
                        problem: format!("is invalid: {e}"),
                    })
                }
            },
            _ => DEFAULT_TIMEOUT,
        };
        Ok(Self {
            rank,
            world,
            host,
            port,
            attempt,
            timeout,
        })
    }
}

/// What rank `r` of `w` writes, and every other rank expects to read.
fn greeting(r: u64, w: u64) -> String {
    format!("rank {r} of {w}")
}

/// Runs the check; returns the line to print.
pub fn run(e: &WorkerEnv) -> Result<String, TestError> {
    let (rank, world) = (e.rank, e.world);
    let store = |source: ClientError| TestError::Store {
        rank,
        world,
        source,
    };
    let fail = |problem: String| TestError::Check {
        rank,
        world,
        problem,
    };
    let prefix = format!("accel-test/attempt_{}", e.attempt);
    let key_of = |r: u64| format!("{prefix}/rank_{r}");
    let mut c = Client::connect(&e.host, e.port, e.timeout).map_err(store)?;
    // Count in before publishing the key: once every key exists, every
    // rank's ADD has been applied, so the count below is final.
    let arrived = format!("{prefix}/arrived");
    let n = c.add(&arrived, 1).map_err(store)?;
    if n < 1 || n as u64 > world {
        return Err(fail(format!(
            "the store counted {n} arrivals for a world of {world}: the processes disagree on \
             WORLD_SIZE, or another job uses this store"
        )));
    }
    c.set(&key_of(rank), &greeting(rank, world))
        .map_err(store)?;
    let keys: Vec<String> = (0..world).map(key_of).collect();
    if let Err(err) = c.wait(&keys) {
        return Err(match err {
            ClientError::TimedOut { .. } => fail(missing_ranks(e, &keys)),
            other => store(other),
        });
    }
    for (r, key) in keys.iter().enumerate() {
        let got = c.get(key).map_err(store)?;
        let want = greeting(r as u64, world);
        if got != want.as_bytes() {
            return Err(fail(format!(
                "rank {r} wrote {:?} where {want:?} was expected: the processes disagree on \
                 WORLD_SIZE or their ranks",
                String::from_utf8_lossy(&got)
            )));
        }
    }
    let total = c.add(&arrived, 0).map_err(store)?;
    if total as u64 != world {
        return Err(fail(format!(
            "the store counted {total} arrivals for a world of {world}"
        )));
    }
    // Final barrier: the last rank to finish releases everyone.
    let release = format!("{prefix}/release");
    if c.add(&format!("{prefix}/done"), 1).map_err(store)? as u64 == world {
        c.set(&release, "1").map_err(store)?;
    }
    if let Err(err) = c.wait(std::slice::from_ref(&release)) {
        return Err(match err {
            ClientError::TimedOut { limit, .. } => fail(format!(
                "not every process finished the check within {limit:?} (a process died, or \
                 stopped answering, after reaching the store); ACCEL_TEST_TIMEOUT sets the limit"
            )),
            other => store(other),
        });
    }
    Ok(format!(
        "rank {rank} of {world}: all {world} processes reached each other through the store at {}",
        c.addr()
    ))
}

/// The timeout message, naming the ranks whose keys never appeared (asked
/// on a fresh connection: the timed-out one still has its WAIT pending).
fn missing_ranks(e: &WorkerEnv, keys: &[String]) -> String {
    let limit = e.timeout;
    let head = format!("timed out after {limit:?} waiting for the other processes");
    let tail = "are they all running? (ACCEL_TEST_TIMEOUT sets the limit)";
    let missing: Option<Vec<String>> = Client::connect(&e.host, e.port, Duration::from_secs(5))
        .ok()
        .and_then(|mut c| {
            let mut out = Vec::new();
            for (r, k) in keys.iter().enumerate() {
                if !c.check(std::slice::from_ref(k)).ok()? {
                    out.push(r.to_string());
                }
            }
            Some(out)
        });
    match missing {
        Some(m) if !m.is_empty() => format!(
            "{head}: {} {} of {} never reached the store at {}:{}; {tail}",
            if m.len() == 1 { "rank" } else { "ranks" },
            m.join(", "),
            e.world,
            e.host,
            e.port,
        ),
        _ => format!("{head}; {tail}"),
    }
}

#[cfg(test)]
mod tests;
