//! What the rendezvous server counts, for Prometheus (`--metrics-bind`).
//!
//! Two kinds of numbers. *Events* (rounds formed, restarts, failures, nodes
//! dropped, jobs ended, calls by method and code, store writes, and how
//! long rounds take to form) are counted where they happen, into
//! [`ServerMetrics`], which every registry and the gRPC layer share.
//! *States* (jobs by phase, nodes by state, each running job's restarts)
//! are read from the serving registry at scrape time ([`States`]), so they
//! are never stale and cost nothing between scrapes; on a follower there is
//! no registry and they are absent, while `accel_rdzv_leader` says which
//! replica leads.
//!
//! Labels are bounded vocabularies (phases, states, gRPC codes, method
//! names), with one exception: the per-job restart gauges carry the job id
//! (label `rdzv_id`),
//! for at most [`JOB_SERIES`] running jobs. Nothing else a client sends
//! becomes a label, so a hostile client cannot grow the series count.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry as Prometheus, Unit};
use tokio::sync::watch;

use crate::ha::Role;

/// Running jobs whose restart gauges are exported (the first, by id).
pub const JOB_SERIES: usize = 1000;

/// Why a server-wide quarantine got no place or lost it: the labels of
/// `accel_rdzv_quarantines_refused_total`.
pub const QUARANTINE_REFUSALS: [&str; 3] = ["job_share", "full", "evicted"];

/// One label, from a fixed vocabulary.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

/// Why, from a fixed vocabulary.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rpc {
    method: &'static str,
    code: &'static str,
}

/// The server's event counters; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics(Arc<Counters>);

#[derive(Debug)]
struct Counters {
    rounds_formed: Counter,
    restarts: Family<Kind, Counter>,
    failures: Family<Kind, Counter>,
    nodes_dropped: Family<Kind, Counter>,
    nodes_joined: Family<Kind, Counter>,
    nodes_left: Counter,
    jobs_ended: Family<Kind, Counter>,
    job_time: Family<CategoryLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    rpcs: Family<Rpc, Counter>,
    store_writes: Family<Kind, Counter>,
    rendezvous: Histogram,
    reform: Histogram,
    leader: Gauge,
    leaders_deposed: Counter,
    quarantines: Counter,
    quarantines_refused: Family<Reason, Counter>,
}

impl Default for Counters {
    fn default() -> Self {
        // 10 ms to ~10 min: a round forms in milliseconds once its nodes
        // are there; waiting for nodes takes as long as they take.
        let buckets = || Histogram::new(exponential_buckets(0.01, 2.0, 17));
        Self {
            rounds_formed: Counter::default(),
            restarts: Family::default(),
            failures: Family::default(),
            nodes_dropped: Family::default(),
            nodes_joined: Family::default(),
            nodes_left: Counter::default(),
            jobs_ended: Family::default(),
            job_time: Family::default(),
            rpcs: Family::default(),
            store_writes: Family::default(),
            rendezvous: buckets(),
            reform: buckets(),
            leader: Gauge::default(),
            leaders_deposed: Counter::default(),
            quarantines: Counter::default(),
            quarantines_refused: Family::default(),
        }
    }
}

/// Arrivals and departures of one job, as the registry tallies them.
#[derive(Debug, Default, Clone, Copy)]
pub struct Movements {
    /// New members.
    pub joined: u64,
    /// Members that reconnected and resumed.
    pub resumed: u64,
    /// Members that left (said so).
    pub left: u64,
    /// Members whose stream broke.
    pub disconnected: u64,
    /// Members dropped for sending no keep-alive in time.
    pub silent: u64,
    /// Members dropped because their etcd lease expired (agent-only
    /// rendezvous: their presence key vanished).
    pub expired: u64,
    /// Members disconnected for not reading their events.
    pub too_slow: u64,
}

impl ServerMetrics {
    /// Registers the counters in `registry` (once per process). Every
    /// label a counter can have is there from the start, at 0, so a rate
    /// over a counter that has not moved yet is 0, not "no data".
    pub fn register(&self, registry: &mut Prometheus) {
        let c = &self.0;
        for (family, kinds) in [
            (&c.restarts, &["failure", "membership"][..]),
            (&c.failures, &["exit", "signal"]),
            (
                &c.nodes_dropped,
                &["disconnected", "silent", "too_slow", "lease_expired"],
            ),
            (&c.nodes_joined, &["new", "resumed"]),
            (&c.jobs_ended, &["succeeded", "failed"]),
            (&c.store_writes, &["ok", "error"]),
        ] {
            for kind in kinds {
                let _ = family.get_or_create(&Kind { kind });
            }
        }
        for category in CATEGORIES {
            let _ = c.job_time.get_or_create(&CategoryLabel { category });
        }
        for reason in QUARANTINE_REFUSALS {
            let _ = c.quarantines_refused.get_or_create(&Reason { reason });
        }
        registry.register(
            "accel_rdzv_rounds_formed",
            "Rounds formed (every member got its rank)",
            c.rounds_formed.clone(),
        );
        registry.register(
            "accel_rdzv_restarts",
            "Rounds abandoned for a new one; kind=failure counts against max_restarts, kind=membership does not",
            c.restarts.clone(),
        );
        registry.register(
            "accel_rdzv_failures",
            "Worker failures reported by agents, by kind (exit: non-zero exit code; signal: killed by a signal)",
            c.failures.clone(),
        );
        registry.register(
            "accel_rdzv_nodes_dropped",
            "Members the server stopped counting on, by reason (silent: no keep-alive within the drop limit; disconnected: stream broke; too_slow: did not read its events)",
            c.nodes_dropped.clone(),
        );
        registry.register(
            "accel_rdzv_nodes_joined",
            "Nodes that joined a job (kind=new) or reconnected and resumed (kind=resumed)",
            c.nodes_joined.clone(),
        );
        registry.register(
            "accel_rdzv_nodes_left",
            "Members that left their job saying so (an agent that exits, or stops)",
            c.nodes_left.clone(),
        );
        registry.register(
            "accel_rdzv_jobs_ended",
            "Jobs that ended, by outcome",
            c.jobs_ended.clone(),
        );
        registry.register(
            "accel_rdzv_job_time_seconds",
            "Time of the jobs that ended, by category of rdzv-server's goodput accounting (productive: steps past the best reached before; recomputation: steps redone after a restart; recovery: from a restart to the next first step; start-up: the first round to its first step; waiting: forming the first round, or short of nodes); the categories of a job add up to its wall time",
            c.job_time.clone(),
        );
        registry.register(
            "accel_rdzv_rpcs",
            "gRPC calls answered, by method and status code (a stream's code is that of its opening)",
            c.rpcs.clone(),
        );
        registry.register(
            "accel_rdzv_store_writes",
            "Batches of job state written to etcd, by result",
            c.store_writes.clone(),
        );
        registry.register_with_unit(
            "accel_rdzv_rendezvous_duration",
            "From a job's first join to its first round formed",
            Unit::Seconds,
            c.rendezvous.clone(),
        );
        registry.register_with_unit(
            "accel_rdzv_reform_duration",
            "From a restart (or membership change) to the next round formed",
            Unit::Seconds,
            c.reform.clone(),
        );
        registry.register(
            "accel_rdzv_leader",
            "1 while this process serves the rendezvous (the leader, or the only server), 0 while it follows",
            c.leader.clone(),
        );
        registry.register(
            "accel_rdzv_leaders_deposed",
            "Leaders this replica deposed (revoked their etcd lease) because most nodes of a job reported them silent",
            c.leaders_deposed.clone(),
        );
        registry.register(
            "accel_rdzv_quarantines",
            "Hosts quarantined because their workers failed --quarantine-after times within --quarantine-window",
            c.quarantines.clone(),
        );
        registry.register(
            "accel_rdzv_quarantines_refused",
            "Quarantines that got no place in the server-wide table (--quarantine-scope server), or lost it, by reason (job_share: the job holds its share of the table; full: every place holds a quarantine from a job that ran; evicted: a quarantine from a job that had not run gave its place to a newer one); each still holds in the job that made it",
            c.quarantines_refused.clone(),
        );
    }

    /// A job quarantined a host.
    pub fn quarantined(&self) {
        self.0.quarantines.inc();
    }

    /// A server-wide quarantine got no place, or lost it, for `reason` (one
    /// of [`QUARANTINE_REFUSALS`]).
    pub fn quarantine_refused(&self, reason: &'static str) {
        debug_assert!(QUARANTINE_REFUSALS.contains(&reason), "{reason}");
        self.0
            .quarantines_refused
            .get_or_create(&Reason { reason })
            .inc();
    }

    /// A round formed, `took` after its rendezvous or re-form began (if the
    /// server saw it begin); `first`: the job's first round.
    pub fn round_formed(&self, took: Option<Duration>, first: bool) {
        self.0.rounds_formed.inc();
        if let Some(t) = took {
            let h = if first {
                &self.0.rendezvous
            } else {
                &self.0.reform
            };
            h.observe(t.as_secs_f64());
        }
    }

    /// A round was abandoned for a new one.
    pub fn restart(&self, counted: bool) {
        let kind = if counted { "failure" } else { "membership" };
        self.0.restarts.get_or_create(&Kind { kind }).inc();
    }

    /// An agent's report of a worker failure, with this exit code (negative:
    /// killed by that signal, as torch reports it), changed its job (one
    /// repeated after a reconnect, or for a round already over, does not).
    pub fn failure(&self, exit_code: i32) {
        let kind = if exit_code < 0 { "signal" } else { "exit" };
        self.0.failures.get_or_create(&Kind { kind }).inc();
    }

    /// A job ended, its time spent as `goodput` says.
    pub fn job_ended(&self, succeeded: bool, goodput: Option<&accel_proto::v1::Goodput>) {
        let kind = if succeeded { "succeeded" } else { "failed" };
        self.0.jobs_ended.get_or_create(&Kind { kind }).inc();
        for (category, ms) in goodput.map(|g| g.categories()).unwrap_or_default() {
            self.0
                .job_time
                .get_or_create(&CategoryLabel { category })
                .inc_by(ms as f64 / 1000.0);
        }
    }

    /// Members that came and went.
    pub fn movements(&self, m: &Movements) {
        for (n, family, kind) in [
            (m.joined, &self.0.nodes_joined, "new"),
            (m.resumed, &self.0.nodes_joined, "resumed"),
            (m.disconnected, &self.0.nodes_dropped, "disconnected"),
            (m.silent, &self.0.nodes_dropped, "silent"),
            (m.too_slow, &self.0.nodes_dropped, "too_slow"),
            (m.expired, &self.0.nodes_dropped, "lease_expired"),
        ] {
            if n > 0 {
                family.get_or_create(&Kind { kind }).inc_by(n);
            }
        }
        self.0.nodes_left.inc_by(m.left);
    }

    /// A store write finished.
    pub fn store_write(&self, ok: bool) {
        let kind = if ok { "ok" } else { "error" };
        self.0.store_writes.get_or_create(&Kind { kind }).inc();
    }

    /// This replica deposed a leader its nodes could not reach.
    pub fn leader_deposed(&self) {
        self.0.leaders_deposed.inc();
    }

    /// Whether this process serves now.
    pub fn set_leader(&self, leading: bool) {
        self.0.leader.set(i64::from(leading));
    }

    /// A gRPC call's answer.
    pub fn rpc(&self, path: &str, code: i32) {
        let method = method_name(path);
        let code = code_name(code);
        self.0.rpcs.get_or_create(&Rpc { method, code }).inc();
    }
}

/// The method part of a gRPC path, from the services this server has.
fn method_name(path: &str) -> &'static str {
    let method = path.rsplit('/').next().unwrap_or_default();
    const KNOWN: [&str; 10] = [
        "Join",
        "Ready",
        "KeepAlive",
        "ReportFailure",
        "ReportSuccess",
        "Leave",
        "JobStatus",
        // grpc.health.v1.Health
        "Check",
        "Watch",
        "List",
    ];
    KNOWN.into_iter().find(|k| *k == method).unwrap_or("other")
}

/// gRPC's canonical name of a status code.
fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

/// What the serving registry holds, summed for a scrape.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Jobs by phase name.
    pub jobs: Vec<(&'static str, u64)>,
    /// Members by state (`joining`, `ready`, `running`, `spare`,
    /// `quarantined`, `succeeded`, `done`).
    pub nodes: Vec<(&'static str, u64)>,
    /// Hosts quarantined now (server-wide ones once, else per job).
    pub quarantined_hosts: u64,
    /// Places left in the server-wide quarantine table (all of them with
    /// `--quarantine-scope job`, which does not use it).
    pub quarantine_free: u64,
    /// Running (not finished) jobs, the first [`JOB_SERIES`] by id: id,
    /// restarts used, restarts allowed.
    pub restarts: Vec<(String, u32, u32)>,
    /// Jobs the server holds (finished ones too), the first [`JOB_SERIES`]
    /// by id: id, milliseconds per category ([`CATEGORIES`]' order).
    pub time: Vec<(String, [u64; 5])>,
    /// The running jobs' stragglers (of the first [`JOB_SERIES`] jobs): job,
    /// host, global rank, its time per step and the job's median (µs).
    pub stragglers: Vec<(String, String, u32, u64, u64)>,
    /// Forming jobs (the first [`JOB_SERIES`] by id): id, and how long
    /// since the round they form began (the job's first join, its last
    /// restart, or, on a replica that took the job over, the take-over).
    pub forming: Vec<(String, Duration)>,
}

/// The goodput categories, as labels (`crate::job::Category`).
pub const CATEGORIES: [&str; 5] = [
    "productive",
    "recomputation",
    "recovery",
    "start-up",
    "waiting",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabel {
    category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StragglerLabel {
    rdzv_id: String,
    host: String,
    rank: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobCategory {
    rdzv_id: String,
    category: &'static str,
}

/// How long one summary of the registry answers scrapes: however many
/// scrapers there are, the registry's lock is taken for it at most once per
/// interval.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(1);

/// The state gauges, read at scrape time from whichever registry serves.
#[derive(Debug)]
pub struct States {
    seat: watch::Receiver<Role>,
    /// The last summary, and when it was taken.
    last: std::sync::Mutex<Option<(std::time::Instant, Summary)>>,
}

impl States {
    /// Gauges over the registry `seat` serves with.
    pub fn new(seat: watch::Receiver<Role>) -> Self {
        Self {
            seat,
            last: std::sync::Mutex::new(None),
        }
    }

    /// The serving registry's summary, at most [`SUMMARY_EVERY`] old;
    /// `None` on a follower.
    fn summary(&self) -> Option<Summary> {
        // Cloned out, so the role is not held while the jobs are counted.
        let registry = match &*self.seat.borrow() {
            Role::Leader(registry) => crate::Registry::clone(registry),
            Role::Follower { .. } => return None,
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        match &*last {
            Some((at, s)) if now.saturating_duration_since(*at) < SUMMARY_EVERY => Some(s.clone()),
            _ => {
                let s = registry.summary();
                *last = Some((now, s.clone()));
                Some(s)
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabel {
    /// Not `job`: Prometheus gives every scraped series a `job` label of
    /// its own (the scrape job's name).
    rdzv_id: String,
}

/// One gauge family of the scrape: `name` with one sample per
/// `(labels, value)`.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (L, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(e.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for States {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(summary) = self.summary() else {
            return Ok(());
        };
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        gauges(
            &mut encoder,
            "accel_rdzv_jobs",
            "Jobs the server holds, by phase",
            summary
                .jobs
                .iter()
                .map(|(phase, n)| (Phase { phase }, count(*n))),
        )?;
        gauges(
            &mut encoder,
            "accel_rdzv_nodes",
            "Members of the jobs the server holds, by state (spare: waits for a slot while the job runs at its maximum)",
            summary.nodes.iter().map(|(state, n)| (State { state }, count(*n))),
        )?;
        let job = |id: &String| JobLabel {
            rdzv_id: id.clone(),
        };
        gauges(
            &mut encoder,
            "accel_rdzv_job_restarts",
            "Restarts a running job has used of its job-wide max_restarts",
            summary
                .restarts
                .iter()
                .map(|(id, used, _)| (job(id), i64::from(*used))),
        )?;
        gauges(
            &mut encoder,
            "accel_rdzv_job_restarts_remaining",
            "Restarts a running job has left before the next failure fails it",
            summary
                .restarts
                .iter()
                .map(|(id, used, max)| (job(id), i64::from(max.saturating_sub(*used)))),
        )?;
        let mut e = encoder.encode_descriptor(
            "accel_rdzv_job_forming_seconds",
            "How long each forming job has waited for its round: since its first join or its last restart (on a replica that took the job over, since the take-over); forming jobs only",
            None,
            MetricType::Gauge,
        )?;
        for (id, waited) in &summary.forming {
            ConstGauge::new(waited.as_secs_f64()).encode(e.encode_family(&job(id))?)?;
        }
        let mut e = encoder.encode_descriptor(
            "accel_rdzv_job_seconds",
            "Where each job's time went so far, by category of the goodput accounting (see accel_rdzv_job_time_seconds_total); the categories add up to the job's wall time",
            None,
            MetricType::Gauge,
        )?;
        for (id, ms) in &summary.time {
            for (category, ms) in CATEGORIES.into_iter().zip(ms) {
                let labels = JobCategory {
                    rdzv_id: id.clone(),
                    category,
                };
                ConstGauge::new(*ms as f64 / 1000.0).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "accel_rdzv_straggler_slowdown",
            "Ranks of running jobs persistently slower per step than their job's median (by more than 25 %), with their host: their time per step over the median (at most 16 per job)",
            None,
            MetricType::Gauge,
        )?;
        for (id, host, rank, step_us, median_us) in &summary.stragglers {
            let ratio = *step_us as f64 / (*median_us).max(1) as f64;
            let labels = StragglerLabel {
                rdzv_id: id.clone(),
                host: host.clone(),
                rank: *rank,
            };
            ConstGauge::new(ratio).encode(e.encode_family(&labels)?)?;
        }
        let e = encoder.encode_descriptor(
            "accel_rdzv_quarantined_hosts",
            "Hosts quarantined now (--quarantine-after): no round places them until their quarantine ends",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(count(summary.quarantined_hosts)).encode(e)?;
        let e = encoder.encode_descriptor(
            "accel_rdzv_quarantine_table_free",
            "Places left in the server-wide quarantine table (--quarantine-scope server; 256 hosts, all free with job scope): at 0, a new quarantine takes the place of the least recent one from a job that had not run, or is refused",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(count(summary.quarantine_free)).encode(e)
    }
}

/// A tower layer counting every gRPC call by method and status code.
#[derive(Debug, Clone)]
pub struct CountRpcs(pub ServerMetrics);

impl<S> tower::Layer<S> for CountRpcs {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A service whose calls [`CountRpcs`] counts.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    metrics: ServerMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut path = String::new();
        let _ = write!(path, "{}", req.uri().path());
        let metrics = self.metrics.clone();
        let call = self.inner.call(req);
        Box::pin(async move {
            let answer = call.await;
            if let Ok(r) = &answer {
                // An error answer carries its code in the headers (a
                // "trailers-only" response); a call that goes on (a stream,
                // a unary answer) is OK so far.
                let code = r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                metrics.rpc(&path, code);
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::prometheus_text::encode;

    fn scrape(m: &ServerMetrics) -> String {
        let mut r = Prometheus::default();
        m.register(&mut r);
        let mut out = String::new();
        encode(&mut out, &r).expect("encode");
        out
    }

    #[test]
    fn events_are_counted_under_bounded_labels() {
        let m = ServerMetrics::default();
        m.round_formed(Some(Duration::from_millis(30)), true);
        m.round_formed(Some(Duration::from_millis(5)), false);
        m.restart(true);
        m.failure(1);
        m.failure(-9);
        m.job_ended(false, None);
        m.movements(&Movements {
            joined: 3,
            silent: 1,
            ..Default::default()
        });
        m.rpc("/accel.rendezvous.v1.Rendezvous/Join", 0);
        m.rpc("/x.Y/Unheard", 16);
        m.rpc("/accel.rendezvous.v1.Rendezvous/Ready", 99);
        let text = scrape(&m);
        for line in [
            "accel_rdzv_rounds_formed_total 2",
            "accel_rdzv_restarts_total{kind=\"failure\"} 1",
            "accel_rdzv_failures_total{kind=\"exit\"} 1",
            "accel_rdzv_failures_total{kind=\"signal\"} 1",
            "accel_rdzv_jobs_ended_total{kind=\"failed\"} 1",
            "accel_rdzv_nodes_joined_total{kind=\"new\"} 3",
            "accel_rdzv_nodes_dropped_total{kind=\"silent\"} 1",
            "accel_rdzv_rpcs_total{method=\"Join\",code=\"OK\"} 1",
            "accel_rdzv_rpcs_total{method=\"other\",code=\"UNAUTHENTICATED\"} 1",
            "accel_rdzv_rpcs_total{method=\"Ready\",code=\"UNKNOWN\"} 1",
            "accel_rdzv_rendezvous_duration_seconds_count 1",
            "accel_rdzv_reform_duration_seconds_count 1",
            "accel_rdzv_leader 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_follower_exports_no_job_states() {
        let (_tx, rx) = watch::channel(Role::Follower { leader: None });
        let mut r = Prometheus::default();
        r.register_collector(Box::new(States::new(rx)));
        let mut out = String::new();
        encode(&mut out, &r).expect("encode");
        assert!(!out.contains("accel_rdzv_jobs"), "{out}");
    }
}
