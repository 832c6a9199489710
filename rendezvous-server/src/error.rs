//! The server's errors and their one mapping to gRPC status codes.

use tonic::{Code, Status};

use crate::job::JoinRefused;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A malformed request.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The node cannot join the job.
    #[error(transparent)]
    Join(#[from] JoinRefused),
    /// No job with this id.
    #[error("no job '{0}' on this rendezvous server; join it first")]
    UnknownJob(String),
    /// The agent is of another release line than the server
    /// ([`crate::version`]).
    #[error("{0}")]
    Incompatible(String),
    /// A release of a host that is not quarantined.
    #[error("host '{0}' is not quarantined there; `rdzv-server quarantine list` shows the hosts that are")]
    NotQuarantined(String),
    /// A node resumes a job the store does not hold, and the registry
    /// relearns nothing ([`crate::Registry::without_relearning`]).
    #[error("job '{0}' is not in the rendezvous's store: it ended while this node was cut off, longer ago than its outcome is kept (tombstone_ttl; the other nodes' logs have it), or it never got that far")]
    JobGone(String),
    /// The job is over (its tombstone says so) and this node took no part in it.
    #[error("job '{job}' already {outcome} at {at}, and this agent, started before it ended, took no part in it; to run it again, start the agents again (an agent started after the end starts a new run of the id), or use another --rdzv-id (this one refuses late agents until {until})")]
    Over {
        /// The job id.
        job: String,
        /// `succeeded` or `failed`.
        outcome: &'static str,
        /// When it finished, UTC.
        at: String,
        /// When its tombstone expires, UTC.
        until: String,
    },
    /// The node is not a member of the job.
    #[error("node '{1}' is not a member of job '{0}'; join it first")]
    UnknownNode(String, String),
    /// The call does not carry the node's session secret.
    #[error("this request does not carry the session secret of node '{1}' in job '{0}'; a node can act only for itself")]
    WrongSession(String, String),
    /// A server limit would be exceeded.
    #[error("{0}")]
    LimitReached(String),
    /// The listener failed.
    #[error("serving the rendezvous failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The job store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The server is closing its jobs (shutting down, or no longer leading).
    #[error("the rendezvous server is shutting down; retry, or reach another replica")]
    ShuttingDown,
    /// The job store refused the last write: no new job or member is
    /// admitted until it takes one (what waits to be written stays bounded).
    #[error("the rendezvous cannot write job state to its store ({0}); it admits no new node until it can; retrying")]
    Unwritable(String),
    /// This replica led, but its etcd lease may have lapsed (it was paused
    /// or cut off): it serves nothing more ([`crate::lease`]).
    #[error("{}", crate::registry::NOT_LEADING)]
    NotLeading,
    /// This replica does not lead: the status names the leader.
    #[error("{}", .0.message())]
    Redirect(Status),
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        if let Error::Redirect(status) = e {
            return status;
        }
        let code = match &e {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Join(JoinRefused::WrongSession { .. }) => Code::PermissionDenied,
            Error::Join(_) | Error::Over { .. } | Error::Incompatible(_) => {
                Code::FailedPrecondition
            }
            Error::UnknownJob(_)
            | Error::NotQuarantined(_)
            | Error::JobGone(_)
            | Error::UnknownNode(..) => Code::NotFound,
            Error::WrongSession(..) => Code::PermissionDenied,
            Error::LimitReached(_) => Code::ResourceExhausted,
            Error::Transport(_)
            | Error::Store(_)
            | Error::Unwritable(_)
            | Error::Redirect(_)
            | Error::NotLeading
            | Error::ShuttingDown => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}
