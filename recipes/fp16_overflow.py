"""Recipe: activations grow layer by layer until one fp16 layer overflows to inf.

    .venv/bin/python recipes/fp16_overflow.py [--sync-every-module]

Ten 64x64 linear layers, each initialised orthogonal with gain 4, so every layer multiplies
the activations' scale by about four. In fp16 (run on CPU: torch supports fp16 matmul there)
layer 6 ends near 4.8e4 and layer 7 passes fp16's largest value, 65504: its output is inf
and every later layer turns it into nan. mldebug's DebugUnderflowOverflow names layers.7 as
the first bad module, with the growing abs max in the frames before it, and warns that
layer 6 had used more than half of fp16's range.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from mldebug.numerics import DebugUnderflowOverflow, OverflowDetected, OverflowReport

LAYERS = 10
WIDTH = 64
GAIN = 4.0


class GrowingNet(nn.Module):
    """A stack of linear layers whose outputs grow ~4x per layer."""

    def __init__(self, layers: int = LAYERS, width: int = WIDTH, gain: float = GAIN) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        for layer in self.layers:
            nn.init.orthogonal_(layer.weight, gain=gain)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(dtype: torch.dtype = torch.float16, seed: int = 0) -> tuple[GrowingNet, torch.Tensor]:
    """The model and one input batch, deterministic for a given seed."""
    torch.manual_seed(seed)
    model = GrowingNet()
    x = torch.randn(8, WIDTH)
    return model.to(dtype), x.to(dtype)


def run(sync_every_module: bool = False, max_frames_to_save: int = 21,
        print_report: bool = True) -> OverflowReport | None:
    """Run one fp16 forward under the detector; return its report (None if nothing found)."""
    model, x = build()
    with DebugUnderflowOverflow(model, max_frames_to_save=max_frames_to_save,
                                sync_every_module=sync_every_module,
                                print_report=print_report) as debug:
        try:
            model(x)
        except OverflowDetected:
            pass
    return debug.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--sync-every-module", action="store_true",
                        help="check after every module instead of once per pass")
    parser.add_argument("--frames", type=int, default=21, help="max_frames_to_save")
    args = parser.parse_args(argv)
    report = run(args.sync_every_module, args.frames)
    if report is None:
        print("no inf/nan found (unexpected: the recipe is built to overflow)")
        return 1
    print(f"first bad module: {report.first.module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
