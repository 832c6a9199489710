"""Failover time of the highly available rendezvous, measured on real processes.

A three-member etcd on loopback (started here, in a temporary directory), then:

  server   two `rdzv-server` replicas; two agents (2 workers each) join through both.
           `kill -9` of the leader, then the time until every agent has reconnected
           to the new one; then one worker is killed, and the time until every agent
           runs the next round's workers.
  pause    two `rdzv-server` replicas; two agents (2 workers each) join through both.
           `SIGSTOP` of the leader for 10 s (a GC pause, a frozen VM), one worker killed
           0.5 s into the pause; the time until every agent is on the new leader, and
           until every agent runs the next round's workers (from the pause, and from the
           new leader's election, its "leading" log line); then `SIGCONT`.
  cut      as `pause`, but the leader runs on and reaches etcd: every packet from the agents
           to the leader's port is dropped for 10 s (nftables on loopback, one way; needs root
           and `nft`). Only the agents' complaints to the other replica end its term.
  agents   three agents with `--rdzv-backend etcd` (no server), `--nnodes 2:3`.
           `kill -9` of the agent that hosts the rendezvous, then the time until both
           survivors reconnected to the new host (resuming their round, or told the job
           re-formed without the dead node), and until they run the re-formed round
           (the new host drops the dead node once its etcd lease expired).

Times come from the agents' own log timestamps, against the moment of the kill.
Usage: python bench/failover.py [server|pause|cut|agents] [--lease SECONDS] [--runs N]
(the binaries of `cargo build --release`, etcd and etcdctl on PATH).
"""

import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from ports import lease  # noqa: E402  (ports leased as the tests lease theirs)

TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/accel/target"))
BIN = os.path.join(TARGET, "release")


def stamp(line):
    """The UTC time at the head of a log line, as seconds since the epoch."""
    head = line.split(" ", 1)[0].rstrip("Z")
    try:
        t = datetime.datetime.fromisoformat(head[:26])
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def first_after(path, text, after):
    """The time of the first line of `path` after `after` that contains `text` (or, for
    a tuple, any of its texts)."""
    texts = text if isinstance(text, tuple) else (text,)
    with open(path, errors="replace") as f:
        for line in f:
            t = stamp(line)
            if t is not None and t >= after and any(x in line for x in texts):
                return t
    return None


# An agent is back on a rendezvous when it resumed its round, or was told the job
# re-formed without it meanwhile.
BACK = ("reconnected", "the job moved on without this node")


def wait_for(what, f, limit=60.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    sys.exit(f"failover bench: timed out waiting for {what}")


class Etcd:
    def __init__(self, d):
        self.clients = lease(3)
        peers = lease(3)
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.procs = []
        for i in range(3):
            self.procs.append(subprocess.Popen(
                ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(d, f"m{i}"),
                 "--listen-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                 "--initial-cluster", cluster],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for("etcd", lambda: self.ctl("endpoint", "health") is not None)

    def urls(self):
        return ",".join(f"http://127.0.0.1:{p}" for p in self.clients)

    def ctl(self, *args):
        r = subprocess.run(["etcdctl", "--endpoints", self.urls(), *args],
                           env={**os.environ, "ETCDCTL_API": "3"},
                           capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def agent(d, name, args):
    err = open(os.path.join(d, f"{name}.err"), "w")
    p = subprocess.Popen([os.path.join(BIN, "accel-agent"), *args], stdout=subprocess.DEVNULL,
                         stderr=err, env={**os.environ, "ACCEL_LOG": "info"})
    return p, os.path.join(d, f"{name}.err")


def grep(path, text):
    with open(path, errors="replace") as f:
        return text in f.read()


def worker_pids(agent_pid):
    """The agent's workers (`sleep`), not its guard process."""
    out = subprocess.run(["pgrep", "-P", str(agent_pid), "-x", "sleep"],
                         capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def server_run(d, etcd_lease):
    etcd = Etcd(d)
    ports = lease(2)
    servers = []
    for i, port in enumerate(ports):
        log = open(os.path.join(d, f"s{i}.log"), "w")
        servers.append(subprocess.Popen(
            [os.path.join(BIN, "rdzv-server"), "--bind", f"127.0.0.1:{port}", "--metrics-bind", "off",
             "--etcd-endpoints", etcd.urls(), "--etcd-lease", str(etcd_lease)],
            stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info"}))
        if i == 0:
            wait_for("the first replica to lead", lambda: grep(os.path.join(d, "s0.log"), "leading"))
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    agents = [agent(d, f"a{n}", [
        "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoints, "--rdzv-id", "f", "--local-addr", "127.0.0.1",
        "--no-python", "sleep", "60"]) for n in range(2)]
    wait_for("the workers", lambda: all(grep(e, "starting workers") for _, e in agents))
    time.sleep(1)
    killed = time.time()
    servers[0].kill()
    reconnected = wait_for("both agents to reconnect", lambda: (
        all(first_after(e, "reconnected", killed) for _, e in agents)
        and max(first_after(e, "reconnected", killed) for _, e in agents)))
    time.sleep(0.5)
    failed = time.time()
    os.kill(worker_pids(agents[0][0].pid)[0], signal.SIGKILL)
    formed = wait_for("the next round", lambda: (
        all(first_after(e, "starting workers round=1", failed) for _, e in agents)
        and max(first_after(e, "starting workers round=1", failed) for _, e in agents)))
    for p, _ in agents:
        p.kill()
    for s in servers:
        s.kill()
    etcd.stop()
    return reconnected - killed, formed - failed


def nft(script):
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)


class Cut:
    """Drops every packet to the leader's port (one way: what it sends goes out, and its
    own connections to etcd are untouched)."""

    def __init__(self, port):
        self.table = f"accel_bench_cut_{os.getpid()}"
        self.port = port

    def start(self, _server):
        nft(f"table inet {self.table} {{\n chain in {{\n  type filter hook input priority 0;\n"
            f"  tcp dport {self.port} drop\n }}\n}}\n")

    def end(self, _server):
        nft(f"delete table inet {self.table}\n")


class Pause:
    def start(self, server):
        server.send_signal(signal.SIGSTOP)

    def end(self, server):
        server.send_signal(signal.SIGCONT)


def pause_run(d, etcd_lease, cut=False):
    """Seconds from the pause (or cut) to every agent on the new leader, to every agent
    running the next round, and from the new leader's election to that (None: not within
    40 s)."""
    etcd = Etcd(d)
    ports = lease(2)
    servers = []
    logs = [os.path.join(d, f"s{i}.log") for i in range(2)]
    for i, port in enumerate(ports):
        log = open(logs[i], "w")
        servers.append(subprocess.Popen(
            [os.path.join(BIN, "rdzv-server"), "--bind", f"127.0.0.1:{port}", "--metrics-bind", "off",
             "--etcd-endpoints", etcd.urls(), "--etcd-lease", str(etcd_lease)],
            stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info"}))
        if i == 0:
            wait_for("the first replica to lead", lambda: grep(logs[0], "leading"))
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    agents = [agent(d, f"a{n}", [
        "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoints, "--rdzv-id", "f", "--local-addr", "127.0.0.1",
        "--no-python", "sleep", "60"]) for n in range(2)]
    wait_for("the workers", lambda: all(grep(e, "starting workers") for _, e in agents))
    time.sleep(1)
    silence = Cut(ports[0]) if cut else Pause()
    paused = time.time()
    silence.start(servers[0])
    time.sleep(0.5)
    os.kill(worker_pids(agents[0][0].pid)[0], signal.SIGKILL)

    def settle(texts, limit):
        deadline = time.time() + limit
        while time.time() < deadline:
            seen = [min((t for t in (first_after(e, x, paused) for x in texts) if t), default=None)
                    for _, e in agents]
            if all(seen):
                return max(seen)
            time.sleep(0.05)
        return None

    # On the new leader: resumed there, or found the job restarted there already.
    on_new = ["reconnected", "the job moved on without this node"]
    moved = settle(on_new, 9)
    formed = settle(["starting workers round=1"], 9)
    elected = first_after(logs[1], "leading", paused)
    time.sleep(max(0.0, paused + 10 - time.time()))
    silence.end(servers[0])
    # What did not happen during the pause may happen after it.
    moved = moved or settle(on_new, 30)
    formed = formed or settle(["starting workers round=1"], 30)
    for p, _ in agents:
        p.kill()
    for s in servers:
        s.kill()
    etcd.stop()
    since = lambda t, base: None if t is None or base is None else t - base
    return since(moved, paused), since(formed, paused), since(formed, elected)


def agents_run(d, etcd_lease):
    etcd = Etcd(d)
    endpoints = etcd.urls().replace("http://", "")
    agents = [agent(d, f"a{n}", [
        "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-backend", "etcd",
        "--rdzv-endpoint", endpoints, "--rdzv-id", "f", "--local-addr", "127.0.0.1",
        "--rdzv-conf", f"last_call_timeout=1,etcd_lease={etcd_lease}",
        "--no-python", "sleep", "120"]) for n in range(3)]
    wait_for("the workers", lambda: all(grep(e, "starting workers") for _, e in agents))
    time.sleep(1)
    leader = etcd.ctl("get", "--prefix", "/accel/agents/f/leader", "--sort-by=CREATE",
                      "--order=ASCEND", "--print-value-only").split()[0]
    host = next(i for i, (_, e) in enumerate(agents) if grep(e, f"advertise={leader} "))
    killed = time.time()
    agents[host][0].kill()
    survivors = [a for i, a in enumerate(agents) if i != host]
    reconnected = wait_for("both survivors to reconnect", lambda: (
        all(first_after(e, BACK, killed) for _, e in survivors)
        and max(first_after(e, BACK, killed) for _, e in survivors)))
    formed = wait_for("the re-formed round", lambda: (
        all(first_after(e, "starting workers round=1", killed) for _, e in survivors)
        and max(first_after(e, "starting workers round=1", killed) for _, e in survivors)),
        limit=90)
    for p, _ in agents:
        p.kill()
    etcd.stop()
    return reconnected - killed, formed - killed


def pause_main(a):
    results = []
    for _ in range(a.runs):
        d = tempfile.mkdtemp(prefix="accel-bench-failover-")
        try:
            results.append(pause_run(d, a.lease, cut=a.mode == "cut"))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def median(i):
        got = [r[i] for r in results if r[i] is not None]
        text = f"{statistics.median(got):.2f} s" if got else "never"
        if len(got) < len(results):
            text += f" (not within 40 s in {len(results) - len(got)} of {len(results)} runs)"
        return text

    what = ("agents cut off from the leader (one way) 10 s" if a.mode == "cut"
            else "leader paused (SIGSTOP) 10 s")
    print(f"server replicas, --etcd-lease {a.lease}: {what}, a worker killed "
          f"0.5 s into it -> every agent on the new leader {median(0)} after it began; every agent "
          f"running the next round {median(1)} after it began, {median(2)} after the new leader's "
          f"election (median of {a.runs}; each run: {[tuple(round(x, 2) if x is not None else None for x in r) for r in results]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["server", "pause", "cut", "agents"])
    ap.add_argument("--lease", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.mode in ("pause", "cut"):
        return pause_main(a)
    run = server_run if a.mode == "server" else agents_run
    results = []
    for _ in range(a.runs):
        d = tempfile.mkdtemp(prefix="accel-bench-failover-")
        try:
            results.append(run(d, a.lease))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    first = statistics.median(r[0] for r in results)
    second = statistics.median(r[1] for r in results)
    if a.mode == "server":
        print(f"server replicas, --etcd-lease {a.lease}: leader kill -9 -> every agent on the new "
              f"leader {first:.2f} s; worker failure -> next round running {second * 1000:.0f} ms "
              f"(median of {a.runs})")
    else:
        print(f"agent-only, etcd_lease={a.lease}: hosting agent kill -9 -> survivors on the new host "
              f"{first:.2f} s; -> re-formed round running {second:.2f} s (drop limit 15 s; "
              f"median of {a.runs}; each run: {', '.join(f'{r[1]:.2f}' for r in results)} s)")


if __name__ == "__main__":
    main()
