"""What a control-plane outage costs a running job, measured on real processes.

A two-node job (two agents on this machine, 2 workers each, `sleep` workers, the
default keep-alive settings: a 15 s drop limit) on one `rdzv-server` without etcd.
For each outage length, the server is

  pause    stopped with SIGSTOP, then SIGCONT;
  kill     killed with SIGKILL, then started again, empty, on the same port;

and the bench reports how many of the 4 workers were stopped (a worker whose pid
is gone) and how long after the server's return `rdzv-server status` shows the
job running its round with both nodes again.

Usage: python bench/outage.py [--lengths 5,30,120] [--modes pause,kill]
       [--bin DIR] (the binaries to measure; default: the release build,
       or the wheel's static binaries with --bin DIR_OF_THE_WHEEL'S_SCRIPTS)
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from ports import lease  # noqa: E402  (ports leased as the tests lease theirs)

TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/accel/target"))


def running(binary, endpoint, job):
    """Whether the rendezvous at `endpoint` has `job` running with both nodes."""
    r = subprocess.run([binary, "status", "--json", "--rdzv-endpoint", endpoint],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return False
    for j in json.loads(r.stdout).get("jobs", []):
        nodes = j.get("nodes", [])
        if j.get("job_id") == job and j.get("phase") == "running" and len(nodes) == 2 \
                and all(n.get("state") == "running" for n in nodes):
            return True
    return False


def workers(agent_pid):
    out = subprocess.run(["pgrep", "-P", str(agent_pid), "-x", "sleep"],
                         capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def one(bin_dir, mode, length, d):
    port = lease(1)[0]
    endpoint = f"127.0.0.1:{port}"
    server_bin = os.path.join(bin_dir, "rdzv-server")

    def server():
        log = open(os.path.join(d, f"server-{mode}-{length}.log"), "a")
        return subprocess.Popen([server_bin, "--bind", endpoint, "--metrics-bind", "off"],
                                stdout=log, stderr=log)

    srv = server()
    time.sleep(0.5)
    job = f"outage-{mode}-{length}"
    agents = []
    for n in ("a", "b"):
        err = open(os.path.join(d, f"{job}-{n}.err"), "w")
        agents.append(subprocess.Popen(
            [os.path.join(bin_dir, "accel-agent"), "--nnodes", "2", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
             "--no-python", "sleep", "3600"],
            stdout=subprocess.DEVNULL, stderr=err))
    deadline = time.time() + 30
    while time.time() < deadline and sum(len(workers(a.pid)) for a in agents) < 4:
        time.sleep(0.1)
    pids = [p for a in agents for p in workers(a.pid)]
    if len(pids) != 4:
        sys.exit(f"outage bench: the job did not start ({len(pids)} workers)")
    time.sleep(2)
    if mode == "pause":
        srv.send_signal(signal.SIGSTOP)
        time.sleep(length)
        srv.send_signal(signal.SIGCONT)
    else:
        srv.kill()
        srv.wait()
        time.sleep(length)
        srv = server()
    back = time.time()
    again = None
    while time.time() < back + 60:
        if running(server_bin, endpoint, job):
            again = time.time() - back
            break
        time.sleep(0.05)
    stopped = sum(1 for p in pids if not alive(p))
    for a in agents:
        a.kill()
        a.wait()
    srv.kill()
    srv.wait()
    return stopped, again


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="5,30,120")
    ap.add_argument("--modes", default="pause,kill")
    ap.add_argument("--bin", default=os.path.join(TARGET, "release"))
    a = ap.parse_args()
    print(f"binaries: {a.bin}")
    print("| outage | server | workers stopped (of 4) | running again after the server's return |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="accel-outage-") as d:
        for length in (int(x) for x in a.lengths.split(",")):
            for mode in a.modes.split(","):
                stopped, again = one(a.bin, mode, length, d)
                shown = f"{again:.2f} s" if again is not None else "not within 60 s"
                what = "SIGSTOP, then SIGCONT" if mode == "pause" else "kill -9, restarted empty"
                print(f"| {length} s | {what} | {stopped} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
