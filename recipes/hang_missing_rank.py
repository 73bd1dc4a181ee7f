"""A rank that dies before it joins: the others wait for it forever in init_process_group.

Launch the ranks the way srun or mpirun does - each an independent process - and kill one
before it joins (it sleeps first, standing in for a slow or crashing start-up):

    for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 LOCAL_WORLD_SIZE=4 \\
        MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 python recipes/hang_missing_rank.py & done
    kill -9 <pid of rank 3>

What mldebug should say: rank 3 of 4 is missing (expected on this host); ranks 0-2 wait
together in init_process_group.
"""

from __future__ import annotations

import datetime
import os
import time

import torch.distributed as dist


def main() -> None:
    rank = int(os.environ["RANK"])
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    if rank == int(os.environ.get("SLOW_RANK", "3")):
        time.sleep(3600)  # killed here by the test
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
