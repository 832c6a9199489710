//! `rdzv-server status`: asks a running server for its jobs and prints them.

use std::fmt::Write as _;
use std::time::Duration;

use accel_proto::v1 as pb;
use pb::rendezvous_client::RendezvousClient;

use crate::auth::{AttachToken, Token};
use crate::tls::{endpoint_uri, ClientTlsFiles};

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// The endpoint is not a `HOST:PORT`.
    #[error("'{0}' is not a rendezvous endpoint; give HOST:PORT")]
    BadEndpoint(String),
    /// The server could not be reached.
    #[error("cannot reach the rendezvous at {endpoint}: {cause}; is rdzv-server running there?")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause, with its sources.
        cause: String,
    },
    /// A TLS file cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The server answered with an error.
    #[error("the rendezvous at {endpoint} answered: {message}")]
    Call {
        /// The endpoint.
        endpoint: String,
        /// Its message.
        message: String,
    },
}

/// `e` and its sources, joined: a transport error's own text is often only
/// "transport error".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        // Wrappers often repeat their source's text; say it once.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// The status of every job (or of `job`) at `endpoint`, as text; every page
/// of a server with many jobs is fetched. `token`: the server's token, if it
/// has one.
pub async fn report(
    endpoint: &str,
    job: Option<&str>,
    token: Option<&Token>,
    tls: &ClientTlsFiles,
) -> Result<String, StatusError> {
    let bad = || StatusError::BadEndpoint(endpoint.to_owned());
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let uri = endpoint_uri(host, port, tls.enabled());
    let mut ep = tonic::transport::Endpoint::from_shared(uri).map_err(|_| bad())?;
    if let Some(config) = tls.config(host)? {
        ep = ep.tls_config(config).map_err(|e| StatusError::Connect {
            endpoint: endpoint.to_owned(),
            cause: error_chain(&e),
        })?;
    }
    let channel = ep
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| StatusError::Connect {
            endpoint: endpoint.to_owned(),
            cause: error_chain(&e),
        })?;
    let mut client = RendezvousClient::with_interceptor(channel, AttachToken::new(token));
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let mut request = tonic::Request::new(pb::JobStatusRequest {
            job_id: job.unwrap_or_default().to_owned(),
            page_size: 0,
            page_token,
        });
        request.set_timeout(Duration::from_secs(10));
        let page = client
            .job_status(request)
            .await
            .map_err(|s| StatusError::Call {
                endpoint: endpoint.to_owned(),
                message: s.message().to_owned(),
            })?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(render(&jobs))
}

/// One block per job: a summary line, then one line per node.
pub fn render(jobs: &[pb::JobInfo]) -> String {
    let mut out = String::new();
    if jobs.is_empty() {
        out.push_str("no jobs\n");
    }
    for j in jobs {
        let nnodes = if j.min_nodes == j.max_nodes {
            j.max_nodes.to_string()
        } else {
            format!("{}:{}", j.min_nodes, j.max_nodes)
        };
        let _ = writeln!(
            out,
            "job {}  phase {}  round {}  restarts {}/{}  nnodes {}  members {}",
            j.job_id, j.phase, j.round, j.restart_count, j.max_restarts, nnodes, j.node_count
        );
        if !j.last_failure.is_empty() {
            let _ = writeln!(out, "  last failure: {}", j.last_failure);
        }
        for n in &j.nodes {
            let rank = n
                .node_rank
                .map_or_else(|| "-".to_owned(), |r| r.to_string());
            let _ = writeln!(
                out,
                "  node {}  host {}  rank {}  {}",
                n.node_id, n.hostname, rank, n.state
            );
        }
        let unlisted = (j.node_count as usize).saturating_sub(j.nodes.len());
        if unlisted > 0 {
            let _ = writeln!(out, "  ... and {unlisted} more nodes");
        }
    }
    out
}
