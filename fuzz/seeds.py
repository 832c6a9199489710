#!/usr/bin/env python3
"""Writes the seed corpora of the binary-input fuzz targets (store_wire,
rdzv_job) into fuzz/corpus/<target>/: small, real sessions in each target's
input format (documented at the top of fuzz_targets/<target>.rs).

The text targets' seeds (agent_flags, accel_config) are plain files written
by hand. Run from anywhere: python3 fuzz/seeds.py
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# --- store_wire: PyTorch TCPStore client frames --------------------------------

MAGIC = 0x3C85F7CE


def b(data):
    """A length-prefixed string or value."""
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<Q", len(data)) + data


def keys(ks):
    return struct.pack("<Q", len(ks)) + b"".join(b(k) for k in ks)


def validate():
    return bytes([0]) + struct.pack("<I", MAGIC)


def set_(k, v):
    return bytes([1]) + b(k) + b(v)


def cas(k, expected, desired):
    return bytes([2]) + b(k) + b(expected) + b(desired)


def get(k):
    return bytes([3]) + b(k)


def add(k, n):
    return bytes([4]) + b(k) + struct.pack("<q", n)


def check(ks):
    return bytes([5]) + keys(ks)


def wait(ks):
    return bytes([6]) + keys(ks)


def num_keys():
    return bytes([7])


def delete(k):
    return bytes([8]) + b(k)


def append(k, v):
    return bytes([9]) + b(k) + b(v)


def multi_get(ks):
    return bytes([10]) + keys(ks)


def multi_set(pairs):
    return bytes([11]) + struct.pack("<q", len(pairs)) + b"".join(b(k) + b(v) for k, v in pairs)


def cancel_wait():
    return bytes([12])


def ping(n):
    return bytes([13]) + struct.pack("<I", n)


def queue_push(k, v):
    return bytes([14]) + b(k) + b(v)


def queue_pop(k):
    return bytes([15]) + b(k)


def queue_len(k):
    return bytes([16]) + b(k)


def list_keys():
    return bytes([17])


def barrier(k, world_size):
    return bytes([18]) + b(k) + struct.pack("<q", world_size)


def feed(conn, data, chunk=255):
    """Records that deliver `data` on connection `conn` in `chunk`-byte pieces."""
    out = b""
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        out += bytes([conn, len(piece)]) + piece
    return out


def deliver(conn):
    return bytes([0b1000 | conn])


def reconnect(conn):
    return bytes([0b1100 | conn])


def store_seeds():
    hello = validate() + ping(0x1234)
    basic = (
        hello
        + set_("/a", "x")
        + get("/a")
        + add("/n", 5)
        + add("/n", -7)
        + check(["/a", "/b"])
        + num_keys()
        + delete("/a")
        + list_keys()
    )
    yield "basic", feed(0, basic)
    yield "basic-bytewise", feed(0, basic, chunk=1)
    yield "basic-odd-cuts", feed(0, basic, chunk=7)
    yield "rare-commands", feed(
        0,
        hello
        + cas("/c", "", "v1")
        + cas("/c", "v1", "v2")
        + cas("/c", "v1", "v3")
        + append("/s", "ab")
        + append("/s", "cd")
        + multi_set([("/m1", "1"), ("/m2", "2")])
        + multi_get(["/m1", "/m2", "/none"])
        + queue_push("/q", "job1")
        + queue_push("/q", "job2")
        + queue_len("/q")
        + queue_pop("/q")
        + queue_pop("/q")
        + queue_pop("/q"),
    )
    # Rank 0 waits for a key rank 1 writes: the c10d init handshake.
    yield "wait-wake", (
        feed(0, hello + wait(["/rank1"]) + get("/rank1"))
        + feed(1, hello + set_("/rank1", "ready"))
        + deliver(0)
    )
    # Three ranks at a barrier, released by the last.
    yield "barrier", (
        feed(0, hello + barrier("/bar", 3) + num_keys())
        + feed(1, hello + barrier("/bar", 3))
        + feed(2, hello + barrier("/bar", 3))
        + deliver(0)
        + deliver(1)
    )
    yield "cancel-wait", (
        feed(0, hello + wait(["/x", "/y"]))
        + feed(1, hello + set_("/x", "1"))
        + feed(0, cancel_wait() + get("/x"))
        + feed(1, set_("/y", "1"))
        + deliver(0)
    )
    yield "disconnect-parked", (
        feed(0, hello + wait(["/gone"]))
        + reconnect(0)
        + feed(1, hello + set_("/gone", "v"))
        + feed(0, hello + get("/gone"))
    )
    yield "queue-wait", (
        feed(0, hello + wait(["/q"]))
        + feed(1, hello + wait(["/q"]))
        + feed(2, hello + queue_push("/q", "a"))
        + deliver(0)
        + feed(0, queue_pop("/q"))
        + feed(2, set_("/q", "b"))
        + deliver(1)
    )
    # What torch.distributed's TCPStore client sends at init_process_group.
    yield "torch-init", (
        feed(0, hello + add("/default_pg/0//init/", 1) + set_("rank_0", "tcp://127.0.0.1:29500"))
        + feed(1, hello + add("/default_pg/0//init/", 1) + wait(["rank_0"]) + get("rank_0"))
        + deliver(1)
    )
    yield "bad-magic", feed(0, bytes([0]) + struct.pack("<I", 0xDEADBEEF) + num_keys())
    yield "no-handshake", feed(0, num_keys())
    yield "huge-key", feed(0, hello + bytes([3]) + struct.pack("<Q", 1 << 40))
    yield "negative-count", feed(0, hello + bytes([11]) + struct.pack("<q", -1))
    yield "not-a-number", feed(0, hello + set_("/s", "abc") + add("/s", 1))
    yield "overflow", feed(0, hello + set_("/o", str(2**63 - 1)) + add("/o", 1))


# --- rdzv_job: sequences of rendezvous requests ------------------------------

JOIN, READY, KEEP_ALIVE, FAILURE, SUCCESS, LEAVE, TICK, CLOCK, CLOSE, RESTART, QUARANTINE, BENCH = range(12)
SAME, RANK, RESUME = 1, 2, 4


def u32(v):
    return bytes([v]) if v < 0xF0 else bytes([0xF0]) + struct.pack("<I", v)


def u64(v):
    return bytes([v]) if v < 0xF0 else bytes([0xF0]) + struct.pack("<Q", v)


def join(node, host, cfg=None, rank=None, resume=None):
    """cfg: (min, max, nproc, max_restarts, dead_after_ms, last_call_ms); None: the job's."""
    flags = (SAME if cfg is None else 0) | (RANK if rank is not None else 0) | (RESUME if resume else 0)
    out = bytes([JOIN, node, host, flags])
    if cfg is not None:
        mn, mx, nproc, restarts, dead, last = cfg
        out += u32(mn) + u32(mx) + u32(nproc) + u32(restarts) + u64(dead) + u64(last)
    if rank is not None:
        out += u32(rank)
    if resume:
        rnd, restarts, node_rank, nnodes = resume
        out += bytes([rnd]) + u32(restarts) + u32(node_rank) + u32(nnodes)
    return out


def ready(node, rnd=0, master=1):
    return bytes([READY, node, rnd, master])


def keep_alive(node):
    return bytes([KEEP_ALIVE, node])


def failure(node, rnd=0, detail=1):
    return bytes([FAILURE, node, rnd, detail])


def success(node, rnd=0):
    return bytes([SUCCESS, node, rnd])


def leave(node):
    return bytes([LEAVE, node])


def tick():
    return bytes([TICK])


def clock(ms):
    return bytes([CLOCK]) + u32(ms)


def close(may_rejoin=1):
    return bytes([CLOSE, may_rejoin])


def restart_server():
    return bytes([RESTART])


def quarantine(after, window_ms, hold_ms):
    """The server's quarantine flags (after 0: off)."""
    return bytes([QUARANTINE, after]) + u32(window_ms) + u32(hold_ms)


def bench(host, ms):
    """Benches a host for ms milliseconds; 0 releases it."""
    return bytes([BENCH, host]) + u32(ms)


def rdzv_seeds():
    two = (2, 2, 4, 3, 3000, 0)
    # Round numbers below are relative: 0 is the job's current round.
    formed = join(0, 0, two) + join(1, 1) + ready(0) + ready(1)
    yield "two-nodes-succeed", formed + success(0) + success(1)
    yield "failure-restarts", formed + failure(1) + ready(0) + ready(1) + failure(0) + ready(0) + ready(1) + success(0) + success(1)
    yield "budget-spent", join(0, 0, (1, 1, 1, 0, 0, 0)) + ready(0) + failure(0)
    # Detail byte bit 1: the node's workers were fenced, not failed (no budget is spent).
    no_budget = (2, 2, 1, 0, 3000, 0)
    yield "fenced-re-forms", (
        join(0, 0, no_budget) + join(1, 1) + ready(0) + ready(1) + failure(1, detail=2) + failure(0, 2, detail=2)
        + ready(0) + ready(1) + failure(0, detail=1)
    )
    yield "leave-restarts", formed + leave(1) + join(2, 2) + ready(0) + ready(2) + tick()
    yield "lost-node", formed + clock(200) + keep_alive(0) + clock(200) + tick() + clock(0xF0_0000) + tick()
    elastic = (2, 4, 1, 1, 0, 200)
    yield "elastic-last-call", (
        join(0, 1, elastic) + join(1, 0) + join(2, 2) + ready(0) + ready(1) + tick() + clock(250) + tick()
        + join(3, 3) + ready(0) + ready(1) + ready(2) + ready(3)
    )
    yield "spare", join(0, 0, (1, 1, 1, 0, 0, 0)) + join(1, 1) + ready(0) + ready(1) + leave(0) + ready(1) + tick()
    static = (3, 3, 2, 0, 0, 0)
    yield "static-ranks", (
        join(0, 2, static, rank=2) + join(1, 1, rank=0) + join(2, 0, rank=1) + join(3, 0, rank=1)
        + ready(2) + ready(1) + ready(0)
    )
    yield "server-restart-resume", (
        formed + restart_server()
        + join(1, 1, two, resume=(0, 0, 1, 2)) + join(0, 0, resume=(0, 0, 0, 2)) + success(0) + success(1)
    )
    yield "resume-after-restart", formed + failure(0) + join(0, 0, resume=(2, 1, 0, 2)) + ready(0) + ready(1)
    yield "close", formed + close(1) + join(0, 0)
    yield "mismatch", join(0, 0, two) + join(1, 1, (1, 2, 4, 3, 0, 0)) + join(2, 1, (2, 2, 8, 3, 0, 0))
    # Quarantine: after 2 failures within 60 s a host is benched for 0.2 s.
    q = quarantine(2, 60_000, 200)
    three = (2, 3, 1, 5, 3000, 0)
    trio = q + join(0, 0, three) + join(1, 1) + join(2, 2) + ready(0) + ready(1) + ready(2)
    yield "quarantine-benches-and-expires", (
        trio + failure(2) + ready(0) + ready(1) + ready(2) + failure(2) + ready(0) + ready(1) + ready(2)
        + clock(100) + keep_alive(0) + keep_alive(1) + keep_alive(2) + clock(100) + tick()
        + ready(0) + ready(1) + ready(2)
    )
    yield "quarantine-release-and-bench", (
        trio + failure(2) + ready(0) + ready(1) + ready(2) + failure(2) + ready(0) + ready(1) + ready(2)
        + bench(2, 0) + ready(0) + ready(1) + ready(2) + bench(1, 5000) + failure(0) + ready(0) + ready(1)
        + ready(2)
    )
    yield "quarantine-no-room", (
        quarantine(1, 60_000, 300) + join(0, 0, two) + join(1, 1) + ready(0) + ready(1) + failure(1)
        + ready(0) + ready(1) + clock(300) + keep_alive(0) + keep_alive(1) + tick()
    )
    yield "finished-job-ttl", formed + success(0) + success(1) + leave(0) + leave(1) + clock(0xEF) + tick() + join(0, 0, two)


def main():
    for target, seeds in [("store_wire", store_seeds()), ("rdzv_job", rdzv_seeds())]:
        d = os.path.join(HERE, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds:
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
