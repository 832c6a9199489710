//! The status page on rdzv-server's metrics listener: the page and its
//! files for anyone, the jobs (`/api/jobs`, what `status --json` prints)
//! only for a caller on the server's host or one presenting the token.

use std::time::Duration;

use serde_json::Value;

use accel_tests::{http_get_with, poll_until, AgentCmd, Server};

const TOKEN: &str = "status-page-test-token-8d2e41";
const LIMIT: Duration = Duration::from_secs(60);

/// This host's first address that is not loopback (`hostname -I`).
fn routable_ip() -> String {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .expect("an IPv4 address that is not loopback")
        .to_owned()
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn the_page_is_for_anyone_and_the_jobs_for_this_host_or_the_token() {
    let server = Server::start_with(
        "127.0.0.1:0",
        &[],
        &[("RDZV_TOKEN", TOKEN), ("RDZV_METRICS_BIND", "0.0.0.0:0")],
    );
    let port = server
        .metrics
        .as_deref()
        .and_then(|m| m.rsplit(':').next())
        .expect("metrics port")
        .to_owned();
    let near = format!("127.0.0.1:{port}");
    let far = format!("{}:{port}", routable_ip());
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            AgentCmd::c10d(&server.addr, "page-job")
                .nnodes(2)
                .nproc(1)
                .env("ACCEL_RDZV_TOKEN", TOKEN)
                .no_python("sleep", &["60"])
                .start(&accel_tests::scratch("status-page"), name)
        })
        .collect();

    // The page and its files, hardened, from anywhere.
    for (path, kind) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/app.css", "text/css"),
    ] {
        let (status, head, body) = http_get_with(&far, path, &[]).expect("answer");
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            header(&head, "content-type").is_some_and(|t| t.starts_with(kind)),
            "{head}"
        );
        let csp = header(&head, "content-security-policy").expect("a CSP");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        assert!(!body.contains(TOKEN));
    }
    let (_, _, index) = http_get_with(&far, "/", &[]).expect("page");
    assert!(
        index.contains("/app.js") && index.contains("/api/jobs"),
        "{index}"
    );

    // The jobs: from this host without the token, the job running on two nodes.
    let doc = poll_until("the job runs, seen on the page", LIMIT, || {
        let (status, _, body) = http_get_with(&near, "/api/jobs", &[]).ok_or("no answer")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let running = v["jobs"][0]["phase"] == "running"
            && v["jobs"][0]["nodes"]
                .as_array()
                .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["state"] == "running"));
        match (status, running) {
            (200, true) => Ok(v),
            _ => Err(format!("{status} {v}")),
        }
    });
    assert_eq!(doc["jobs"][0]["job_id"], "page-job", "{doc}");
    assert_eq!(doc["more"], false, "{doc}");

    // From another address: refused without the token (saying why), and
    // with a wrong one; admitted with it.
    let (status, head, body) = http_get_with(&far, "/api/jobs", &[]).expect("answer");
    assert_eq!(status, 401, "{head}");
    assert!(
        body.contains("requires its token") && !body.contains("page-job"),
        "{body}"
    );
    let (status, _, _) = http_get_with(
        &far,
        "/api/jobs",
        &[("Authorization", "Bearer not-the-token-000000")],
    )
    .expect("answer");
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, body) =
        http_get_with(&far, "/api/jobs", &[("Authorization", &bearer)]).expect("answer");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("page-job"), "{body}");
    // The metrics stay open to scrapers.
    let (status, _, _) = http_get_with(&far, "/metrics", &[]).expect("answer");
    assert_eq!(status, 200);
    for a in agents {
        a.signal("TERM");
        let _ = a.wait(LIMIT);
    }
}

/// The page in a real browser (Debian's `chromium`, headless): its script
/// runs, fetches the jobs and shows the job, its round and its nodes.
#[test]
fn headless_chromium_shows_the_running_job_and_its_nodes() {
    let server = Server::start();
    let metrics = server.metrics.clone().expect("metrics");
    let dir = accel_tests::scratch("status-page-browser");
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            AgentCmd::c10d(&server.addr, "browser-job")
                .nnodes(2)
                .nproc(1)
                .no_python("sleep", &["60"])
                .start(&dir, name)
        })
        .collect();
    poll_until("the job runs", LIMIT, || {
        let jobs = accel_tests::status_jobs(&server.addr, &[])?;
        match jobs.first().map(|j| j["phase"].clone()) {
            Some(p) if p == "running" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // Seven seconds of the page's clock: several of its 2 s polls.
    let dom = dump_dom(&dir, &format!("http://{metrics}/"), 7000);
    assert!(
        dom.contains("data-job=\"browser-job\""),
        "the page shows the job: {dom}"
    );
    assert!(dom.contains("phase-running"), "{dom}");
    assert_eq!(dom.matches("data-node=").count(), 2, "both nodes: {dom}");
    assert!(dom.contains("1 job (1 running)"), "the summary line: {dom}");
    // It refreshed by itself, without a reload.
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the refresh count");
    assert!(refreshes >= 3, "{refreshes} refreshes in 7 s: {dom}");
    screenshot(
        &dir,
        &format!("http://{metrics}/"),
        "status-page-running",
        (1200, 560),
    );
    for a in agents {
        a.signal("TERM");
        let _ = a.wait(LIMIT);
    }
}

/// Runs headless Chromium (Debian's package, which scripts/setup.sh
/// installs) with its profile in `profile` and `args` after the common ones.
fn chromium(profile: &std::path::Path, args: &[String]) -> std::process::Output {
    std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium (scripts/setup.sh installs Debian's package)")
}

/// Headless Chromium's DOM of the page at `url` after `budget_ms` of the
/// page's clock.
pub(crate) fn dump_dom(dir: &std::path::Path, url: &str, budget_ms: u32) -> String {
    let out = chromium(
        &dir.join("chromium-profile"),
        &[
            format!("--virtual-time-budget={budget_ms}"),
            "--dump-dom".to_owned(),
            url.to_owned(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A screenshot of the page at `url` (`width`x`height`), as `name`.png in
/// `ACCEL_SCREENSHOTS` (scripts/screenshots.sh points it at the
/// documentation's images) or else in `dir`; checked to be a PNG.
fn screenshot(dir: &std::path::Path, url: &str, name: &str, size: (u32, u32)) {
    let into = std::env::var_os("ACCEL_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.to_path_buf());
    std::fs::create_dir_all(&into).expect("screenshot dir");
    let file = into.join(format!("{name}.png"));
    let out = chromium(
        &dir.join(format!("chromium-profile-{name}")),
        &[
            "--hide-scrollbars".to_owned(),
            "--virtual-time-budget=3000".to_owned(),
            format!("--window-size={},{}", size.0, size.1),
            format!("--screenshot={}", file.display()),
            url.to_owned(),
        ],
    );
    let png = std::fs::read(&file).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {}: {e}\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} is not a screenshot ({} bytes)",
        file.display(),
        png.len()
    );
}

/// When the server's kept stacks of `job` were collected (Unix ms).
fn stacks_at(metrics: &str, job: &str) -> Result<u64, String> {
    let (status, _, body) =
        http_get_with(metrics, &format!("/api/stacks?job={job}"), &[]).ok_or("no answer")?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    match (status, v["at_unix_ms"].as_u64()) {
        (200, Some(at)) => Ok(at),
        _ => Err(format!("{status} {body}")),
    }
}

/// A 3-node job seen in the browser through a hang: in the first attempt
/// rank 2 sleeps inside a function past its FileTimer while ranks 0-1 wait
/// in a barrier. The page shows the restart, the root cause and every
/// rank's stacks as the hang collected them, grouped 1 + 2, without being
/// asked; a link to `#stacks=JOB` asks for a new collection on load, and
/// the button's request needs its header.
#[test]
fn headless_chromium_shows_a_hang_s_restart_root_cause_and_grouped_stacks() {
    let _heavy = crate::heavy();
    let server = Server::start();
    let metrics = server.metrics.clone().expect("metrics");
    let dir = accel_tests::scratch("status-page-hang");
    let place = dir.join("place");
    std::fs::create_dir_all(&place).expect("place dir");
    // Node c's health check takes 8 s once the first attempt's ranks are
    // in place: the job waits for it after the restart, mid-restart.
    let check = format!(
        "if [ -e {p}/rank-2-attempt-0 ] && [ ! -e {p}/slept ]; then touch {p}/slept; sleep 8; fi",
        p = place.display()
    );
    let agents: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|name| {
            let cmd = match *name {
                "c" => AgentCmd::c10d(&server.addr, "page-hang").flag("--health-check", &check),
                _ => AgentCmd::c10d(&server.addr, "page-hang"),
            };
            cmd.nnodes(3)
                .nproc(1)
                .max_restarts(1)
                .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
                .env("HANG_AFTER", "3")
                .env("PLACE_DIR", place.display())
                .script(accel_tests::worker("stacks_job.py"))
                .start(&dir, name)
        })
        .collect();
    // Mid-restart: the budget is spent, the root cause and the hang's
    // stacks are shown, and the round waits for node c.
    poll_until(
        "the job is forming after the hang",
        Duration::from_secs(120),
        || {
            let jobs = accel_tests::status_jobs(&server.addr, &[])?;
            let j = jobs.first().ok_or("no job")?;
            match (j["phase"].as_str(), j["restart_count"].as_u64()) {
                (Some("forming"), Some(1)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    let dom = dump_dom(&dir, &format!("http://{metrics}/"), 2000);
    assert!(dom.contains("phase-forming"), "{dom}");
    assert!(dom.contains("1 of 1 (0 left)"), "the restart: {dom}");
    assert!(dom.contains("class=\"root-cause\""), "{dom}");
    assert!(dom.contains("round 0 restarted: "), "{dom}");
    screenshot(
        &dir,
        &format!("http://{metrics}/"),
        "status-page-restarting",
        (1200, 760),
    );
    // The hang restarted the job, and the stacks it collected are kept.
    poll_until(
        "the job restarted after the hang",
        Duration::from_secs(120),
        || {
            let jobs = accel_tests::status_jobs(&server.addr, &[])?;
            let j = jobs.first().ok_or("no job")?;
            match (j["phase"].as_str(), j["restart_count"].as_u64()) {
                (Some("running"), Some(1)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    let first = poll_until("the hang's stacks are kept", LIMIT, || {
        stacks_at(&metrics, "page-hang")
    });

    let dom = dump_dom(&dir, &format!("http://{metrics}/"), 5000);
    screenshot(
        &dir,
        &format!("http://{metrics}/"),
        "status-page-hang",
        (1200, 1300),
    );
    assert!(dom.contains("data-job=\"page-hang\""), "{dom}");
    assert!(dom.contains("1 of 1 (0 left)"), "the restart: {dom}");
    assert_eq!(dom.matches("data-node=").count(), 3, "three nodes: {dom}");
    assert!(
        dom.contains("class=\"root-cause\"") && dom.contains("FileTimer 'step' expired: rank 2"),
        "the root cause: {dom}"
    );
    assert!(
        dom.contains(&format!("data-stacks-at=\"{first}\"")),
        "the hang's stacks: {dom}"
    );
    let one = dom.find("== 1 rank: 2").unwrap_or_else(|| panic!("{dom}"));
    let two = dom
        .find("== 2 ranks: 0-1")
        .unwrap_or_else(|| panic!("{dom}"));
    assert!(one < two, "the odd rank out first: {dom}");
    assert!(
        dom.contains("sleeps_inside_a_function (stacks_job.py:"),
        "{dom}"
    );
    // The timeline: round 0 formed, restarted after the hang, round 1 formed.
    assert!(dom.contains("class=\"timeline\""), "{dom}");
    let formed = dom
        .find("round 1 formed: 3 nodes, 3 workers")
        .unwrap_or_else(|| panic!("{dom}"));
    let restarted = dom
        .find("round 0 restarted: ")
        .unwrap_or_else(|| panic!("{dom}"));
    let first_round = dom
        .find("round 0 formed: 3 nodes, 3 workers")
        .unwrap_or_else(|| panic!("{dom}"));
    assert!(
        formed < restarted && restarted < first_round,
        "newest first: {dom}"
    );
    assert!(dom.contains("world <b>3</b>"), "{dom}");
    assert!(
        dom.contains(" s ago</td>"),
        "when each node was last heard: {dom}"
    );

    // A link to the job's stacks marks its Stacks button, and collects
    // nothing by itself: another site could link to it.
    let dom = dump_dom(&dir, &format!("http://{metrics}/#stacks=page-hang"), 3000);
    assert!(dom.contains("data-linked=\"true\""), "{dom}");
    // A malformed link does not stop the page.
    let dom = dump_dom(&dir, &format!("http://{metrics}/#stacks=%E0"), 3000);
    assert!(dom.contains("data-job=\"page-hang\""), "{dom}");
    assert_eq!(
        stacks_at(&metrics, "page-hang").as_ref(),
        Ok(&first),
        "no collection"
    );

    // A collection is asked as the page's button asks: with its header, and
    // no other site's Origin.
    let post = |headers: &[(&str, &str)]| {
        accel_tests::http_request(&metrics, "POST", "/api/stacks?job=page-hang", headers)
            .expect("answer")
    };
    let (status, _, body) = post(&[]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("X-Accel-Request"), "{body}");
    let (status, _, body) = post(&[
        ("X-Accel-Request", "stacks"),
        ("Origin", "http://evil.example"),
    ]);
    assert_eq!(status, 403, "another site's page: {body}");
    let (status, _, _) = accel_tests::http_request(
        &metrics,
        "POST",
        "/api/stacks?job=no-such-job",
        &[("X-Accel-Request", "stacks")],
    )
    .expect("answer");
    assert_eq!(status, 404);
    // Once the second attempt's ranks are in the sleep and the barrier.
    poll_until("the second attempt's ranks are in place", LIMIT, || {
        let n = std::fs::read_dir(&place).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with("-attempt-1"))
                .count()
        });
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} of 3"))
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let origin = format!("http://{metrics}");
    let (status, _, body) = post(&[("X-Accel-Request", "stacks"), ("Origin", &origin)]);
    assert_eq!(status, 202, "{body}");
    poll_until("the collection answered", LIMIT, || {
        let at = stacks_at(&metrics, "page-hang")?;
        if at > first {
            Ok(())
        } else {
            Err(format!("still the hang's, from {at}"))
        }
    });
    let (_, _, body) = http_get_with(&metrics, "/api/stacks?job=page-hang", &[]).expect("answer");
    let v: Value = serde_json::from_str(&body).expect("json");
    let ranks: Vec<u64> = v["groups"][1]["ranks"]
        .as_array()
        .expect("two groups")
        .iter()
        .filter_map(|r| r["rank"].as_u64())
        .collect();
    assert_eq!(ranks, [0, 1], "{body}");
    assert_eq!(v["groups"][0]["ranks"][0]["rank"], 2, "{body}");
    for a in agents {
        a.signal("TERM");
        let _ = a.wait(LIMIT);
    }
}

/// A server without a token, on loopback: a browser on this host that a
/// page of another site re-pointed at 127.0.0.1 (DNS rebinding) gets no
/// job and starts no stack dump; the same requests naming this host do.
#[test]
fn a_tokenless_loopback_server_refuses_requests_that_name_another_site() {
    use std::io::{Read, Write};
    let server = Server::start();
    let page = server.metrics.clone().expect("metrics listener");
    let ask = |method: &str, path: &str, host: &str| -> u16 {
        let mut s = std::net::TcpStream::connect(&page).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nX-Accel-Request: stacks\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        raw.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(ask("GET", "/api/jobs", &page), 200, "this host, named so");
    assert_eq!(ask("GET", "/api/jobs", "localhost"), 200);
    for (method, path) in [("GET", "/api/jobs"), ("POST", "/api/stacks?job=j")] {
        let code = ask(method, path, "evil.example:29401");
        assert!(
            code == 401 || code == 403,
            "{method} {path} naming another site: {code}"
        );
    }
}

/// On a shared node every local user's processes connect from loopback:
/// the jobs and the stacks go without the token only to the server's own
/// user (or root), as the kernel says; another local user gets 401, as a
/// remote caller does.
#[test]
fn another_local_user_gets_no_job_and_starts_no_stack_dump_without_the_token() {
    let server = Server::start_with("127.0.0.1:0", &[], &[("RDZV_TOKEN", TOKEN)]);
    let page = server.metrics.clone().expect("metrics listener");
    let (host, port) = page.rsplit_once(':').expect("host:port");
    let ask = |other: bool, method: &str, path: &str| -> String {
        let script = format!(
            "exec 3<>/dev/tcp/{host}/{port} && printf '{method} {path} HTTP/1.1\\r\\nHost: {page}\\r\\nX-Accel-Request: stacks\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -1 <&3"
        );
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["-c", &script]);
        if other {
            accel_tests::as_other_user(&mut cmd);
        }
        let out = cmd.output().expect("bash");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        ask(false, "GET", "/api/jobs").contains(" 200 "),
        "the server's own user"
    );
    let jobs = ask(true, "GET", "/api/jobs");
    assert!(jobs.contains(" 401 "), "another user: {jobs}");
    let stacks = ask(true, "POST", "/api/stacks?job=j");
    assert!(stacks.contains(" 401 "), "another user: {stacks}");
    // The page itself (no data) is for anyone.
    assert!(ask(true, "GET", "/").contains(" 200 "));
}

/// The server's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// A client that asks for `path` and never reads the answer, through a
/// receive buffer of a few KiB, so the server's side of the answer stalls.
fn stalled_client(addr: &str, path: &str) -> std::net::TcpStream {
    use nix::sys::socket::{
        connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let to: std::net::SocketAddrV4 = addr.parse().expect("an IPv4 address");
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    setsockopt(&fd, sockopt::RcvBuf, &4096).expect("SO_RCVBUF");
    connect(fd.as_raw_fd(), &SockaddrIn::from(to)).expect("connect");
    let mut s = std::net::TcpStream::from(fd);
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("request");
    s
}

/// A flood of stack answers nobody reads (64 clients, a large job's
/// stacks each): the listener holds a bounded number of bytes for them,
/// paces the answers, and every probe meanwhile is answered; the server's
/// memory is back within 64 MiB of where it was once they are gone.
#[test]
fn a_flood_of_unread_stack_answers_keeps_probes_answered_and_memory_bounded() {
    let _heavy = crate::heavy();
    let server = Server::start();
    let metrics = server.metrics.clone().expect("metrics");
    let dir = accel_tests::scratch("status-page-flood");
    let place = dir.join("place");
    std::fs::create_dir_all(&place).expect("place dir");
    let agent = AgentCmd::c10d(&server.addr, "deep")
        .nnodes(1)
        .nproc(8)
        .env("PLACE_DIR", place.display())
        .script(accel_tests::worker("deep_stacks.py"))
        .start(&dir, "agent");
    poll_until("every rank at the bottom of its stack", LIMIT, || {
        let n = std::fs::read_dir(&place).map_or(0, |d| d.count());
        if n == 8 {
            Ok(())
        } else {
            Err(format!("{n} of 8"))
        }
    });
    let origin = format!("http://{metrics}");
    let headers = [("X-Accel-Request", "stacks"), ("Origin", origin.as_str())];
    let (status, _, body) =
        accel_tests::http_request(&metrics, "POST", "/api/stacks?job=deep", &headers)
            .expect("answer");
    assert_eq!(status, 202, "{body}");
    poll_until("the collection answered", LIMIT, || {
        stacks_at(&metrics, "deep")
    });
    // A first reader, then a pause: the answers' pace is full again.
    let (_, _, answer) = http_get_with(&metrics, "/api/stacks?job=deep", &[]).expect("answer");
    assert!(
        answer.len() > accel_telemetry::http::LARGE_ANSWER,
        "a large answer: {} bytes: {}",
        answer.len(),
        &answer[..answer.len().min(3000)]
    );
    std::thread::sleep(Duration::from_secs(2));
    let baseline = rss(server.pid());

    let mut flood = Vec::new();
    let mut answered = 0;
    let flooding = std::time::Instant::now();
    for i in 0..64 {
        flood.push(stalled_client(&metrics, "/api/stacks?job=deep"));
        // A probe between every third connection of the flood, each
        // answered within a second.
        if i % 3 == 2 && answered < 20 {
            let t = std::time::Instant::now();
            let probe = http_get_with(&metrics, "/readyz", &[]);
            if probe.as_ref().is_some_and(|p| p.0 == 200) && t.elapsed() < Duration::from_secs(1) {
                answered += 1;
            } else {
                panic!(
                    "probe {answered} during the flood: {probe:?} in {:?}",
                    t.elapsed()
                );
            }
        }
    }
    while answered < 20 {
        let probe = http_get_with(&metrics, "/readyz", &[]);
        assert_eq!(probe.map(|p| p.0), Some(200), "probe {answered}");
        answered += 1;
    }
    let during = rss(server.pid());
    let took = flooding.elapsed().as_secs_f64();
    // What the flood was answered (the first bytes of each answer): a
    // paced few stack answers; the rest told to retry, or closed (one
    // address holds a few connections at most; a newer one takes the
    // place of one that does not read).
    let (mut served, mut refused, mut closed) = (0, 0, 0);
    for s in &mut flood {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut head = [0u8; 12];
        match s.read_exact(&mut head).map(|()| head) {
            Ok(h) if &h == b"HTTP/1.1 200" => served += 1,
            Ok(h) if &h == b"HTTP/1.1 429" || &h == b"HTTP/1.1 503" => refused += 1,
            Ok(h) => panic!("{:?}", String::from_utf8_lossy(&h)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => panic!("no answer: {e}"),
            Err(_) => closed += 1,
        }
    }
    eprintln!("flood: {served} served, {refused} told to retry, {closed} closed");
    let paced = 4.0 + 4.0 * took.ceil();
    assert!(
        served as f64 <= paced && served < 64,
        "{served} stack answers in {took:.1} s"
    );
    drop(flood);
    std::thread::sleep(Duration::from_secs(2));
    let after = rss(server.pid());
    eprintln!(
        "flood: server RSS {} MiB before, {} MiB during, {} MiB after; answer {} KiB",
        baseline >> 20,
        during >> 20,
        after >> 20,
        answer.len() >> 10
    );
    assert!(
        after <= baseline + (64 << 20),
        "RSS {} MiB after the flood, {} MiB before",
        after >> 20,
        baseline >> 20
    );
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
}
