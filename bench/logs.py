"""Tee benchmark: accel-agent vs torchrun, side by side in one run.

1. Throughput: one worker writes SIZE MB of 100-byte lines as fast as it can;
   the launcher tees them (prefixed) to its stdout, which goes to a file. MB/s =
   bytes the worker wrote / wall time of the whole command.
2. Latency: one worker writes a line stamped with CLOCK_MONOTONIC every 10 ms;
   this script reads the launcher's stdout through a pipe and stamps each line
   on arrival; the difference is the delay from the worker's write to the line
   appearing on the launcher's output.

Usage: python bench/logs.py --accel PATH --torchrun PATH [--mb 200] [--lines 300]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

LATENCY_WORKER = r"""
import sys, time
n = int(sys.argv[1])
for i in range(n):
    sys.stdout.write(f"stamp {time.clock_gettime(time.CLOCK_MONOTONIC):.9f}\n")
    sys.stdout.flush()
    time.sleep(0.01)
"""


def launcher_args(name, path, logdir):
    if name == "accel-agent":
        return [path, "--nproc-per-node", "1", "--tee", "3", "--log-dir", logdir]
    return [path, "--standalone", "--nproc-per-node", "1", "--tee", "3", "--log-dir", logdir]


def throughput(name, path, mb):
    with tempfile.TemporaryDirectory() as d:
        out = open(os.path.join(d, "console"), "wb")
        cmd = launcher_args(name, path, os.path.join(d, "logs")) + [
            "--no-python", "sh", "-c", f"yes {'x' * 99} | head -c {mb * 1024 * 1024}"]
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=out, stderr=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - t0
        console = os.path.getsize(os.path.join(d, "console"))
        return mb / wall, console


def latency(name, path, lines):
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "w.py")
        open(script, "w").write(LATENCY_WORKER)
        cmd = launcher_args(name, path, os.path.join(d, "logs")) + [
            "--no-python", sys.executable, "-u", script, str(lines)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        delays = []
        buf = b""
        while True:
            chunk = p.stdout.read1(65536) if hasattr(p.stdout, "read1") else os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            now = time.clock_gettime(time.CLOCK_MONOTONIC)
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                i = line.find(b"stamp ")
                if i >= 0:
                    delays.append((now - float(line[i + 6:])) * 1000)
        p.wait()
        delays.sort()
        return statistics.median(delays), delays[int(0.99 * (len(delays) - 1))], len(delays)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--lines", type=int, default=300)
    a = ap.parse_args()
    launchers = {"accel-agent": a.accel, "torchrun": a.torchrun}
    rows = []
    for name, path in launchers.items():
        mbs, console = throughput(name, path, a.mb)
        med, p99, n = latency(name, path, a.lines)
        rows.append((name, mbs, console, med, p99, n))
    print(f"tee of one worker's stdout (--tee 3, prefixed), {a.mb} MB of 100-byte lines; latency over "
          f"{a.lines} lines written 10 ms apart; {os.cpu_count()} CPUs")
    print()
    print("| launcher | throughput | console bytes | line latency median | p99 |")
    print("|---|---|---|---|---|")
    for name, mbs, console, med, p99, n in rows:
        print(f"| {name} | {mbs:.0f} MB/s | {console:,} | {med:.3f} ms | {p99:.3f} ms |")


if __name__ == "__main__":
    main()
