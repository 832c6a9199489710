"""Records the CPUs this worker may run on, for the `--numa-binding` tests:
the process's affinity, the kernel's `Cpus_allowed_list` of it, and the
affinity of a thread it starts (a binding covers the whole process), in
`<dir>/affinity_<LOCAL_RANK>.json`."""

import json
import os
import sys
import threading


def main() -> None:
    out = sys.argv[1]
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    seen = {}

    def in_thread() -> None:
        seen["thread"] = sorted(os.sched_getaffinity(0))

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    facts = {
        "affinity": sorted(os.sched_getaffinity(0)),
        "cpus_allowed_list": status["Cpus_allowed_list"].strip(),
        "thread": seen["thread"],
    }
    with open(os.path.join(out, f"affinity_{os.environ['LOCAL_RANK']}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
