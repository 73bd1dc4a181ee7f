"""A module that keeps a reference to an intermediate tensor every forward: a memory leak.

The book's TiledMLP story: a custom layer stashes one intermediate per forward "for later"
and never lets go, so every step leaks a few MB per layer. Run it:

    python recipes/memory_leak.py --steps 5              # CPU: proc RSS climbs every step
    python recipes/memory_leak.py --snapshot mem.pickle  # GPU: record a snapshot, then
    mldebug mem report mem-HOST-0.pickle                 #   names model line 'self.saved.append'

What mldebug should say: see_memory_usage shows 'CPU proc' growing by the same amount each
step (and MA on GPU); 'mldebug mem report' lists the leaking line as a leak suspect.

Distributed, one rank leaking at a steady rate (for 'mldebug mem top --watch'):

    torchrun --standalone --nproc_per_node 4 recipes/memory_leak.py --job --leak-rank 2 --rate 20

Every rank prints 'rank R pid P ready' and then loops; rank 2 keeps 20 MB more each second.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


class LeakyMLP(nn.Module):
    """An MLP block that remembers every hidden activation it ever computed (the bug)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.saved: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        self.saved.append(h)  # the leak: a reference kept every forward
        return self.down(h)


def train(steps: int, dim: int, batch: int, layers: int, device: torch.device) -> None:
    from mldebug import see_memory_usage

    model = nn.Sequential(*[LeakyMLP(dim) for _ in range(layers)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    see_memory_usage("before training", force=True, ranks="all")
    for step in range(steps):
        x = torch.randn(batch, dim, device=device)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # grads stay allocated: only the leak moves RSS
        see_memory_usage(f"after step {step}", force=True, ranks="all")


def job(leak_rank: int, rate_mb: float, seconds: float) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())
    kept: list[bytearray] = []
    ballast = bytearray(64 * 1024 * 1024)  # every rank holds some steady memory
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if rank == leak_rank:
            chunk = bytearray(int(rate_mb * 1e6 / 10))
            chunk[::4096] = b"\x01" * len(range(0, len(chunk), 4096))
            kept.append(chunk)  # the leak: never released
        time.sleep(0.1)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--snapshot", metavar="PATH", help="GPU: record a snapshot to PATH")
    p.add_argument("--job", action="store_true", help="distributed: one rank leaks steadily")
    p.add_argument("--leak-rank", type=int, default=2)
    p.add_argument("--rate", type=float, default=20.0, help="MB per second leaked (--job)")
    p.add_argument("--seconds", type=float, default=600.0, help="how long --job runs")
    args = p.parse_args()
    if args.job:
        job(args.leak_rank, args.rate, args.seconds)
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.snapshot and device.type == "cuda":
        import mldebug.memory

        with mldebug.memory.record(args.snapshot):
            train(args.steps, args.dim, args.batch, args.layers, device)
    else:
        train(args.steps, args.dim, args.batch, args.layers, device)


if __name__ == "__main__":
    main()
