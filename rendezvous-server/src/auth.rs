//! Who may talk to the rendezvous: the shared token every call carries, and
//! the per-node session secrets handed out at join.
//!
//! PyTorch's own rendezvous has no credentials: anyone who reaches its port
//! can join a job, take node rank 0 and point every worker's `MASTER_ADDR`
//! at itself. Here a server with a token refuses every call that does not
//! carry `authorization: Bearer <token>` (`UNAUTHENTICATED`), before any
//! handler runs. The token is compared in constant time and never logged
//! (`Token`'s `Debug` hides it). The gRPC health service stays open: it tells
//! a probe only whether the server serves.
//!
//! The token itself and the client's side (`AttachToken`) live in
//! `accel-rdzv-client`, which both the agent and this server use; this module
//! re-exports them next to the server's check.

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::job::{Session, SESSION_BYTES};

use accel_wire::auth::{Token, AUTHORIZATION};

/// The server's check of every call: with a token, calls without it are
/// `UNAUTHENTICATED`; without one, every call passes.
#[derive(Debug, Clone, Default)]
pub struct RequireToken(Option<Token>);

impl RequireToken {
    /// Checks calls against `token` (none: admit all).
    pub fn new(token: Option<Token>) -> Self {
        Self(token)
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let admitted = match &self.0 {
            None => true,
            Some(t) => t.admits(request.metadata().get(AUTHORIZATION)),
        };
        if admitted {
            // The connection proved itself: it is kept (see `admission`).
            if let Some(conn) = crate::admission::ConnInfo::of(&request) {
                conn.prove();
            }
            return Ok(request);
        }
        // Each client says how *it* takes the token (an agent, `rdzv-server
        // status`, a notebook): see `accel_wire::auth::GIVE_AGENT_TOKEN`.
        Err(Status::unauthenticated(UNAUTHENTICATED))
    }
}

/// What a call without the server's token is told.
pub const UNAUTHENTICATED: &str =
    "this rendezvous requires its token (the one rdzv-server has from --token-file or RDZV_TOKEN)";

/// A new random session secret, from the operating system's random source.
pub fn new_session() -> Result<Session, Status> {
    let mut bytes = [0u8; SESSION_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| Status::internal(format!("no randomness for a session secret: {e}")))?;
    Ok(Session::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use accel_wire::auth::AttachToken;

    const T: &str = "0123456789abcdef0123";

    #[test]
    fn the_interceptor_admits_only_the_token() {
        let t = Token::new(T, "test").expect("valid");
        let mut check = RequireToken::new(Some(t.clone()));
        let mut attach = AttachToken::new(Some(&t));
        let signed = attach.call(Request::new(())).expect("attach");
        assert!(check.call(signed).is_ok());
        let status = check.call(Request::new(())).expect_err("no token");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let other = Token::new("another-token-of-enough-length", "t").expect("valid");
        let wrong = AttachToken::new(Some(&other))
            .call(Request::new(()))
            .expect("attach");
        assert!(check.call(wrong).is_err());
        assert!(RequireToken::new(None).call(Request::new(())).is_ok());
    }
}
