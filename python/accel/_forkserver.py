"""The fork server: the process whose forks are the workers of a launch.

It has two users, and one code path for what a forked worker must look like:

- ``notebook_launcher`` forks it from the caller (a notebook's kernel) at the
  moment of the call, so it holds the function, its arguments and whatever
  they share by inheritance (a ``multiprocessing.Queue``); each worker calls
  the function.
- ``accel-agent --preload MODULES`` starts it as the **zygote**: a fresh
  interpreter that imports those modules and nothing else, so that each
  worker, forked from it, runs the training script as ``python -u script.py``
  would without paying for the imports again (run as
  ``python -c "<this file>" --fd N --preload MODULES``; see :func:`zygote`).

Either way it does only what the agent asks: fork a worker with the round's
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
import struct
import sys
import traceback
from typing import Callable, Dict, List, NoReturn, Optional, Tuple

# The name tracebacks give this file's frames: a worker's traceback shows the
# script's frames only, as under `python script.py`.
_SELF = globals().get("__file__") or "<accel zygote>"

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61
_MAX_LINE = 4 << 20
# The most workers a group may have: one byte each fits a pipe's buffer.
_MAX_GROUP = 1 << 15
_prctl = None

# The agent's secrets (the agent crate's `supervisor::SECRET_VARIABLES`):
# never in a worker's environment.
_SECRETS = (b"ACCEL_RDZV_TOKEN", b"RDZV_TOKEN")


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


def _allow_tracer(tracer: object) -> None:
    """Lets ``tracer`` (the agent, whose py-spy reads a hung worker's
    stacks) and its children trace this process where Yama allows ptrace
    only to ancestors, as an executed worker does; nothing without one."""
    if _prctl and isinstance(tracer, int) and not isinstance(tracer, bool) and tracer > 0:
        _prctl(_PR_SET_PTRACER, tracer, 0, 0, 0)


def _bind_cpus(cpus: object) -> None:
    """Binds this worker (one thread, just forked) to ``cpus``, the agent's
    ``--numa-binding`` choice, before it runs anything, as an executed worker
    is bound before its exec; nothing without a list."""
    if isinstance(cpus, list) and cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError, TypeError) as e:
            os.write(2, f"accel: cannot bind this worker to CPUs {cpus} (--numa-binding): {e}\n".encode())
            raise


def _environ_block() -> Optional[Tuple[int, int]]:
    """Where this process's initial environment is in its memory: what
    ``/proc/PID/environ`` shows (``env_start`` and ``env_end``, fields 50
    and 51 of ``/proc/self/stat``); ``None`` if the kernel does not say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 1 :].split()
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
    except (OSError, ValueError, IndexError):
        return None
    if start == 0 or end <= start or end - start > 64 << 20:
        return None
    return start, end


def _scrub_environ_block(drop: Callable[[bytes], bool]) -> int:
    """Overwrites with NUL bytes each ``NAME=value`` entry of this process's
    raw environment block whose name ``drop`` says. A fork keeps its
    parent's block, and ``os.environ`` does not change it: without this a
    worker's ``/proc/PID/environ``, readable by the processes of its user
    (a sibling worker included), shows the caller's variables, its
    rendezvous token too. Call it in a process with one thread (a fork's
    child). Returns how many entries were overwritten."""
    block = _environ_block()
    if block is None:
        return 0
    start, end = block
    data = ctypes.string_at(start, end - start)
    scrubbed, at = 0, 0
    for entry in data.split(b"\0"):
        name, eq, _ = entry.partition(b"=")
        if eq and drop(name):
            ctypes.memset(start + at, 0, len(entry))
            scrubbed += 1
        at += len(entry) + 1
    return scrubbed


def _plain_signals() -> None:
    """Default dispositions: a kernel's handlers (or an ignored SIGCHLD,
    which would break waitpid) make no sense in these processes."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass


def serve(sock: socket.socket, target: Optional[Callable[[], None]], parent: int) -> NoReturn:
    """Runs in the fork server until the agent's end of ``sock`` closes.
    ``target`` is what each worker calls; ``None`` (the zygote): each runs
    the script its request names."""
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
        # Forked from the caller: its token is in this process's block,
        # which the workers (its children, of its user) could read.
        for name in _SECRETS:
            os.environ.pop(name.decode(), None)
        _scrub_environ_block(lambda name: name in _SECRETS)
        _Server(sock, target).run()
    except BaseException:  # noqa: BLE001 - nothing may escape a fork
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    os._exit(code)


class _Server:
    def __init__(self, sock: socket.socket, target: Optional[Callable[[], None]]) -> None:
        self.sock = sock
        self.target = target
        self.sel = selectors.DefaultSelector()
        self.children: Dict[int, int] = {}  # pid -> pidfd (-1: polled)
        self.buf = b""
        self.fds: List[int] = []
        self.pid = os.getpid()
        # A function's workers, by the agent's group id: see _Group.
        self.groups: Dict[int, _Group] = {}
        self.member_of: Dict[int, _Group] = {}
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
                elif isinstance(key.data, _Group):
                    self._returned(key.data)
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
        group = self._group(req.get("group")) if self.target is not None else None
        try:
            pid = os.fork()
        except OSError as e:
            os.close(out)
            os.close(err)
            self._send({"refused": {"id": rid, "local_rank": rank, "error": f"fork failed: {e}"}})
            return
        if pid == 0:
            peers = None
            if group is not None:
                peers = (group.done_w, group.go_r)
                for g in self.groups.values():
                    for fd in g.fds():
                        if fd not in peers:
                            os.close(fd)
            _worker(self.target, req, out, err, self.sock, self.pid, peers)
        if group is not None:
            group.members.add(pid)
            self.member_of[pid] = group
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

    def _group(self, spec: object) -> Optional["_Group"]:
        """The group a request's worker belongs to (made at its first
        worker); ``None`` if the agent named none."""
        if not isinstance(spec, dict):
            return None
        gid, size = spec.get("id"), spec.get("size")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (gid, size)):
            return None
        # Releasing writes a byte per worker into a pipe (64 KiB).
        size = min(size, _MAX_GROUP)
        group = self.groups.get(gid)
        if group is None:
            group = self.groups[gid] = _Group(gid, size)
            self.sel.register(group.done_r, selectors.EVENT_READ, group)
        return group

    def _returned(self, group: "_Group") -> None:
        """Workers of ``group`` said their function returned (each its pid)."""
        group.buf += os.read(group.done_r, 4096)
        whole = len(group.buf) - len(group.buf) % 4
        for (pid,) in struct.iter_unpack("=i", group.buf[:whole]):
            if pid in group.members:
                group.returned.add(pid)
        group.buf = group.buf[whole:]
        self._release_if_all_returned(group)

    def _release_if_all_returned(self, group: "_Group") -> None:
        if len(group.returned) >= group.size:
            # One byte per waiting worker; each reads one.
            os.write(group.go_w, b"\0" * len(group.members))
            self._drop(group)

    def _drop(self, group: "_Group") -> None:
        """Forgets ``group``. Its workers that still wait see the end of
        their pipe without a byte: a peer failed, and the agent stops them."""
        if self.groups.pop(group.gid, None) is None:
            return
        self.sel.unregister(group.done_r)
        for fd in group.fds():
            os.close(fd)
        for pid in group.members:
            self.member_of.pop(pid, None)

    def _ended(self, pid: int, status: int) -> None:
        pidfd = self.children.pop(pid)
        if pidfd >= 0:
            self.sel.unregister(pidfd)
            os.close(pidfd)
        group = self.member_of.pop(pid, None)
        if group is not None:
            group.members.discard(pid)
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                # It ended without saying it returned (SystemExit(0)): it
                # is done all the same.
                group.returned.add(pid)
                self._release_if_all_returned(group)
            else:
                self._drop(group)
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


class _Group:
    """The workers the agent starts together (one round on this node) for
    a function, as torch's ``elastic_launch`` (accelerate's
    ``notebook_launcher``) runs one: a worker whose function returns stays
    alive until every worker of its group has returned. A rank that ended
    at once would close its sockets while a peer may still be completing
    the process group's set-up (gloo's ``connectFullMesh`` then fails with
    "Connection closed by peer"); training code that returns after its last
    collective would race the same way.

    Each worker, once its function has returned, writes its pid (4 bytes,
    one atomic pipe write) to ``done`` and reads one byte from ``go``; the
    server writes ``size`` bytes to ``go`` when ``size`` workers have
    returned (or ended with code 0). When a worker fails the group is
    dropped: the waiting ones see the end of ``go`` and wait to be stopped
    by the agent, as torch's are."""

    def __init__(self, gid: int, size: int) -> None:
        self.gid = gid
        self.size = size
        self.members: set = set()
        self.returned: set = set()
        self.buf = b""
        self.done_r, self.done_w = os.pipe()
        self.go_r, self.go_w = os.pipe()

    def fds(self) -> Tuple[int, int, int, int]:
        return (self.done_r, self.done_w, self.go_r, self.go_w)


def _worker(
    target: Optional[Callable[[], None]],
    req: dict,
    out: int,
    err: int,
    sock: socket.socket,
    server: int,
    peers: Optional[Tuple[int, int]] = None,
) -> NoReturn:
    """Becomes one worker: what ``python -u`` would set up, then ``target``
    (or, in the zygote, the script of ``req["argv"]``)."""
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
        os.environ.update(dict(req["env"]))
        # What the agent withheld from the worker (its token) does not show
        # in its /proc/PID/environ either.
        given = {os.fsencode(k) for k in os.environ}
        _scrub_environ_block(lambda name: name not in given or name in _SECRETS)
        _bind_cpus(req.get("cpus"))
        _allow_tracer(req.get("tracer"))
        # The caller's streams (a kernel's, which forward to its cells) are
        # replaced by this process's own, unbuffered as under `python -u`.
        callers = (sys.stdout, sys.__stdout__, sys.stderr, sys.__stderr__)
        if target is None:
            # The zygote's own streams were made by the same interpreter
            # settings (`-u`, the locale): the new ones copy their encoding
            # and error handlers; line buffering only on a terminal, as the
            # interpreter decides it.
            sys.stdin, sys.stdout, sys.stderr = (
                _stream(0, "r", sys.__stdin__),
                _stream(1, "w", sys.__stdout__),
                _stream(2, "w", sys.__stderr__),
            )
        else:
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
    if target is None:
        _run_script(list(req.get("argv") or []))
    _call(target, peers)


def _stream(fd: int, mode: str, like: object) -> io.TextIOWrapper:
    """A text stream on ``fd`` as ``python -u`` makes it, with ``like``'s
    encoding and error handler."""
    return io.TextIOWrapper(
        io.FileIO(fd, mode, closefd=False),
        encoding=getattr(like, "encoding", None),
        errors=getattr(like, "errors", None),
        line_buffering=mode == "w" and os.isatty(fd),
        write_through=True,
    )


def _call(target: Callable[[], None], peers: Optional[Tuple[int, int]] = None) -> NoReturn:
    """Calls a launcher's function with ``elastic_launch``'s semantics: an
    exception is printed and recorded in the error file, as torch's
    ``@record`` does; after a return, the worker waits for its group's
    (``peers``: see :class:`_Group`)."""
    code = 1
    try:
        target()
        if peers is not None:
            _wait_for_peers(*peers)
        code = 0
    except KeyboardInterrupt:
        _die_by_sigint(_finish)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 - reported, as torch's @record does
        traceback.print_exc()
        _record(e)
        code = 1
    _finish()
    os._exit(code)


def _run_script(argv: List[str]) -> NoReturn:
    """Runs ``python -u [-m] SCRIPT ARGS`` (``argv`` without the program) in
    this process as the interpreter would: a fresh ``__main__``,
    ``sys.argv``, ``sys.path[0]``, an uncaught exception printed by
    ``sys.excepthook`` (exit 1), ``SystemExit``'s code, and at the end
    non-daemon threads joined, ``atexit`` handlers run, streams flushed."""
    import runpy

    code = 1
    # A new interpreter seeds numpy's global generator from the OS; forks of
    # one zygote would all share its state. (`random` reseeds itself at fork.)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except BaseException:  # noqa: BLE001
            pass
    try:
        args = list(argv)
        while args and args[0] == "-u":
            args.pop(0)
        if args[:1] == ["-m"]:
            module, rest = args[1], args[2:]
            sys.argv = ["-m", *rest]
            sys.path[0] = os.getcwd()
            # It runs in `__main__`'s namespace: a fresh one, not this file's.
            _fresh_main()
            runpy._run_module_as_main(module, alter_argv=True)  # what `python -m` calls
        else:
            script, rest = args[0], args[1:]
            sys.argv = [script, *rest]
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            if os.path.isdir(script) or not script.endswith(".py"):
                # A directory or zip with __main__.py, or an unusual name.
                runpy.run_path(script, run_name="__main__")
            else:
                # The interpreter makes `__file__` absolute (since 3.9).
                _exec_main(os.path.abspath(script))
        code = 0
    except KeyboardInterrupt:
        _die_by_sigint(_at_exit)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter does
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == _SELF:
            tb = tb.tb_next
        e.__traceback__ = tb  # what the hook prints
        try:
            sys.excepthook(type(e), e, tb)
        except BaseException:  # noqa: BLE001
            traceback.print_exception(type(e), e, tb)
        code = 1
    _at_exit()
    os._exit(code)


def _exec_main(script: str) -> None:
    """Executes ``script`` as ``__main__``, the module the interpreter makes
    for ``python script.py``."""
    import importlib.machinery

    main = _fresh_main()
    main.__file__ = script
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    with io.open_code(script) as f:
        source = f.read()
    # dont_inherit: this file's `from __future__ import annotations` is not
    # the script's.
    exec(compile(source, script, "exec", dont_inherit=True), main.__dict__)


def _fresh_main():
    """An empty ``__main__`` module in ``sys.modules``, as a new interpreter has."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__spec__ = None
    sys.modules["__main__"] = main
    return main


def _exit_code(e: SystemExit) -> int:
    """The process's exit code for ``SystemExit`` (a message is printed)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _wait_for_peers(done: int, go: int) -> None:
    """Says this worker's function returned, then waits until every worker
    of its group has (see :class:`_Group`)."""
    os.write(done, struct.pack("=i", os.getpid()))
    os.close(done)
    while not os.read(go, 1):
        # The group was dropped: a peer failed and the agent stops this
        # process. Nothing more is read; a signal ends the wait.
        signal.pause()
    os.close(go)


def _die_by_sigint(finish: Callable[[], None]) -> NoReturn:
    """As ``python`` does after an uncaught ``KeyboardInterrupt``: the
    traceback, the exit steps, then death by SIGINT (torch reports -2)."""
    traceback.print_exc()
    finish()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)


def _at_exit() -> None:
    """The interpreter's exit steps: non-daemon threads joined, ``atexit``
    handlers (multiprocessing's and logging's among them), streams flushed."""
    import atexit

    for step in (getattr(sys.modules.get("threading"), "_shutdown", None), atexit._run_exitfuncs):
        if step is not None:
            try:
                step()
            except BaseException:  # noqa: BLE001
                pass
    # The interpreter's teardown clears `__main__`, which closes (flushes)
    # the files the script kept in globals; os._exit would lose their buffers.
    main = sys.modules.get("__main__")
    if main is not None and main.__dict__ is not globals():
        try:
            main.__dict__.clear()
            import gc

            gc.collect()
        except BaseException:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


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


def _unsafe_to_fork() -> Optional[str]:
    """Why forking this process would give broken workers, if it would: a
    thread that a fork does not stop (its locks are copied held, the thread
    itself is not) or an initialised CUDA context (unusable in a child).

    Thread pools that handle fork themselves (OpenBLAS, numpy's BLAS, stops
    its pool in a ``pthread_atfork`` handler and restarts it when next used)
    are told apart by one probe fork: what still runs after it is unsafe."""
    if _os_threads() > 1:
        probe = os.fork()
        if probe == 0:
            os._exit(0)
        os.waitpid(probe, 0)
    threads = _os_threads()
    if threads > 1:
        threading = sys.modules.get("threading")
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()] if threading else []
        return f"importing them started {threads - 1} thread(s) besides the main one ({', '.join(names) or 'not Python threads'})"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "importing them initialised CUDA"
    return None


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return _thread_count()


def _thread_count() -> int:
    threading = sys.modules.get("threading")
    return threading.active_count() if threading is not None else 1


# What a preloaded module imports on first use, preloaded with it.
_LAZY = {"torch": ["torch.distributed", "torch._dynamo"]}


def zygote(args: List[str]) -> NoReturn:
    """The zygote of ``accel-agent --preload``: imports the modules, says
    whether it can serve (``{"ready": ...}``, ``{"unsafe": why}``,
    ``{"failed": why}``, one line on the socket), then serves forks until
    the agent closes the socket. ``args``: ``--fd N --preload A,B
    [--path DIR]``; ``DIR`` is the script's directory (``sys.path[0]`` of
    the workers, so a preloaded module next to the script is found)."""
    import time

    opts = dict(zip(args[::2], args[1::2]))
    fd = int(opts["--fd"])
    # Nothing the imports start may hold the agent's socket: its end is how
    # the agent learns that this process is gone.
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    # The agent wrote this file on stdin; workers get /dev/null.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if opts.get("--path"):
        sys.path[0] = opts["--path"]

    def say(msg: dict) -> None:
        sock.sendall(json.dumps(msg).encode() + b"\n")

    started = time.monotonic()
    modules = [m for m in opts.get("--preload", "").split(",") if m]
    # torch imports torch._dynamo (~900 modules, over a second) lazily, the
    # first time a script builds DistributedDataParallel or FSDP or
    # compiles: preloading torch includes it, or every restart would pay it.
    for name, lazy in _LAZY.items():
        if name in modules:
            modules += [m for m in lazy if m not in modules]
    try:
        import importlib

        for name in modules:
            importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - reported to the agent
        say({"failed": traceback.format_exc()[-4000:]})
        os._exit(1)
    why = _unsafe_to_fork()
    if why is not None:
        say({"unsafe": why})
        os._exit(1)
    prepare()
    say({"ready": {"modules": modules, "seconds": round(time.monotonic() - started, 3), "pid": os.getpid()}})
    serve(sock, None, os.getppid())


if __name__ == "__main__":
    zygote(sys.argv[1:])
