"""mldebug log at scale: R ranks x L lines each, interleaved in one file, parsed end to end.

Prints CPU seconds and peak RSS for two sizes side by side (the second 4x the first) and their
ratio (linear: about 4x), plus `wc -l` on the same file as the floor of reading it at all.

  python benchmarks/bench_log.py                     # 1,024 ranks x 2,500 and x 10,000 lines
  python benchmarks/bench_log.py --ranks 256 --lines 1000
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
from pathlib import Path

NOISE = [
    "[rank{r}]:step {s} loss 2.{x} lr 3e-4 grad_norm 1.{x} tokens/s 51{x}",
    "[rank{r}]:[W{md} 10:{mm}:{ss}.000000 ProcessGroupNCCL.cpp:4561] using GPU {g} to perform barrier",
    "[rank{r}]:  data loader: shard {x} batch {s}",
]


def write_log(path: Path, ranks: int, lines: int, culprit: int) -> int:
    rnd = random.Random(0)
    n = 0
    with path.open("w") as f:
        for s in range(lines):
            for r in range(ranks):
                t = NOISE[(s + r) % len(NOISE)]
                f.write(t.format(r=r, s=s, x=rnd.randint(0, 999), md="0321", mm=s % 60, ss=r % 60,
                                 g=r % 8) + "\n")
                n += 1
        for r in range(ranks):
            if r == culprit:
                continue
            f.write(f"[rank{r}]:[E0321 11:00:00.{r:06d} ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog "
                    f"caught collective operation timeout: WorkNCCL(SeqNum={lines}, OpType=ALLREDUCE, "
                    f"NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n")
            f.write(f"[rank{r}]:[E0321 11:00:00.{r:06d} ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {r}] "
                    f"Exception (either an error or timeout) detected by watchdog at work: {lines}, last "
                    f"enqueued NCCL work: {lines}, last completed NCCL work: {lines - 1}.\n")
            n += 2
        f.write(f"[rank{culprit}]:[E0321 11:00:00.5 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank "
                f"{culprit}] Exception (either an error or timeout) detected by watchdog at work: "
                f"{lines - 1}, last enqueued NCCL work: {lines - 1}, last completed NCCL work: {lines - 1}.\n")
    return n + 1


def run_once(path: Path) -> dict[str, float]:
    code = (
        "import json,resource,sys,time;from mldebug.log.collect import load;"
        "from mldebug.log.analyze import analyze;"
        "t=time.process_time();r=analyze(load([sys.argv[1]]));"
        "print(json.dumps({'cpu':time.process_time()-t,'rss_mb':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024,"
        "'culprits':r.culprits,'code':r.verdict.code}))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def wc(path: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["wc", "-l", str(path)], capture_output=True, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--lines", type=int, default=10_000, help="lines per rank of the larger size")
    a = ap.parse_args()
    small, big = max(1, a.lines // 4), a.lines
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for lines in (small, big):
            p = Path(d) / f"log-{lines}.txt"
            n = write_log(p, a.ranks, lines, culprit=a.ranks // 3)
            size = p.stat().st_size
            res = run_once(p)
            rows.append((lines, n, size, res, wc(p)))
            p.unlink()
    print(f"{'ranks x lines':>16} {'lines':>11} {'MB':>7} {'cpu s':>7} {'us/line':>8} {'peak RSS MB':>12} {'wc -l s':>8}  verdict")
    for lines, n, size, res, w in rows:
        print(f"{a.ranks:>6} x {lines:<7} {n:>11} {size / 1e6:>7.0f} {res['cpu']:>7.2f} "
              f"{res['cpu'] / n * 1e6:>8.2f} {res['rss_mb']:>12.0f} {w:>8.2f}  {res['code']} {res['culprits']}")
    ratio = rows[1][3]["cpu"] / rows[0][3]["cpu"]
    print(f"CPU ratio for 4x the lines: {ratio:.2f}x (linear = 4x); peak RSS "
          f"{rows[0][3]['rss_mb']:.0f} -> {rows[1][3]['rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
