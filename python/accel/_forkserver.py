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
_prctl = None


def prepare() -> None:
    """Resolves libc's prctl in the caller, before it forks: loading a
    library after forking a multi-threaded process can deadlock on the
    loader's lock."""
    global _prctl
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` dies (and at once if it has)."""
    if _prctl:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _plain_signals() -> None:
    """Default dispositions: a kernel's handlers (or an ignored SIGCHLD,
    which would break waitpid) make no sense in these processes."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass


def serve(sock: socket.socket, target: Callable[[], None], parent: int) -> NoReturn:
    """Runs in the fork server until the agent's end of ``sock`` closes."""
    code = 0
    try:
        # An interrupt of the notebook reaches the agent, which stops the
        # workers; this process ignores it. (The caller blocked SIGINT
        # around the fork, so none arrived before this.)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.setpgid(0, 0)
        _die_with_parent(parent)
        _plain_signals()
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
        self.children: Dict[int, int] = {}  # pid -> pidfd (-1: polled)
        self.buf = b""
        self.fds: List[int] = []
        self.pid = os.getpid()
        # pidfds need Linux 5.3 (and a seccomp profile that allows them);
        # without, exits are polled every 50 ms.
        self.pidfds = hasattr(os, "pidfd_open")
        if self.pidfds:
            try:
                os.close(os.pidfd_open(self.pid))
            except OSError:
                self.pidfds = False

    def run(self) -> None:
        self.sock.setblocking(True)
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.sel.select(None if self.pidfds else 0.05):
                if key.data is None:
                    if not self._read():
                        self._end()
                        return
                else:
                    self._reap(key.data)
            if not self.pidfds:
                self._poll()

    def _poll(self) -> None:
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._ended(pid, status)

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
        rank, rid = req["local_rank"], req.get("id")
        try:
            pid = os.fork()
        except OSError as e:
            os.close(out)
            os.close(err)
            self._send({"refused": {"id": rid, "local_rank": rank, "error": f"fork failed: {e}"}})
            return
        if pid == 0:
            _worker(self.target, dict(req["env"]), out, err, self.sock, self.pid)
        # Its own group before anyone can signal it (the child does the same).
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        os.close(out)
        os.close(err)
        pidfd = -1
        if self.pidfds:
            pidfd = os.pidfd_open(pid)
            self.sel.register(pidfd, selectors.EVENT_READ, pid)
        self.children[pid] = pidfd
        self._send({"spawned": {"id": rid, "local_rank": rank, "pid": pid}})

    def _reap(self, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        self._ended(pid, status)

    def _ended(self, pid: int, status: int) -> None:
        pidfd = self.children.pop(pid)
        if pidfd >= 0:
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
        _plain_signals()
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
        callers = (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True, errors="backslashreplace"
        )
        old = {id(callers[0]): sys.stdout, id(callers[1]): sys.stdout}
        old.update({id(callers[2]): sys.stderr, id(callers[3]): sys.stderr})
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        _adopt(old)
    except BaseException:  # noqa: BLE001 - nothing may escape a fork
        os._exit(127)
    try:
        target()
        code = 0
    except KeyboardInterrupt:
        # As `python` does: die by SIGINT, so the exit says so (torch: -2).
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - reported, as torch's @record does
        traceback.print_exc()
        _record(e)
        code = 1
    _finish()
    os._exit(code)


def _adopt(old: Dict[int, object]) -> None:
    """What a new process would have: multiprocessing's fork hooks run (a
    Queue argument gets this process's own feeder), logging handlers that
    wrote to the caller's streams write to this process's, and torch's
    thread count follows OMP_NUM_THREADS (torch read it in the caller)."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util._finalizer_registry.clear()
        mp_util._run_after_forkers()
    logging = sys.modules.get("logging")
    if logging is not None:
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", []):
                stream = getattr(handler, "stream", None)
                if stream is not None and id(stream) in old:
                    handler.stream = old[id(stream)]
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _finish() -> None:
    """What a multiprocessing child does at its end (queues flushed,
    threads joined), then the streams flushed."""
    mp_util = sys.modules.get("multiprocessing.util")
    for step in (getattr(mp_util, "_exit_function", None), getattr(sys.modules.get("threading"), "_shutdown", None)):
        if step is not None:
            try:
                step()
            except BaseException:  # noqa: BLE001
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


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
