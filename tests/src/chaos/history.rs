//! The recorded history: what the workers wrote (`workers/chaos_worker.py`)
//! and what the harness did, on one clock (CLOCK_MONOTONIC, seconds).
//!
//! A worker is one process: its `start` line, the time of its last line
//! (a heartbeat every 50 ms while it runs) and whether it ended on the
//! harness's request. A round is identified by what its workers were
//! told: (job, restart count, MASTER_ADDR:MASTER_PORT, WORLD_SIZE): every
//! round gets a fresh store on a fresh port, so two rounds never share it.

use std::collections::BTreeMap;

use serde_json::Value;

use super::schedule::Fault;

/// One worker process, as its lines tell.
#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    /// The job (`--rdzv-id`).
    pub job: String,
    /// Global rank.
    pub rank: u32,
    /// WORLD_SIZE.
    pub world: u32,
    /// LOCAL_RANK.
    pub local_rank: u32,
    /// GROUP_RANK (node rank).
    pub group_rank: u32,
    /// TORCHELASTIC_RESTART_COUNT.
    pub restart: u32,
    /// MASTER_ADDR:MASTER_PORT.
    pub master: String,
    /// Its pid.
    pub pid: u32,
    /// The node (agent host) it ran on.
    pub node: String,
    /// Its `start` line.
    pub start: f64,
    /// Its last line (the start, a heartbeat or the end).
    pub last: f64,
    /// It wrote `end` (stopped on the harness's request).
    pub ended: bool,
}

/// A round's identity.
pub type RoundKey = (String, u32, String, u32);

impl Worker {
    /// The round it belonged to.
    pub fn round(&self) -> RoundKey {
        (
            self.job.clone(),
            self.restart,
            self.master.clone(),
            self.world,
        )
    }

    /// One line for a violation's history slice.
    pub fn describe(&self) -> String {
        format!(
            "pid {} {} rank {}/{} (node {} group_rank {} local_rank {}, restart {}, store {}) ran {:.3}..{:.3}{}",
            self.pid,
            self.job,
            self.rank,
            self.world,
            self.node,
            self.group_rank,
            self.local_rank,
            self.restart,
            self.master,
            self.start,
            self.last,
            if self.ended { " ended" } else { "" }
        )
    }
}

/// Every worker, by pid, from the history's text. Lines that do not parse
/// (a line cut by a full disk, say) are counted, not fatal.
pub fn parse(text: &str) -> (Vec<Worker>, usize) {
    let mut p = Parser::default();
    p.feed(text);
    p.feed("\n");
    (p.workers(), p.bad)
}

/// The history read as it grows: feed it what was appended.
#[derive(Debug, Default)]
pub struct Parser {
    /// The worker each pid is now.
    by_pid: BTreeMap<u32, Worker>,
    /// Workers whose pid a later worker took.
    done: Vec<Worker>,
    /// An incomplete last line.
    partial: String,
    /// Lines that did not parse.
    pub bad: usize,
}

impl Parser {
    /// Reads `chunk` (what was appended since the last call).
    pub fn feed(&mut self, chunk: &str) {
        self.partial.push_str(chunk);
        let Some(cut) = self.partial.rfind('\n') else {
            return;
        };
        let rest = self.partial.split_off(cut + 1);
        let text = std::mem::replace(&mut self.partial, rest);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Some((ev, mut w)) = parse_line(line) else {
                self.bad += 1;
                continue;
            };
            w.ended = ev == "end";
            // A pid may be used again by a later worker: a `start` line begins a new one.
            match self.by_pid.get_mut(&w.pid) {
                Some(old) if ev != "start" => {
                    old.last = old.last.max(w.last);
                    old.ended |= w.ended;
                }
                _ => self.done.extend(self.by_pid.insert(w.pid, w)),
            }
        }
    }

    /// Every worker so far, by start time.
    pub fn workers(&self) -> Vec<Worker> {
        let mut out: Vec<Worker> = self
            .done
            .iter()
            .chain(self.by_pid.values())
            .cloned()
            .collect();
        out.sort_by(|a, b| a.start.total_cmp(&b.start));
        out
    }
}

fn parse_line(line: &str) -> Option<(String, Worker)> {
    let v: Value = serde_json::from_str(line).ok()?;
    let n = |k: &str| v[k].as_u64().map(|x| x as u32);
    let t = v["t"].as_f64()?;
    let ev = v["ev"].as_str()?.to_owned();
    Some((
        ev,
        Worker {
            job: v["job"].as_str()?.to_owned(),
            rank: n("rank")?,
            world: n("world")?,
            local_rank: n("local_rank")?,
            group_rank: n("group_rank")?,
            restart: n("restart")?,
            master: v["master"].as_str()?.to_owned(),
            pid: n("pid")?,
            node: v["node"].as_str()?.to_owned(),
            start: t,
            last: t,
            ended: false,
        },
    ))
}

/// What one injected fault did, as the harness saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// The fault.
    pub fault: Fault,
    /// When it was injected (monotonic seconds).
    pub at: f64,
    /// When it healed.
    pub healed: f64,
    /// For a worker fault: the worker it hit (its pid and restart count
    /// then), `None` if no worker of the job was live.
    pub victim: Option<Victim>,
    /// It was not injected (its target was gone): why.
    pub skipped: Option<String>,
}

/// The worker a worker fault hit.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    /// Its pid.
    pub pid: u32,
    /// Its TORCHELASTIC_RESTART_COUNT.
    pub restart: u32,
    /// Its global rank.
    pub rank: u32,
}

/// A daemon of the job that ended by itself (not killed by the harness).
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    /// Which (`agent1/rec`).
    pub who: String,
    /// When the harness saw it.
    pub at: f64,
    /// Exit code, or the signal.
    pub status: String,
    /// Whether it was the expected end (exit 0 after the job was told to finish).
    pub ok: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_its_start_and_its_last_line_and_bad_lines_are_counted() {
        let line = |ev: &str, t: f64, pid: u32| {
            format!(
                r#"{{"job":"rec","rank":1,"world":4,"local_rank":1,"group_rank":0,"restart":2,"master":"10.0.0.2:9","pid":{pid},"node":"node0","ev":"{ev}","t":{t}}}"#
            )
        };
        let text = [
            line("start", 1.0, 7),
            line("beat", 1.05, 7),
            line("start", 1.2, 8),
            "{\"job\": \"rec\", \"ra".to_owned(),
            line("beat", 1.1, 7),
            line("end", 1.5, 7),
        ]
        .join("\n");
        let (ws, bad) = parse(&text);
        assert_eq!(bad, 1);
        assert_eq!(ws.len(), 2);
        assert_eq!(
            (ws[0].pid, ws[0].start, ws[0].last, ws[0].ended),
            (7, 1.0, 1.5, true)
        );
        assert_eq!(ws[0].round(), ("rec".into(), 2, "10.0.0.2:9".into(), 4));
        assert_eq!((ws[1].pid, ws[1].last, ws[1].ended), (8, 1.2, false));

        // Read as it grows: a line cut between two reads is read whole.
        let mut p = Parser::default();
        let (a, b) = text.split_at(text.len() / 2);
        p.feed(a);
        p.feed(b);
        p.feed("\n");
        assert_eq!((p.workers(), p.bad), (ws, 1));
        // A later worker with a pid used before is another worker.
        p.feed(&(line("start", 9.0, 7) + "\n"));
        let again = p.workers();
        assert_eq!(again.len(), 3);
        assert_eq!((again[2].pid, again[2].start, again[0].last), (7, 9.0, 1.5));
    }
}
