//! The metrics and health endpoint: `GET /metrics` (Prometheus text format
//! 0.0.4), `GET /healthz` (the process answers) and `GET /readyz` (it does
//! its job now: 200, or 503 with the reason).
//!
//! It is served on its own port, apart from the gRPC service: scrapers and
//! probes need no token or client certificate, and a flood of them cannot
//! take connections from agents. In exchange it reveals only aggregates and
//! states, and it is bounded like every other input: at most
//! [`MAX_CONNECTIONS`] at once and [`MAX_PER_IP`] from one address (more are
//! closed at once), one request per connection, its head (at most 16 KiB)
//! read within [`HEAD_TIMEOUT`], and each connection closed after
//! [`CONNECTION_LIFETIME`] whatever it does. Only `GET` and `HEAD` are
//! answered. So one client cannot hold the endpoint; and since it could
//! still crowd it with many addresses, liveness probes belong on the main
//! service (the manifests probe gRPC health for liveness).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

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
use tokio::sync::Semaphore;
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
/// Pause after a failed accept (out of descriptors): the server's other
/// work goes on meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether the program is ready: `Err` says why not (e.g. "waiting for 1 of
/// 2 nodes"). Called on every `GET /readyz`; it must not block.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

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
        }
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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_ip = PerIp::default();
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
        let Some(held) = per_ip.take(peer.ip()) else {
            continue; // dropped: closed at once
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let endpoint = endpoint.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = (slot, held);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = endpoint.respond(req.method(), req.uri().path());
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
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Connections held per client address.
#[derive(Debug, Clone, Default)]
struct PerIp(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection's place in [`PerIp`], given back on drop.
#[derive(Debug)]
struct Held(PerIp, IpAddr);

impl PerIp {
    fn take(&self, ip: IpAddr) -> Option<Held> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip.to_canonical()).or_default();
        if *n >= MAX_PER_IP {
            return None;
        }
        *n += 1;
        Some(Held(self.clone(), ip.to_canonical()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut map = (self.0).0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

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

    #[tokio::test]
    async fn serves_over_tcp_and_sheds_one_address_s_extra_connections() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (e, c) = endpoint(Ok(()));
        c.inc();
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, e, stop.clone()));
        // Idle connections from one address hold its share...
        let mut idle = Vec::new();
        for _ in 0..MAX_PER_IP {
            idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // ...so one more is closed without an answer.
        let mut extra = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = extra
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf))
            .await
            .expect("closed promptly")
            .unwrap_or(0);
        assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf));
        // ...while another address is served (127.0.0.2 is loopback too).
        let other = tokio::net::TcpSocket::new_v4().expect("socket");
        other
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind");
        let mut s = other.connect(addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        // One request per connection: the server closes it after answering.
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .expect("closed after one answer")
            .expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        // Freed slots serve again.
        idle.clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("accel_test_events_total 1"), "{out}");
        stop.cancel();
        server.await.expect("stopped");
    }
}
