//! What can go wrong talking to etcd, sorted the way callers decide on it.
//!
//! The one decision every caller makes is whether to try again: an answer
//! that never came (the member is down, the connection broke) or a member
//! that cannot serve right now (`UNAVAILABLE`, e.g. it lost its leader) is
//! another member's to answer ([`Error::is_transient`]); anything etcd
//! decided (a permission, a compacted revision, a bad request) is final.

use tonic::{Code, Status};

/// An etcd client error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// etcd answered the call with this status.
    #[error("etcd refused the call: {}: {}", .0.code(), .0.message())]
    Status(Status),
    /// No answer came from the member: the connection could not be made or
    /// broke (the status is tonic's account of it).
    #[error("no answer from etcd at {endpoint}: {}", causes(.status.message(), std::error::Error::source(.status)))]
    Transport {
        /// The member's URL.
        endpoint: String,
        /// What the transport reported.
        #[source]
        status: Status,
    },
    /// None of the endpoints accepted a connection.
    #[error("cannot connect to any etcd endpoint ({endpoints}): {}", causes(&source.to_string(), std::error::Error::source(source)))]
    Connect {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The last endpoint's failure.
        #[source]
        source: tonic::transport::Error,
    },
    /// The client was given no endpoints.
    #[error("no etcd endpoints given; pass at least one URL such as http://127.0.0.1:2379")]
    NoEndpoints,
    /// An endpoint is not a usable URL.
    #[error("etcd endpoint '{endpoint}' is not a URL like http://HOST:PORT or https://HOST:PORT: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is refused.
        reason: String,
    },
    /// etcd's authentication token cannot be sent as gRPC metadata.
    #[error("etcd returned an authentication token that is not ASCII metadata")]
    InvalidToken,
    /// etcd ended a watch, or never confirmed it.
    #[error("etcd ended the watch: {0}")]
    WatchCanceled(String),
    /// A stream's sending half is gone (the stream ended).
    #[error("the etcd {0} stream has ended")]
    StreamClosed(&'static str),
}

/// `first`, then each cause under it (tonic's own messages are terse:
/// "transport error"; the reason, e.g. "Connection refused" or a
/// certificate problem, is further down), skipping repeats.
fn causes(first: &str, mut cause: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut text = first.to_owned();
    let mut last = first.to_owned();
    while let Some(e) = cause {
        let message = e.to_string();
        if !message.is_empty() && !last.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        last = message;
        cause = e.source();
    }
    text
}

impl Error {
    /// Whether etcd answered that what the call names does not exist (its
    /// `NotFound` status: a lease revoked or expired already, for a lease
    /// call). Told by the status code, not the message's words.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Status(s) if s.code() == tonic::Code::NotFound)
    }

    /// Classifies a status a call ended with: etcd's own answer, or the
    /// transport's account of a call that got none (tonic then keeps the
    /// underlying error as the status's source).
    pub(crate) fn from_call(endpoint: &str, status: Status) -> Self {
        if std::error::Error::source(&status).is_some() {
            Error::Transport {
                endpoint: endpoint.to_owned(),
                status,
            }
        } else {
            Error::Status(status)
        }
    }

    /// Whether another attempt (possibly at another member) may succeed:
    /// no answer came (or no member took the connection), or the member
    /// answered `UNAVAILABLE`.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::Connect { .. } => true,
            Error::Status(s) => s.code() == Code::Unavailable,
            _ => false,
        }
    }

    /// The status of a call that etcd answered, if this is one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::Status(s) => Some(s),
            _ => None,
        }
    }
}

/// etcd's message for a token it no longer accepts (expired, or issued
/// before a restart with simple tokens).
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
/// etcd's message when the token was issued before the auth store changed.
const OLD_AUTH_REVISION: &str = "etcdserver: revision of auth store is old";

/// Whether a call refused with `status` should be sent again after
/// authenticating anew. Only with credentials to authenticate with; etcd
/// says so with `UNAUTHENTICATED`, or, from the election service (which
/// relays etcd's errors through an internal client), with its message
/// under `UNKNOWN`; a token made stale by a change of users or roles is
/// `INVALID_ARGUMENT` with its own message.
pub(crate) fn must_reauthenticate(status: &Status, has_credentials: bool) -> bool {
    has_credentials
        && match status.code() {
            Code::Unauthenticated => true,
            Code::Unknown => status.message() == INVALID_TOKEN,
            Code::InvalidArgument => status.message() == OLD_AUTH_REVISION,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport_status() -> Status {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        Status::from_error(Box::new(io))
    }

    #[test]
    fn not_found_is_told_by_the_status_code() {
        let gone = Error::from_call(
            "http://m1:2379",
            Status::not_found("etcdserver: requested lease not found"),
        );
        assert!(gone.is_not_found(), "{gone:?}");
        // The same words under another code are not it.
        let other = Error::from_call("http://m1:2379", Status::unknown("lease not found"));
        assert!(!other.is_not_found());
        assert!(!Error::from_call("http://m1:2379", transport_status()).is_not_found());
    }

    #[test]
    fn a_status_from_the_transport_is_transient_and_names_the_endpoint() {
        let e = Error::from_call("http://m1:2379", transport_status());
        assert!(matches!(e, Error::Transport { .. }), "{e:?}");
        assert!(e.is_transient());
        assert!(e.to_string().contains("http://m1:2379"), "{e}");
        // The cause under tonic's words is named.
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(e.status().is_none());
    }

    #[test]
    fn etcds_own_answers_are_final_unless_unavailable() {
        let no_leader = Error::from_call("e", Status::unavailable("etcdserver: no leader"));
        assert!(matches!(no_leader, Error::Status(_)));
        assert!(no_leader.is_transient());
        for status in [
            Status::permission_denied("etcdserver: permission denied"),
            Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
            Status::unknown("election: not leader"),
        ] {
            let e = Error::from_call("e", status);
            assert!(!e.is_transient(), "{e:?}");
            assert!(e.status().is_some());
        }
        assert!(!Error::NoEndpoints.is_transient());
        assert!(!Error::WatchCanceled("compacted".into()).is_transient());
    }

    #[test]
    fn a_refused_token_is_renewed_only_with_credentials() {
        let expired = Status::unauthenticated(INVALID_TOKEN);
        assert!(must_reauthenticate(&expired, true));
        assert!(!must_reauthenticate(&expired, false));
        // The election service relays it as UNKNOWN.
        assert!(must_reauthenticate(&Status::unknown(INVALID_TOKEN), true));
        assert!(!must_reauthenticate(
            &Status::unknown("election: session expired"),
            true
        ));
        assert!(must_reauthenticate(
            &Status::invalid_argument(OLD_AUTH_REVISION),
            true
        ));
        assert!(!must_reauthenticate(
            &Status::invalid_argument("etcdserver: key is not provided"),
            true
        ));
        assert!(!must_reauthenticate(
            &Status::permission_denied("etcdserver: permission denied"),
            true
        ));
    }
}
