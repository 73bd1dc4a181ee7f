"""Recipe: a 2-rank DDP job where only rank 1 meets an inf; every rank stops together.

    torchrun --standalone --nproc_per_node 2 recipes/ddp_rank_overflow.py [--no-all-ranks-stop]

At step 2 rank 1's batch carries an inf. With ``all_ranks_stop=True`` the detector
all-reduces its flag at each check, so rank 0 stops at the same step instead of waiting
forever in the next gradient all-reduce for a rank that has aborted. Rank 1's report is
prefixed ``[host:1]``. Gloo on CPU; the inf is planted in the input of the second layer so
that the report names ``module.fc2`` (DDP adds the ``module.`` prefix).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mldebug.numerics import DebugUnderflowOverflow, OverflowDetected
from mldebug.printing import rank_print

BAD_RANK = 1
BAD_STEP = 2
STEPS = 6


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.poison:
            h = h * torch.tensor(float("inf"))
        return self.fc2(h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-all-ranks-stop", action="store_true")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    debug = DebugUnderflowOverflow(model, all_ranks_stop=not args.no_all_ranks_stop)
    stopped = None
    for step in range(STEPS):
        net.poison = rank == BAD_RANK and step == BAD_STEP
        try:
            loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
        except OverflowDetected as e:
            who = "its own report above" if e.report else "another rank's report"
            rank_print(f"STOPPED rank={rank} step={step} ({who})")
            stopped = step
            break
        opt.step()
        opt.zero_grad()
    debug.detach()
    dist.barrier()
    dist.destroy_process_group()
    if stopped is None:
        rank_print(f"FINISHED rank={rank} without detecting anything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
