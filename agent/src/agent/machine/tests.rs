//! The node's life driven by synthetic events and instants: no process,
//! no network.

use super::*;
use crate::sys::Ended;

const SECOND: Duration = Duration::from_secs(1);
/// When a node that lost its rendezvous stops its workers: the 15 s drop
/// limit less the fence margin (0.2 s).
const FENCE: Duration = Duration::from_millis(14_800);

fn settings() -> Settings {
    Settings {
        run_id: "job".into(),
        nproc_per_node: 2,
        join_timeout: Duration::from_secs(600),
        exit_barrier_timeout: Duration::from_secs(300),
        shutdown_timeout: Duration::from_secs(30),
        reconnect_grace: Duration::from_secs(60),
        fence_after: Duration::from_secs(15),
        outage_timeout: Duration::from_secs(900),
        fence: true,
        restart_backoff: crate::config::RestartBackoff::default(),
    }
}

/// A node that joined at round 0 and was told to get ready for it.
fn joined() -> (NodeMachine, Instant) {
    let t0 = Instant::now();
    let (m, actions) = NodeMachine::new(settings(), t0, 0);
    assert!(
        matches!(actions[..], [Action::Offer { round: 0 }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), Some(t0 + Duration::from_secs(600)));
    (m, t0)
}

fn complete(round: u64, restart_count: u32) -> Event {
    Event::Message(Kind::RoundComplete(pb::RoundComplete {
        round,
        node_rank: 1,
        nnodes: 2,
        world_size: 4,
        base_rank: 2,
        restart_count,
        max_restarts: 3,
        master_addr: "10.0.0.1".into(),
        master_port: 29500,
        member_addrs: Vec::new(),
        ..Default::default()
    }))
}

/// A node whose round 0 formed and whose two workers run.
fn running() -> (NodeMachine, Instant) {
    let (mut m, t0) = joined();
    let actions = m.step(t0 + SECOND, complete(0, 0));
    match &actions[..] {
        [Action::Start { info, .. }] => {
            assert_eq!((info.round, info.node_rank, info.base_rank), (0, 1, 2));
        }
        other => panic!("expected the workers to start, got {other:?}"),
    }
    assert!(m.sources().workers && m.sources().stream);
    (m, t0)
}

fn exit(local_rank: u32, code: i32) -> Exit {
    Exit {
        local_rank,
        global_rank: 2 + local_rank,
        pid: 100 + local_rank,
        ended: Ended::Exited(code),
    }
}

fn restart(round: u64, next_round: u64) -> Event {
    Event::Message(Kind::RestartRequested(pb::RestartRequested {
        round,
        next_round,
        reason: "a worker failed".into(),
        counted: true,
    }))
}

fn job_failed() -> Event {
    Event::Message(Kind::JobFailed(pb::JobFailed {
        round: 0,
        reason: "budget spent".into(),
        root_cause: Some(pb::Failure {
            host: "h".into(),
            ..Default::default()
        }),
        exit_code: None,
        goodput: None,
    }))
}

fn succeeded() -> Event {
    Event::Message(Kind::JobSucceeded(pb::JobSucceeded {
        round: 0,
        goodput: None,
    }))
}

fn is_stop(a: &Action, sig: Signal) -> bool {
    matches!(a, Action::Stop { signal, grace } if *signal == sig && *grace == Duration::from_secs(30))
}

/// A stop while the job re-forms: SIGTERM, SIGKILL at the fence at most
/// (the re-formed round waits no longer for this node).
fn is_reform_stop(a: &Action) -> bool {
    matches!(a, Action::Stop { signal: Signal::SIGTERM, grace } if *grace == FENCE)
}

/// Stopped at once, with no grace: the fence.
fn is_kill(a: &Action) -> bool {
    matches!(a, Action::Stop { signal: Signal::SIGKILL, grace } if grace.is_zero())
}

fn outcome(actions: &[Action]) -> &Outcome {
    match actions.last() {
        Some(Action::Exit(Ok(o))) => o,
        other => panic!("expected an outcome last, got {other:?}"),
    }
}

fn error(actions: Vec<Action>) -> AgentError {
    match actions.into_iter().last() {
        Some(Action::Exit(Err(e))) => e,
        other => panic!("expected an error last, got {other:?}"),
    }
}

#[test]
fn a_worker_failure_is_reported_the_others_are_stopped_and_the_restart_followed() {
    let (mut m, t0) = running();
    let t = t0 + 2 * SECOND;
    let actions = m.step(t, Event::Exited(exit(1, 3)));
    match &actions[..] {
        [Action::ReportFailure { round: 0, exit }, stop] => {
            assert_eq!(exit.ended, Ended::Exited(3));
            assert!(is_reform_stop(stop), "{stop:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        m.sources(),
        Sources {
            stream: false,
            rejoin: false,
            workers: false,
            stop: true,
            peers: false,
        }
    );
    // The stop saw local rank 0 end by SIGTERM: it goes into the summary.
    let stopped = Exit {
        ended: Ended::Signaled(15),
        ..exit(0, 0)
    };
    let actions = m.step(t, Event::Stopped(vec![stopped]));
    assert!(
        matches!(&actions[..], [Action::Note(e)] if e.local_rank == 0),
        "{actions:?}"
    );
    // No success once a worker failed, however the others end.
    assert!(m.step(t, Event::Exited(exit(0, 0))).is_empty());
    assert_eq!(m.deadline(), None, "no exit barrier after a failure");
    // The job restarts: ready for round 1, with a fresh forming deadline.
    let later = t + 5 * SECOND;
    let actions = m.step(later, restart(0, 1));
    assert!(is_reform_stop(&actions[0]), "{actions:?}");
    let actions = m.step(later, Event::Stopped(Vec::new()));
    assert!(
        matches!(actions[..], [Action::Offer { round: 1 }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), Some(later + Duration::from_secs(600)));
    let actions = m.step(later, complete(1, 1));
    assert!(matches!(&actions[..], [Action::Start { info, .. }] if info.restart_count == 1));
}

#[test]
fn a_restart_for_another_round_is_ignored() {
    let (mut m, t0) = running();
    assert!(m.step(t0, restart(7, 8)).is_empty());
    assert!(m.sources().workers);
}

#[test]
fn a_spent_budget_fails_the_job_with_the_summary() {
    let (mut m, t0) = running();
    m.step(t0, Event::Exited(exit(0, 1)));
    m.step(t0, Event::Stopped(Vec::new()));
    let actions = m.step(t0, job_failed());
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    let actions = m.step(t0, Event::Stopped(Vec::new()));
    match &actions[..] {
        [Action::Summarize { root: Some(root) }, Action::Exit(Ok(Outcome::Failed(reason)))] => {
            assert_eq!(root.host, "h");
            assert_eq!(reason, "budget spent");
        }
        other => panic!("{other:?}"),
    }
    assert!(m.is_done());
    assert!(m.step(t0, Event::Timer).is_empty(), "nothing after the end");
}

#[test]
fn a_job_that_fails_while_forming_prints_the_summary() {
    let (mut m, t0) = joined();
    let actions = m.step(t0, job_failed());
    assert!(
        matches!(
            &actions[..],
            [
                Action::Summarize { .. },
                Action::Exit(Ok(Outcome::Failed(_)))
            ]
        ),
        "{actions:?}"
    );
}

#[test]
fn a_worker_that_cannot_start_is_reported_as_a_start_failure() {
    let (mut m, t0) = running();
    let actions = m.step(
        t0,
        Event::StartFailed {
            local_rank: 1,
            global_rank: 3,
            message: "no such file".into(),
        },
    );
    assert!(
        matches!(
            &actions[..],
            [Action::ReportStartFailure {
                round: 0,
                local_rank: 1,
                global_rank: 3,
                ..
            }]
        ),
        "{actions:?}"
    );
    assert_eq!(
        m.deadline(),
        None,
        "a node that could not start does not succeed"
    );
}

#[test]
fn a_lost_rendezvous_keeps_the_workers_and_resumes_the_round() {
    let (mut m, t0) = running();
    let actions = m.step(t0, Event::Lost("no keep-alive answered for 30.0 s".into()));
    match &actions[..] {
        [Action::Rejoin { resume: Some(r) }] => {
            assert_eq!(
                (r.round, r.restart_count, r.node_rank, r.nnodes),
                (0, 0, 1, 2)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        m.sources(),
        Sources {
            stream: false,
            rejoin: true,
            workers: true,
            stop: false,
            peers: true,
        }
    );
    // A worker succeeding meanwhile is just noted.
    assert!(m.step(t0, Event::Exited(exit(0, 0))).is_empty());
    let actions = m.step(
        t0 + SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(actions.is_empty(), "no stop, no report: {actions:?}");
    assert!(m.sources().stream && m.sources().workers);
    // The round goes on: the last worker's success is reported.
    let actions = m.step(t0 + 2 * SECOND, Event::Exited(exit(1, 0)));
    assert!(
        matches!(actions[..], [Action::ReportSuccess { round: 0 }]),
        "{actions:?}"
    );
}

#[test]
fn workers_unreachable_for_the_drop_limit_are_stopped_and_their_round_re_forms_once_back() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    assert_eq!(m.deadline(), Some(t0 + FENCE), "the fence");
    assert!(
        m.step(t0 + 14 * SECOND, Event::Timer).is_empty(),
        "early timer"
    );
    assert!(!m.left_round(), "lost, but still in its round");
    let actions = m.step(t0 + 15 * SECOND, Event::Timer);
    assert!(is_kill(&actions[0]), "{actions:?}");
    assert!(m.left_round(), "fenced: out of the round's peer hub");
    let stopped = vec![
        Exit {
            ended: Ended::Signaled(15),
            ..exit(0, 0)
        },
        Exit {
            ended: Ended::Signaled(15),
            ..exit(1, 0)
        },
    ];
    assert!(
        m.step(t0 + 16 * SECOND, Event::Stopped(stopped)).is_empty(),
        "not noted"
    );
    assert!(m.sources().rejoin && !m.sources().stream, "still rejoining");
    assert_eq!(m.deadline(), None, "nothing left to fence");
    // The rendezvous comes back late (a new host loaded the job) and still
    // runs round 0: it cannot go on without this node's workers, so the
    // node says they were fenced. No worker failed: nothing is reported as
    // a failure, and the round re-forms without spending the budget.
    let actions = m.step(
        t0 + 30 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    match &actions[..] {
        [Action::ReportFenced { round: 0, reason }] => {
            assert!(
                reason.contains("15.0 s") && reason.contains("drop limit"),
                "{reason}"
            )
        }
        other => panic!("expected the fence to be said, got {other:?}"),
    }
    let ready = m.readiness().expect_err("not ready");
    assert!(ready.contains("fencing"), "{ready}");
    // The job's re-form is then followed as usual, and is no crash.
    let reform = Event::Message(Kind::RestartRequested(pb::RestartRequested {
        round: 0,
        next_round: 1,
        reason: "host 'h' stopped its workers".into(),
        counted: false,
    }));
    let actions = m.step(t0 + 31 * SECOND, reform);
    assert!(is_reform_stop(&actions[0]), "{actions:?}");
    let actions = m.step(t0 + 31 * SECOND, Event::Stopped(Vec::new()));
    assert!(
        matches!(actions[..], [Action::Offer { round: 1 }]),
        "{actions:?}"
    );
}

#[test]
fn a_lapsed_presence_lease_fences_the_workers_at_once_and_the_node_rejoins() {
    // Agent-only rendezvous: the link still answers, but this node's
    // presence lease could not be renewed, so the leader drops it when etcd
    // ends the lease: the workers go now, not at the drop limit.
    let (mut m, t0) = running();
    let actions = m.step(t0, Event::Dead("presence lease lapsed".into()));
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: Some(_) }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), Some(t0), "the fence is now");
    let actions = m.step(t0, Event::Timer);
    assert!(is_kill(&actions[0]), "{actions:?}");
    m.step(t0 + SECOND, Event::Stopped(Vec::new()));
    // Already recovering (the link broke first): the lapse moves the fence.
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    assert_eq!(m.deadline(), Some(t0 + FENCE));
    assert!(m
        .step(t0 + 2 * SECOND, Event::Dead("lapsed".into()))
        .is_empty());
    assert_eq!(m.deadline(), Some(t0 + 2 * SECOND), "fenced at the lapse");
    // With fencing switched off (the debug-only test switch) nothing moves.
    let (mut m, t0) = running();
    m.settings.fence = false;
    m.step(t0, Event::Dead("lapsed".into()));
    assert_ne!(m.deadline(), Some(t0));
}

#[test]
fn workers_the_guard_killed_while_the_agent_was_paused_were_fenced_not_failed() {
    // The agent wakes from a pause past its fence deadline: the guard
    // killed both workers; their exits follow the guard's word.
    let (mut m, t0) = running();
    let t = t0 + 3 * SECOND;
    let actions = m.step(t, Event::GuardFenced);
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: Some(_) }]),
        "{actions:?}"
    );
    let killed = |local_rank| Exit {
        ended: Ended::Signaled(9),
        ..exit(local_rank, 0)
    };
    assert!(m.step(t, Event::Exited(killed(0))).is_empty());
    assert!(m.step(t, Event::Exited(killed(1))).is_empty());
    assert_eq!(m.deadline(), None, "nothing left to fence");
    // Back on the same round: said to be fenced, not failed, so the job
    // re-forms without spending the budget.
    let actions = m.step(
        t + SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(&actions[..], [Action::ReportFenced { round: 0, .. }]),
        "{actions:?}"
    );
    // Already recovering (the link broke during the pause): the same.
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    assert!(m.step(t0 + SECOND, Event::GuardFenced).is_empty());
    assert!(m.step(t0 + SECOND, Event::Exited(killed(0))).is_empty());
    let actions = m.step(
        t0 + 2 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(&actions[..], [Action::ReportFenced { round: 0, .. }]),
        "{actions:?}"
    );
}

#[test]
fn a_failure_before_the_fence_is_still_the_rounds_failure() {
    let (mut m, t0) = running();
    // A worker fails and is reported; the loss comes before the job's
    // decision, and the fence then stops what is left.
    let actions = m.step(t0, Event::Exited(exit(1, 9)));
    assert!(matches!(actions[0], Action::ReportFailure { round: 0, .. }));
    m.step(t0, Event::Stopped(Vec::new()));
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    // (The machine does not count the stopped workers as ended: it kills
    // whatever may be left.)
    let actions = m.step(t0 + 15 * SECOND, Event::Timer);
    assert!(matches!(&actions[..], [a] if is_kill(a)), "{actions:?}");
    m.step(t0 + 15 * SECOND, Event::Stopped(Vec::new()));
    let actions = m.step(
        t0 + 20 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(&actions[..], [Action::ReportFailure { round: 0, exit }] if exit.local_rank == 1),
        "the failure is said again, not a fence: {actions:?}"
    );
}

#[test]
fn a_fenced_node_whose_job_moved_on_gets_ready_for_the_next_round() {
    let (mut m, t0) = running();
    // Silent for the drop limit already: the workers go at once.
    let since = t0;
    m.step(
        t0 + 15 * SECOND,
        Event::Silent {
            why: "no keep-alive answered for 15.0 s".into(),
            since,
        },
    );
    assert_eq!(
        m.deadline(),
        Some(since + FENCE),
        "the fence counts from the last answer"
    );
    let actions = m.step(t0 + 15 * SECOND, Event::Timer);
    assert!(is_kill(&actions[0]), "{actions:?}");
    m.step(t0 + 16 * SECOND, Event::Stopped(Vec::new()));
    let actions = m.step(
        t0 + 20 * SECOND,
        Event::Rejoined {
            round: 2,
            resumed: false,
        },
    );
    assert!(is_reform_stop(&actions[0]), "{actions:?}");
    let actions = m.step(t0 + 20 * SECOND, Event::Stopped(Vec::new()));
    assert!(
        matches!(actions[..], [Action::Offer { round: 2 }]),
        "{actions:?}"
    );
}

#[test]
fn a_fenced_node_keeps_rejoining_through_an_outage_as_long_as_a_spare_would() {
    let (mut m, t0) = running();
    m.step(
        t0 + 15 * SECOND,
        Event::Silent {
            why: "no keep-alive answered for 15.0 s".into(),
            since: t0,
        },
    );
    let actions = m.step(t0 + 15 * SECOND, Event::Timer);
    assert!(is_kill(&actions[0]), "{actions:?}");
    m.step(t0 + 16 * SECOND, Event::Stopped(Vec::new()));
    // reconnect_grace (60 s) over, nothing running: it tries again...
    let actions = m.step(
        t0 + 76 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("no answer".into())),
    );
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: Some(_) }]),
        "{actions:?}"
    );
    // ...until outage_timeout (900 s) from the loss.
    let actions = m.step(
        t0 + 916 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("no answer".into())),
    );
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    let e = error(m.step(t0 + 917 * SECOND, Event::Stopped(Vec::new())));
    assert!(
        matches!(&e, AgentError::GaveUp { grace, .. } if *grace == Duration::from_secs(900)),
        "{e:?}"
    );
}

#[test]
fn a_node_whose_workers_succeeded_during_an_outage_waits_to_report_it() {
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::Lost("lost the rendezvous: connection refused".into()),
    );
    m.step(t0 + SECOND, Event::Vouched(t0 + 20 * SECOND));
    // Training ends while the rendezvous is still away.
    m.step(t0 + 10 * SECOND, Event::Exited(exit(0, 0)));
    m.step(t0 + 10 * SECOND, Event::Exited(exit(1, 0)));
    // reconnect_grace over: it tries again rather than exit 1...
    let actions = m.step(
        t0 + 60 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("no answer".into())),
    );
    assert!(
        matches!(actions[..], [Action::Rejoin { .. }]),
        "{actions:?}"
    );
    // ...and reports the success once it is back.
    let actions = m.step(
        t0 + 120 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::ReportSuccess { round: 0 })),
        "{actions:?}"
    );
}

#[test]
fn a_node_back_within_the_drop_limit_keeps_its_workers_unfenced() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    let actions = m.step(
        t0 + 14 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(m.deadline(), None, "no fence once back");
    assert!(m.step(t0 + 20 * SECOND, Event::Timer).is_empty());
}

#[test]
fn a_failure_reported_before_the_loss_is_said_again_to_the_rendezvous_it_rejoins() {
    let (mut m, t0) = running();
    let actions = m.step(t0, Event::Exited(exit(1, 9)));
    assert!(
        matches!(actions[0], Action::ReportFailure { round: 0, .. }),
        "{actions:?}"
    );
    m.step(t0, Event::Stopped(Vec::new()));
    // The leader dies before the failure was durable; a new one serves.
    m.step(
        t0 + SECOND,
        Event::Lost("lost the rendezvous: broken pipe".into()),
    );
    let actions = m.step(
        t0 + 3 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(&actions[..], [Action::ReportFailure { round: 0, exit }] if exit.local_rank == 1),
        "{actions:?}"
    );
}

#[test]
fn a_node_whose_failure_report_was_answered_stops_vouching_for_its_round() {
    // Its other workers take their time on SIGTERM; meanwhile the stream
    // (and the restart on it) is not read. A peer cut off from the
    // rendezvous must not keep its workers on this node's word beside the
    // re-formed round (accel-sim seed 59178).
    let (mut m, t0) = running();
    let actions = m.step(t0, Event::Exited(exit(1, 9)));
    assert!(
        matches!(&actions[..], [Action::ReportFailure { round: 0, .. }, a] if is_reform_stop(a)),
        "{actions:?}"
    );
    assert!(
        !m.left_round(),
        "not answered yet: still in its round's hub"
    );
    assert!(
        m.stop_reforms(),
        "its fence is the one it had when the stop began"
    );
    // An answer for another round changes nothing.
    assert!(m.step(t0, Event::FailureTaken(7)).is_empty());
    assert!(!m.left_round());
    assert!(m.step(t0, Event::FailureTaken(0)).is_empty());
    assert!(m.left_round(), "answered: the round is over for it");
    assert_eq!(m.phase_name(), "stopping");
    assert!(m.step(t0 + SECOND, Event::Stopped(Vec::new())).is_empty());
    assert!(m.left_round(), "still out once its workers stopped");
    let actions = m.step(t0 + SECOND, restart(0, 1));
    assert!(
        matches!(&actions[..], [a] if is_reform_stop(a)),
        "{actions:?}"
    );
    assert!(m.left_round());
}

#[test]
fn a_failure_while_unreachable_is_reported_once_back() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("lost the rendezvous: broken pipe".into()));
    let actions = m.step(t0, Event::Exited(exit(1, 9)));
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    // While the others stop, the rejoin waits; the workers the stop ends do
    // not go into the summary before the failure that caused it.
    assert!(!m.sources().rejoin);
    let killed = Exit {
        ended: Ended::Signaled(15),
        ..exit(0, 0)
    };
    assert!(!m.left_round(), "its own failure: still in its round's hub");
    assert!(m.step(t0, Event::Stopped(vec![killed])).is_empty());
    assert!(m.sources().rejoin, "back to rejoining");
    assert!(!m.left_round(), "its report waits for the rendezvous");
    let actions = m.step(
        t0,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(&actions[..], [Action::ReportFailure { round: 0, exit }] if exit.local_rank == 1),
        "{actions:?}"
    );
}

#[test]
fn a_success_is_said_again_to_a_server_that_restarted() {
    let (mut m, t0) = running();
    m.step(t0, Event::Exited(exit(0, 0)));
    let actions = m.step(t0, Event::Exited(exit(1, 0)));
    assert!(matches!(actions[..], [Action::ReportSuccess { round: 0 }]));
    let closing = Event::Message(Kind::JobClosed(pb::JobClosed {
        reason: "the rendezvous server is shutting down".into(),
        may_rejoin: true,
    }));
    assert!(matches!(
        m.step(t0, closing)[..],
        [Action::Rejoin { resume: Some(_) }]
    ));
    let actions = m.step(
        t0,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(
        matches!(actions[..], [Action::ReportSuccess { round: 0 }]),
        "{actions:?}"
    );
}

#[test]
fn a_job_that_reformed_without_this_node_stops_its_workers_and_gets_ready() {
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::Lost("lost the rendezvous: connection reset".into()),
    );
    let later = t0 + SECOND;
    let actions = m.step(
        later,
        Event::Rejoined {
            round: 3,
            resumed: false,
        },
    );
    // The stop ends at the fence the lost rendezvous set, not a fence from
    // the rejoin: the rendezvous now answering licenses nothing of the old round.
    assert!(
        matches!(actions[..], [Action::Stop { signal: Signal::SIGTERM, grace }] if grace == FENCE - SECOND),
        "{actions:?}"
    );
    let actions = m.step(
        later,
        Event::Stopped(vec![Exit {
            ended: Ended::Signaled(15),
            ..exit(0, 0)
        }]),
    );
    assert!(
        matches!(actions[..], [Action::Offer { round: 3 }]),
        "not noted as a failure: {actions:?}"
    );
    assert_eq!(m.deadline(), Some(later + Duration::from_secs(600)));
}

#[test]
fn a_node_that_rejoins_past_its_fence_to_a_job_that_moved_on_kills_its_workers_at_once() {
    // The agent did not run past its fence (paused), and the first thing it
    // hears is a rendezvous (a restarted one without a store) that does not
    // run its round: that rendezvous may form a round any moment now.
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::Lost("lost the rendezvous: connection reset".into()),
    );
    let actions = m.step(
        t0 + 20 * SECOND,
        Event::Rejoined {
            round: 3,
            resumed: false,
        },
    );
    assert!(matches!(&actions[..], [a] if is_kill(a)), "{actions:?}");
    assert!(m.left_round(), "the round is over for it");
}

#[test]
fn a_grace_that_expires_stops_the_workers_and_ends_the_agent() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("no keep-alive answered for 30.0 s".into()));
    let actions = m.step(
        t0 + 60 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("no answer".into())),
    );
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    let e = error(m.step(t0 + 61 * SECOND, Event::Stopped(Vec::new())));
    assert!(
        matches!(&e, AgentError::GaveUp { grace, source, .. }
            if *grace == Duration::from_secs(60) && matches!(**source, AgentError::JoinTimeout(_))),
        "{e:?}"
    );
    assert_eq!(e.exit_code(), 1);
    let text = e.to_string();
    assert!(
        text.contains("no keep-alive answered") && text.contains("within 60 s (reconnect_grace"),
        "{text}"
    );
}

#[test]
fn a_lost_rendezvous_while_forming_rejoins_and_gets_ready_for_the_current_round() {
    let (mut m, t0) = joined();
    let actions = m.step(t0 + SECOND, Event::Lost("lost the rendezvous: eof".into()));
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: None }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), None, "the grace bounds the rejoin");
    let actions = m.step(
        t0 + 2 * SECOND,
        Event::Rejoined {
            round: 4,
            resumed: false,
        },
    );
    assert!(
        matches!(actions[..], [Action::Offer { round: 4 }]),
        "{actions:?}"
    );
    // Reconnecting does not extend the time a round may take to form.
    assert_eq!(m.deadline(), Some(t0 + Duration::from_secs(600)));
}

#[test]
fn a_round_that_does_not_form_in_time_ends_the_agent_with_the_last_progress() {
    let (mut m, t0) = joined();
    let waiting = Event::Message(Kind::Waiting(pb::Waiting {
        round: 0,
        ready: 1,
        needed: 2,
        hosts: vec!["a".into()],
        min_nodes: 2,
        max_nodes: 2,
        members: 1,
        ..Default::default()
    }));
    assert!(m.step(t0, waiting).is_empty());
    assert!(
        m.step(t0 + 599 * SECOND, Event::Timer).is_empty(),
        "early timer"
    );
    let text = error(m.step(t0 + 600 * SECOND, Event::Timer)).to_string();
    assert!(
        text.contains("1 of 2 nodes ready, waiting for 1 more to join (joined: a)"),
        "{text}"
    );
}

#[test]
fn a_later_round_while_forming_is_offered_again() {
    let (mut m, t0) = joined();
    let actions = m.step(t0, restart(0, 2));
    assert!(
        matches!(actions[..], [Action::Offer { round: 2 }]),
        "{actions:?}"
    );
    assert!(
        m.step(t0, complete(0, 0)).is_empty(),
        "the stale round is ignored"
    );
    assert!(matches!(
        m.step(t0, complete(2, 0))[..],
        [Action::Start { .. }]
    ));
}

#[test]
fn the_exit_barrier_ends_when_the_job_succeeds() {
    let (mut m, t0) = running();
    assert!(m.step(t0, Event::Exited(exit(0, 0))).is_empty());
    let actions = m.step(t0 + SECOND, Event::Exited(exit(1, 0)));
    assert!(
        matches!(actions[..], [Action::ReportSuccess { round: 0 }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), Some(t0 + SECOND + Duration::from_secs(300)));
    let actions = m.step(t0 + 2 * SECOND, succeeded());
    assert!(
        is_stop(&actions[0], Signal::SIGTERM),
        "the groups are swept: {actions:?}"
    );
    let actions = m.step(t0 + 2 * SECOND, Event::Stopped(Vec::new()));
    assert_eq!(outcome(&actions), &Outcome::Succeeded);
    assert_eq!(actions.len(), 1, "no leave after success: {actions:?}");
}

#[test]
fn the_exit_barrier_times_out_into_success_after_leaving() {
    let (mut m, t0) = running();
    m.step(t0, Event::Exited(exit(0, 0)));
    m.step(t0, Event::Exited(exit(1, 0)));
    let end = t0 + Duration::from_secs(300);
    let actions = m.step(end, Event::Timer);
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    let actions = m.step(end, Event::Stopped(Vec::new()));
    match &actions[..] {
        [Action::Leave { reason }, Action::Exit(Ok(Outcome::Succeeded))] => {
            assert!(reason.contains("exit barrier timed out"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_signal_while_waiting_leaves_the_job() {
    let (mut m, t0) = joined();
    let actions = m.step(t0, Event::Signal(Signal::SIGTERM));
    match &actions[..] {
        [Action::Leave { reason }, Action::Exit(Ok(Outcome::Signaled(Signal::SIGTERM)))] => {
            assert!(reason.contains("SIGTERM"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_signal_while_reconnecting_ends_the_wait() {
    let (mut m, t0) = joined();
    m.step(t0, Event::Lost("eof".into()));
    let actions = m.step(t0, Event::Signal(Signal::SIGINT));
    assert_eq!(outcome(&actions), &Outcome::Signaled(Signal::SIGINT));
}

#[test]
fn a_signal_while_running_is_forwarded_then_the_node_leaves() {
    let (mut m, t0) = running();
    let actions = m.step(t0, Event::Signal(Signal::SIGINT));
    assert!(
        is_stop(&actions[0], Signal::SIGINT),
        "the signal itself goes to the workers: {actions:?}"
    );
    let actions = m.step(t0, Event::Stopped(Vec::new()));
    assert!(
        matches!(
            &actions[..],
            [
                Action::Leave { .. },
                Action::Exit(Ok(Outcome::Signaled(Signal::SIGINT)))
            ]
        ),
        "{actions:?}"
    );
}

#[test]
fn a_second_signal_kills_the_workers_at_once() {
    let (mut m, t0) = running();
    m.step(t0, Event::Signal(Signal::SIGTERM));
    let actions = m.step(t0 + SECOND, Event::Signal(Signal::SIGTERM));
    assert!(matches!(actions[..], [Action::Kill]), "{actions:?}");
    let actions = m.step(t0 + SECOND, Event::Stopped(Vec::new()));
    assert_eq!(
        outcome(&actions),
        &Outcome::Signaled(Signal::SIGTERM),
        "the first signal decides the exit code"
    );
}

#[test]
fn a_signal_during_a_restart_ends_the_node_once_the_workers_stopped() {
    let (mut m, t0) = running();
    m.step(t0, restart(0, 1));
    assert!(
        m.step(t0, Event::Signal(Signal::SIGTERM)).is_empty(),
        "the stop goes on"
    );
    let actions = m.step(t0, Event::Stopped(Vec::new()));
    assert_eq!(
        outcome(&actions),
        &Outcome::Signaled(Signal::SIGTERM),
        "no offer for round 1"
    );
    // A further signal now would have killed them.
    let (mut m, t0) = running();
    m.step(t0, restart(0, 1));
    m.step(t0, Event::Signal(Signal::SIGTERM));
    assert!(matches!(
        m.step(t0, Event::Signal(Signal::SIGTERM))[..],
        [Action::Kill]
    ));
}

#[test]
fn a_signal_while_rejoining_with_workers_stops_them() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("eof".into()));
    let actions = m.step(t0, Event::Signal(Signal::SIGHUP));
    assert!(is_stop(&actions[0], Signal::SIGHUP), "{actions:?}");
    assert!(!m.sources().rejoin, "the rejoin is abandoned");
    let actions = m.step(t0, Event::Stopped(Vec::new()));
    assert_eq!(outcome(&actions), &Outcome::Signaled(Signal::SIGHUP));
}

#[test]
fn a_closed_job_ends_the_agent_with_the_reason() {
    let (mut m, t0) = running();
    let closed = Event::Message(Kind::JobClosed(pb::JobClosed {
        reason: "the agent hosting the rendezvous stopped".into(),
        may_rejoin: false,
    }));
    let actions = m.step(t0, closed);
    assert!(is_stop(&actions[0], Signal::SIGTERM));
    let e = error(m.step(t0, Event::Stopped(Vec::new())));
    assert!(
        matches!(&e, AgentError::JobClosed { reason } if reason == "the agent hosting the rendezvous stopped"),
        "{e:?}"
    );
    assert_eq!(e.exit_code(), 1);
    assert!(
        e.to_string().contains("closed the job: the agent hosting"),
        "{e}"
    );
}

#[test]
fn events_for_other_phases_change_nothing() {
    let (mut m, t0) = running();
    m.step(t0, Event::Signal(Signal::SIGTERM));
    // While stopping, a stray message or timer is not acted on.
    assert!(m.step(t0, succeeded()).is_empty());
    assert!(m.step(t0, Event::Timer).is_empty());
    assert!(m.sources().stop);
    let (mut m, t0) = joined();
    assert!(m.step(t0, Event::Exited(exit(0, 0))).is_empty());
    assert!(m
        .step(
            t0,
            Event::Rejoined {
                round: 9,
                resumed: true
            }
        )
        .is_empty());
    assert!(m.sources().stream);
}

#[test]
fn a_second_signal_kills_during_any_stop() {
    // The job succeeded and the groups are being swept: the first signal is
    // noted, the second kills; the outcome stays the job's.
    let (mut m, t0) = running();
    m.step(t0, succeeded());
    assert!(m.step(t0, Event::Signal(Signal::SIGTERM)).is_empty());
    assert!(matches!(
        m.step(t0, Event::Signal(Signal::SIGTERM))[..],
        [Action::Kill]
    ));
    assert_eq!(
        outcome(&m.step(t0, Event::Stopped(Vec::new()))),
        &Outcome::Succeeded
    );
}

#[test]
fn a_signal_while_stopping_after_a_failure_unreachable_ends_the_node() {
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("eof".into()));
    m.step(t0, Event::Exited(exit(1, 1)));
    assert!(m.step(t0, Event::Signal(Signal::SIGINT)).is_empty());
    let actions = m.step(t0, Event::Stopped(Vec::new()));
    assert!(
        matches!(
            &actions[..],
            [
                Action::Leave { .. },
                Action::Exit(Ok(Outcome::Signaled(Signal::SIGINT)))
            ]
        ),
        "no rejoin after the signal: {actions:?}"
    );
}

#[test]
fn a_job_that_ends_while_forming_ends_the_node() {
    let (mut m, t0) = joined();
    let actions = m.step(t0, succeeded());
    assert!(
        matches!(actions[..], [Action::Exit(Ok(Outcome::Succeeded))]),
        "{actions:?}"
    );

    let (mut m, t0) = joined();
    let closed = Event::Message(Kind::JobClosed(pb::JobClosed {
        reason: "the agent hosting the rendezvous stopped".into(),
        may_rejoin: false,
    }));
    let e = error(m.step(t0, closed));
    assert!(matches!(e, AgentError::JobClosed { .. }), "{e:?}");
    assert!(e.to_string().contains("closed the job"), "{e}");

    let (mut m, t0) = joined();
    let restarting = Event::Message(Kind::JobClosed(pb::JobClosed {
        reason: "the rendezvous server is shutting down".into(),
        may_rejoin: true,
    }));
    assert!(matches!(
        m.step(t0, restarting)[..],
        [Action::Rejoin { resume: None }]
    ));
}

#[test]
fn a_rejoin_that_gives_up_with_no_workers_ends_the_agent() {
    let (mut m, t0) = joined();
    m.step(t0, Event::Lost("lost the rendezvous: eof".into()));
    let e = error(m.step(
        t0,
        Event::RejoinFailed(AgentError::JoinTimeout("no answer".into())),
    ));
    // The rejoin's own failure stays reachable as the source, not only as
    // text, and the exit code is the runtime failure's.
    let AgentError::GaveUp { why, source, grace } = &e else {
        panic!("expected GaveUp, got {e:?}");
    };
    assert_eq!(why, "lost the rendezvous: eof");
    // A node without workers waits out a control-plane outage.
    assert_eq!(*grace, Duration::from_secs(900));
    assert!(matches!(**source, AgentError::JoinTimeout(_)), "{source:?}");
    assert!(std::error::Error::source(&e).is_some());
    assert_eq!(e.exit_code(), 1);
    assert!(e.to_string().contains("(lost the rendezvous: eof)"), "{e}");
    assert!(
        e.to_string().contains("; rendezvous timed out: no answer)"),
        "{e}"
    );
}

#[test]
fn a_reconnect_keeps_the_last_progress_for_the_timeout_message() {
    let (mut m, t0) = joined();
    let waiting = Event::Message(Kind::Waiting(pb::Waiting {
        round: 0,
        ready: 1,
        min_nodes: 3,
        max_nodes: 3,
        members: 2,
        ..Default::default()
    }));
    m.step(t0, waiting);
    m.step(t0, Event::Lost("eof".into()));
    m.step(
        t0,
        Event::Rejoined {
            round: 0,
            resumed: false,
        },
    );
    let text = error(m.step(t0 + Duration::from_secs(600), Event::Timer)).to_string();
    assert!(
        text.contains("1 of 3 nodes ready, waiting for 1 more to join, 1 joined and getting ready"),
        "{text}"
    );
}

#[test]
fn an_early_timer_changes_nothing_at_the_barrier() {
    let (mut m, t0) = running();
    m.step(t0, Event::Exited(exit(0, 0)));
    m.step(t0, Event::Exited(exit(1, 0)));
    assert!(m
        .step(t0 + Duration::from_secs(299), Event::Timer)
        .is_empty());
    assert!(m.sources().stream, "still at the barrier");
}

#[test]
fn a_node_that_could_not_start_still_follows_the_job() {
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::StartFailed {
            local_rank: 0,
            global_rank: 2,
            message: "no such file".into(),
        },
    );
    // The job restarts it like any other node.
    let actions = m.step(t0, restart(0, 1));
    assert!(is_reform_stop(&actions[0]));
    assert!(matches!(
        m.step(t0, Event::Stopped(Vec::new()))[..],
        [Action::Offer { round: 1 }]
    ));
}

#[test]
fn unchanged_progress_is_printed_at_most_every_ten_seconds() {
    let (mut m, t0) = joined();
    let waiting = |ready: u32, last_call_ms: Option<u64>| {
        Event::Message(Kind::Waiting(pb::Waiting {
            round: 0,
            ready,
            needed: 2,
            min_nodes: 2,
            max_nodes: 2,
            members: ready,
            last_call_ms,
            ..Default::default()
        }))
    };
    m.step(t0, waiting(1, None));
    let first = m.last_progress().cloned().expect("printed");
    // The rendezvous repeats itself every second: not news.
    for s in 1..10 {
        m.step(t0 + s * SECOND, waiting(1, None));
        assert_eq!(m.last_progress(), Some(&first), "reprinted at {s} s");
    }
    m.step(t0 + 10 * SECOND, waiting(1, None));
    assert_eq!(m.last_progress().map(|p| p.1), Some(t0 + 10 * SECOND));
    // A countdown alone is not news either; a new count is, at once.
    m.step(t0 + 11 * SECOND, waiting(1, Some(5000)));
    assert_eq!(m.last_progress().map(|p| p.1), Some(t0 + 10 * SECOND));
    m.step(t0 + 12 * SECOND, waiting(2, None));
    assert_eq!(m.last_progress().map(|p| p.1), Some(t0 + 12 * SECOND));
}

/// A one-node run's first report ("0 of 1 nodes ready") and any other
/// where every node has joined and is getting ready are not news: said
/// only if that lasts.
#[test]
fn every_node_joined_and_getting_ready_is_said_only_if_it_lasts() {
    let (mut m, t0) = joined();
    let waiting = |ready: u32, members: u32| {
        Event::Message(Kind::Waiting(pb::Waiting {
            round: 0,
            ready,
            min_nodes: 1,
            max_nodes: 2,
            members,
            hosts: vec!["a".into(), "b".into()],
            ..Default::default()
        }))
    };
    m.step(t0, waiting(0, 1));
    m.step(t0 + 9 * SECOND, waiting(0, 1));
    assert_eq!(m.last_progress(), None, "not said at once");
    m.step(t0 + 10 * SECOND, waiting(0, 1));
    let (line, _) = m.last_progress().cloned().expect("said once it lasts");
    assert!(
        line.contains("0 of 1..2 nodes ready, 1 joined and getting ready"),
        "{line}"
    );
    // Nodes that have not joined are news at once.
    let (mut m, t0) = joined();
    m.step(
        t0,
        Event::Message(Kind::Waiting(pb::Waiting {
            round: 0,
            ready: 1,
            min_nodes: 3,
            max_nodes: 3,
            members: 2,
            hosts: vec!["a".into(), "b".into()],
            ..Default::default()
        })),
    );
    let (line, _) = m.last_progress().cloned().expect("said");
    assert_eq!(
        line,
        "0 1 of 3 nodes ready, waiting for 1 more to join, 1 joined and getting ready (joined: a, b)",
        "round, then the line"
    );
}

#[test]
fn readiness_says_what_the_node_waits_for() {
    let (m, _) = joined();
    let why = m.readiness().expect_err("not running yet");
    assert!(why.starts_with("forming round 0"), "{why}");
    let (mut m, t0) = running();
    assert_eq!(m.readiness(), Ok(()));
    // A failed worker: the node no longer does its work, whatever follows.
    m.step(
        t0 + 2 * SECOND,
        Event::Exited(Exit {
            local_rank: 0,
            global_rank: 2,
            pid: 10,
            ended: Ended::Exited(1),
        }),
    );
    let why = m.readiness().expect_err("a worker failed");
    assert!(
        why.contains("a worker of this node failed") || why.contains("stopping the workers"),
        "{why}"
    );
}

/// Ends running `round` (started at `started`) with a restart requested
/// `after` its start (`counted`: for a failure); returns the actions once
/// the stop completed and the time.
fn restarted_after(
    m: &mut NodeMachine,
    round: u64,
    started: Instant,
    after: Duration,
    counted: bool,
) -> (Vec<Action>, Instant) {
    let t = started + after;
    let event = Event::Message(Kind::RestartRequested(pb::RestartRequested {
        round,
        next_round: round + 1,
        reason: "a worker failed".into(),
        counted,
    }));
    let actions = m.step(t, event);
    assert!(is_reform_stop(&actions[0]), "{actions:?}");
    (m.step(t, Event::Stopped(Vec::new())), t)
}

/// Runs `round` from `t`: it formed and its workers started.
fn start_round(m: &mut NodeMachine, t: Instant, round: u64) {
    let actions = m.step(t, complete(round, round as u32));
    assert!(
        matches!(&actions[..], [Action::Start { .. }]),
        "{actions:?}"
    );
}

#[test]
fn a_crash_loop_backs_off_exponentially_after_the_first_quick_failure() {
    let (mut m, t0) = running();
    let mut started = t0 + SECOND;
    let mut waits = Vec::new();
    for round in 0..5 {
        let (actions, t) = restarted_after(&mut m, round, started, SECOND, true);
        let next = round + 1;
        if let [Action::Offer { round: r }] = actions[..] {
            assert_eq!(r, next);
            waits.push(Duration::ZERO);
            started = t;
        } else {
            assert!(actions.is_empty(), "{actions:?}");
            let until = m.deadline().expect("a wait");
            assert!(m.readiness().expect_err("waiting").contains("crash loop"));
            assert!(m.sources().stream && !m.sources().workers);
            // Nothing before the wait ends; the round's progress is not ours.
            assert!(m
                .step(until - Duration::from_millis(1), Event::Timer)
                .is_empty());
            let actions = m.step(until, Event::Timer);
            assert!(
                matches!(actions[..], [Action::Offer { round: r }] if r == next),
                "{actions:?}"
            );
            assert_eq!(m.deadline(), Some(until + Duration::from_secs(600)));
            waits.push(until - t);
            started = until;
        }
        start_round(&mut m, started, next);
    }
    assert_eq!(
        waits,
        [0, 1, 2, 4, 8].map(Duration::from_secs),
        "none for the first quick failure, then base doubling"
    );
}

#[test]
fn a_round_that_outlived_the_window_ends_the_loop_and_membership_is_no_crash() {
    let (mut m, t0) = running();
    let started = t0 + SECOND;
    let (a, _) = restarted_after(&mut m, 0, started, SECOND, true);
    assert!(matches!(a[..], [Action::Offer { round: 1 }]));
    start_round(&mut m, started + SECOND, 1);
    // A node left: not a failure, no wait, the streak is kept as it was.
    let (a, t) = restarted_after(&mut m, 1, started + SECOND, SECOND, false);
    assert!(matches!(a[..], [Action::Offer { round: 2 }]), "{a:?}");
    start_round(&mut m, t, 2);
    // Second quick failure: a wait.
    let (a, t) = restarted_after(&mut m, 2, t, SECOND, true);
    assert!(a.is_empty(), "{a:?}");
    let until = m.deadline().expect("wait");
    assert_eq!(until - t, SECOND);
    m.step(until, Event::Timer);
    start_round(&mut m, until, 3);
    // This round trained for two minutes: its failure is not part of a loop.
    let (a, _) = restarted_after(&mut m, 3, until, Duration::from_secs(120), true);
    assert!(matches!(a[..], [Action::Offer { round: 4 }]), "{a:?}");
}

#[test]
fn a_long_round_ended_by_a_membership_change_also_ends_the_loop() {
    let (mut m, t0) = running();
    let (a, t) = restarted_after(&mut m, 0, t0 + SECOND, SECOND, true);
    assert!(matches!(a[..], [Action::Offer { round: 1 }]));
    start_round(&mut m, t, 1);
    // Second quick failure: a wait, the streak is 2.
    let (a, _) = restarted_after(&mut m, 1, t, SECOND, true);
    assert!(a.is_empty(), "{a:?}");
    let until = m.deadline().expect("wait");
    m.step(until, Event::Timer);
    start_round(&mut m, until, 2);
    // Hours of training, then a node is preempted: not a failure, and the
    // round outlived the window, so the loop is over.
    let (a, t) = restarted_after(&mut m, 2, until, Duration::from_secs(3600), false);
    assert!(matches!(a[..], [Action::Offer { round: 3 }]), "{a:?}");
    start_round(&mut m, t, 3);
    // A quick failure now is the first of a new streak: at once.
    let (a, _) = restarted_after(&mut m, 3, t, SECOND, true);
    assert!(matches!(a[..], [Action::Offer { round: 4 }]), "{a:?}");
}

#[test]
fn while_backing_off_a_signal_leaves_and_the_job_end_is_heard() {
    let backing_off = || {
        let (mut m, t0) = running();
        let (a, t) = restarted_after(&mut m, 0, t0 + SECOND, SECOND, true);
        assert!(matches!(a[..], [Action::Offer { .. }]));
        start_round(&mut m, t, 1);
        let (a, t) = restarted_after(&mut m, 1, t, SECOND, true);
        assert!(a.is_empty(), "{a:?}");
        (m, t)
    };
    let (mut m, t) = backing_off();
    let actions = m.step(t, Event::Signal(Signal::SIGTERM));
    assert!(matches!(actions[0], Action::Leave { .. }), "{actions:?}");
    assert_eq!(outcome(&actions), &Outcome::Signaled(Signal::SIGTERM));
    let (mut m, t) = backing_off();
    let actions = m.step(t, job_failed());
    assert!(
        matches!(actions[0], Action::Summarize { .. }),
        "{actions:?}"
    );
    assert!(matches!(outcome(&actions), Outcome::Failed(_)));
    // A later restart while waiting moves the target round, not the wait.
    let (mut m, t) = backing_off();
    let until = m.deadline().expect("wait");
    assert!(m.step(t, restart(2, 3)).is_empty());
    assert_eq!(m.deadline(), Some(until));
    assert!(matches!(
        m.step(until, Event::Timer)[..],
        [Action::Offer { round: 3 }]
    ));
}

#[test]
fn a_zero_base_never_waits() {
    let t0 = Instant::now();
    let mut s = settings();
    s.restart_backoff.base = Duration::ZERO;
    let (mut m, _) = NodeMachine::new(s, t0, 0);
    let mut t = t0;
    for round in 0..4 {
        start_round(&mut m, t, round);
        let (a, at) = restarted_after(&mut m, round, t, SECOND, true);
        assert!(matches!(a[..], [Action::Offer { .. }]), "{a:?}");
        t = at;
    }
}

fn over(succeeded: bool) -> Event {
    Event::Over(pb::JobOver {
        succeeded,
        exit_code: i32::from(!succeeded),
        reason: if succeeded {
            String::new()
        } else {
            "budget spent".into()
        },
        round: 3,
        finished_unix_ms: 1_796_473_296_000,
    })
}

#[test]
fn a_node_back_after_its_job_ended_ends_with_the_jobs_result() {
    // Workers still running (cut off at the end): they stop, then it exits 0.
    let (mut m, t0) = running();
    assert!(matches!(
        m.step(t0, Event::Lost("eof".into()))[..],
        [Action::Rejoin { resume: Some(_) }]
    ));
    let actions = m.step(t0 + SECOND, over(true));
    assert!(
        matches!(&actions[..], [a] if is_stop(a, Signal::SIGTERM)),
        "{actions:?}"
    );
    let actions = m.step(t0 + 2 * SECOND, Event::Stopped(Vec::new()));
    assert_eq!(outcome(&actions), &Outcome::Succeeded);
    assert_eq!(outcome(&actions).exit_code(), 0);

    // No workers (a spare, or reconnecting while forming): it exits at once.
    let (mut m, t0) = joined();
    m.step(t0, Event::Lost("eof".into()));
    let actions = m.step(t0 + SECOND, over(false));
    assert!(
        matches!(outcome(&actions), Outcome::Failed(r) if r == "budget spent"),
        "{actions:?}"
    );
    assert_eq!(outcome(&actions).exit_code(), 1);

    // Told while its workers were being stopped: the stop ends the node.
    let (mut m, t0) = running();
    m.step(t0, restart(0, 1));
    assert!(m.step(t0, over(true)).is_empty());
    let actions = m.step(t0 + SECOND, Event::Stopped(Vec::new()));
    assert_eq!(outcome(&actions), &Outcome::Succeeded);

    let line = over_line(
        "j",
        &pb::JobOver {
            succeeded: true,
            finished_unix_ms: 1_796_473_296_000,
            ..Default::default()
        },
    );
    assert_eq!(
        line,
        "job 'j' already succeeded at 2026-12-05 12:21:36 UTC; nothing to do (the same command run again starts a new run)"
    );
    let line = new_run_line(
        "j",
        &pb::JobOver {
            succeeded: false,
            exit_code: 1,
            finished_unix_ms: 1_796_473_296_000,
            ..Default::default()
        },
    );
    assert_eq!(
        line,
        "job 'j' failed at 2026-12-05 12:21:36 UTC; starting a new run"
    );
}

/// F6 of the chaos run: a server going away right after this node's
/// rejoin may close the job as the first event of the new stream; that is
/// a rendezvous lost again, never a refusal.
#[test]
fn a_job_closed_for_a_rejoin_right_after_a_rejoin_is_rejoined_again() {
    let closing = || {
        Event::Message(Kind::JobClosed(pb::JobClosed {
            reason: "this rdzv-server is no longer the leader".into(),
            may_rejoin: true,
        }))
    };
    // Forming: rejoined, then closed at once.
    let (mut m, t0) = joined();
    m.step(t0, Event::Lost("eof".into()));
    let actions = m.step(
        t0,
        Event::Rejoined {
            round: 0,
            resumed: false,
        },
    );
    assert!(
        matches!(actions[..], [Action::Offer { round: 0 }]),
        "{actions:?}"
    );
    let actions = m.step(t0, closing());
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: None }]),
        "{actions:?}"
    );
    // Running: resumed, then closed at once; the workers are kept.
    let (mut m, t0) = running();
    m.step(t0, Event::Lost("eof".into()));
    let actions = m.step(
        t0,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(actions.is_empty(), "{actions:?}");
    let actions = m.step(t0, closing());
    assert!(
        matches!(actions[..], [Action::Rejoin { resume: Some(_) }]),
        "{actions:?}"
    );
    assert!(m.sources().workers);
}

#[test]
fn a_quarantined_node_waits_out_its_quarantine_then_join_timeout() {
    let (mut m, t0) = joined();
    let hour = 3600 * SECOND;
    m.step(
        t0,
        Event::Message(Kind::Waiting(pb::Waiting {
            round: 0,
            spare: true,
            max_nodes: 2,
            members: 3,
            quarantine: "3 worker failures within 1h".into(),
            quarantine_left_ms: 3_600_000,
            ..Default::default()
        })),
    );
    // join_timeout (600 s) alone would have ended it long before.
    assert!(m.step(t0 + hour, Event::Timer).is_empty());
    let line = m.last_progress().expect("printed").0.clone();
    assert!(
        line.contains("this host is quarantined by the rendezvous"),
        "{line}"
    );
    let text = error(m.step(t0 + hour + 601 * SECOND, Event::Timer)).to_string();
    assert!(text.contains("did not form within"), "{text}");
}

#[test]
fn the_peers_word_keeps_the_workers_through_an_outage_and_the_rejoin_goes_on() {
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::Lost("lost the rendezvous: connection refused".into()),
    );
    assert_eq!(m.deadline(), Some(t0 + FENCE));
    // Most of the round hears each other: the workers may run on.
    assert!(m
        .step(t0 + SECOND, Event::Vouched(t0 + 20 * SECOND))
        .is_empty());
    assert_eq!(m.deadline(), Some(t0 + 20 * SECOND), "the fence moved");
    // An older word never moves it back.
    assert!(m
        .step(t0 + 2 * SECOND, Event::Vouched(t0 + 10 * SECOND))
        .is_empty());
    assert_eq!(m.deadline(), Some(t0 + 20 * SECOND));
    assert!(
        m.step(t0 + 15 * SECOND, Event::Timer).is_empty(),
        "not fenced at the drop limit"
    );
    // The rejoin's grace ends meanwhile: it starts again, presenting the round.
    let actions = m.step(
        t0 + 16 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("the grace ended".into())),
    );
    assert!(
        matches!(&actions[..], [Action::Rejoin { resume: Some(r) }] if r.round == 0),
        "{actions:?}"
    );
    // Back: the round is still current, nothing was stopped or reported.
    let actions = m.step(
        t0 + 17 * SECOND,
        Event::Rejoined {
            round: 0,
            resumed: true,
        },
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert!(m.readiness().is_ok());
}

#[test]
fn when_the_peers_word_runs_out_the_workers_are_fenced() {
    let (mut m, t0) = running();
    m.step(
        t0,
        Event::Lost("lost the rendezvous: connection refused".into()),
    );
    m.step(t0 + SECOND, Event::Vouched(t0 + 20 * SECOND));
    let actions = m.step(t0 + 20 * SECOND, Event::Timer);
    assert!(is_kill(&actions[0]), "{actions:?}");
    // Fenced, it rejoins on (nothing of it runs) until outage_timeout
    // from the loss, as without peers.
    m.step(t0 + 21 * SECOND, Event::Stopped(Vec::new()));
    let actions = m.step(
        t0 + 22 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("the grace ended".into())),
    );
    assert!(
        matches!(actions[..], [Action::Rejoin { .. }]),
        "{actions:?}"
    );
    let actions = m.step(
        t0 + 900 * SECOND,
        Event::RejoinFailed(AgentError::JoinTimeout("the grace ended".into())),
    );
    assert!(is_stop(&actions[0], Signal::SIGTERM), "{actions:?}");
    let actions = m.step(t0 + 900 * SECOND, Event::Stopped(Vec::new()));
    assert!(
        actions.iter().any(|a| matches!(a, Action::Exit(Err(_)))),
        "{actions:?}"
    );
}

#[test]
fn the_peers_word_means_nothing_to_a_node_that_is_not_recovering() {
    let (mut m, t0) = running();
    assert!(m.step(t0, Event::Vouched(t0 + 100 * SECOND)).is_empty());
    assert_eq!(m.deadline(), None);
    // A node whose presence lease lapsed is dropped whatever its peers say.
    m.step(t0, Event::Dead("presence".into()));
    assert_eq!(m.deadline(), Some(t0));
    m.step(t0, Event::Vouched(t0 + 100 * SECOND));
    assert_eq!(m.deadline(), Some(t0), "fenced at once all the same");
}

/// The machine decides without the server: only the modules that embed
/// the server (run it, follow its presence keys) name the server crate,
/// so neither the machine nor anything it uses reaches it. What is shared
/// with the server comes from `accel-wire` and `accel-proto`.
#[test]
fn only_the_embedding_modules_reach_the_server_crate() {
    const EMBEDDING: [&str; 4] = ["rendezvous.rs", "agent.rs", "agent/link.rs", "node.rs"];
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src.clone()];
    let mut files = 0;
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("agent sources").flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).expect("source");
            files += 1;
            let uses = text.contains(concat!("rendezvous", "_server::"));
            assert!(
                !uses || EMBEDDING.contains(&rel.as_str()),
                "{rel} uses the server crate; take what it needs from accel-wire"
            );
        }
    }
    assert!(files > 50, "read the agent's sources ({files} files)");
    // node.rs names it only in the log filter (a tracing target).
    let node = include_str!("../../node.rs");
    assert_eq!(node.matches(concat!("rendezvous", "_server::")).count(), 1);
}

#[test]
fn a_node_that_fails_a_periodic_check_mid_round_says_so_stops_its_workers_then_leaves() {
    let (mut m, t0) = running();
    let t = t0 + 5 * SECOND;
    let actions = m.step(t, Event::Unhealthy("nic eth0: operstate down".into()));
    match &actions[..] {
        [Action::ReportFenced { round: 0, reason }, stop] => {
            assert!(
                reason.contains("failed its health check (nic eth0: operstate down)")
                    && reason.contains("no restart is counted"),
                "{reason}"
            );
            // Gone within the drop limit (less the margin): the re-formed
            // round forms without this node no sooner.
            assert!(
                matches!(stop, Action::Stop { signal: Signal::SIGTERM, grace } if *grace == FENCE),
                "{actions:?}"
            );
        }
        other => panic!("expected a report and a stop, got {other:?}"),
    }
    // Its workers end as stopped; the restart this caused is not news.
    assert!(m.step(t, restart(0, 1)).is_empty());
    let actions = m.step(t + SECOND, Event::Stopped(vec![exit(0, -15), exit(1, -15)]));
    match &actions[..] {
        [Action::Depart { why }] => assert_eq!(why, "nic eth0: operstate down"),
        other => panic!("expected the node to leave, got {other:?}"),
    }
    assert!(m.is_done());
}

#[test]
fn a_forming_node_or_spare_that_fails_a_periodic_check_leaves_at_once_and_others_ignore_it() {
    let (mut m, t0) = joined();
    let actions = m.step(
        t0 + SECOND,
        Event::Unhealthy("gpu 3: 2 uncorrectable ECC errors".into()),
    );
    assert!(
        matches!(&actions[..], [Action::Depart { .. }]),
        "{actions:?}"
    );
    assert!(m.is_done());
    // Workers that succeeded: the node's part is done, the check is moot.
    let (mut m, t0) = running();
    let t = t0 + 2 * SECOND;
    m.step(t, Event::Exited(exit(0, 0)));
    let actions = m.step(t, Event::Exited(exit(1, 0)));
    assert!(
        matches!(&actions[..], [Action::ReportSuccess { round: 0 }]),
        "{actions:?}"
    );
    assert!(m
        .step(t, Event::Unhealthy("storage /ckpt: full".into()))
        .is_empty());
    assert_eq!(m.phase_name(), "running");
    // A signal during the stop wins: the node ends as signaled.
    let (mut m, t0) = running();
    let t = t0 + 2 * SECOND;
    m.step(
        t,
        Event::Unhealthy("endpoint unix:/run/h.sock: XID 79".into()),
    );
    assert!(m.step(t, Event::Signal(Signal::SIGTERM)).is_empty());
    let actions = m.step(t + SECOND, Event::Stopped(Vec::new()));
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Exit(Ok(Outcome::Signaled(Signal::SIGTERM))))),
        "{actions:?}"
    );
}

#[test]
fn a_spare_of_a_running_round_waits_longer_than_the_join_timeout() {
    // accel-sim seed 571657: a round ran past join_timeout and its spare
    // exited 1 while the job went on (and then succeeded). The rendezvous
    // says once that the node is a spare; the round then runs for hours.
    let (mut m, t0) = joined();
    let waiting = |spare: bool| {
        Event::Message(Kind::Waiting(pb::Waiting {
            round: 0,
            ready: 1,
            needed: 2,
            spare,
            max_nodes: 2,
            ..Default::default()
        }))
    };
    assert!(m.step(t0, waiting(true)).is_empty());
    let mut at = t0;
    for _ in 0..30 {
        at = m.deadline().expect("a timer");
        assert!(
            m.step(at, Event::Timer).is_empty(),
            "still a spare after {:?}",
            at - t0
        );
    }
    assert!(at - t0 > Duration::from_secs(3 * 3600), "{:?}", at - t0);
    // The round it waited beside re-forms: join_timeout counts from then.
    let restart = Event::Message(Kind::RestartRequested(pb::RestartRequested {
        round: 0,
        next_round: 1,
        ..Default::default()
    }));
    let actions = m.step(at, restart);
    assert!(
        matches!(actions.as_slice(), [Action::Offer { round: 1 }]),
        "{actions:?}"
    );
    assert_eq!(m.deadline(), Some(at + Duration::from_secs(600)));
    let actions = m.step(at + Duration::from_secs(600), Event::Timer);
    assert!(
        matches!(actions.last(), Some(Action::Exit(Err(_)))),
        "{actions:?}"
    );
}

#[test]
fn a_node_no_longer_a_spare_times_out_join_timeout_after_the_report_that_said_so() {
    let (mut m, t0) = joined();
    let waiting = |at_round: u64, spare: bool| {
        Event::Message(Kind::Waiting(pb::Waiting {
            round: at_round,
            ready: 1,
            needed: 2,
            spare,
            max_nodes: 2,
            ..Default::default()
        }))
    };
    assert!(m.step(t0, waiting(0, true)).is_empty());
    let later = t0 + Duration::from_secs(1800);
    assert!(m.step(later, waiting(0, false)).is_empty());
    assert!(m
        .step(later + Duration::from_secs(599), Event::Timer)
        .is_empty());
    let actions = m.step(later + Duration::from_secs(600), Event::Timer);
    assert!(
        matches!(actions.last(), Some(Action::Exit(Err(_)))),
        "{actions:?}"
    );
}
