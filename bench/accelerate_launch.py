"""`accel launch` vs `accelerate launch`, side by side in one run.

Runs `<tool> launch --multi_gpu --num_processes N --no_python true` alternately
with each tool (no configuration file: HF_HOME points at an empty directory),
for each N, and reports the median wall time and median peak RSS, measured as
in bench/launch.py. Prints a Markdown table.

Usage: python bench/accelerate_launch.py --accel PATH --accelerate PATH [--nproc 2,4] [--runs 5]
"""
import argparse
import os
import tempfile

from launch import compare


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accel", required=True)
    ap.add_argument("--accelerate", required=True)
    ap.add_argument("--nproc", default="2,4")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="accel-bench-hf-")
    print(f"launch N workers of `true` through each tool's `launch`, whole command; {a.runs} runs each, "
          "alternating, medians")
    print()
    print("| workers | accel launch wall | accelerate launch wall | ratio | accel peak RSS | accelerate peak RSS | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.nproc.split(",")]:
        tail = ["launch", "--multi_gpu", "--num_processes", str(n), "--no_python", "true"]
        cmds = {"accel": [a.accel, *tail], "accelerate": [a.accelerate, *tail]}
        wall, rss = compare(cmds, a.runs)
        print(f"| {n} | {wall['accel'] * 1000:.1f} ms | {wall['accelerate'] * 1000:.0f} ms | "
              f"{wall['accelerate'] / wall['accel']:.0f}x | {rss['accel']:.1f} MiB | "
              f"{rss['accelerate']:.0f} MiB | {rss['accelerate'] / rss['accel']:.0f}x |", flush=True)


if __name__ == "__main__":
    main()
