"""accelerate's argument checks and guards, with accelerate's messages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from accel import debug_launcher, notebook_launcher


def nothing() -> None:
    pass


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "You have to specify the number of devices"),
        ({"num_processes": 2, "node_rank": 1}, ValueError, "node_rank must be less than the number of nodes"),
        ({"num_processes": 2, "mixed_precision": "fp32"}, ValueError, r"Unknown mixed_precision mode: fp32"),
        ({"num_processes": 0}, ValueError, "num_processes must be a positive integer"),
        ({"num_processes": 2, "max_restarts": -1}, ValueError, "max_restarts must be 0 or more"),
        ({"num_processes": 2, "monitor_interval": 0}, ValueError, "monitor_interval must be greater than 0"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        notebook_launcher(nothing, **kwargs)


def test_debug_launcher_needs_a_positive_count() -> None:
    with pytest.raises(ValueError, match="num_processes must be a positive integer"):
        debug_launcher(nothing, num_processes=0)


def guarded(setup: str) -> subprocess.CompletedProcess:
    code = setup + textwrap.dedent(
        """
        from accel import notebook_launcher
        def f():
            pass
        notebook_launcher(f, num_processes=2)
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_an_accelerator_made_before_the_launch_is_refused() -> None:
    done = guarded("from accelerate import Accelerator\nAccelerator(cpu=True)")
    assert done.returncode != 0
    assert "the `Accelerator` should only be initialized inside your training function" in done.stderr, done.stderr


def test_one_process_runs_the_function_here() -> None:
    seen = []
    notebook_launcher(lambda x: seen.append(x), args=(5,), num_processes=1)
    assert seen == [5]


def test_an_unknown_rdzv_conf_key_is_the_agent_s_clear_error() -> None:
    with pytest.raises(RuntimeError, match="accel-agent exited with code 2 before any worker failed: .*no_such_key"):
        notebook_launcher(nothing, num_processes=2, rdzv_conf={"no_such_key": 1})


def put_rank(q) -> None:
    import os

    # The queue's feeder thread may still be writing when the function
    # returns: the process must flush it before it ends. (Smaller than a
    # pipe's buffer: as with any multiprocessing child, a bigger item would
    # wait for a reader, and the caller reads only after the launch.)
    q.put((int(os.environ["RANK"]), "x" * 4096))


def test_a_queue_argument_carries_results_back_to_the_caller() -> None:
    import multiprocessing as mp

    q = mp.get_context("fork").Queue()
    notebook_launcher(put_rank, args=(q,), num_processes=2)
    got = sorted(q.get(timeout=30)[0] for _ in range(2))
    assert got == [0, 1]
