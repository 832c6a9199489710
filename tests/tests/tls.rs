//! TLS on the rendezvous links, with certificates made by `openssl` for
//! each test: mutual TLS end to end, a wrong CA, unusable files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use accel_tests::{bin, eventually, records, scratch, Agent, AgentCmd, Server};

const TOKEN: &str = "tls-test-token-8d2e6b0c1a";

pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (the test command installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `name` in `dir`: `name.key`, `name.pem`.
pub(crate) fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

/// A certificate `name` signed by CA `ca`, valid for 127.0.0.1 and localhost,
/// for servers and clients.
pub(crate) fn leaf(dir: &Path, ca: &str, name: &str) {
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new() -> Self {
        let dir = scratch("tls-pki");
        ca(&dir, "ca");
        ca(&dir, "other-ca");
        leaf(&dir, "ca", "server");
        leaf(&dir, "ca", "agent");
        Self { dir }
    }
    fn path(&self, f: &str) -> String {
        self.dir.join(f).to_string_lossy().into_owned()
    }
}

fn agent(dir: &Path, tag: &str, endpoint: &str, conf: &str, timeout: &str) -> Agent {
    AgentCmd::c10d_no_local_addr(endpoint, "tls")
        .nnodes(2)
        .nproc(1)
        .conf(conf)
        .conf(format!("join_timeout={timeout}"))
        .recording(dir, tag)
        .env("RUN_FOR", "0.5")
        .env("ACCEL_RDZV_TOKEN", TOKEN)
        .start(dir, tag)
}

#[test]
fn mutual_tls_end_to_end() {
    let pki = Pki::new();
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--tls-cert",
            &pki.path("server.pem"),
            "--tls-key",
            &pki.path("server.key"),
            "--tls-client-ca",
            &pki.path("ca.pem"),
        ],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let dir = scratch("tls-e2e");
    let conf = format!(
        "tls_ca={},tls_cert={},tls_key={}",
        pki.path("ca.pem"),
        pki.path("agent.pem"),
        pki.path("agent.key")
    );
    let a = agent(&dir, "a", &server.addr, &conf, "30");
    let b = agent(&dir, "b", &server.addr, &conf, "30");
    assert!(
        eventually(Duration::from_secs(30), || records(&dir).len() == 2),
        "both workers ran"
    );
    // status over the same TLS, from the environment.
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let out = Command::new(bin("rdzv-server"))
        .args(["status", "--rdzv-endpoint", &server.addr, "--token-file"])
        .arg(&token_file)
        .env("ACCEL_RDZV_TLS_CA", pki.path("ca.pem"))
        .env("ACCEL_RDZV_TLS_CERT", pki.path("agent.pem"))
        .env("ACCEL_RDZV_TLS_KEY", pki.path("agent.key"))
        .output()
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("job tls"));
    assert_eq!(a.wait(Duration::from_secs(30)).code(), 0);
    assert_eq!(b.wait(Duration::from_secs(30)).code(), 0);
    // Without TLS the same server is unreachable: no plaintext fallback.
    let plain = agent(
        &scratch("tls-plain"),
        "p",
        &server.addr,
        "keep_alive_interval=1",
        "3",
    )
    .wait(Duration::from_secs(20));
    assert_ne!(plain.code(), 0);
}

#[test]
fn a_wrong_ca_or_a_missing_client_certificate_fails_fast_and_clearly() {
    let pki = Pki::new();
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--tls-cert",
            &pki.path("server.pem"),
            "--tls-key",
            &pki.path("server.key"),
            "--tls-client-ca",
            &pki.path("ca.pem"),
        ],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let dir = scratch("tls-wrong");
    let t0 = Instant::now();
    let wrong = agent(
        &dir,
        "w",
        &server.addr,
        &format!("tls_ca={}", pki.path("other-ca.pem")),
        "60",
    )
    .wait(Duration::from_secs(30));
    assert_ne!(wrong.code(), 0);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "not retried until join_timeout"
    );
    assert!(
        wrong.stderr.contains("TLS") && wrong.stderr.contains("tls_ca"),
        "{}",
        wrong.stderr
    );
    // The right CA but no client certificate: the server refuses the
    // handshake, a TLS verdict too (told by its type, not its words).
    let t0 = Instant::now();
    let anonymous = agent(
        &dir,
        "n",
        &server.addr,
        &format!("tls_ca={}", pki.path("ca.pem")),
        "60",
    )
    .wait(Duration::from_secs(30));
    assert_ne!(anonymous.code(), 0, "{}", anonymous.stderr);
    assert!(
        t0.elapsed() < Duration::from_secs(20) && anonymous.stderr.contains("TLS"),
        "not retried until join_timeout: {}",
        anonymous.stderr
    );
}

#[test]
fn unusable_tls_files_are_one_clear_line() {
    let pki = Pki::new();
    let run = |args: &[&str]| {
        let out = Command::new(bin("rdzv-server"))
            .args(["--bind", "127.0.0.1:0"])
            .env("RDZV_METRICS_BIND", "127.0.0.1:0")
            .args(args)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A key where the certificate belongs.
    let (code, err) = run(&[
        "--tls-cert",
        &pki.path("server.key"),
        "--tls-key",
        &pki.path("server.key"),
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("server.key") && err.contains("no certificate"),
        "{err}"
    );
    let (code, err) = run(&[
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        "/nonexistent/key.pem",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("/nonexistent/key.pem"), "{err}");
    let (code, err) = run(&["--tls-cert", &pki.path("server.pem")]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--tls-key"), "{err}");
    // The agent checks its files before joining.
    let out = Command::new(bin("accel-agent"))
        .args([
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:1",
            "--rdzv-conf",
            &format!("tls_ca={}", pki.path("ca.key")),
            "--no-python",
            "true",
        ])
        .output()
        .expect("agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        err.contains("ca.key") && err.contains("no certificate"),
        "{err}"
    );
}

/// `rdzv-server status` over TLS trusting `ca` only, with client
/// certificate `agent`: whether it got an answer.
fn status_trusting(server: &Server, pki: &Pki, ca: &str, token_file: &Path) -> Result<(), String> {
    let out = Command::new(bin("rdzv-server"))
        .args(["status", "--rdzv-endpoint", &server.addr, "--token-file"])
        .arg(token_file)
        .env("ACCEL_RDZV_TLS_CA", pki.path(ca))
        .env("ACCEL_RDZV_TLS_CERT", pki.path("agent.pem"))
        .env("ACCEL_RDZV_TLS_KEY", pki.path("agent.key"))
        .output()
        .expect("status");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A renewed server certificate, from a new CA, moved into place while a
/// two-node job runs: new connections get it at once (a client trusting
/// only the new CA is answered, one trusting only the old is refused); the
/// running job's connections are untouched and it ends with success.
#[test]
fn a_renewed_certificate_is_served_without_a_restart_and_the_running_job_goes_on() {
    let pki = Pki::new();
    ca(&pki.dir, "next-ca");
    leaf(&pki.dir, "next-ca", "next-server");
    // The agents trust both CAs while the certificate is renewed.
    let both = pki.dir.join("both.pem");
    let bundle = [
        std::fs::read_to_string(pki.dir.join("ca.pem")).expect("ca"),
        std::fs::read_to_string(pki.dir.join("next-ca.pem")).expect("next ca"),
    ]
    .concat();
    std::fs::write(&both, bundle).expect("bundle");
    // The server's files, replaced as cert-manager or a Secret would:
    // written beside them and renamed over.
    let (cert, key) = (pki.dir.join("live.pem"), pki.dir.join("live.key"));
    std::fs::copy(pki.dir.join("server.pem"), &cert).expect("cert");
    std::fs::copy(pki.dir.join("server.key"), &key).expect("key");
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
            "--tls-client-ca",
            &pki.path("ca.pem"),
        ],
        &[("RDZV_TOKEN", TOKEN)],
    );
    let dir = scratch("tls-renew");
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("token");
    let conf = format!(
        "tls_ca={},tls_cert={},tls_key={}",
        both.display(),
        pki.path("agent.pem"),
        pki.path("agent.key")
    );
    let long = |tag: &str| {
        AgentCmd::c10d_no_local_addr(&server.addr, "renew")
            .nnodes(2)
            .nproc(1)
            .conf(&conf)
            .recording(&dir, tag)
            .env("RUN_FOR", "8")
            .env("ACCEL_RDZV_TOKEN", TOKEN)
            .start(&dir, tag)
    };
    let (a, b) = (long("a"), long("b"));
    assert!(
        eventually(Duration::from_secs(30), || records(&dir).len() == 2),
        "both workers run"
    );
    status_trusting(&server, &pki, "ca.pem", &token_file).expect("the old certificate");
    assert!(status_trusting(&server, &pki, "next-ca.pem", &token_file).is_err());
    let replace = |from: &Path, to: &Path| {
        let tmp = to.with_extension("new");
        std::fs::copy(from, &tmp).expect("copy");
        std::fs::rename(&tmp, to).expect("rename");
    };
    // The new key first: with the old certificate it makes no identity, so
    // the last good one is served meanwhile.
    replace(&pki.dir.join("next-server.key"), &key);
    std::thread::sleep(Duration::from_millis(1500));
    status_trusting(&server, &pki, "ca.pem", &token_file).expect("the last good certificate");
    replace(&pki.dir.join("next-server.pem"), &cert);
    accel_tests::poll_until(
        "the renewed certificate is served",
        Duration::from_secs(10),
        || status_trusting(&server, &pki, "next-ca.pem", &token_file),
    );
    let old = status_trusting(&server, &pki, "ca.pem", &token_file).expect_err("old CA only");
    assert!(old.contains("TLS") || old.contains("certificate"), "{old}");
    assert_eq!(a.wait(Duration::from_secs(40)).code(), 0);
    assert_eq!(b.wait(Duration::from_secs(40)).code(), 0);
    assert_eq!(records(&dir).len(), 2, "the job was never restarted");
}
