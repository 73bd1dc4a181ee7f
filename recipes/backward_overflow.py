"""Recipe: a finite fp16 forward whose backward overflows (a loss scale that is too large).

    .venv/bin/python recipes/backward_overflow.py

Eight 64x64 fp16 linear layers with orthogonal weights of gain 4 and tiny inputs: the
forward stays far below fp16's limit (output ~2e2). The loss is multiplied by 256, as
mixed-precision loss scaling does; going backward each layer multiplies the gradient by
about four again, and the weight and bias gradients of ``layers.5`` pass 65504 (the bias
gradient sums the batch). Forward-only detectors (the book's, transformers') see nothing while
the gradients turn to inf and nan; mldebug's ``check_backward`` (on by default) names
``layers.5`` as the module whose backward produced the first inf, with the gradient that
arrived at it still finite, and warns that ``layers.6``'s weight gradient used 90% of fp16.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from mldebug.numerics import DebugUnderflowOverflow, OverflowDetected, OverflowReport

LAYERS = 8
WIDTH = 64
GAIN = 4.0
LOSS_SCALE = 256.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        for layer in self.layers:
            nn.init.orthogonal_(layer.weight, gain=GAIN)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(dtype: torch.dtype = torch.float16, seed: int = 0) -> tuple[Net, torch.Tensor]:
    """The model and one (tiny-valued) input batch, deterministic for a given seed."""
    torch.manual_seed(seed)
    model = Net()
    x = torch.randn(8, WIDTH) * 1e-3
    return model.to(dtype), x.to(dtype)


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.float().sum() * LOSS_SCALE


def run(sync_every_module: bool = False, print_report: bool = True) -> OverflowReport | None:
    """One fp16 training step under the detector; return its report (None if nothing found)."""
    model, x = build()
    with DebugUnderflowOverflow(model, sync_every_module=sync_every_module,
                                print_report=print_report) as debug:
        try:
            out = model(x)
            if print_report:
                print(f"forward is finite: output abs max={out.abs().max().item():.4g}")
            loss_fn(out).backward()
        except OverflowDetected:
            pass
    return debug.report


def main() -> int:
    report = run()
    if report is None:
        print("no inf/nan found (unexpected: the recipe is built to overflow in backward)")
        return 1
    print(f"first bad module: {report.first.module} ({report.first.cls}, {report.phase})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
