"""accelerate's ``notebook_launcher`` and ``debug_launcher``, run by accel's agent.

``from accel import notebook_launcher`` replaces ``from accelerate import
notebook_launcher``: the same signature, defaults, checks and messages. The
difference is who supervises. accelerate forks the workers itself through
torch's elastic agent inside the notebook's kernel; here ``accel-agent``
does, exactly as it does for ``accel-agent train.py``: the same rendezvous
and worker store, a job-wide ``max_restarts``, ``monitor_interval``, output
prefixes, the orphan guard, and torch's ``ChildFailedError`` when the job
fails.

Why the workers are forks (and not new interpreters running a pickled
function): a function defined in a notebook cell has no importable name, and
arguments such as a ``multiprocessing.Queue`` can only be shared by
inheritance. So, as accelerate does, the workers are copies of the caller
made by ``fork``: at the call, the caller forks one *fork server* holding the
function and its arguments, and the agent asks it for one fork per worker and
round (see ``accel._forkserver``). Everything else, supervision included,
stays in Rust. The price is accelerate's: nothing may have initialised CUDA
in the caller before the call, which is checked.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _forkserver

# What a launch needs, imported with this module as accelerate's import
# does: a notebook's import cell pays for torch (and accelerate's CUDA
# checks) once, and the launcher call itself starts at once. Without
# torch the import still works; the call then says what to install.
try:
    import torch as _TORCH
except ImportError:
    _TORCH = None
try:
    from accelerate.utils import check_cuda_p2p_ib_support as _CHECK_P2P_IB
except ImportError:
    _CHECK_P2P_IB = None

__all__ = ["notebook_launcher", "debug_launcher"]

_PRECISIONS = ("no", "fp8", "fp16", "bf16")

# What differs between accelerate releases for these launchers: the field
# of `Behaviour` in accelerate-cli/src/release.rs that concerns them, as the
# first (major, minor) release with the newer behaviour, and the table's
# range. A test there checks these numbers against the table.
_OLDEST_SUPPORTED = (1, 10)
_NEWEST_KNOWN = (1, 16)
# notebook_launcher passes the precision as ACCELERATE_MIXED_PRECISION
# (before: MIXED_PRECISION).
_ACCELERATE_MIXED_PRECISION_SINCE = (1, 16)


def _accelerate_release() -> Tuple[int, int]:
    """The installed accelerate's (major, minor), as the behaviour table reads
    it: the newest known when none is installed; a newer or older one than
    the table knows warns once and behaves as the nearest known release."""
    try:
        from importlib.metadata import version

        text = version("accelerate")
    except Exception:  # noqa: BLE001 - not installed: the newest behaviour
        return _NEWEST_KNOWN
    major, _, rest = text.partition(".")
    minor = ""
    for c in rest:
        if not c.isdigit():
            break
        minor += c
    if not major.isdigit() or not minor:
        return _NEWEST_KNOWN
    found = (int(major), int(minor))
    if found > _NEWEST_KNOWN:
        _warn_once(
            f"accelerate {text} is newer than the releases accel knows (1.10 to 1.16); "
            "accel behaves as accelerate 1.16"
        )
        return _NEWEST_KNOWN
    if found < _OLDEST_SUPPORTED:
        _warn_once(
            f"accelerate {text} is older than the oldest release accel supports (1.10); "
            "accel behaves as accelerate 1.10"
        )
        return _OLDEST_SUPPORTED
    return found


_WARNED: set = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, stacklevel=3)
# How long an interrupted launch waits for the agent to stop the workers
# before it kills them.
_INTERRUPT_GRACE = 30.0


def notebook_launcher(
    function: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    num_processes: Optional[int] = None,
    mixed_precision: str = "no",
    use_port: Union[str, int] = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: Optional[Dict[str, Any]] = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: Optional[str] = None,
) -> None:
    """Runs ``function(*args)`` in ``num_processes`` processes on this node.

    Arguments and defaults are accelerate's. With more than one process the
    processes are started and supervised by ``accel-agent``: they see the
    environment torchrun gives (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ...) plus what accelerate's launcher sets (``NPROC``,
    ``NODE_RANK``, ``MIXED_PRECISION``), so ``Accelerator()`` inside the
    function builds the same state. Their output streams here, each line
    prefixed with its rank. With one process (or in Colab without two GPUs)
    the function runs in this process, as accelerate does.

    Raises:
        ValueError: a bad argument, or an ``Accelerator`` created before the call.
        RuntimeError: CUDA (or a library that initialises it on import, such as
            bitsandbytes) was initialised before the call, or the agent failed
            for a reason other than a worker (a rendezvous timeout, say).
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: the
            job failed after its restarts; the message is the root cause
            (rank, exit code, the worker's traceback).
        KeyboardInterrupt: the call was interrupted; every process is stopped.
    """
    in_colab = False
    in_kaggle = any(key.startswith("KAGGLE") for key in os.environ)
    if not in_kaggle and "IPython" in sys.modules:
        in_colab = "google.colab" in str(sys.modules["IPython"].get_ipython())
    precision = _precision(mixed_precision)
    on_tpu = os.environ.get("TPU_NAME") is not None or os.environ.get("PJRT_DEVICE", "") == "TPU"
    if (in_colab or in_kaggle) and on_tpu:
        raise NotImplementedError(
            "accel does not launch on TPUs (torch_xla); use accelerate's own notebook_launcher there"
        )
    torch = _torch()
    if in_colab and (not torch.cuda.is_available() or torch.cuda.device_count() < 2):
        print("Launching training on one GPU." if torch.cuda.is_available() else "Launching training on one CPU.")
        function(*args)
        return
    if num_processes is None:
        raise ValueError(
            "You have to specify the number of devices you would like to use, add `num_processes=...` to your call."
        )
    _positive("num_processes", num_processes)
    _positive("num_nodes", num_nodes)
    if node_rank >= num_nodes:
        raise ValueError("The node_rank must be less than the number of nodes.")
    if num_processes == 1:
        _single(torch)
        function(*args)
        return
    _refuse_initialised(torch)
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, not {max_restarts}")
    if monitor_interval <= 0:
        raise ValueError(f"monitor_interval must be greater than 0, not {monitor_interval}")
    env = {
        "NPROC": str(num_processes),
        "NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(num_nodes * num_processes),
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(use_port),
        "ACCELERATE_MIXED_PRECISION": precision,
    }
    if _accelerate_release() < _ACCELERATE_MIXED_PRECISION_SINCE:
        # Before 1.16 accelerate sets only MIXED_PRECISION, which
        # Accelerator() does not read, so its argument has no effect; accel
        # also sets the variable Accelerator() reads (a documented deviation).
        env["MIXED_PRECISION"] = precision
    if not _p2p_ib_supported():
        env["NCCL_P2P_DISABLE"] = "1"
        env["NCCL_IB_DISABLE"] = "1"
    flags = [
        # torch's elastic_launch (accelerate's launcher) names the role so:
        # ROLE_NAME and the output prefixes ("[default_role0]:") match.
        "--role",
        "default_role",
        "--nproc-per-node",
        str(num_processes),
        "--nnodes",
        str(num_nodes),
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        repr(float(monitor_interval)),
        "--rdzv-backend",
        rdzv_backend,
        "--rdzv-id",
        str(rdzv_id),
    ]
    conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        # accelerate overwrites torch's static `rank` key with node_rank; the
        # agent takes it as --node-rank.
        conf.pop("rank", None)
        flags += ["--node-rank", str(node_rank)]
        if rdzv_endpoint:
            flags += ["--rdzv-endpoint", rdzv_endpoint]
        else:
            flags += ["--master-addr", str(master_addr), "--master-port", str(use_port)]
    elif rdzv_endpoint:
        flags += ["--rdzv-endpoint", rdzv_endpoint]
    if conf:
        flags += ["--rdzv-conf", ",".join(f"{k}={_conf_value(v)}" for k, v in conf.items())]
    if log_line_prefix_template is not None:
        flags += ["--log-line-prefix-template", log_line_prefix_template]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with _patched(env):
        if os.environ.get("ACCELERATE_DEBUG_MODE", "false").lower() == "true":
            try:
                _launch(_test_launch, (), flags, title="test_launch")
            except Exception as e:  # noqa: BLE001 - re-raised with accelerate's words
                raise RuntimeError(
                    "An issue was found when verifying a stable environment for the notebook launcher. "
                    f"The following error was raised: {e}"
                ) from e
        print(f"Launching training on {num_processes} {device.upper()}s.")
        _launch(function, args, flags, title=_name(function))


def debug_launcher(function: Callable[..., Any], args: Tuple[Any, ...] = (), num_processes: int = 2) -> None:
    """Runs ``function(*args)`` in ``num_processes`` processes on the CPU, for debugging.

    As accelerate's: no GPU is visible (``CUDA_VISIBLE_DEVICES`` is empty),
    ``ACCELERATE_USE_CPU=yes``, no mixed precision, gloo on loopback; the
    processes are accel-agent's, on a free local port.
    """
    _positive("num_processes", num_processes)
    torch = _torch()
    _refuse_initialised(torch)
    env = {
        "ACCELERATE_MIXED_PRECISION": "no",
        "ACCELERATE_USE_CPU": "yes",
        "CUDA_VISIBLE_DEVICES": "",
        # accelerate 1.14's fix for gloo's flaky host-name interface choice,
        # kept for every release (1.10-1.13 leave gloo to choose).
        "GLOO_SOCKET_IFNAME": "lo",
    }
    flags = ["--standalone", "--nproc-per-node", str(num_processes)]
    with _patched(env):
        _launch(function, args, flags, title=_name(function), debug=True)


# ---------------------------------------------------------------------------


def _test_launch() -> None:
    from accelerate import PartialState

    PartialState()


def _precision(mixed_precision: str) -> str:
    value = str(mixed_precision).lower()
    if value not in _PRECISIONS:
        raise ValueError(f"Unknown mixed_precision mode: {value}. Choose between {list(_PRECISIONS)}.")
    return value


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")


def _torch():
    if _TORCH is None:
        raise RuntimeError("accel's launchers need PyTorch in this environment: pip install torch")
    return _TORCH


def _single(torch) -> None:
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
        print("Launching training on MPS.")
    elif torch.cuda.is_available():
        print("Launching training on one GPU.")
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        print("Launching training on one XPU.")
    else:
        print("Launching training on CPU.")


def _refuse_initialised(torch) -> None:
    """accelerate's guards, for a launch whose workers are forks of this process."""
    state = sys.modules.get("accelerate.state")
    if state is not None and len(state.AcceleratorState._shared_state) > 0:
        raise ValueError(
            "To launch a multi-device training from your notebook, the `Accelerator` should only be initialized "
            "inside your training function. Restart your notebook and make sure no cells initializes an "
            "`Accelerator`."
        )
    if "bitsandbytes" in sys.modules:
        raise RuntimeError(
            "Could not start distributed process. Libraries known to initialize device upon import have been "
            "imported already. Please keep these imports inside your training function to try and help with this:"
            "\n\t* `bitsandbytes`"
        )
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA has been initialized before the `notebook_launcher` could create a forked subprocess. "
            "The processes are forks of this one and cannot use CUDA then. Restart the notebook and make sure "
            "no cell uses CUDA (moves a tensor or model to the GPU, calls torch.cuda) before the launch."
        )


def _p2p_ib_supported() -> bool:
    if _CHECK_P2P_IB is None:
        return True
    return bool(_CHECK_P2P_IB())


def _conf_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or "function"


class _patched:
    """Sets variables in os.environ for the launch, then restores them."""

    def __init__(self, env: Dict[str, str]) -> None:
        self.env = env
        self.saved: Dict[str, Optional[str]] = {}

    def __enter__(self) -> "_patched":
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _agent() -> str:
    """The accel-agent to run: ``ACCEL_AGENT``, else this environment's, else PATH's."""
    given = os.environ.get("ACCEL_AGENT")
    if given:
        return given
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(d, "accel-agent")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("accel-agent")
    if found:
        return found
    raise RuntimeError(
        "accel-agent is not installed in this environment: run `pip install .` in a checkout of accel "
        "(it builds the wheel accel-launch), or set ACCEL_AGENT to an accel-agent binary"
    )


def _prepared(function: Callable[..., Any], args: Sequence[Any], debug: bool) -> None:
    """What each worker runs."""
    if debug:
        # accelerate's debug launch marks its workers so.
        os.environ["FORK_LAUNCHED"] = "1"
    function(*args)


def _launch(function: Callable[..., Any], args: Sequence[Any], flags: List[str], title: str, debug: bool = False) -> None:
    """Forks the fork server, runs the agent on it, streams, and raises what the job ended with."""
    agent = _agent()
    target = functools.partial(_prepared, function, tuple(args), debug)
    with tempfile.TemporaryDirectory(prefix="accel-launch-") as tmp:
        error_file = os.path.join(tmp, "error.json")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError):
                pass
        parent = os.getpid()
        _forkserver.prepare()
        # No interrupt may land between the fork and the child's own
        # handling of it (the kernel's handler would run in the child).
        main = threading.current_thread() is threading.main_thread()
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            server = os.fork()
            if server == 0:
                try:
                    ours.close()
                finally:
                    _forkserver.serve(theirs, target, parent)
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        theirs.close()
        env = dict(os.environ)
        env["TORCHELASTIC_ERROR_FILE"] = error_file
        argv = [agent, *flags, "--tee", "3", "--fork-server-fd", str(ours.fileno()), title]
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(ours.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            _end_server(server)
            raise
        said: "collections.deque[str]" = collections.deque(maxlen=20)
        try:
            ours.close()
            pumps = [
                threading.Thread(target=_pump, args=(proc.stdout, "stdout", None), daemon=True),
                threading.Thread(target=_pump, args=(proc.stderr, "stderr", said), daemon=True),
            ]
            for p in pumps:
                p.start()
            code = _wait(proc)
            for p in pumps:
                p.join(timeout=5)
        except BaseException:
            # An interrupt outside the wait (or anything else): nothing may
            # outlive the call. The wait itself stops the job gracefully.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        finally:
            _end_server(server)
        if code == 0:
            return
        failure = _failure(title, error_file)
        if failure is not None:
            raise failure
        # The agent's error line (a usage error ends with a hint line after it).
        errors = [line for line in said if "error" in line.lower()] or list(said)
        last = f": {errors[-1].strip()}" if errors else ""
        raise RuntimeError(f"accel-agent exited with code {code} before any worker failed{last}")


def _pump(pipe, name: str, last: "Optional[collections.deque[str]]") -> None:
    """Copies the agent's output into this process's stream (a notebook's
    cell); `last` keeps the agent's own last line (not a worker's)."""
    for raw in iter(pipe.readline, b""):
        stream = getattr(sys, name)
        line = raw.decode("utf-8", "replace")
        if last is not None and not line.startswith("["):
            last.append(line[:2000])
        try:
            stream.write(line)
            stream.flush()
        except (ValueError, OSError):
            pass
    pipe.close()


def _wait(proc: "subprocess.Popen[bytes]") -> int:
    """Waits for the agent. An interrupt stops the job: SIGINT to the agent
    (which stops the workers and exits), SIGKILL if it has not after
    ``_INTERRUPT_GRACE`` or at a second interrupt; then it propagates."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=_INTERRUPT_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
        raise


def _end_server(pid: int) -> None:
    """Reaps the fork server: it exits when the agent's end of its socket closes."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)


def _failure(title: str, error_file: str) -> Optional[BaseException]:
    """torch's ChildFailedError from what the agent wrote, if a worker failed."""
    try:
        with open(error_file) as fp:
            data = json.load(fp)
        found = data["accel"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures: Dict[int, ProcessFailure] = {}
    for i, f in enumerate([found["root"], *found.get("others", [])]):
        rank = int(f["rank"])
        if rank in failures:
            continue
        path = f.get("error_file", "")
        if not path or not os.path.isfile(path):
            # Another host's worker, or a copy gone: the message as reported.
            path = os.path.join(os.path.dirname(error_file), f"failure-{i}.json")
            with open(path, "w") as fp:
                json.dump(_error_data(f), fp)
        failure = ProcessFailure(
            local_rank=int(f["local_rank"]), pid=int(f["pid"]), exitcode=int(f["exitcode"]), error_file=path
        )
        failure.timestamp = int(f.get("timestamp") or failure.timestamp)
        failures[rank] = failure
    return ChildFailedError(name=title, failures=failures)


def _error_data(f: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "message": {
            "message": f.get("message", ""),
            "extraInfo": {"py_callstack": f.get("traceback") or f.get("message", ""), "timestamp": str(f.get("timestamp", 0))},
        }
    }
