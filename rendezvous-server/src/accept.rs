//! Accepting connections without spinning when the process is out of file
//! descriptors.
//!
//! A plain accept loop retries a failing `accept` at once: at the descriptor
//! limit (`EMFILE`) every pending connection fails again immediately, and the
//! server burns a core while logging nothing. Here a failing accept backs
//! off (10 ms doubling to 1 s), says so once when the episode starts and
//! once when it ends, and the connections it does accept are handed to the
//! gRPC server through a small channel, each once [`Admission`] gave it a
//! place.
//!
//! # TLS
//! With TLS the handshake happens here, not in tonic, so that the
//! certificate can change while the server runs ([`ServerTls`] re-reads its
//! files): each connection is accepted with the configuration current at
//! that moment. Handshakes run beside the accept loop, each bounded by
//! `TLS_HANDSHAKE` (10 s), so a client that opens a connection and never
//! finishes the handshake holds neither the loop nor a descriptor for
//! ever (and its address's place is counted by [`Admission`] meanwhile).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use accel_wire::tls::ServerTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, info, warn};

use crate::admission::{Admission, Conn, ConnInfo};

/// How long a client has to finish the TLS handshake.
pub(crate) const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connections `listener` accepts and `admission` admits, as a stream
/// for tonic; the accepting task ends when the stream is dropped (the server
/// stopped).
pub(crate) fn incoming(
    listener: TcpListener,
    admission: Arc<Admission>,
    tls: Option<ServerTls>,
) -> ReceiverStream<io::Result<ServerIo>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut backoff = FIRST_BACKOFF;
        let mut failures = 0u64;
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((stream, remote)) => {
                    if failures > 0 {
                        info!(failures, "accepting connections again");
                        failures = 0;
                        backoff = FIRST_BACKOFF;
                    }
                    // Events are small and latency matters more than packet count.
                    let _ = stream.set_nodelay(true);
                    let Some(conn) = admission.admit(stream, remote) else {
                        continue;
                    };
                    match &tls {
                        None => {
                            if tx.send(Ok(ServerIo::Plain(conn))).await.is_err() {
                                return;
                            }
                        }
                        Some(tls) => {
                            tokio::spawn(handshake(tls.clone(), conn, tx.clone()));
                        }
                    }
                }
                Err(e) => {
                    if failures == 0 {
                        warn!(error = %e, "cannot accept connections (out of file descriptors? raise LimitNOFILE); backing off");
                    }
                    failures += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Finishes a connection's TLS handshake within [`TLS_HANDSHAKE`] and hands
/// it on; a failed or slow one is closed (at debug level: a scanner or a
/// client with the wrong CA must not fill the log).
async fn handshake(tls: ServerTls, conn: Conn, tx: mpsc::Sender<io::Result<ServerIo>>) {
    // Looking at the certificate's files (at most once a second) happens
    // here, beside the accept loop: a file system that hangs holds one
    // handshake, never the loop.
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    match tokio::time::timeout(TLS_HANDSHAKE, acceptor.accept(conn)).await {
        Ok(Ok(stream)) => {
            let _ = tx.send(Ok(ServerIo::Tls(Box::new(stream)))).await;
        }
        Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
        Err(_) => debug!("TLS handshake not finished in time"),
    }
}

/// A connection the gRPC server serves: plain, or TLS over it.
#[derive(Debug)]
pub(crate) enum ServerIo {
    /// Plain HTTP/2.
    Plain(Conn),
    /// HTTP/2 over TLS.
    Tls(Box<tokio_rustls::server::TlsStream<Conn>>),
}

impl Connected for ServerIo {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Self::Plain(c) => c.connect_info(),
            Self::Tls(t) => t.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_read(cx, buf),
            Self::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_write(cx, buf),
            Self::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_flush(cx),
            Self::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_shutdown(cx),
            Self::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            Self::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(c) => c.is_write_vectored(),
            Self::Tls(t) => t.is_write_vectored(),
        }
    }
}
