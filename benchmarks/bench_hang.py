"""mldebug hang vs the book's serial recipe, side by side on the same hung job, one run.

    .venv/bin/python benchmarks/bench_hang.py [--ranks 8] [--repeat 5]

Starts recipes/collective_mismatch.py under torchrun with N ranks (gloo, CPU), waits until
every rank is hung, then alternates, REPEAT times each:
  recipe:  pgrep -P <launcher> | xargs -I {} py-spy dump [--native] --pid {}
  mldebug: python -m mldebug hang --pid <launcher> [--native]   (start-up + collection +
           analysis + report, end to end)
and prints median wall times and the ratio mldebug/recipe. Also times the pure analysis of
10,000 synthetic rank dumps. Ratios, not absolute times: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from jobs import torchrun  # noqa: E402


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return elapsed


def bench_collection(ranks: int, repeat: int) -> list[tuple[str, float, float]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]  # py-spy
    job = torchrun("collective_mismatch.py", ranks, Path("/tmp/mldebug-bench-hang.log"))
    rows = []
    try:
        job.wait_ready(timeout=300, settle=3)
        for native in (False, True):
            flag = " --native" if native else ""
            recipe = ["bash", "-c", f"pgrep -P {job.pid} | xargs -I {{}} py-spy dump{flag} --pid {{}}"]
            ours = [sys.executable, "-m", "mldebug", "hang", "--pid", str(job.pid)]
            if native:
                ours.append("--native")
            t_recipe, t_ours = [], []
            for _ in range(repeat):
                t_recipe.append(timed(recipe, env))
                t_ours.append(timed(ours, env))
            rows.append(("--native" if native else "python only",
                         statistics.median(t_recipe), statistics.median(t_ours)))
    finally:
        job.stop()
    return rows


def bench_analysis(n: int) -> float:
    from mldebug.hang.analyze import analyze
    from mldebug.hang.model import Collection, Process, StackFrame, Thread

    c10d = "torch/distributed/distributed_c10d.py"
    wait = [StackFrame("all_reduce", "/v/site-packages/" + c10d, 3252, c10d),
            StackFrame("step", "/home/u/train.py", 40, "train.py"), StackFrame("main", "/home/u/train.py", 60, "train.py")]
    odd = [StackFrame("load_batch", "/home/u/train.py", 12, "train.py"), StackFrame("main", "/home/u/train.py", 59, "train.py")]
    procs = [Process(host=f"node{r // 8}", pid=1000 + r % 8, rank=r, local_rank=r % 8, world_size=n,
                     local_world_size=8, node_rank=r // 8,
                     threads=[Thread("MainThread", frames=list(odd if r == 4321 else wait))])
             for r in range(n)]
    t = time.perf_counter()
    report = analyze(Collection(processes=procs))
    report.to_dict()
    elapsed = time.perf_counter() - t
    assert [s.rank for s in report.suspects] == [4321]
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    print(f"mldebug hang benchmark: {args.ranks} hung ranks, median of {args.repeat} alternating runs")
    for mode, recipe, ours in bench_collection(args.ranks, args.repeat):
        print(f"  {mode:12s} recipe {recipe:6.2f}s  mldebug {ours:6.2f}s  ratio {ours / recipe:5.2f}x")
    a = bench_analysis(10_000)
    print(f"  analysis of 10,000 synthetic rank dumps (+ JSON dict): {a:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
