//! The status page: what `rdzv-server status` prints, as a page that
//! refreshes by itself, served on the metrics listener (`--metrics-bind`).
//!
//! # Why
//! When a job stalls an operator should look, not read 64 agents' logs.
//! The server already knows every job, round, node, spare, restart and
//! last failure; the page shows them, and `GET /api/jobs` gives the same
//! document as `rdzv-server status --json` to scripts.
//!
//! # What is served
//! - `/` : the page (`ui/index.html`, `ui/app.js`, `ui/app.css`, compiled
//!   into the binary: no build step, nothing fetched from elsewhere). It
//!   holds no data, so it is served to anyone; a strict content security
//!   policy allows only its own script and style, and no framing.
//! - `/api/jobs`: the jobs (the first [`STATUS_PAGE`]'s worth), as JSON.
//! - `/api/stacks?job=ID`: `POST` begins collecting the job's stacks
//!   ([`crate::stacks`]; it needs the header `X-Accel-Request: stacks`,
//!   which a cross-site form cannot send), `GET` gives the last answer
//!   (202 while one is collected, 404 when none is kept).
//!
//! # Who may read the jobs
//! The data is what `JobStatus` gives, so it is guarded the same way: a
//! caller must present the rendezvous token (`Authorization: Bearer ...`;
//! the page asks for it once and keeps it in the tab's session storage),
//! unless the server has no token (then the gRPC port is open too) or the
//! caller is on this host (loopback: an SSH or `kubectl port-forward`
//! tunnel). A caller on this host must name it (`localhost` or an address)
//! in its `Host` header, token or not: a browser page of another site that
//! re-points its own name at 127.0.0.1 (DNS rebinding) names that site. No secrets are in it: session secrets and the token never are,
//! command lines are not known to the server.

use std::net::IpAddr;

use accel_telemetry::http::{reply, Page, Pages, Reply};
use tokio::sync::watch;

use crate::auth::{Scope, Tokens};
use crate::ha::Role;
use crate::registry::STATUS_PAGE;
use crate::stacks::Latest;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Headers of every answer: nothing but the page's own files runs, it is
/// never framed, and types are as declared.
const HARDENED: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

/// Nodes of each job the page lists (`rdzv-server status` lists 1,000).
pub const PAGE_NODES: usize = 64;

/// How long one answer of `/api/jobs` serves every caller: ten open pages
/// cost the registry one listing per second, not ten.
const JOBS_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The last `/api/jobs` body and when it was made.
type Fresh = std::sync::Mutex<Option<(std::time::Instant, bytes::Bytes)>>;

/// Stack answers (`GET /api/stacks` of a finished collection, megabytes for
/// a large job) served per second at most, after a burst of as many: a
/// flood of them costs the server this much rendering and sending, and the
/// rest is told to retry (`429`). The listener bounds their bytes in flight
/// too ([`accel_telemetry::http::MAX_BYTES_IN_FLIGHT`]).
pub const STACK_ANSWERS_PER_SECOND: f64 = 4.0;

/// The stack answers' state, behind one lock.
type Rendered = std::sync::Mutex<StackAnswers>;

/// The last stacks answer's body, for that job and collection (every
/// caller is served the same bytes, shared, not copied, so many readers of
/// a large answer, slow or stalled, hold one copy between them), and the
/// answers' pace.
#[derive(Debug)]
struct StackAnswers {
    last: Option<(String, u64, bytes::Bytes)>,
    pace: Pace,
}

impl Default for StackAnswers {
    fn default() -> Self {
        Self {
            last: None,
            pace: Pace::new(STACK_ANSWERS_PER_SECOND, std::time::Instant::now()),
        }
    }
}

/// A token bucket: `rate` a second, at most `rate` saved up.
#[derive(Debug)]
struct Pace {
    rate: f64,
    tokens: f64,
    at: std::time::Instant,
}

impl Pace {
    fn new(rate: f64, now: std::time::Instant) -> Self {
        Self {
            rate,
            tokens: rate,
            at: now,
        }
    }

    /// Whether one more may go at `now`.
    fn take(&mut self, now: std::time::Instant) -> bool {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + gained).min(self.rate);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The status page's routes, for the metrics listener.
pub fn pages(
    seat: watch::Receiver<Role>,
    tokens: Tokens,
    lighthouse: Option<crate::lighthouse::service::Shared>,
) -> Pages {
    let fresh = Fresh::default();
    let rendered = Rendered::default();
    std::sync::Arc::new(move |page: &Page<'_>| {
        if page.path == "/api/lighthouse" && page.method != http::Method::POST {
            return lighthouse
                .as_ref()
                .map(|l| lighthouse_json(page, &seat, &tokens, l));
        }
        route(page, &seat, &tokens, &fresh, &rendered)
    })
}

/// `/api/lighthouse`: the torchft lighthouse's report, to whoever may read
/// the jobs.
fn lighthouse_json(
    page: &Page<'_>,
    seat: &watch::Receiver<Role>,
    tokens: &Tokens,
    l: &crate::lighthouse::service::Shared,
) -> Reply {
    if let Err(refused) = leader(page, seat, tokens, Scope::Read) {
        return *refused;
    }
    let report = l.read(|l| crate::lighthouse::report::Report::of(l, std::time::Instant::now()));
    reply(200, JSON, report.json().to_string() + "\n", &[])
}

fn route(
    page: &Page<'_>,
    seat: &watch::Receiver<Role>,
    tokens: &Tokens,
    fresh: &Fresh,
    rendered: &Rendered,
) -> Option<Reply> {
    if page.path == "/api/stacks" {
        return Some(stacks(page, seat, tokens, rendered));
    }
    if page.method == http::Method::POST {
        // Refused as for any other path that takes no POST.
        return None;
    }
    Some(match page.path {
        "/" | "/index.html" => reply(200, "text/html; charset=utf-8", INDEX, &HARDENED),
        "/app.js" => reply(200, "text/javascript; charset=utf-8", SCRIPT, &HARDENED),
        "/app.css" => reply(200, "text/css; charset=utf-8", STYLE, &HARDENED),
        "/api/jobs" => jobs(page, seat, tokens, fresh),
        _ => return None,
    })
}

/// Whether `page`'s caller may do what `scope` covers (see the module
/// docs): with a token that allows it; or, without one, from this host when
/// the request names this host (`host`: its `Host` header) as `localhost`
/// or an IP address. A page of another site that re-points its own name at
/// 127.0.0.1 (DNS rebinding) reaches a tunnel's loopback port too, but its
/// requests name that site, so they are refused.
pub fn admitted(
    peer: IpAddr,
    own_user: bool,
    host: Option<&[u8]>,
    authorization: Option<&[u8]>,
    tokens: &Tokens,
    scope: Scope,
) -> Admitted {
    let local = match peer {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    };
    let named_here = host.is_some_and(names_this_host);
    if !tokens.required() {
        // Without a token the gRPC port is open as well; but a browser on
        // this host that a page of another site re-pointed at 127.0.0.1
        // (DNS rebinding) is no caller of this server's: its requests name
        // that site, and are refused.
        return if !local || named_here {
            Admitted::Yes
        } else {
            Admitted::NoToken
        };
    }
    // On a shared node every local user's processes come from loopback
    // too: only the server's own user (or root), as the kernel says, is
    // taken for an operator's tunnel.
    if local && named_here && own_user {
        return Admitted::Yes;
    }
    match tokens.grants(authorization) {
        Some(g) if g.allows(scope) => Admitted::Yes,
        Some(_) => Admitted::NotThisToken,
        None => Admitted::NoToken,
    }
}

/// Whether a caller of the page may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Yes.
    Yes,
    /// No token of the server's, where one is needed.
    NoToken,
    /// A token of the server's that does not allow this.
    NotThisToken,
}

/// Whether a `Host` header is `localhost` or an IP literal (any port).
fn names_this_host(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [v6]:port
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                n
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok()
}

/// Whether a `POST` comes from the page itself: no `Origin` (not a browser),
/// or the origin of the `Host` it was sent to.
fn same_origin(page: &Page<'_>) -> bool {
    let Some(origin) = page.headers.get("origin") else {
        return true;
    };
    let host = page
        .headers
        .get("host")
        .map(|h| h.as_bytes())
        .unwrap_or_default();
    let origin = origin.as_bytes();
    [b"http://".as_slice(), b"https://".as_slice()]
        .iter()
        .any(|scheme| origin.strip_prefix(*scheme) == Some(host))
}

const JSON: &str = "application/json";

/// The leader's registry, if `page`'s caller may read the jobs; the answer
/// to give otherwise.
fn leader(
    page: &Page<'_>,
    seat: &watch::Receiver<Role>,
    tokens: &Tokens,
    scope: Scope,
) -> Result<crate::registry::Registry, Box<Reply>> {
    let authorization = page.headers.get("authorization").map(|v| v.as_bytes());
    let host = page.headers.get("host").map(|v| v.as_bytes());
    let me = nix::unistd::geteuid().as_raw();
    let own_user = page.peer_uid.is_some_and(|u| u == me || u == 0);
    match admitted(page.peer, own_user, host, authorization, tokens, scope) {
        Admitted::Yes => {}
        Admitted::NoToken => {
            let body = error_json(
                "this rendezvous requires its token: give it to the page (or send \
                 Authorization: Bearer TOKEN), or open the page through a tunnel to the server's host",
            );
            return Err(Box::new(reply(
                401,
                JSON,
                body,
                &[("www-authenticate", "Bearer")],
            )));
        }
        Admitted::NotThisToken => {
            let status = crate::auth::Granted::default()
                .require(scope)
                .err()
                .map(|s| s.message().to_owned())
                .unwrap_or_default();
            return Err(Box::new(reply(403, JSON, error_json(&status), &[])));
        }
    }
    match &*seat.borrow() {
        Role::Leader(registry) => Ok(crate::Registry::clone(registry)),
        Role::Follower { leader } => {
            let at = leader.as_deref().unwrap_or("not known yet");
            let body = error_json(&format!(
                "this replica follows; the leader (whose page has the jobs) is at {at}"
            ));
            Err(Box::new(reply(503, JSON, body, &[])))
        }
    }
}

/// The value of `key` in a query string (`a=1&job=x%2Fy`), decoded.
fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/api/stacks?job=ID`: `POST` begins a collection, `GET` gives the last.
fn stacks(
    page: &Page<'_>,
    seat: &watch::Receiver<Role>,
    tokens: &Tokens,
    rendered: &Rendered,
) -> Reply {
    // Collecting acts on every node of the job; the last answer is a read.
    let scope = if page.method == http::Method::POST {
        Scope::Operate
    } else {
        Scope::Read
    };
    let registry = match leader(page, seat, tokens, scope) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let Some(job) = query_value(page.query, "job") else {
        return reply(
            400,
            JSON,
            error_json("name the job: /api/stacks?job=ID"),
            &[],
        );
    };
    if let Err(e) = crate::limits::check_name("job", &job) {
        return reply(400, JSON, error_json(&e.to_string()), &[]);
    }
    let collecting = || reply(202, JSON, "{\"state\":\"collecting\"}\n", &[]);
    if page.method == http::Method::POST {
        let asked = page
            .headers
            .get("x-accel-request")
            .is_some_and(|v| v.as_bytes() == b"stacks");
        if !asked || !same_origin(page) {
            let body = error_json(
                "a collection is asked by the page itself, with the header X-Accel-Request: stacks and no other site's Origin",
            );
            return reply(403, JSON, body, &[]);
        }
        return match registry.stacks(&job, false, crate::stacks::DEFAULT_TIMEOUT) {
            Ok(_) => collecting(),
            Err(e @ crate::error::Error::UnknownJob(_)) => {
                reply(404, JSON, error_json(&e.to_string()), &[])
            }
            Err(e @ crate::error::Error::LimitReached(_)) => {
                reply(429, JSON, error_json(&e.to_string()), &[])
            }
            Err(e) => reply(503, JSON, error_json(&e.to_string()), &[]),
        };
    }
    match registry.latest_stacks(&job) {
        Latest::None => reply(
            404,
            JSON,
            error_json(&format!(
                "no stacks of job '{job}' are kept; collect them first"
            )),
            &[],
        ),
        Latest::Collecting => collecting(),
        Latest::Done(at, r) => {
            let mut kept = rendered.lock().unwrap_or_else(|e| e.into_inner());
            if !kept.pace.take(std::time::Instant::now()) {
                let body = error_json(&format!(
                    "too many stack answers: at most {STACK_ANSWERS_PER_SECOND} a second are served; retry in a second"
                ));
                return reply(429, JSON, body, &[("retry-after", "1")]);
            }
            let body = match kept.last.as_ref() {
                Some((j, t, b)) if *j == job && *t == at => b.clone(),
                _ => {
                    let mut body = crate::stacks::json(&job, &r);
                    body["state"] = "done".into();
                    body["at_unix_ms"] = at.into();
                    body["text"] = accel_wire::stacks::render(&job, &r).into();
                    let b = bytes::Bytes::from(body.to_string() + "\n");
                    kept.last = Some((job.clone(), at, b.clone()));
                    b
                }
            };
            drop(kept);
            reply(200, JSON, body, &[])
        }
    }
}

fn jobs(page: &Page<'_>, seat: &watch::Receiver<Role>, tokens: &Tokens, fresh: &Fresh) -> Reply {
    let registry = match leader(page, seat, tokens, Scope::Read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut last = fresh
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, body)) = last.as_ref().filter(|(at, _)| at.elapsed() < JOBS_FRESH) {
        return reply(200, JSON, body.clone(), &[]);
    }
    match registry.status_listing("", STATUS_PAGE.1 as u32, "", PAGE_NODES) {
        Ok(r) => {
            // `more`: there are more jobs than one page shows.
            let body = serde_json::json!({
                "jobs": crate::status::jobs_json(&r.jobs),
                "more": !r.next_page_token.is_empty(),
            });
            let body = bytes::Bytes::from(body.to_string() + "\n");
            *last = Some((std::time::Instant::now(), body.clone()));
            reply(200, JSON, body, &[])
        }
        Err(e) => reply(503, JSON, error_json(&e.to_string()), &[]),
    }
}

fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_answers_are_paced_after_a_burst() {
        let t = std::time::Instant::now();
        let mut pace = Pace::new(4.0, t);
        assert_eq!((0..10).filter(|_| pace.take(t)).count(), 4, "the burst");
        assert!(!pace.take(t + std::time::Duration::from_millis(200)));
        assert!(pace.take(t + std::time::Duration::from_millis(250)));
        // Idle time saves up at most one second's worth.
        let later = t + std::time::Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| pace.take(later)).count(), 4);
    }

    #[test]
    fn the_jobs_need_the_token_unless_the_caller_is_on_this_host() {
        let t = Tokens::agents(Some(accel_wire::accepted::Accepted::fixed(
            accel_wire::auth::Token::new("0123456789abcdef0123", "test").expect("token"),
        )));
        let open = Tokens::default();
        let ok = |peer, own, host, authorization, tokens: &Tokens| {
            admitted(peer, own, host, authorization, tokens, Scope::Read) == Admitted::Yes
        };
        let far: IpAddr = "10.0.0.7".parse().expect("ip");
        let near: IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let here = Some(b"127.0.0.1:29401".as_slice());
        assert!(!ok(far, true, here, None, &t));
        assert!(!ok(
            far,
            true,
            here,
            Some(b"Bearer wrong-token-value-000"),
            &t
        ));
        assert!(ok(
            far,
            true,
            Some(b"evil.example:29401"),
            Some(b"Bearer 0123456789abcdef0123"),
            &t
        ));
        assert!(ok(near, true, here, None, &t));
        assert!(ok(near, true, Some(b"localhost:29401"), None, &t));
        assert!(ok(near, true, Some(b"[::1]:29401"), None, &t));
        assert!(ok(mapped, true, Some(b"localhost"), None, &t));
        // A page of another site whose name now points at 127.0.0.1 (DNS
        // rebinding through a tunnel), or no Host at all: the token is needed.
        assert!(!ok(near, true, Some(b"evil.example:29401"), None, &t));
        assert!(!ok(near, true, Some(b"localhost.evil.example"), None, &t));
        assert!(!ok(near, true, None, None, &t));
        // Another local user (a shared node): the token, even from loopback.
        assert!(!ok(near, false, here, None, &t));
        assert!(ok(
            near,
            false,
            here,
            Some(b"Bearer 0123456789abcdef0123"),
            &t
        ));
        // Without a token the gRPC port is open as well...
        assert!(ok(far, true, None, None, &open));
        assert!(ok(near, true, here, None, &open));
        // ...but DNS rebinding on this host is refused all the same.
        assert!(!ok(near, true, Some(b"evil.example:29401"), None, &open));
        assert!(!ok(near, true, None, None, &open));
    }

    #[test]
    fn the_page_reads_with_the_read_token_and_collects_stacks_only_with_the_operate_token() {
        let token = |s: &str| {
            Some(accel_wire::accepted::Accepted::fixed(
                accel_wire::auth::Token::new(s, "test").expect("token"),
            ))
        };
        let tokens = Tokens::agents(token("agents-token-0123456789"))
            .with_read(token("reader-token-0123456789"))
            .with_operate(token("operator-token-0123456789"));
        let far: IpAddr = "10.0.0.7".parse().expect("ip");
        let here = Some(b"10.0.0.1:29401".as_slice());
        let check = |bearer: &str, scope| {
            let h = format!("Bearer {bearer}");
            admitted(far, false, here, Some(h.as_bytes()), &tokens, scope)
        };
        assert_eq!(check("reader-token-0123456789", Scope::Read), Admitted::Yes);
        assert_eq!(
            check("reader-token-0123456789", Scope::Operate),
            Admitted::NotThisToken
        );
        assert_eq!(
            check("agents-token-0123456789", Scope::Read),
            Admitted::NotThisToken
        );
        assert_eq!(
            check("operator-token-0123456789", Scope::Operate),
            Admitted::Yes
        );
        assert_eq!(
            check("nobody-token-0123456789", Scope::Read),
            Admitted::NoToken
        );
    }

    #[test]
    fn query_values_are_decoded_and_never_panic() {
        assert_eq!(
            query_value("job=a%2Fb+c&x=1", "job").as_deref(),
            Some("a/b c")
        );
        assert_eq!(query_value("x=1&job=j", "job").as_deref(), Some("j"));
        assert_eq!(query_value("x=1", "job"), None);
        // Broken or multibyte escapes are kept as they are.
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%é9"), "%é9");
        assert_eq!(percent_decode("%C3%A9"), "é");
    }
}
