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
//! # Scopes
//! One shared token is readable by every training process on every node
//! (they run as the agent's user), so training code could join other
//! forming jobs, collect any job's stacks or release a quarantined host.
//! An operator who sets an operate token (and a read token for dashboards)
//! splits that: the agents' token then only joins ([`Tokens`]); each
//! handler requires its [`Scope`] (`PERMISSION_DENIED` names the token it
//! needs). Every token file may hold a current and a next token while it
//! rotates, and is re-read as it changes (`accel_wire::accepted`).
//!
//! The token itself and the client's side (`AttachToken`) live in
//! `accel-wire`, which both the agent and this server use.

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::job::{Session, SESSION_BYTES};

use accel_wire::accepted::Accepted;
use accel_wire::auth::AUTHORIZATION;

/// What a call does, as far as who may make it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// An agent's calls for its node: join, ready, keep-alive, reports,
    /// leave.
    Join,
    /// Reading the jobs: `JobStatus`, the quarantine list, the status page.
    Read,
    /// Acting on jobs an operator watches: collecting stacks, releasing a
    /// quarantined host.
    Operate,
}

/// What a caller's token lets it do (see [`Tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    join: bool,
    read: bool,
    operate: bool,
}

impl Granted {
    /// Everything: a server without a token.
    pub const ALL: Self = Self {
        join: true,
        read: true,
        operate: true,
    };

    /// Whether `scope` is granted.
    pub fn allows(self, scope: Scope) -> bool {
        match scope {
            Scope::Join => self.join,
            Scope::Read => self.read,
            Scope::Operate => self.operate,
        }
    }

    /// Refuses a call of `scope` this grant does not allow, saying which
    /// token it needs.
    pub fn require(self, scope: Scope) -> Result<(), Status> {
        if self.allows(scope) {
            return Ok(());
        }
        Err(Status::permission_denied(match scope {
            Scope::Join => "this call is an agent's: it needs the agents' token (rdzv-server --token-file); the token presented may only read or operate",
            Scope::Read => "the agents' token may not read the jobs on this server: use its read token (--read-token-file) or operate token (--operate-token-file)",
            Scope::Operate => "collecting stacks and releasing a quarantined host need this server's operate token (--operate-token-file); the token presented may only join or read",
        }))
    }
}

/// The server's tokens, by who holds them. Each is a file re-read as it
/// rotates ([`Accepted`]).
///
/// - `agents` (`--token-file`): the agents' calls for their nodes; while no
///   operate token is set it also reads and operates, as one shared token
///   always did.
/// - `read` (`--read-token-file`): reading the jobs (dashboards, `status`).
/// - `operate` (`--operate-token-file`): reading, collecting stacks and
///   releasing quarantined hosts. Once it is set, the agents' token, which
///   training code on every node can read, no longer does either.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    agents: Option<Accepted>,
    read: Option<Accepted>,
    operate: Option<Accepted>,
}

impl Tokens {
    /// Only the agents' token (`None`: a server open to every caller).
    pub fn agents(agents: Option<Accepted>) -> Self {
        Self {
            agents,
            ..Self::default()
        }
    }

    /// With `read` as the read token.
    pub fn with_read(mut self, read: Option<Accepted>) -> Self {
        self.read = read;
        self
    }

    /// With `operate` as the operate token.
    pub fn with_operate(mut self, operate: Option<Accepted>) -> Self {
        self.operate = operate;
        self
    }

    /// Whether the server requires a token at all.
    pub fn required(&self) -> bool {
        self.agents.is_some() || self.read.is_some() || self.operate.is_some()
    }

    /// What an `authorization` value (raw bytes) grants; `None` when it
    /// carries none of the server's tokens (or none at all). Every token is
    /// compared, so the time taken does not say which one matched.
    pub fn grants(&self, authorization: Option<&[u8]>) -> Option<Granted> {
        if !self.required() {
            return Some(Granted::ALL);
        }
        let matches =
            |t: &Option<Accepted>| t.as_ref().is_some_and(|t| t.admits_bytes(authorization));
        let (agent, reader, operator) = (
            matches(&self.agents),
            matches(&self.read),
            matches(&self.operate),
        );
        let shared = agent && self.operate.is_none();
        let g = Granted {
            join: agent,
            read: reader || operator || shared,
            operate: operator || shared,
        };
        (g != Granted::default()).then_some(g)
    }
}

/// The server's check of every call: with a token, calls without one of
/// the server's are `UNAUTHENTICATED`; without any, every call passes. What
/// the token grants travels with the request ([`Granted`], an extension),
/// and each handler requires its [`Scope`].
#[derive(Debug, Clone, Default)]
pub struct RequireToken(Tokens);

impl RequireToken {
    /// Checks calls against `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        Self(tokens)
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get(AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        match self.0.grants(header.as_deref()) {
            Some(granted) => {
                // The connection proved itself: it is kept (see `admission`).
                if let Some(conn) = crate::admission::ConnInfo::of(&request) {
                    conn.prove();
                }
                request.extensions_mut().insert(granted);
                Ok(request)
            }
            // Each client says how *it* takes the token (an agent,
            // `rdzv-server status`, a notebook).
            None => Err(Status::unauthenticated(UNAUTHENTICATED)),
        }
    }
}

/// Refuses a call whose token does not allow `scope`. A request that went
/// through no [`RequireToken`] (a server without tokens, a test's direct
/// call) carries no grant and is allowed.
pub fn require<T>(request: &Request<T>, scope: Scope) -> Result<(), Status> {
    request
        .extensions()
        .get::<Granted>()
        .map_or(Ok(()), |g| g.require(scope))
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
    use accel_wire::auth::{AttachToken, Token};

    const T: &str = "0123456789abcdef0123";

    #[test]
    fn the_interceptor_admits_only_the_token() {
        let t = Token::new(T, "test").expect("valid");
        let mut check = RequireToken::new(Tokens::agents(Some(Accepted::fixed(t.clone()))));
        let mut attach = AttachToken::new(Some(&t));
        let signed = attach.call(Request::new(())).expect("attach");
        let admitted = check.call(signed).expect("admitted");
        assert_eq!(
            admitted.extensions().get(),
            Some(&Granted::ALL),
            "one shared token"
        );
        let status = check.call(Request::new(())).expect_err("no token");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let other = Token::new("another-token-of-enough-length", "t").expect("valid");
        let wrong = AttachToken::new(Some(&other))
            .call(Request::new(()))
            .expect("attach");
        assert!(check.call(wrong).is_err());
        assert!(RequireToken::new(Tokens::default())
            .call(Request::new(()))
            .is_ok());
    }

    #[test]
    fn an_operate_token_takes_reading_and_operating_from_the_agents_token() {
        let token = |s: &str| Accepted::fixed(Token::new(s, "test").expect("valid"));
        let bearer = |s: &str| format!("Bearer {s}").into_bytes();
        let (agents, reader, operator) = (
            "agents-token-0123456789",
            "reader-token-0123456789",
            "operator-token-0123456789",
        );
        let tokens = Tokens::agents(Some(token(agents)))
            .with_read(Some(token(reader)))
            .with_operate(Some(token(operator)));
        let grant = |s: &str| tokens.grants(Some(&bearer(s)));
        let agent = grant(agents).expect("an agent");
        assert!(agent.allows(Scope::Join));
        assert!(!agent.allows(Scope::Read) && !agent.allows(Scope::Operate));
        let e = agent.require(Scope::Operate).expect_err("no stacks");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message().contains("--operate-token-file"),
            "{}",
            e.message()
        );
        let read = grant(reader).expect("a reader");
        assert!(
            read.allows(Scope::Read) && !read.allows(Scope::Join) && !read.allows(Scope::Operate)
        );
        let op = grant(operator).expect("an operator");
        assert!(op.allows(Scope::Read) && op.allows(Scope::Operate) && !op.allows(Scope::Join));
        assert_eq!(grant("someone-else-0123456789"), None);
        assert_eq!(tokens.grants(None), None);
        // Without an operate token, the agents' token does everything.
        let shared = Tokens::agents(Some(token(agents))).with_read(Some(token(reader)));
        assert_eq!(shared.grants(Some(&bearer(agents))), Some(Granted::ALL));
        // A request that went through no check carries no grant.
        assert!(require(&Request::new(()), Scope::Operate).is_ok());
        let mut r = Request::new(());
        r.extensions_mut().insert(agent);
        assert!(require(&r, Scope::Join).is_ok());
        assert!(require(&r, Scope::Read).is_err());
    }
}
