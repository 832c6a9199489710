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

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{info, warn};

use crate::admission::{Admission, Conn};

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connections `listener` accepts and `admission` admits, as a stream
/// for tonic; the accepting task ends when the stream is dropped (the server
/// stopped).
pub(crate) fn incoming(
    listener: TcpListener,
    admission: Arc<Admission>,
) -> ReceiverStream<std::io::Result<Conn>> {
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
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
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
