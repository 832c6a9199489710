//! What the agent counts, for Prometheus (`--metrics-bind`, off by default).
//!
//! The agent's driver counts what it does (workers started, their exits by
//! code or signal, restarts, how long a round took to form and how long a
//! failure kept the node's workers down); the worker store counts its
//! connections and operations; the console counts tee'd lines it dropped.
//! `/readyz` says whether this node's workers run in a round now, and if
//! not, what the node waits for.
//!
//! Every label is a bounded vocabulary (an exit code is 0..=255, a signal
//! one of the system's names), so a misbehaving worker cannot grow the
//! series count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use accel_worker_store::metrics::StoreMetrics;

use crate::Ended;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabel {
    check: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckResult {
    check: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExitLabel {
    kind: &'static str,
    code: String,
}

/// The agent's metrics; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct AgentMetrics(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    worker_starts: Counter,
    worker_exits: Family<ExitLabel, Counter>,
    workers: Gauge,
    restarts: Family<Kind, Counter>,
    round: Gauge,
    formation: Histogram,
    recovery: Histogram,
    tee_dropped: Counter,
    file_timer_dropped: Family<Reason, Counter>,
    health_checks: Family<CheckResult, Counter>,
    health_failing: Family<CheckLabel, Gauge>,
    store: StoreMetrics,
    /// What `/readyz` answers.
    ready: Mutex<Result<(), String>>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        // 1 ms to ~9 min: a round re-forms in milliseconds; a first round
        // waits for nodes, a recovery for the workers' stop grace and for
        // Python to start again.
        let buckets = || Histogram::new(exponential_buckets(0.001, 2.0, 20));
        Self(Arc::new(Inner {
            worker_starts: Counter::default(),
            worker_exits: Family::default(),
            workers: Gauge::default(),
            restarts: Family::default(),
            round: Gauge::default(),
            formation: buckets(),
            recovery: buckets(),
            tee_dropped: Counter::default(),
            file_timer_dropped: Family::default(),
            health_checks: Family::default(),
            health_failing: Family::default(),
            store: StoreMetrics::default(),
            ready: Mutex::new(Err("starting".into())),
        }))
    }
}

impl AgentMetrics {
    /// Registers every metric in `registry` (once per process).
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.0;
        for kind in ["failure", "membership"] {
            let _ = m.restarts.get_or_create(&Kind { kind });
        }
        registry.register(
            "accel_agent_worker_starts",
            "Worker processes started",
            m.worker_starts.clone(),
        );
        registry.register(
            "accel_agent_worker_exits",
            "Worker processes that ended, by kind (exit, with its code; signal, with its name)",
            m.worker_exits.clone(),
        );
        registry.register(
            "accel_agent_workers",
            "Worker processes running now",
            m.workers.clone(),
        );
        registry.register(
            "accel_agent_restarts",
            "Rounds this node left for a new one: kind=failure counts against the job's max_restarts, kind=membership does not",
            m.restarts.clone(),
        );
        registry.register(
            "accel_agent_round",
            "The round this node's workers run, or last ran",
            m.round.clone(),
        );
        registry.register_with_unit(
            "accel_agent_round_formation",
            "From offering this node for a round to the round formed",
            Unit::Seconds,
            m.formation.clone(),
        );
        registry.register_with_unit(
            "accel_agent_recovery",
            "From a worker failure seen on this node to its workers running again",
            Unit::Seconds,
            m.recovery.clone(),
        );
        registry.register(
            "accel_agent_tee_lines_dropped",
            "Tee'd worker lines dropped from the console because it was slower than the workers (the log files keep them)",
            m.tee_dropped.clone(),
        );
        for reason in crate::file_timer::DROP_REASONS {
            let _ = m.file_timer_dropped.get_or_create(&Reason { reason });
        }
        registry.register(
            "accel_agent_file_timer_requests_dropped",
            "FileTimer requests dropped, by reason: not_a_worker (for a process in no worker's process group of this node), malformed, table_full",
            m.file_timer_dropped.clone(),
        );
        registry.register(
            "accel_agent_health_checks",
            "Health checks run, by check (command, nic, storage, gpu, endpoint) and result (pass, fail)",
            m.health_checks.clone(),
        );
        registry.register(
            "accel_agent_health_check_failing",
            "1 while the last run of this health check failed",
            m.health_failing.clone(),
        );
        m.store.register(registry);
    }

    /// Counts a run of the health checks.
    pub fn health(&self, verdict: &crate::health::Verdict) {
        for (check, r) in &verdict.results {
            let result = if r.is_ok() { "pass" } else { "fail" };
            self.0
                .health_checks
                .get_or_create(&CheckResult { check, result })
                .inc();
            self.0
                .health_failing
                .get_or_create(&CheckLabel { check })
                .set(i64::from(r.is_err()));
        }
    }

    /// `n` workers started.
    pub fn started(&self, n: usize, round: u64) {
        self.0.worker_starts.inc_by(n as u64);
        self.0.workers.set(n as i64);
        self.0.round.set(i64::try_from(round).unwrap_or(i64::MAX));
    }

    /// A worker ended.
    pub fn exited(&self, ended: &Ended) {
        let label = match ended {
            Ended::Exited(code) => ExitLabel {
                kind: "exit",
                code: code.to_string(),
            },
            Ended::Signaled(sig) => ExitLabel {
                kind: "signal",
                code: Signal::try_from(*sig)
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_else(|_| "unknown".to_owned()),
            },
        };
        self.0.worker_exits.get_or_create(&label).inc();
        self.0.workers.dec();
    }

    /// The workers were stopped (none run).
    pub fn stopped(&self) {
        self.0.workers.set(0);
    }

    /// The job left a round for a new one.
    pub fn restart(&self, counted: bool) {
        let kind = if counted { "failure" } else { "membership" };
        self.0.restarts.get_or_create(&Kind { kind }).inc();
    }

    /// A round formed `took` after this node offered itself.
    pub fn formed(&self, took: Duration) {
        self.0.formation.observe(took.as_secs_f64());
    }

    /// Workers run again `took` after a failure was seen.
    pub fn recovered(&self, took: Duration) {
        self.0.recovery.observe(took.as_secs_f64());
    }

    /// The console's dropped-line counter.
    pub fn tee_dropped(&self) -> Counter {
        self.0.tee_dropped.clone()
    }

    /// `n` FileTimer requests were dropped for `reason` (one of
    /// [`crate::file_timer::DROP_REASONS`]).
    pub fn file_timer_dropped(&self, reason: &'static str, n: u64) {
        self.0
            .file_timer_dropped
            .get_or_create(&Reason { reason })
            .inc_by(n);
    }

    /// The worker store's counters.
    pub fn store(&self) -> StoreMetrics {
        self.0.store.clone()
    }

    /// Sets what `/readyz` answers: `Ok` while workers run.
    pub fn set_ready(&self, state: Result<(), String>) {
        if let Ok(mut r) = self.0.ready.lock() {
            *r = state;
        }
    }

    /// What `/readyz` answers.
    pub fn ready(&self) -> Result<(), String> {
        self.0
            .ready
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|_| Err("the agent's state is unreadable".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::prometheus_text::encode;

    #[test]
    fn counts_under_bounded_labels() {
        let m = AgentMetrics::default();
        m.started(2, 3);
        m.exited(&Ended::Exited(1));
        m.exited(&Ended::Signaled(9));
        m.restart(true);
        m.formed(Duration::from_millis(4));
        m.recovered(Duration::from_millis(1500));
        let _open = m.store().connected();
        m.store()
            .op(&accel_worker_store::wire::Command::Get(b"k".to_vec()));
        m.tee_dropped().inc();
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        encode(&mut text, &r).expect("encode");
        for line in [
            "accel_agent_worker_starts_total 2",
            "accel_agent_worker_exits_total{kind=\"exit\",code=\"1\"} 1",
            "accel_agent_worker_exits_total{kind=\"signal\",code=\"SIGKILL\"} 1",
            "accel_agent_workers 0",
            "accel_agent_round 3",
            "accel_agent_restarts_total{kind=\"failure\"} 1",
            "accel_agent_restarts_total{kind=\"membership\"} 0",
            "accel_agent_round_formation_seconds_count 1",
            "accel_agent_recovery_seconds_count 1",
            "accel_agent_store_connections_total 1",
            "accel_agent_store_open_connections 1",
            "accel_agent_store_operations_total{op=\"get\"} 1",
            "accel_agent_store_operations_total{op=\"set\"} 0",
            "accel_agent_tee_lines_dropped_total 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn readiness_starts_false_and_follows_the_driver() {
        let m = AgentMetrics::default();
        assert_eq!(m.ready(), Err("starting".into()));
        m.set_ready(Ok(()));
        assert_eq!(m.ready(), Ok(()));
    }
}
