"""torch's own `--numa-binding` choice for fake machines, to compare accel's
with: runs torch 2.13's `torch.numa.binding` code unchanged, with its file
reads moved under a fake root and CUDA's device properties made from PCI
addresses (no GPU is needed).

Reads a JSON list of cases on stdin, each `{"root": DIR, "gpus": ["0000:1a:00.0",
...], "allowed": [CPU, ...]}`, and writes, for each case, `{MODE: [CPUS or
{"error": TEXT}, one per GPU]}` as a JSON list on stdout."""

import json
import os
import sys
import types

import torch.numa.binding as binding


def fake(case: dict) -> None:
    root = case["root"]
    gpus = case["gpus"]

    def under_root(path: str) -> str:
        return root + path if os.path.isabs(path) else path

    real_open = open
    binding.open = lambda path, *a, **k: real_open(under_root(path), *a, **k)
    binding.os = types.SimpleNamespace(listdir=lambda p: os.listdir(under_root(p)), path=os.path)

    def properties(index: int) -> types.SimpleNamespace:
        addr = gpus[index]  # IndexError for a GPU that does not exist
        return types.SimpleNamespace(
            pci_domain_id=int(addr[0:4], 16), pci_bus_id=int(addr[5:7], 16), pci_device_id=int(addr[8:10], 16)
        )

    binding.torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_device_properties=properties, device_count=lambda: len(gpus))
    )
    binding._get_allowed_cpu_indices_for_current_thread = lambda: set(case["allowed"])


def choose(mode: str, gpu: int) -> object:
    try:
        cpus = binding._get_logical_cpus_to_bind_to(
            gpu_index=gpu, numa_options=binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
        )
    except Exception as e:  # noqa: BLE001 - torch's failure is the answer
        return {"error": f"{type(e).__name__}: {e}"}
    if not cpus:
        return {"error": "Must bind to a non-empty set of CPU indices"}
    return sorted(cpus)


def main() -> None:
    answers = []
    for case in json.load(sys.stdin):
        fake(case)
        answers.append(
            {mode.value: [choose(mode.value, gpu) for gpu in range(len(case["gpus"]))] for mode in binding.AffinityMode}
        )
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
