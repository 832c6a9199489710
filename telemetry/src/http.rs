//! The metrics and health endpoint: `GET /metrics` (Prometheus text format
//! 0.0.4), `GET /healthz` (the process answers) and `GET /readyz` (it does
//! its job now: 200, or 503 with the reason).
//!
//! It is served on its own port, apart from the gRPC service: scrapers and
//! probes need no token or client certificate, and a flood of them cannot
//! take connections from agents. In exchange its own paths reveal only
//! aggregates and states (a program's extra [`Pages`] guard what they show
//! themselves: rdzv-server's status page), and it is bounded like every
//! other input: at most
//! [`MAX_CONNECTIONS`] at once and [`MAX_PER_IP`] from one address, one
//! request per connection, its head (at most 16 KiB) read within
//! [`HEAD_TIMEOUT`], and each connection closed after
//! [`CONNECTION_LIFETIME`] whatever it does. Only `GET` and `HEAD` are
//! answered.
//!
//! A probe must get its answer even while others hold every slot: the
//! Kubernetes manifests probe `/readyz` for readiness, and a node whose
//! probe times out is taken out of service. So when a new connection finds
//! its address's share or the whole endpoint full, the oldest connection
//! that has not sent a complete request head (of that address, or of any)
//! is closed to make room (`Slots`); only when every held connection has
//! sent its request (each then gets its answer at once and ends) is the new
//! one refused. A real client sends its request as soon as it has
//! connected, so idle connections, however many addresses hold them, only
//! ever displace each other; closing the oldest first means a flood would
//! have to open every slot's worth of connections between a probe's
//! connect and its request to displace it.
//!
//! Large answers (a job's stacks, megabytes) are bounded in total: each
//! answer of at least [`LARGE_ANSWER`] bytes holds its size against
//! [`MAX_BYTES_IN_FLIGHT`] until its connection ends (counted per answer,
//! whether or not answers share their bytes, so the bound holds whatever a
//! page does). One that would exceed it is answered `503` with
//! `Retry-After: 1` instead, at once; small answers (`/readyz`, `/healthz`,
//! a scrape) never wait on large ones. Clients that ask for large answers
//! and never read them hold at most that much between them, for at most
//! [`CONNECTION_LIFETIME`] (or until a probe needs their place).

use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Scrapers and probes served at once; more connections are closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one client address may hold at once.
pub const MAX_PER_IP: usize = 4;
/// How long a client has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection is kept, however busy.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(15);
/// The smallest read buffer hyper allows: request heads are small.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Answers of at least this many bytes count against [`MAX_BYTES_IN_FLIGHT`].
pub const LARGE_ANSWER: usize = 64 * 1024;
/// Bytes of large answers held by connections at once (see the module docs).
pub const MAX_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;
/// Pause after a failed accept (out of descriptors): the server's other
/// work goes on meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether the program is ready: `Err` says why not (e.g. "waiting for 1 of
/// 2 nodes"). Called on every `GET /readyz`; it must not block.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// One `GET`, `HEAD` or `POST` request (its body is never read), for the
/// program's own pages.
#[derive(Debug)]
pub struct Page<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path, without the query.
    pub path: &'a str,
    /// The query (after `?`; empty without one).
    pub query: &'a str,
    /// The request's headers.
    pub headers: &'a hyper::HeaderMap,
    /// The address the connection came from.
    pub peer: IpAddr,
    /// Who owns the connection's other end, when it is a socket on this
    /// host the kernel knows ([`crate::peer::Owners`]): `None` for a remote
    /// peer, or one whose socket is already closed.
    pub peer_uid: Option<u32>,
}

/// An answer.
pub type Reply = Response<Full<Bytes>>;

/// Pages a program serves beside `/metrics`, `/healthz` and `/readyz`
/// (`None`: not one of its paths). Called for every other `GET`, `HEAD` or
/// `POST`; it must not block. A page that acts on `POST` should require a
/// header a cross-site form cannot send.
pub type Pages = Arc<dyn Fn(&Page<'_>) -> Option<Reply> + Send + Sync>;

/// An answer with `status`, `content_type`, `body` and `headers` (names in
/// lower case), never cached.
pub fn reply(
    status: u16,
    content_type: &'static str,
    body: impl Into<Bytes>,
    headers: &[(&'static str, &'static str)],
) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    for (name, value) in headers {
        h.insert(
            hyper::header::HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    r
}

/// Where `--metrics-bind` asks the endpoint to listen: `off` (or empty) for
/// nowhere, else `HOST:PORT` with a literal address (`[::]:29401`,
/// `127.0.0.1:0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// No endpoint.
    Off,
    /// Listen here.
    At(SocketAddr),
}

/// A `--metrics-bind` value that is neither `off` nor an address.
#[derive(Debug, thiserror::Error)]
#[error("--metrics-bind {0:?} is not an address: write IP:PORT (e.g. 0.0.0.0:29401 or [::]:29401), or off")]
pub struct BadBind(String);

impl FromStr for Bind {
    type Err = BadBind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        s.parse()
            .map(Self::At)
            .map_err(|_| BadBind(s.chars().take(80).collect()))
    }
}

impl fmt::Display for Bind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::At(a) => write!(f, "{a}"),
        }
    }
}

/// The listening endpoint could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for metrics on {addr}: {source}; pick another --metrics-bind (or off)")]
pub struct BindError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// What the endpoint serves.
#[derive(Clone)]
pub struct Endpoint {
    registry: Arc<Registry>,
    ready: Readiness,
    pages: Option<Pages>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Serves `registry` on `/metrics` and `ready` on `/readyz`.
    pub fn new(registry: Registry, ready: Readiness) -> Self {
        Self {
            registry: Arc::new(registry),
            ready,
            pages: None,
        }
    }

    /// The same, also serving `pages`.
    pub fn with_pages(mut self, pages: Pages) -> Self {
        self.pages = Some(pages);
        self
    }

    /// The answer to `req` from `peer`: the program's pages first, then
    /// [`Endpoint::respond`].
    pub fn answer<B>(
        &self,
        req: &Request<B>,
        peer: IpAddr,
        peer_uid: Option<u32>,
    ) -> Response<Full<Bytes>> {
        let (method, path) = (req.method(), req.uri().path());
        let own = matches!(path, "/metrics" | "/healthz" | "/livez" | "/readyz");
        if let (Some(pages), false, true) = (
            &self.pages,
            own,
            method == Method::GET || method == Method::HEAD || method == Method::POST,
        ) {
            let page = Page {
                method,
                path,
                query: req.uri().query().unwrap_or_default(),
                headers: req.headers(),
                peer,
                peer_uid,
            };
            if let Some(r) = pages(&page) {
                return r;
            }
        }
        self.respond(method, path)
    }

    /// The answer to one request.
    pub fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        if method != Method::GET && method != Method::HEAD {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and HEAD are served\n".into(),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        match path {
            "/metrics" => {
                let mut body = String::new();
                match prometheus_text::encode(&mut body, &self.registry) {
                    Ok(()) => {
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        r.headers_mut().insert(
                            CONTENT_TYPE,
                            HeaderValue::from_static(prometheus_text::CONTENT_TYPE),
                        );
                        r
                    }
                    Err(_) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot encode the metrics\n".into(),
                    ),
                }
            }
            "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => match (self.ready)() {
                Ok(()) => text(StatusCode::OK, "ready\n".into()),
                Err(why) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {why}\n"),
                ),
            },
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: the paths are /metrics, /healthz and /readyz\n".into(),
            ),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Opens the endpoint's listener (call before serving, so a taken port is a
/// start-up error, not a warning later).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves `endpoint` on `listener` until `stop` is cancelled; connections
/// in progress are then dropped (a scrape is cheap to repeat).
pub async fn serve(listener: TcpListener, endpoint: Endpoint, stop: CancellationToken) {
    let slots = Slots::default();
    let flight = InFlight::default();
    // Who is at the other end of a connection from this host: the pages
    // serve some answers without the token only to the server's own user.
    let owners = Arc::new(crate::peer::Owners::open());
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "the metrics endpoint cannot accept a connection");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let Some(slot) = slots.admit(peer.ip()) else {
            continue; // dropped: closed at once
        };
        let endpoint = endpoint.clone();
        let stop = stop.clone();
        let owners = owners.clone();
        let flight = flight.clone();
        tokio::spawn(async move {
            // Asked once per connection (one netlink round trip), and only
            // for a peer on this host: a remote one has no socket here.
            let peer_uid = match stream.local_addr() {
                Ok(local) if crate::peer::on_this_host(peer.ip(), local.ip()) => {
                    owners.peer_uid(peer, local)
                }
                _ => None,
            };
            let evicted = slot.evicted.clone();
            let requested = Slot::clone(&slot);
            // A large answer's share of the budget, given back when the
            // connection ends (its bytes written or abandoned).
            let held: Arc<Mutex<Option<Share>>> = Arc::default();
            let holding = held.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                requested.requested();
                let r = flight.admit(endpoint.answer(&req, peer.ip(), peer_uid), &holding);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
                _ = evicted.cancelled() => {}
                _ = stop.cancelled() => {}
            }
            drop(slot);
            drop(held);
        });
    }
}

/// Bytes of large answers held by connections ([`MAX_BYTES_IN_FLIGHT`]).
#[derive(Debug, Clone, Default)]
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

/// One answer's part of [`InFlight`], given back on drop.
#[derive(Debug)]
struct Share {
    flight: InFlight,
    bytes: usize,
}

impl Drop for Share {
    fn drop(&mut self) {
        self.flight
            .0
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

impl InFlight {
    /// Takes `bytes` of the budget, or `None` when that would exceed it.
    fn take(&self, bytes: usize) -> Option<Share> {
        use std::sync::atomic::Ordering;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes)
                    .filter(|&n| n <= MAX_BYTES_IN_FLIGHT)
            })
            .ok()?;
        Some(Share {
            flight: self.clone(),
            bytes,
        })
    }

    /// `r` if it is small or fits the budget (its share then kept in
    /// `held`), else a `503` asking to retry.
    fn admit(&self, r: Reply, held: &Mutex<Option<Share>>) -> Reply {
        use hyper::body::Body;
        let size = r.body().size_hint().exact().unwrap_or(0);
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size < LARGE_ANSWER {
            return r;
        }
        match self.take(size) {
            Some(share) => {
                *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(share);
                r
            }
            None => {
                let mut busy = text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "busy: {} MiB of large answers are being sent (at most {} MiB at once); retry in a second\n",
                        self.0.load(std::sync::atomic::Ordering::Acquire) >> 20,
                        MAX_BYTES_IN_FLIGHT >> 20
                    ),
                );
                busy.headers_mut()
                    .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
                busy
            }
        }
    }
}

/// The connections held, oldest first, and which have sent a complete
/// request head: a new connection takes the place of the oldest idle one
/// when its address's share or the endpoint is full (see the module docs).
#[derive(Debug, Clone, Default)]
struct Slots(Arc<Mutex<Table>>);

/// The bookkeeping behind [`Slots`]: pure, so its choices are unit-tested.
#[derive(Debug, Default)]
struct Table {
    next: u64,
    /// By admission order: the smallest id is the oldest.
    held: std::collections::BTreeMap<u64, HeldConnection>,
}

#[derive(Debug)]
struct HeldConnection {
    ip: IpAddr,
    /// When it sent its request (`None`: idle so far).
    requested: Option<Instant>,
    evict: CancellationToken,
}

/// How long a connection that sent its request may take to read the
/// answer before a newer connection may take its place when the endpoint
/// is full: a client that never reads (a flood of large answers) keeps no
/// place from a probe.
const WRITE_GRACE: Duration = Duration::from_secs(2);

impl Table {
    /// Admits a connection from `ip`, closing idle ones to make room:
    /// its id, or `None` (refused: every candidate has sent its request).
    fn admit(&mut self, now: Instant, ip: IpAddr, evict: CancellationToken) -> Option<u64> {
        let ip = ip.to_canonical();
        // Idle, or stuck on an answer it does not read.
        let spare = |h: &HeldConnection| h.requested.is_none_or(|at| now >= at + WRITE_GRACE);
        let idle_of = |t: &Self, only: Option<IpAddr>| {
            t.held
                .iter()
                .find(|(_, h)| spare(h) && only.is_none_or(|ip| h.ip == ip))
                .map(|(id, _)| *id)
        };
        // Decide before closing anything: a refused connection displaces
        // nobody.
        let mut out = Vec::new();
        if self.held.values().filter(|h| h.ip == ip).count() >= MAX_PER_IP {
            out.push(idle_of(self, Some(ip))?);
        }
        if self.held.len() - out.len() >= MAX_CONNECTIONS {
            let oldest = self
                .held
                .iter()
                .find(|(id, h)| spare(h) && !out.contains(id))
                .map(|(id, _)| *id)?;
            out.push(oldest);
        }
        for id in out {
            if let Some(h) = self.held.remove(&id) {
                h.evict.cancel();
            }
        }
        let id = self.next;
        self.next += 1;
        self.held.insert(
            id,
            HeldConnection {
                ip,
                requested: None,
                evict,
            },
        );
        Some(id)
    }

    fn requested(&mut self, now: Instant, id: u64) {
        if let Some(h) = self.held.get_mut(&id) {
            h.requested = Some(now);
        }
    }

    fn release(&mut self, id: u64) {
        self.held.remove(&id);
    }
}

/// One connection's place in [`Slots`], given back on drop.
#[derive(Debug, Clone)]
struct Slot {
    slots: Slots,
    id: u64,
    /// Cancelled when a newer connection takes this one's place.
    evicted: CancellationToken,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn admit(&self, ip: IpAddr) -> Option<SlotGuard> {
        let evicted = CancellationToken::new();
        let id = self.lock().admit(Instant::now(), ip, evicted.clone())?;
        Some(SlotGuard(Slot {
            slots: self.clone(),
            id,
            evicted,
        }))
    }
}

impl Slot {
    /// The connection's request head is complete: it is no longer idle.
    fn requested(&self) {
        self.slots.lock().requested(Instant::now(), self.id);
    }
}

/// The [`Slot`] a connection's task owns; the place is freed when it drops.
#[derive(Debug)]
struct SlotGuard(Slot);

impl std::ops::Deref for SlotGuard {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.0
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.slots.lock().release(self.0.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    /// One instant for the slot tables' tests (no time passes in them).
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn endpoint(ready: Result<(), String>) -> (Endpoint, Counter) {
        let mut registry = Registry::default();
        let c = Counter::default();
        registry.register("accel_test_events", "Events seen", c.clone());
        let ready: Readiness = Arc::new(move || ready.clone());
        (Endpoint::new(registry, ready), c)
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let bytes = r.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text() {
        let (e, c) = endpoint(Ok(()));
        c.inc_by(3);
        let r = e.respond(&Method::GET, "/metrics");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[CONTENT_TYPE],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let text = body(r).await;
        assert!(
            text.contains("# TYPE accel_test_events_total counter\n"),
            "{text}"
        );
        assert!(text.contains("accel_test_events_total 3\n"), "{text}");
    }

    #[tokio::test]
    async fn readiness_names_the_reason() {
        let (e, _) = endpoint(Err("waiting for 1 of 2 nodes".into()));
        let r = e.respond(&Method::GET, "/readyz");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(r).await, "not ready: waiting for 1 of 2 nodes\n");
        let r = e.respond(&Method::GET, "/healthz");
        assert_eq!(r.status(), StatusCode::OK);
        let (e, _) = endpoint(Ok(()));
        assert_eq!(e.respond(&Method::HEAD, "/readyz").status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn other_paths_and_methods_are_refused() {
        let (e, _) = endpoint(Ok(()));
        assert_eq!(e.respond(&Method::GET, "/").status(), StatusCode::NOT_FOUND);
        let r = e.respond(&Method::POST, "/metrics");
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[ALLOW], "GET, HEAD");
    }

    #[tokio::test]
    async fn large_answers_share_a_budget_and_small_ones_never_wait() {
        let flight = InFlight::default();
        let large = |n: usize| reply(200, "text/plain", vec![b'x'; n], &[]);
        let held: Vec<Mutex<Option<Share>>> = (0..5).map(|_| Mutex::default()).collect();
        let quarter = MAX_BYTES_IN_FLIGHT / 4;
        for h in &held[..4] {
            assert_eq!(flight.admit(large(quarter), h).status(), StatusCode::OK);
        }
        let refused = flight.admit(large(LARGE_ANSWER), &held[4]);
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[hyper::header::RETRY_AFTER], "1");
        assert!(body(refused).await.contains("at most 64 MiB at once"));
        // A probe's answer is small: never refused.
        let (e, _) = endpoint(Ok(()));
        let probe = flight.admit(e.respond(&Method::GET, "/readyz"), &held[4]);
        assert_eq!(probe.status(), StatusCode::OK);
        // A connection that ends gives its share back.
        drop(held[0].lock().expect("lock").take());
        assert_eq!(
            flight.admit(large(quarter), &held[4]).status(),
            StatusCode::OK
        );
    }

    #[test]
    fn bind_values() {
        assert_eq!("off".parse::<Bind>().expect("off"), Bind::Off);
        assert_eq!("".parse::<Bind>().expect("empty"), Bind::Off);
        assert_eq!(
            "[::]:29401".parse::<Bind>().expect("v6"),
            Bind::At("[::]:29401".parse().expect("addr"))
        );
        let e = "localhost:9".parse::<Bind>().expect_err("a name");
        assert!(e.to_string().contains("write IP:PORT"), "{e}");
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_full_address_or_endpoint_makes_room_by_closing_the_oldest_idle_connection() {
        let mut t = Table::default();
        let tokens: Vec<CancellationToken> = (0..MAX_CONNECTIONS + 8)
            .map(|_| CancellationToken::new())
            .collect();
        // One address: its share, then each newer one displaces its oldest idle.
        for id in 0..MAX_PER_IP as u64 {
            assert_eq!(t.admit(t0(), ip(1), tokens[id as usize].clone()), Some(id));
        }
        t.requested(t0(), 0); // connection 0 has sent its request: not idle
        let id = t.admit(t0(), ip(1), tokens[4].clone()).expect("admitted");
        assert!(
            !tokens[0].is_cancelled(),
            "busy connections are never closed"
        );
        assert!(
            tokens[1].is_cancelled(),
            "the oldest idle one of the address"
        );
        assert_eq!(t.held.len(), MAX_PER_IP);
        // Another address fills the rest of the endpoint...
        let others: Vec<u64> = (0..(MAX_CONNECTIONS - MAX_PER_IP))
            .map(|i| {
                let addr = ip(2 + (i / MAX_PER_IP) as u8);
                t.admit(t0(), addr, CancellationToken::new()).expect("room")
            })
            .collect();
        assert_eq!(t.held.len(), MAX_CONNECTIONS);
        // ...and a new address displaces the oldest idle connection of all
        // (address 1's second-oldest, as 0 is busy and 1 is gone).
        t.admit(t0(), ip(99), tokens[5].clone()).expect("room made");
        assert!(tokens[2].is_cancelled());
        assert_eq!(t.held.len(), MAX_CONNECTIONS);
        // When every connection has sent its request, a new one is refused
        // and nobody is displaced.
        let ids: Vec<u64> = t.held.keys().copied().collect();
        for id in ids {
            t.requested(t0(), id);
        }
        assert_eq!(t.admit(t0(), ip(100), tokens[6].clone()), None);
        assert_eq!(t.held.len(), MAX_CONNECTIONS);
        // Released places are free again.
        t.release(id);
        t.release(others[0]);
        assert!(t.admit(t0(), ip(100), tokens[7].clone()).is_some());
        assert_eq!(t.held.len(), MAX_CONNECTIONS - 1);
    }

    #[test]
    fn a_connection_that_does_not_read_its_answer_gives_its_place_up() {
        let mut t = Table::default();
        let tokens: Vec<CancellationToken> = (0..MAX_CONNECTIONS)
            .map(|_| CancellationToken::new())
            .collect();
        for (i, tok) in tokens.iter().enumerate() {
            let id = t
                .admit(t0(), ip(1 + (i / MAX_PER_IP) as u8), tok.clone())
                .expect("room");
            t.requested(t0(), id);
        }
        // Full of connections busy with their answers: a probe waits...
        assert_eq!(t.admit(t0(), ip(200), CancellationToken::new()), None);
        // ...until the oldest has not read its answer for the grace.
        let later = t0() + WRITE_GRACE;
        assert!(t.admit(later, ip(200), CancellationToken::new()).is_some());
        assert!(tokens[0].is_cancelled(), "the oldest stuck one");
        assert!(tokens[1..].iter().all(|t| !t.is_cancelled()));
    }

    #[test]
    fn a_refused_connection_displaces_nobody() {
        let mut t = Table::default();
        let tokens: Vec<CancellationToken> =
            (0..MAX_PER_IP).map(|_| CancellationToken::new()).collect();
        for (i, tok) in tokens.iter().enumerate() {
            let id = t.admit(t0(), ip(1), tok.clone()).expect("room");
            if i > 0 {
                t.requested(t0(), id);
            }
        }
        // The address's only idle connection is 0; the endpoint is not full.
        assert!(t.admit(t0(), ip(1), CancellationToken::new()).is_some());
        assert!(tokens[0].is_cancelled());
        t.requested(t0(), MAX_PER_IP as u64);
        // Now all of the address's connections are busy: refused.
        assert_eq!(t.admit(t0(), ip(1), CancellationToken::new()), None);
        assert!(tokens[1..].iter().all(|t| !t.is_cancelled()));
    }

    async fn serving(e: Endpoint) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, e, stop.clone()));
        (addr, stop, server)
    }

    async fn connect_from(from: u8, addr: SocketAddr) -> tokio::net::TcpStream {
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        s.bind(SocketAddr::new(ip(from), 0)).expect("bind");
        s.connect(addr).await.expect("connect")
    }

    /// The whole answer to `request` on `s` (the server closes after one).
    async fn ask(s: &mut tokio::net::TcpStream, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(request).await.expect("write");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("answered and closed promptly")
            .expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Whether the server closed `s` (end of file or reset) within `limit`.
    async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(limit, s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    const READYZ: &[u8] = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";

    #[tokio::test]
    async fn a_probe_is_answered_while_sixteen_addresses_hold_every_slot_idle() {
        let (e, _) = endpoint(Ok(()));
        let (addr, stop, server) = serving(e).await;
        let mut idle = Vec::new();
        for from in 1..=16u8 {
            for _ in 0..MAX_PER_IP {
                idle.push(connect_from(from, addr).await);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A probe from a new address is answered: the endpoint is full,
        // and the oldest idle connection of all makes room.
        let mut probe = connect_from(17, addr).await;
        let out = ask(&mut probe, READYZ).await;
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.ends_with("ready\n"),
            "{out}"
        );
        assert!(closed_within(&mut idle[0], Duration::from_secs(2)).await);
        // Full again; a probe from an address that holds its share is
        // answered too: that address's oldest idle connection makes room.
        idle.push(connect_from(18, addr).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut probe = connect_from(2, addr).await;
        let out = ask(&mut probe, READYZ).await;
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.ends_with("ready\n"),
            "{out}"
        );
        assert!(closed_within(&mut idle[MAX_PER_IP], Duration::from_secs(2)).await);
        // Nobody else was closed.
        for s in &mut idle[1..MAX_PER_IP] {
            assert!(!closed_within(s, Duration::from_millis(50)).await);
        }
        stop.cancel();
        server.await.expect("stopped");
    }

    #[tokio::test]
    async fn methods_paths_and_header_limits_hold_over_tcp() {
        let (e, _) = endpoint(Ok(()));
        let (addr, stop, server) = serving(e).await;
        let mut s = connect_from(1, addr).await;
        let out = ask(
            &mut s,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        let mut s = connect_from(1, addr).await;
        let out = ask(&mut s, b"GET /secrets HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        // A head over 16 KiB is refused, not buffered.
        let mut s = connect_from(1, addr).await;
        let mut big = b"GET /readyz HTTP/1.1\r\nHost: x\r\n".to_vec();
        big.extend(format!("X-Pad: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES * 2)).as_bytes());
        let out = ask(&mut s, &big).await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
        stop.cancel();
        server.await.expect("stopped");
    }

    #[tokio::test]
    async fn a_head_sent_slowly_is_cut_off_after_the_head_timeout() {
        use tokio::io::AsyncWriteExt;
        let (e, _) = endpoint(Ok(()));
        let (addr, stop, server) = serving(e).await;
        let mut s = connect_from(1, addr).await;
        let t0 = tokio::time::Instant::now();
        s.write_all(b"GET /readyz HTTP/1.1\r\n")
            .await
            .expect("write");
        // A byte a second: never a complete head.
        let mut closed = false;
        while t0.elapsed() < HEAD_TIMEOUT + Duration::from_secs(3) {
            if s.write_all(b"X").await.is_err()
                || closed_within(&mut s, Duration::from_secs(1)).await
            {
                closed = true;
                break;
            }
        }
        assert!(closed, "still open after {:?}", t0.elapsed());
        assert!(
            t0.elapsed() >= HEAD_TIMEOUT - Duration::from_millis(100),
            "{:?}",
            t0.elapsed()
        );
        stop.cancel();
        server.await.expect("stopped");
    }

    #[tokio::test]
    async fn freed_places_serve_again_and_metrics_are_served_over_tcp() {
        let (e, c) = endpoint(Ok(()));
        c.inc();
        let (addr, stop, server) = serving(e).await;
        let mut idle = Vec::new();
        for _ in 0..MAX_PER_IP {
            idle.push(connect_from(1, addr).await);
        }
        idle.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut s = connect_from(1, addr).await;
        let out = ask(
            &mut s,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("accel_test_events_total 1"), "{out}");
        stop.cancel();
        server.await.expect("stopped");
    }
}
