"""mldebug log at scale, against `grep -c -E` on the same file, side by side in one run.

A 1,024-rank training log (R ranks x L lines each, interleaved in one file, ~45 MB at the
default size) is written once; then, alternately over --rounds:

- `grep -c -E 'Watchdog|Traceback|Error|NCCL' FILE` (the floor: one C pass that matches lines);
- `mldebug log FILE` (the whole command: interpreter start, imports, reading, analysis, output;
  grep's prefilter child included);
- `load + analyze` in-process with each prefilter engine (grep for files >= 4 MiB; the Python
  regex passes), and with no prefilter at all (every line parsed: the engine before the
  prefilter, 4.0-4.4 us/line in docs/benchmarks.md before the regression).

CPU is user+sys of the process and its children (getrusage). Peak RSS of each run is printed;
--big N also streams an N-GB copy (the same lines repeated) to show memory does not grow.

  python benchmarks/bench_log.py                      # 1,024 ranks x 640 lines (~45 MB)
  python benchmarks/bench_log.py --big 2              # and a 2 GB log
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
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


ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def child_cpu(cmd: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, peak RSS MB, stdout) of one command run to the end."""
    import resource

    t0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=False)
    t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
    return cpu, t1.ru_maxrss / 1024, out.stdout


def in_process(path: Path, engine: str) -> dict[str, float]:
    code = (
        "import json,resource,sys\n"
        "def cpu():\n"
        " a=resource.getrusage(resource.RUSAGE_SELF);b=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        " return a.ru_utime+a.ru_stime+b.ru_utime+b.ru_stime\n"
        "from mldebug.log.collect import load\nfrom mldebug.log.analyze import analyze\n"
        "kw={'grep':{},'python':{'grep_min':1<<62},'none':{'prefilter':False}}[sys.argv[2]]\n"
        "t=cpu();r=analyze(load([sys.argv[1]],**kw));c=cpu()-t\n"
        "print(json.dumps({'cpu':c,'rss_mb':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024,"
        "'culprits':r.culprits,'code':r.verdict.code if r.verdict else None}))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path), engine], capture_output=True,
                         text=True, check=True, env=ENV)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--lines", type=int, default=640, help="lines per rank")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", type=float, default=0.0, help="also stream a log of this many GB")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "log.txt"
        n = write_log(p, a.ranks, a.lines, culprit=a.ranks // 3)
        mb = p.stat().st_size / 1e6
        grep = ["grep", "-c", "-E", "Watchdog|Traceback|Error|NCCL", str(p)]
        cli = [sys.executable, "-m", "mldebug", "log", str(p)]
        rows: dict[str, list[float]] = {k: [] for k in ("grep", "cli", "grep-engine", "python-engine", "none")}
        rss: dict[str, float] = {}
        verdicts = set()
        for _ in range(a.rounds):
            rows["grep"].append(child_cpu(grep)[0])
            c, r, out = child_cpu(cli)
            rows["cli"].append(c)
            rss["cli"] = r
            verdicts.add(out.splitlines()[2].strip()[:70] if len(out.splitlines()) > 2 else "?")
            for eng, key in (("grep", "grep-engine"), ("python", "python-engine"), ("none", "none")):
                res = in_process(p, eng)
                rows[key].append(res["cpu"])
                rss[key] = res["rss_mb"]
                verdicts.add(f"{res['code']} {res['culprits']}")
        g = min(rows["grep"])
        print(f"{a.ranks} ranks x {a.lines} lines = {n:,} lines, {mb:.0f} MB; best of {a.rounds} "
              "rounds, interleaved")
        print(f"{'':34} {'CPU s':>7} {'x grep':>7} {'us/line':>8} {'peak RSS MB':>12}")
        names = {"grep": "grep -c -E (the floor)", "cli": "mldebug log FILE (whole command)",
                 "grep-engine": "load+analyze, grep prefilter", "python-engine":
                 "load+analyze, Python prefilter", "none": "load+analyze, every line parsed"}
        for key, label in names.items():
            c = min(rows[key])
            print(f"{label:34} {c:>7.3f} {c / g:>7.1f} {c / n * 1e6:>8.3f} {rss.get(key, 0):>12.0f}")
        print("verdicts:", "; ".join(sorted(verdicts)))
        if a.big:
            big = Path(d) / "big.txt"
            body = p.read_bytes()
            with big.open("wb") as f:
                for _ in range(max(1, int(a.big * 1e9 / len(body)))):
                    f.write(body)
            p.unlink()
            size = big.stat().st_size / 1e9
            gc_, _, _ = child_cpu(["grep", "-c", "-E", "Watchdog|Traceback|Error|NCCL", str(big)])
            c, r, _ = child_cpu([sys.executable, "-m", "mldebug", "log", str(big)])
            res = in_process(big, "python")
            print(f"{size:.1f} GB: grep {gc_:.2f} s; mldebug log {c:.2f} s ({c / gc_:.1f}x), peak RSS "
                  f"{r:.0f} MB; Python prefilter {res['cpu']:.2f} s, peak RSS {res['rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
