//! The events' text, checked against what torch 2.13's own `Event.serialize`
//! printed for the same values (run once in the pinned venv; the expected
//! strings below are its output).

use super::json::python_float;
use super::*;
use crate::agent::round::RoundInfo;

fn id() -> Identity {
    Identity {
        run_id: "job-1".into(),
        role: "trainer".into(),
        hostname: "node-é".into(),
        rdzv_backend: "c10d".into(),
        entry_point: "job.sh".into(),
    }
}

fn round(node_rank: u32, nnodes: u32, world_size: u32, restart_count: u32) -> RoundInfo {
    RoundInfo {
        round: 1,
        node_rank,
        nnodes,
        world_size,
        base_rank: node_rank * 2,
        restart_count,
        max_restarts: 3,
        master_addr: "h".into(),
        master_port: 1,
        segment: Default::default(),
        peer_key: Vec::new(),
    }
}

#[test]
fn handler_names_are_torchruns() {
    assert_eq!(
        "null".parse::<EventHandler>().ok(),
        Some(EventHandler::Null)
    );
    assert_eq!(
        "console".parse::<EventHandler>().ok(),
        Some(EventHandler::Console)
    );
    assert_eq!(
        "dynamic_rendezvous".parse::<EventHandler>().ok(),
        Some(EventHandler::DynamicRendezvous)
    );
    let e = "Console".parse::<EventHandler>().expect_err("case matters");
    assert!(
        e.0.contains("'Console'") && e.0.contains("console, dynamic_rendezvous, null"),
        "{}",
        e.0
    );
}

#[test]
fn loglevel_gates_events_as_pythons_logger() {
    assert!(info_enabled(None));
    assert!(info_enabled(Some("")));
    assert!(info_enabled(Some("INFO")));
    assert!(info_enabled(Some("DEBUG")));
    assert!(info_enabled(Some("20")));
    assert!(!info_enabled(Some("WARNING")));
    assert!(!info_enabled(Some("ERROR")));
    assert!(!info_enabled(Some("30")));
}

#[test]
fn only_console_prints() {
    for h in [EventHandler::Null, EventHandler::DynamicRendezvous] {
        let mut log = EventLog::new(h, None, id());
        assert!(log
            .formed(Duration::ZERO, Duration::ZERO, &round(0, 1, 2, 0))
            .is_empty());
        assert!(log.ended(&Ending::Succeeded, Duration::ZERO).is_empty());
    }
    let mut quiet = EventLog::new(EventHandler::Console, Some("WARNING"), id());
    assert!(quiet
        .formed(Duration::ZERO, Duration::ZERO, &round(0, 1, 2, 0))
        .is_empty());
}

#[test]
fn agent_event_text_is_torchs() {
    let mut log = EventLog::new(EventHandler::Console, None, id());
    let lines = log.formed(
        Duration::from_micros(12_500),
        Duration::from_micros(1_250),
        &round(1, 2, 4, 0),
    );
    assert_eq!(
        lines[0],
        r#"{"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT", "timestamp": 0, "metadata": {"run_id": "job-1", "global_rank": null, "group_rank": null, "worker_id": null, "role": "trainer", "hostname": "node-\u00e9", "state": "RENDEZVOUS", "total_run_time": 0, "rdzv_backend": "c10d", "raw_error": null, "metadata": "{\"group_world_size\": null, \"entry_point\": \"job.sh\"}", "agent_restarts": 0, "duration_ms": 12.5}}"#
    );
    assert!(lines[1].contains(r#""state": "ASSIGN_WORKER_RANKS""#));
    assert!(lines[1].contains(r#""duration_ms": 1.25}"#));
    // The next round's RENDEZVOUS describes the node as the last round left it.
    let next = log.formed(Duration::ZERO, Duration::ZERO, &round(1, 2, 4, 1));
    assert!(
        next[0].contains(r#""group_rank": 1,"#)
            && next[0].contains(r#"\"group_world_size\": 2,"#)
            && next[0].contains(r#""agent_restarts": 1,"#),
        "{}",
        next[0]
    );
}

#[test]
fn failed_worker_event_text_is_torchs() {
    let mut log = EventLog::new(EventHandler::Console, None, id());
    log.formed(Duration::ZERO, Duration::ZERO, &round(1, 2, 4, 2));
    let workers = vec![
        WorkerInfo {
            local_rank: 0,
            global_rank: 2,
            pid: 4241,
        },
        WorkerInfo {
            local_rank: 1,
            global_rank: 3,
            pid: 4242,
        },
    ];
    let started = log.started(workers);
    assert_eq!(started.len(), 2);
    assert!(
        started[1].contains(r#"\"local_rank\": [1], \"role_rank\": [3], \"role_world_size\": [4], \"exit_code\": [null], \"worker_pid\": [null]}"#)
            && started[1].contains(r#""worker_id": "4242""#)
            && started[1].contains(r#""source": "WORKER""#),
        "{}",
        started[1]
    );
    log.failed(1, Failure::of(Ended::Signaled(9), None).expect("a failure"));
    let ended = log.ended(&Ending::Failed, Duration::from_millis(7_900));
    assert_eq!(ended.len(), 3);
    assert!(
        ended[0].contains(r#""state": "TERMINATED""#),
        "{}",
        ended[0]
    );
    assert_eq!(
        ended[1],
        r#"{"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp": 0, "metadata": {"run_id": "job-1", "global_rank": 3, "group_rank": 1, "worker_id": "4242", "role": "trainer", "hostname": "node-\u00e9", "state": "FAILED", "total_run_time": 7, "rdzv_backend": "c10d", "raw_error": "{\"message\": \"<NONE>\"}", "metadata": "{\"group_world_size\": 2, \"entry_point\": \"job.sh\", \"local_rank\": [1], \"role_rank\": [3], \"role_world_size\": [4], \"exit_code\": [-9], \"worker_pid\": [4242]}", "agent_restarts": 2, "duration_ms": null}}"#
    );
    // The agent's own run ended normally: SUCCEEDED, as torchrun's launcher records.
    assert!(
        ended[2].contains(r#""name": "torchelastic.worker.status.SUCCEEDED", "source": "AGENT""#)
    );
}

#[test]
fn raw_errors_follow_torchs_process_failure() {
    let exited = Failure::of(Ended::Exited(3), None).expect("failure");
    assert_eq!(exited.exit_code, 3);
    let mut traits = false;
    assert_eq!(
        exited.raw_error(&mut traits),
        r#"{"message": "<NONE>", "errorTraits": {"category": "system_terminated_error", "retryability": "False"}}"#
    );
    let written = Failure::of(
        Ended::Exited(1),
        Some(r#"{"message":{"message":"boom","extraInfo":{"timestamp":"1"}},"z":1.0,"a":[true]}"#),
    )
    .expect("failure");
    assert_eq!(
        written.raw_error(&mut traits),
        r#"{"message": {"message": "boom", "extraInfo": {"timestamp": "1"}}, "z": 1.0, "a": [true]}"#,
        "the file's keys keep their order"
    );
    assert_eq!(Failure::of(Ended::Exited(0), None), None);
    // A signalled worker's placeholder: bare, until an exited one added the
    // traits to torchrun's shared placeholder.
    let killed = Failure::of(Ended::Signaled(15), None).expect("failure");
    assert_eq!(killed.exit_code, -15);
    assert_eq!(killed.raw_error(&mut false), r#"{"message": "<NONE>"}"#);
    assert!(traits, "the exit without an error file added them");
    assert!(killed.raw_error(&mut traits).contains("errorTraits"));
}

#[test]
fn an_agent_failure_has_no_worker_events() {
    let mut log = EventLog::new(EventHandler::Console, None, id());
    log.formed(Duration::ZERO, Duration::ZERO, &round(0, 1, 1, 0));
    log.started(vec![WorkerInfo {
        local_rank: 0,
        global_rank: 0,
        pid: 1,
    }]);
    let ended = log.ended(&Ending::AgentFailed("stopped".into()), Duration::ZERO);
    assert_eq!(ended.len(), 1);
    assert!(
        ended[0].contains(r#""state": "FAILED""#) && ended[0].contains(r#""raw_error": "stopped""#)
    );
}

#[test]
fn json_matches_pythons_dumps() {
    let v: Value = serde_json::json!({"m": "tab\t\u{7f}\u{1} 😀 \"q\" \\"});
    assert_eq!(
        python_json(&v),
        r#"{"m": "tab\t\u007f\u0001 \ud83d\ude00 \"q\" \\"}"#
    );
    // Python's repr for each, as printed by the venv's Python.
    for (f, py) in [
        (0.1, "0.1"),
        (1e16, "1e+16"),
        (1.5e-7, "1.5e-07"),
        (123456789.125, "123456789.125"),
        (5.0, "5.0"),
        (0.0001, "0.0001"),
        (0.00001234, "1.234e-05"),
        (1e15, "1000000000000000.0"),
        (12345678901234567.0, "1.2345678901234568e+16"),
        (-2.5, "-2.5"),
    ] {
        assert_eq!(python_float(f), py, "{f}");
    }
}
