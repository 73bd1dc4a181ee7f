"""Overhead of DebugUnderflowOverflow on a training step, side by side with the anchor.

    .venv/bin/python benchmarks/bench_numerics.py [--rounds 7] [--steps 10] [--threads 1]

A tiny Llama (4 layers, hidden 64, vocab 128) built from a config, batch 4 x 64 tokens,
forward + backward on CPU. Configurations run interleaved, round after round, on copies of
the same model: no detector, ``transformers.debug_utils.DebugUnderflowOverflow`` (forward
only), mldebug's default mode (forward + backward, one check per pass), mldebug forward only,
mldebug ``sync_every_module=True``, and a floor: hooks that only reduce each module output and
each gradient, recording and checking nothing (``floor_hooks``). Prints the median step time
of each and the ratios, also from the minimum over rounds (the figure least disturbed by other
work on a shared machine).

Host syncs: mldebug's default mode checks once per pass (``detector.checks``), i.e. 2 per
step, none per module. On CUDA, ``--cuda`` runs the default mode under
``torch.cuda.set_sync_debug_mode("error")`` outside the two check points to prove it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers
from transformers.debug_utils import DebugUnderflowOverflow as Anchor

from mldebug.numerics import DebugUnderflowOverflow


def tiny_llama(device: str, hidden: int = 64, layers: int = 4) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(device)


def make_step(model: Any, ids: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def floor_hooks(model: Any) -> None:
    """The least any hook-based detector that checks forward AND backward must do: reduce
    each module's output (``abs`` + ``aminmax``) and each gradient arriving at it, and each
    weight's gradient. Nothing is recorded, nothing is checked, inputs are not looked at:
    a lower bound for the cost of ``mldebug`` (and of any design built on module hooks)."""
    def grad_hook(grads: Any) -> None:
        if grads and isinstance(grads[0], torch.Tensor):
            torch.aminmax(grads[0].abs())

    def weight_hook(grad: torch.Tensor) -> None:
        torch.aminmax(grad.abs())

    def hook(module: Any, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            torch.aminmax(output.detach().abs())
            if output.grad_fn is not None:
                output.grad_fn.register_prehook(grad_hook)

    for m in model.modules():
        m.register_forward_hook(hook)
    for p in model.parameters():
        p.register_hook(weight_hook)


def count_modules(model: Any) -> int:
    return sum(1 for _ in model.modules())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="DebugUnderflowOverflow overhead benchmark")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="steps per round per configuration")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--cuda", action="store_true", help="run on CUDA and check host syncs")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (the issue's: 64)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (the issue's: 4)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = "cuda" if args.cuda else "cpu"
    base = tiny_llama(device, args.hidden, args.layers)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(0)).to(device)

    models = {name: copy.deepcopy(base) for name in
              ("none", "transformers", "mldebug", "mldebug fwd-only", "mldebug sync",
               "floor (no bookkeeping)")}
    Anchor(models["transformers"])
    ours = DebugUnderflowOverflow(models["mldebug"])
    DebugUnderflowOverflow(models["mldebug fwd-only"], check_backward=False)
    DebugUnderflowOverflow(models["mldebug sync"], sync_every_module=True)
    floor_hooks(models["floor (no bookkeeping)"])
    steps = {name: make_step(m, ids) for name, m in models.items()}

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        for step in steps.values():  # warm-up
            for _ in range(2):
                step()
    # CPU time of this process is the measure on CPU: the machine may be shared, and other
    # processes' load inflates wall time but not our CPU time. On CUDA, wall time.
    clock = time.perf_counter if device == "cuda" else time.process_time
    times: dict[str, list[float]] = {name: [] for name in steps}
    with contextlib.redirect_stdout(sink):
        for _ in range(args.rounds):
            for name, step in steps.items():
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = clock()
                for _ in range(args.steps):
                    step()
                if device == "cuda":
                    torch.cuda.synchronize()
                times[name].append((clock() - t0) / args.steps)

    med = {name: statistics.median(v) for name, v in times.items()}
    none = med["none"]
    print(f"tiny Llama {args.layers} layers, hidden {args.hidden}, batch 4x64, fwd+bwd on {device}, "
          f"{count_modules(base)} modules, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, threads={args.threads}, "
          f"{args.rounds} rounds x {args.steps} steps, median step "
          f"{'wall' if device == 'cuda' else 'CPU'} time")
    # the minimum over rounds is the least disturbed by other work on a shared machine
    best = {name: min(v) for name, v in times.items()}
    print(f"{'configuration':<22} {'step ms':>8} {'x no-detector':>14} {'overhead ms':>12}"
          f" {'x (min of rounds)':>18}")
    for name, t in med.items():
        print(f"{name:<22} {t * 1e3:8.2f} {t / none:14.2f} {(t - none) * 1e3:12.2f}"
              f" {best[name] / best['none']:18.2f}")
    anchor_over = med["transformers"] - none
    ours_over = med["mldebug"] - none
    print(f"mldebug default overhead / transformers overhead: {ours_over / anchor_over:.2f} "
          f"(mldebug checks forward AND backward; transformers forward only)")
    print(f"mldebug fwd-only overhead / transformers overhead: "
          f"{(med['mldebug fwd-only'] - none) / anchor_over:.2f}")
    checks_per_step = ours.checks / ours.batch_number
    print(f"mldebug default mode host syncs per step: {checks_per_step:.0f} "
          f"(one per forward, one per backward; 0 per module)")

    if device == "cuda":
        det = DebugUnderflowOverflow(models["none"])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            steps["none"]()
        torch.cuda.set_sync_debug_mode(0)
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        print(f"CUDA sync debug mode: {len(syncs)} synchronizing calls in one step "
              f"(expected {checks_per_step:.0f}: the per-pass checks)")
        det.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
