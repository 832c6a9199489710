#!/usr/bin/env python3
"""TCP ports for the scripts and benchmarks, leased from the registry the
integration tests use (tests/src/lease.rs), so that a check or benchmark
running beside the test suite, or beside another clone's, is never handed a
port someone else was given.

A port a process must be told before it starts (an etcd member's URLs, a
Slurm daemon's, a static master port) cannot come from binding port 0 and
releasing it: anything may take it in between. Where a process reports its
own address (rdzv-server's --address-file), bind port 0 instead.

The registry is a directory (/run/lock/accel-tests, else
$TMPDIR/accel-leases-UID) with one file per leased port, port-N, holding its
owner's pid and start time, written under an exclusive flock of its `lock`
file. Here the owner is a process the caller names (a shell script passes
its own pid): its ports stay leased while it runs, and the next taker
reclaims them once it has exited. Candidates lie outside the kernel's
ephemeral range, skip the ports accel and etcd use by default, and must be
free on both wildcard addresses now.

Usage: scripts/ports.py --owner PID [COUNT]     prints COUNT ports, one a line
       from ports import lease; lease(3)         (owner: the calling process)
"""

import argparse
import errno
import fcntl
import os
import socket
import tempfile

# Ports processes bind when told nothing else: accel's rendezvous and
# metrics, torchrun's master port, etcd's client and peer ports.
DEFAULT_PORTS = {29400, 29401, 29500, 2379, 2380}


def _registry():
    def usable(d):
        try:
            os.mkdir(d)
            os.chmod(d, 0o1777)
        except FileExistsError:
            pass
        except OSError:
            return False
        try:
            fd = os.open(os.path.join(d, "lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError:
            return False
        os.close(fd)
        return True

    if usable("/run/lock/accel-tests"):
        return "/run/lock/accel-tests"
    d = os.path.join(tempfile.gettempdir(), f"accel-leases-{os.getuid()}")
    if not usable(d):
        raise SystemExit(f"ports.py: cannot use {d} for leases")
    return d


def _start_time(pid):
    """A process's start time since boot (/proc/PID/stat's 22nd field)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return rest[19] if len(rest) > 19 else None


def _alive(stamp):
    parts = stamp.split()
    return len(parts) == 2 and parts[0].isdigit() and _start_time(int(parts[0])) == parts[1]


def _ephemeral():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _free(port):
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
        except OSError as e:
            # Only "in use" counts (a machine may lack IPv6).
            if e.errno == errno.EADDRINUSE:
                return False
    return True


def lease(count=1, owner=None):
    """COUNT ports leased to process OWNER (default: this one) until it exits."""
    owner = os.getpid() if owner is None else owner
    start = _start_time(owner)
    if start is None:
        raise SystemExit(f"ports.py: no process {owner} to lease ports to")
    stamp = f"{owner} {start}"
    d = _registry()
    lo, hi = _ephemeral()
    candidates = [p for p in range(10_000, 65_536) if not lo <= p <= hi and p not in DEFAULT_PORTS]
    # Spread successive takers over the range (correctness does not depend on it).
    first = (os.getpid() * 7919) % len(candidates)
    order = candidates[first:] + candidates[:first]
    got = []
    with open(os.path.join(d, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for port in order:
            if len(got) == count:
                break
            path = os.path.join(d, f"port-{port}")
            try:
                with open(path) as f:
                    if _alive(f.read()):
                        continue
                os.remove(path)  # a finished owner's entry: reclaimed
            except OSError:
                pass
            if not _free(port):
                continue
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError:
                continue  # another user's entry this one may not replace
            with os.fdopen(fd, "w") as f:
                f.write(stamp)
            got.append(port)
    if len(got) < count:
        raise SystemExit(f"ports.py: only {len(got)} of {count} ports are free to lease")
    return got


def main():
    ap = argparse.ArgumentParser(description="Lease TCP ports from the tests' registry.")
    # Required: a command substitution's subshell, the caller's parent, may
    # exit at once and free its leases. A shell script passes $$.
    ap.add_argument("--owner", type=int, required=True,
                    help="the process the ports are leased to until it exits")
    ap.add_argument("count", type=int, nargs="?", default=1)
    a = ap.parse_args()
    print("\n".join(str(p) for p in lease(a.count, a.owner)))


if __name__ == "__main__":
    main()
