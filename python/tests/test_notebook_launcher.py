"""accel's notebook_launcher and debug_launcher in a real Jupyter kernel.

Run by scripts/check-wheel.sh from a fresh venv with the wheel installed:
the kernel is that venv's Python, so `accel` and `accel-agent` are the
installed ones. Each notebook is executed by nbclient in an ipykernel kernel,
as a user's notebook would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

# What each process records of its Accelerator().
STATE_CELL = textwrap.dedent(
    """
    def train(outdir):
        import json, os
        import torch.distributed as dist
        from accelerate import Accelerator
        acc = Accelerator()
        s = acc.state
        keys = ["distributed_type", "num_processes", "process_index", "local_process_index", "device",
                "mixed_precision", "backend", "use_distributed", "is_main_process", "is_local_main_process",
                "fork_launched"]
        state = {k: str(getattr(s, k, None)) for k in keys}
        state["dist"] = [dist.get_rank(), dist.get_world_size()] if dist.is_initialized() else None
        env = {k: os.environ.get(k) for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "NPROC", "NODE_RANK", "MIXED_PRECISION",
               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
               "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]}
        rank = os.environ["RANK"]
        with open(f"{outdir}/{rank}.json", "w") as f:
            json.dump({"state": state, "env": env}, f)
        print(f"train ran in rank {rank} of {os.environ['WORLD_SIZE']}")
    """
)


def notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in cells]
    return nb


def run(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 240) -> nbformat.NotebookNode:
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def states(d: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}


def test_a_cell_s_function_runs_in_two_processes_with_accelerate_s_state(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "accel", tmp_path / "accelerate"
    ours.mkdir()
    theirs.mkdir()
    nb = run(
        notebook(
            STATE_CELL,
            f"import accel\naccel.notebook_launcher(train, args=({str(ours)!r},), num_processes=2)",
        ),
        tmp_path,
    )
    out = text(nb.cells[1])
    assert "Launching training on 2 CPUs." in out, out
    for rank in (0, 1):
        assert f"[default_role{rank}]:train ran in rank {rank} of 2" in out, out
    # The same notebook under accelerate's own launcher, in a new kernel.
    run(
        notebook(
            STATE_CELL,
            f"import accelerate\naccelerate.notebook_launcher(train, args=({str(theirs)!r},), num_processes=2)",
        ),
        tmp_path,
    )
    a, b = states(ours), states(theirs)
    assert sorted(a) == ["0", "1"] and sorted(b) == ["0", "1"], (a, b)
    for rank in a:
        assert a[rank]["state"] == b[rank]["state"], (rank, a[rank]["state"], b[rank]["state"])
        assert a[rank]["env"] == b[rank]["env"], (rank, a[rank]["env"], b[rank]["env"])


@pytest.mark.parametrize("launch", ["notebook_launcher(first_returns, args=(outdir,), num_processes=2)",
                                    "debug_launcher(first_returns, args=(outdir,), num_processes=2)"])
def test_a_process_whose_function_returned_lives_until_every_process_has_returned(tmp_path: Path, launch: str) -> None:
    # Rank 0 returns at once; rank 1 looks at it a second later. Had rank 0
    # ended, its sockets would be closed (a peer still setting up gloo's
    # connections to it fails with "Connection closed by peer").
    nb = run(
        notebook(
            f"""
            import os, time
            outdir = {str(tmp_path)!r}
            def first_returns(outdir):
                if os.environ["RANK"] == "0":
                    with open(f"{{outdir}}/0.tmp", "w") as f:
                        f.write(str(os.getpid()))
                    os.rename(f"{{outdir}}/0.tmp", f"{{outdir}}/0.pid")
                    return
                while not os.path.exists(f"{{outdir}}/0.pid"):
                    time.sleep(0.01)
                time.sleep(1)
                pid = open(f"{{outdir}}/0.pid").read()
                with open(f"/proc/{{pid}}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                print("rank 0 is in state", state, "after it returned")
            """,
            f"from accel import notebook_launcher, debug_launcher\n{launch}",
        ),
        tmp_path,
    )
    out = text(nb.cells[1])
    assert "rank 0 is in state S after it returned" in out, out


def test_a_function_that_fails_once_succeeds_on_its_restart(tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    nb = run(
        notebook(
            f"""
            import os
            def flaky():
                if os.environ["RANK"] == "1" and not os.path.exists({str(marker)!r}):
                    open({str(marker)!r}, "w").close()
                    raise RuntimeError("first attempt fails")
                print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "ok in rank", os.environ["RANK"])
            """,
            "from accel import notebook_launcher\nnotebook_launcher(flaky, num_processes=2, max_restarts=1)",
        ),
        tmp_path,
    )
    out = text(nb.cells[1])
    assert "[default_role0]:attempt 1 ok in rank 0" in out, out
    assert "[default_role1]:attempt 1 ok in rank 1" in out, out
    assert "RuntimeError: first attempt fails" in out, out


def test_a_function_that_always_fails_raises_child_failed_error_with_the_root_cause(tmp_path: Path) -> None:
    nb = notebook(
        """
        import os
        def broken(x):
            if os.environ["RANK"] == "1":
                raise ValueError(f"bad value {x}")
            import time; time.sleep(60)
        """,
        """
        from accel import notebook_launcher
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        try:
            notebook_launcher(broken, args=(42,), num_processes=2, max_restarts=1)
        except ChildFailedError as e:
            caught = e
        print("CAUGHT", type(caught).__name__, sorted(caught.failures))
        rank, root = caught.get_first_failure()
        print("ROOT", rank, root.local_rank, root.exitcode)
        print(str(caught))
        """,
        "notebook_launcher(broken, args=(7,), num_processes=2)",
    )
    with pytest.raises(CellExecutionError) as raised:
        run(nb, tmp_path)
    out = text(nb.cells[1])
    assert "CAUGHT ChildFailedError" in out, out
    assert "ROOT 1 1 1" in out, out
    assert "ValueError: bad value 42" in out, out
    assert "broken FAILED" in out, out
    # Uncaught, it ends the cell with that exception and its root cause.
    err = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert err and err[0].ename == "ChildFailedError", nb.cells[2].outputs
    assert "ValueError: bad value 7" in err[0].evalue, err[0].evalue
    assert "ChildFailedError" in str(raised.value)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended; only its parent has not reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def kernel(cwd: Path) -> Iterator[Tuple[KernelManager, Any]]:
    """A kernel of its own (to interrupt or kill) and its client."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(cwd))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def launch_sleepers(km: KernelManager, kc: Any, d: Path) -> Tuple[str, List[int], List[int]]:
    """Runs a cell launching two workers that sleep; once both run: the
    cell's message id, the workers' pids, and the kernel's children."""
    msg_id = kc.execute(
        textwrap.dedent(
            f"""
            import os, time
            from accel import notebook_launcher
            def sleeper():
                # Written whole, then renamed: a reader never sees it empty.
                tmp = os.path.join({str(d)!r}, "tmp-" + os.environ["RANK"])
                with open(tmp, "w") as f:
                    f.write(str(os.getpid()))
                os.replace(tmp, os.path.join({str(d)!r}, "pid-" + os.environ["RANK"]))
                time.sleep(600)
            notebook_launcher(sleeper, num_processes=2)
            """
        )
    )
    deadline = time.monotonic() + 120
    while len(list(d.glob("pid-*"))) < 2:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    workers = [int(p.read_text()) for p in d.glob("pid-*")]
    k = km.provisioner.process.pid
    children = [int(c) for c in Path(f"/proc/{k}/task/{k}/children").read_text().split()]
    return msg_id, workers, children


def test_interrupting_the_kernel_stops_every_process_promptly(tmp_path: Path) -> None:
    with kernel(tmp_path) as (km, kc):
        try:
            msg_id, workers, children = launch_sleepers(km, kc, tmp_path)
            started = time.monotonic()
            km.interrupt_kernel()
            reply = kc.get_shell_msg(timeout=60)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = kc.get_shell_msg(timeout=60)
            took = time.monotonic() - started
            assert reply["content"]["status"] == "error", reply["content"]
            assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
            assert took < 15, f"the interrupted cell took {took:.1f} s to return"
            left = [p for p in workers + children if alive(p)]
            assert not left, f"processes left behind: {left}"
            # The kernel lives on and can launch again.
            msg_id = kc.execute("print('still here')")
            while True:
                m = kc.get_iopub_msg(timeout=30)
                if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                    assert "still here" in m["content"]["text"]
                    break
        except queue.Empty:
            pytest.fail("the kernel did not answer")


def test_debug_launcher_runs_on_cpu_with_no_gpu_visible(tmp_path: Path) -> None:
    nb = run(
        notebook(
            """
            def check():
                import os, torch
                from accelerate import Accelerator
                acc = Accelerator()
                assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
                assert torch.cuda.device_count() == 0
                assert acc.device.type == "cpu"
                print("debug", acc.state.distributed_type, acc.process_index, acc.num_processes, acc.state.backend)
                acc.wait_for_everyone()
            """,
            "from accel import debug_launcher\ndebug_launcher(check, num_processes=2)",
        ),
        tmp_path,
    )
    out = text(nb.cells[1])
    for rank in (0, 1):
        assert f"debug DistributedType.MULTI_CPU {rank} 2 gloo" in out, out


def test_killing_the_kernel_leaves_no_process_behind(tmp_path: Path) -> None:
    with kernel(tmp_path) as (km, kc):
        _, workers, children = launch_sleepers(km, kc, tmp_path)
        assert len(children) == 2, children  # the agent and the fork server
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in workers + children):
            assert time.monotonic() < deadline, [p for p in workers + children if alive(p)]
            time.sleep(0.1)


NODE = textwrap.dedent(
    """
    import json, os, sys
    from accel import notebook_launcher
    def where(out):
        with open(os.path.join(out, os.environ["RANK"]), "w") as f:
            json.dump({k: os.environ[k] for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"]}, f)
    node, endpoint, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    notebook_launcher(where, args=(out,), num_processes=2, num_nodes=2, node_rank=node,
                      rdzv_backend="c10d", rdzv_endpoint=endpoint, rdzv_id="two-nodes")
    """
)


def test_two_nodes_join_one_c10d_job(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["rdzv-server", "--bind", f"127.0.0.1:{port}", "--metrics-bind", "off"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        nodes = [
            subprocess.Popen(
                [sys.executable, "-c", NODE, str(i), f"127.0.0.1:{port}", str(tmp_path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in (0, 1)
        ]
        outs = [n.communicate(timeout=120)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], outs
    finally:
        server.kill()
        server.wait()
    seen = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir() if p.name.isdigit()}
    assert sorted(seen) == ["0", "1", "2", "3"], seen
    assert {v["WORLD_SIZE"] for v in seen.values()} == {"4"}, seen
    assert sorted(v["GROUP_RANK"] for v in seen.values()) == ["0", "0", "1", "1"], seen
