"""A test worker for `accel launch` vs `accelerate launch`: records what
accelerate sees in this process.

Writes $STATE_DIR/rank<RANK>.json with the accelerate-relevant environment
and, unless STATE_ENV_ONLY=1, the state `Accelerator()` builds from it (or the
error it raises). Leaves with a barrier and os._exit(0) (torch 2.13 can abort
at interpreter exit after a process group was used).
"""
import json
import os

PREFIXES = ("ACCELERATE_", "FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_")
PLAIN = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "PYTHONPATH", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT",
    "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "CCL_WORKER_COUNT",
)
import importlib.metadata

record = {
    "env": {k: v for k, v in os.environ.items() if k.startswith(PREFIXES) or k in PLAIN},
    # The release this worker imports (the test checks it is the venv's).
    "accelerate": importlib.metadata.version("accelerate"),
}
state = None
if os.environ.get("STATE_ENV_ONLY") != "1":
    try:
        from accelerate import Accelerator

        acc = Accelerator()
        state = acc.state
        record["state"] = {
            "distributed_type": str(state.distributed_type),
            "backend": state.backend,
            "num_processes": state.num_processes,
            "process_index": state.process_index,
            "local_process_index": state.local_process_index,
            "device": str(state.device),
            "mixed_precision": state.mixed_precision,
            "debug": state.debug,
            "use_ipex": getattr(state, "use_ipex", None),
            "repr": repr(state),
        }
    except Exception as e:  # the same error under both launchers is a match
        record["state"] = {"error": f"{type(e).__name__}: {e}"}
rank = os.environ.get("RANK", "0")
with open(os.path.join(os.environ["STATE_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
if state is not None and state.num_processes > 1:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
os._exit(0)
