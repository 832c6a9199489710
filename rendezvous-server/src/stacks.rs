//! Job-wide stacks: every worker's Python stacks, grouped so that the odd
//! rank out stands out.
//!
//! A stalled job is usually one rank stuck somewhere (a slow data loader, a
//! deadlock, a collective the others never entered) while every other rank
//! waits for it in the same collective. The hung rank's stack alone says
//! where it is, not who waits for it; 64 nodes' logs say it only to someone
//! who reads them all. So the server, which knows every node of the job,
//! asks each node of the running round for its workers' stacks
//! ([`pb::StacksRequested`] down its session stream), and each agent runs
//! `py-spy dump` on its workers and answers with `ReportStacks`. Stacks that
//! are the same once the per-process details are set aside ([`normalize`])
//! form one group; groups are listed with the fewest ranks first.
//!
//! Who asks: an operator (`rdzv-server stacks JOB`, or the status page), and
//! an agent whose worker's FileTimer expired, before it stops the worker, so
//! the failure report says where every rank was when the job hung.
//!
//! Bounds: at most [`MAX_COLLECTIONS`] collections run at once, one per job
//! (a second caller gets the answer of the one under way, whatever it asked
//! for, and a caller within [`COOLDOWN`] of an answer gets that answer); a collection
//! lasts at most [`MAX_TIMEOUT`] and ends when every node asked answered;
//! a node's answer must fit in one request (`limits::MAX_MESSAGE_BYTES`),
//! each stack at most [`accel_wire::limits::MAX_STACK_BYTES`]; the answer carries at most
//! [`MAX_ANSWER_TEXT`] of stack text and [`MAX_RANKS_LISTED`] ranks per
//! group. An answer from a node that was not asked, or for a collection
//! that is over, changes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use accel_proto::v1 as pb;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::error::Error;

/// How long a collection waits for the nodes when the caller says nothing.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a caller may ask a collection to wait.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest: `py-spy dump` of a large process takes a few hundred ms.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(500);
/// Most collections under way at once (one per job).
pub const MAX_COLLECTIONS: usize = 16;
/// Most stack text in one answer: groups past it are counted, not listed.
pub const MAX_ANSWER_TEXT: usize = 2 << 20;
/// Most ranks listed per group (`rank_count` in the text counts them all).
pub const MAX_RANKS_LISTED: usize = 1000;
/// Most hosts listed as missing.
pub const MAX_MISSING_LISTED: usize = 1000;
/// Most jobs whose last collection is kept for the status page (the
/// oldest is forgotten first).
pub const MAX_KEPT: usize = 64;
/// How long a collection's answer is kept for the status page.
pub const KEPT_FOR: Duration = Duration::from_secs(3600);
/// How long an answer stands in for a new collection of its job: asking in
/// a loop cannot keep the workers under py-spy.
pub const COOLDOWN: Duration = Duration::from_secs(5);

/// The collection's time budget for `timeout_ms` (0: the default), bounded.
pub fn timeout_of(timeout_ms: u32) -> Duration {
    match timeout_ms {
        0 => DEFAULT_TIMEOUT,
        ms => Duration::from_millis(ms.into()).clamp(MIN_TIMEOUT, MAX_TIMEOUT),
    }
}

/// The time the agents get out of a collection's `timeout`: four fifths of
/// it, so their answers arrive before the collection gives up on them.
pub fn agent_budget(timeout: Duration) -> Duration {
    timeout * 4 / 5
}

/// A stack as grouped and shown: `py-spy dump`'s text without what differs
/// from one process to the next though the code is in the same place (the
/// `Process` and `Python v...` header lines, thread ids and states, blank
/// lines). `Thread 4242 (idle): "MainThread"` becomes `Thread "MainThread"`,
/// and `Thread 4243 (idle)` (no name) `Thread`.
pub fn normalize(stack: &str) -> String {
    let mut out = String::with_capacity(stack.len());
    for line in stack.lines() {
        let trimmed = line.trim_end();
        if trimmed.is_empty() || trimmed.starts_with("Process ") || trimmed.starts_with("Python v")
        {
            continue;
        }
        let line = match trimmed.strip_prefix("Thread ") {
            Some(rest) => match rest.find(": ") {
                Some(at) => format!("Thread {}", &rest[at + 2..]),
                // A thread without a name (py-spy 0.4 prints `Thread 4242
                // (idle)`): its id and state differ between processes too.
                None if rest.starts_with(|c: char| c.is_ascii_digit()) => "Thread".to_owned(),
                None => trimmed.to_owned(),
            },
            None => trimmed.to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// One node's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Its host name.
    pub host: String,
    /// Its workers' stacks.
    pub workers: Vec<pb::WorkerStack>,
}

/// The answers grouped by identical (normalized) stacks, fewest ranks
/// first, then by lowest rank; `asked`: nodes asked; `missing`: hosts that
/// did not answer.
pub fn group(round: u64, asked: u32, answers: &[Answer], missing: &[String]) -> pb::StacksResponse {
    let mut groups: BTreeMap<String, Vec<pb::RankRef>> = BTreeMap::new();
    for a in answers {
        for w in &a.workers {
            groups
                .entry(normalize(&w.stack))
                .or_default()
                .push(pb::RankRef {
                    rank: w.rank,
                    local_rank: w.local_rank,
                    host: a.host.clone(),
                    pid: w.pid,
                });
        }
    }
    let mut groups: Vec<(String, Vec<pb::RankRef>)> = groups.into_iter().collect();
    for (_, ranks) in &mut groups {
        ranks.sort_by_key(|r| r.rank);
    }
    groups.sort_by_key(|(_, ranks)| (ranks.len(), ranks.first().map(|r| r.rank)));
    let mut out = pb::StacksResponse {
        round,
        nodes_asked: asked,
        nodes_answered: answers.len() as u32,
        missing: missing.iter().take(MAX_MISSING_LISTED).cloned().collect(),
        ..Default::default()
    };
    let mut text = 0;
    for (stack, mut ranks) in groups {
        if text + stack.len() > MAX_ANSWER_TEXT {
            out.groups_omitted += 1;
            out.ranks_omitted += ranks.len() as u32;
            continue;
        }
        text += stack.len();
        let rank_count = ranks.len() as u32;
        ranks.truncate(MAX_RANKS_LISTED);
        out.groups.push(pb::StackGroup {
            stack,
            ranks,
            rank_count,
        });
    }
    out
}

/// The grouped stacks as one JSON document (`rdzv-server stacks --json`).
pub fn render_json(job: &str, r: &pb::StacksResponse) -> String {
    let mut out = json(job, r).to_string();
    out.push('\n');
    out
}

/// The grouped stacks as JSON: `{"job_id", "round", "nodes_asked",
/// "nodes_answered", "missing": [host], "groups": [{"rank_count", "ranks":
/// [{"rank", "local_rank", "host", "pid"}], "stack"}], "groups_omitted",
/// "ranks_omitted"}`.
pub fn json(job: &str, r: &pb::StacksResponse) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = r
        .groups
        .iter()
        .map(|g| {
            let ranks: Vec<serde_json::Value> = g
                .ranks
                .iter()
                .map(|k| {
                    serde_json::json!({
                        "rank": k.rank, "local_rank": k.local_rank, "host": k.host, "pid": k.pid,
                    })
                })
                .collect();
            serde_json::json!({ "rank_count": g.rank_count, "ranks": ranks, "stack": g.stack })
        })
        .collect();
    serde_json::json!({
        "job_id": job,
        "round": r.round,
        "nodes_asked": r.nodes_asked,
        "nodes_answered": r.nodes_answered,
        "missing": r.missing,
        "groups": groups,
        "groups_omitted": r.groups_omitted,
        "ranks_omitted": r.ranks_omitted,
    })
}

/// Whether an answer published at `at` (Unix ms) is past [`KEPT_FOR`].
fn stale(at: u64) -> bool {
    unix_ms_now().saturating_sub(at) > KEPT_FOR.as_millis() as u64
}

/// What a collection's callers wait on: `None` until it is done.
pub type Done = watch::Receiver<Option<Arc<pb::StacksResponse>>>;

/// One node's answer on its way to its collection.
#[derive(Debug)]
struct Reply {
    node_id: String,
    answer: Answer,
}

/// A collection under way.
#[derive(Debug)]
struct Pending {
    id: u64,
    /// Nodes asked that have not answered.
    waiting: HashSet<String>,
    replies: mpsc::Sender<Reply>,
    done: Done,
}

/// The collections under way, by job. Its lock is taken after the
/// registry's, never before.
#[derive(Debug, Default)]
pub struct Desk {
    state: Mutex<DeskState>,
}

#[derive(Debug, Default)]
struct DeskState {
    next_id: u64,
    by_job: HashMap<String, Pending>,
    /// Each job's last answer, when it was published (Unix ms).
    kept: HashMap<String, (u64, Arc<pb::StacksResponse>)>,
}

/// A job's stacks as the status page asks for them.
#[derive(Debug, Clone, PartialEq)]
pub enum Latest {
    /// Nothing collected (or forgotten).
    None,
    /// A collection is under way.
    Collecting,
    /// The last answer, published at this Unix time (ms).
    Done(u64, Arc<pb::StacksResponse>),
}

fn unix_ms_now() -> u64 {
    accel_wire::time::unix_ms(std::time::SystemTime::now())
}

/// What [`Desk::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// A collection of the job is under way: wait for its answer.
    UnderWay(Done),
    /// A new collection, numbered `id`, to ask the nodes for.
    New(Collection),
}

/// A collection just begun: ask the nodes, [`Desk::expect`] their answers,
/// then [`Collection::run`] it.
#[derive(Debug)]
pub struct Collection {
    /// Its number, in every `StacksRequested` it sends.
    pub id: u64,
    job: String,
    replies: mpsc::Receiver<Reply>,
    done: watch::Sender<Option<Arc<pb::StacksResponse>>>,
}

impl Desk {
    fn lock(&self) -> MutexGuard<'_, DeskState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Joins the collection of `job` under way, or begins one for up to
    /// `nodes` answers.
    pub fn begin(&self, job: &str, nodes: usize) -> Result<Begin, Error> {
        let mut s = self.lock();
        if let Some(p) = s.by_job.get(job) {
            return Ok(Begin::UnderWay(p.done.clone()));
        }
        if let Some((_, r)) = s
            .kept
            .get(job)
            .filter(|(at, _)| unix_ms_now().saturating_sub(*at) < COOLDOWN.as_millis() as u64)
        {
            // Answered a moment ago: that answer, not another round of dumps.
            return Ok(Begin::UnderWay(watch::channel(Some(r.clone())).1));
        }
        if s.by_job.len() >= MAX_COLLECTIONS {
            return Err(Error::LimitReached(format!(
                "{MAX_COLLECTIONS} stack collections are under way on this server; try again in {} s",
                MAX_TIMEOUT.as_secs()
            )));
        }
        s.next_id += 1;
        let id = s.next_id;
        let (tx, replies) = mpsc::channel(nodes.max(1));
        let (done, rx) = watch::channel(None);
        s.by_job.insert(
            job.to_owned(),
            Pending {
                id,
                waiting: HashSet::new(),
                replies: tx,
                done: rx,
            },
        );
        Ok(Begin::New(Collection {
            id,
            job: job.to_owned(),
            replies,
            done,
        }))
    }

    /// The nodes collection `id` of `job` asked: only their answers count.
    pub fn expect(&self, job: &str, id: u64, nodes: impl IntoIterator<Item = String>) {
        if let Some(p) = self.lock().by_job.get_mut(job).filter(|p| p.id == id) {
            p.waiting.extend(nodes);
        }
    }

    /// A node's answer to collection `id` of `job`: taken if the node was
    /// asked and has not answered; ignored otherwise (late, or not asked).
    pub fn deliver(&self, job: &str, id: u64, node_id: &str, answer: Answer) -> bool {
        let mut s = self.lock();
        let Some(p) = s.by_job.get_mut(job).filter(|p| p.id == id) else {
            return false;
        };
        if !p.waiting.remove(node_id) {
            return false;
        }
        p.replies
            .try_send(Reply {
                node_id: node_id.to_owned(),
                answer,
            })
            .is_ok()
    }

    /// Collections under way.
    pub fn under_way(&self) -> usize {
        self.lock().by_job.len()
    }

    /// Job `job`'s stacks: being collected, or the last answer (kept for
    /// [`KEPT_FOR`]).
    pub fn latest(&self, job: &str) -> Latest {
        let s = self.lock();
        if s.by_job.contains_key(job) {
            return Latest::Collecting;
        }
        match s.kept.get(job) {
            Some((at, r)) if !stale(*at) => Latest::Done(*at, r.clone()),
            _ => Latest::None,
        }
    }

    /// When job `job`'s kept answer was published (Unix ms), if one is kept.
    pub fn kept_at(&self, job: &str) -> Option<u64> {
        self.lock()
            .kept
            .get(job)
            .map(|(at, _)| *at)
            .filter(|at| !stale(*at))
    }

    /// Collection `id` of `job` is over with answer `r`: kept for the page,
    /// and the job free for a new one, at once (a reader never sees the
    /// collection gone without its answer).
    fn publish(&self, job: &str, id: u64, r: Arc<pb::StacksResponse>) {
        let mut s = self.lock();
        if s.by_job.get(job).is_some_and(|p| p.id == id) {
            s.by_job.remove(job);
        }
        s.kept.retain(|_, (at, _)| !stale(*at));
        if s.kept.len() >= MAX_KEPT && !s.kept.contains_key(job) {
            if let Some(oldest) = s
                .kept
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(j, _)| j.clone())
            {
                s.kept.remove(&oldest);
            }
        }
        s.kept.insert(job.to_owned(), (unix_ms_now(), r));
    }

    /// Forgets what is kept of `job` (it ended and was forgotten: a new job
    /// of that id must not show its stacks).
    pub fn forget(&self, job: &str) {
        self.lock().kept.remove(job);
    }
}

impl Collection {
    /// What its callers wait on.
    pub fn done(&self) -> Done {
        self.done.subscribe()
    }

    /// Waits for the answers of `asked` (node id, host) for `timeout` (on
    /// the runtime's clock), then publishes the groups. `unreachable`:
    /// hosts of the round that could not be asked.
    pub async fn run(
        mut self,
        desk: Arc<Desk>,
        round: u64,
        asked: Vec<(String, String)>,
        unreachable: Vec<String>,
        timeout: Duration,
    ) {
        let deadline = Instant::now() + timeout;
        let mut answers = Vec::with_capacity(asked.len());
        let mut heard = HashSet::with_capacity(asked.len());
        while heard.len() < asked.len() {
            match tokio::time::timeout_at(deadline, self.replies.recv()).await {
                Ok(Some(r)) => {
                    heard.insert(r.node_id);
                    answers.push(r.answer);
                }
                _ => break,
            }
        }
        let nodes = (asked.len() + unreachable.len()) as u32;
        let mut missing = unreachable;
        missing.extend(
            asked
                .iter()
                .filter(|(node, _)| !heard.contains(node))
                .map(|(_, host)| host.clone()),
        );
        missing.sort();
        let r = Arc::new(group(round, nodes, &answers, &missing));
        desk.publish(&self.job, self.id, r.clone());
        self.done.send_replace(Some(r));
    }
}

#[cfg(test)]
mod tests;
