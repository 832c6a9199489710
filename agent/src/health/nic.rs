//! `--health-check-nic`: the links the collectives use, as sysfs shows them.
//!
//! A NIC that lost its link makes every collective of the round hang until
//! a timeout, and one that drops packets makes it crawl; both are visible in
//! sysfs long before a worker fails. For each interface checked:
//! - a network interface (`/sys/class/net/NAME`): `operstate` must be `up`
//!   (or `unknown` with `carrier` 1, as some drivers report a working link),
//!   and its receive and transmit error counters may not have grown faster
//!   than [`ERRORS_PER_SECOND`] since the last check (over at least a
//!   second: a burst right after a check is judged as well);
//! - an InfiniBand port (`/sys/class/infiniband/DEV/ports/N`): `state` must
//!   be `ACTIVE` and `phys_state` `LinkUp`, and `counters/link_downed` may
//!   not have grown since the last check.
//!
//! Which interfaces: the names given (`eth0,ib0`, an InfiniBand device
//! `mlx5_0` for all its ports, or one port `mlx5_0:1`), or `auto`, what the
//! collectives would use when the agent starts:
//! - the interfaces `NCCL_SOCKET_IFNAME` selects, in NCCL's syntax
//!   (prefixes, `=` for exact names, `^` to exclude), else those
//!   `GLOO_SOCKET_IFNAME` names (gloo's syntax: exact names), else every
//!   physical interface (one with a `device` in sysfs) but loopback, a bond's
//!   member counting as its bond (`master`: an active-backup bond whose
//!   backup link is down still carries traffic);
//! - the InfiniBand ports `NCCL_IB_HCA` selects (NCCL's syntax, a port
//!   named with `:N`), else every port;
//!
//! in each case only the links that are up at that moment (NCCL skips a
//! port that is not ACTIVE, and an unplugged second port is no fault): the
//! ones left out are logged. A selection that finds nothing is a
//! configuration error, said when the agent starts.
//!
//! The sysfs root is `/sys` unless `--health-check-sysfs` says otherwise
//! (a container that mounts the host's sysfs elsewhere; tests use a fake
//! tree read the same way).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How many receive and transmit errors a second an interface may count
/// between two checks before the check fails.
pub const ERRORS_PER_SECOND: u64 = 10;

/// One link checked.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Link {
    /// A network interface.
    Net(String),
    /// An InfiniBand device's port.
    Ib(String, u32),
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Link::Net(n) => write!(f, "{n}"),
            Link::Ib(d, p) => write!(f, "{d} port {p}"),
        }
    }
}

/// The NIC check: its links and what their counters said last time.
#[derive(Debug, Clone)]
pub struct NicCheck {
    sysfs: PathBuf,
    links: Vec<Link>,
    /// Error counters (interfaces) and link-down counts (ports) at the last
    /// check, by link, and when they were read.
    last: Arc<Mutex<HashMap<Link, (u64, Instant)>>>,
}

impl PartialEq for NicCheck {
    fn eq(&self, other: &Self) -> bool {
        self.sysfs == other.sysfs && self.links == other.links
    }
}

impl Eq for NicCheck {}

impl NicCheck {
    /// The check of `spec` (`auto` or a comma-separated list of names) under
    /// `sysfs`; `env` reads the selecting variables. `Err`: what is wrong
    /// with the selection, for the user.
    pub fn new(
        spec: &str,
        sysfs: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let mut check = Self {
            sysfs: sysfs.to_path_buf(),
            links: Vec::new(),
            last: Arc::default(),
        };
        check.links = match spec.trim() {
            "auto" => {
                let (up, down): (Vec<Link>, Vec<Link>) = auto(sysfs, &env)?
                    .into_iter()
                    .partition(|l| check.check_link(l, &mut HashMap::new()).is_ok());
                if !down.is_empty() {
                    tracing::info!(
                        links = %words(&down),
                        "--health-check-nic auto: links down at start are not checked (the collectives do not use them)"
                    );
                }
                if up.is_empty() {
                    return Err(format!(
                        "--health-check-nic auto: every link it would check is down ({}); name the links to check (--health-check-nic eth0,mlx5_0) or bring one up",
                        words(&down)
                    ));
                }
                up
            }
            list => named(sysfs, list)?,
        };
        Ok(check)
    }

    /// The links checked.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// Reads every link's state: `Err` names each bad one and why.
    pub fn check(&self) -> Result<(), String> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let bad: Vec<String> = self
            .links
            .iter()
            .filter_map(|l| {
                self.check_link(l, &mut last)
                    .err()
                    .map(|e| format!("{l}: {e}"))
            })
            .collect();
        match bad.is_empty() {
            true => Ok(()),
            false => Err(format!("nic {}", bad.join(", "))),
        }
    }

    fn check_link(
        &self,
        link: &Link,
        last: &mut HashMap<Link, (u64, Instant)>,
    ) -> Result<(), String> {
        match link {
            Link::Net(name) => {
                let dir = self.sysfs.join("class/net").join(name);
                let oper = read(&dir.join("operstate")).ok_or("gone (no operstate in sysfs)")?;
                // `carrier` cannot be read while the interface is down.
                let carrier = read(&dir.join("carrier")).is_some_and(|c| c == "1");
                match oper.as_str() {
                    "up" => {}
                    "unknown" if carrier => {}
                    other => return Err(format!("operstate {other}")),
                }
                if !carrier && oper == "up" {
                    return Err("no carrier".into());
                }
                let errors = ["rx_errors", "tx_errors"]
                    .iter()
                    .filter_map(|c| read(&dir.join("statistics").join(c))?.parse::<u64>().ok())
                    .fold(0u64, u64::saturating_add);
                grown(last, link, errors, ERRORS_PER_SECOND)
                    .map_err(|(n, secs)| format!("{n} receive/transmit errors in {secs:.1} s"))
            }
            Link::Ib(dev, port) => {
                let dir = self
                    .sysfs
                    .join("class/infiniband")
                    .join(dev)
                    .join("ports")
                    .join(port.to_string());
                let state = read(&dir.join("state")).ok_or("gone (no state in sysfs)")?;
                if !state.ends_with("ACTIVE") {
                    return Err(format!("state {state}"));
                }
                let phys = read(&dir.join("phys_state")).unwrap_or_default();
                if !phys.ends_with("LinkUp") {
                    return Err(format!("physical state {phys}"));
                }
                let downed = read(&dir.join("counters/link_downed"))
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0);
                grown(last, link, downed, 0)
                    .map_err(|(n, secs)| format!("the link went down {n} times in {secs:.1} s"))
            }
        }
    }
}

/// Records counter value `now` for `link`; `Err((growth, seconds))` when it
/// grew faster than `per_second` since the last record, judged over at
/// least a second (a counter that went back, a reset, is no growth).
fn grown(
    last: &mut HashMap<Link, (u64, Instant)>,
    link: &Link,
    now: u64,
    per_second: u64,
) -> Result<(), (u64, f64)> {
    let at = Instant::now();
    let Some((before, then)) = last.insert(link.clone(), (now, at)) else {
        return Ok(());
    };
    let elapsed = at.duration_since(then).as_secs_f64();
    let growth = now.saturating_sub(before);
    match growth as f64 > per_second as f64 * elapsed.max(1.0) {
        true => Err((growth, elapsed)),
        false => Ok(()),
    }
}

/// Links in words, comma-separated.
fn words(links: &[Link]) -> String {
    links
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sysfs attribute, trimmed; `None` if it cannot be read.
fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The names in a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The ports of InfiniBand device `dev`.
fn ports(sysfs: &Path, dev: &str) -> Vec<Link> {
    let mut ports: Vec<u32> = names(&sysfs.join("class/infiniband").join(dev).join("ports"))
        .iter()
        .filter_map(|p| p.parse().ok())
        .collect();
    ports.sort_unstable();
    ports.into_iter().map(|p| Link::Ib(dev.into(), p)).collect()
}

/// The links of a comma-separated list of names.
fn named(sysfs: &Path, list: &str) -> Result<Vec<Link>, String> {
    let mut links = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.contains('/') || name.starts_with('.') {
            return Err(format!(
                "--health-check-nic: {name:?} is not an interface name"
            ));
        }
        if sysfs.join("class/net").join(name).is_dir() {
            links.push(Link::Net(name.into()));
            continue;
        }
        let (dev, port) = match name.split_once(':') {
            Some((d, p)) => (d, Some(p)),
            None => (name, None),
        };
        if !sysfs.join("class/infiniband").join(dev).is_dir() {
            return Err(format!(
                "--health-check-nic: no network interface or InfiniBand device {name:?} in {} (interfaces: {}; InfiniBand: {})",
                sysfs.display(),
                or_none(names(&sysfs.join("class/net"))),
                or_none(names(&sysfs.join("class/infiniband")))
            ));
        }
        match port {
            None => links.extend(ports(sysfs, dev)),
            Some(p) => match p.parse::<u32>() {
                Ok(p) if ports(sysfs, dev).contains(&Link::Ib(dev.into(), p)) => {
                    links.push(Link::Ib(dev.into(), p))
                }
                _ => return Err(format!("--health-check-nic: {dev} has no port {p:?}")),
            },
        }
    }
    if links.is_empty() {
        return Err(
            "--health-check-nic: no interface named (give names like eth0,mlx5_0 or `auto`)".into(),
        );
    }
    links.sort();
    links.dedup();
    Ok(links)
}

fn or_none(v: Vec<String>) -> String {
    match v.is_empty() {
        true => "none".into(),
        false => v.join(", "),
    }
}

/// Whether an NCCL-style list selects something: entries separated by
/// commas, each matched by `matches(entry, exact)` (`=` before the list:
/// exact names, else prefixes); a leading `^` excludes what it matches
/// instead.
fn nccl_selects(list: &str, matches: impl Fn(&str, bool) -> bool) -> bool {
    let (exclude, list) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let (exact, list) = match list.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|e| matches(e, exact));
    hit != exclude
}

/// Whether `name` is selected by an NCCL-style list (`eth,ib` prefixes;
/// `=eth0` exact names; a leading `^` excludes what follows instead).
fn selects(list: &str, name: &str) -> bool {
    nccl_selects(list, |p, exact| match exact {
        true => name == p,
        false => name.starts_with(p),
    })
}

/// `auto`: what NCCL (or gloo) would use.
fn auto(sysfs: &Path, env: &impl Fn(&str) -> Option<String>) -> Result<Vec<Link>, String> {
    let mut links = Vec::new();
    let net = sysfs.join("class/net");
    let set = |k: &str| env(k).filter(|s| !s.trim().is_empty());
    let (nccl, gloo) = (set("NCCL_SOCKET_IFNAME"), set("GLOO_SOCKET_IFNAME"));
    for n in names(&net) {
        let chosen = match (&nccl, &gloo) {
            (Some(list), _) => selects(list, &n),
            // gloo takes exact names, comma-separated.
            (None, Some(list)) => list.split(',').any(|g| g.trim() == n),
            (None, None) => n != "lo" && net.join(&n).join("device").exists(),
        };
        if !chosen {
            continue;
        }
        // A bond's member counts as its bond (default selection only: a
        // named interface is the one checked).
        let bond = (nccl.is_none() && gloo.is_none())
            .then(|| std::fs::read_link(net.join(&n).join("master")).ok())
            .flatten()
            .and_then(|m| m.file_name().and_then(|f| f.to_str()).map(str::to_owned));
        links.push(Link::Net(bond.unwrap_or(n)));
    }
    let hca = set("NCCL_IB_HCA");
    for dev in names(&sysfs.join("class/infiniband")) {
        for link in ports(sysfs, &dev) {
            let Link::Ib(_, port) = &link else { continue };
            if hca
                .as_deref()
                .is_none_or(|list| selects_port(list, &dev, *port))
            {
                links.push(link);
            }
        }
    }
    if links.is_empty() {
        return Err(format!(
            "--health-check-nic auto: no interface to check in {} ({}); name them (--health-check-nic eth0,mlx5_0) or set NCCL_SOCKET_IFNAME",
            sysfs.display(),
            match nccl.as_ref().or(gloo.as_ref()) {
                Some(s) => format!("none matches NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME={s:?}"),
                None => "no physical network interface and no InfiniBand device".into(),
            }
        ));
    }
    links.sort();
    links.dedup();
    Ok(links)
}

/// Whether `NCCL_IB_HCA`'s `list` selects port `port` of `dev`: entries
/// `DEV[:PORT]`, device names as prefixes (`=`: exact), a leading `^`
/// excluding what follows instead.
fn selects_port(list: &str, dev: &str, port: u32) -> bool {
    nccl_selects(list, |e, exact| {
        let (d, p) = match e.split_once(':') {
            Some((d, p)) => (d, p.parse::<u32>().ok()),
            None => (e, None),
        };
        let named = match exact {
            true => dev == d,
            false => dev.starts_with(d),
        };
        named && p.is_none_or(|p| p == port)
    })
}

/// Writes a fake sysfs tree.
#[cfg(test)]
mod fake {
    use std::path::Path;

    /// A network interface `name` in `state` (`up`, `down`), with a carrier
    /// unless down, a `device` link unless `virtual_`, and `errors` receive errors.
    pub(super) fn net(sysfs: &Path, name: &str, state: &str, errors: u64, virtual_: bool) {
        let dir = sysfs.join("class/net").join(name);
        std::fs::create_dir_all(dir.join("statistics")).expect("fake sysfs");
        if !virtual_ {
            std::fs::create_dir_all(dir.join("device")).expect("fake sysfs");
        }
        let carrier = if state == "down" { "0" } else { "1" };
        for (f, v) in [
            ("operstate", state.to_owned()),
            ("carrier", carrier.to_owned()),
            ("statistics/rx_errors", errors.to_string()),
            ("statistics/tx_errors", "0".to_owned()),
        ] {
            std::fs::write(dir.join(f), format!("{v}\n")).expect("fake sysfs");
        }
    }

    /// An InfiniBand port.
    pub(super) fn ib(sysfs: &Path, dev: &str, port: u32, state: &str, phys: &str, downed: u64) {
        let dir = sysfs
            .join("class/infiniband")
            .join(dev)
            .join("ports")
            .join(port.to_string());
        std::fs::create_dir_all(dir.join("counters")).expect("fake sysfs");
        for (f, v) in [
            ("state", state.to_owned()),
            ("phys_state", phys.to_owned()),
            ("counters/link_downed", downed.to_string()),
        ] {
            std::fs::write(dir.join(f), format!("{v}\n")).expect("fake sysfs");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_link_that_goes_down_or_loses_packets_fails_by_name() {
        let d = tempfile::tempdir().expect("dir");
        let s = d.path();
        fake::net(s, "eth0", "up", 5, false);
        fake::ib(s, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", 0);
        let c = NicCheck::new("eth0,mlx5_0", s, no_env).expect("check");
        assert_eq!(
            c.links(),
            [Link::Net("eth0".into()), Link::Ib("mlx5_0".into(), 1)]
        );
        assert_eq!(c.check(), Ok(()));
        // A few errors a second are tolerated, a burst is not, even right
        // after a check (judged over a second at least).
        fake::net(s, "eth0", "up", 5 + ERRORS_PER_SECOND, false);
        assert_eq!(c.check(), Ok(()));
        fake::net(s, "eth0", "up", 5 + 3 * ERRORS_PER_SECOND, false);
        let e = c.check().expect_err("errors");
        assert!(
            e.contains("eth0: 20 receive/transmit errors in 0.0 s"),
            "{e}"
        );
        assert_eq!(c.check(), Ok(()));
        fake::net(s, "eth0", "down", 0, false);
        fake::ib(s, "mlx5_0", 1, "1: DOWN", "3: Disabled", 1);
        let e = c.check().expect_err("down");
        assert_eq!(e, "nic eth0: operstate down, mlx5_0 port 1: state 1: DOWN");
        fake::net(s, "eth0", "up", 0, false);
        fake::ib(s, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", 2);
        let e = c.check().expect_err("flapped");
        assert!(
            e.contains("mlx5_0 port 1: the link went down 2 times in"),
            "{e}"
        );
        assert_eq!(c.check(), Ok(()));
        std::fs::remove_dir_all(s.join("class/net/eth0")).expect("unplug");
        assert!(c.check().expect_err("gone").contains("eth0: gone"));
    }

    #[test]
    fn auto_follows_nccl_and_gloo_selections() {
        let d = tempfile::tempdir().expect("dir");
        let s = d.path();
        fake::net(s, "lo", "unknown", 0, true);
        fake::net(s, "eth0", "up", 0, false);
        fake::net(s, "eth1", "up", 0, false);
        fake::net(s, "docker0", "up", 0, true);
        fake::ib(s, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", 0);
        fake::ib(s, "mlx5_1", 1, "4: ACTIVE", "5: LinkUp", 0);
        let links = |env: &[(&str, &str)]| {
            let env: HashMap<String, String> = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            NicCheck::new("auto", s, |k| env.get(k).cloned()).map(|c| {
                c.links()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            links(&[]).expect("auto"),
            ["eth0", "eth1", "mlx5_0 port 1", "mlx5_1 port 1"]
        );
        assert_eq!(
            links(&[("NCCL_SOCKET_IFNAME", "=eth1"), ("NCCL_IB_HCA", "mlx5_1:1")]).expect("auto"),
            ["eth1", "mlx5_1 port 1"]
        );
        assert_eq!(
            links(&[("NCCL_SOCKET_IFNAME", "^eth"), ("NCCL_IB_HCA", "^mlx5_0")]).expect("auto"),
            ["docker0", "lo", "mlx5_1 port 1"]
        );
        // gloo's variable holds exact names.
        assert_eq!(
            links(&[("GLOO_SOCKET_IFNAME", "eth"), ("NCCL_IB_HCA", "=mlx5_1")]).expect("auto"),
            ["mlx5_1 port 1"]
        );
        assert_eq!(
            links(&[("GLOO_SOCKET_IFNAME", "eth0,docker0")]).expect("auto"),
            ["docker0", "eth0", "mlx5_0 port 1", "mlx5_1 port 1"]
        );
        // A port NCCL_IB_HCA names is the only one of its device; a port
        // down at start is left out (the collectives skip it).
        fake::ib(s, "mlx5_1", 2, "1: DOWN", "2: Polling", 0);
        assert_eq!(
            links(&[("NCCL_IB_HCA", "mlx5_1:1")]).expect("auto"),
            ["eth0", "eth1", "mlx5_1 port 1"]
        );
        assert_eq!(
            links(&[]).expect("auto"),
            ["eth0", "eth1", "mlx5_0 port 1", "mlx5_1 port 1"]
        );
        // A bond's member counts as its bond.
        fake::net(s, "bond0", "up", 0, true);
        std::os::unix::fs::symlink("../bond0", s.join("class/net/eth1/master")).expect("enslave");
        assert_eq!(
            links(&[]).expect("auto"),
            ["bond0", "eth0", "mlx5_0 port 1", "mlx5_1 port 1"]
        );
        // Everything down: refused, naming what is down.
        fake::net(s, "eth0", "down", 0, false);
        fake::net(s, "bond0", "down", 0, true);
        let e = links(&[
            ("NCCL_SOCKET_IFNAME", "eth0,bond0"),
            ("NCCL_IB_HCA", "mlx5_1:2"),
        ])
        .expect_err("all down");
        assert!(
            e.contains("every link it would check is down") && e.contains("mlx5_1 port 2"),
            "{e}"
        );

        std::fs::remove_dir_all(s.join("class/infiniband")).expect("no ib");
        let e = links(&[("NCCL_SOCKET_IFNAME", "ens")]).expect_err("nothing");
        assert!(e.contains("none matches") && e.contains("\"ens\""), "{e}");
    }

    #[test]
    fn a_name_that_is_not_there_is_said_with_what_is() {
        let d = tempfile::tempdir().expect("dir");
        let s = d.path();
        fake::net(s, "eth0", "up", 0, false);
        fake::ib(s, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", 0);
        let e = NicCheck::new("eth9", s, no_env).expect_err("missing");
        assert!(
            e.contains("\"eth9\"") && e.contains("interfaces: eth0; InfiniBand: mlx5_0"),
            "{e}"
        );
        let e = NicCheck::new("mlx5_0:2", s, no_env).expect_err("no port");
        assert!(e.contains("mlx5_0 has no port \"2\""), "{e}");
        assert!(NicCheck::new("../etc", s, no_env).is_err());
        assert!(NicCheck::new(" , ", s, no_env).is_err());
        // `unknown` with a carrier is a working link.
        fake::net(s, "tun0", "unknown", 0, true);
        let c = NicCheck::new("tun0", s, no_env).expect("tun0");
        assert_eq!(c.check(), Ok(()));
    }
}
