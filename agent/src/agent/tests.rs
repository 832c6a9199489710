//! The driver (`Driver`) with a fake link and fake workers on a paused
//! clock: what it asks of the rendezvous and of the workers when the node's
//! state machine decides, without a process or a server.
//!
//! The machine's decisions have their own tests (`machine/tests.rs`); these
//! check the wiring: that each decision reaches the right call with the
//! right values, that what the link and the workers say reaches the
//! machine, and that stops, rejoins and signals run concurrently as the
//! real agent needs them to.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long workers get on a restart: the default drop limit (15 s) less
/// the fence margin (0.2 s), under the default --shutdown-timeout (30 s).
const REFORM_GRACE: Duration = Duration::from_millis(14_800);

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use super::link::{Failed, Heard, Link};
use super::machine::{NodeMachine, Settings};
use super::round::Exit;
use super::workers::{Spawner, Workers};
use super::{Driver, DriverEnd};
use crate::config::{Config, LaunchOptions, Nproc};
use crate::error::{AgentError, Outcome};
use crate::signal::Signals;
use crate::supervisor::{SpawnError, WorkerSpec};
use crate::sys::Ended;

/// What the driver did, in order, through the fakes.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    /// On link `n` (0: the first; each rejoin makes the next).
    Ready(u32, u64),
    Failure(u32, u64, Box<Failed>),
    /// The workers of this round were fenced (no worker failed).
    Fenced(u32, u64),
    Success(u32, u64),
    Leave(u32, String),
    Rejoin(u32, Option<pb::Resume>),
    /// Workers started for these global ranks, with these
    /// `TORCHELASTIC_RESTART_COUNT`s.
    Spawn(Vec<u32>, Vec<String>),
    Stop(Signal, Duration),
}

/// What a test tells the fakes: shared by every link and group.
#[derive(Default)]
struct Script {
    /// Each link's inbox, by link number, created on first use.
    inboxes: Mutex<Vec<Option<UnboundedReceiver<Heard>>>>,
    senders: Mutex<Vec<UnboundedSender<Heard>>>,
    /// Answers to rejoins, in order.
    rejoins: Mutex<VecDeque<Result<pb::Joined, AgentError>>>,
    /// How long a rejoin takes before it answers.
    rejoin_takes: Mutex<Duration>,
    /// The next spawn fails.
    spawn_fails: Mutex<bool>,
    /// Workers ignore the stop signal (only SIGKILL ends them).
    ignore_stop: Mutex<bool>,
    /// Prepare waits until told.
    hold_prepare: Mutex<bool>,
    /// Exits only the backstop check finds.
    unreported: Mutex<Vec<Exit>>,
    /// The store port the last `ready` offered.
    offered: Mutex<Option<u32>>,
    /// The rendezvous answers the next `ready` with this status.
    refuse_ready: Mutex<Option<tonic::Status>>,
    /// Each group's exit sender, by spawn.
    groups: Mutex<Vec<UnboundedSender<Exit>>>,
}

impl Script {
    fn inbox(&self, n: u32) -> UnboundedReceiver<Heard> {
        let mut boxes = self.inboxes.lock().expect("lock");
        let mut senders = self.senders.lock().expect("lock");
        while boxes.len() <= n as usize {
            let (tx, rx) = unbounded_channel();
            boxes.push(Some(rx));
            senders.push(tx);
        }
        boxes[n as usize].take().expect("one inbox per link")
    }

    /// Link `n` hears `what`.
    fn say(&self, n: u32, what: Heard) {
        self.inbox_sender(n).send(what).expect("the link is gone");
    }

    fn inbox_sender(&self, n: u32) -> UnboundedSender<Heard> {
        let mut boxes = self.inboxes.lock().expect("lock");
        let mut senders = self.senders.lock().expect("lock");
        while boxes.len() <= n as usize {
            let (tx, rx) = unbounded_channel();
            boxes.push(Some(rx));
            senders.push(tx);
        }
        senders[n as usize].clone()
    }

    /// Spawn number `g`'s worker `local_rank` ends.
    fn exit(&self, g: usize, local_rank: u32, ended: Ended) {
        let tx = self.groups.lock().expect("lock")[g].clone();
        tx.send(exit_of(local_rank, ended))
            .expect("the group is gone");
    }
}

fn exit_of(local_rank: u32, ended: Ended) -> Exit {
    Exit {
        local_rank,
        global_rank: 2 + local_rank,
        pid: 100 + local_rank,
        ended,
    }
}

struct FakeLink {
    n: u32,
    inbox: UnboundedReceiver<Heard>,
    calls: UnboundedSender<Call>,
    script: Arc<Script>,
    /// Links made so far, shared.
    made: Arc<Mutex<u32>>,
}

impl FakeLink {
    fn first(script: &Arc<Script>, calls: &UnboundedSender<Call>) -> Self {
        Self {
            n: 0,
            inbox: script.inbox(0),
            calls: calls.clone(),
            script: script.clone(),
            made: Arc::new(Mutex::new(1)),
        }
    }

    fn call(&self, c: Call) {
        let _ = self.calls.send(c);
    }
}

impl Link for FakeLink {
    async fn ready(&mut self, round: u64, store: (String, u32)) -> Result<(), tonic::Status> {
        assert_eq!(store.0, "127.0.0.1", "the store is offered on --local-addr");
        assert_ne!(store.1, 0, "the store listener is bound");
        *self.script.offered.lock().expect("lock") = Some(store.1);
        self.call(Call::Ready(self.n, round));
        match self.script.refuse_ready.lock().expect("lock").take() {
            Some(status) => Err(status),
            None => Ok(()),
        }
    }

    async fn report_failure(&mut self, round: u64, failed: Failed) -> bool {
        self.call(Call::Failure(self.n, round, Box::new(failed)));
        true
    }

    async fn report_fenced(&mut self, round: u64, reason: String) {
        assert!(reason.contains("drop limit"), "{reason}");
        self.call(Call::Fenced(self.n, round));
    }

    async fn report_success(&mut self, round: u64) {
        self.call(Call::Success(self.n, round));
    }

    async fn leave(&mut self, reason: &str, _unhealthy: bool) {
        self.call(Call::Leave(self.n, reason.into()));
    }

    async fn next(&mut self) -> Heard {
        match self.inbox.recv().await {
            Some(h) => h,
            None => std::future::pending().await,
        }
    }

    fn rejoin(
        &self,
        resume: Option<pb::Resume>,
    ) -> impl std::future::Future<Output = Result<(Self, pb::Joined), AgentError>> + Send + 'static
    {
        self.call(Call::Rejoin(self.n, resume));
        let (script, calls, made) = (self.script.clone(), self.calls.clone(), self.made.clone());
        async move {
            let takes = *script.rejoin_takes.lock().expect("lock");
            tokio::time::sleep(takes).await;
            let answer = script
                .rejoins
                .lock()
                .expect("lock")
                .pop_front()
                .expect("the test says how a rejoin ends before it starts");
            let joined = answer?;
            let n = {
                let mut made = made.lock().expect("lock");
                *made += 1;
                *made - 1
            };
            let link = FakeLink {
                n,
                inbox: script.inbox(n),
                calls,
                script,
                made,
            };
            Ok((link, joined))
        }
    }
}

struct FakeGroup {
    exits: UnboundedReceiver<Exit>,
    ended: Vec<Option<Ended>>,
    calls: UnboundedSender<Call>,
    script: Arc<Script>,
}

impl FakeGroup {
    fn record(&mut self, e: Exit) -> Option<Exit> {
        let slot = self.ended.get_mut(e.local_rank as usize)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(e.ended);
        Some(e)
    }

    fn end_all(&mut self, ended: Ended) -> Vec<Exit> {
        (0..self.ended.len() as u32)
            .filter_map(|r| self.record(exit_of(r, ended)))
            .collect()
    }
}

impl Workers for FakeGroup {
    async fn next_exit(&mut self) -> Exit {
        loop {
            match self.exits.recv().await {
                Some(e) => {
                    if let Some(e) = self.record(e) {
                        return e;
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    fn check(&mut self) -> Vec<Exit> {
        let found = std::mem::take(&mut *self.script.unreported.lock().expect("lock"));
        found.into_iter().filter_map(|e| self.record(e)).collect()
    }

    fn all_ended(&self) -> bool {
        self.ended.iter().all(Option::is_some)
    }

    fn pids(&self) -> Vec<i32> {
        (0..self.ended.len() as i32).map(|r| 100 + r).collect()
    }

    async fn stop(&mut self, sig: Signal, grace: Duration) -> Vec<Exit> {
        let _ = self.calls.send(Call::Stop(sig, grace));
        if sig != Signal::SIGKILL && *self.script.ignore_stop.lock().expect("lock") {
            tokio::time::sleep(grace).await;
        }
        let how = match self.all_ended() || sig == Signal::SIGKILL {
            true => Signal::SIGKILL,
            false if *self.script.ignore_stop.lock().expect("lock") => Signal::SIGKILL,
            false => sig,
        };
        self.end_all(Ended::Signaled(how as i32))
    }
}

struct FakeSpawner {
    calls: UnboundedSender<Call>,
    script: Arc<Script>,
    /// Wakes a held prepare.
    release: Arc<tokio::sync::Notify>,
}

impl Spawner for FakeSpawner {
    type Group = FakeGroup;

    async fn prepare(&self, _previous: &[i32]) {
        if *self.script.hold_prepare.lock().expect("lock") {
            self.release.notified().await;
        }
    }

    async fn spawn(&self, specs: Vec<WorkerSpec>) -> Result<FakeGroup, SpawnError> {
        let var = |s: &WorkerSpec, k: &str| {
            s.env
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let _ = self.calls.send(Call::Spawn(
            specs.iter().map(|s| s.global_rank).collect(),
            specs
                .iter()
                .map(|s| var(s, "TORCHELASTIC_RESTART_COUNT"))
                .collect(),
        ));
        if std::mem::take(&mut *self.script.spawn_fails.lock().expect("lock")) {
            return Err(SpawnError {
                local_rank: 1,
                global_rank: 3,
                program: "train.py".into(),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            });
        }
        let (tx, exits) = unbounded_channel();
        self.script.groups.lock().expect("lock").push(tx);
        Ok(FakeGroup {
            exits,
            ended: vec![None; specs.len()],
            calls: self.calls.clone(),
            script: self.script.clone(),
        })
    }
}

/// Two workers per node, logs in `dir`, the store on loopback.
fn config(dir: &std::path::Path) -> Config {
    let mut o = LaunchOptions::new("train.py");
    o.nproc_per_node = Nproc::Count(2);
    o.local_addr = Some("127.0.0.1".into());
    o.log_dir = Some(dir.to_path_buf());
    o.max_restarts = 3;
    o.build(&|_| None).expect("a valid configuration")
}

/// A running test: the driver on one side, the test's end of the fakes on
/// the other.
struct Harness {
    script: Arc<Script>,
    calls: UnboundedReceiver<Call>,
    signals: UnboundedSender<Signal>,
    release: Arc<tokio::sync::Notify>,
}

impl Harness {
    /// The next thing the driver did.
    async fn next(&mut self) -> Call {
        tokio::time::timeout(Duration::from_secs(3600), self.calls.recv())
            .await
            .expect("the driver did nothing for an hour")
            .expect("the driver is gone")
    }

    /// Checks the driver did nothing more.
    fn quiet(&mut self) {
        if let Ok(c) = self.calls.try_recv() {
            panic!("unexpected {c:?}");
        }
    }
}

/// Runs `test` against a driver of a node that joined at round 0; the
/// driver's end.
async fn drive<F, Fut>(test: F) -> Result<DriverEnd, AgentError>
where
    F: FnOnce(Harness) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let script = Arc::new(Script::default());
    let (calls_tx, calls) = unbounded_channel();
    let (signals_tx, mut signals) = Signals::channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let (machine, first) = NodeMachine::new(Settings::of(&cfg), Instant::now().into_std(), 0);
    let spawner = FakeSpawner {
        calls: calls_tx.clone(),
        script: script.clone(),
        release: release.clone(),
    };
    let mut driver = Driver::new(
        &cfg,
        machine,
        FakeLink::first(&script, &calls_tx),
        spawner,
        &mut signals,
        "node-a".into(),
        crate::metrics::AgentMetrics::default(),
        crate::file_timer::Workers::default(),
    );
    let harness = Harness {
        script,
        calls,
        signals: signals_tx,
        release,
    };
    let (end, ()) = tokio::join!(driver.drive(first), test(harness));
    end
}

fn complete(round: u64, node_rank: u32, restart_count: u32) -> Heard {
    Heard::Message(Kind::RoundComplete(pb::RoundComplete {
        round,
        node_rank,
        nnodes: 2,
        world_size: 4,
        base_rank: 2 * node_rank,
        restart_count,
        max_restarts: 3,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        member_addrs: vec!["127.0.0.1".into()],
        ..Default::default()
    }))
}

fn restart(round: u64, next_round: u64) -> Heard {
    Heard::Message(Kind::RestartRequested(pb::RestartRequested {
        round,
        next_round,
        reason: "a worker failed".into(),
        counted: true,
    }))
}

fn succeeded(round: u64) -> Heard {
    Heard::Message(Kind::JobSucceeded(pb::JobSucceeded {
        round,
        goodput: None,
    }))
}

fn outcome(end: Result<DriverEnd, AgentError>) -> Outcome {
    match end {
        Ok(DriverEnd::Done(o)) => o,
        Ok(DriverEnd::Unhealthy) => panic!("unexpected: unhealthy"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Round 0 formed with this node as node rank 1 (global ranks 2 and 3).
async fn running(h: &mut Harness) {
    assert_eq!(h.next().await, Call::Ready(0, 0));
    h.script.say(0, complete(0, 1, 0));
    assert_eq!(
        h.next().await,
        Call::Spawn(vec![2, 3], vec!["0".into(), "0".into()])
    );
    assert!(
        !store_answers(h).await,
        "a node that is not node rank 0 lets its offered listener go"
    );
}

/// Whether something accepts connections on the store port last offered.
async fn store_answers(h: &Harness) -> bool {
    let port = h.script.offered.lock().expect("lock").expect("an offer");
    tokio::net::TcpStream::connect(("127.0.0.1", port as u16))
        .await
        .is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_reported_the_group_stopped_and_the_restart_runs_with_the_next_count() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script.exit(0, 1, Ended::Exited(3));
        match h.next().await {
            Call::Failure(0, 0, f) => {
                assert_eq!((f.local_rank, f.global_rank, f.exit_code), (1, 3, 3));
                // The worker wrote no error file: its end is the reason.
                assert_eq!(f.reason, Ended::Exited(3).to_string());
                let failure = f.failure.expect("the failure as recorded");
                assert_eq!(
                    (failure.rank, failure.host.as_str(), failure.exitcode),
                    (3, "node-a", 3)
                );
                assert_eq!(failure.error_file, "<N/A>");
            }
            other => panic!("expected the failure reported, got {other:?}"),
        }
        assert_eq!(h.next().await, Call::Stop(Signal::SIGTERM, REFORM_GRACE));
        h.script.say(0, restart(0, 1));
        assert_eq!(h.next().await, Call::Ready(0, 1));
        h.script.say(0, complete(1, 1, 1));
        assert_eq!(
            h.next().await,
            Call::Spawn(vec![2, 3], vec!["1".into(), "1".into()])
        );
        h.script.exit(1, 0, Ended::Exited(0));
        h.script.exit(1, 1, Ended::Exited(0));
        assert_eq!(h.next().await, Call::Success(0, 1));
        h.script.say(0, succeeded(1));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_signal_stops_the_workers_a_second_one_kills_them_and_the_node_leaves() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        *h.script.ignore_stop.lock().expect("lock") = true;
        let t = Instant::now();
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert_eq!(
            h.next().await,
            Call::Stop(Signal::SIGTERM, Duration::from_secs(30))
        );
        h.signals.send(Signal::SIGINT).expect("signal");
        assert_eq!(h.next().await, Call::Stop(Signal::SIGKILL, Duration::ZERO));
        assert!(matches!(h.next().await, Call::Leave(0, _)));
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the second signal did not wait for the grace: {:?}",
            t.elapsed()
        );
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn workers_that_ignore_the_stop_signal_are_killed_after_the_grace() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        *h.script.ignore_stop.lock().expect("lock") = true;
        let t = Instant::now();
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert_eq!(
            h.next().await,
            Call::Stop(Signal::SIGTERM, Duration::from_secs(30))
        );
        assert!(matches!(h.next().await, Call::Leave(0, _)));
        assert!(t.elapsed() >= Duration::from_secs(30), "{:?}", t.elapsed());
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn a_lost_link_rejoins_and_a_resumed_round_keeps_its_workers() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script
            .rejoins
            .lock()
            .expect("lock")
            .push_back(Ok(pb::Joined {
                round: 0,
                resumed: true,
                session: Vec::new(),
                over: None,
                previous: None,
            }));
        h.script
            .say(0, Heard::Lost("lost the rendezvous: broken pipe".into()));
        match h.next().await {
            Call::Rejoin(0, Some(resume)) => {
                assert_eq!((resume.round, resume.node_rank, resume.nnodes), (0, 1, 2));
            }
            other => panic!("expected a rejoin presenting round 0, got {other:?}"),
        }
        // Back on a new link: the workers were never stopped, and what
        // they do next is reported there.
        h.script.exit(0, 0, Ended::Exited(0));
        h.script.exit(0, 1, Ended::Exited(0));
        assert_eq!(h.next().await, Call::Success(1, 0));
        h.script.say(1, succeeded(0));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_rejoin_into_a_reformed_job_stops_the_workers_and_offers_for_its_round() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script
            .rejoins
            .lock()
            .expect("lock")
            .push_back(Ok(pb::Joined {
                round: 2,
                resumed: false,
                session: Vec::new(),
                over: None,
                previous: None,
            }));
        h.script
            .say(0, Heard::Lost("lost the rendezvous: broken pipe".into()));
        assert!(matches!(h.next().await, Call::Rejoin(0, Some(_))));
        assert_eq!(h.next().await, Call::Stop(Signal::SIGTERM, REFORM_GRACE));
        assert_eq!(h.next().await, Call::Ready(1, 2));
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert!(matches!(h.next().await, Call::Leave(1, _)));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn fenced_workers_re_form_the_round_without_a_failure_or_a_counted_restart() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        // The rendezvous comes back after 20 s (a new host elected), past
        // the drop limit (15 s), and still runs round 0.
        *h.script.rejoin_takes.lock().expect("lock") = Duration::from_secs(20);
        h.script
            .rejoins
            .lock()
            .expect("lock")
            .push_back(Ok(pb::Joined {
                round: 0,
                resumed: true,
                session: Vec::new(),
                over: None,
                previous: None,
            }));
        h.script
            .say(0, Heard::Lost("lost the rendezvous: broken pipe".into()));
        assert!(matches!(h.next().await, Call::Rejoin(0, Some(_))));
        assert_eq!(
            h.next().await,
            Call::Stop(Signal::SIGKILL, Duration::ZERO),
            "the fence"
        );
        assert_eq!(h.next().await, Call::Fenced(1, 0), "not a failure");
        // The job re-forms for free: the same restart count.
        h.script.say(
            1,
            Heard::Message(Kind::RestartRequested(pb::RestartRequested {
                round: 0,
                next_round: 1,
                reason: "host 'node-a' stopped its workers".into(),
                counted: false,
            })),
        );
        // Nothing is left to stop: the node offers itself at once.
        assert_eq!(h.next().await, Call::Ready(1, 1));
        h.script.say(1, complete(1, 1, 0));
        assert_eq!(
            h.next().await,
            Call::Spawn(vec![2, 3], vec!["0".into(), "0".into()])
        );
        h.script.exit(1, 0, Ended::Exited(0));
        h.script.exit(1, 1, Ended::Exited(0));
        assert_eq!(h.next().await, Call::Success(1, 1));
        h.script.say(1, succeeded(1));
        h.quiet();
    })
    .await;
    assert_eq!(outcome(end), Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_refused_offer_ends_the_agent_with_the_servers_status_code() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script.exit(0, 1, Ended::Exited(3));
        assert!(matches!(h.next().await, Call::Failure(0, 0, _)));
        assert!(matches!(h.next().await, Call::Stop(..)));
        *h.script.refuse_ready.lock().expect("lock") =
            Some(tonic::Status::not_found("no job 'j' here"));
        h.script.say(0, restart(0, 1));
        assert_eq!(h.next().await, Call::Ready(0, 1));
    })
    .await;
    let e = end.err().expect("the agent ends with an error");
    assert!(
        matches!(
            &e,
            AgentError::NotReady { round: 1, code: tonic::Code::NotFound, message }
                if message == "no job 'j' here"
        ),
        "{e:?}"
    );
    assert_eq!(e.exit_code(), 1);
    assert!(
        e.to_string().contains("ready for round 1: no job 'j' here"),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_offer_the_rendezvous_leaves_unanswered_rejoins_and_offers_again() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script.exit(0, 1, Ended::Exited(3));
        assert!(matches!(h.next().await, Call::Failure(0, 0, _)));
        assert!(matches!(h.next().await, Call::Stop(..)));
        // The leader went silent (or no longer leads): not its verdict.
        *h.script.refuse_ready.lock().expect("lock") = Some(tonic::Status::unavailable(
            "the rendezvous did not answer ready within 1.0 s",
        ));
        h.script
            .rejoins
            .lock()
            .expect("lock")
            .push_back(Ok(pb::Joined {
                round: 1,
                resumed: false,
                session: Vec::new(),
                over: None,
                previous: None,
            }));
        h.script.say(0, restart(0, 1));
        assert_eq!(h.next().await, Call::Ready(0, 1));
        assert_eq!(h.next().await, Call::Rejoin(0, None));
        assert_eq!(
            h.next().await,
            Call::Ready(1, 1),
            "offered again, on the new link"
        );
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert!(matches!(h.next().await, Call::Leave(1, _)));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn a_rejoin_that_gives_up_stops_the_workers_and_ends_the_agent() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script
            .rejoins
            .lock()
            .expect("lock")
            .push_back(Err(AgentError::JoinTimeout("the grace ended".into())));
        h.script.say(
            0,
            Heard::Silent {
                why: "no keep-alive answered for 30.0 s".into(),
                since: Instant::now().into_std(),
            },
        );
        assert!(matches!(h.next().await, Call::Rejoin(0, Some(_))));
        assert_eq!(
            h.next().await,
            Call::Stop(Signal::SIGTERM, Duration::from_secs(30))
        );
    })
    .await;
    let e = end.err().expect("the agent ends with an error");
    assert!(
        matches!(&e, AgentError::GaveUp { why, source, .. }
            if why.contains("no keep-alive answered") && matches!(**source, AgentError::JoinTimeout(_))),
        "{e:?}"
    );
    assert!(e.to_string().contains("reconnect_grace"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_start_is_reported_with_exit_code_127() {
    let end = drive(|mut h| async move {
        assert_eq!(h.next().await, Call::Ready(0, 0));
        *h.script.spawn_fails.lock().expect("lock") = true;
        h.script.say(0, complete(0, 1, 0));
        assert!(matches!(h.next().await, Call::Spawn(..)));
        match h.next().await {
            Call::Failure(0, 0, f) => {
                assert_eq!((f.local_rank, f.global_rank, f.exit_code), (1, 3, 127));
                assert!(f.reason.contains("train.py"), "{}", f.reason);
                assert!(f.failure.is_none());
            }
            other => panic!("expected a start failure, got {other:?}"),
        }
        h.script.say(
            0,
            Heard::Message(Kind::JobFailed(pb::JobFailed {
                round: 0,
                reason: "the restart budget is spent".into(),
                root_cause: None,
                exit_code: None,
                goodput: None,
            })),
        );
    })
    .await;
    assert!(matches!(outcome(end), Outcome::Failed(r) if r.contains("budget")));
}

#[tokio::test(start_paused = true)]
async fn an_exit_the_workers_did_not_report_is_found_by_the_monitor() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        // Only the backstop sees this one (a missed SIGCHLD).
        h.script
            .unreported
            .lock()
            .expect("lock")
            .push(exit_of(0, Ended::Signaled(9)));
        match h.next().await {
            Call::Failure(0, 0, f) => assert_eq!((f.local_rank, f.exit_code), (0, 137)),
            other => panic!("expected the found exit reported, got {other:?}"),
        }
        assert_eq!(h.next().await, Call::Stop(Signal::SIGTERM, REFORM_GRACE));
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert!(matches!(h.next().await, Call::Leave(0, _)));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn a_signal_while_the_round_prepares_starts_nothing() {
    let end = drive(|mut h| async move {
        assert_eq!(h.next().await, Call::Ready(0, 0));
        *h.script.hold_prepare.lock().expect("lock") = true;
        h.script.say(0, complete(0, 1, 0));
        // The imports (or the GPUs) keep the round waiting.
        tokio::time::sleep(Duration::from_secs(5)).await;
        h.quiet();
        h.signals.send(Signal::SIGTERM).expect("signal");
        assert!(matches!(h.next().await, Call::Leave(0, _)));
        h.release.notify_one();
        h.quiet();
    })
    .await;
    assert_eq!(outcome(end), Outcome::Signaled(Signal::SIGTERM));
}

#[tokio::test(start_paused = true)]
async fn node_rank_0_serves_the_workers_store_on_the_offered_listener() {
    let end = drive(|mut h| async move {
        assert_eq!(h.next().await, Call::Ready(0, 0));
        h.script.say(0, complete(0, 0, 0));
        assert_eq!(
            h.next().await,
            Call::Spawn(vec![0, 1], vec!["0".into(), "0".into()])
        );
        assert!(store_answers(&h).await, "node rank 0 serves the store");
        h.script.exit(0, 0, Ended::Exited(0));
        h.script.exit(0, 1, Ended::Exited(0));
        assert_eq!(h.next().await, Call::Success(0, 0));
        // The exit barrier: the others have not finished yet.
        tokio::time::sleep(Duration::from_secs(60)).await;
        h.quiet();
        h.script.say(0, succeeded(0));
    })
    .await;
    assert_eq!(outcome(end), Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn the_exit_barrier_times_out_into_success_after_leaving() {
    let end = drive(|mut h| async move {
        running(&mut h).await;
        h.script.exit(0, 0, Ended::Exited(0));
        h.script.exit(0, 1, Ended::Exited(0));
        assert_eq!(h.next().await, Call::Success(0, 0));
        let t = Instant::now();
        // What the workers left behind is swept first.
        assert_eq!(
            h.next().await,
            Call::Stop(Signal::SIGTERM, Duration::from_secs(30))
        );
        let waited = t.elapsed();
        assert!(
            matches!(h.next().await, Call::Leave(0, r) if r.contains("exit barrier timed out"))
        );
        assert!(
            waited >= Duration::from_secs(300) && waited < Duration::from_secs(301),
            "--exit-barrier-timeout: {waited:?}"
        );
    })
    .await;
    assert_eq!(outcome(end), Outcome::Succeeded);
}
