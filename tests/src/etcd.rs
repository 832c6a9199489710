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
}

impl EtcdCluster {
    /// Starts `n` members in `dir` and waits until the cluster serves.
    pub fn start(dir: &Path, n: usize) -> Self {
        Self::start_also_at(dir, n, None)
    }

    /// The same, the members also serving clients at `also` (an address of
    /// this namespace, such as a [`crate::Lan`]'s gateway), on the same ports.
    pub fn start_also_at(dir: &Path, n: usize, also: Option<&str>) -> Self {
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (the test command installs etcd-server)");
        self.members[i].child = Some(child);
    }
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
