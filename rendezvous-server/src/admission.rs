//! Which connections the server keeps: a bounded number per client address,
//! and only those that prove themselves with an admitted call.
//!
//! A token stops calls, not connections. Before any call is checked, a
//! connection already holds a file descriptor and the HTTP/2 buffers (about
//! 20 KiB), so a client without the token could otherwise open connections
//! until the server has no descriptors left for its agents. Two rules bound
//! that:
//! - one client address holds at most `max_per_ip` connections at once;
//!   further ones are closed as they are accepted, before a byte is read;
//! - a connection that has made no admitted call within `prove_within` of
//!   being accepted is closed. A call is admitted when the token
//!   interceptor lets it through (every call, when the server has no token);
//!   the gRPC health service is open to all and does not count. Agents call
//!   as soon as they connect, so this never touches them.
//!
//! Refusals and closures are counted and logged at most once per
//! [`REPORT_EVERY`] ([`accel_telemetry::quiet`]), so a flood cannot flood the log as
//! well.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;
use tracing::warn;

use accel_telemetry::quiet::{Quiet, Say};

/// Refused and closed connections are reported at most this often.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The connections the server holds, by client address.
#[derive(Debug)]
pub struct Admission {
    max_per_ip: u32,
    prove_within: Duration,
    open: Mutex<HashMap<IpAddr, u32>>,
    refused: Mutex<Quiet>,
    expired: Mutex<Quiet>,
}

impl Admission {
    /// At most `max_per_ip` connections per client address, each closed if
    /// it has made no admitted call within `prove_within`.
    pub fn new(max_per_ip: u32, prove_within: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_per_ip,
            prove_within,
            open: Mutex::new(HashMap::new()),
            refused: Mutex::new(Quiet::every(REPORT_EVERY)),
            expired: Mutex::new(Quiet::every(REPORT_EVERY)),
        })
    }

    fn open(&self) -> MutexGuard<'_, HashMap<IpAddr, u32>> {
        // Counting does not panic; a poisoned lock still holds valid counts.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot for a connection from `remote`, or `None` (close it)
    /// when that address already holds its share.
    pub fn admit(self: &Arc<Self>, stream: TcpStream, remote: SocketAddr) -> Option<Conn> {
        let ip = remote.ip().to_canonical();
        {
            let mut open = self.open();
            let held = open.entry(ip).or_insert(0);
            if *held >= self.max_per_ip {
                drop(open);
                if let Some(n) = report(&self.refused, Instant::now()) {
                    warn!(refused = n, max = self.max_per_ip, last_from = %ip,
                        "refused connections over the per-address limit (--max-connections-per-ip)");
                }
                return None;
            }
            *held += 1;
        }
        Some(Conn {
            io: stream,
            info: ConnInfo {
                remote: Some(remote),
                proven: Arc::new(AtomicBool::new(false)),
            },
            deadline: Some(Box::pin(tokio::time::sleep(self.prove_within))),
            slot: Slot {
                admission: self.clone(),
                ip,
            },
        })
    }

    /// Connections `ip` holds now.
    pub fn held(&self, ip: IpAddr) -> u32 {
        self.open().get(&ip.to_canonical()).copied().unwrap_or(0)
    }

    fn expired(&self) {
        if let Some(n) = report(&self.expired, Instant::now()) {
            warn!(
                closed = n,
                within_s = self.prove_within.as_secs_f64(),
                "closed connections that made no authenticated call in time (--auth-timeout)"
            );
        }
    }
}

/// Counts one event at `now`; the number to log when a line is due (the
/// first event, then at most once per period, with every event since).
fn report(quiet: &Mutex<Quiet>, now: Instant) -> Option<u64> {
    // Counting does not panic; a poisoned lock still holds a valid count.
    let mut q = quiet.lock().unwrap_or_else(|e| e.into_inner());
    match q.hit(now) {
        Say::First => Some(1),
        Say::Summary(n, _) => Some(n),
        Say::Nothing => None,
    }
}

/// Gives a connection's place back when it closes.
#[derive(Debug)]
struct Slot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admission.open();
        if let Some(held) = open.get_mut(&self.ip) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// What a call can learn about its connection (tonic puts it in the
/// request's extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    remote: Option<SocketAddr>,
    proven: Arc<AtomicBool>,
}

impl ConnInfo {
    /// The connection `request` came on, over TLS or not.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&ConnInfo> {
        request.extensions().get::<ConnInfo>()
    }

    /// The client's address.
    pub fn remote(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// The connection made an admitted call: it stays open.
    pub fn prove(&self) {
        self.proven.store(true, Ordering::Relaxed);
    }
}

/// An accepted connection: closed with an error on its next read once its
/// time to prove itself is over.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    info: ConnInfo,
    /// Until the first admitted call; dropped after it.
    deadline: Option<Pin<Box<Sleep>>>,
    slot: Slot,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(deadline) = &mut this.deadline {
            if this.info.proven.load(Ordering::Relaxed) {
                this.deadline = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                this.deadline = None;
                this.slot.admission.expired();
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no authenticated call in time",
                )));
            }
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_first_event_then_at_most_every_period() {
        let t = Mutex::new(Quiet::every(REPORT_EVERY));
        let t0 = Instant::now();
        assert_eq!(report(&t, t0), Some(1));
        assert_eq!(report(&t, t0 + Duration::from_secs(1)), None);
        assert_eq!(report(&t, t0 + Duration::from_secs(2)), None);
        assert_eq!(report(&t, t0 + REPORT_EVERY), Some(3));
        assert_eq!(report(&t, t0 + REPORT_EVERY * 2), Some(1));
    }

    /// A connection accepted from `listener`, and its client end (kept
    /// open by the caller).
    async fn pair(
        listener: &tokio::net::TcpListener,
        clients: &mut Vec<TcpStream>,
    ) -> (TcpStream, SocketAddr) {
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        clients.push(client.expect("connect"));
        accepted.expect("accept")
    }

    #[tokio::test]
    async fn an_address_holds_at_most_its_share_and_gets_it_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let admission = Admission::new(2, Duration::from_secs(30));
        let mut clients = Vec::new();
        let (s, a) = pair(&listener, &mut clients).await;
        let first = admission.admit(s, a).expect("first");
        let (s, a) = pair(&listener, &mut clients).await;
        let second = admission.admit(s, a).expect("second");
        let (s, a) = pair(&listener, &mut clients).await;
        assert!(admission.admit(s, a).is_none(), "third refused");
        assert_eq!(admission.held(a.ip()), 2);
        drop(first);
        assert_eq!(admission.held(a.ip()), 1);
        let (s, a) = pair(&listener, &mut clients).await;
        assert!(admission.admit(s, a).is_some(), "a freed slot is reusable");
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unproven_connection_fails_its_next_read_a_proven_one_does_not() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let admission = Admission::new(8, Duration::from_secs(30));
        let mut clients = Vec::new();
        let (s, a) = pair(&listener, &mut clients).await;
        let mut idle = admission.admit(s, a).expect("idle");
        let (s, a) = pair(&listener, &mut clients).await;
        let mut proven = admission.admit(s, a).expect("proven");
        proven.connect_info().prove();
        let mut buf = [0u8; 8];
        let err = idle
            .read(&mut buf)
            .await
            .expect_err("closed at the deadline");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // The proven one still waits for data (nothing was sent).
        let waited = tokio::time::timeout(Duration::from_secs(60), proven.read(&mut buf)).await;
        assert!(waited.is_err(), "a proven connection is never timed out");
    }
}
