//! Starting workers as forks of a prepared process instead of executing a
//! program: the way the `accel` Python package's `notebook_launcher` runs a
//! function defined in a notebook cell (it cannot be imported by name from a
//! new interpreter, and arguments such as a `multiprocessing.Queue` only
//! travel by inheritance).
//!
//! The fork server is a single-threaded process that holds the function; it
//! is handed to the agent as one end of a Unix stream socket
//! (`--fork-server-fd`). Supervision stays here: the agent decides what runs
//! and when, owns the output pipes, signals the workers' process groups and
//! hears every exit; the server only forks and reaps.
//!
//! # Protocol
//! One JSON object per line, each way.
//! - Agent to server, one request at a time, with the worker's stdout and
//!   stderr (in that order) as `SCM_RIGHTS` on the same message:
//!   `{"spawn": {"id": 7, "local_rank": 0, "global_rank": 0, "env": [["K", "V"], ...]}}`.
//!   `env` is the worker's whole environment; `id` numbers the requests.
//!   A zygote ([`crate::zygote`]) also gets `"argv": ["-u", "script.py", ...]`,
//!   the interpreter's arguments an executed worker would have;
//!   `"tracer": PID`, the agent, which the worker lets trace it
//!   (`PR_SET_PTRACER`, for `py-spy`); with `--numa-binding`,
//!   `"cpus": [0, 1, ...]`, the CPUs the worker binds itself to before
//!   anything else, as an executed worker is bound before its `exec`;
//!   `"group": {"id": 3, "size": 2}` names the workers started together
//!   (one round on this node): a function's worker whose function returns
//!   stays alive until all `size` workers of its group have returned, as
//!   under torch's `elastic_launch` (a zygote's workers, scripts, do not
//!   wait, as executed ones do not).
//! - Server to agent: `{"spawned": {"id": 7, "local_rank": 0, "pid": 4242}}`
//!   or `{"refused": {"id": 7, "local_rank": 0, "error": "why"}}` for each
//!   request; then, at any time, `{"exited": {"pid": 4242, "code": 0}}` or
//!   `{"exited": {"pid": 4242, "signal": 9}}` once per worker it forked.
//!   An answer to a request the agent no longer waits for (it timed out) is
//!   a worker nobody supervises: the agent kills its process group.
//!
//! The forked worker leads its own process group, sets `PR_SET_PDEATHSIG`
//! to die with the server, and the server kills every worker it forked when
//! the agent's end of the socket closes. When the server's end closes (its
//! parent, the notebook's kernel, is gone), the agent stops as on SIGTERM.
//! Lines longer than [`MAX_LINE`] or malformed ones end the connection:
//! nothing the server sends can make the agent panic or grow without bound.

use std::collections::HashMap;
use std::io;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::sys::Ended;

/// The longest line the server may send.
pub const MAX_LINE: usize = 64 * 1024;

/// How long a spawn request may wait for its answer.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong talking to the fork server.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The socket failed or closed.
    #[error("the fork server's socket: {0}")]
    Io(#[from] io::Error),
    /// The server is gone.
    #[error("the fork server has closed its socket")]
    Closed,
    /// The server could not fork this worker.
    #[error("the fork server could not start it: {0}")]
    Refused(String),
    /// No answer in time.
    #[error("the fork server did not answer within {} s", SPAWN_TIMEOUT.as_secs())]
    Timeout,
}

/// A worker the server forked.
#[derive(Debug)]
pub struct Forked {
    /// Its process id.
    pub pid: i32,
    /// Resolves once, when it has ended.
    pub exit: oneshot::Receiver<Ended>,
}

/// One worker to fork.
#[derive(Debug)]
pub struct ForkRequest {
    /// Local rank.
    pub local_rank: u32,
    /// Global rank.
    pub global_rank: u32,
    /// The worker's whole environment.
    pub env: Vec<(String, String)>,
    /// Its standard output.
    pub stdout: OwnedFd,
    /// Its standard error.
    pub stderr: OwnedFd,
    /// The script to run, as the interpreter's arguments (a zygote's
    /// workers); `None`: the server's own target (a notebook's function).
    pub argv: Option<Vec<String>>,
    /// A process the worker lets trace it (`PR_SET_PTRACER`): the agent,
    /// whose `py-spy` reads the workers' stacks.
    pub tracer: Option<u32>,
    /// The CPUs the worker binds itself to first (`--numa-binding`).
    pub cpus: Option<Vec<u32>>,
    /// The workers started with it ([`ForkServer::group`]).
    pub group: Option<ForkGroup>,
}

/// Workers the agent starts together (one round on this node): a
/// function's worker that returns waits for the others of its group before
/// it ends, so that none closes its connections while a peer still sets up
/// the process group (see the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkGroup {
    /// Unique per server.
    pub id: u64,
    /// How many workers it has.
    pub size: u32,
}

#[derive(Debug, Default)]
struct Shared {
    /// The request in flight (one at a time) and where its answer goes.
    pending: Option<(u64, oneshot::Sender<Result<Forked, ForkError>>)>,
    /// The next request's id.
    next_id: u64,
    /// The last group's id.
    last_group: u64,
    /// Exit waiters, by pid.
    waiters: HashMap<i32, oneshot::Sender<Ended>>,
    closed: bool,
}

/// The agent's end of a fork server connection.
#[derive(Debug)]
pub struct ForkServer {
    /// Requests go one at a time: the lock is held until the answer.
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    shared: Arc<Mutex<Shared>>,
    reader: tokio::task::JoinHandle<()>,
    /// Whether its workers run the request's script (a zygote).
    runs_scripts: bool,
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl ForkServer {
    /// Takes over the agent's end of the socket. `on_close` runs once if the
    /// server's end closes or misbehaves (not when the agent drops it).
    pub fn start(
        fd: OwnedFd,
        on_close: impl FnOnce(&str) + Send + 'static,
    ) -> Result<Self, ForkError> {
        let std = std::os::unix::net::UnixStream::from(fd);
        std.set_nonblocking(true)?;
        let (read, write) = UnixStream::from_std(std)?.into_split();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let reader = tokio::spawn(read_loop(read, shared.clone(), on_close));
        Ok(Self {
            writer: tokio::sync::Mutex::new(write),
            shared,
            reader,
            runs_scripts: false,
        })
    }

    /// [`ForkServer::start`] for a zygote, whose workers run the script each
    /// request names.
    pub fn start_for_scripts(
        fd: OwnedFd,
        on_close: impl FnOnce(&str) + Send + 'static,
    ) -> Result<Self, ForkError> {
        let mut server = Self::start(fd, on_close)?;
        server.runs_scripts = true;
        Ok(server)
    }

    /// Whether its workers run the request's script.
    pub fn runs_scripts(&self) -> bool {
        self.runs_scripts
    }

    /// Whether the server's end has closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared).closed
    }

    /// A new group of `size` workers, for the requests that start them.
    pub fn group(&self, size: u32) -> ForkGroup {
        let mut shared = lock(&self.shared);
        shared.last_group += 1;
        ForkGroup {
            id: shared.last_group,
            size,
        }
    }

    /// Asks the server to fork one worker.
    pub async fn spawn(&self, req: ForkRequest) -> Result<Forked, ForkError> {
        let mut writer = self.writer.lock().await;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut shared = lock(&self.shared);
            if shared.closed {
                return Err(ForkError::Closed);
            }
            shared.next_id += 1;
            let id = shared.next_id;
            shared.pending = Some((id, tx));
            id
        };
        let env: Vec<Value> = req.env.iter().map(|(k, v)| json!([k, v])).collect();
        let mut spawn = json!({
            "id": id,
            "local_rank": req.local_rank,
            "global_rank": req.global_rank,
            "env": env,
        });
        if let Some(argv) = &req.argv {
            spawn["argv"] = json!(argv);
        }
        if let Some(tracer) = req.tracer {
            spawn["tracer"] = json!(tracer);
        }
        if let Some(cpus) = &req.cpus {
            spawn["cpus"] = json!(cpus);
        }
        if let Some(group) = req.group {
            spawn["group"] = json!({ "id": group.id, "size": group.size });
        }
        let mut line = json!({ "spawn": spawn }).to_string();
        line.push('\n');
        send_with_fds(&mut writer, line.as_bytes(), &[&req.stdout, &req.stderr]).await?;
        // The worker holds its own copies now.
        drop(req);
        match tokio::time::timeout(SPAWN_TIMEOUT, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(ForkError::Closed),
            Err(_) => {
                lock(&self.shared).pending = None;
                Err(ForkError::Timeout)
            }
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `bytes` with `fds` attached to the first part that goes out.
async fn send_with_fds(
    writer: &mut OwnedWriteHalf,
    bytes: &[u8],
    fds: &[&OwnedFd],
) -> io::Result<()> {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_fd().as_raw_fd()).collect();
    let stream: &UnixStream = writer.as_ref();
    let sent = loop {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || {
            let cmsg = [ControlMessage::ScmRights(&raw)];
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(bytes)],
                &cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        }) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    writer.write_all(&bytes[sent..]).await
}

/// Reads the server's lines until its end closes, answering requests and
/// exits; then fails whatever still waits and calls `on_close`.
async fn read_loop(
    read: OwnedReadHalf,
    shared: Arc<Mutex<Shared>>,
    on_close: impl FnOnce(&str) + Send + 'static,
) {
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    let why = loop {
        line.clear();
        let limit = (MAX_LINE + 1) as u64;
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) => break "the fork server closed its socket".to_string(),
            Ok(_) if line.last() != Some(&b'\n') => {
                break format!("the fork server sent a line over {MAX_LINE} bytes")
            }
            Ok(_) => {}
            Err(e) => break format!("reading from the fork server: {e}"),
        }
        if let Err(e) = handle(&line, &shared) {
            break format!("the fork server sent a malformed message ({e})");
        }
    };
    let (pending, waiters) = {
        let mut s = lock(&shared);
        s.closed = true;
        (s.pending.take(), std::mem::take(&mut s.waiters))
    };
    // First the agent is told to stop, so the workers' ends below are seen
    // as part of stopping rather than as failures to restart.
    on_close(&why);
    if let Some((_, p)) = pending {
        let _ = p.send(Err(ForkError::Closed));
    }
    // Its workers die with it (PR_SET_PDEATHSIG, SIGKILL).
    for (_, w) in waiters {
        let _ = w.send(Ended::Signaled(nix::sys::signal::Signal::SIGKILL as i32));
    }
}

/// Where the answer `o` goes: the request in flight, if `o` names it.
fn answering(o: &Value, s: &mut Shared) -> Option<oneshot::Sender<Result<Forked, ForkError>>> {
    let id = o.get("id").and_then(Value::as_u64);
    match &s.pending {
        Some((want, _)) if Some(*want) == id => s.pending.take().map(|(_, p)| p),
        _ => None,
    }
}

/// Acts on one line from the server.
fn handle(line: &[u8], shared: &Mutex<Shared>) -> Result<(), String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let int = |o: &Value, k: &str| -> Result<i64, String> {
        o.get(k)
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("'{k}' is not an integer"))
    };
    let pid_of = |o: &Value| -> Result<i32, String> {
        i32::try_from(int(o, "pid")?)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| "'pid' is out of range".to_string())
    };
    let mut s = lock(shared);
    if let Some(o) = v.get("spawned") {
        let pid = pid_of(o)?;
        match answering(o, &mut s) {
            Some(p) => {
                let (tx, exit) = oneshot::channel();
                s.waiters.insert(pid, tx);
                let _ = p.send(Ok(Forked { pid, exit }));
            }
            None => {
                tracing::warn!(
                    pid,
                    "the fork server started a worker nobody waits for (a late answer); killing it"
                );
                crate::sys::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
    } else if let Some(o) = v.get("refused") {
        let error = o
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        let error: String = error.chars().take(2000).collect();
        if let Some(p) = answering(o, &mut s) {
            let _ = p.send(Err(ForkError::Refused(error)));
        }
    } else if let Some(o) = v.get("exited") {
        let pid = pid_of(o)?;
        let ended = match (o.get("code"), o.get("signal")) {
            (Some(_), _) => Ended::Exited(int(o, "code")?.clamp(-255, 255) as i32),
            (None, Some(_)) => Ended::Signaled(int(o, "signal")?.clamp(1, 127) as i32),
            (None, None) => return Err("an exit has neither 'code' nor 'signal'".into()),
        };
        // An unknown pid is not ours to report.
        if let Some(w) = s.waiters.remove(&pid) {
            let _ = w.send(ended);
        }
    } else {
        return Err("unknown message".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream as StdStream;

    fn pipe_fds() -> (OwnedFd, OwnedFd) {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        (r, w)
    }

    fn request(rank: u32) -> ForkRequest {
        let (_, out) = pipe_fds();
        let (_, err) = pipe_fds();
        ForkRequest {
            local_rank: rank,
            global_rank: rank,
            env: vec![("A".into(), "1".into())],
            stdout: out,
            stderr: err,
            argv: None,
            tracer: Some(4242),
            cpus: Some(vec![0, 3]),
            group: Some(ForkGroup { id: 5, size: 2 }),
        }
    }

    /// A server played by the test on the other end of a socket pair.
    fn pair() -> (
        ForkServer,
        tokio::net::UnixStream,
        oneshot::Receiver<String>,
    ) {
        let (ours, theirs) = StdStream::pair().expect("pair");
        theirs.set_nonblocking(true).expect("nonblocking");
        let (tx, rx) = oneshot::channel();
        let server = ForkServer::start(OwnedFd::from(ours), move |why| {
            let _ = tx.send(why.to_string());
        })
        .expect("start");
        (
            server,
            tokio::net::UnixStream::from_std(theirs).expect("tokio"),
            rx,
        )
    }

    async fn read_line(s: &mut tokio::net::UnixStream) -> Value {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            s.read_exact(&mut byte).await.expect("read");
            if byte[0] == b'\n' {
                break;
            }
            buf.push(byte[0]);
        }
        serde_json::from_slice(&buf).expect("json")
    }

    #[tokio::test]
    async fn a_spawn_gets_its_pid_and_then_its_exit() {
        let (server, mut peer, _closed) = pair();
        let served = tokio::spawn(async move {
            let req = read_line(&mut peer).await;
            assert_eq!(req["spawn"]["local_rank"], 1);
            assert_eq!(req["spawn"]["env"][0], json!(["A", "1"]));
            assert_eq!(req["spawn"]["id"], 1);
            assert_eq!(req["spawn"]["tracer"], 4242);
            assert_eq!(req["spawn"]["cpus"], json!([0, 3]));
            assert_eq!(req["spawn"]["group"], json!({"id": 5, "size": 2}));
            peer.write_all(b"{\"spawned\": {\"id\": 1, \"local_rank\": 1, \"pid\": 77}}\n{\"exited\": {\"pid\": 77, \"code\": 3}}\n")
                .await
                .expect("write");
            peer
        });
        let forked = server.spawn(request(1)).await.expect("spawned");
        assert_eq!(forked.pid, 77);
        assert_eq!(forked.exit.await.expect("exit"), Ended::Exited(3));
        drop(served.await.expect("peer"));
    }

    #[tokio::test]
    async fn each_group_has_its_own_id() {
        let (server, _peer, _closed) = pair();
        let (a, b) = (server.group(2), server.group(2));
        assert_eq!((a.size, b.size), (2, 2));
        assert_ne!(a.id, b.id);
    }

    #[tokio::test]
    async fn an_answer_to_another_request_is_killed_not_taken() {
        // A real process in its own group plays the unwanted worker.
        let mut stray = std::process::Command::new("sleep");
        std::os::unix::process::CommandExt::process_group(&mut stray, 0);
        let mut stray = stray.arg("30").spawn().expect("sleep");
        let stray_pid = stray.id();
        let (server, mut peer, _closed) = pair();
        tokio::spawn(async move {
            read_line(&mut peer).await;
            let late = format!(
                "{{\"spawned\": {{\"id\": 99, \"local_rank\": 0, \"pid\": {stray_pid}}}}}\n"
            );
            peer.write_all(late.as_bytes()).await.expect("write");
            peer.write_all(b"{\"spawned\": {\"id\": 1, \"local_rank\": 0, \"pid\": 8}}\n")
                .await
                .expect("write");
            std::future::pending::<()>().await;
        });
        let forked = server.spawn(request(0)).await.expect("spawned");
        assert_eq!(forked.pid, 8);
        let status = stray.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_naming_why() {
        let (server, mut peer, _closed) = pair();
        tokio::spawn(async move {
            read_line(&mut peer).await;
            peer.write_all(
                b"{\"refused\": {\"id\": 1, \"local_rank\": 0, \"error\": \"no memory\"}}\n",
            )
            .await
            .expect("write");
            std::future::pending::<()>().await;
        });
        let err = server.spawn(request(0)).await.expect_err("refused");
        assert!(err.to_string().contains("no memory"), "{err}");
    }

    #[tokio::test]
    async fn a_closed_server_ends_its_workers_and_says_so() {
        let (server, mut peer, closed) = pair();
        let served = tokio::spawn(async move {
            read_line(&mut peer).await;
            peer.write_all(b"{\"spawned\": {\"id\": 1, \"local_rank\": 0, \"pid\": 5}}\n")
                .await
                .expect("write");
            peer
        });
        let forked = server.spawn(request(0)).await.expect("spawned");
        drop(served.await.expect("peer"));
        assert_eq!(forked.exit.await.expect("exit"), Ended::Signaled(9));
        assert!(closed.await.expect("closed").contains("closed"));
        assert!(matches!(
            server.spawn(request(1)).await,
            Err(ForkError::Closed)
        ));
    }

    #[tokio::test]
    async fn garbage_or_an_endless_line_closes_the_connection() {
        for junk in [
            b"{\"exited\": {\"pid\": -1, \"code\": 0}}\n".to_vec(),
            b"not json\n".to_vec(),
            vec![b'x'; MAX_LINE + 10],
        ] {
            let (_server, mut peer, closed) = pair();
            peer.write_all(&junk).await.expect("write");
            let why = closed.await.expect("closed");
            assert!(why.contains("malformed") || why.contains("over"), "{why}");
        }
    }
}
