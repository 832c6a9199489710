//! The stop signals the agent handles (`--signals-to-handle`, by default
//! SIGTERM from systemd or Kubernetes, SIGINT from a terminal, SIGHUP when the
//! terminal goes away, SIGQUIT). They are installed before the rendezvous, so
//! a signal at any time, even while waiting for other nodes, stops the agent
//! in order: forward to the workers, wait `--shutdown-timeout`, SIGKILL, leave
//! the rendezvous, exit `128 + signo`.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::error::AgentError;

/// A merged stream of the handled signals.
#[derive(Debug)]
pub(crate) struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Installs handlers for `which`. Must run inside the runtime.
    pub(crate) fn install(which: &[Signal]) -> Result<Self, AgentError> {
        let (tx, rx) = mpsc::unbounded_channel();
        for &sig in which {
            let mut stream = signal(SignalKind::from_raw(sig as i32))
                .map_err(|e| AgentError::io(format!("cannot handle {sig}"), e))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Self { rx })
    }

    /// Signals sent on the returned channel instead of received: the
    /// driver's unit tests deliver them this way.
    #[cfg(test)]
    pub(crate) fn channel() -> (mpsc::UnboundedSender<Signal>, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Self { rx })
    }

    /// The next signal received.
    pub(crate) async fn recv(&mut self) -> Signal {
        match self.rx.recv().await {
            Some(s) => s,
            None => std::future::pending().await,
        }
    }
}
