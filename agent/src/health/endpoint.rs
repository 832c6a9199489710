//! `--health-check-endpoint ADDR`: a node health daemon's verdict.
//!
//! Sites run daemons that already know a node's health (DCGM's health
//! watches, node-problem-detector, a vendor's agent watching XIDs and
//! thermals). The agent asks one, each check, in one of two tiny protocols:
//!
//! - `unix:/run/node-health.sock`: the agent connects, writes the line
//!   `check HOSTNAME\n`, and reads one line back (at most [`LINE_MAX`]
//!   bytes): `ok` passes; `fail REASON` (or anything else) fails, quoting
//!   the line. The daemon may close the connection after its line.
//! - `http://127.0.0.1:9400/health`: the agent sends
//!   `GET /health?host=HOSTNAME HTTP/1.0`; a `2xx` status passes; any other
//!   fails, quoting the status line and the start of the body. Plain HTTP
//!   only: the endpoint is meant to be on the node itself.
//!
//! A daemon that cannot be reached fails the check (the node is not known
//! to be healthy), with the address and the error. The answer is read up
//! to a bound, so a daemon cannot make the agent hold much.

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The most of an answer read: a Unix answer's line, an HTTP answer's head
/// and body start.
pub const LINE_MAX: usize = 4096;

/// Where the health daemon answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket.
    Unix(PathBuf),
    /// An HTTP URL: `host:port` and the path with its query.
    Http {
        /// `host:port` (port 80 if none was given).
        authority: String,
        /// The path, `/` at least.
        path: String,
    },
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path (unix:/run/node-health.sock)".into());
            }
            return Ok(Endpoint::Unix(path.into()));
        }
        if let Some(rest) = s.strip_prefix("http://") {
            let (authority, path) = match rest.find(['/', '?']) {
                Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_owned()),
                Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
                None => (rest, "/".to_owned()),
            };
            if authority.is_empty() || authority.contains('@') {
                return Err(format!("{s:?}: needs host[:port] after http:// (no user)"));
            }
            if path.chars().any(|c| c.is_control() || c == ' ') {
                return Err(format!("{s:?}: the path has spaces or control characters"));
            }
            let authority = match authority.rsplit_once(':') {
                Some((_, port)) if !authority.ends_with(']') => {
                    port.parse::<u16>()
                        .map_err(|_| format!("{s:?}: {port:?} is not a port"))?;
                    authority.to_owned()
                }
                _ => format!("{authority}:80"),
            };
            return Ok(Endpoint::Http { authority, path });
        }
        Err(format!(
            "{s:?}: expected unix:/path/to.sock or http://host:port/path (https is not spoken: the endpoint is on the node)"
        ))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Http { authority, path } => write!(f, "http://{authority}{path}"),
        }
    }
}

impl Endpoint {
    /// Asks the daemon once (the caller bounds the wait).
    pub async fn check(&self) -> Result<(), String> {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        let r = match self {
            Endpoint::Unix(path) => match tokio::net::UnixStream::connect(path).await {
                Ok(s) => unix(s, &host).await,
                Err(e) => Err(format!("cannot connect: {e}")),
            },
            Endpoint::Http { authority, path } => {
                match tokio::net::TcpStream::connect(authority.as_str()).await {
                    Ok(s) => http(s, authority, path, &host).await,
                    Err(e) => Err(format!("cannot connect: {e}")),
                }
            }
        };
        r.map_err(|e| format!("endpoint {self}: {e}"))
    }
}

/// Reads up to [`LINE_MAX`] bytes, to the end of the stream.
/// Reads up to [`LINE_MAX`] bytes, until the end of the stream or until
/// `enough` says what came is the whole answer (a daemon may keep the
/// connection open).
async fn read_bounded(
    mut s: impl AsyncRead + Unpin,
    enough: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>, String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while got.len() < LINE_MAX {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n.min(LINE_MAX - got.len())]);
        if enough(&got) {
            break;
        }
    }
    Ok(got)
}

async fn send(s: &mut (impl AsyncWrite + Unpin), what: &[u8]) -> Result<(), String> {
    s.write_all(what)
        .await
        .map_err(|e| format!("cannot send the request: {e}"))
}

async fn unix(mut s: tokio::net::UnixStream, host: &str) -> Result<(), String> {
    send(&mut s, format!("check {host}\n").as_bytes()).await?;
    let got = read_bounded(s, |got| got.contains(&b'\n')).await?;
    let text = String::from_utf8_lossy(&got);
    let line = text.lines().next().unwrap_or("").trim();
    match line {
        "ok" => Ok(()),
        "" => Err("the daemon closed the connection without an answer".into()),
        other => Err(accel_wire::limits::printable(
            other.strip_prefix("fail ").unwrap_or(other),
        )),
    }
}

async fn http(
    mut s: tokio::net::TcpStream,
    authority: &str,
    path: &str,
    host: &str,
) -> Result<(), String> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let host_q: String = host
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect();
    let req = format!(
        "GET {path}{sep}host={host_q} HTTP/1.0\r\nHost: {authority}\r\nUser-Agent: accel-agent\r\nConnection: close\r\n\r\n"
    );
    send(&mut s, req.as_bytes()).await?;
    let got = read_bounded(s, http_answered).await?;
    let text = String::from_utf8_lossy(&got);
    let status = text.lines().next().unwrap_or("").trim();
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP answer: {}", accel_input::excerpt(status)))?;
    if (200..300).contains(&code) {
        return Ok(());
    }
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    let said = match body.is_empty() {
        true => status.to_owned(),
        false => format!("{status}: {}", body.replace(['\r', '\n'], " ")),
    };
    Err(format!("{}", accel_input::excerpt(&said)))
}

/// Whether `got` holds a whole HTTP answer for the check: the head, and
/// for a failure its body (`Content-Length` of it, or, without one,
/// whatever came with the head or after it).
fn http_answered(got: &[u8]) -> bool {
    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&got[..end]);
    let ok = head
        .split_whitespace()
        .nth(1)
        .is_some_and(|c| c.starts_with('2') && c.len() == 3);
    let body = got.len() - end - 4;
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    ok || length.map_or(body > 0, |n| body >= n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            "unix:/run/h.sock".parse::<Endpoint>(),
            Ok(Endpoint::Unix("/run/h.sock".into()))
        );
        assert_eq!(
            "http://127.0.0.1:9400/health?x=1".parse::<Endpoint>(),
            Ok(Endpoint::Http {
                authority: "127.0.0.1:9400".into(),
                path: "/health?x=1".into()
            })
        );
        assert_eq!(
            "http://localhost"
                .parse::<Endpoint>()
                .map(|e| e.to_string()),
            Ok("http://localhost:80/".into())
        );
        for bad in [
            "https://x/",
            "unix:",
            "http://u@h/",
            "http://h:99999/",
            "/run/h.sock",
            "http://h/a b",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_unix_daemon_passes_or_fails_the_node_in_its_words() {
        let d = tempfile::tempdir().expect("dir");
        let sock = d.path().join("h.sock");
        let l = tokio::net::UnixListener::bind(&sock).expect("bind");
        let ep = Endpoint::Unix(sock.clone());
        for (answer, want) in [
            ("ok\n", Ok(())),
            ("fail XID 79 on GPU 2\n", Err("XID 79 on GPU 2")),
            ("", Err("without an answer")),
        ] {
            let serve = async {
                let (mut s, _) = l.accept().await.expect("accept");
                let mut buf = [0u8; 64];
                let n = s.read(&mut buf).await.expect("read");
                assert!(buf[..n].starts_with(b"check "), "{:?}", &buf[..n]);
                s.write_all(answer.as_bytes()).await.expect("write");
            };
            let (r, ()) = tokio::join!(ep.check(), serve);
            match want {
                Ok(()) => assert_eq!(r, Ok(())),
                Err(w) => {
                    let e = r.expect_err("fails");
                    assert!(
                        e.contains(w) && e.contains(&format!("unix:{}", sock.display())),
                        "{e}"
                    );
                }
            }
        }
        drop(l);
        std::fs::remove_file(&sock).expect("rm");
        assert!(ep
            .check()
            .await
            .expect_err("gone")
            .contains("cannot connect"));
    }

    #[tokio::test]
    async fn a_daemon_that_keeps_the_connection_open_is_answered_all_the_same() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let ep: Endpoint = format!("http://127.0.0.1:{port}/h").parse().expect("ep");
        for (answer, ok) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true),
            (
                "HTTP/1.1 500 Oops\r\nContent-Length: 9\r\n\r\nECC fault",
                false,
            ),
        ] {
            let serve = async {
                let (mut s, _) = l.accept().await.expect("accept");
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.expect("read");
                s.write_all(answer.as_bytes()).await.expect("write");
                // Kept open (HTTP/1.1 keep-alive) for longer than the wait.
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            };
            let check =
                async { tokio::time::timeout(std::time::Duration::from_secs(2), ep.check()).await };
            let (r, ()) = tokio::join!(check, serve);
            let r = r.expect("answered before the connection closed");
            match ok {
                true => assert_eq!(r, Ok(())),
                false => assert!(r.expect_err("fails").contains("500 Oops: ECC fault")),
            }
        }
    }

    #[tokio::test]
    async fn an_http_daemon_passes_on_2xx_and_fails_quoting_its_answer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let ep: Endpoint = format!("http://127.0.0.1:{port}/health")
            .parse()
            .expect("ep");
        for (answer, want) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Ok(())),
            (
                "HTTP/1.0 503 Service Unavailable\r\n\r\nGPU 2 thermal throttling\n",
                Err("503 Service Unavailable: GPU 2 thermal throttling"),
            ),
            ("SSH-2.0-OpenSSH\r\n", Err("not an HTTP answer")),
        ] {
            let serve = async {
                let (mut s, _) = l.accept().await.expect("accept");
                let mut buf = [0u8; 512];
                let n = s.read(&mut buf).await.expect("read");
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(req.starts_with("GET /health?host="), "{req}");
                s.write_all(answer.as_bytes()).await.expect("write");
            };
            let (r, ()) = tokio::join!(ep.check(), serve);
            match want {
                Ok(()) => assert_eq!(r, Ok(())),
                Err(w) => {
                    let e = r.expect_err("fails");
                    assert!(e.contains(w), "{e}");
                }
            }
        }
    }
}
