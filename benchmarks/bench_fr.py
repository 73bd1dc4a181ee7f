"""Benchmark: `mldebug fr analyze` vs torchfrtrace on the same synthetic dump sets.

Each set is an SPMD job of RANKS ranks x ENTRIES entries (all_reduce / all_gather, 4 frames
per entry, torch's format 2.10) with one rank's tensor of another size near the end, each
file pickled as torch writes it (protocol 2, unframed; ``--protocol 4`` for Python's). Both
analysers run in fresh subprocesses on the same files; wall time includes loading, and the
peak RSS is the child's own (wait4). torchfrtrace gets a time cap; where it does not finish,
the ratio is a lower bound (">"). ``--distinct`` lines also give the CPU seconds (user +
system of the process and its loader workers, which it reaps: steadier than wall time on a
loaded machine), the 1-minute load average when the run ended, and the VM's speed just before
the run (``vm``: the seconds a fixed pure-Python loop took; this VM's doubles in its slow
minutes, and the run's seconds with it). ``--floor`` times, before each round, what no
Python reader of these files can go below: the same worker processes only reading and
unpickling them; each side's wall time is then also printed as a ratio to that floor.

    .venv/bin/python benchmarks/bench_fr.py                 # 1024x2000 plus smaller sets
    .venv/bin/python benchmarks/bench_fr.py --sets 64x2000 --cap 120

    .venv/bin/python benchmarks/bench_fr.py --distinct 1024x2000 --no-torchfrtrace
    .venv/bin/python benchmarks/bench_fr.py --scaling 4096,16384 --sets ''
    .venv/bin/python benchmarks/bench_fr.py --sets '' --distinct 1024x2000 --baseline /tmp/old --rounds 2
    .venv/bin/python benchmarks/bench_fr.py --sets '' --distinct 1024x2000 --floor --rounds 5

``--distinct``: a pipeline-parallel-like set where every rank records its own timeline
(sends to the next stage, receives from the previous, an all_reduce every 10th entry), so
no two files share a timeline; rank RANKS//3 sends one activation of the wrong size near
the end, so the answer is [RANKS//3, RANKS//3 + 1], kind p2p. ``--scaling``: the pure analysis (no files) of SPMD sets of
that many ranks x 200 entries, one culprit; prints the time ratio between the sizes.

Not a test: prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # fr_synth: the synthetic dump generator

import fr_synth as synth  # noqa: E402

OURS = """
import sys, time, resource
t = time.perf_counter()
from mldebug.fr.loader import load
from mldebug.fr.analyze import analyze
a = analyze(load([sys.argv[1]]))
print("culprits", a.culprits, "kind", a.mismatches[0].kind if a.mismatches else None,
      "seq", a.mismatches[0].seq if a.mismatches else None, "timelines", a.timelines)
print("inner_s", time.perf_counter() - t)
"""

# The floor for any reader of these files in Python: the same processes (one per CPU, forked,
# the files in the same chunks as the loader's) only read and unpickle each file with the C
# unpickler, then free it. No restriction, no columns, no hand-off, no analysis. The pool's
# shape is copied from ``mldebug.fr.loader.load_files`` on purpose, not imported: the guard
# runs this as an anchor that must be the same command on both trees it compares.
FLOOR = """
import gc, os, pickle, sys
from concurrent.futures import ProcessPoolExecutor
def one(name):
    with open(name, "rb") as f:
        doc = pickle.loads(f.read())
    return len(doc["entries"])
files = sorted(os.path.join(sys.argv[1], x) for x in os.listdir(sys.argv[1]))
gc.disable()
n = min(8, os.cpu_count() or 1)
with ProcessPoolExecutor(n) as pool:
    entries = sum(pool.map(one, files, chunksize=max(1, len(files) // (n * 32))))
print("floor_entries", entries)
"""


# torch writes its dumps with its C++ pickler: protocol 2, no frames (``\x80\x02``; seen in
# torch 2.13's ``_dump_fr_trace``), which the C unpickler reads differently from Python's
# framed protocol 4. The sets are written the same way; ``--protocol 4`` for the old sets.
PROTOCOL = 2


def make_set(root: Path, ranks: int, entries: int, culprit: int,
             protocol: int = PROTOCOL) -> Path:
    d = root / f"fr-{ranks}x{entries}-p{protocol}"
    if (d / f"fr_rank{ranks - 1}").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    at = entries - 7
    majority = synth.spmd_rank(ranks, entries, 0 if culprit else 1, fault="size",
                               culprit=culprit, at=at)
    for r in range(ranks):
        doc = (synth.spmd_rank(ranks, entries, r, fault="size", culprit=culprit, at=at)
               if r == culprit else majority)
        doc["rank"] = r
        (d / f"fr_rank{r}").write_bytes(pickle.dumps(doc, protocol=protocol))
    return d


def make_distinct(root: Path, ranks: int, entries: int, protocol: int = PROTOCOL) -> Path:
    d = root / f"fr-distinct-{ranks}x{entries}-c{ranks // 3}-p{protocol}"
    if (d / f"fr_rank{ranks - 1}").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        doc = synth.pipeline_rank(ranks, entries, r, culprit=ranks // 3)
        (d / f"fr_rank{r}").write_bytes(pickle.dumps(doc, protocol=protocol))
    return d


SCALING = """
import sys, time
sys.path.insert(0, sys.argv[2])
import fr_synth as synth
from mldebug.fr.analyze import analyze
from mldebug.fr.loader import from_docs
ranks, n = int(sys.argv[1]), 200
good = synth.spmd_rank(ranks, n, 1, fault="skip", culprit=0, at=150)
bad = synth.spmd_rank(ranks, n, 0, fault="skip", culprit=0, at=150)
ds = from_docs((f"fr_rank{r}", dict(bad if r == 0 else good, rank=r)) for r in range(ranks))
t = time.perf_counter()
a = analyze(ds)
print("analysis_s", time.perf_counter() - t, "culprits", a.culprits, "timelines", a.timelines)
"""


TREE_PEAK = [0.0]  # MiB: the last run's peak of the summed RSS of the child and its workers
CPU = [0.0]  # s: the last run's user + system CPU, the child's and its reaped workers'


def _tree_rss(pid: int) -> float:
    """MiB resident in ``pid`` and its descendants now (psutil, a dev dependency)."""
    from mldebug.memory.peak import tree_rss

    return tree_rss(pid) / (1 << 20)


def run(argv: list[str], cap: float, repo: Path = REPO) -> tuple[float, float, bool, str]:
    """Wall seconds, peak RSS in MiB (wait4: the largest single process of the child's tree,
    which it reaps), whether it finished within ``cap``, and the tail of its output. Also sets
    ``CPU`` (the tree's user + system seconds) and ``TREE_PEAK`` (the peak of the whole tree's
    summed RSS, sampled every 0.2 s on a thread). The wall time ends when ``wait4`` returns
    (blocking: no polling interval in the figure); the sampler walks /proc (~1 ms a sample),
    5 times a second, so it takes about 0.5% of one core from the run it measures."""
    import tempfile
    import threading

    TREE_PEAK[0] = 0.0

    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=str(repo)), cwd=repo)
        done = threading.Event()
        timed_out = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                TREE_PEAK[0] = max(TREE_PEAK[0], _tree_rss(proc.pid))
                if time.perf_counter() - start > cap:
                    timed_out.set()
                    proc.kill()
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, _, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        CPU[0] = usage.ru_utime + usage.ru_stime
        proc.returncode = 0  # reaped here; keep Popen from waiting again
        out.seek(0)
        text = out.read().decode(errors="replace")
    return wall, usage.ru_maxrss / 1024, not timed_out.is_set(), text[-20000:]


def vm_speed() -> float:
    """Seconds a fixed pure-Python loop (3 million additions) takes now, the best of three:
    this VM's CPU speed moves by 2x from minute to minute (0.06 s in its fast minutes, 0.12-0.13
    s in its slow ones here), and every absolute figure with it; printed beside each run so
    figures from different minutes can be told apart."""
    def once() -> float:
        t = time.perf_counter()
        x = 0
        for i in range(3_000_000):
            x += i
        return time.perf_counter() - t
    return min(once() for _ in range(3))


def compile_tree(repo: Path) -> None:
    """Byte-compile ``repo``'s package, as installing it does: a checkout run with
    ``PYTHONDONTWRITEBYTECODE`` set (or a fresh worktree) otherwise compiles every module
    from source in every run (+0.05 s on this machine, paid by one side only when the other
    has its ``__pycache__``)."""
    import compileall

    compileall.compile_dir(str(repo / "mldebug"), quiet=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sets", default="16x2000,64x2000,1024x2000")
    p.add_argument("--cap", type=float, default=300.0, help="seconds torchfrtrace may take")
    p.add_argument("--root", default="/tmp/mldebug-bench-fr")
    p.add_argument("--no-torchfrtrace", action="store_true")
    p.add_argument("--distinct", default="", help="e.g. 1024x2000: every rank its own timeline")
    p.add_argument("--baseline", default="", help="another checkout (e.g. a git worktree of an "
                   "older commit) run on the same --distinct sets, interleaved")
    p.add_argument("--rounds", type=int, default=1, help="--distinct runs per side")
    p.add_argument("--floor", action="store_true", help="before each --distinct round, time "
                   "the floor: the same number of forked processes only reading and unpickling "
                   "the set's files (C unpickler), and print each side's wall time as a ratio "
                   "to it (steadier than seconds on this VM, whose speed doubles from minute "
                   "to minute)")
    p.add_argument("--protocol", type=int, default=PROTOCOL, choices=(2, 4, 5),
                   help="pickle protocol of the sets (2: as torch writes them)")
    p.add_argument("--scaling", default="", help="e.g. 4096,16384: analysis time per rank count")
    a = p.parse_args()
    root = Path(a.root)
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]} pickle protocol {a.protocol}")
    for tree in [REPO] + ([Path(a.baseline)] if a.baseline else []):
        compile_tree(tree)
    for spec in filter(None, a.distinct.split(",")):
        ranks, entries = (int(x) for x in spec.split("x"))
        d = make_distinct(root, ranks, entries, a.protocol)
        sides = [("this", REPO)] + ([("baseline", Path(a.baseline))] if a.baseline else [])
        for rnd in range(a.rounds):
            if a.floor:
                speed = vm_speed()
                floor, _, _, out = run([sys.executable, "-c", FLOOR, str(d)], 3600)
                print(f"distinct {spec} [floor #{rnd + 1}]: {floor:.2f} s wall, {CPU[0]:.2f} s "
                      f"CPU (vm {speed:.3f} s): read + pickle.loads + free only, "
                      f"{out.split()[1] if out.startswith('floor_entries') else out[-200:]} "
                      "entries", flush=True)
            for label, repo in sides:  # interleaved: the machine's load hits both alike
                speed = vm_speed()
                s, rss, _, out = run([sys.executable, "-c", OURS, str(d)], 3600, repo)
                answer = " ".join(x for x in out.splitlines() if x.startswith("culprits"))
                load = os.getloadavg()[0]
                over = f", {s / floor:.2f}x the floor" if a.floor else ""
                print(f"distinct {spec} [{label} #{rnd + 1}]: {s:.2f} s wall{over}, {CPU[0]:.2f} "
                      f"s CPU (load {load:.1f}, vm {speed:.3f} s), {rss:.0f} MiB "
                      f"peak RSS (largest process), {TREE_PEAK[0]:.0f} MiB summed over the "
                      f"process and its workers  {answer}", flush=True)
    sizes = [int(x) for x in a.scaling.split(",") if x]
    times = []
    for ranks in sizes:
        _, _, _, out = run([sys.executable, "-c", SCALING, str(ranks), str(REPO / "tests")], 3600)
        line = next((x for x in out.splitlines() if x.startswith("analysis_s")), out[-500:])
        times.append(float(line.split()[1]) if line.startswith("analysis_s") else float("nan"))
        print(f"analysis {ranks} ranks: {line}", flush=True)
    if len(times) >= 2:
        print(f"analysis ratio {sizes[-1]}/{sizes[0]} ranks: {times[-1] / times[0]:.2f}x "
              f"(linear: {sizes[-1] / sizes[0]:.1f}x)")
    print(f"{'set':>10} {'ours_s':>8} {'ours_MiB':>9} {'frtrace_s':>10} {'frtrace_MiB':>11} "
          f"{'ratio':>8}  answer")
    for spec in filter(None, a.sets.split(",")):
        ranks, entries = (int(x) for x in spec.split("x"))
        d = make_set(root, ranks, entries, culprit=ranks // 3, protocol=a.protocol)
        ours_s, ours_rss, _, ours_out = run([sys.executable, "-c", OURS, str(d)], 3600)
        answer = " ".join(line for line in ours_out.splitlines() if line.startswith("culprits"))
        if a.no_torchfrtrace:
            print(f"{spec:>10} {ours_s:8.2f} {ours_rss:9.0f} {'-':>10} {'-':>11} {'-':>8}  {answer}")
            continue
        fr_s, fr_rss, done, fr_out = run([sys.executable, "-m",
                                          "torch.distributed.flight_recorder.fr_trace",
                                          str(d), "-p", "fr_rank"], a.cap)
        import re

        theirs = sorted({int(x) for x in re.findall(r"Culprit rank (\d+)", fr_out)})
        answer += f" | torchfrtrace culprits {theirs if done else '(did not finish)'}"
        ratio = f"{fr_s / ours_s:.1f}x" if done else f">{fr_s / ours_s:.1f}x"
        fr_txt = f"{fr_s:.2f}" if done else f">{a.cap:.0f}"
        print(f"{spec:>10} {ours_s:8.2f} {ours_rss:9.0f} {fr_txt:>10} "
              f"{fr_rss if done else float('nan'):11.0f} {ratio:>8}  {answer}", flush=True)


if __name__ == "__main__":
    main()
