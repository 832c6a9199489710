"""Drives PyTorch's own TCPStore client through every operation and records
each result or error, so two servers can be compared.

  store_ops.py OUT agent   client of the store at MASTER_ADDR:MASTER_PORT
                           (run as a worker of accel-agent)
  store_ops.py OUT torch   client of PyTorch's own server (libuv), started here

Values that differ by design between servers (the port) are not recorded.
"""
import datetime
import json
import os
import sys
import threading
import time

import torch.distributed as dist

out_path, against = sys.argv[1], sys.argv[2]
T = datetime.timedelta(seconds=10)
if against == "agent":
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    server = None
else:
    host = "127.0.0.1"
    server = dist.TCPStore(host, 0, is_master=True, timeout=T, wait_for_workers=False, use_libuv=True)
    port = server.port


def client():
    return dist.TCPStore(host, port, is_master=False, timeout=T, wait_for_workers=False)


s = client()
results = []


def op(name, fn):
    try:
        v = fn()
        if isinstance(v, bytes):
            v = {"bytes": v.decode("latin-1")}
        elif isinstance(v, list):
            v = [x.decode("latin-1") if isinstance(x, bytes) else x for x in v]
        results.append([name, "ok", v])
    except Exception as e:  # the error's type and message are part of the contract
        msg = str(e).split("\n")[0]
        # Strip what names this machine's run (ports, hosts) from messages.
        msg = msg.replace(str(port), "PORT")
        results.append([name, "error", type(e).__name__, msg])


op("set", lambda: s.set("a", "1"))
op("get", lambda: s.get("a"))
op("set_bytes", lambda: s.set("bin", b"\x00\xff\x10"))
op("get_bytes", lambda: s.get("bin"))
op("add_new", lambda: s.add("counter", 5))
op("add_more", lambda: s.add("counter", -2))
op("get_counter", lambda: s.get("counter"))
op("add_to_numeric_text", lambda: client().add("a", 1))
op("set_text", lambda: s.set("txt", "hello"))
op("add_to_non_number", lambda: client().add("txt", 1))
op("compare_set_match", lambda: s.compare_set("a", "1", "2"))
op("compare_set_mismatch", lambda: s.compare_set("a", "1", "3"))
op("compare_set_missing_expected", lambda: s.compare_set("nokey", "x", "y"))
op("compare_set_missing_empty", lambda: s.compare_set("newkey", "", "z"))
op("check_present", lambda: s.check(["a", "counter"]))
op("check_missing", lambda: s.check(["a", "missing"]))
op("wait_present", lambda: s.wait(["a"]))
op("wait_timeout", lambda: s.wait(["never"], datetime.timedelta(milliseconds=300)))
op("after_wait_timeout", lambda: s.get("a"))
op("get_missing_timeout", lambda: (s.set_timeout(datetime.timedelta(milliseconds=300)), s.get("nothing"))[1])
s.set_timeout(T)


# Clients made in threads stay open until the end: a SET has no reply, and
# torch 2.4's client sends nothing that waits for one when it connects, so a
# temporary client would close before the agent's store has checked who
# owns the connection, and the store refuses connections it cannot
# attribute (docs: compatibility.md, "The worker store and older torch").
kept = []


def later_set():
    time.sleep(0.3)
    c = client()
    kept.append(c)
    c.set("late", "here")


threading.Thread(target=later_set).start()
op("wait_until_set", lambda: s.wait(["late"]))
op("get_late", lambda: s.get("late"))
op("append_new", lambda: s.append("log", "ab"))
op("append_more", lambda: s.append("log", "cd"))
op("get_appended", lambda: s.get("log"))
op("multi_set", lambda: s.multi_set(["m1", "m2"], ["x", "y"]))
op("multi_get", lambda: s.multi_get(["m2", "m1", "a"]))
op("num_keys", lambda: s.num_keys())
op("delete_present", lambda: s.delete_key("m1"))
op("delete_missing", lambda: s.delete_key("m1"))
op("num_keys_after_delete", lambda: s.num_keys())
op("list_keys", lambda: sorted(s.list_keys()))
op("queue_push", lambda: s.queue_push("q", "first"))
op("queue_push2", lambda: s.queue_push("q", "second"))
op("queue_len", lambda: s.queue_len("q"))
op("queue_pop", lambda: s.queue_pop("q", block=False))
op("queue_pop2", lambda: s.queue_pop("q"))
op("queue_pop_empty", lambda: s.queue_pop("q", block=False))
op("queue_len_empty", lambda: s.queue_len("q"))
op("check_queue", lambda: s.check(["q"]))


def later_push():
    time.sleep(0.3)
    client().queue_push("q2", "pushed")


threading.Thread(target=later_push).start()
op("queue_pop_blocking", lambda: s.queue_pop("q2", block=True))


def arrive():
    client().barrier("bar", 3)


threads = [threading.Thread(target=arrive) for _ in range(2)]
for t in threads:
    t.start()
op("barrier", lambda: s.barrier("bar", 3))
for t in threads:
    t.join()
op("barrier_counter", lambda: s.get("bar"))
op("barrier_timeout", lambda: s.barrier("bar2", 2, datetime.timedelta(milliseconds=300)))
op("large_value", lambda: len(s.set("big", "v" * (4 * 1024 * 1024)) or s.get("big")))
op("final_num_keys", lambda: s.num_keys())

with open(out_path, "w") as f:
    json.dump(results, f, indent=1)
