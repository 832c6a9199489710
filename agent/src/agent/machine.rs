//! One node's life as a pure, clock-injected state machine: no I/O.
//!
//! The agent's driver (`Driver`, in [`crate::agent`]) waits for whatever can happen
//! next (a message on the node's event stream, a worker exit, a signal, the
//! end of a rejoin attempt or of a stop, a deadline), hands it to
//! [`NodeMachine::step`] with the current time, and performs the returned
//! [`Action`]s in order. Every decision the agent makes about its round lives
//! here, so reconnecting, resuming, the exit barrier and signals are
//! unit-tested with synthetic instants and no process, as the server's `Job`
//! is.
//!
//! # Phases
//! - **Forming** round `r`: this node has said it is ready for `r` (offering
//!   a store listener) and waits for the round to complete, until
//!   `join_timeout`. A restart request for a later round makes it ready for
//!   that one instead.
//! - **Running** round `r`: its workers run. The first worker failure is
//!   reported and the node's other workers are stopped; then the node waits
//!   for the job's decision (restart, fail). When every worker succeeded the
//!   node reports success and waits at the exit barrier, until
//!   `exit_barrier_timeout`.
//! - **Reconnecting** (no workers) and **Recovering** (workers running): the
//!   stream broke or keep-alives went unanswered; the node rejoins with the
//!   same id within `reconnect_grace`. Recovering presents the round it runs:
//!   if it is still current the workers were never interrupted; if the job
//!   re-formed without this node, or the grace ended, they are stopped.
//!   *Fencing*: workers are kept without a rendezvous for at most the job's
//!   drop limit (`keep_alive_interval × keep_alive_max_attempt`, the time
//!   after which the rendezvous drops a silent node and the others re-form),
//!   counted from the last answered keep-alive as the rendezvous counts it:
//!   then they are killed (SIGKILL: their own shutdown, a last checkpoint,
//!   is what must not run), so no second copy of this node's ranks runs
//!   beside a re-formed job. The node still rejoins within the grace; if its
//!   round is still current (a rendezvous that came back late, or a new
//!   host that loaded the job), it says its workers were fenced and the job
//!   re-forms as for a membership change: no worker failed, so nothing of
//!   `--max-restarts` is spent.
//! - **Backing off** before round `r`: a crash loop. When a failure
//!   restarts the job within `restart_backoff.window` of its round's start
//!   for the second time in a row (or more), the node waits before it says
//!   it is ready: `base`, then twice that for each further quick failure, at
//!   most `max`. The first quick failure restarts at once (a real job's
//!   single failure costs no delay); a round that runs past the window
//!   ends the loop. Every node of the job counts the same restarts from the
//!   same rounds, so they wait alike, and the round forms after the wait.
//! - **Stopping**: the workers are being stopped (a stop signal to their
//!   process groups, SIGKILL after `shutdown_timeout`); what follows is
//!   decided already and happens when the stop completes. A stop signal
//!   during a signal-initiated stop kills the workers at once.
//!
//! Whatever ends the node's life is the last action, [`Action::Exit`].

use std::time::Duration;

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use std::time::Instant;
use tracing::{error, info, warn};

use super::round::{Exit, RoundInfo, Segment};
use crate::deadline::after_from;
use crate::error::{AgentError, Outcome};

/// What the machine needs of the agent's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The job id, for messages.
    pub run_id: String,
    /// Workers this node runs per round.
    pub nproc_per_node: u32,
    /// How long a round may take to form.
    pub join_timeout: Duration,
    /// How long a node whose workers succeeded waits for the others.
    pub exit_barrier_timeout: Duration,
    /// How long workers get to stop before SIGKILL.
    pub shutdown_timeout: Duration,
    /// How long a node may take to reach the rendezvous again.
    pub reconnect_grace: Duration,
    /// How long workers keep running while no rendezvous is reached.
    pub fence_after: Duration,
    /// How long they may run on their peers' word (`outage_timeout`).
    pub outage_timeout: Duration,
    /// Whether the node fences at all (always, but for a debug build's
    /// test-only switch: `testing`).
    pub fence: bool,
    /// Waits between restarts in a crash loop.
    pub restart_backoff: crate::config::RestartBackoff,
}

/// What a node whose guard killed its workers says.
const GUARD_FENCED: &str = "this agent did not run past its fence deadline (paused or starved): its guard killed the workers, so no second copy of their ranks runs; the job re-forms with this node (no restart is counted)";

impl Settings {
    /// The machine's part of `cfg`.
    pub fn of(cfg: &crate::config::Config) -> Self {
        Self {
            run_id: cfg.run_id.clone(),
            nproc_per_node: cfg.nproc_per_node,
            join_timeout: cfg.join_timeout(),
            exit_barrier_timeout: cfg.exit_barrier_timeout,
            shutdown_timeout: cfg.shutdown_timeout,
            reconnect_grace: cfg.reconnect_grace(),
            fence_after: cfg.rdzv.dead_after(),
            outage_timeout: cfg.rdzv.outage_timeout,
            fence: true,
            restart_backoff: cfg.restart_backoff,
        }
        .with_test_switches()
    }

    /// How long after its last contact a node stops its workers: the drop
    /// limit less the fence margin (`link::fence_margin`), so the kill lands before
    /// the rendezvous can drop the node and the others re-form.
    pub fn fence_in(&self) -> Duration {
        self.fence_after
            .saturating_sub(super::link::fence_margin(self.fence_after))
    }

    /// A debug build's test-only switch turns fencing off (see `testing`).
    fn with_test_switches(self) -> Self {
        match crate::testing::fence_broken() {
            true => self.without_fencing(),
            false => self,
        }
    }

    /// The same settings with fencing off: the planted bug of the tests
    /// that show a safety check catching a node that keeps its ranks while
    /// the job re-forms without it (`ACCEL_TEST_BREAK_FENCE`, and the
    /// simulator's per-node switch). Never used by a real agent otherwise.
    pub fn without_fencing(mut self) -> Self {
        self.fence_after = accel_input::MAX_DURATION;
        self.fence = false;
        self
    }
}

/// Something that happened to the node.
#[derive(Debug)]
pub enum Event {
    /// A message on the node's event stream.
    Message(Kind),
    /// The stream ended or broke: why.
    Lost(String),
    /// Keep-alives went unanswered for the drop limit: why, and when one
    /// was last answered (the rendezvous counts silence from there).
    Silent {
        /// Why, in words.
        why: String,
        /// The last answered keep-alive.
        since: Instant,
    },
    /// The rendezvous takes this node for dead from now on, although the
    /// link may still answer: its presence lease in etcd (agent-only
    /// rendezvous) could not be renewed in time, so the leader drops it
    /// when etcd ends the lease. Workers still running are stopped at once
    /// (fencing), before the job can re-form without them; the node rejoins
    /// once its presence is back.
    Dead(String),
    /// The guard killed this node's workers while the agent did not run
    /// (paused, starved) past its fence deadline: the exits that follow were
    /// fenced, not failed; the node rejoins and the job re-forms with it
    /// without spending the restart budget.
    GuardFenced,
    /// A worker ended.
    Exited(Exit),
    /// A worker could not be started (the others were killed).
    StartFailed {
        /// Its local rank.
        local_rank: u32,
        /// Its global rank.
        global_rank: u32,
        /// Why.
        message: String,
    },
    /// A [`Action::Stop`] completed: the exits it saw.
    Stopped(Vec<Exit>),
    /// A stop signal arrived.
    Signal(Signal),
    /// A [`Action::Rejoin`] succeeded: the job's current round, and whether
    /// this node's running round is still it.
    Rejoined {
        /// The job's round.
        round: u64,
        /// Whether the presented round was resumed.
        resumed: bool,
    },
    /// A [`Action::Rejoin`] gave up (the grace ended, or a refusal).
    RejoinFailed(AgentError),
    /// The job was already over when this node (re)joined, and it took part
    /// in it: the outcome its tombstone kept. The node ends with the job's
    /// result (its workers, if any still run, are stopped first).
    Over(pb::JobOver),
    /// A health check (`--health-check-interval`) failed: why. A node that
    /// runs workers says so to the rendezvous (the round re-forms at once,
    /// no restart counted, before its workers' ends can read as failures
    /// elsewhere), stops them, then leaves the job; a forming node or a
    /// spare leaves at once. Ignored while the node reconnects, recovers or
    /// stops, and once its workers succeeded.
    Unhealthy(String),
    /// The rendezvous answered this node's failure report for this round:
    /// it took the failure (the round ends: a restart or the job's end
    /// follows on the stream) or had ended the round already. The node no
    /// longer counts itself in the round: it stops vouching for it in the
    /// peer hub at once, even while its other workers still stop (see
    /// [`NodeMachine::left_round`]).
    FailureTaken(u64),
    /// [`NodeMachine::deadline`] passed.
    Timer,
    /// More than half of the round hears each other through its peer hub
    /// while this node cannot reach the rendezvous: the rendezvous cannot
    /// drop it, so its workers may run until this instant (the `peers`
    /// module dates it, and caps it at `outage_timeout`).
    Vouched(Instant),
}

/// What the driver does, in order.
#[derive(Debug)]
pub enum Action {
    /// Bind a store listener and tell the rendezvous this node is ready for
    /// `round`, offering it (a failure ends the agent).
    Offer {
        /// The round.
        round: u64,
    },
    /// Start the round's workers (and, on node rank 0, its store). A worker
    /// that cannot start comes back as [`Event::StartFailed`].
    Start {
        /// This node's place in the round.
        info: RoundInfo,
        /// The members' addresses (the store admits them).
        members: Vec<String>,
    },
    /// Stop the workers: `signal` to their process groups, SIGKILL after
    /// `grace`, then sweep the groups. Completion is [`Event::Stopped`].
    Stop {
        /// The stop signal.
        signal: Signal,
        /// How long they get.
        grace: Duration,
    },
    /// SIGKILL the workers being stopped, now.
    Kill,
    /// Report a worker's failure to the rendezvous, with what its error file
    /// says, and keep it for the failure summary.
    ReportFailure {
        /// The round it ran in.
        round: u64,
        /// How it ended.
        exit: Exit,
    },
    /// Report that a worker could not be started (exit code 127).
    ReportStartFailure {
        /// The round.
        round: u64,
        /// Its local rank.
        local_rank: u32,
        /// Its global rank.
        global_rank: u32,
        /// Why.
        message: String,
    },
    /// Say that this node stopped its workers in `round` because it lost
    /// the rendezvous for the drop limit (fencing), not because one failed:
    /// the round, still current, re-forms without spending the budget.
    ReportFenced {
        /// The round.
        round: u64,
        /// Why, for the other nodes.
        reason: String,
    },
    /// Keep a failure this node caused by stopping its workers, for the
    /// summary (as torchrun lists them); not reported.
    Note(Exit),
    /// Report that every worker of this node succeeded in `round`.
    ReportSuccess {
        /// The round.
        round: u64,
    },
    /// Join again with the same node id and session secret, until
    /// `reconnect_grace` ends; `resume`: the round the workers run.
    /// Completion is [`Event::Rejoined`] or [`Event::RejoinFailed`].
    Rejoin {
        /// The running round, if workers run.
        resume: Option<pb::Resume>,
    },
    /// Leave the job (best effort).
    Leave {
        /// Why, for the other nodes.
        reason: String,
    },
    /// Leave the job because this node failed a health check (the
    /// rendezvous benches its host where a quarantine policy is set); the
    /// agent checks its health again and joins anew once it passes.
    Depart {
        /// What the check said.
        why: String,
    },
    /// Print torchrun's failure summary (root cause first: the job's, else
    /// this node's first) and write it to a parent's error file.
    Summarize {
        /// The job-wide root cause, if the rendezvous named one.
        root: Option<pb::Failure>,
    },
    /// The node's life is over.
    Exit(Result<Outcome, AgentError>),
}

/// What the driver should wait for in the current phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// The event stream and the keep-alive watch.
    pub stream: bool,
    /// A rejoin attempt in flight.
    pub rejoin: bool,
    /// Worker exits.
    pub workers: bool,
    /// A stop in flight.
    pub stop: bool,
    /// The round's peers' evidence (the `peers` module).
    pub peers: bool,
}

/// A round this node runs.
#[derive(Debug, Clone)]
struct Round {
    info: RoundInfo,
    /// Workers not known to have ended.
    live: u32,
    /// A worker of this node failed (or could not start) in this round.
    failed: bool,
    /// When the exit barrier ends, once every worker succeeded.
    barrier: Option<Instant>,
    /// While the rendezvous is unreachable: until when workers are kept.
    fence: Option<Instant>,
    /// The workers were stopped for want of a rendezvous.
    fenced: bool,
    /// Its peers' evidence kept the workers past the drop limit in this
    /// loss of the rendezvous (said once).
    vouched: bool,
    /// The rendezvous drops this node whatever its peers say (its presence
    /// lease lapsed): their evidence counts for nothing.
    dropped: bool,
    /// The failure this node reported in this round, said again to a
    /// rendezvous it reconnects to (a new leader may not have it).
    reported: Option<Exit>,
    /// The rendezvous answered that report ([`Event::FailureTaken`]): the
    /// round is over for it, and this node out of the round's peer hub.
    taken: bool,
    /// When its workers started.
    started: Instant,
    /// When the rendezvous was lost, while recovering.
    lost: Option<Instant>,
}

/// What happens when a stop completes.
#[derive(Debug)]
enum Then {
    /// Get ready for this round (after this crash-loop wait, if any).
    Form(u64, Duration),
    /// Go on running (the stop followed this node's own failure).
    Run(Round),
    /// Go on rejoining.
    Recover {
        round: Round,
        pending: Option<Exit>,
        why: String,
    },
    /// These actions, then the outcome.
    Finish(Vec<Action>, Outcome),
    /// End with this error.
    Fail(AgentError),
    /// Leave the job: a health check failed (why).
    Depart(String),
}

#[derive(Debug)]
enum Phase {
    Forming {
        round: u64,
        deadline: Instant,
        /// The last progress report, for a timeout's message.
        waiting: String,
        /// The last report said this node waits as a spare beside a running
        /// round: it is not late, so the deadline moves on instead of
        /// ending the agent, until the node stops being a spare.
        spare: bool,
    },
    Reconnecting {
        /// The forming deadline, which a reconnect does not extend.
        deadline: Instant,
        why: String,
        /// The forming round's last progress, for a timeout's message.
        waiting: String,
    },
    Running(Round),
    BackingOff {
        /// The round to get ready for.
        round: u64,
        /// When.
        until: Instant,
    },
    Recovering {
        round: Round,
        /// A failure seen while unreachable, reported once back.
        pending: Option<Exit>,
        why: String,
    },
    Stopping {
        then: Then,
        /// Whether failed exits the stop sees go into the summary.
        note: bool,
        /// A stop signal arrived during this stop (a second one kills).
        heard: bool,
    },
    Done,
}

/// One node's life in its job.
#[derive(Debug)]
pub struct NodeMachine {
    settings: Settings,
    phase: Phase,
    /// The last progress line printed while forming (without its
    /// countdown), and when.
    said: Option<(String, Instant)>,
    /// A transient progress line not printed yet (every node has joined and
    /// is getting ready: a one-node run's first report), and since when.
    held: Option<(String, Instant)>,
    /// Failures in a row that restarted the job within the backoff window.
    crashes: u32,
}

/// How often at most an unchanged progress line is printed again.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

impl NodeMachine {
    /// A node that has joined; the job is at `round`.
    pub fn new(settings: Settings, now: Instant, round: u64) -> (Self, Vec<Action>) {
        let mut machine = Self {
            settings,
            phase: Phase::Done,
            said: None,
            held: None,
            crashes: 0,
        };
        let actions = machine.form(now, round);
        (machine, actions)
    }

    /// When [`Event::Timer`] is due, if anything waits on time.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Forming { deadline, .. } => Some(*deadline),
            Phase::Running(r) => r.barrier,
            Phase::BackingOff { until, .. } => Some(*until),
            Phase::Recovering { round, .. } if round.live > 0 => round.fence,
            _ => None,
        }
    }

    /// Whether this node does its work now (its workers run in a round
    /// with the rendezvous reachable), and if not, what it waits for: what
    /// `/readyz` answers.
    pub fn readiness(&self) -> Result<(), String> {
        match &self.phase {
            Phase::Running(r) if r.barrier.is_some() => Err(format!(
                "round {}: this node's workers succeeded; waiting for the other nodes",
                r.info.round
            )),
            Phase::Running(r) if r.fenced => Err(format!(
                "round {}: this node's workers were stopped while the rendezvous was lost (fencing); waiting for the job to re-form",
                r.info.round
            )),
            Phase::Running(r) if r.failed || r.live == 0 => Err(format!(
                "round {}: a worker of this node failed; waiting for the job's decision",
                r.info.round
            )),
            Phase::Running(_) => Ok(()),
            Phase::Forming { round, waiting, .. } if waiting.is_empty() => {
                Err(format!("forming round {round}"))
            }
            Phase::Forming { round, waiting, .. } => {
                Err(format!("forming round {round}: {waiting}"))
            }
            Phase::Reconnecting { why, .. } => {
                Err(format!("reconnecting to the rendezvous ({why})"))
            }
            Phase::BackingOff { round, .. } => Err(format!(
                "crash loop: waiting before round {round} (--restart-backoff)"
            )),
            Phase::Recovering { why, .. } => Err(format!(
                "workers run, but the rendezvous is lost ({why}); rejoining"
            )),
            Phase::Stopping { .. } => Err("stopping the workers".into()),
            Phase::Done => Err("the node's part of the job is over".into()),
        }
    }

    /// What the driver listens to now. Nothing else is read meanwhile:
    /// while workers stop, the stream waits; while rejoining, the old stream
    /// is dead. Signals are always heard.
    pub fn sources(&self) -> Sources {
        let none = Sources {
            stream: false,
            rejoin: false,
            workers: false,
            stop: false,
            peers: false,
        };
        match &self.phase {
            Phase::Forming { .. } | Phase::BackingOff { .. } => Sources {
                stream: true,
                ..none
            },
            Phase::Running(_) => Sources {
                stream: true,
                workers: true,
                ..none
            },
            Phase::Reconnecting { .. } => Sources {
                rejoin: true,
                ..none
            },
            Phase::Recovering { .. } => Sources {
                rejoin: true,
                workers: true,
                peers: true,
                ..none
            },
            Phase::Stopping { .. } => Sources { stop: true, ..none },
            Phase::Done => none,
        }
    }

    /// The phase's name, for tests and the simulator (`forming`,
    /// `reconnecting`, `running`, `backing-off`, `recovering`, `stopping`,
    /// `done`).
    pub fn phase_name(&self) -> &'static str {
        phase_name(&self.phase)
    }
}

/// A phase's name (see [`NodeMachine::phase_name`]).
fn phase_name(phase: &Phase) -> &'static str {
    match phase {
        Phase::Forming { .. } => "forming",
        Phase::Reconnecting { .. } => "reconnecting",
        Phase::Running(_) => "running",
        Phase::BackingOff { .. } => "backing-off",
        Phase::Recovering { .. } => "recovering",
        Phase::Stopping { .. } => "stopping",
        Phase::Done => "done",
    }
}

impl NodeMachine {
    /// How long after the last call answered this node's workers may run
    /// (`None`: fencing is off).
    pub fn fence_within(&self) -> Option<Duration> {
        self.settings.fence.then(|| self.settings.fence_in())
    }

    /// Whether this node can no longer count itself in its round: its
    /// fence fell (its own deadline or its guard's) or it was told it was
    /// dropped. It then leaves the round's peer hub at once: the hub's
    /// argument counts only nodes the rendezvous may still hold in the
    /// running round, and a fenced node may already have been dropped (see
    /// the `peers` module). So does a node stopping its workers because the
    /// rendezvous ended the round (a restart, a job that moved on) or to
    /// leave the job: the round is over, whatever the stop's length (a
    /// worker may take its time on SIGTERM), and vouching for it would keep
    /// a cut-off peer's workers beside the re-formed round. A node whose own
    /// worker failed still belongs to the round until the rendezvous
    /// answers its report (during an outage the rendezvous has not heard
    /// the failure, and the node keeps vouching for the round:
    /// sim/scenarios/failure_during_outage.sim); once answered
    /// ([`Event::FailureTaken`]), the round is over for it too, even while
    /// its other workers still stop (a stop does not read the stream, so
    /// the restart itself is heard only after it).
    pub fn left_round(&self) -> bool {
        let round = match &self.phase {
            Phase::Stopping {
                then: Then::Form(..) | Then::Depart(_),
                ..
            } => return true,
            Phase::Running(round)
            | Phase::Stopping {
                then: Then::Run(round),
                ..
            } => return round.taken,
            Phase::Recovering { round, .. } => round,
            Phase::Stopping {
                then: Then::Recover { round, .. },
                ..
            } => round,
            _ => return false,
        };
        round.fenced || round.dropped || round.taken
    }

    /// Whether the stop in flight ends this node's part of its round for a
    /// re-form (a restart, its own failure, a departure): the rendezvous
    /// forms the next round a drop limit after it sent the restart, so the
    /// stop's fence is the one the node had when the stop began (the send
    /// time of the last call answered before the restart arrived, which
    /// came before the restart was sent, whatever the link's latency), not
    /// one that later answers move.
    pub fn stop_reforms(&self) -> bool {
        matches!(
            self.phase,
            Phase::Stopping {
                then: Then::Form(..) | Then::Run(_) | Then::Depart(_),
                ..
            }
        )
    }

    /// Whether the life is over.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Handles one event at `now`; returns what to do, in order.
    pub fn step(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, event) {
            (Phase::Done, _) => Vec::new(),
            // Signals first: they are heard in every phase.
            (Phase::Stopping { then, note, heard }, Event::Signal(sig)) => {
                self.signal_stopping(then, note, heard, sig)
            }
            (Phase::Running(_) | Phase::Recovering { .. }, Event::Signal(sig)) => {
                warn!(signal = %sig, grace_s = self.settings.shutdown_timeout.as_secs_f64(), "stopping workers; a second signal kills them at once");
                self.stop(sig, Then::Finish(Vec::new(), Outcome::Signaled(sig)), false)
            }
            (
                Phase::Forming { .. } | Phase::Reconnecting { .. } | Phase::BackingOff { .. },
                Event::Signal(sig),
            ) => self.finish(Vec::new(), Outcome::Signaled(sig)),
            // A late node's job is over: it ends with the job's result.
            (Phase::Running(_) | Phase::Recovering { .. }, Event::Over(o)) => self.stop(
                Signal::SIGTERM,
                Then::Finish(Vec::new(), outcome_of(&o)),
                false,
            ),
            (
                Phase::Forming { .. } | Phase::Reconnecting { .. } | Phase::BackingOff { .. },
                Event::Over(o),
            ) => self.exit(Ok(outcome_of(&o))),
            (Phase::Forming { .. } | Phase::BackingOff { .. }, Event::Unhealthy(why)) => {
                warn!(reason = %why, "this node failed its health check (--health-check-interval); it leaves the job until the checks pass");
                self.phase = Phase::Done;
                vec![Action::Depart { why }]
            }
            (Phase::Running(r), Event::Unhealthy(why)) if r.barrier.is_none() => {
                warn!(reason = %why, round = r.info.round, "this node failed its health check (--health-check-interval): stopping its workers; it leaves the job until the checks pass");
                let mut actions = Vec::new();
                if !r.failed {
                    // First, so the others stop before this node's workers
                    // vanish from their collectives (which would read as
                    // their failures and spend the budget).
                    actions.push(Action::ReportFenced {
                        round: r.info.round,
                        reason: format!(
                            "failed its health check ({}); it leaves the job (no restart is counted)",
                            accel_input::excerpt(&why)
                        ),
                    });
                }
                // Gone within the fence (`stop`): the re-formed round forms
                // without this node no sooner, its node rank to a spare.
                actions.extend(self.stop(Signal::SIGTERM, Then::Depart(why), false));
                actions
            }
            (phase, Event::Unhealthy(why)) => {
                tracing::debug!(reason = %why, phase = phase_name(&phase), "a health check failed; acted on when the node is back in a round or forming");
                self.phase = phase;
                Vec::new()
            }
            (
                Phase::Stopping {
                    then: Then::Run(mut round),
                    note,
                    heard,
                },
                Event::FailureTaken(r),
            ) => {
                round.taken |= r == round.info.round;
                self.phase = Phase::Stopping {
                    then: Then::Run(round),
                    note,
                    heard,
                };
                Vec::new()
            }
            (Phase::Running(mut round), Event::FailureTaken(r)) => {
                round.taken |= r == round.info.round && round.failed;
                self.phase = Phase::Running(round);
                Vec::new()
            }
            (Phase::Stopping { note, heard, .. }, Event::Over(o)) => {
                self.phase = Phase::Stopping {
                    then: Then::Finish(Vec::new(), outcome_of(&o)),
                    note,
                    heard,
                };
                Vec::new()
            }
            (
                Phase::Forming {
                    round,
                    deadline,
                    waiting,
                    spare,
                },
                event,
            ) => self.forming(now, round, deadline, waiting, spare, event),
            (
                Phase::Reconnecting {
                    deadline,
                    why,
                    waiting,
                },
                event,
            ) => self.reconnecting(deadline, why, waiting, event),
            (Phase::BackingOff { round, until }, event) => {
                self.backing_off(now, round, until, event)
            }
            (Phase::Running(round), event) => self.running(now, round, event),
            (
                Phase::Recovering {
                    round,
                    pending,
                    why,
                },
                event,
            ) => self.recovering(now, round, pending, why, event),
            (Phase::Stopping { then, note, .. }, Event::Stopped(exits)) => {
                let mut actions: Vec<Action> = match note {
                    true => exits
                        .into_iter()
                        .filter(|e| !e.ended.success())
                        .map(Action::Note)
                        .collect(),
                    false => Vec::new(),
                };
                actions.extend(self.then(now, then));
                actions
            }
            (phase @ Phase::Stopping { .. }, _) => {
                self.phase = phase;
                Vec::new()
            }
        }
    }

    /// Gets ready for `round`; the round must form within `join_timeout`.
    fn form(&mut self, now: Instant, round: u64) -> Vec<Action> {
        self.phase = Phase::Forming {
            round,
            deadline: after_from(now, self.settings.join_timeout),
            waiting: String::from("no report from the rendezvous yet"),
            spare: false,
        };
        vec![Action::Offer { round }]
    }

    /// Forming `round`. A node waiting as a spare beside a running round
    /// (`--nnodes MIN:MAX`, `--nnodes-multiple-of`) is kept for as long as
    /// it is one: its `join_timeout` counts from when it stops being a spare
    /// (the round it waited beside re-forms, the rendezvous is lost, a
    /// report says otherwise). torchrun ends its waiting nodes after
    /// join_timeout whatever they wait for; accel's hot spares would
    /// otherwise leave ten minutes into every run (documented as a
    /// deviation).
    fn forming(
        &mut self,
        now: Instant,
        round: u64,
        mut deadline: Instant,
        mut waiting: String,
        mut spare: bool,
        event: Event,
    ) -> Vec<Action> {
        if spare {
            // Whatever happens next, a spare's join_timeout has not begun.
            deadline = deadline.max(after_from(now, self.settings.join_timeout));
        }
        let kind = match event {
            Event::Message(kind) => kind,
            Event::Lost(why) | Event::Silent { why, .. } | Event::Dead(why) => {
                return self.reconnect(deadline, why, waiting)
            }
            Event::Timer if now >= deadline => {
                return self.exit(Err(AgentError::JoinTimeout(format!(
                    "round {round} of job '{}' did not form within {:.0} s: {waiting}; start the missing nodes with the same --rdzv-id, --nnodes and endpoint",
                    self.settings.run_id,
                    self.settings.join_timeout.as_secs_f64()
                ))))
            }
            _ => {
                self.phase = Phase::Forming {
                    round,
                    deadline,
                    waiting,
                    spare,
                };
                return Vec::new();
            }
        };
        match kind {
            Kind::RoundComplete(r) if r.round == round => {
                let info = round_info(&r);
                let nproc = self.settings.nproc_per_node;
                info!(
                    round = info.round,
                    node_rank = info.node_rank,
                    nnodes = info.nnodes,
                    ranks = %format!("{}..{}", info.base_rank, info.base_rank.saturating_add(nproc)),
                    world_size = info.world_size,
                    restart_count = info.restart_count,
                    master = %format!("{}:{}", info.master_addr, info.master_port),
                    "round formed; starting workers"
                );
                self.phase = Phase::Running(Round {
                    info: info.clone(),
                    live: nproc,
                    failed: false,
                    barrier: None,
                    fence: None,
                    fenced: false,
                    vouched: false,
                    dropped: false,
                    reported: None,
                    taken: false,
                    started: now,
                    lost: None,
                });
                vec![Action::Start {
                    info,
                    members: r.member_addrs,
                }]
            }
            Kind::RestartRequested(r) if r.next_round > round => self.form_again(
                deadline,
                r.next_round,
                String::from("no report from the rendezvous yet"),
            ),
            Kind::JobFailed(f) => {
                say_goodput(f.goodput.as_deref());
                let outcome = Outcome::failed(&f);
                self.finish(vec![Action::Summarize { root: f.root_cause }], outcome)
            }
            Kind::JobSucceeded(s) => {
                say_goodput(s.goodput.as_deref());
                self.finish(Vec::new(), Outcome::Succeeded)
            }
            Kind::JobClosed(c) if c.may_rejoin => self.reconnect(deadline, c.reason, waiting),
            Kind::JobClosed(c) => self.exit(Err(closed(&c))),
            kind => {
                if let Kind::Waiting(w) = &kind {
                    if w.round == round {
                        waiting = describe_waiting(w);
                        self.progress(now, round, w, &waiting);
                        if !w.quarantine.is_empty() {
                            // Quarantined: the round is not late, this node is
                            // kept out; it waits out the quarantine, then
                            // join_timeout as any node.
                            let left = Duration::from_millis(w.quarantine_left_ms);
                            let until = after_from(now, left);
                            deadline = deadline.max(after_from(until, self.settings.join_timeout));
                        }
                        spare = w.spare && w.quarantine.is_empty();
                        if spare {
                            deadline = deadline.max(after_from(now, self.settings.join_timeout));
                        }
                    }
                }
                self.phase = Phase::Forming {
                    round,
                    deadline,
                    waiting,
                    spare,
                };
                Vec::new()
            }
        }
    }

    /// Prints a forming round's progress when it says something new, and
    /// otherwise at most every [`PROGRESS_EVERY`] (the rendezvous reports
    /// every second; the countdown alone is not news).
    fn progress(&mut self, now: Instant, round: u64, w: &pb::Waiting, line: &str) {
        let key = format!(
            "{round} {}",
            describe_waiting(&pb::Waiting {
                last_call_ms: None,
                quarantine_left_ms: 0,
                ..w.clone()
            })
        );
        // Every node has joined and is getting ready: nothing to wait for
        // but the round itself, which normally follows at once. Said only
        // if it lasts.
        let transient = w.members >= w.min_nodes
            && w.ready < w.members
            && w.last_call_ms.is_none()
            && !w.spare
            && w.quarantine.is_empty();
        if transient {
            let since = match &self.held {
                Some((held, since)) if *held == key => *since,
                _ => {
                    self.held = Some((key.clone(), now));
                    now
                }
            };
            if now.saturating_duration_since(since) < PROGRESS_EVERY {
                return;
            }
        }
        let news = match &self.said {
            Some((said, at)) => {
                *said != key || now.saturating_duration_since(*at) >= PROGRESS_EVERY
            }
            None => true,
        };
        if news {
            info!(round, "{line}");
            self.said = Some((key, now));
        }
    }

    /// The last progress line printed, without its countdown, and when (for tests).
    #[cfg(test)]
    pub(super) fn last_progress(&self) -> Option<&(String, Instant)> {
        self.said.as_ref()
    }

    /// Ready for `round` while forming: the forming deadline stays, and so
    /// does the last progress (until the round's own arrives).
    fn form_again(&mut self, deadline: Instant, round: u64, waiting: String) -> Vec<Action> {
        self.phase = Phase::Forming {
            round,
            deadline,
            waiting,
            spare: false,
        };
        vec![Action::Offer { round }]
    }

    /// Waiting out a crash loop's backoff before getting ready for `round`:
    /// the job's end, a later restart and a lost rendezvous are heard
    /// meanwhile; the round's progress is not (this node is not in it yet).
    fn backing_off(
        &mut self,
        now: Instant,
        round: u64,
        until: Instant,
        event: Event,
    ) -> Vec<Action> {
        let deadline = after_from(until, self.settings.join_timeout);
        match event {
            Event::Timer if now >= until => self.form(now, round),
            Event::Message(Kind::RestartRequested(r)) if r.next_round > round => {
                self.phase = Phase::BackingOff {
                    round: r.next_round,
                    until,
                };
                Vec::new()
            }
            event @ (Event::Lost(_)
            | Event::Silent { .. }
            | Event::Dead(_)
            | Event::Message(
                Kind::JobFailed(_) | Kind::JobSucceeded(_) | Kind::JobClosed(_),
            )) => self.forming(now, round, deadline, String::new(), false, event),
            _ => {
                self.phase = Phase::BackingOff { round, until };
                Vec::new()
            }
        }
    }

    /// How long to wait before the next round, now that `round` ended in a
    /// restart (`counted`: caused by a failure): see *Backing off* above.
    fn backoff(&mut self, now: Instant, round: &Round, counted: bool) -> Duration {
        let b = self.settings.restart_backoff;
        // A round that ran past the window ends the loop, however it ended.
        if now.saturating_duration_since(round.started) >= b.window {
            self.crashes = 0;
        }
        if !counted {
            return Duration::ZERO;
        }
        self.crashes = self.crashes.saturating_add(1);
        b.wait(self.crashes)
    }

    /// The rendezvous was lost with no workers running: rejoin.
    fn reconnect(&mut self, deadline: Instant, why: String, waiting: String) -> Vec<Action> {
        warn!(reason = %why, grace_s = self.idle_grace().as_secs_f64(), "lost the rendezvous; reconnecting");
        self.phase = Phase::Reconnecting {
            deadline,
            why,
            waiting,
        };
        vec![Action::Rejoin { resume: None }]
    }

    fn reconnecting(
        &mut self,
        deadline: Instant,
        why: String,
        waiting: String,
        event: Event,
    ) -> Vec<Action> {
        match event {
            Event::Rejoined { round, .. } => self.form_again(deadline, round, waiting),
            Event::RejoinFailed(e) => {
                let e = self.gave_up(why, e, self.idle_grace());
                self.exit(Err(e))
            }
            _ => {
                self.phase = Phase::Reconnecting {
                    deadline,
                    why,
                    waiting,
                };
                Vec::new()
            }
        }
    }

    fn running(&mut self, now: Instant, mut round: Round, event: Event) -> Vec<Action> {
        let this = round.info.round;
        match event {
            Event::Message(Kind::RestartRequested(r)) if r.round == this => {
                info!(reason = %r.reason, counted = r.counted, "restart requested; stopping workers");
                let wait = self.backoff(now, &round, r.counted);
                self.stop(Signal::SIGTERM, Then::Form(r.next_round, wait), false)
            }
            Event::Message(Kind::JobFailed(f)) => {
                say_goodput(f.goodput.as_deref());
                let outcome = Outcome::failed(&f);
                self.stop(
                    Signal::SIGTERM,
                    Then::Finish(vec![Action::Summarize { root: f.root_cause }], outcome),
                    false,
                )
            }
            Event::Message(Kind::JobSucceeded(s)) => {
                say_goodput(s.goodput.as_deref());
                self.stop(
                    Signal::SIGTERM,
                    Then::Finish(Vec::new(), Outcome::Succeeded),
                    false,
                )
            }
            Event::Message(Kind::JobClosed(c)) if !c.may_rejoin => {
                self.stop(Signal::SIGTERM, Then::Fail(closed(&c)), false)
            }
            Event::Message(Kind::JobClosed(c)) => self.recover(now, round, c.reason),
            Event::Lost(why) => self.recover(now, round, why),
            // The fence counts from the last contact, as the rendezvous
            // counts the silence: the workers stop at once.
            Event::Silent { why, since } => self.recover(since.min(now), round, why),
            Event::Dead(why) => {
                let actions = self.recover(now, round, why);
                self.fence_now(now);
                actions
            }
            Event::GuardFenced => {
                let actions = self.rejoin_with(now, round, GUARD_FENCED.into());
                self.guard_fenced();
                actions
            }
            Event::Timer if round.barrier.is_some_and(|b| now >= b) => {
                warn!(
                    timeout_s = self.settings.exit_barrier_timeout.as_secs_f64(),
                    "this node's workers succeeded but other nodes did not finish within --exit-barrier-timeout; exiting"
                );
                self.stop(
                    Signal::SIGTERM,
                    Then::Finish(
                        vec![Action::Leave {
                            reason: "its workers succeeded; exit barrier timed out".into(),
                        }],
                        Outcome::Succeeded,
                    ),
                    false,
                )
            }
            Event::StartFailed {
                local_rank,
                global_rank,
                message,
            } => {
                round.live = 0;
                round.failed = true;
                self.phase = Phase::Running(round);
                vec![Action::ReportStartFailure {
                    round: this,
                    local_rank,
                    global_rank,
                    message,
                }]
            }
            Event::Exited(exit) => {
                round.live = round.live.saturating_sub(1);
                if exit.ended.success() || round.failed {
                    return self.go_on(now, round, Vec::new());
                }
                round.failed = true;
                round.reported = Some(exit);
                warn!(local_rank = exit.local_rank, rank = exit.global_rank, ended = %exit.ended, "worker failed");
                let mut actions = vec![Action::ReportFailure { round: this, exit }];
                // Workers this stops show in the summary too (as torchrun's do).
                actions.extend(self.stop(Signal::SIGTERM, Then::Run(round), true));
                actions
            }
            _ => {
                self.phase = Phase::Running(round);
                Vec::new()
            }
        }
    }

    /// Running on: once every worker succeeded, report it and start the
    /// exit barrier.
    fn go_on(&mut self, now: Instant, mut round: Round, mut actions: Vec<Action>) -> Vec<Action> {
        if !round.failed && round.barrier.is_none() && round.live == 0 {
            actions.push(Action::ReportSuccess {
                round: round.info.round,
            });
            round.barrier = Some(after_from(now, self.settings.exit_barrier_timeout));
        }
        self.phase = Phase::Running(round);
        actions
    }

    /// The rendezvous was lost while workers run: they keep running while
    /// the node rejoins, presenting its round.
    fn recover(&mut self, now: Instant, round: Round, why: String) -> Vec<Action> {
        warn!(reason = %why, grace_s = self.settings.reconnect_grace.as_secs_f64(), fence_s = self.settings.fence_after.as_secs_f64(), "lost the rendezvous; workers keep running while this node reconnects");
        self.rejoin_with(now, round, why)
    }

    /// Recovering `round`: the node rejoins, presenting it.
    fn rejoin_with(&mut self, now: Instant, mut round: Round, why: String) -> Vec<Action> {
        round.fence = Some(after_from(now, self.settings.fence_in()));
        round.vouched = false;
        round.dropped = false;
        round.lost = Some(now);
        let resume = resume_of(&round);
        self.phase = Phase::Recovering {
            round,
            pending: None,
            why,
        };
        vec![Action::Rejoin {
            resume: Some(resume),
        }]
    }

    /// The guard killed a recovering round's workers: they were fenced.
    fn guard_fenced(&mut self) {
        if let Phase::Recovering { round, .. } = &mut self.phase {
            warn!("{GUARD_FENCED}");
            round.fence = None;
            round.fenced = true;
            round.failed = true;
        }
    }

    /// Moves a recovering round's fence to `now`: its workers stop at the
    /// next step (the driver wakes at once for the deadline).
    fn fence_now(&mut self, now: Instant) {
        if let Phase::Recovering { round, .. } = &mut self.phase {
            round.dropped = true;
            if self.settings.fence && round.live > 0 {
                round.fence = Some(now);
            }
        }
    }

    fn recovering(
        &mut self,
        now: Instant,
        mut round: Round,
        mut pending: Option<Exit>,
        why: String,
        event: Event,
    ) -> Vec<Action> {
        match event {
            Event::Timer if round.live > 0 && round.fence.is_some_and(|t| now >= t) => {
                warn!(
                    fence_s = self.settings.fence_after.as_secs_f64(),
                    "no rendezvous reached within the drop limit: stopping this node's workers, so no second copy of its ranks runs beside a re-formed job; still rejoining"
                );
                round.fence = None;
                round.fenced = true;
                round.failed = true;
                // SIGKILL: a worker's own shutdown (a last checkpoint) is
                // what must not run beside the re-formed job.
                self.phase = Phase::Stopping {
                    then: Then::Recover {
                        round,
                        pending,
                        why,
                    },
                    note: false,
                    heard: false,
                };
                vec![Action::Stop {
                    signal: Signal::SIGKILL,
                    grace: Duration::ZERO,
                }]
            }
            Event::GuardFenced => {
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                self.guard_fenced();
                Vec::new()
            }
            Event::Vouched(until) => {
                let later = !round.dropped && round.fence.is_some_and(|f| until > f);
                if self.settings.fence && round.live > 0 && later {
                    round.fence = Some(until);
                    if !round.vouched {
                        round.vouched = true;
                        warn!(
                            outage_timeout_s = self.settings.outage_timeout.as_secs_f64(),
                            "the rendezvous is unreachable, but most of this round's nodes hear each other: nobody can re-form the job without them, so the workers keep running while this node reconnects"
                        );
                    }
                }
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                Vec::new()
            }
            // The rejoin gave up (its grace ended) but the outage is not the
            // end of this node: try again (`rejoins_on`).
            Event::RejoinFailed(AgentError::JoinTimeout(_)) if self.rejoins_on(now, &round) => {
                let resume = resume_of(&round);
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                vec![Action::Rejoin {
                    resume: Some(resume),
                }]
            }
            Event::Dead(why) => {
                warn!(reason = %why, "this node's presence lease lapsed: the rendezvous drops it");
                round.dropped = true;
                if self.settings.fence && round.live > 0 {
                    round.fence = Some(now);
                }
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                Vec::new()
            }
            Event::Exited(exit) => {
                round.live = round.live.saturating_sub(1);
                if exit.ended.success() || round.failed {
                    self.phase = Phase::Recovering {
                        round,
                        pending,
                        why,
                    };
                    return Vec::new();
                }
                warn!(local_rank = exit.local_rank, rank = exit.global_rank, ended = %exit.ended, "worker failed while the rendezvous is unreachable");
                round.failed = true;
                pending = Some(exit);
                // The failure itself is recorded when it is reported, once
                // back; the workers this stop ends are not (they would come
                // before it in the summary).
                self.stop(
                    Signal::SIGTERM,
                    Then::Recover {
                        round,
                        pending,
                        why,
                    },
                    false,
                )
            }
            Event::Rejoined {
                round: now_at,
                resumed: false,
            } => {
                info!(
                    round = now_at,
                    "the job moved on without this node; stopping its workers"
                );
                let mut actions =
                    self.stop(Signal::SIGTERM, Then::Form(now_at, Duration::ZERO), false);
                // The workers' time still ends at the fence the lost
                // rendezvous set (or its peers' vouch): the rendezvous now
                // answering does not run their round and licenses none of
                // it. A server restarted without a store counts on that: it
                // forms no round before the drop limit (or outage limit)
                // from its start, and no later (`Job::hold_until`;
                // accel-sim seed 246666).
                if let (true, Some(fence), [Action::Stop { signal, grace }]) =
                    (self.settings.fence, round.fence, &mut actions[..])
                {
                    *grace = (*grace).min(fence.saturating_duration_since(now));
                    if grace.is_zero() {
                        *signal = Signal::SIGKILL;
                    }
                }
                actions
            }
            Event::Rejoined { resumed: true, .. } => {
                info!(
                    round = round.info.round,
                    "reconnected; the round is still current"
                );
                let mut actions = Vec::new();
                round.fence = None;
                // A worker's failure, seen while unreachable or reported
                // before the loss (the rendezvous now serving may not have
                // it: its round would otherwise never end), is the round's
                // failure and spends the budget.
                if let Some(exit) = pending.or(round.reported) {
                    // Said again if this server is lost too.
                    round.reported = Some(exit);
                    actions.push(Action::ReportFailure {
                        round: round.info.round,
                        exit,
                    });
                } else if round.fenced {
                    // No worker failed: this node stopped them itself. The
                    // round cannot go on without them, so the job re-forms,
                    // spending nothing of the budget.
                    info!(
                        round = round.info.round,
                        "this node's workers were fenced; the job re-forms with it (no restart is counted)"
                    );
                    actions.push(Action::ReportFenced {
                        round: round.info.round,
                        reason: format!(
                            "stopped its workers after {:.1} s without a rendezvous (the drop limit; fencing)",
                            self.settings.fence_after.as_secs_f64()
                        ),
                    });
                }
                if round.barrier.is_some() {
                    // A restarted server has forgotten; say it again.
                    actions.push(Action::ReportSuccess {
                        round: round.info.round,
                    });
                }
                self.go_on(now, round, actions)
            }
            Event::RejoinFailed(e) => {
                let grace = match round.fenced || round.live == 0 {
                    true => self.idle_grace(),
                    false => self.settings.reconnect_grace,
                };
                let e = self.gave_up(why, e, grace);
                self.stop(Signal::SIGTERM, Then::Fail(e), false)
            }
            _ => {
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                Vec::new()
            }
        }
    }

    /// Stops the workers; `then` follows when they have stopped.
    /// Stops the workers with `signal`, SIGKILL after `--shutdown-timeout`;
    /// `then` happens once they are gone. While the job re-forms (a restart
    /// this node goes on to, its own failure, its leaving for a failed
    /// check), the grace is at most the fence (the drop limit less its
    /// margin): the re-formed round waits for this node's offer no longer
    /// than a drop limit from the restart, then forms without it, and a
    /// worker still finishing its SIGTERM handler then would run beside its
    /// rank's new copy.
    fn stop(&mut self, signal: Signal, then: Then, note: bool) -> Vec<Action> {
        let reforming = matches!(then, Then::Form(..) | Then::Run(_) | Then::Depart(_));
        let grace = match reforming && self.settings.fence {
            true => self.settings.shutdown_timeout.min(self.settings.fence_in()),
            false => self.settings.shutdown_timeout,
        };
        self.phase = Phase::Stopping {
            then,
            note,
            heard: false,
        };
        vec![Action::Stop { signal, grace }]
    }

    /// A signal while workers stop. A stop the node itself started for a
    /// new round or its own failure now ends the node, signaled, once the
    /// workers stopped. A second signal during any stop (the signal that
    /// started it counts) kills the workers at once.
    fn signal_stopping(&mut self, then: Then, note: bool, heard: bool, sig: Signal) -> Vec<Action> {
        let second = heard || matches!(then, Then::Finish(_, Outcome::Signaled(_)));
        let then = match then {
            Then::Form(..) | Then::Run(_) | Then::Recover { .. } | Then::Depart(_) => {
                Then::Finish(Vec::new(), Outcome::Signaled(sig))
            }
            then => then,
        };
        let actions = if second {
            warn!(signal = %sig, "second signal: killing workers now");
            vec![Action::Kill]
        } else {
            warn!(signal = %sig, "stopping; a second signal kills the workers at once");
            Vec::new()
        };
        self.phase = Phase::Stopping {
            then,
            note,
            heard: true,
        };
        actions
    }

    fn then(&mut self, now: Instant, then: Then) -> Vec<Action> {
        match then {
            Then::Form(round, wait) if !wait.is_zero() => {
                warn!(
                    round,
                    wait_s = wait.as_secs_f64(),
                    crashes = self.crashes,
                    "crash loop: the job failed again within --restart-backoff-window of its start; waiting before the restart"
                );
                self.phase = Phase::BackingOff {
                    round,
                    until: after_from(now, wait),
                };
                Vec::new()
            }
            Then::Form(round, _) => self.form(now, round),
            Then::Run(round) => self.go_on(now, round, Vec::new()),
            Then::Recover {
                round,
                pending,
                why,
            } => {
                self.phase = Phase::Recovering {
                    round,
                    pending,
                    why,
                };
                Vec::new()
            }
            Then::Finish(pre, outcome) => self.finish(pre, outcome),
            Then::Fail(e) => self.exit(Err(e)),
            Then::Depart(why) => {
                self.phase = Phase::Done;
                vec![Action::Depart { why }]
            }
        }
    }

    /// `pre`, then the outcome: a signaled node leaves the job first.
    fn finish(&mut self, mut pre: Vec<Action>, outcome: Outcome) -> Vec<Action> {
        match &outcome {
            Outcome::Signaled(sig) => pre.push(Action::Leave {
                reason: format!("its agent received {sig}"),
            }),
            Outcome::Succeeded => info!("job succeeded"),
            Outcome::Failed(reason) => error!(%reason, "job failed"),
            // The reason says which: a worker's no-restart code, or no
            // progress (--max-no-progress-restarts).
            Outcome::NoRestart { reason, code } => {
                error!(%reason, exit_code = code, "job failed without a restart")
            }
        }
        pre.extend(self.exit(Ok(outcome)));
        pre
    }

    fn exit(&mut self, result: Result<Outcome, AgentError>) -> Vec<Action> {
        self.phase = Phase::Done;
        vec![Action::Exit(result)]
    }

    /// Whether a recovering node whose rejoin timed out tries again:
    /// - its peers keep its workers: an outage is not the end of a healthy
    ///   job;
    /// - nothing of it runs any more (its workers were fenced, or ended
    ///   during the outage: succeeded, or failed and the rest stopped): it
    ///   keeps rejoining through a control-plane outage, as a spare does
    ///   ([`super::link::idle_rejoin_grace`] from the loss), to report how
    ///   its round ended; giving up would end a finished job's agent with 1,
    ///   or lose a failure the job must restart on.
    fn rejoins_on(&self, now: Instant, round: &Round) -> bool {
        let vouched = round.vouched && round.live > 0 && round.fence.is_some_and(|f| f > now);
        let idle = (round.fenced || round.live == 0)
            && round
                .lost
                .is_some_and(|lost| now < after_from(lost, self.idle_grace()));
        vouched || idle
    }

    /// How long a node with no workers running keeps rejoining.
    fn idle_grace(&self) -> Duration {
        super::link::idle_rejoin_grace(self.settings.reconnect_grace, self.settings.outage_timeout)
    }

    fn gave_up(&self, why: String, e: AgentError, grace: Duration) -> AgentError {
        AgentError::GaveUp {
            why,
            grace,
            source: Box::new(e),
        }
    }
}

/// The result a node of a job that is already over ends with.
pub(crate) fn outcome_of(o: &pb::JobOver) -> Outcome {
    match (o.succeeded, u8::try_from(o.exit_code)) {
        (true, _) => Outcome::Succeeded,
        // A "do not restart" code the job ended with, which its agents exited with.
        (false, Ok(code)) if code > 1 => Outcome::NoRestart {
            reason: o.reason.clone(),
            code,
        },
        (false, _) => Outcome::Failed(o.reason.clone()),
    }
}

/// The one line a node of a finished job prints when it joins late.
pub(crate) fn over_line(job: &str, o: &pb::JobOver) -> String {
    let at = accel_wire::time::utc(o.finished_unix_ms);
    if o.succeeded {
        format!("job '{job}' already succeeded at {at}; nothing to do (the same command run again starts a new run)")
    } else {
        format!(
            "job '{job}' already failed at {at} (round {}): {}; exiting {} (the same command run again starts a new run)",
            o.round, o.reason, o.exit_code
        )
    }
}

/// The line an agent that starts a new run of a finished job's id prints.
pub(crate) fn new_run_line(job: &str, o: &pb::JobOver) -> String {
    let at = accel_wire::time::utc(o.finished_unix_ms);
    let outcome = if o.succeeded { "succeeded" } else { "failed" };
    format!("job '{job}' {outcome} at {at}; starting a new run")
}

fn closed(c: &pb::JobClosed) -> AgentError {
    AgentError::JobClosed {
        reason: c.reason.clone(),
    }
}

/// What a forming round waits for, in words.
pub(super) fn describe_waiting(w: &pb::Waiting) -> String {
    let mut hosts = match (w.hosts.is_empty(), w.members) {
        (true, 0) => "none".to_owned(),
        // A large job's progress names nobody, only counts.
        (true, n) => format!("{n} nodes"),
        (false, _) => w.hosts.join(", "),
    };
    if !w.hosts.is_empty() && w.members as usize > w.hosts.len() {
        hosts.push_str(&format!(" and {} more", w.members as usize - w.hosts.len()));
    }
    if !w.quarantine.is_empty() {
        let left = accel_input::duration_words(std::time::Duration::from_secs(
            w.quarantine_left_ms.div_ceil(1000),
        ));
        return format!(
            "this host is quarantined by the rendezvous: {}; no round takes it for {left} more, and it waits as a spare meanwhile (`rdzv-server quarantine release HOST` ends it sooner)",
            w.quarantine
        );
    }
    if w.spare {
        return match w.round_nodes {
            n if n == 0 || n >= w.max_nodes => format!(
                "waiting as a spare: the job runs with its maximum of {} nodes; this node joins when a slot frees (members: {hosts})",
                w.max_nodes
            ),
            n => format!(
                "waiting as a spare: the job runs with {n} nodes, the most of the ready ones it can use (--nnodes-multiple-of); this node joins when a slot frees or enough nodes wait for a larger round (members: {hosts})"
            ),
        };
    }
    let range = if w.min_nodes == w.max_nodes {
        w.max_nodes.to_string()
    } else {
        format!("{}..{}", w.min_nodes, w.max_nodes)
    };
    let mut s = format!("{} of {range} nodes ready", w.ready);
    if w.members < w.min_nodes {
        s.push_str(&format!(
            ", waiting for {} more to join",
            w.min_nodes - w.members
        ));
    }
    if w.members > w.ready {
        s.push_str(&format!(
            ", {} joined and getting ready",
            w.members - w.ready
        ));
    }
    if let Some(ms) = w.last_call_ms {
        s.push_str(&format!(
            ", last call closes in {:.1} s",
            ms as f64 / 1000.0
        ));
    }
    s.push_str(&format!(" (joined: {hosts})"));
    s
}

/// This node's segment as the server described it; one segment of the whole
/// round when that description does not hold this node (a server that
/// predates segments sends zeros).
fn segment_of(r: &pb::RoundComplete) -> Segment {
    let (first, nodes) = (r.segment_first_node, r.segment_nodes);
    let holds = nodes > 0
        && first <= r.node_rank
        && r.node_rank - first < nodes
        && first.checked_add(nodes).is_some_and(|end| end <= r.nnodes);
    match holds {
        true => Segment {
            index: r.segment,
            first_node: first,
            nodes,
        },
        false => Segment {
            index: 0,
            first_node: 0,
            nodes: r.nnodes,
        },
    }
}

/// What a node that rejoins presents of the round its workers run.
fn resume_of(round: &Round) -> pb::Resume {
    let info = &round.info;
    pb::Resume {
        round: info.round,
        restart_count: info.restart_count,
        node_rank: info.node_rank,
        nnodes: info.nnodes,
    }
}

fn round_info(r: &pb::RoundComplete) -> RoundInfo {
    RoundInfo {
        round: r.round,
        node_rank: r.node_rank,
        nnodes: r.nnodes,
        world_size: r.world_size,
        base_rank: r.base_rank,
        restart_count: r.restart_count,
        max_restarts: r.max_restarts,
        master_addr: r.master_addr.clone(),
        master_port: r.master_port,
        segment: segment_of(r),
        peer_key: r.peer_key.clone(),
    }
}

#[cfg(test)]
mod tests;

/// The job is over: where its time went, as the rendezvous accounted it
/// (`goodput 91.2 % of 1m54s: productive 1m44s, ...`), once per agent.
fn say_goodput(g: Option<&pb::Goodput>) {
    if let Some(g) = g.filter(|g| g.wall_ms() > 0) {
        info!("job time: {}", g.line());
    }
}
