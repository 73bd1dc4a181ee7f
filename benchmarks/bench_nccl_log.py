"""How `mldebug nccl-log` scales with ranks: 1,024 / 4,096 / 8,192 ranks side by side.

Writes one synthetic per-rank log file per rank (benchmarks/nccl_synth.py: NCCL 2.2x line
shapes, 8 ranks per host, a few planted problems), then measures CPU time of load + analyze
+ render (to a null console) for each size in this one process, and the lines the report
prints; then the peak RSS of reading one ~100 MiB job log. With the previous implementation (commit 325af95 mldebug/envcheck/nccllog.py, when
present) also measured on the same files for comparison. Usage:

    python benchmarks/bench_nccl_log.py [ROUNDS]
    python benchmarks/bench_nccl_log.py --baseline main [ROUNDS]

``--baseline REF``: instead, this tree and git REF's mldebug/ (extracted to a temporary
directory) each read the same files in fresh interpreters, alternately, best of ROUNDS: the
side-by-side CPU of load + analyze + render.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from nccl_synth import rank_lines as write_lines  # noqa: E402
from nccl_synth import write_job  # noqa: E402

from mldebug.nccllog.analyze import analyze  # noqa: E402
from mldebug.nccllog.parse import load  # noqa: E402
from mldebug.nccllog.report import render  # noqa: E402

SIZES = (1024, 4096, 8192)


def _old_module(tmp: Path):  # the implementation before the split, if git has it
    try:
        src = subprocess.run(["git", "show", "325af95:mldebug/envcheck/nccllog.py"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = tmp / "old_nccllog.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_nccllog", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_nccllog"] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def run_new(files: list[Path]) -> tuple[float, int]:
    from rich.console import Console

    start = time.process_time()
    report = analyze(load(files))
    buf = io.StringIO()
    render(report, Console(file=buf, width=120, color_system=None))
    return time.process_time() - start, buf.getvalue().count("\n")


def run_old(mod, files: list[Path]) -> float:
    start = time.process_time()
    mod.analyze(mod.load(files))
    return time.process_time() - start


RSS_CHILD = """
import resource, sys
sys.path.insert(0, {repo!r})
if sys.argv[1] == "new":
    from mldebug.nccllog.analyze import analyze
    from mldebug.nccllog.parse import load
else:
    import importlib.util
    spec = importlib.util.spec_from_file_location("old_nccllog", sys.argv[3])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_nccllog"] = mod
    spec.loader.exec_module(mod)
    analyze, load = mod.analyze, mod.load
analyze(load([sys.argv[2]]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def peak_rss(tmp: Path, old: bool, mb: int = 100) -> None:
    """Peak RSS (MiB) reading one big job log (all ranks in one file), new vs old, each in a
    fresh interpreter."""
    big = tmp / "big.log"
    with open(big, "w") as f:
        r = 0
        while f.tell() < mb << 20:
            f.write("\n".join(write_lines(r % 1024, 1024)) + "\n")
            r += 1
    size = big.stat().st_size >> 20
    for impl in ("new", "old") if old else ("new",):
        out = subprocess.run([sys.executable, "-c", RSS_CHILD.format(repo=str(REPO)), impl,
                              str(big), str(tmp / "old_nccllog.py")],
                             capture_output=True, text=True, check=True).stdout.strip()
        print(f"{impl}: a {size} MiB log -> peak RSS {out} MiB")


CPU_CHILD = """
import io, sys, time
sys.path.insert(0, sys.argv[1])
from rich.console import Console
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import load
from mldebug.nccllog.report import render
files = sys.argv[2:]
start = time.process_time()
report = analyze(load(files))
render(report, Console(file=io.StringIO(), width=120, color_system=None))
print(time.process_time() - start, len(report.findings))
"""


def baseline(ref: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(["git", "archive", ref, "mldebug"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        jobs = {n: write_job(tmp / f"job{n}", n) for n in SIZES}
        best: dict[tuple[str, int], tuple[float, str]] = {}
        for _ in range(rounds):
            for n, files in jobs.items():
                for name, root in (("this tree", REPO), (ref, base)):
                    out = subprocess.run([sys.executable, "-c", CPU_CHILD, str(root),
                                          *map(str, files)], capture_output=True, text=True,
                                         check=True).stdout.split()
                    t = float(out[0])
                    if (name, n) not in best or t < best[(name, n)][0]:
                        best[(name, n)] = (t, out[1])
        print(f"{'ranks':>6} {'this tree CPU s':>16} {ref + ' CPU s':>16} {'ratio':>6} findings")
        for n in SIZES:
            a, b = best[("this tree", n)], best[(ref, n)]
            print(f"{n:>6} {a[0]:16.2f} {b[0]:16.2f} {a[0] / b[0]:6.2f} {a[1]} vs {b[1]}")


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--baseline":
        baseline(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        old = _old_module(tmp)
        jobs = {n: write_job(tmp / f"job{n}", n) for n in SIZES}
        new_t: dict[int, float] = {}
        old_t: dict[int, float] = {}
        lines: dict[int, int] = {}
        for _ in range(rounds):
            for n, files in jobs.items():
                t, lines[n] = run_new(files)
                new_t[n] = min(new_t.get(n, t), t)
                if old is not None:
                    t = run_old(old, files)
                    old_t[n] = min(old_t.get(n, t), t)
        print(f"{'ranks':>6} {'new CPU s':>10} {'report lines':>13} {'old CPU s':>10}")
        for n in SIZES:
            print(f"{n:>6} {new_t[n]:10.2f} {lines[n]:>13} "
                  + (f"{old_t[n]:10.2f}" if n in old_t else f"{'-':>10}"))
        print(f"8k/1k CPU ratio: new {new_t[8192] / new_t[1024]:.1f}x"
              + (f", old {old_t[8192] / old_t[1024]:.1f}x" if old_t else "")
              + " (linear = 8x)")
        peak_rss(tmp, old is not None)


if __name__ == "__main__":
    main()
