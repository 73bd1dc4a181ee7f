"""Overhead of the execution ring (mldebug.trace) side by side with a full line tracer.

    .venv/bin/python benchmarks/bench_trace.py [--rounds 7] [--steps 10] [--loop 20000]

Two workloads, each run under every configuration, interleaved round after round in one
process: the tiny-Llama CPU training step of bench_numerics.py (4 layers, hidden 64, batch
4 x 64, forward + backward; the user's code is the step function, the model code lives in
site-packages) and a pure-Python loop (every call and line is user code: the worst case).
Configurations: no tracing; mldebug calls-ring; mldebug lines-ring; a plain ``sys.settrace``
line tracer writing each user-code line to a file (the book's approach: ``trace.Trace`` with
``ignoredirs=[sys.prefix, sys.exec_prefix]``); viztracer when installed (``pip install
mldebug[bench]``). CPU time of this process; prints the median per configuration, the ratio
to no tracing, and each ring's overhead as a fraction of the settrace tracer's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import linecache
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mldebug.trace.ring as ring  # noqa: E402


class FileLineTracer:
    """The book's approach: every line of code outside sys.prefix/exec_prefix, to a file
    (in a virtualenv that skips site-packages, not the standard library)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w")  # noqa: SIM115 - closed in stop()
        self.ignore = tuple({sys.prefix, sys.exec_prefix})
        self.t0 = time.monotonic()

    def globaltrace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.startswith(self.ignore):
            return None
        return self.localtrace

    def localtrace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            code = frame.f_code
            self.file.write(f"{time.monotonic() - self.t0:.6f} {code.co_filename}:"
                            f"{frame.f_lineno}: {linecache.getline(code.co_filename, frame.f_lineno)}")
        return self.localtrace

    def start(self) -> None:
        sys.settrace(self.globaltrace)

    def stop(self) -> None:
        sys.settrace(None)
        self.file.flush()


def helper(i: int) -> int:
    return i * i % 7


def py_loop(n: int) -> int:
    total = 0
    for i in range(n):
        if i % 3:
            total += helper(i)
        else:
            total -= 1
    return total


def configurations(tmp: str) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    """name -> (start() -> state, stop(state))."""
    def ring_start(kind: str) -> Callable[[], Any]:
        return lambda: ring.Ring(kind, 4096).start()

    def settrace_start() -> Any:
        t = FileLineTracer(os.path.join(tmp, "lines.txt"))
        t.start()
        return t

    confs: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "none": (lambda: None, lambda s: None),
        "mldebug calls-ring": (ring_start("calls"), lambda s: s.stop()),
        "mldebug lines-ring": (ring_start("lines"), lambda s: s.stop()),
        "settrace lines->file": (settrace_start, lambda s: s.stop()),
    }
    try:
        from viztracer import VizTracer

        def viz_start() -> Any:
            v = VizTracer(tracer_entries=1_000_000, verbose=0)
            v.start()
            return v

        def viz_stop(v: Any) -> None:
            v.stop()
            v.clear()

        confs["viztracer"] = (viz_start, viz_stop)
    except ImportError:
        print("viztracer not installed (pip install mldebug[bench]): skipped")
    return confs


def measure(work: Callable[[], Any], confs: dict[str, Any], rounds: int, steps: int
            ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in confs}
    for _ in range(rounds):
        for name, (start, stop) in confs.items():
            state = start()
            t0 = time.process_time()
            for _ in range(steps):
                work()
            dt = time.process_time() - t0
            stop(state)
            times[name].append(dt / steps)
    return times


def table(title: str, times: dict[str, list[float]]) -> None:
    med = {n: statistics.median(v) for n, v in times.items()}
    best = {n: min(v) for n, v in times.items()}
    none = med["none"]
    anchor = med["settrace lines->file"] - none
    print(f"\n{title}")
    print(f"{'configuration':<22} {'ms':>9} {'x none':>8} {'x none (min)':>13} "
          f"{'overhead / settrace overhead':>29}")
    for n, t in med.items():
        frac = (t - none) / anchor if anchor > 0 else float("nan")
        print(f"{n:<22} {t * 1e3:9.3f} {t / none:8.2f} {best[n] / best['none']:13.2f} "
              f"{frac:29.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="execution ring overhead benchmark")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="Llama steps per round per configuration")
    p.add_argument("--loop", type=int, default=20000, help="iterations of the pure-Python loop")
    p.add_argument("--skip-llama", action="store_true", help="only the pure-Python loop")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        confs = configurations(tmp)
        print(f"Python {sys.version.split()[0]}, {'sys.monitoring' if sys.version_info >= (3, 12) else 'sys.settrace'} "
              f"rings of 4096 events, {args.rounds} rounds, CPU time, median")
        if not args.skip_llama:
            import torch
            from bench_numerics import make_step, tiny_llama

            torch.set_num_threads(1)
            model = tiny_llama("cpu")
            ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(0))
            step = make_step(model, ids)
            with contextlib.redirect_stdout(io.StringIO()):
                for _ in range(2):
                    step()
            table(f"tiny-Llama fwd+bwd step on CPU (torch {torch.__version__}), "
                  f"{args.steps} steps per round", measure(step, confs, args.rounds, args.steps))
        table(f"pure-Python loop ({args.loop} iterations, a call in 2 of 3)",
              measure(lambda: py_loop(args.loop), confs, args.rounds, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
