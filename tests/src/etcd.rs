//! A real etcd cluster for the HA tests: one or three `etcd` members (the
//! binary the test command installs) on leased loopback ports ([`crate::lease`]), each with its own
//! data directory under the test's scratch directory. Members can be killed
//! and started again (with their data) to lose and regain quorum; every
//! member is killed when the cluster is dropped, and its data (tens of MiB
//! of preallocated log per member) deleted unless the test failed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::Port;

/// One member: its ports (leased for the cluster's lifetime: a member
/// restarted later binds them again) and, while it runs, its process.
#[derive(Debug)]
struct Member {
    name: String,
    client: Port,
    peer: Port,
    child: Option<Child>,
}

/// A running etcd cluster.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    token: String,
    members: Vec<Member>,
    /// An address clients reach the members at besides loopback.
    also: Option<String>,
    /// `--quota-backend-bytes`, where a test fills etcd ([`fill`]).
    quota: Option<u64>,
}

impl EtcdCluster {
    /// Starts `n` members in `dir` and waits until the cluster serves.
    pub fn start(dir: &Path, n: usize) -> Self {
        Self::start_also_at(dir, n, None)
    }

    /// The same, the members also serving clients at `also` (an address of
    /// this namespace, such as a [`crate::Lan`]'s gateway), on the same ports.
    pub fn start_also_at(dir: &Path, n: usize, also: Option<&str>) -> Self {
        Self::start_with(dir, n, also, None)
    }

    /// Starts `n` members whose database may grow to `quota` bytes only
    /// (`--quota-backend-bytes`), small enough for [`fill`] to reach it fast.
    pub fn start_with_quota(dir: &Path, n: usize, quota: u64) -> Self {
        Self::start_with(dir, n, None, Some(quota))
    }

    fn start_with(dir: &Path, n: usize, also: Option<&str>, quota: Option<u64>) -> Self {
        let dir = dir.join("etcd");
        fs::create_dir_all(&dir).expect("etcd dir");
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: Port::lease(),
                peer: Port::lease(),
                child: None,
            })
            .collect();
        let mut cluster = Self {
            token: format!("accel-test-{}", std::process::id()),
            dir,
            members,
            also: also.map(str::to_owned),
            quota,
        };
        for i in 0..n {
            cluster.start_member(i);
        }
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// The client URLs, comma-separated (`--etcd-endpoints`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client URLs at the address given to [`Self::start_also_at`].
    pub fn endpoints_at(&self, addr: &str) -> String {
        self.members
            .iter()
            .map(|m| format!("http://{addr}:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client)
    }

    /// Kills member `i` (SIGKILL); its data stays for [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again with its data.
    pub fn restart(&mut self, i: usize) {
        self.start_member(i);
    }

    /// Runs `etcdctl ARGS` against every member; its stdout, or panics.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &self.endpoints(), "--command-timeout", "5s"])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("run etcdctl (the test command installs it)");
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `etcdctl ARGS` against every member: its stdout, or its
    /// error's last line.
    pub fn try_ctl(&self, args: &[&str]) -> Result<String, String> {
        etcdctl(&self.endpoints(), args, None)
    }

    /// Waits until a quorum of members answers health checks.
    pub fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = Command::new("etcdctl")
                .args(["--endpoints", &self.endpoints(), "--command-timeout", "2s"])
                .args(["endpoint", "health", "--cluster"])
                .env("ETCDCTL_API", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            // `--cluster` fails while any member is down; a quorum is enough.
            let quorum = ok
                || Command::new("etcdctl")
                    .args(["--endpoints", &self.endpoints(), "--command-timeout", "2s"])
                    .args(["get", "accel-test-probe"])
                    .env("ETCDCTL_API", "3")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if quorum {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within {limit:?}; logs in {}",
                self.dir.display()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_member(&mut self, i: usize) {
        let initial = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let state = if data.exists() { "existing" } else { "new" };
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", m.name)))
            .expect("etcd log");
        let mut client = format!("http://127.0.0.1:{}", m.client);
        if let Some(also) = &self.also {
            client.push_str(&format!(",http://{also}:{}", m.client));
        }
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new("etcd")
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            // Quicker leader elections than the defaults (100 ms / 1 s).
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(
                self.quota
                    .map(|q| vec!["--quota-backend-bytes".to_owned(), q.to_string()])
                    .unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (the test command installs etcd-server)");
        self.members[i].child = Some(child);
    }
}

/// The prefix [`fill`] writes under.
const FILL: &str = "/accel-test-fill/";

/// `etcdctl` against `endpoints` (comma-separated) with `stdin`: its
/// stdout, or its stderr's last line.
fn etcdctl(endpoints: &str, args: &[&str], stdin: Option<&Path>) -> Result<String, String> {
    let mut cmd = Command::new("etcdctl");
    cmd.args(["--endpoints", endpoints, "--command-timeout", "10s"])
        .args(args)
        .env("ETCDCTL_API", "3")
        .stdin(match stdin {
            Some(p) => fs::File::open(p)
                .map(Stdio::from)
                .map_err(|e| format!("{}: {e}", p.display()))?,
            None => Stdio::null(),
        });
    let out = cmd
        .output()
        .map_err(|e| format!("run etcdctl (the test command installs it): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().last().unwrap_or("failed").to_owned())
    }
}

/// Fills the etcd at `endpoints` (started with a small
/// `--quota-backend-bytes`) until it refuses writes: the NOSPACE alarm is
/// raised and, until [`make_room`], etcd takes only reads and deletes (no
/// puts, no new leases). `scratch` holds the value written. How many
/// values it took.
pub fn fill(endpoints: &str, scratch: &Path) -> Result<usize, String> {
    let value = scratch.join("etcd-fill-value");
    // Incompressible, 1 MB (under etcd's 1.5 MiB request limit).
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let bytes: Vec<u8> = (0..1_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(&value, bytes).map_err(|e| format!("{}: {e}", value.display()))?;
    for i in 0..1000 {
        match etcdctl(endpoints, &["put", &format!("{FILL}{i}")], Some(&value)) {
            Ok(_) => {}
            Err(e) if e.contains("database space exceeded") => return Ok(i),
            Err(e) => return Err(format!("filling etcd: {e}")),
        }
    }
    Err("etcd took 1000 MB without reaching its quota: start it with --quota-backend-bytes".into())
}

/// Undoes [`fill`] as an operator recovers from NOSPACE: deletes what it
/// wrote, compacts, defragments every member and disarms the alarm.
pub fn make_room(endpoints: &str) -> Result<(), String> {
    etcdctl(endpoints, &["del", "--prefix", FILL], None)?;
    let head = etcdctl(endpoints, &["get", FILL, "-w", "json"], None)?;
    let rev = serde_json::from_str::<serde_json::Value>(&head)
        .ok()
        .and_then(|v| v["header"]["revision"].as_i64())
        .ok_or_else(|| format!("no revision in {head}"))?;
    if let Err(e) = etcdctl(endpoints, &["compact", &rev.to_string()], None) {
        // Compacted already (a member did it): nothing to do.
        if !e.contains("compacted") {
            return Err(e);
        }
    }
    etcdctl(endpoints, &["defrag"], None)?;
    etcdctl(endpoints, &["alarm", "disarm"], None)?;
    Ok(())
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}
