"""Overhead of the execution ring (mldebug.trace) side by side with the book's line tracer.

    .venv/bin/python benchmarks/bench_trace.py [--rounds 101] [--steps 2] [--loop-rounds 15]

Three workloads, each run under every configuration, interleaved round after round in one
process (the order rotates every round): the tiny-Llama CPU training step of
bench_numerics.py (4 layers, hidden 64, batch 4 x 64, forward + backward; the user's code
is the step function, the model code lives in site-packages: ~1,300 Python calls of torch
and transformers per step), a pure-Python loop (every call and line is user code: the
worst case for a ring) and a loop of ``fractions.Fraction`` sums (the user's loop is short,
the work is Python code of the standard library, which the ring's filter excludes: the
shape of a training step, runnable where torch is not installed, e.g. on Python 3.12+).

Configurations: no tracing; a ``sys.settrace`` function that returns None at once (the
floor of any Python-level tracer before 3.12: the interpreter's tracing mode plus one call
per Python function); mldebug calls-ring and lines-ring (4096 events); the book's
line tracer, as its listing has it: ``trace.Trace(trace=1, count=1, timing=True)`` with
``sys.stdout`` replaced by a Tee that writes every piece of output to the console and to a
per-process file, flushing the file on every write (here the console side goes to
/dev/null, which only makes this anchor cheaper), once with the book's
``ignoredirs=[sys.prefix, sys.exec_prefix]``, once without ignoredirs (everything traced,
as the book warns "expect a lot of GBs") and, in a virtualenv (where the book's setting skips
site-packages but traces the standard library), once with the base interpreter's prefixes
added (what the book's setting skips in a plain install); viztracer when installed (``pip install
mldebug[bench]``). CPU time of this process; per configuration the median time, the median
over rounds of its ratio to no tracing in the same round, and each ring's overhead as a
fraction of each book tracer's overhead (both from those median ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import sysconfig
import tempfile
import time
import trace
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mldebug.trace.ring as ring  # noqa: E402

BOOK = "book trace.Trace"
BOOK_ALL = "book trace.Trace, all"
BOOK_BASE = "book trace.Trace, base"
# The book's ignoredirs as written, what it skips in a plain (conda-style) install even when
# run from a virtualenv (the base interpreter's prefix too: site-packages and the standard
# library), and nothing.
IGNORE: dict[str, list[str] | None] = {
    BOOK: [sys.prefix, sys.exec_prefix],
    BOOK_BASE: [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix],
    BOOK_ALL: None,
}


class Tee:
    """The book's Tee: every write goes to the console and to the trace file, and the file
    is flushed each time (so a rank that stops responding leaves a complete file)."""

    def __init__(self, console: IO[str], path: str) -> None:
        self.console = console
        self.file = open(path, "a")  # noqa: SIM115 - closed by BookTracer.stop

    def write(self, msg: str) -> int:
        self.console.write(msg)
        self.file.write(msg)
        self.file.flush()
        return len(msg)

    def flush(self) -> None:
        self.console.flush()
        self.file.flush()


class BookTracer:
    """The book's approach, with the standard library's ``trace`` module itself: a
    ``sys.settrace`` tracer that prints a timestamped line for every line it traces (and
    counts them), into a Tee; ``dirs`` is the ignoredirs setting."""

    def __init__(self, path: str, dirs: list[str] | None) -> None:
        self.tracer = trace.Trace(ignoredirs=dirs, trace=1, count=1, timing=True)
        self.console = open(os.devnull, "w")  # noqa: SIM115 - closed in stop()
        self.tee = Tee(self.console, path)
        self.saved = sys.stdout

    def start(self) -> None:
        sys.stdout = self.tee  # type: ignore[assignment]
        sys.settrace(self.tracer.globaltrace)  # what Trace.runfunc does

    def stop(self) -> None:
        sys.settrace(None)
        sys.stdout = self.saved
        self.tee.file.close()
        self.console.close()


def book_skips() -> str:
    """What ignoredirs=[sys.prefix, sys.exec_prefix] skips in this interpreter."""
    paths = sysconfig.get_paths()
    prefixes = tuple(p.rstrip("/") + "/" for p in {sys.prefix, sys.exec_prefix})
    skipped = [what for what, key in (("site-packages", "purelib"), ("the standard library",
                                                                      "stdlib"))
               if (paths[key].rstrip("/") + "/").startswith(prefixes)]
    traced = [w for w in ("site-packages", "the standard library") if w not in skipped]
    return (f"sys.prefix={sys.prefix}: skips {' and '.join(skipped) or 'nothing'}"
            f"{', traces ' + ' and '.join(traced) if traced else ''}")


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


def fraction_loop(n: int) -> Fraction:
    total = Fraction(0)
    for i in range(1, n):
        total += Fraction(1, i % 17 + 1)
    return total


def _no_op(frame: Any, event: str, arg: Any) -> None:
    """The floor of any sys.settrace tracer: a trace function that returns at once."""


Conf = tuple[Callable[[], Any], Callable[[Any], None]]


def configurations(tmp: str) -> dict[str, Conf]:
    """name -> (start() -> state, stop(state))."""
    def ring_start(kind: str) -> Callable[[], Any]:
        return lambda: ring.Ring(kind, 4096).start()

    def book_start(name: str) -> Callable[[], Any]:
        def start() -> Any:
            t = BookTracer(os.path.join(tmp, f"trace-{len(name)}.txt"), IGNORE[name])
            t.start()
            return t
        return start

    confs: dict[str, Conf] = {
        "none": (lambda: None, lambda s: None),
        "settrace no-op": (lambda: sys.settrace(_no_op), lambda s: sys.settrace(None)),
        "mldebug calls-ring": (ring_start("calls"), lambda s: s.stop()),
        "mldebug lines-ring": (ring_start("lines"), lambda s: s.stop()),
        BOOK: (book_start(BOOK), lambda s: s.stop()),
        BOOK_BASE: (book_start(BOOK_BASE), lambda s: s.stop()),
        BOOK_ALL: (book_start(BOOK_ALL), lambda s: s.stop()),
    }
    if sys.prefix == sys.base_prefix:  # no virtualenv: the book's setting is this one already
        del confs[BOOK_BASE]
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


def measure(work: Callable[[], Any], confs: dict[str, Conf], rounds: int, steps: int
            ) -> dict[str, list[float]]:
    """Per configuration, the CPU time of one call of ``work`` in each round."""
    times: dict[str, list[float]] = {name: [] for name in confs}
    names = list(confs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, stop = confs[name]
            state = start()
            t0 = time.process_time()
            for _ in range(steps):
                work()
            dt = time.process_time() - t0
            stop(state)
            times[name].append(dt / steps)
    return times


def table(title: str, times: dict[str, list[float]]) -> None:
    none = times["none"]
    ratio = {n: statistics.median([a / b for a, b in zip(v, none, strict=True)])
             for n, v in times.items()}
    anchors = [a for a in (BOOK, BOOK_BASE, BOOK_ALL) if a in times]
    print(f"\n{title}\n{'configuration':<22} {'ms':>9} {'x none':>8}"
          + "".join(f" {'/' + a[17:] if a != BOOK else '/ book':>8}" for a in anchors)
          + "   (overhead / that tracer's overhead)")
    for n, v in times.items():
        fracs = [(ratio[n] - 1) / (ratio[a] - 1) if ratio[a] > 1 else float("nan")
                 for a in anchors]
        print(f"{n:<22} {statistics.median(v) * 1e3:9.3f} {ratio[n]:8.3f}"
              + "".join(f" {f:8.3f}" for f in fracs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="execution ring overhead benchmark")
    p.add_argument("--rounds", type=int, default=101, help="rounds of the Llama step")
    p.add_argument("--loop-rounds", type=int, default=15, help="rounds of each loop")
    p.add_argument("--steps", type=int, default=2, help="Llama steps per round per configuration")
    p.add_argument("--loop", type=int, default=20000, help="iterations of the pure-Python loop")
    p.add_argument("--fractions", type=int, default=2000, help="iterations of the Fraction loop")
    p.add_argument("--skip-llama", action="store_true", help="only the loops (no torch)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        confs = configurations(tmp)
        mode = "sys.monitoring" if sys.version_info >= (3, 12) else "sys.settrace"
        print(f"Python {sys.version.split()[0]}, {mode} rings of 4096 events, {args.rounds} "
              f"rounds (Llama), {args.loop_rounds} (loops), CPU time\n{BOOK}: ignoredirs=[sys.prefix, sys.exec_prefix]; "
              f"{book_skips()}\n{BOOK_ALL}: no ignoredirs, traces everything")
        if BOOK_BASE in confs:
            print(f"{BOOK_BASE}: ignoredirs adds sys.base_prefix={sys.base_prefix} (what the "
                  "book's setting skips in a plain install: site-packages and the stdlib)")
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
              measure(lambda: py_loop(args.loop), confs, args.loop_rounds, 1))
        table(f"Fraction loop ({args.fractions} sums; the work is standard-library Python)",
              measure(lambda: fraction_loop(args.fractions), confs, args.loop_rounds, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
