"""The straggler rows of the fault matrix (#44): a rank that is slow, never stuck.

    python benchmarks/faults/run.py --stragglers                 # 2 and 4 ranks, every row
    python benchmarks/faults/run.py --stragglers --ranks 2 --seeds 2 --json out.json

Each case is a real torchrun job (gloo, CPU; job.py ``--fault straggler``): every step reads a
batch from a DataLoader (30 ms of storage), computes (forward+backward passes, about 30 ms),
all_reduces its gradients in 1 or 3 buckets and updates, inside ``mldebug.step()``. On the
rank drawn from the seed one phase is slower by 10 %, 50 % or 4x (+300 %) of 30 ms: ``data``
(its storage), ``compute`` (more passes), ``comm`` (its first all_reduce returns that much
later); an even job slows no one. At the end every rank dumps its flight recorder and its step
clock. Routes: ``fr`` (``mldebug fr analyze`` on the dumps alone) and ``fr+steps`` (the same
with the step clock's file beside each dump). Scores: detection (exactly the drawn rank
named), phase right (its phase names the slowed one), and on even jobs any straggler named or
any ERROR.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PY = sys.executable
PHASES = ("data", "compute", "comm")
FACTORS = (0.1, 0.5, 3.0)  # the slowed phase takes this x 30 ms longer (3.0: 4x)
ROUTES = ("fr", "fr+steps")
# what a right phase starts with, per injected phase (mldebug.fr.stragglers' labels)
RIGHT = {"data": ("data",), "compute": ("compute",), "comm": ("communication",)}
HOST_SIDE = ("data", "compute")  # FR's coarse "compute or data" is right for these


@dataclass
class Case:
    ranks: int
    collectives: int
    phase: str  # "" for an even job
    factor: float
    seed: int

    @property
    def culprit(self) -> int | None:
        return random.Random(f"{self.seed}-{self.ranks}-{self.phase}").randrange(self.ranks) \
            if self.phase else None

    @property
    def name(self) -> str:
        what = f"{self.phase}+{self.factor:g}" if self.phase else "even"
        return f"{what}-r{self.ranks}-c{self.collectives}-s{self.seed}"


@dataclass
class Result:
    case: str
    route: str
    phase: str
    factor: float
    ranks: int
    collectives: int
    culprit: int | None
    named: list[int] = field(default_factory=list)
    said_phase: str = ""
    errors: int = 0
    fail: str = ""  # the job or the CLI failed: counted as a miss
    late_ms: float | None = None


def cases(ranks: list[int], seeds: int, first_seed: int = 0,
          phases: tuple[str, ...] = PHASES) -> list[Case]:
    out = []
    for s in range(first_seed, first_seed + seeds):
        for w in ranks:
            for c in (1, 3):
                out.extend(Case(w, c, p, f, s) for p in phases for f in FACTORS)
                out.extend(Case(w, c, "", 0.0, s * 10 + k) for k in range(2))  # even jobs
    return out


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLDEBUG_", "TORCH_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", NO_COLOR="1")
    return env


def run_case(c: Case, base: Path, steps: int = 40) -> list[Result]:
    side = base / c.name
    side.mkdir(parents=True)
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={c.ranks}",
           str(HERE / "job.py"), "--fault", "straggler", "--side", str(side),
           "--culprits", "" if c.culprit is None else str(c.culprit),
           "--slow-phase", c.phase, "--slow-factor", str(c.factor),
           "--collectives", str(c.collectives), "--steps", str(steps), "--timeout", "120"]
    results = [Result(c.name, r, c.phase, c.factor, c.ranks, c.collectives, c.culprit)
               for r in ROUTES]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300,
                           stdin=subprocess.DEVNULL, cwd=REPO)
        fail = "" if p.returncode == 0 else f"job exit {p.returncode}: {p.stderr[-300:]}"
    except subprocess.TimeoutExpired:
        fail = "job timed out"
    if fail:
        for r in results:
            r.fail = fail
        return results
    only = side / "fr-only"  # the dumps without the step clock's files
    only.mkdir()
    for f in (side / "fr").glob("fr_rank*"):
        shutil.copy(f, only / f.name)
    for r, d in zip(results, (only, side / "fr"), strict=True):
        _route(r, d)
    return results


def _route(r: Result, d: Path) -> None:
    p = subprocess.run([PY, "-m", "mldebug", "fr", "analyze", str(d), "--json"],
                       capture_output=True, text=True, env=_env(), timeout=120, cwd=REPO)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        r.fail = f"fr analyze exit {p.returncode}: {p.stderr[-300:]}"
        return
    sts = doc.get("stragglers", [])
    r.named = [s["rank"] for s in sts]
    if sts:
        r.said_phase, r.late_ms = sts[0].get("phase", ""), sts[0].get("late_ms_median")
    r.errors = sum(f.get("severity") == "ERROR" for f in doc.get("findings", []))
    if doc.get("verdict", {}).get("kind") == "error":
        r.errors += 1


def run_all(todo: list[Case], jobs: int = 2, progress: Callable[[str], None] = print,
            keep: bool = False) -> list[Result]:
    base = Path(tempfile.mkdtemp(prefix="mldebug-strag-"))
    out: list[Result] = []
    try:
        with ThreadPoolExecutor(jobs) as ex:
            for i, rs in enumerate(ex.map(lambda c: run_case(c, base), todo)):
                out.extend(rs)
                r = rs[-1]
                progress(f"[{i + 1}/{len(todo)}] {r.case}: named {r.named} "
                         f"({r.said_phase[:24]!r}){' ' + r.fail[:80] if r.fail else ''}")
    finally:
        if keep:
            progress(f"kept every case's directory under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return out


def phase_right(r: Result, coarse: bool = False) -> bool:
    said = r.said_phase
    if coarse and r.phase in HOST_SIDE and said.startswith("compute or data"):
        return True
    return said.startswith(RIGHT[r.phase]) and not said.startswith("compute or data")


def score(results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per route: detection and phase right over the slowed cases (and per phase and
    factor), false stragglers and errors over the even ones."""
    out: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        rs = [r for r in results if r.route == route]
        slow = [r for r in rs if r.phase]
        even = [r for r in rs if not r.phase]
        hit = [r for r in slow if r.named == [r.culprit]]
        cells: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for r in slow:
            for key in (r.phase, f"{r.factor:g}", f"{r.phase} {r.factor:g}"):
                cells[key][0] += 1
                cells[key][1] += r.named == [r.culprit]
                cells[key][2] += r.named == [r.culprit] and phase_right(r)
        out[route] = {
            "slowed": len(slow), "detected": len(hit),
            "phase_right": sum(phase_right(r) for r in hit),
            "phase_right_coarse": sum(phase_right(r, True) for r in hit),
            "even": len(even), "even_named": sum(bool(r.named) for r in even),
            "errors": sum(r.errors > 0 for r in rs),
            "failed": sum(bool(r.fail) for r in rs),
            "cells": {k: v for k, v in sorted(cells.items())},
            "wrong": [f"{r.case}: named {r.named} phase {r.said_phase[:40]!r} {r.fail[:60]}"
                      for r in rs if (r.phase and (r.named != [r.culprit]
                                                   or not phase_right(r)))
                      or (not r.phase and (r.named or r.errors)) or r.fail],
        }
    return out


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "-"


def markdown(scores: dict[str, dict[str, Any]]) -> str:
    lines = ["| route | detection | phase right (data/compute/comm) | phase right, host side "
             "as one | even jobs: straggler named | errors | failed runs |",
             "|---|---|---|---|---|---|---|"]
    for route, s in scores.items():
        lines.append(f"| {route} | {_pct(s['detected'], s['slowed'])} | "
                     f"{_pct(s['phase_right'], s['slowed'])} | "
                     f"{_pct(s['phase_right_coarse'], s['slowed'])} | "
                     f"{_pct(s['even_named'], s['even'])} | {s['errors']} | {s['failed']} |")
    lines += ["", "| route | " + " | ".join(f"{p} +{f:g}" for p in PHASES for f in FACTORS)
              + " |", "|---|" + "---|" * (len(PHASES) * len(FACTORS))]
    for route, s in scores.items():
        cells = []
        for p in PHASES:
            for f in FACTORS:
                n, d, ph = s["cells"].get(f"{p} {f:g}", [0, 0, 0])
                cells.append(f"{d}/{n} found, {ph} phase" if n else "-")
        lines.append(f"| {route} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(ranks: list[int], seeds: int, first_seed: int, jobs: int, json_out: str | None,
         progress: Callable[[str], None], keep: bool = False) -> int:
    todo = cases(ranks, seeds, first_seed)
    t0 = time.monotonic()
    progress(f"straggler matrix: {len(todo)} case(s), {jobs} at a time")
    results = run_all(todo, jobs, progress, keep)
    wall = time.monotonic() - t0
    scores = score(results)
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\nstraggler matrix, commit {commit}: {len(todo)} cases (ranks "
          f"{','.join(map(str, ranks))}, 1 and 3 all_reduces per step) in {wall:.0f} s")
    print(markdown(scores))
    print("\nwrong, per route:")
    for route, s in scores.items():
        for w in s["wrong"]:
            print(f"  {route}: {w}")
    if json_out:
        Path(json_out).write_text(json.dumps({
            "commit": commit, "wall_s": round(wall, 1), "scores": scores,
            "results": [asdict(r) for r in results]}, indent=1))
    return 0
