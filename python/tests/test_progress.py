"""What `accel.progress` sends the agent: one datagram per report, the
rank's own work per step as `w=MICROSECONDS` when given."""

from __future__ import annotations

import importlib
import socket
import time

import pytest

# The module (the package's `progress` is the function).
progress = importlib.import_module("accel.progress")


@pytest.fixture
def agent(tmp_path, monkeypatch):
    path = str(tmp_path / "progress.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2)
    monkeypatch.setenv("ACCEL_PROGRESS_SOCKET", path)
    # Nothing held back from an earlier test: reports are 10 ms apart here.
    monkeypatch.setattr(progress, "_last", None)
    monkeypatch.setattr(progress, "_held", None)
    yield s
    s.close()


def test_a_steps_own_work_goes_with_it_in_microseconds(agent):
    progress.progress(3, compute=0.0123)
    assert agent.recv(64) == b"p 3 w=12300"
    time.sleep(0.02)
    progress.progress(4, samples=128, compute=0)
    assert agent.recv(64) == b"p 4 128 w=0"
    time.sleep(0.02)
    progress.progress(5)
    assert agent.recv(64) == b"p 5"


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "0.1", True])
def test_compute_that_is_no_duration_is_refused(agent, bad):
    with pytest.raises(ValueError, match="compute must be seconds"):
        progress.progress(1, compute=bad)
