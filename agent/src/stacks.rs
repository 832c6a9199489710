//! Workers' Python stacks, from `py-spy dump`: for the rendezvous's
//! job-wide collection (`rdzv-server stacks`, the status page, a hang) and
//! for a hung worker's own error file.
//!
//! The server asks each node of the running round with `StacksRequested`
//! down its session stream; the node's link answers by itself
//! ([`answer`]): it changes nothing about the node's rounds, so the state
//! machine never sees it. Each worker is dumped on its own `py-spy`, all at
//! once, within the time the request gives; a worker py-spy cannot read
//! is reported with why, so the answer always names every worker.
//!
//! A worker whose FileTimer expires is dumped through the same collection
//! ([`JobStacks`]): its agent asks the server for the whole job's stacks
//! before it stops the worker, so the failure report says where every rank
//! was, not only the hung one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use accel_proto::v1 as pb;
use accel_rdzv_client::client::RdzvClient;
use accel_wire::limits::{truncated, MAX_STACKS_REPORT_BYTES, MAX_STACK_BYTES};
use tracing::{debug, warn};

use crate::file_timer::{Watched, Workers};

/// The longest a server may ask a node to spend on its stacks.
const MAX_BUDGET: Duration = Duration::from_secs(60);

/// The workers a `py-spy` is reading now: a second one would find the
/// process paused by the first, and the two could leave it stopped.
static DUMPING: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Holds `pid` in [`DUMPING`] while it lives.
struct Dumping(i32);

impl Dumping {
    fn take(pid: i32) -> Option<Self> {
        let mut d = DUMPING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if d.contains(&pid) {
            return None;
        }
        d.push(pid);
        Some(Self(pid))
    }
}

impl Drop for Dumping {
    fn drop(&mut self) {
        DUMPING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|p| *p != self.0);
    }
}

/// The Python stacks of `pid` from `py-spy dump` (`native`: C/C++ frames
/// too), or why there are none, within `timeout`. One `py-spy` at a time
/// per process.
pub async fn dump(pid: i32, native: bool, timeout: Duration) -> String {
    let Some(_dumping) = Dumping::take(pid) else {
        return "(no stacks: another py-spy is reading this worker now)".into();
    };
    let Some(py_spy) = crate::probe::program("py-spy") else {
        return "(no stacks: py-spy is not installed; `pip install py-spy` on the nodes to see where a hung worker is)".into();
    };
    let mut cmd = tokio::process::Command::new(&py_spy);
    cmd.args(["dump", "--pid", &pid.to_string()]);
    if native {
        cmd.arg("--native");
    }
    let run = cmd
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            truncated(&text, MAX_STACK_BYTES).to_owned()
        }
        Ok(Ok(out)) => format!(
            "(no stacks: {} failed: {})",
            py_spy.display(),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .chars()
                .take(2000)
                .collect::<String>()
        ),
        Ok(Err(e)) => format!("(no stacks: cannot run {}: {e})", py_spy.display()),
        Err(_) => format!(
            "(no stacks: py-spy did not answer within {:.1} s)",
            timeout.as_secs_f64()
        ),
    }
}

/// Every running worker's stacks, dumped at once within `budget`, each cut
/// to its share of one report.
pub async fn dump_all(workers: &[Watched], native: bool, budget: Duration) -> Vec<pb::WorkerStack> {
    let share = (MAX_STACKS_REPORT_BYTES / workers.len().max(1)).min(MAX_STACK_BYTES);
    let dumps = workers.iter().map(|w| {
        let (pid, rank, local_rank) = (w.pid, w.rank, w.local_rank);
        async move {
            let stack = dump(pid, native, budget).await;
            pb::WorkerStack {
                rank,
                local_rank,
                pid: u32::try_from(pid).unwrap_or_default(),
                stack: truncated(&stack, share).to_owned(),
            }
        }
    });
    futures_join_all(dumps).await
}

/// Runs `futures` at once, their results in order (tokio has no `join_all`).
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

/// Answers the server's request with this node's running workers' stacks
/// (best effort: a collection that gets no answer names the node).
pub async fn answer(mut client: RdzvClient, req: pb::StacksRequested, workers: Workers) {
    let running: Vec<Watched> = workers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let budget = Duration::from_millis(req.timeout_ms.into()).min(MAX_BUDGET);
    debug!(
        request = req.request_id,
        workers = running.len(),
        "the rendezvous asked for this node's stacks"
    );
    let stacks = dump_all(&running, req.native, budget).await;
    if let Err(s) = client.report_stacks(req.request_id, stacks).await {
        warn!(code = ?s.code(), error = %s.message(), "could not send this node's stacks to the rendezvous");
    }
}

/// How the agent asks for its whole job's stacks: the client of its
/// current link, once it has joined.
#[derive(Debug, Clone, Default)]
pub struct JobStacks(Arc<Mutex<Option<RdzvClient>>>);

impl JobStacks {
    /// The link now serving the node.
    pub(crate) fn serve(&self, client: RdzvClient) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(client);
    }

    /// The job's stacks, grouped, asked of the rendezvous; the nodes get at
    /// most `timeout`.
    /// Returns the job's id with them.
    pub async fn collect(&self, timeout: Duration) -> Result<(String, pb::StacksResponse), String> {
        let client = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(mut client) = client else {
            return Err("this node has not joined a rendezvous".into());
        };
        let job = client.job_id().to_owned();
        // The call's deadline is the server's to keep: this one is ours.
        let limit = timeout + Duration::from_secs(2);
        match tokio::time::timeout(limit, client.job_stacks(timeout)).await {
            Ok(Ok(r)) => Ok((job, r)),
            Ok(Err(s)) => Err(format!(
                "the rendezvous answered {:?}: {}",
                s.code(),
                s.message()
            )),
            Err(_) => Err(format!(
                "the rendezvous did not answer within {} s",
                limit.as_secs()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_py_spy_at_a_time_per_process() {
        let first = Dumping::take(424_242).expect("free");
        assert!(Dumping::take(424_242).is_none(), "taken");
        assert!(Dumping::take(424_243).is_some(), "another process");
        drop(first);
        assert!(Dumping::take(424_242).is_some(), "free again");
    }

    #[tokio::test]
    async fn a_worker_being_read_is_not_read_twice() {
        let _held = Dumping::take(424_244).expect("free");
        let got = dump(424_244, false, Duration::from_secs(1)).await;
        assert!(got.contains("another py-spy is reading"), "{got}");
    }
}
