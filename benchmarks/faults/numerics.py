"""The fault matrix's ``numerics`` route: numerics faults planted in real gloo torchrun jobs
under NanSentinel (recipes/numerics_faults.py), each scored on what `mldebug numerics report
--json` says (culprit ranks and class), per parallelism.

    python benchmarks/faults/numerics.py [--seeds 1] [--ranks 4] [--jobs 2] [--markdown]
    python benchmarks/faults/run.py --routes numerics      (the same)

Rows (the rank and the step are drawn from the seed):

- ``nan-forward``: a batch scaled by 1e5 on the drawn rank: exp overflows in forward;
  right: that rank, class ``nonfinite-forward`` (reproducible);
- ``nan-backward``: one input of 1000: a NaN made in ``layers.3.gate``'s backward; right:
  that rank, ``nonfinite-backward``;
- ``bitflip``: the exponent bits of one activation set once (as a hardware fault): that
  rank, ``not-reproducible``;
- ``mismatch`` (DDP only): the drawn rank all-reduces its loss metric with MAX, the others
  with SUM - gloo completes it silently with wrong values; right: that rank, ``desync``;
- ``healthy``: nothing planted; right: no culprit, ``healthy``.

Parallelisms: ``ddp`` (--ranks ranks) and ``single`` (one process). FSDP2 is not a row yet
(docs/numerics.md says why).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from score import Outcome, markdown, score, text  # noqa: E402

ROWS = {  # name -> (recipe fault, class, parallelisms)
    "nan-forward": ("forward", "nonfinite-forward", ("ddp", "single")),
    "nan-backward": ("backward", "nonfinite-backward", ("ddp", "single")),
    "bitflip": ("bitflip", "not-reproducible", ("ddp", "single")),
    "mismatch": ("mismatch", "desync", ("ddp",)),
    "healthy": ("none", "healthy", ("ddp", "single")),
}


@dataclass
class Case:
    row: str
    parallel: str
    ranks: int
    seed: int
    rank: int
    step: int

    @property
    def name(self) -> str:
        return f"{self.row}/{self.parallel}/r{self.rank}s{self.step}"


def cases(ranks: int, seeds: int, first_seed: int = 0) -> list[Case]:
    out = []
    for seed in range(first_seed, first_seed + seeds):
        for row, (_, _, pars) in ROWS.items():
            for par in pars:
                n = ranks if par == "ddp" else 1
                rng = random.Random(f"{row}/{par}/{n}/{seed}")
                out.append(Case(row, par, n, seed, rng.randrange(n), rng.randint(1, 3)))
    return out


def classify(doc: dict[str, Any]) -> tuple[list[int], str]:
    """The report's culprits and the matrix's class for them."""
    v = doc.get("verdict") or {}
    culprits = [int(r) for r in v.get("culprits") or []]
    if v.get("class") == "desync":
        return culprits, "desync"
    first = doc.get("first")
    if not first:
        return culprits, "healthy" if v.get("kind") == "ok" else str(v.get("class"))
    if first.get("reproducible") is False:
        return culprits, "not-reproducible"
    if first.get("phase") in ("forward", "backward") and first.get("reproducible"):
        return culprits, f"nonfinite-{first['phase']}"
    return culprits, "nonfinite-unlocalised"


def run_case(c: Case, timeout: float = 240) -> Outcome:
    fault, cls, _ = ROWS[c.row]
    truth = [] if c.row == "healthy" else [c.rank]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="fault-numerics-") as tmp:
        rec = Path(tmp) / "rec"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(c.ranks), str(ROOT / "recipes" / "numerics_faults.py"),
               "--dir", str(rec), "--fault", fault, "--rank", str(c.rank), "--step",
               str(c.step), "--parallel", c.parallel]
        t0 = time.monotonic()
        out = Outcome(case=c.name, route=f"numerics/{c.parallel}", truth=truth,
                      classes=[cls], culprits=None, cls=None, seconds=0.0, ranks=c.ranks,
                      seed=c.seed)
        try:
            job = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp,
                                 timeout=timeout, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        except subprocess.TimeoutExpired:
            out.error = f"the job did not end within {timeout:.0f} s"
            return out
        if job.returncode != 0:
            out.error = f"job exit {job.returncode}: {job.stderr[-300:]}"
            return out
        rep = subprocess.run([sys.executable, "-m", "mldebug", "numerics", "report", str(rec),
                              "--json"], capture_output=True, text=True, env=env, timeout=120,
                             stdin=subprocess.DEVNULL)
        out.seconds = time.monotonic() - t0
        if rep.returncode != 0:
            out.error = f"report exit {rep.returncode}: {rep.stderr[-300:]}"
            return out
        doc = json.loads(rep.stdout)
        out.culprits, out.cls = classify(doc)
        out.summary = str((doc.get("verdict") or {}).get("summary", ""))[:300]
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4, help="DDP world size (default 4)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    todo = cases(a.ranks, a.seeds, a.first_seed)
    print(f"numerics route: {len(todo)} case(s), {a.jobs} at a time", file=sys.stderr)
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        outcomes = list(pool.map(run_case, todo))
    wall = time.monotonic() - t0
    for o in outcomes:
        ok = "ok   " if o.exact and o.class_ok else "WRONG"
        print(f"{ok} {o.case:28} {o.seconds:5.1f} s  {sorted(o.culprits or []) or '-'} "
              f"{o.cls}{'  ' + o.error if o.error else ''}")
    scores = score(outcomes)
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\nnumerics route, commit {commit}: {len(todo)} cases in {wall:.0f} s")
    print(markdown(scores) if a.markdown else text(scores))
    wrong = [w for s in scores.values() for w in s.wrong]
    for w in wrong:
        print(f"  wrong: {w}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "commit": commit, "wall_s": round(wall, 1),
            "scores": {k: v.to_dict() for k, v in scores.items()},
            "outcomes": [o.to_dict() for o in outcomes]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
