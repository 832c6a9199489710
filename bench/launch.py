"""Launch benchmark: accel-agent vs torchrun, side by side in one run.

Runs `<launcher> --nproc-per-node N --no-python true` alternately with each
launcher, for each N, and reports the median wall time and the median peak RSS (the
largest resident set of any process of the launch that the launcher waited
for, from wait4's ru_maxrss). Prints a Markdown table.

Usage: python bench/launch.py --accel PATH --torchrun PATH [--nproc 1,4,16] [--runs 10]
"""
import argparse
import os
import platform
import statistics
import subprocess
import time


def run_once(argv):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed with status {status}")
    return wall, usage.ru_maxrss / 1024.0  # KiB -> MiB


def compare(cmds, runs):
    """Runs each command of `cmds` (name -> argv) once to warm the page cache,
    then `runs` times alternating; returns (median wall, median peak RSS) per name."""
    for argv in cmds.values():
        run_once(argv)
    results = {k: [] for k in cmds}
    for _ in range(runs):
        for name, argv in cmds.items():
            results[name].append(run_once(argv))
    wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
    rss = {k: statistics.median(r for _, r in v) for k, v in results.items()}
    return wall, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--nproc", default="1,4,16")
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    print(f"launch N workers of `true`, whole command; {a.runs} runs each, alternating, medians; "
          f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}")
    print()
    print("| workers | accel-agent wall | torchrun wall | ratio | accel-agent peak RSS | torchrun peak RSS | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.nproc.split(",")]:
        cmds = {
            "accel": [a.accel, "--nproc-per-node", str(n), "--no-python", "true"],
            "torchrun": [a.torchrun, "--nproc-per-node", str(n), "--no-python", "true"],
        }
        wall, rss = compare(cmds, a.runs)
        print(f"| {n} | {wall['accel'] * 1000:.1f} ms | {wall['torchrun'] * 1000:.0f} ms | "
              f"{wall['torchrun'] / wall['accel']:.0f}x | {rss['accel']:.1f} MiB | {rss['torchrun']:.0f} MiB | "
              f"{rss['torchrun'] / rss['accel']:.0f}x |", flush=True)


if __name__ == "__main__":
    main()
