//! The rendezvous token in the agent's process: a worker runs as the
//! agent's user, so file modes do not stop it; the agent makes itself
//! non-dumpable and blanks the token in its environment block.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use accel_tests::{as_other_user, bin, poll_until, scratch};

const TOKEN: &str = "s3cret-token-of-the-job";

/// `dir` readable and searchable by every user (scratch directories are
/// root's 0700), so another user reaches what is in it.
fn open_to_all(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A copy of the binary `name` that another user may run (/root is 0700).
fn runnable_copy(dir: &Path, name: &str) -> PathBuf {
    let copy = dir.join(name);
    std::fs::copy(bin(name), &copy).expect("copy the binary");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    copy
}

/// Runs `binary ARGS /bin/sh -c CHECKS` as the other user with the token
/// in its environment, where the worker, as that user too, tries the
/// agent's environment and memory; asserts it got neither and that the
/// environment block root reads holds no token.
fn a_worker_of(tag: &str, binary: &str, args: &[&str]) {
    let dir = scratch(tag);
    open_to_all(&dir);
    let program = runnable_copy(&dir, binary);
    let stop = dir.join("stop");
    // The worker, as the agent's user, tries what any process of that user
    // could: the agent's environment and memory. Then it waits to be let go.
    let script = format!(
        r#"if cat /proc/$PPID/environ >/dev/null 2>&1; then echo "environ: readable"; else echo "environ: denied"; fi
if head -c 1 /proc/$PPID/mem >/dev/null 2>&1; then echo "mem: readable"; else echo "mem: denied"; fi
if grep -qa {TOKEN} /proc/$PPID/environ 2>/dev/null; then echo "token: found"; fi
echo "worker checked"
while [ ! -e {stop} ]; do sleep 0.05; done"#,
        stop = stop.display()
    );
    let (out, err) = (dir.join("agent.stdout"), dir.join("agent.stderr"));
    let mut cmd = Command::new(&program);
    as_other_user(&mut cmd)
        .current_dir(&dir)
        .env("ACCEL_RDZV_TOKEN", TOKEN)
        .env("RDZV_TOKEN", TOKEN)
        .args(args)
        .args(["/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout"))
        .stderr(std::fs::File::create(&err).expect("stderr"));
    let mut child = cmd.spawn().expect("start the agent as the other user");
    let pid = child.id();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    poll_until("the worker's checks", Duration::from_secs(30), || {
        let text = read(&out);
        if text.contains("worker checked") {
            Ok(())
        } else {
            Err(format!("stdout: {text}\nstderr: {}", read(&err)))
        }
    });
    // Root reads what the kernel keeps of the agent's environment: the
    // variables the agent was started with, but not the token's.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("root reads environ");
    let environ = String::from_utf8_lossy(&environ);
    std::fs::write(&stop, "").expect("let the worker go");
    let ended = child.wait().expect("wait");
    let (stdout, stderr) = (read(&out), read(&err));
    assert!(ended.success(), "{binary}: {stdout}\n{stderr}");
    assert!(stdout.contains("environ: denied"), "{binary}: {stdout}");
    assert!(stdout.contains("mem: denied"), "{binary}: {stdout}");
    assert!(!stdout.contains("token: found"), "{binary}: {stdout}");
    assert!(
        environ.contains("HOME=/") && !environ.contains(TOKEN) && !environ.contains("RDZV_TOKEN="),
        "{binary}: the environment block keeps the other variables only: {environ:?}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");
}

#[test]
fn a_worker_cannot_read_its_agents_environment_and_the_token_is_gone_from_it() {
    a_worker_of(
        "agent-environ",
        "accel-agent",
        &["--standalone", "--nproc-per-node", "1", "--no-python"],
    );
}

#[test]
fn a_worker_of_accel_launch_cannot_read_its_environment_either() {
    a_worker_of(
        "launch-environ",
        "accel",
        &["launch", "--num_processes", "1", "--no_python"],
    );
}

/// The configuration is built (and `nvidia-smi -q` asked for the topology
/// of a multi-node job) before the agent starts anything: by then the agent
/// is already non-dumpable, and the probe runs without the token in its
/// environment (a process of the agent's user reads neither).
#[test]
fn the_nvidia_smi_probe_sees_no_token_and_cannot_read_the_agents_environment() {
    let dir = scratch("smi-environ");
    open_to_all(&dir);
    let program = runnable_copy(&dir, "accel-agent");
    let fake = dir.join("bin");
    std::fs::create_dir(&fake).expect("mkdir");
    open_to_all(&fake);
    // Where the probe, as the other user, writes what it saw.
    let out = dir.join("out");
    std::fs::create_dir(&out).expect("mkdir");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let said = out.join("probe.out");
    let smi = fake.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            r#"#!/bin/sh
{{
if cat /proc/$PPID/environ >/dev/null 2>&1; then echo "agent environ: readable"; else echo "agent environ: denied"; fi
if env | grep -q {TOKEN}; then echo "probe env: token"; else echo "probe env: clean"; fi
}} > {said}.tmp
mv {said}.tmp {said}
exit 1
"#,
            said = said.display()
        ),
    )
    .expect("fake nvidia-smi");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut cmd = Command::new(&program);
    as_other_user(&mut cmd)
        .current_dir(&dir)
        .env("ACCEL_RDZV_TOKEN", TOKEN)
        .env("PATH", format!("{}:/usr/bin:/bin", fake.display()))
        .args([
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:1",
            "--rdzv-id",
            "smi",
            "--nproc-per-node",
            "1",
            "--no-python",
            "true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start the agent as the other user");
    poll_until("the probe ran", Duration::from_secs(30), || {
        std::fs::read_to_string(&said)
            .map_err(|e| e.to_string())
            .and_then(|t| match t.contains("probe env") {
                true => Ok(()),
                false => Err(t),
            })
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&said).expect("probe output");
    assert!(text.contains("agent environ: denied"), "{text}");
    assert!(text.contains("probe env: clean"), "{text}");
}
