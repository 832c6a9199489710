"""What a launched worker's /proc/PID/environ shows: never the caller's
rendezvous token, although the worker is a fork of the caller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

TOKEN = "s3cret-token-of-the-caller"

# Each worker reports what the processes of its user can read: its own
# /proc/PID/environ and its parent's (the fork server, also a fork of the
# caller), and what os.environ says.
LAUNCH = textwrap.dedent(
    f"""
    import json, os, sys
    import multiprocessing as mp
    from accel import notebook_launcher

    def look(q):
        own = open("/proc/self/environ", "rb").read()
        parent = open(f"/proc/{{os.getppid()}}/environ", "rb").read()
        q.put({{
            "rank": os.environ["RANK"],
            "own": {TOKEN!r}.encode() in own,
            "parent": {TOKEN!r}.encode() in parent,
            "own_names": sorted(e.split(b"=", 1)[0].decode() for e in own.split(b"\\0") if b"=" in e),
            "os_environ": "ACCEL_RDZV_TOKEN" in os.environ or "RDZV_TOKEN" in os.environ,
        }})

    q = mp.get_context("fork").Queue()
    notebook_launcher(look, args=(q,), num_processes=2)
    print(json.dumps(sorted((q.get(timeout=30) for _ in range(2)), key=lambda r: r["rank"])))
    """
)


def test_a_forked_worker_s_proc_environ_does_not_show_the_caller_s_token() -> None:
    env = dict(os.environ, ACCEL_RDZV_TOKEN=TOKEN, RDZV_TOKEN=TOKEN, ACCEL_TEST_KEPT="kept")
    done = subprocess.run([sys.executable, "-c", LAUNCH], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in reports] == ["0", "1"], reports
    for r in reports:
        assert not r["own"], f"rank {r['rank']}'s own environ holds the token"
        assert not r["parent"], f"the fork server's environ (rank {r['rank']}'s parent) holds the token"
        assert not r["os_environ"], r
        names = r["own_names"]
        assert "ACCEL_RDZV_TOKEN" not in names and "RDZV_TOKEN" not in names, names
        # The rest of the caller's environment is still there for tools.
        assert "ACCEL_TEST_KEPT" in names and "PATH" in names, names


def test_only_the_named_entries_of_the_block_are_blanked() -> None:
    code = textwrap.dedent(
        """
        from accel import _forkserver
        n = _forkserver._scrub_environ_block(lambda name: name in _forkserver._SECRETS)
        raw = open("/proc/self/environ", "rb").read()
        print(n, b"s3cret" in raw, b"ACCEL_RDZV_TOKEN_FILE=/kept" in raw, b"ACCEL_RDZV_TOKEN=" in raw)
        """
    )
    env = dict(os.environ, ACCEL_RDZV_TOKEN="s3cret", RDZV_TOKEN="s3cret", ACCEL_RDZV_TOKEN_FILE="/kept")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "False", "True", "False"], done.stdout
