//! torchelastic events (`--event-log-handler`): the
//! `torchelastic.worker.status.<STATE>` records torchrun's agent writes, so
//! that tools which parse them keep working under accel.
//!
//! Facts from torch 2.13 (`elastic/events/{api,handlers,__init__}.py`,
//! `elastic/agent/server/api.py`, `launcher/api.py`):
//! - the handlers registered are `console` (a `logging.StreamHandler`: one
//!   line on stderr, the event's JSON and nothing else), `null` (the
//!   default) and `dynamic_rendezvous`; both of the latter discard events.
//!   Events are logged at INFO on a logger whose level is `LOGLEVEL`
//!   (default INFO), so `LOGLEVEL=WARNING` silences them.
//! - An event is `{"name", "source", "timestamp": 0, "metadata"}` as
//!   Python's `json.dumps` writes it (`", "` and `": "` separators, non-ASCII
//!   escaped); `metadata` holds run_id, global_rank, group_rank, worker_id,
//!   role, hostname, state, total_run_time, rdzv_backend, raw_error,
//!   metadata (itself a JSON string) , agent_restarts and duration_ms, in
//!   that order.
//! - The agent records `RENDEZVOUS` and `ASSIGN_WORKER_RANKS` (source AGENT,
//!   with the time each took) each round, `START` per worker (source WORKER)
//!   once the round's workers run, at the end each worker's final state
//!   (`SUCCEEDED`; or `FAILED` for every worker that ended badly, by itself
//!   or killed by the agent's stop, and `TERMINATED` for the rest, which
//!   exited 0), then `SUCCEEDED` for the agent itself (its run ended,
//!   whatever the workers did), or only `FAILED` for the agent when it was
//!   signalled or raised.
//! - torchrun's rendezvous events (`RdzvEvent`) go to the
//!   `dynamic_rendezvous` handler, which is a null handler whatever
//!   `--event-log-handler` says: torchrun never prints them, so neither
//!   does accel.
//!
//! The [`EventLog`] is fed by the agent's driver at those moments and
//! returns the lines to print; it reads no clock (durations and the run
//! time are given) and does no I/O, so its tests check the exact text.

use std::str::FromStr;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::config::ConfigError;
use crate::Ended;
use accel_input::excerpt;

/// Where events go (`--event-log-handler`): a handler torchrun registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventHandler {
    /// `null`: nowhere (torchrun's default).
    #[default]
    Null,
    /// `console`: one JSON line per event on the agent's stderr.
    Console,
    /// `dynamic_rendezvous`: nowhere (a null handler in torchrun too).
    DynamicRendezvous,
}

/// The names [`EventHandler`] accepts, as torchrun registers them.
pub(crate) const HANDLERS: [&str; 3] = ["console", "dynamic_rendezvous", "null"];

impl FromStr for EventHandler {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "null" => Ok(Self::Null),
            "console" => Ok(Self::Console),
            "dynamic_rendezvous" => Ok(Self::DynamicRendezvous),
            _ => Err(ConfigError(format!(
                "--event-log-handler '{}' is not an event handler torchrun registers; use one of: {}",
                excerpt(s),
                HANDLERS.join(", ")
            ))),
        }
    }
}

/// Whether `LOGLEVEL` (torchrun's events logger level) lets INFO through.
pub(crate) fn info_enabled(loglevel: Option<&str>) -> bool {
    let Some(level) = loglevel.map(str::trim).filter(|l| !l.is_empty()) else {
        return true;
    };
    match level.parse::<i64>() {
        Ok(n) => n <= 20,
        Err(_) => matches!(level, "NOTSET" | "DEBUG" | "INFO"),
    }
}

/// Who records an event (torchrun's `EventSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The agent.
    Agent,
    /// One worker.
    Worker,
}

/// One worker of the running round, as its events describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerInfo {
    /// `LOCAL_RANK`.
    pub local_rank: u32,
    /// `RANK`.
    pub global_rank: u32,
    /// Its process id.
    pub pid: i32,
}

/// What the node's job came to, for the final events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every worker of the job succeeded.
    Succeeded,
    /// The job failed: this node's failed workers are `FAILED`, the others
    /// `TERMINATED`.
    Failed,
    /// The agent stopped on a signal or an error (`raw_error` says which).
    AgentFailed(String),
}

/// A worker's failure as the final events report it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    /// torchrun's exit code: the code, or minus the signal number.
    pub exit_code: i64,
    /// The worker's error file, parsed, if it wrote one.
    pub error_file: Option<Value>,
}

impl Failure {
    /// From how a worker ended and its error file's text, if any; `None`
    /// for a success.
    pub(crate) fn of(ended: Ended, error_file: Option<&str>) -> Option<Self> {
        let exit_code = match ended {
            Ended::Exited(0) => return None,
            Ended::Exited(c) => i64::from(c),
            Ended::Signaled(s) => -i64::from(s),
        };
        Some(Self {
            exit_code,
            error_file: error_file.and_then(|t| serde_json::from_str(t).ok()),
        })
    }

    /// torchrun's `raw_error`: the error file's data, re-serialized; with
    /// no error file, the placeholder torchrun's `ProcessFailure` makes.
    /// That placeholder is one shared dict to which torchrun adds
    /// `errorTraits` at the first failure that exited (rather than being
    /// signalled) without an error file, so every later placeholder, a
    /// signalled worker's too, carries them: `traits` says whether that
    /// has happened, and is set by this failure if it does.
    fn raw_error(&self, traits: &mut bool) -> String {
        let data = match &self.error_file {
            Some(v) => v.clone(),
            None => {
                let mut m = Map::new();
                m.insert("message".into(), "<NONE>".into());
                *traits |= self.exit_code >= 0;
                if *traits {
                    let mut traits = Map::new();
                    traits.insert("category".into(), "system_terminated_error".into());
                    traits.insert("retryability".into(), "False".into());
                    m.insert("errorTraits".into(), Value::Object(traits));
                }
                Value::Object(m)
            }
        };
        python_json(&data)
    }
}

/// What every event of this agent shares.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// `run_id`: the rendezvous id.
    pub run_id: String,
    /// `role`.
    pub role: String,
    /// `hostname`.
    pub hostname: String,
    /// `rdzv_backend`: `c10d`, `static` or `etcd`.
    pub rdzv_backend: String,
    /// `entry_point`: the base name of the program the workers run.
    pub entry_point: String,
}

/// The events of one agent: the round it is in and how its workers ended.
#[derive(Debug)]
pub(crate) struct EventLog {
    on: bool,
    id: Identity,
    group_rank: Option<u32>,
    group_world_size: Option<u32>,
    world_size: u32,
    restarts: u32,
    workers: Vec<WorkerInfo>,
    /// Failed local ranks: exit code and `raw_error`.
    failures: Vec<(u32, i64, String)>,
    /// Whether torchrun's shared placeholder error has gained its traits.
    traits: bool,
}

impl EventLog {
    /// Events for `handler`; `on` is false when nothing is printed (a null
    /// handler, or `LOGLEVEL` above INFO), and then nothing is made.
    pub(crate) fn new(handler: EventHandler, loglevel: Option<&str>, id: Identity) -> Self {
        Self {
            on: handler == EventHandler::Console && info_enabled(loglevel),
            id,
            group_rank: None,
            group_world_size: None,
            world_size: 0,
            restarts: 0,
            workers: Vec::new(),
            failures: Vec::new(),
            traits: false,
        }
    }

    /// Whether events are printed at all.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// A round formed after `rendezvous`, and its ranks took `assign`:
    /// `RENDEZVOUS` and `ASSIGN_WORKER_RANKS` (describing the node as it was
    /// before the round, as torchrun's do), then the round is taken on.
    pub(crate) fn formed(
        &mut self,
        rendezvous: Duration,
        assign: Duration,
        round: &crate::agent::round::RoundInfo,
    ) -> Vec<String> {
        self.restarts = round.restart_count;
        let lines = if self.on {
            vec![
                self.agent_event("RENDEZVOUS", None, Some(rendezvous), 0),
                self.agent_event("ASSIGN_WORKER_RANKS", None, Some(assign), 0),
            ]
        } else {
            Vec::new()
        };
        self.group_rank = Some(round.node_rank);
        self.group_world_size = Some(round.nnodes);
        self.world_size = round.world_size;
        self.workers.clear();
        self.failures.clear();
        lines
    }

    /// The round's workers run: `START` for each.
    pub(crate) fn started(&mut self, workers: Vec<WorkerInfo>) -> Vec<String> {
        self.workers = workers;
        if !self.on {
            return Vec::new();
        }
        self.workers
            .iter()
            .map(|w| self.worker_event("START", w, None, 0))
            .collect()
    }

    /// A worker of the running round ended with `failure`: by itself, or
    /// of the agent's stop (torchrun records both, in the order seen).
    pub(crate) fn failed(&mut self, local_rank: u32, failure: Failure) {
        if self.on && !self.failures.iter().any(|(r, ..)| *r == local_rank) {
            let raw = failure.raw_error(&mut self.traits);
            self.failures.push((local_rank, failure.exit_code, raw));
        }
    }

    /// The agent's run is over after `run_time`: each worker's final state
    /// (unless the agent itself failed), then the agent's.
    pub(crate) fn ended(&self, ending: &Ending, run_time: Duration) -> Vec<String> {
        if !self.on {
            return Vec::new();
        }
        let secs = run_time.as_secs();
        let mut lines = Vec::new();
        let state = |w: &WorkerInfo| -> (&str, Option<(i64, &str)>) {
            let failure = self
                .failures
                .iter()
                .find(|(r, ..)| *r == w.local_rank)
                .map(|(_, code, raw)| (*code, raw.as_str()));
            match (ending, failure) {
                (Ending::Succeeded, _) => ("SUCCEEDED", None),
                (_, Some(f)) => ("FAILED", Some(f)),
                (_, None) => ("TERMINATED", None),
            }
        };
        if !matches!(ending, Ending::AgentFailed(_)) {
            for w in &self.workers {
                let (s, f) = state(w);
                lines.push(self.worker_event(s, w, f, secs));
            }
        }
        lines.push(match ending {
            Ending::AgentFailed(why) => self.agent_event("FAILED", Some(why.clone()), None, secs),
            _ => self.agent_event("SUCCEEDED", None, None, secs),
        });
        lines
    }

    fn agent_event(
        &self,
        state: &str,
        raw_error: Option<String>,
        duration: Option<Duration>,
        run_time: u64,
    ) -> String {
        let md = self.inner_metadata(None);
        self.event(
            state,
            Source::Agent,
            EventFields {
                global_rank: None,
                worker_id: None,
                raw_error,
                inner: md,
                run_time,
                duration_ms: duration.map(|d| d.as_secs_f64() * 1000.0),
            },
        )
    }

    fn worker_event(
        &self,
        state: &str,
        w: &WorkerInfo,
        failure: Option<(i64, &str)>,
        run_time: u64,
    ) -> String {
        let md = self.inner_metadata(Some((w, failure.map(|f| f.0))));
        self.event(
            state,
            Source::Worker,
            EventFields {
                global_rank: Some(w.global_rank),
                worker_id: Some(w.pid.to_string()),
                raw_error: failure.map(|f| f.1.to_owned()),
                inner: md,
                run_time,
                duration_ms: None,
            },
        )
    }

    /// The `metadata` string inside the metadata; torchrun puts each
    /// worker value in a one-element tuple, which JSON writes as a list.
    fn inner_metadata(&self, worker: Option<(&WorkerInfo, Option<i64>)>) -> String {
        let mut md = Map::new();
        md.insert("group_world_size".into(), opt(self.group_world_size));
        md.insert("entry_point".into(), self.id.entry_point.clone().into());
        if let Some((w, failure)) = worker {
            let one = |v: Value| Value::Array(vec![v]);
            md.insert("local_rank".into(), one(w.local_rank.into()));
            md.insert("role_rank".into(), one(w.global_rank.into()));
            md.insert("role_world_size".into(), one(self.world_size.into()));
            md.insert(
                "exit_code".into(),
                one(failure.map_or(Value::Null, Value::from)),
            );
            md.insert(
                "worker_pid".into(),
                one(failure.map_or(Value::Null, |_| w.pid.into())),
            );
        }
        python_json(&Value::Object(md))
    }

    fn event(&self, state: &str, source: Source, f: EventFields) -> String {
        let mut m = Map::new();
        m.insert("run_id".into(), self.id.run_id.clone().into());
        m.insert("global_rank".into(), opt(f.global_rank));
        m.insert("group_rank".into(), opt(self.group_rank));
        m.insert(
            "worker_id".into(),
            f.worker_id.map_or(Value::Null, Value::from),
        );
        m.insert("role".into(), self.id.role.clone().into());
        m.insert("hostname".into(), self.id.hostname.clone().into());
        m.insert("state".into(), state.into());
        m.insert("total_run_time".into(), f.run_time.into());
        m.insert("rdzv_backend".into(), self.id.rdzv_backend.clone().into());
        m.insert(
            "raw_error".into(),
            f.raw_error.map_or(Value::Null, Value::from),
        );
        m.insert("metadata".into(), f.inner.into());
        m.insert("agent_restarts".into(), self.restarts.into());
        m.insert(
            "duration_ms".into(),
            f.duration_ms
                .and_then(serde_json::Number::from_f64)
                .map_or(Value::Null, Value::Number),
        );
        let mut e = Map::new();
        e.insert(
            "name".into(),
            format!("torchelastic.worker.status.{state}").into(),
        );
        e.insert(
            "source".into(),
            match source {
                Source::Agent => "AGENT",
                Source::Worker => "WORKER",
            }
            .into(),
        );
        e.insert("timestamp".into(), 0.into());
        e.insert("metadata".into(), Value::Object(m));
        python_json(&Value::Object(e))
    }
}

struct EventFields {
    global_rank: Option<u32>,
    worker_id: Option<String>,
    raw_error: Option<String>,
    inner: String,
    run_time: u64,
    duration_ms: Option<f64>,
}

fn opt(v: Option<u32>) -> Value {
    v.map_or(Value::Null, Value::from)
}

mod json;
pub(crate) use json::python_json;

#[cfg(test)]
mod tests;
