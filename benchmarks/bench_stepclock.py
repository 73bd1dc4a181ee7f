"""What ``with mldebug.step():`` costs a training step, side by side in one process.

    .venv/bin/python benchmarks/bench_stepclock.py [--rounds 15] [--steps 200]

A step is a small CPU training step (a 4 x Linear(256, 256) MLP, batch 64: forward, backward,
SGD by hand; one torch thread), the smallest step the clock would sit around (a GPU job's
steps are longer, so the share is smaller). Rounds alternate ``off`` (the plain loop) and
``on`` (each step inside ``mldebug.step()``, writing its file every 2 s to a temporary
``MLDEBUG_FR_DIR`` as a job would), and the order flips every round. Prints the median step
time of each, the ratio on/off (wall and the process's CPU time), and the clock's own cost per
step measured around an empty body (``pass``), which bounds what it adds to any step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    os.environ["MLDEBUG_FR_DIR"] = tempfile.mkdtemp(prefix="bench-stepclock-")
    sys.path.insert(0, ROOT)
    import torch
    from torch import nn

    import mldebug
    import mldebug.stepclock

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 1))
    x, y = torch.randn(64, 256), torch.randn(64, 1)

    def train_step() -> None:
        (model(x) - y).pow(2).mean().backward()
        with torch.no_grad():
            for q in model.parameters():
                if q.grad is not None:
                    q -= 1e-4 * q.grad
                    q.grad = None

    def loop(on: bool) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        if on:
            for _ in range(a.steps):
                with mldebug.step():
                    train_step()
        else:
            for _ in range(a.steps):
                train_step()
        return ((time.perf_counter() - w) / a.steps * 1e3,
                (time.process_time() - c) / a.steps * 1e3)

    loop(False)
    loop(True)  # warm both
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(a.rounds):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            got[on].append(loop(on))
    n = 200_000
    t = time.perf_counter()
    for _ in range(n):
        with mldebug.step():
            pass
    clock_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        pass
    clock_us -= (time.perf_counter() - t) / n * 1e6
    med = statistics.median
    off_w, on_w = med(v[0] for v in got[False]), med(v[0] for v in got[True])
    off_c, on_c = med(v[1] for v in got[False]), med(v[1] for v in got[True])
    print(f"step clock, {a.rounds} rounds x {a.steps} steps, interleaved")
    print(f"  step (wall)  off {off_w:.3f} ms   on {on_w:.3f} ms   on/off {on_w / off_w:.4f}")
    print(f"  step (CPU)   off {off_c:.3f} ms   on {on_c:.3f} ms   on/off {on_c / off_c:.4f}")
    print(f"  the clock alone: {clock_us:.2f} us per step = {100 * clock_us / 1e3 / off_w:.3f}% "
          f"of this step; file written {mldebug.stepclock.clock().steps} steps in, "
          f"{mldebug.stepclock.flush()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
