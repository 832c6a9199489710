#!/usr/bin/env python3
"""Minimal torchft DDP training on CPU/gloo, for fault-tolerance end-to-end tests.

Written against torchft 0.2.0 (torchft.manager.Manager, torchft.ddp.DistributedDataParallel,
torchft.optim.OptimizerWrapper, torchft.process_group.ProcessGroupGloo).

Environment:
  REPLICA_GROUP_ID     replica group id (default 0)
  NUM_REPLICA_GROUPS   number of replica groups (default 2; only used for data sharding)
  RANK, WORLD_SIZE     rank / size within the replica group (set by the launcher)
  MASTER_ADDR, MASTER_PORT  the group's TCPStore (torchft's Manager connects to it as a client)
  TORCHFT_LIGHTHOUSE   http://host:port of the lighthouse (read by Manager on group rank 0)
  STEPS                committed steps to train (default 200)
  STEP_SLEEP           seconds to sleep per step (default 0.05)
  SLEEP_WHERE          "mid" (default): sleep between forward and backward, i.e. inside
                       the step after the quorum; "after": sleep after optimizer step
  RECORD               if set, append one JSON line per committed step:
                       {"group","rank","step","quorum_id","participants","time","param_sum"}
                       (param_sum: sum of all weights, equal across groups at a step)
  MIN_REPLICA_SIZE     Manager min_replica_size (default 1)
  PG_TIMEOUT_SEC       gloo PG timeout (default 5)
  MANAGER_TIMEOUT_SEC  Manager timeout (collectives, should_commit, checkpoint) (default 10)
  QUORUM_TIMEOUT_SEC   Manager quorum timeout (default 30)
  CONNECT_TIMEOUT_SEC  Manager connect timeout (default 10)
  (TORCHFT_TIMEOUT_SEC / TORCHFT_QUORUM_TIMEOUT_SEC / TORCHFT_CONNECT_TIMEOUT_SEC /
   TORCHFT_QUORUM_RETRIES / TORCHFT_MANAGER_PORT override inside Manager.)
  HOST_STORE           "1": group rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT;
                       "0": never; default: host it on RANK 0 unless the launcher does
                       (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun and accel-agent set).
  TRAIN_LOG            "1" to print torchft INFO logs (default 0)
"""

import json
import logging
import os
import sys
import time
from datetime import timedelta

import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributed import TCPStore

from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo


class FTDistributedDataParallel(DistributedDataParallel):
    """torchft's DDP with a comm hook that survives a failed allreduce.

    In torchft 0.2.0, DistributedDataParallel._comm_hook does
    `assert fut._fut` on the work's future. When the allreduce fails (a peer
    group died mid-step: gloo "Connection reset by peer") _ManagedWork.wait()
    reports the error to the manager but never builds the future chain, so
    `_fut` is None -> AssertionError; when the manager had already errored
    (e.g. PG configure failed) allreduce returns a _DummyWork whose plain
    Future has no `_fut` -> AttributeError. Either way the survivor crashes.
    Here we return a completed future instead: the manager has recorded the
    error, so should_commit() returns False and the step is retried on the
    next quorum.
    """

    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        work.wait()
        inner = getattr(work.get_future(), "_fut", None)
        if inner is not None:
            return inner
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


def main() -> int:
    group = env_int("REPLICA_GROUP_ID", 0)
    num_groups = env_int("NUM_REPLICA_GROUPS", 2)
    rank = env_int("RANK", 0)
    world_size = env_int("WORLD_SIZE", 1)
    steps = env_int("STEPS", 200)
    step_sleep = env_float("STEP_SLEEP", 0.05)
    sleep_mid = os.environ.get("SLEEP_WHERE", "mid") == "mid"
    record = os.environ.get("RECORD") or None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    logging.basicConfig(
        level=logging.INFO if os.environ.get("TRAIN_LOG") == "1" else logging.WARNING,
        format=f"%(asctime)s g{group}r{rank} %(name)s %(levelname)s %(message)s",
    )

    # torchft's Manager is a *client* of the group's TCPStore (is_master=False),
    # so somebody must host it. torchrun/accel-agent do (agent store); a bare
    # process launch must host it itself on group rank 0.
    host_store = os.environ.get("HOST_STORE")
    if host_store is None:
        host_store = (
            "1"
            if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
            else "0"
        )
    store = None
    if host_store == "1":
        store = TCPStore(
            host_name=os.environ["MASTER_ADDR"],
            port=int(os.environ["MASTER_PORT"]),
            world_size=None,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )

    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    inner_opt = optim.SGD(model.parameters(), lr=0.01)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner_opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner_opt.state_dict()}

    # Manager keeps "manager_addr"/"replica_id" under fixed, unprefixed keys in
    # the group's store. A launcher whose store survives a restart (torchrun's
    # agent store does) hands a restarted rank > 0 the previous attempt's
    # manager address before the new rank 0 overwrites it ("failed to connect to
    # http://...: Connection refused" after connect_timeout, restart loop).
    # So ranks > 0 wait for a per-attempt key that rank 0 sets after its
    # Manager has published the new address. Harmless with a fresh store.
    ready_key = f"train_ft/manager_ready/{restart}"
    if world_size > 1 and rank != 0:
        TCPStore(
            host_name=os.environ["MASTER_ADDR"],
            port=int(os.environ["MASTER_PORT"]),
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=120),
        ).wait([ready_key])

    pg = ProcessGroupGloo(timeout=timedelta(seconds=env_float("PG_TIMEOUT_SEC", 5)))
    manager = Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=env_int("MIN_REPLICA_SIZE", 1),
        replica_id=f"train_ft_{group}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=env_float("MANAGER_TIMEOUT_SEC", 10)),
        quorum_timeout=timedelta(seconds=env_float("QUORUM_TIMEOUT_SEC", 30)),
        connect_timeout=timedelta(seconds=env_float("CONNECT_TIMEOUT_SEC", 10)),
        hostname=os.environ.get("TORCHFT_HOSTNAME", "127.0.0.1"),
    )
    if world_size > 1 and rank == 0:
        manager._store.set(ready_key, "1")
    ddp = FTDistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, inner_opt)
    loss_fn = nn.MSELoss()

    print(
        f"train_ft: group={group}/{num_groups} rank={rank}/{world_size} "
        f"restart={restart} pid={os.getpid()} start",
        flush=True,
    )
    rec = open(record, "a", buffering=1) if record else None
    while manager.current_step() < steps:
        before = manager.current_step()
        g = torch.Generator().manual_seed(
            (before * num_groups + group) * world_size + rank
        )
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)

        opt.zero_grad()  # starts the (async) quorum
        loss = loss_fn(ddp(x), y)
        if step_sleep > 0 and sleep_mid:
            # Sleep inside the step (quorum done, before the allreduce), so a kill
            # usually lands while the peer group is about to wait in the allreduce.
            time.sleep(step_sleep)
        loss.backward()  # allreduce across replica groups via the comm hook
        opt.step()  # should_commit; steps the inner optimizer only if committed

        after = manager.current_step()
        if after > before:
            line = {
                "group": group,
                "rank": rank,
                "step": after,
                "quorum_id": getattr(manager, "_quorum_id", None),
                "participants": manager.num_participants(),
                "time": time.time(),
                "pid": os.getpid(),
                "restart": int(restart),
                # extra: lets a test check that a healed group got the same weights
                "param_sum": round(sum(float(p.detach().double().sum()) for p in model.parameters()), 10),
            }
            if rec:
                rec.write(json.dumps(line) + "\n")
            if after % 20 == 0 or after == steps:
                print(
                    f"train_ft: group={group} rank={rank} step={after} "
                    f"quorum_id={line['quorum_id']} participants={line['participants']} "
                    f"loss={loss.item():.4f}",
                    flush=True,
                )
        if step_sleep > 0 and not sleep_mid:
            time.sleep(step_sleep)

    print(
        f"train_ft: group={group} rank={rank} done step={manager.current_step()} "
        f"batches_committed={manager.batches_committed()}",
        flush=True,
    )
    if rec:
        rec.close()
    manager.shutdown(wait=False)
    # Keep the store alive briefly so peers in the group can finish with it.
    if store is not None and world_size > 1:
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
