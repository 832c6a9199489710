"""Training progress for the agent: ``accel.progress(step)`` after each step,
``accel.checkpointed(step)`` once a checkpoint of that step is saved.

The agent (``accel-agent``, or ``accel launch``) gives each worker
``ACCEL_PROGRESS_SOCKET``; a report is one datagram on it, sent without
waiting (a full queue drops it), so a call costs a few microseconds and
never blocks a step. Outside accel (no such variable) both calls do nothing,
so a script that reports runs unchanged under torchrun.

The agent sums the reports up per node and the rendezvous per job: with
``--max-no-progress-restarts N``, N restarts in a row that did not take the
job past the best step it reached end it, naming that step. With
``--learned-hang-timeouts``, the agent learns each rank's step time and
takes a rank silent for much longer for hung; ``with accel.section(name):``
marks work that is not a step (saving a checkpoint, evaluating), which
learns a timeout of its own. The rendezvous compares the ranks' time per
step and flags a rank persistently slower than the others (a straggler);
in a job whose ranks wait for each other every step, pass each step's own
work as ``compute=`` (seconds) so that the slow rank can be told apart.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import time
from typing import Iterator, Optional

__all__ = ["progress", "checkpointed", "section"]

_ENV = "ACCEL_PROGRESS_SOCKET"
# (path, socket) of the last send: a worker's environment does not change,
# but a forked process gets a socket of its own.
_sock: Optional[socket.socket] = None
_path: Optional[str] = None
_pid: Optional[int] = None
# Step reports closer together than this are folded into the next one: at
# most 100 a second per worker, whatever its step rate. A report is a system
# call, and on a virtual machine a system call in the middle of a step costs
# the step more than the call itself (about 10 us at 1,000 steps/s, where
# the call alone takes 3). A checkpoint report and a section's edges are
# always sent, after the step report held back; so is a held report when
# the worker exits normally or by an exception.
_GAP = 0.01
_last: Optional[float] = None
_held: Optional[str] = None


def _send(text: str) -> None:
    global _sock, _path, _pid
    path = os.environ.get(_ENV)
    if not path:
        return
    pid = os.getpid()
    if _sock is None or _path != path or _pid != pid:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        _sock, _path, _pid = s, path, pid
    try:
        _sock.sendto(text.encode("ascii"), path)
    except OSError:
        # A full queue, or no agent (it stopped): progress is best effort.
        pass


def _step(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number of 0 or more, not {value!r}")
    return value


def progress(step: int, samples: Optional[int] = None, compute: Optional[float] = None) -> None:
    """Says that training step ``step`` is done (``samples``: samples seen so far).

    ``compute``: the seconds of this step that were this rank's own work,
    before it waited for the others (in DDP, the forward pass and the loss,
    say). Where ranks wait for each other every step, a slow rank's extra
    time is in every rank's step, so the rendezvous can tell which rank is
    the straggler only from this."""
    global _last, _held
    step = _step("step", step)
    text = f"p {step}" if samples is None else f"p {step} {_step('samples', samples)}"
    if compute is not None:
        if isinstance(compute, bool) or not isinstance(compute, (int, float)) or not compute >= 0:
            raise ValueError(f"compute must be seconds, 0 or more, not {compute!r}")
        text += f" w={min(int(compute * 1e6), 2**63 - 1)}"
    now = time.monotonic()
    if _last is not None and now - _last < _GAP:
        _held = text
        return
    _last, _held = now, None
    _send(text)


def _flush() -> None:
    global _held
    if _held is not None:
        _send(_held)
        _held = None


atexit.register(_flush)


def checkpointed(step: int) -> None:
    """Says that a checkpoint of step ``step`` is saved."""
    step = _step("step", step)
    _flush()
    _send(f"c {step}")


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    """Marks a block that is not a training step (``with accel.section("checkpoint"):``):
    with ``--learned-hang-timeouts`` the agent judges it by the longest
    earlier run of the same section, not by the step time."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"a section name is 1 to 32 letters, digits, '_', '-' or '.', not {name!r}"
        )
    _flush()
    _send(f"s {name}")
    try:
        yield
    finally:
        _send(f"e {name}")
