//! The agent's errors and outcomes, and how they map to exit codes.

use nix::sys::signal::Signal;

impl From<accel_rdzv_client::JoinError> for AgentError {
    fn from(e: accel_rdzv_client::JoinError) -> Self {
        use accel_rdzv_client::JoinError;
        match e {
            JoinError::Config(m) => AgentError::Config(m),
            JoinError::Rejected { code, message } => AgentError::Rejected { code, message },
            JoinError::Tls(m) => AgentError::Tls(m),
            JoinError::Timeout(m) => AgentError::JoinTimeout(m),
            // `JoinError` is non-exhaustive: a new kind is a setting's until mapped.
            other => AgentError::Config(other.to_string()),
        }
    }
}

/// Why the agent could not run the job to an outcome.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A bad flag or value (exit code 2).
    #[error("{0}")]
    Config(String),
    /// The rendezvous refused this node, e.g. its settings disagree with the
    /// job's or the token is wrong (exit code 2). `code` is the server's gRPC
    /// status code, so callers can tell a refusal of the job's settings
    /// (`InvalidArgument`, `FailedPrecondition`) from one of credentials
    /// (`Unauthenticated`, `PermissionDenied`).
    #[error("the rendezvous refused this node: {message}")]
    Rejected {
        /// The server's status code.
        code: tonic::Code,
        /// The server's explanation.
        message: String,
    },
    /// TLS with the rendezvous failed: a certificate this side or the other
    /// refuses (exit code 2).
    #[error("the rendezvous refused this node: {0}")]
    Tls(String),
    /// A round did not form in time.
    #[error("rendezvous timed out: {0}")]
    JoinTimeout(String),
    /// The rendezvous refused a joined node's offer to run a round. `code`
    /// is the server's gRPC status code (`NotFound` for a job or session it
    /// no longer knows, `Unavailable` from a replica that is not the leader,
    /// ...).
    #[error("the rendezvous did not accept this node as ready for round {round}: {message}")]
    NotReady {
        /// The round offered.
        round: u64,
        /// The server's status code.
        code: tonic::Code,
        /// The server's explanation.
        message: String,
    },
    /// The rendezvous ended the job (an operator closed it, or another node
    /// spent the job's restart budget while this one was away).
    #[error("the rendezvous closed the job: {reason}")]
    JobClosed {
        /// The server's reason.
        reason: String,
    },
    /// The link to the rendezvous broke and rejoining failed within
    /// `reconnect_grace`; `source` is why the last rejoin failed.
    #[error(
        "lost the rendezvous ({why}) and could not rejoin within {:.0} s (reconnect_grace, or outage_timeout for a node without workers; {source}); this node stopped its workers",
        grace.as_secs_f64()
    )]
    GaveUp {
        /// How the link broke.
        why: String,
        /// The grace that ran out.
        grace: std::time::Duration,
        /// Why the last rejoin failed.
        #[source]
        source: Box<AgentError>,
    },
    /// A local operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl AgentError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_) | AgentError::Rejected { .. } | AgentError::Tls(_) => 2,
            _ => 1,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        AgentError::Io {
            context: context.into(),
            source,
        }
    }
}

/// How a job ended for this agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every worker on every node succeeded.
    Succeeded,
    /// The job failed (restart budget spent).
    Failed(String),
    /// A worker exited with the code that means "do not restart"
    /// (`--no-restart-exit-code` on its node): the job failed at once, and
    /// every agent exits with that code.
    NoRestart {
        /// Why, as the rendezvous says.
        reason: String,
        /// The worker's exit code, 1..=255.
        code: u8,
    },
    /// The agent was stopped by this signal.
    Signaled(Signal),
}

impl Outcome {
    /// Exit code: 0, 1, the "do not restart" code, or `128 + signo`.
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Succeeded => 0,
            Outcome::Failed(_) => 1,
            Outcome::NoRestart { code, .. } => *code,
            Outcome::Signaled(s) => 128u8.saturating_add(*s as u8),
        }
    }

    /// How a job that `JobFailed` ended ends for this agent: with the
    /// "do not restart" code it carries (when it is an exit status), else 1.
    pub fn failed(f: &accel_proto::v1::JobFailed) -> Self {
        match f
            .exit_code
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c > 0)
        {
            Some(code) => Outcome::NoRestart {
                reason: f.reason.clone(),
                code,
            },
            None => Outcome::Failed(f.reason.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use accel_rdzv_client::JoinError;

    #[test]
    fn a_join_error_keeps_its_kind_and_exit_code() {
        let refused = AgentError::from(JoinError::Rejected {
            code: tonic::Code::FailedPrecondition,
            message: "nnodes differ".into(),
        });
        assert!(matches!(
            refused,
            AgentError::Rejected {
                code: tonic::Code::FailedPrecondition,
                ..
            }
        ));
        assert_eq!(refused.exit_code(), 2);
        assert_eq!(
            AgentError::from(JoinError::Config("x".into())).exit_code(),
            2
        );
        assert_eq!(AgentError::from(JoinError::Tls("x".into())).exit_code(), 2);
        let late = AgentError::from(JoinError::Timeout("no replica".into()));
        assert!(matches!(late, AgentError::JoinTimeout(_)));
        assert_eq!(late.exit_code(), 1);
        assert_eq!(late.to_string(), "rendezvous timed out: no replica");
    }
}
