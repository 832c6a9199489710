//! The rendezvous [`Job`] state machine driven as the gRPC service drives it,
//! by arbitrary sequences of requests from a handful of nodes, server
//! restarts and steps of the clock. After every step it checks:
//! - no panic, and every refusal renders as a message;
//! - one round at a time: the round number never decreases and moves by at
//!   most one per step; a terminal job stays terminal;
//! - the restart budget: `restart_count` never decreases and never exceeds
//!   `max_restarts`, and a fenced node's report (no worker failed) never
//!   spends it;
//! - node ranks: a completed round hands out ranks `0..n` once each, with
//!   `n` within `[min_nodes, max_nodes]` and consistent sizes; a running
//!   round's participants are unique and every ranked member sits at its
//!   rank; static ranks are unique and in range;
//! - members: the ready count equals the members that are ready and not
//!   benched, the benched count the members whose host is benched; nobody
//!   is ready or succeeded in a way the phase forbids; the success count
//!   covers the members that succeeded and never exceeds the participants;
//! - quarantine: no member whose host is benched gets a rank in a round
//!   that completes while it is benched, and a report of a node that is not
//!   in the running round never benches its host;
//! - events go only to members (before or after the step), and a round that
//!   can complete has completed after every step that decides.
//!
//! # Keeping up with the Job API
//! Every call into `Job` (and the service's request validation) is in
//! [`Server`]'s impl block; a change of the API (session secrets, bounds)
//! changes that block only.
//!
//! # Input
//! A sequence of operations, each an opcode byte (mod 12) and its fields.
//! Numbers are one byte below 0xF0, else 0xF0 and 4 (u32) or 8 (u64) bytes
//! little-endian. A round is one byte relative to the job's current round
//! (0 current, 1 next, 2 previous; 3..0xEF that number; 0xF0 and 8 bytes).
//! - 0 join: node, host, flags (1 same settings as before, 2 node_rank,
//!   4 resume, bits 3-4 the topology path, 32 `--no-restart-exit-code 93`,
//!   16 and 128 together `--nnodes-multiple-of 2`),
//!   then unless flag 1 min, max, nproc, max_restarts (u32),
//!   dead_after_ms, last_call_ms (u64); with 2 the node rank (u32); with 4
//!   round, restart_count, node_rank, nnodes;
//! - 1 ready: node, round, endpoint byte; 2 keep-alive: node;
//! - 3 failure: node, round, detail byte (bit 0: a failure detail; bit 1:
//!   the node's workers were fenced, not failed; bit 2: exit code 93 with
//!   the "do not restart" flag); 4 success: node, round;
//! - 5 leave: node; 6 tick; 7 clock: milliseconds (u32);
//! - 8 close: may_rejoin byte; 9 the server restarts (forgets the job);
//! - 10 the server's quarantine flags: after byte (mod 4; 0: off), window
//!   and hold in milliseconds (u32 each), for the job and every job it
//!   creates from then on (as a restart with other flags would);
//! - 11 a host's bench (an operator, or a server-wide quarantine): host
//!   byte, milliseconds (u32): 0 releases the host, else benches it for
//!   that long.
//!
//! `fuzz/seeds.py` writes the seeds in `fuzz/corpus/rdzv_job/`. To see what
//! a crashing input does, replay it with `RDZV_FUZZ_TRACE=1` in the
//! environment: every step and its events are printed.

#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use libfuzzer_sys::fuzz_target;
use pb::event::Kind;
use rendezvous_server::store::records;
use rendezvous_server::job::{
    decide, fuzzing, Category, Decision, Job, Member, Outbound, Phase, QuarantinePolicy, Session, Spent,
    SESSION_BYTES,
};

/// The most nodes a job may have here: the service's default limits
/// otherwise. A relearned job holds a placeholder per node of its round, and
/// every step checks every member, so with the default 100,000 one input
/// could take seconds (a timeout in the CI run); the logic is the same at
/// 256, and scale is measured by the benchmarks.
const MAX_NODES_PER_JOB: u32 = 256;

/// The service's checks of a join.
fn validate_join(req: &pb::JoinRequest) -> Result<(), rendezvous_server::Error> {
    let limits = rendezvous_server::Limits {
        max_nodes_per_job: MAX_NODES_PER_JOB,
        ..rendezvous_server::Limits::default()
    };
    rendezvous_server::limits::check_join(req, &limits)
}

/// Every node's session secret: this target checks the state machine's
/// invariants; who may call for a node is the service's check, fuzzed
/// through the integration tests.
const SESSION: Session = Session::from_bytes([7; SESSION_BYTES]);

/// Topology paths joining nodes choose from.
const TOPOLOGIES: [&str; 4] = ["", "r1", "r2", "z/r10"];
const JOB_ID: &str = "job";
/// Node ids: a few honest ones, one that mimics a relearned job's
/// placeholder, and an invalid empty one.
const NODES: [&str; 7] = ["n0", "n1", "n2", "n3", "n4", "\u{0}absent-rank-0", ""];
/// Host names, including ones that sort first and carry control characters.
const HOSTS: [&str; 6] = ["host-b", "host-a", "host-c", "", "\u{1b}[2Jevil", "aaaaaaaaaaaaaaaa"];
/// How long the registry remembers a finished job after its last node left.
const FINISHED_TTL: Duration = Duration::from_millis(100);
/// The clock never runs further than this from the start (Instant's range).
const MAX_ELAPSED: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data, at: 0 };
    let mut server = Server::new();
    let mut settings = Settings {
        min: 1,
        max: 1,
        nproc: 1,
        max_restarts: 0,
        dead_after_ms: 0,
        last_call_ms: 0,
        outage_ms: 0,
        keep_alive_ms: 0,
        max_no_progress_restarts: 0,
        nnodes_multiple_of: 0,
        scale_up_settle_ms: 0,
    };
    let trace = std::env::var_os("RDZV_FUZZ_TRACE").is_some();
    while !input.done() {
        let before = server.snapshot();
        let at = input.at;
        let round = |input: &mut Input<'_>, s: &Server| input.round(s.job.as_ref().map_or(0, Job::round));
        let (out, decides) = match input.byte() % 12 {
            0 => {
                let node = input.node();
                let host = HOSTS[usize::from(input.byte()) % HOSTS.len()];
                let flags = input.byte();
                if flags & 1 == 0 {
                    settings = Settings {
                        min: input.u32(),
                        max: input.u32(),
                        nproc: input.u32(),
                        max_restarts: input.u32(),
                        dead_after_ms: input.u64(),
                        last_call_ms: input.u64(),
                        // Agents that ride out outages (mass-silence holds),
                        // or older ones.
                        outage_ms: if flags & 64 == 64 { input.u64() } else { 0 },
                        keep_alive_ms: if flags & 64 == 64 { input.u64() } else { 0 },
                        // Ended after this many restarts without progress.
                        max_no_progress_restarts: u32::from(flags >> 7) * 2,
                        // Rounds of pairs only (--nnodes-multiple-of 2).
                        nnodes_multiple_of: if flags & 144 == 144 { 2 } else { 0 },
                        // ...growing a running round after a settle time.
                        scale_up_settle_ms: if flags & 152 == 152 { 800 } else { 0 },
                    };
                }
                let node_rank = (flags & 2 != 0).then(|| input.u32());
                let resume = (flags & 4 != 0).then(|| pb::Resume {
                    round: round(&mut input, &server),
                    restart_count: input.u32(),
                    node_rank: input.u32(),
                    nnodes: input.u32(),
                });
                let mut req = settings.request(node, host, node_rank, resume);
                // Segments: nodes of one path get contiguous ranks, a
                // departed node's place goes to one of its segment.
                req.topology = TOPOLOGIES[usize::from(flags >> 3) % TOPOLOGIES.len()].into();
                req.no_restart_exit_code = if flags & 32 == 32 { 93 } else { 0 };
                (server.join(&req), false)
            }
            1 => {
                let node = input.node();
                let r = round(&mut input, &server);
                let endpoint = match input.byte() {
                    0 => (String::new(), 0),
                    b => (format!("10.0.0.{b}"), 29_500 + u32::from(b)),
                };
                let decides = before.forming_member(node) && before.job.as_ref().is_some_and(|j| j.round == r);
                (server.ready(node, r, endpoint), decides)
            }
            2 => {
                let node = input.node();
                server.keep_alive(node);
                let flags = input.byte();
                if flags & 1 == 1 {
                    // A vouch for peers: some ranks, or the whole round.
                    let r = round(&mut input, &server);
                    let ranks: Vec<u8> = (0..usize::from(flags >> 5)).map(|_| input.byte()).collect();
                    server.vouch(node, r, &ranks, flags & 2 == 2);
                }
                let mut out = Vec::new();
                if flags & 4 == 4 {
                    // Its workers' progress (`accel.progress`).
                    let r = round(&mut input, &server);
                    let step = u64::from(input.u32() % 64);
                    // A checkpoint, and when the steps were (ms ago, any).
                    let saved = (flags & 8 == 8).then(|| step.saturating_sub(u64::from(input.byte() % 16)));
                    let ago = (u64::from(input.u32()), u64::from(input.u32()));
                    // Its ranks' times per step (a straggler's, a quarantine's).
                    let times: Vec<u64> = (0..usize::from((flags >> 4) & 1) * 2).map(|_| 100_000 + u64::from(input.byte()) * 1000).collect();
                    out = server.progress(node, r, step, saved, ago, &times);
                }
                (out, false)
            }
            3 => {
                let node = input.node();
                let r = round(&mut input, &server);
                let flags = input.byte();
                if flags & 2 == 2 {
                    let out = server.fenced(node, r);
                    let spent = server.job.as_ref().map(Job::restart_count);
                    assert_eq!(
                        spent,
                        before.job.as_ref().map(|j| j.restart_count),
                        "a fenced node's report spent the restart budget"
                    );
                    (out, false)
                } else {
                    let detail = (flags & 1 == 1).then(|| pb::Failure {
                        host: "host".into(),
                        message: "RuntimeError: boom".into(),
                        ..Default::default()
                    });
                    // A "do not restart" code ends the job at once with it.
                    let fatal = (flags & 4 == 4).then_some(93);
                    let in_round = before.job.as_ref().is_some_and(|j| j.round == r && j.phase == Phase::Running)
                        && server.job.as_ref().is_some_and(|j| j.members().get(node).is_some_and(|m| m.rank.is_some()));
                    let benched_before = server.job.as_ref().map(|j| j.quarantine().benched().count());
                    let out = server.failure(node, r, detail, fatal);
                    if !in_round && same_generation(&server, &before) {
                        assert_eq!(
                            server.job.as_ref().map(|j| j.quarantine().benched().count()),
                            benched_before,
                            "a report from outside the running round benched a host"
                        );
                    }
                    let agreed = server.job.as_ref().is_some_and(|j| j.config().no_restart_exit_code == Some(93));
                    // No progress ends the job without spending a restart.
                    let stuck = out.iter().any(|o| matches!(&o.event, Kind::JobFailed(f) if f.reason.contains("; no progress: ")));
                    if stuck {
                        assert_eq!(
                            server.job.as_ref().map(Job::restart_count),
                            before.job.as_ref().map(|b| b.restart_count),
                            "a no-progress verdict spent the restart budget"
                        );
                    }
                    if fatal.is_some() && agreed && out.iter().any(|o| matches!(o.event, Kind::JobFailed(_))) {
                        let j = server.job.as_ref().expect("a job failed");
                        assert_eq!(j.exit_code(), 93, "a no-restart failure lost its code");
                        assert_eq!(
                            Some(j.restart_count()),
                            before.job.as_ref().map(|b| b.restart_count),
                            "a no-restart failure spent the restart budget"
                        );
                    }
                    (out, false)
                }
            }
            4 => {
                let node = input.node();
                let r = round(&mut input, &server);
                (server.success(node, r), false)
            }
            5 => {
                let node = input.node();
                let decides = before.forming_member(node);
                (server.leave(node), decides)
            }
            6 => (server.tick(), true),
            7 => {
                let ms = Duration::from_millis(u64::from(input.u32()));
                server.elapsed = (server.elapsed + ms).min(MAX_ELAPSED);
                (Vec::new(), false)
            }
            8 => {
                let may_rejoin = input.byte() & 1 == 1;
                (server.close(may_rejoin), false)
            }
            10 => {
                let after = u32::from(input.byte() % 4);
                let window = Duration::from_millis(u64::from(input.u32()));
                let hold = Duration::from_millis(u64::from(input.u32()));
                let stragglers = input.byte() & 1 == 1;
                server.set_quarantine((after > 0).then_some(QuarantinePolicy { after, window, hold, stragglers }));
                (Vec::new(), false)
            }
            11 => {
                let host = HOSTS[usize::from(input.byte()) % HOSTS.len()];
                let ms = input.u32();
                server.bench(host, ms)
            }
            _ => {
                server.job = None;
                (Vec::new(), false)
            }
        };
        if trace {
            eprintln!("step at byte {at}: {:?}", &data[at..input.at.min(data.len())]);
            if let Some(j) = &server.job {
                let i = fuzzing::internals(j);
                eprintln!(
                    "  job: round {} {:?}, restarts {}, ready {}, benched {} {:?}, succeeded {}, participants {:?}",
                    j.round(),
                    j.phase(),
                    j.restart_count(),
                    i.ready,
                    i.benched,
                    j.quarantine().benched().map(|(h, _)| h).collect::<Vec<_>>(),
                    i.succeeded,
                    &i.participants[..i.participants.len().min(8)]
                );
                for (id, m) in j.members().iter().take(16) {
                    eprintln!("  member {id:?}: rank {:?} ready {:?} succeeded {}", m.rank, m.ready, m.succeeded);
                }
            }
            for o in &out {
                eprintln!("  -> {:?}: {:?}", o.to, o.event);
            }
        }
        check(&server, &before, &out, decides);
    }
    check_round_trip(&server);
    check_stored_form(&server);
});

/// Members up to which every step checks the record round trip.
const ROUND_TRIP_MEMBERS: usize = 16;

/// A job's record restores to the same job.
fn check_round_trip(server: &Server) {
    let Some(job) = &server.job else {
        return;
    };
    let now = server.now();
    let record = job.record(now);
    assert_eq!(Job::restore(record.clone(), now).record(now), record, "a record restores to another job");
}

/// A job's record, as a key-value store keeps it, is the same record but
/// for the members' last signs of life (which a store does not keep).
/// Checked at the end of each input: encoding is stateless, and checking it
/// at every step would halve the executions.
fn check_stored_form(server: &Server) {
    let Some(job) = &server.job else {
        return;
    };
    let record = job.record(server.now());
    let encoded = records::encode(&record);
    let mut expected = record;
    for (_, m) in &mut expected.members {
        m.last_seen = 0;
    }
    let decoded = records::decode(&expected.id, &encoded).expect("a job's own encoding decodes");
    assert_eq!(decoded, expected, "the stored form of a job is another job");
    let mut held = BTreeMap::new();
    for change in records::diff(&expected.id, None, &encoded) {
        records::apply(&mut held, &change);
    }
    assert_eq!(held.get(&expected.id), Some(&encoded), "a job's writes hold another job");
}

/// The settings a join request carries.
#[derive(Debug, Clone, Copy)]
struct Settings {
    min: u32,
    max: u32,
    nproc: u32,
    max_restarts: u32,
    dead_after_ms: u64,
    last_call_ms: u64,
    outage_ms: u64,
    keep_alive_ms: u64,
    max_no_progress_restarts: u32,
    nnodes_multiple_of: u32,
    scale_up_settle_ms: u64,
}

impl Settings {
    fn request(
        &self,
        node: &str,
        host: &str,
        node_rank: Option<u32>,
        resume: Option<pb::Resume>,
    ) -> pb::JoinRequest {
        pb::JoinRequest {
            job_id: JOB_ID.into(),
            node_id: node.into(),
            hostname: host.into(),
            min_nodes: self.min,
            max_nodes: self.max,
            nproc_per_node: self.nproc,
            max_restarts: self.max_restarts,
            node_rank,
            dead_after_ms: self.dead_after_ms,
            last_call_ms: self.last_call_ms,
            resume,
            session: SESSION.to_vec(),
            silent_replica: String::new(),
            topology: String::new(),
            no_restart_exit_code: 0,
            agent_version: String::new(),
            outage_ms: self.outage_ms,
            keep_alive_ms: self.keep_alive_ms,
            started_unix_ms: 0,
            max_no_progress_restarts: self.max_no_progress_restarts,
            nnodes_multiple_of: self.nnodes_multiple_of,
            scale_up_settle_ms: self.scale_up_settle_ms,
        }
    }
}

/// One job's slot of the service's registry, and the server's clock.
struct Server {
    job: Option<Job>,
    start: Instant,
    elapsed: Duration,
    /// Bumped whenever the slot gets a new `Job` (so history resets).
    generation: u64,
    /// The server's quarantine flags (op 10).
    quarantine: Option<QuarantinePolicy>,
}

/// The adapter: the only code that calls the `Job` API, doing what
/// `rendezvous-server/src/service.rs` does for each request.
impl Server {
    fn new() -> Self {
        Self {
            job: None,
            start: Instant::now(),
            elapsed: Duration::ZERO,
            generation: 0,
            quarantine: None,
        }
    }

    fn now(&self) -> Instant {
        self.start + self.elapsed
    }

    fn join(&mut self, req: &pb::JoinRequest) -> Vec<Outbound> {
        if let Err(e) = validate_join(req) {
            assert!(!e.to_string().is_empty());
            return Vec::new();
        }
        let now = self.now();
        if self.job.is_none() {
            self.generation += 1;
        }
        let quarantine = self.quarantine;
        let job = self.job.get_or_insert_with(|| {
            match &req.resume {
                Some(resume) => Job::relearn(now, JOB_ID, req, resume),
                None => Job::new(JOB_ID, rendezvous_server::job::JobConfig::from_join(req)),
            }
            .with_quarantine(quarantine)
        });
        match job.join(now, &req.node_id, req, SESSION) {
            Ok(out) => out,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                if job.members().is_empty() {
                    self.job = None;
                }
                Vec::new()
            }
        }
    }

    fn ready(&mut self, node: &str, round: u64, endpoint: (String, u32)) -> Vec<Outbound> {
        let now = self.now();
        self.job
            .as_mut()
            .map(|j| j.ready(now, node, round, endpoint, None))
            .unwrap_or_default()
    }

    fn keep_alive(&mut self, node: &str) {
        let now = self.now();
        if let Some(j) = self.job.as_mut() {
            j.keep_alive(now, node);
        }
    }

    fn progress(&mut self, node: &str, round: u64, step: u64, saved: Option<u64>, ago: (u64, u64), times: &[u64]) -> Vec<Outbound> {
        let now = self.now();
        let Some(j) = self.job.as_mut() else {
            return Vec::new();
        };
        let (before, restarts) = (j.steps(), j.restart_count());
        let out = j.report_progress(
            now,
            node,
            &pb::Progress {
                round,
                ranks: 1,
                min_step: step,
                max_step: step,
                checkpoint_step: saved,
                first_step_ms_ago: ago.0,
                min_step_ms_ago: ago.1,
                hang_timeout_ms: 0,
                failing_step: None,
                rank_times: times.iter().enumerate().map(|(r, us)| pb::RankTime { local_rank: r as u32, step_us: *us }).collect(),
            },
        );
        if out.is_empty() {
            assert_eq!(j.steps().0, before.0, "a report changed the best of earlier rounds");
        }
        assert_eq!(j.restart_count(), restarts, "a progress report spent the restart budget");
        out
    }

    fn vouch(&mut self, node: &str, round: u64, ranks: &[u8], all: bool) {
        let now = self.now();
        if let Some(j) = self.job.as_mut() {
            let n = j.vouch(now, node, round, ranks, all);
            assert!(n <= j.participants().len(), "a vouch refreshed more nodes than the round has");
        }
    }

    fn failure(
        &mut self,
        node: &str,
        round: u64,
        detail: Option<pb::Failure>,
        fatal: Option<i32>,
    ) -> Vec<Outbound> {
        let now = self.now();
        let Some(j) = self.job.as_mut() else {
            return Vec::new();
        };
        let host = j.members().get(node).map_or(node.to_owned(), |m| m.hostname.clone());
        let reason = format!("worker rank 0 (local rank 0) on host '{host}' exited with 1");
        match fatal {
            Some(code) => j.fatal_failure(now, node, round, reason, detail, code),
            None => j.failure(now, node, round, reason, detail),
        }
    }

    fn fenced(&mut self, node: &str, round: u64) -> Vec<Outbound> {
        let now = self.now();
        self.job
            .as_mut()
            .map(|j| j.fenced(now, node, round, "stopped its workers (fencing)"))
            .unwrap_or_default()
    }

    fn success(&mut self, node: &str, round: u64) -> Vec<Outbound> {
        let now = self.now();
        self.job
            .as_mut()
            .map(|j| j.success(now, node, round))
            .unwrap_or_default()
    }

    fn leave(&mut self, node: &str) -> Vec<Outbound> {
        let now = self.now();
        self.job
            .as_mut()
            .map(|j| j.leave(now, node, "the agent is shutting down"))
            .unwrap_or_default()
    }

    /// The registry's periodic tick: the job's own, then forgetting it once expired.
    fn tick(&mut self) -> Vec<Outbound> {
        let now = self.now();
        let out = self.job.as_mut().map(|j| j.tick(now)).unwrap_or_default();
        if self.job.as_ref().is_some_and(|j| j.expired(now, FINISHED_TTL)) {
            self.job = None;
        }
        out
    }

    /// The quarantine flags, for the job and the jobs created from now on.
    fn set_quarantine(&mut self, policy: Option<QuarantinePolicy>) {
        self.quarantine = policy;
        self.job = self.job.take().map(|j| j.with_quarantine(policy));
    }

    /// Benches `host` for `ms` milliseconds, or releases it (0); whether
    /// the step decided (a bench began, or one ended).
    fn bench(&mut self, host: &str, ms: u32) -> (Vec<Outbound>, bool) {
        let now = self.now();
        let Some(j) = self.job.as_mut() else {
            return (Vec::new(), false);
        };
        if ms == 0 {
            return match j.release_host(now, host) {
                Some(out) => (out, true),
                None => (Vec::new(), false),
            };
        }
        let until = now + Duration::from_millis(u64::from(ms));
        match j.bench_host(now, host, until, "benched by the fuzzer".into()) {
            Some(out) => (out, true),
            None => (Vec::new(), false),
        }
    }

    fn close(&mut self, may_rejoin: bool) -> Vec<Outbound> {
        let now = self.now();
        self.job
            .as_mut()
            .map(|j| j.close(now, "the server is shutting down", may_rejoin))
            .unwrap_or_default()
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            generation: self.generation,
            job: self.job.as_ref().map(|j| JobSnapshot {
                round: j.round(),
                restart_count: j.restart_count(),
                phase: j.phase().clone(),
                members: j.members().keys().cloned().collect(),
                spent: j.time_spent(self.now()),
                closed: j.goodput().spent,
                at: self.now(),
            }),
        }
    }
}

/// Whether the slot holds the job it held before the step.
fn same_generation(server: &Server, before: &Snapshot) -> bool {
    server.generation == before.generation
}

/// What the checks compare a step's result with.
struct Snapshot {
    generation: u64,
    job: Option<JobSnapshot>,
}

impl Snapshot {
    /// Whether `node` was a member of a forming job: a step for it decides.
    fn forming_member(&self, node: &str) -> bool {
        self.job
            .as_ref()
            .is_some_and(|j| j.phase == Phase::Forming && j.members.contains(node))
    }
}

struct JobSnapshot {
    round: u64,
    restart_count: u32,
    phase: Phase,
    members: BTreeSet<String>,
    /// Where its time went by `at`: so far, and closed.
    spent: Spent,
    closed: Spent,
    at: Instant,
}

fn check(server: &Server, before: &Snapshot, out: &[Outbound], decides: bool) {
    let Some(job) = &server.job else {
        return;
    };
    let config = *job.config();
    let same_job = before.generation == server.generation;
    let prev = before.job.as_ref().filter(|_| same_job);

    // Events go to members only (before or after the step).
    for o in out {
        let known = job.members().contains_key(&o.to)
            || prev.is_some_and(|p| p.members.contains(&o.to));
        assert!(known, "event for '{}', not a member: {:?}", o.to, o.event);
    }

    // One round at a time; the budget.
    assert!(
        job.restart_count() <= config.max_restarts,
        "restart_count {} above max_restarts {}",
        job.restart_count(),
        config.max_restarts
    );
    if let Some(p) = prev {
        assert!(job.round() >= p.round, "round went back from {} to {}", p.round, job.round());
        assert!(job.round() <= p.round.saturating_add(1), "round jumped from {} to {}", p.round, job.round());
        assert!(job.restart_count() >= p.restart_count, "restart_count went back");
        if p.phase.is_terminal() {
            assert_eq!(job.phase(), &p.phase, "a finished job changed its outcome");
        }
        // Goodput: every instant is in one category, closed time never
        // goes back, and a job that formed throughout gained no productive
        // time (a late report may still show that a stretch before a
        // restart was productive).
        let now = server.now();
        let spent = job.time_spent(now);
        let passed = if p.phase.is_terminal() { Duration::ZERO } else { now - p.at };
        assert_eq!(spent.total(), p.spent.total() + passed, "goodput categories do not add up to the wall time");
        if p.phase == Phase::Forming && job.phase() == &Phase::Forming {
            let productive = |s: &Spent| s.of(Category::Productive);
            assert_eq!(productive(&spent), productive(&p.spent), "a forming job counted productive time");
        }
        for c in Category::ALL {
            assert!(job.goodput().spent.of(c) >= p.closed.of(c), "closed {} time went back", c.name());
        }
    }
    check_events(job, prev, out);
    if let Err(e) = fuzzing::check_no_benched_rank(job, out) {
        panic!("quarantine: {e}");
    }
    check_members(job);
    // What a job store keeps is the whole state: restored, it is the same
    // job. After every step while the job is small (most inputs), so the
    // check does not cost a large job's copy at every step.
    if job.members().len() <= ROUND_TRIP_MEMBERS {
        check_round_trip(server);
    }
    if decides {
        assert!(
            !matches!(decide(server.now(), job), Decision::Complete(_)),
            "a round that can complete is still forming after a step that decides"
        );
    }
}

/// The events of one step, against the job after it.
fn check_events(job: &Job, prev: Option<&JobSnapshot>, out: &[Outbound]) {
    let config = job.config();
    let mut completes = Vec::new();
    let restarted = out.iter().any(|o| matches!(o.event, Kind::RestartRequested(_)));
    for o in out {
        match &o.event {
            Kind::RoundComplete(rc) => completes.push((o.to.as_str(), rc)),
            Kind::RestartRequested(r) => {
                assert_eq!(Some(r.next_round), r.round.checked_add(1), "restart skips rounds");
                assert!(
                    job.round() >= r.next_round,
                    "restart to round {} but the job is at {}",
                    r.next_round,
                    job.round()
                );
            }
            // A join that re-forms a running round is told the round it joined, then the restart.
            Kind::Joined(j) => assert!(
                j.round == job.round() || (j.round.checked_add(1) == Some(job.round()) && restarted),
                "joined for round {} of a job at {}",
                j.round,
                job.round()
            ),
            Kind::JobSucceeded(_) => {
                assert_eq!(job.phase(), &Phase::Succeeded, "success announced, not recorded")
            }
            Kind::JobFailed(_) => {
                assert!(matches!(job.phase(), Phase::Failed(_)), "failure announced, not recorded")
            }
            Kind::Waiting(w) => assert!(w.round <= job.round(), "progress of a future round"),
            Kind::JobClosed(_) => {}
            // Only the registry asks for stacks, never the job.
            Kind::StacksRequested(_) => panic!("the job asked for stacks"),
        }
    }
    if completes.is_empty() {
        return;
    }
    let n = completes.len() as u32;
    assert!(
        (config.min_nodes..=config.max_nodes).contains(&n),
        "a round of {n} nodes for nnodes {}:{}",
        config.min_nodes,
        config.max_nodes
    );
    let ids: HashSet<&str> = completes.iter().map(|(to, _)| *to).collect();
    assert_eq!(ids.len(), completes.len(), "a node got two ranks");
    let mut ranks: Vec<u32> = completes.iter().map(|(_, rc)| rc.node_rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "node ranks not 0..{n}");
    let first = completes[0].1;
    for (to, rc) in &completes {
        assert_eq!(rc.nnodes, n);
        assert_eq!(rc.round, first.round, "one completion, two rounds");
        assert_eq!((&rc.master_addr, rc.master_port), (&first.master_addr, first.master_port));
        assert_eq!(rc.restart_count, job.restart_count());
        let world = n.checked_mul(config.nproc_per_node);
        assert_eq!(Some(rc.world_size), world, "world size of {n} x {}", config.nproc_per_node);
        assert_eq!(Some(rc.base_rank), rc.node_rank.checked_mul(config.nproc_per_node));
        if let Some(m) = job.members().get(*to) {
            assert_eq!(m.rank, Some(rc.node_rank), "'{to}' holds another rank than it was told");
        }
    }
    // Segments: runs of node ranks with one topology path, numbered in order.
    let mut by_rank: Vec<&pb::RoundComplete> = completes.iter().map(|(_, rc)| *rc).collect();
    by_rank.sort_unstable_by_key(|rc| rc.node_rank);
    for rc in &by_rank {
        assert!(
            rc.segment_nodes >= 1
                && rc.segment_first_node <= rc.node_rank
                && rc.node_rank - rc.segment_first_node < rc.segment_nodes
                && rc.segment_first_node + rc.segment_nodes <= n,
            "node rank {} outside its segment {}+{}",
            rc.node_rank,
            rc.segment_first_node,
            rc.segment_nodes
        );
        let head = by_rank[rc.segment_first_node as usize];
        assert_eq!(head.segment, rc.segment, "one segment, two indexes");
    }
    for pair in by_rank.windows(2) {
        let step = u32::from(pair[1].segment_first_node != pair[0].segment_first_node);
        assert_eq!(pair[1].segment, pair[0].segment + step, "segments not numbered in order");
    }
    for (to, rc) in &completes {
        let Some(m) = job.members().get(*to) else { continue };
        for (other, orc) in &completes {
            let Some(om) = job.members().get(*other) else { continue };
            if orc.segment == rc.segment {
                assert_eq!(m.topology, om.topology, "one segment, two topology paths");
            }
        }
    }
    if let Some(p) = prev {
        assert!(first.round >= p.round);
    }
    let participants = fuzzing::internals(job).participants;
    assert_eq!(participants.len() as u32, n, "participants differ from the round told");
}

/// The job's members against its own counters and phase.
fn check_members(job: &Job) {
    let config = job.config();
    let internals = fuzzing::internals(job);
    let members = job.members();
    if let Err(e) = fuzzing::check_counts(job) {
        panic!("{e}");
    }

    let mut requested = BTreeMap::new();
    for (id, m) in members {
        if let Some(r) = m.requested_rank {
            assert!(r < config.max_nodes, "'{id}' holds requested rank {r} of {}", config.max_nodes);
            if let Some(other) = requested.insert(r, id) {
                panic!("rank {r} requested by '{other}' and '{id}'");
            }
        }
    }

    let participants = internals.participants;
    let unique: HashSet<&String> = participants.iter().collect();
    assert_eq!(unique.len(), participants.len(), "a node takes part twice");
    let running = job.phase() == &Phase::Running;
    for (id, m) in members {
        // While forming, a rank is the member's place in the last round (it
        // orders the veterans); the departed are already dropped from it.
        if let Some(r) = m.rank.filter(|_| running) {
            assert_eq!(
                participants.get(r as usize),
                Some(id),
                "'{id}' has rank {r} but is not at that place in the round"
            );
        }
        check_member(job, id, m);
    }
    match job.phase() {
        Phase::Forming => {
            // A full round waits only for a node of the last round that has
            // not said it is ready: it may still run that round's workers
            // (`decide`, "Never beside a node that may not have heard"); and,
            // with a drop limit, for a spare not ready yet of a segment whose
            // departed nodes' places its ready newcomers cannot all fill.
            let unheard = members
                .values()
                .any(|m| m.rank.is_some() && m.ready.is_none() && !m.succeeded);
            // Benched members take no place and are not waited for.
            let spare_awaited = config.dead_after.is_some() && {
                let held: HashSet<u32> =
                    members.values().filter(|m| !job.is_benched(m)).filter_map(|m| m.rank).collect();
                let mut open: BTreeMap<&str, i64> = BTreeMap::new();
                for (r, t) in internals.slot_topologies.iter().enumerate() {
                    if let (Some(t), false) = (t, held.contains(&(r as u32))) {
                        *open.entry(t).or_default() += 1;
                    }
                }
                for m in members.values().filter(|m| m.rank.is_none() && m.ready.is_some() && !job.is_benched(m)) {
                    if let Some(n) = open.get_mut(&*m.topology) {
                        *n -= 1;
                    }
                }
                members.values().any(|m| {
                    m.rank.is_none()
                        && m.ready.is_none()
                        && !job.is_benched(m)
                        && open.get(&*m.topology).is_some_and(|n| *n > 0)
                })
            };
            assert!(
                internals.ready < config.max_nodes || unheard || spare_awaited,
                "{} ready for a round of at most {}",
                internals.ready,
                config.max_nodes
            );
        }
        Phase::Running => {
            let n = participants.len() as u32;
            assert!(
                (config.min_nodes..=config.max_nodes).contains(&n),
                "running a round of {n} nodes for nnodes {}:{}",
                config.min_nodes,
                config.max_nodes
            );
            let succeeded = members.values().filter(|m| m.succeeded).count();
            assert!(succeeded <= internals.succeeded, "members that succeeded are not counted");
            assert!(internals.succeeded < participants.len(), "running though every participant succeeded");
        }
        Phase::Succeeded => {
            assert_eq!(internals.succeeded, participants.len(), "succeeded before every participant did");
        }
        Phase::Failed(reason) => assert!(!reason.is_empty()),
    }
}

fn check_member(job: &Job, id: &str, m: &Member) {
    match job.phase() {
        Phase::Forming => assert!(!m.succeeded, "'{id}' succeeded in a round that has not started"),
        Phase::Running => {
            assert!(
                m.ready.is_none() || m.rank.is_none(),
                "'{id}' runs in the round and is ready for the next"
            );
            assert!(!m.succeeded || m.rank.is_some(), "'{id}' succeeded without a rank");
        }
        Phase::Succeeded | Phase::Failed(_) => {}
    }
}

/// The fuzzer's bytes, read as the fields above; zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        for b in &mut out {
            *b = self.byte();
        }
        out
    }

    fn u32(&mut self) -> u32 {
        match self.byte() {
            b @ 0..0xF0 => u32::from(b),
            _ => u32::from_le_bytes(self.bytes()),
        }
    }

    fn u64(&mut self) -> u64 {
        match self.byte() {
            b @ 0..0xF0 => u64::from(b),
            _ => u64::from_le_bytes(self.bytes()),
        }
    }

    fn round(&mut self, current: u64) -> u64 {
        match self.byte() {
            0 => current,
            1 => current.saturating_add(1),
            2 => current.saturating_sub(1),
            b @ 3..0xF0 => u64::from(b),
            _ => u64::from_le_bytes(self.bytes()),
        }
    }

    fn node(&mut self) -> &'static str {
        NODES[usize::from(self.byte()) % NODES.len()]
    }
}
