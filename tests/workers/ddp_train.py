"""A small, deterministic DDP job (CPU, gloo) with checkpoints.

  ddp_train.py CKPT_DIR OUT_DIR [--steps 30] [--ckpt-every 5] [--fail-at 17] [--fail-rank 3]
               [--fail-kill] [--step-sleep 0.2] [--stamps DIR] [--progress [--compute]]
               [--slow-rank 3 --slow 0.08]

Every rank draws its batch from a generator seeded by (step, rank), so a run
resumed from a checkpoint computes what an uninterrupted run would. Rank 0
saves model and optimizer every `ckpt-every` steps; on start every rank loads
the newest checkpoint. With --fail-at, rank --fail-rank exits 13 at that step
in the first attempt only (--fail-kill: it is killed by SIGKILL instead); --step-sleep makes each step last that much longer
(the arithmetic is unchanged), so a test can act while the job trains. With --stamps, the
failing rank appends `fail TIME` to DIR/stamps just before it exits, and every rank appends
`loop RANK RESTART TIME` when it enters the training loop (checkpoint loaded, DDP built):
what `bench/ddp_recovery.py` measures. With --progress, every rank reports each step done
(`accel.progress`) and each checkpoint saved (`accel.checkpointed`, after the save's barrier);
with --compute, each step's own work too (`compute=`: from the step's start to the loss, before
the backward pass's all-reduce). With --slow-rank, that rank sleeps --slow seconds more in each
step's own work (a straggler).
At the end every rank writes its parameters
(exact, as float.hex) and the last step's mean loss to OUT_DIR/final_<rank>.json.
"""
import argparse
import glob
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("ckpt_dir")
ap.add_argument("out_dir")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--ckpt-every", type=int, default=5)
ap.add_argument("--fail-at", type=int, default=-1)
ap.add_argument("--fail-rank", type=int, default=3)
ap.add_argument("--step-sleep", type=float, default=0.0)
ap.add_argument("--stamps", default=None)
ap.add_argument("--fail-kill", action="store_true")
ap.add_argument("--progress", action="store_true")
ap.add_argument("--compute", action="store_true")
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--slow", type=float, default=0.0)
a = ap.parse_args()


def stamp(line):
    if a.stamps:
        import time

        with open(os.path.join(a.stamps, "stamps"), "a") as f:
            f.write(f"{line} {time.time():.6f}\n")


if a.progress:
    import accel

torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
start = 0
ckpts = sorted(glob.glob(os.path.join(a.ckpt_dir, "ckpt_*.pt")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
if ckpts:
    state = torch.load(ckpts[-1])
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
ddp = DDP(model)

loss = torch.tensor(0.0)
stamp(f"loop {rank} {restart}")
import time

for step in range(start, a.steps):
    began = time.perf_counter()
    if a.step_sleep > 0:
        time.sleep(a.step_sleep)
    if rank == a.slow_rank:
        time.sleep(a.slow)
    if step == a.fail_at and rank == a.fail_rank and restart == 0:
        stamp("fail")
        if a.fail_kill:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(13)
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.5
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    own = time.perf_counter() - began
    loss.backward()
    opt.step()
    done = step + 1
    if a.progress:
        accel.progress(done, compute=own if a.compute else None)
    if done % a.ckpt_every == 0:
        if rank == 0:
            tmp = os.path.join(a.ckpt_dir, f".tmp_{done}.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": done}, tmp)
            os.replace(tmp, os.path.join(a.ckpt_dir, f"ckpt_{done}.pt"))
        dist.barrier()
        if a.progress:
            accel.checkpointed(done)

mean_loss = loss.detach().clone()
dist.all_reduce(mean_loss)
mean_loss /= world
params = [v.hex() for p in model.parameters() for v in p.detach().flatten().tolist()]
with open(os.path.join(a.out_dir, f"final_{rank}.json"), "w") as f:
    json.dump({"rank": rank, "restart": restart, "start": start, "loss": mean_loss.item(), "params": params}, f)
# Leave together, then skip interpreter teardown: torch 2.13 sometimes aborts
# ("terminate called without an active exception") while tearing down gloo's
# threads at exit, under any launcher; the result is already written.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
