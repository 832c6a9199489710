//! Bounds on everything a caller sends, checked before the state machine
//! sees it, and the escaping of text that is stored and printed.
//!
//! Every field of a request is untrusted: a `resume.nnodes` of 4 billion
//! must not allocate 4 billion placeholders, a megabyte host name must not be
//! stored, a failure message must not carry terminal escape sequences into
//! an operator's console. Each refusal names the limit, so a legitimate
//! caller that hits one knows what to change.

use std::time::Duration;

use accel_proto::v1 as pb;

use crate::error::Error;
use crate::job::QuarantineSettings;

/// Longest job id, node id, host name or store address, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest duration a request may ask for (keep-alive limit, last call):
/// the same ten years as any duration a person types.
pub use accel_input::MAX_DURATION;
use accel_wire::limits::{
    printable, printable_keeping, MAX_FAILURE_BYTES, MAX_REASON_BYTES, MAX_STACK_BYTES,
};
/// Most workers one node runs (and reports stacks of): a world is at most
/// PyTorch's 2^31 ranks, but one node's processes are bounded by its pids;
/// this bound only keeps a stacks report's list short.
pub const MAX_WORKERS_PER_NODE: usize = 4096;
/// Highest round a resuming node may report: far beyond any job's life (a
/// round takes at least the workers' start), far below where the round
/// counter could overflow.
pub const MAX_ROUND: u64 = u32::MAX as u64;
/// Largest request the server decodes (a failure report with its traceback
/// is the largest legitimate one).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// How much one server holds: refused beyond, with `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most jobs known at once (running, forming, or finished within the TTL).
    pub max_jobs: usize,
    /// Most nodes of one job, spares included.
    pub max_nodes_per_job: u32,
    /// Most connections one client address holds at once.
    pub max_connections_per_ip: u32,
    /// How long a new connection has to make its first authenticated call.
    pub auth_timeout: Duration,
    /// How long a finished job's tombstone is kept (zero: none is kept);
    /// see [`crate::tombstone`].
    pub tombstone_ttl: Duration,
    /// Most tombstones kept at once (the oldest go first).
    pub max_tombstones: usize,
    /// Which nodes a job keeps out of its rounds for a while
    /// (`--quarantine-after`; `None`: none).
    pub quarantine: Option<QuarantineSettings>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_jobs: 10_000,
            max_nodes_per_job: 100_000,
            max_connections_per_ip: 1024,
            auth_timeout: Duration::from_secs(30),
            tombstone_ttl: accel_wire::limits::DEFAULT_TOMBSTONE_TTL,
            max_tombstones: 10_000,
            quarantine: None,
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// A job id, node id or host name: present, at most [`MAX_NAME_BYTES`], and
/// free of control characters (they would corrupt logs and status output).
pub fn check_name(field: &'static str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(invalid(format!(
            "{field} has {} bytes; the limit is {MAX_NAME_BYTES}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} '{}' contains control characters",
            printable(value)
        )));
    }
    Ok(())
}

fn check_ms(field: &'static str, ms: u64) -> Result<(), Error> {
    if Duration::from_millis(ms) > MAX_DURATION {
        return Err(invalid(format!(
            "{field} is {ms} ms; the limit is 10 years"
        )));
    }
    Ok(())
}

/// Most bytes of a join's `silent_replica` ("host:port").
pub const MAX_ADDR_BYTES: usize = 256;

/// The replica a joining agent says went silent: empty, or a short
/// "host:port" without control characters.
pub fn check_silent_replica(value: &str) -> Result<(), Error> {
    if value.len() > MAX_ADDR_BYTES || value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "silent_replica must be at most {MAX_ADDR_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// A join request, against the server's `limits`.
pub fn check_join(req: &pb::JoinRequest, limits: &Limits) -> Result<(), Error> {
    check_name("job_id", &req.job_id)?;
    check_name("node_id", &req.node_id)?;
    check_silent_replica(&req.silent_replica)?;
    if req.hostname.len() > MAX_NAME_BYTES || req.hostname.chars().any(char::is_control) {
        return Err(invalid(format!(
            "hostname must be at most {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    accel_wire::topology::check(&req.topology).map_err(|e| invalid(format!("{e} (--topology)")))?;
    if req.min_nodes == 0 || req.min_nodes > req.max_nodes {
        return Err(invalid(format!(
            "nnodes {}:{} is invalid; need 0 < MIN <= MAX",
            req.min_nodes, req.max_nodes
        )));
    }
    if req.max_nodes > limits.max_nodes_per_job {
        return Err(Error::LimitReached(format!(
            "--nnodes {} is more than this server's --max-nodes-per-job {}",
            req.max_nodes, limits.max_nodes_per_job
        )));
    }
    if req.nproc_per_node == 0 {
        return Err(invalid("nproc_per_node must be at least 1".into()));
    }
    // Every rank of the largest round must be a rank PyTorch can hold (int32).
    let world = u64::from(req.max_nodes) * u64::from(req.nproc_per_node);
    if world > i32::MAX as u64 {
        return Err(invalid(format!(
            "nnodes {} x nproc_per_node {} is a world of {world} ranks, more than PyTorch's {}",
            req.max_nodes,
            req.nproc_per_node,
            i32::MAX
        )));
    }
    if let Some(rank) = req.node_rank {
        if rank >= req.max_nodes {
            return Err(invalid(format!(
                "node rank {rank} is out of range for {} nodes",
                req.max_nodes
            )));
        }
    }
    if req.nnodes_multiple_of > 1 {
        if req.node_rank.is_some() {
            return Err(invalid(
                "nnodes_multiple_of needs a dynamic rendezvous: a node with a fixed node rank cannot wait as a spare".into(),
            ));
        }
        let k = req.nnodes_multiple_of;
        if crate::job::JobConfig::from_join(req).needed() > req.max_nodes {
            return Err(invalid(format!(
                "nnodes {}..{} holds no multiple of nnodes_multiple_of {k}",
                req.min_nodes, req.max_nodes
            )));
        }
    }
    check_ms("dead_after_ms", req.dead_after_ms)?;
    check_ms("last_call_ms", req.last_call_ms)?;
    check_ms("outage_ms", req.outage_ms)?;
    check_ms("keep_alive_ms", req.keep_alive_ms)?;
    // A resume may make a restarted server relearn the job from it: it must
    // describe a round this job could have run.
    if let Some(r) = &req.resume {
        let fits = (req.min_nodes..=req.max_nodes).contains(&r.nnodes)
            && r.node_rank < r.nnodes
            && r.restart_count <= req.max_restarts;
        if !fits {
            return Err(invalid(format!(
                "resume names node rank {} of {} nodes after {} restarts, impossible for nnodes {}:{} and max_restarts {}",
                r.node_rank, r.nnodes, r.restart_count, req.min_nodes, req.max_nodes, req.max_restarts
            )));
        }
        if r.round > MAX_ROUND {
            return Err(invalid(format!(
                "resume names round {}, beyond any round a job reaches ({MAX_ROUND})",
                r.round
            )));
        }
    }
    Ok(())
}

/// The store endpoint a ready node offers.
pub fn check_ready(req: &pb::ReadyRequest) -> Result<(), Error> {
    if req.master_addr.len() > MAX_NAME_BYTES || req.master_addr.chars().any(char::is_control) {
        return Err(invalid(format!(
            "master_addr must be at most {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    if req.master_port > u32::from(u16::MAX) {
        return Err(invalid(format!(
            "master_port {} is not a TCP port",
            req.master_port
        )));
    }
    if req.round > MAX_ROUND {
        return Err(invalid(format!("round {} is out of range", req.round)));
    }
    Ok(())
}

/// A failure report: its text in total at most [`MAX_FAILURE_BYTES`].
pub fn check_failure(req: &pb::ReportFailureRequest) -> Result<(), Error> {
    let f = req.failure.as_ref();
    let total = req.reason.len()
        + f.map_or(0, |f| {
            f.host.len() + f.error_file.len() + f.message.len() + f.traceback.len()
        });
    if total > MAX_FAILURE_BYTES {
        return Err(invalid(format!(
            "the failure report carries {total} bytes of text; the limit is {MAX_FAILURE_BYTES} (shorten the message or traceback)"
        )));
    }
    // A "do not restart" code becomes every agent's exit status.
    if req.no_restart && !(1..=255).contains(&req.exit_code) {
        return Err(invalid(format!(
            "a no-restart failure must carry an exit code of 1..=255, not {}",
            req.exit_code
        )));
    }
    Ok(())
}

/// Most bytes of a keep-alive's vouch bitmap: one bit per node of a round
/// of the most nodes a job may have.
pub const MAX_VOUCH_BYTES: usize = 100_000 / 8;

/// A keep-alive's vouch: a bitmap of at most [`MAX_VOUCH_BYTES`], for a
/// round the server could have.
pub fn check_vouch(req: &pb::KeepAliveRequest) -> Result<(), Error> {
    if req.vouch.len() > MAX_VOUCH_BYTES {
        return Err(invalid(format!(
            "the keep-alive vouches with a {}-byte bitmap; the limit is {MAX_VOUCH_BYTES} (one bit per node of a round)",
            req.vouch.len()
        )));
    }
    if req.round > MAX_ROUND {
        return Err(invalid(format!(
            "the keep-alive names round {}; rounds go up to {MAX_ROUND}",
            req.round
        )));
    }
    Ok(())
}

/// A node's stacks report (`ReportStacks`).
pub fn check_stacks(req: &pb::ReportStacksRequest) -> Result<(), Error> {
    check_name("job_id", &req.job_id)?;
    check_name("node_id", &req.node_id)?;
    if req.workers.len() > MAX_WORKERS_PER_NODE {
        return Err(invalid(format!(
            "a stacks report lists at most {MAX_WORKERS_PER_NODE} workers, not {}",
            req.workers.len()
        )));
    }
    if let Some(w) = req.workers.iter().find(|w| w.stack.len() > MAX_STACK_BYTES) {
        return Err(invalid(format!(
            "rank {}'s stack is {} bytes, more than {MAX_STACK_BYTES}",
            w.rank,
            w.stack.len()
        )));
    }
    Ok(())
}

/// A leave reason.
pub fn check_reason(reason: &str) -> Result<(), Error> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(invalid(format!(
            "the reason has {} bytes; the limit is {MAX_REASON_BYTES}",
            reason.len()
        )));
    }
    Ok(())
}

/// A failure with its text made printable (the traceback keeps its lines).
pub fn printable_failure(f: &pb::Failure) -> pb::Failure {
    pb::Failure {
        host: printable(&f.host),
        error_file: printable(&f.error_file),
        message: printable_keeping(&f.message, true),
        traceback: printable_keeping(&f.traceback, true),
        ..f.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join() -> pb::JoinRequest {
        pb::JoinRequest {
            job_id: "j".into(),
            node_id: "n".into(),
            hostname: "h".into(),
            min_nodes: 2,
            max_nodes: 4,
            nproc_per_node: 8,
            max_restarts: 3,
            ..Default::default()
        }
    }

    fn refused(r: &pb::JoinRequest) -> String {
        check_join(r, &Limits::default())
            .expect_err("must be refused")
            .to_string()
    }

    #[test]
    fn a_multiple_of_k_needs_a_range_that_holds_one_and_no_fixed_rank() {
        let k = |min, max, k| pb::JoinRequest {
            min_nodes: min,
            max_nodes: max,
            nnodes_multiple_of: k,
            ..join()
        };
        assert!(check_join(&k(2, 4, 2), &Limits::default()).is_ok());
        assert!(refused(&k(3, 3, 2)).contains("holds no multiple"));
        assert!(refused(&k(1, 4, u32::MAX)).contains("holds no multiple"));
        let fixed = pb::JoinRequest {
            node_rank: Some(0),
            ..k(2, 4, 2)
        };
        assert!(refused(&fixed).contains("dynamic rendezvous"));
    }

    #[test]
    fn joins_are_bounded() {
        assert!(check_join(&join(), &Limits::default()).is_ok());
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(refused(&pb::JoinRequest {
            node_id: long.clone(),
            ..join()
        })
        .contains("256"));
        assert!(refused(&pb::JoinRequest {
            hostname: long,
            ..join()
        })
        .contains("256"));
        assert!(refused(&pb::JoinRequest {
            job_id: "a\u{1b}[2J".into(),
            ..join()
        })
        .contains("control"));
        let huge = pb::JoinRequest {
            max_nodes: 200_000,
            ..join()
        };
        assert!(refused(&huge).contains("--max-nodes-per-job 100000"));
        let ranks = pb::JoinRequest {
            max_nodes: 70_000,
            nproc_per_node: 70_000,
            ..join()
        };
        assert!(refused(&ranks).contains("more than PyTorch's"));
        let forever = pb::JoinRequest {
            dead_after_ms: u64::MAX,
            ..join()
        };
        assert!(refused(&forever).contains("10 years"));
        let resume = |nnodes, node_rank, round| pb::JoinRequest {
            resume: Some(pb::Resume {
                round,
                restart_count: 0,
                node_rank,
                nnodes,
            }),
            ..join()
        };
        assert!(check_join(&resume(4, 3, 9), &Limits::default()).is_ok());
        assert!(refused(&resume(u32::MAX, 0, 1)).contains("resume"));
        assert!(refused(&resume(4, 4, 1)).contains("resume"));
        assert!(refused(&resume(2, 0, u64::MAX)).contains("round"));
    }

    #[test]
    fn failure_text_is_bounded_and_made_printable() {
        let bell = "\u{7}".repeat(MAX_FAILURE_BYTES);
        assert!(
            printable(&bell).len() <= MAX_FAILURE_BYTES + 16,
            "escaping is bounded too"
        );
        let big = pb::ReportFailureRequest {
            failure: Some(pb::Failure {
                traceback: "t".repeat(MAX_FAILURE_BYTES),
                ..Default::default()
            }),
            reason: "exited 1".into(),
            ..Default::default()
        };
        assert!(check_failure(&big).is_err());
        assert_eq!(printable("a\u{1b}[31mred\nx"), "a\\u{1b}[31mred\\nx");
        assert_eq!(
            printable_keeping("line1\nline2\u{7}", true),
            "line1\nline2\\u{7}"
        );
    }
}
