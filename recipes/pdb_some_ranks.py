"""mldebug.breakpoint() reached by one rank only: the classic `if rank == 1:` guard.

    MLDEBUG_PDB_HANDSHAKE=20 torchrun --standalone --nproc_per_node 3 recipes/pdb_some_ranks.py

Only rank 1 calls mldebug.breakpoint() (whose default is rank=0): rank 0 is never told to
stop and ranks 0 and 2 go on to the all_reduce. What mldebug should say: rank 1 waits
MLDEBUG_PDB_HANDSHAKE seconds for the others, then prints that only rank 1 reached the
breakpoint (ranks 0 and 2 did not), that rank 0 will not be debugged, and continues; the job
ends normally. Meanwhile `mldebug hang` shows rank 1 "in mldebug: waiting ... to reach
mldebug.breakpoint", never a frame of mldebug as the culprit.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import mldebug


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())
    if rank == 1:
        mldebug.breakpoint()  # the bug: the default is rank=0, and rank 0 never gets here
    t = torch.ones(2)
    dist.all_reduce(t)
    os.write(1, f"rank {rank} done {t[0].item():g}\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
