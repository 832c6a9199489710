"""accelerate's own notebook tests, with accel's notebook_launcher.

accelerate ships `test_utils/scripts/test_notebook.py` (a pytest module) in
its wheel. This runs it, unmodified but for the one import it swaps
(`from accelerate import ..., notebook_launcher` becomes accel's), for one
and for two processes, and checks by name which tests passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import accelerate

SOURCE = Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_notebook.py"
ORIGINAL = "from accelerate import PartialState, notebook_launcher"

# What each process count must pass; accelerate itself skips the rest for one
# process, and its bitsandbytes test where bitsandbytes is not installed.
EXPECTED = {
    1: {"test_can_initialize"},
    2: {
        "test_can_initialize",
        "test_clean_cuda_fork",
        "test_static_rdzv_backend",
        "test_c10d_rdzv_backend",
        "test_fault_tolerant",
        "test_monitoring",
    },
}


@pytest.mark.parametrize("processes", [1, 2])
def test_accelerate_s_notebook_tests_pass_with_accel_s_launcher(tmp_path: Path, processes: int) -> None:
    text = SOURCE.read_text()
    assert text.count(ORIGINAL) == 1, f"{SOURCE} no longer imports notebook_launcher as expected"
    swapped = tmp_path / "test_notebook_accel.py"
    swapped.write_text(text.replace(ORIGINAL, "from accelerate import PartialState\nfrom accel import notebook_launcher"))
    report = tmp_path / "report.xml"
    env = dict(os.environ, ACCELERATE_NUM_PROCESSES=str(processes))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(swapped)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    passed = set()
    for case in ET.parse(report).getroot().iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            passed.add(case.get("name"))
    assert EXPECTED[processes] <= passed, (passed, done.stdout[-2000:])
