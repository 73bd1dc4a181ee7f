"""PyTorch's flight-recorder tutorial example on gloo: rank 0 issues one extra all_reduce.

Run (two ranks, as the tutorial does), then trigger while rank 0 hangs:

    MLDEBUG_FR_DIR=/tmp/crash torchrun --standalone --nproc_per_node 2 \\
        recipes/fr_tutorial_crash.py --timeout 60 &
    mldebug fr trigger --dir /tmp/crash --analyze

Both ranks all_reduce a 3x4 tensor twice; rank 0 then issues one extra all_reduce that rank 1
never does; both go on with two more. The extra call has the 3x4 shape here, not the
tutorial's 4x5: on gloo a receiver that gets more bytes than it expects aborts from C++ and
leaves no dump. So the extra call pairs with rank 1's third regular one, the sequences only
part at #5 (rank 0 waits in it, rank 1 is done and lingers for the trigger): one rank against
one, a tie on counts. The call sites break it: rank 0's #3 comes from a source line that
issued no other collective on any rank, while rank 1's #3 comes from the loop that rank 0
also reaches at #4. ``mldebug fr analyze`` names rank 0 and the line of the extra call.
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--linger", type=float, default=60.0,
                        help="seconds a rank that finished stays up to be triggered")
    args = parser.parse_args()
    import mldebug.fr

    mldebug.fr.enable()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    a = torch.full((3, 4), float(rank))
    for _ in range(2):
        dist.all_reduce(a)
    if rank == 0:  # the bug: an extra collective the other rank never issues
        b = torch.full((3, 4), float(rank))
        dist.all_reduce(b)
    print(f"rank {rank} ready", flush=True)  # rank 0 is about to hang in its last call
    for _ in range(2):
        dist.all_reduce(a)
    print(f"rank {rank} done", flush=True)
    time.sleep(args.linger)


if __name__ == "__main__":
    main()
