"""A worker that records its exception with torchelastic's @record.

Rank FAIL_RANK raises ValueError("boom from rank N") at once; the others wait
to be stopped."""
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == int(os.environ.get("FAIL_RANK", "1")):
        raise ValueError(f"boom from rank {rank}")
    time.sleep(60)


if __name__ == "__main__":
    main()
