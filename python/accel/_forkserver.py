"""The fork server: the process whose forks are the workers of a launch.

``notebook_launcher`` forks it from the caller (a notebook's kernel) at the
moment of the call, so it holds the function, its arguments and whatever
they share by inheritance (a ``multiprocessing.Queue``); then it does only
what ``accel-agent --fork-server-fd`` asks: fork a worker with the round's
environment and output pipes, and report each one's end. It never decides
anything: rounds, restarts, signals and reports are the agent's.

The protocol (one JSON object per line each way, output pipes as
``SCM_RIGHTS``) is documented with the agent's side, in the agent crate's
``fork_server`` module.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Callable, Dict, List, NoReturn

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 4 << 20


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` dies (and at once if it has)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def serve(sock: socket.socket, target: Callable[[], None], parent: int) -> NoReturn:
    """Runs in the fork server until the agent's end of ``sock`` closes."""
    code = 0
    try:
        os.setpgid(0, 0)
        _die_with_parent(parent)
        # The kernel's handlers make no sense here; an interrupt of the
        # notebook reaches the agent, which stops the workers.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _Server(sock, target).run()
    except BaseException:  # noqa: BLE001 - nothing may escape a fork
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    os._exit(code)


class _Server:
    def __init__(self, sock: socket.socket, target: Callable[[], None]) -> None:
        self.sock = sock
        self.target = target
        self.sel = selectors.DefaultSelector()
        self.children: Dict[int, int] = {}  # pid -> pidfd
        self.buf = b""
        self.fds: List[int] = []

    def run(self) -> None:
        self.sock.setblocking(True)
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    if not self._read():
                        self._end()
                        return
                else:
                    self._reap(key.data)

    def _read(self) -> bool:
        data, fds, flags, _ = socket.recv_fds(self.sock, 1 << 16, 8)
        self.fds.extend(fds)
        if not data:
            return False
        if flags & socket.MSG_CTRUNC:
            raise RuntimeError("the agent sent more file descriptors than a request carries")
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self._request(json.loads(line))
        if len(self.buf) > _MAX_LINE:
            raise RuntimeError("the agent sent an overlong request")
        return True

    def _request(self, msg: dict) -> None:
        req = msg["spawn"]
        out, err = self.fds[0], self.fds[1]
        del self.fds[:2]
        rank = req["local_rank"]
        try:
            pid = os.fork()
        except OSError as e:
            os.close(out)
            os.close(err)
            self._send({"refused": {"local_rank": rank, "error": f"fork failed: {e}"}})
            return
        if pid == 0:
            _worker(self.target, dict(req["env"]), out, err, self.sock, os.getppid())
        os.close(out)
        os.close(err)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = pidfd
        self.sel.register(pidfd, selectors.EVENT_READ, pid)
        self._send({"spawned": {"local_rank": rank, "pid": pid}})

    def _reap(self, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        pidfd = self.children.pop(pid)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        if os.WIFSIGNALED(status):
            self._send({"exited": {"pid": pid, "signal": os.WTERMSIG(status)}})
        else:
            self._send({"exited": {"pid": pid, "code": os.waitstatus_to_exitcode(status)}})

    def _send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def _end(self) -> None:
        """The agent is gone: nothing it started may outlive it."""
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass


def _worker(
    target: Callable[[], None],
    env: Dict[str, str],
    out: int,
    err: int,
    sock: socket.socket,
    server: int,
) -> NoReturn:
    """Becomes one worker: what ``python -u`` would set up, then ``target``."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent(server)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        # The caller's streams (a kernel's, which forward to its cells) are
        # replaced by this process's own, unbuffered as under `python -u`.
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True, errors="backslashreplace"
        )
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    except BaseException:  # noqa: BLE001 - nothing may escape a fork
        os._exit(127)
    try:
        target()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - reported, as torch's @record does
        traceback.print_exc()
        _record(e)
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
    os._exit(code)


def _record(e: BaseException) -> None:
    """Writes the exception to TORCHELASTIC_ERROR_FILE in torch's format."""
    try:
        from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

        ErrorHandler().record_exception(e)
    except BaseException:  # noqa: BLE001 - without torch, the same format by hand
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not path:
            return
        import time

        data = {
            "message": {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))},
            }
        }
        try:
            with open(path, "w") as fp:
                json.dump(data, fp)
        except OSError:
            pass
