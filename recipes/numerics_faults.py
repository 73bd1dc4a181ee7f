"""Recipe: one numerics fault planted in a real job under NanSentinel, for the fault matrix's
``numerics`` route and the fingerprint tests.

    torchrun --standalone --nproc_per_node 4 recipes/numerics_faults.py --dir REC \
        --fault mismatch --rank 2 --step 3 [--parallel ddp|single] [--steps 6]
    mldebug numerics report REC

The model is recipes/nan_sentinel.py's ``Net`` (4 residual blocks: fc, gate, act; a head);
each step also all-reduces the loss (SUM) as a training loop's metric does. Faults, on rank
``--rank`` at step ``--step``:

- ``none``: a healthy run (nothing may be named);
- ``forward``: the batch is scaled by 1e5: ``layers.1.act`` (exp) overflows in forward;
- ``backward``: one input is 1000: ``layers.3.gate`` makes a NaN in its backward;
- ``bitflip``: a forward hook sets the exponent bits of one element of ``layers.2.fc``'s
  output once (as a hardware fault would): not reproducible on replay;
- ``mismatch``: that rank all-reduces its loss metric with MAX while the others use SUM:
  gloo completes it silently with wrong values on every rank; the fingerprint names it.

``--parallel single`` trains the plain module in one process (launch with
``--nproc_per_node 1``). Every rank prints ``RESULT rank=R step=S action=A`` or
``RESULT rank=R FINISHED``. Process-group timeout: 60 s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nan_sentinel import Net, batch  # noqa: E402

from mldebug.numerics.sentinel import NanSentinel, NonFiniteDetected  # noqa: E402

FAULTS = ("none", "forward", "backward", "bitflip", "mismatch")


def run(args: argparse.Namespace, rank: int) -> str:
    torch.manual_seed(0)
    net = Net()
    model: nn.Module = DDP(net) if args.parallel == "ddp" else net
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sentinel = NanSentinel(model, opt, dir=args.dir, action="raise")
    planted = rank == args.rank
    flips = [1 if args.fault == "bitflip" and planted else 0]

    def flip(mod: nn.Module, a: Any, output: torch.Tensor) -> None:
        if flips[0] and sentinel.step_number == args.step:
            flips[0] = 0
            with torch.no_grad():
                bits = output.view(torch.int32)
                bits[0, 0] = bits[0, 0] | 0x7F800000  # every exponent bit set: inf or nan

    net.layers[2].fc.register_forward_hook(flip)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    try:
        for step in range(args.steps):
            x, y = batch(rank, step)
            here = planted and step == args.step
            if here and args.fault == "backward":
                x[0, 0] = 1000.0
            elif here and args.fault == "forward":
                x = x * 1e5
            with sentinel.step((x, y)):
                loss = model(x, y)
                if distributed:  # the loop's metric: the mean loss over the ranks
                    metric = loss.detach().clone()
                    op = dist.ReduceOp.MAX if here and args.fault == "mismatch" \
                        else dist.ReduceOp.SUM
                    dist.all_reduce(metric, op=op)
                loss.backward()
            opt.step()
            opt.zero_grad()
        return "FINISHED"
    except NonFiniteDetected as e:
        return f"step={e.record.get('step')} action=raise kind={e.record.get('kind')}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--parallel", choices=("ddp", "single"), default="ddp")
    args = p.parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    result = run(args, rank)
    os.write(1, f"RESULT rank={rank} {result}\n".encode())  # one write: ranks share a pipe
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as recipes/nan_sentinel.py: torch 2.13's exit teardown can abort a rank
