"""mldebug hang vs the book's serial recipe, side by side on the same hung job, one run.

    .venv/bin/python benchmarks/bench_hang.py [--ranks 8] [--repeat 5]

Starts recipes/collective_mismatch.py under torchrun with N ranks (gloo, CPU), waits until
every rank is hung, then alternates, REPEAT times each:
  recipe:  pgrep -P <launcher> | xargs -I {} py-spy dump [--native] --pid {}
  mldebug: python -m mldebug hang --pid <launcher> [--native]   (start-up + collection +
           analysis + report, end to end)
and prints median wall times and the ratio mldebug/recipe. Also times the pure analysis of
10,000 synthetic rank dumps. Ratios, not absolute times: this machine is shared and noisy.

    .venv/bin/python benchmarks/bench_hang.py --saved 4096,16384 [--repeat 3]

Saved dumps at scale: writes a `mldebug hang --out` directory of N ranks (30-frame main
thread + 2 other threads each, 8 distinct main stacks), then alternates, REPEAT times each:
  json:    python -c "import json" reading every dump file (the floor: bytes -> objects)
(CPU seconds of each command, user + system)
  text:    python -m mldebug hang analyze DIR            (end to end, output to a file)
  --json:  python -m mldebug hang analyze DIR --json
and prints the ratios text/json-floor (target < 3x), 4k->16k of the text report (linear:
target <= 4.4x), and --json/text (target <= 1.5x) with the bytes each writes.
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
    # byte-compiled, as an install is (PYTHONDONTWRITEBYTECODE would make every run compile)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "mldebug")], check=False,
                   stdout=subprocess.DEVNULL)
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


FLOOR = ("import json,os,sys\n"
         "d=sys.argv[1]\n"
         "for f in os.listdir(d):\n"
         "    with open(os.path.join(d,f),'rb') as fh: json.loads(fh.read())\n")


def write_saved(out: Path, n: int) -> None:
    """A --out directory of n saved rank dumps in mldebug's dump format."""
    import json
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    (out / "dumps").mkdir(parents=True)
    (out / ".mldebug-hang").write_text("bench\n")
    site = "/venv/lib/python3.11/site-packages/"

    def fr(name: str, path: str, line: int) -> dict[str, object]:
        short = path.split("site-packages/")[-1] if "site-packages" in path else Path(path).name
        return {"name": name, "filename": path, "short_filename": short, "line": line,
                "module": None, "locals": None}

    def main_stack(variant: int) -> list[dict[str, object]]:
        frames = [fr("all_reduce", site + "torch/distributed/distributed_c10d.py", 3252),
                  fr("wrapper", site + "torch/distributed/c10d_logger.py", 81)]
        frames += [fr(f"layer{i}", site + f"model/layers_{i}.py", 10 + i) for i in range(20)]
        frames += [fr("step", "/home/u/train.py", 40 + variant), fr("loop", "/home/u/train.py", 80)]
        frames += [fr(f"run{i}", "/home/u/launch.py", 5 + i) for i in range(5)]
        frames.append(fr("<module>", "/home/u/train.py", 120))
        return frames

    other = [fr("wait", "/usr/lib/python3.11/threading.py", 324),
             fr("wait", "/usr/lib/python3.11/threading.py", 607),
             fr("run", site + "tqdm/_monitor.py", 60),
             fr("_bootstrap_inner", "/usr/lib/python3.11/threading.py", 1016),
             fr("_bootstrap", "/usr/lib/python3.11/threading.py", 973)]
    stacks = [main_stack(v) for v in range(8)]
    for r in range(n):
        pid = 1000 + r % 8
        doc = {"format": "mldebug.hang.dump/1", "host": f"node{r // 8}", "pid": pid,
               "ppid": 1, "cmdline": ["python", "train.py"],
               "identity": {"rank": r, "local_rank": r % 8, "world_size": n,
                            "local_world_size": 8, "node_rank": r // 8, "launcher": "torchrun",
                            "run_id": "bench"},
               "job": {"key": "run:bench", "launcher": "torchrun", "lone": False},
               "dump": [
                   {"pid": pid, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": pid,
                    "active": False, "owns_gil": False,
                    "frames": stacks[r % 8 if r % 64 == 7 else 0]},
                   {"pid": pid, "thread_id": 2, "thread_name": "Thread-1", "os_thread_id": pid + 1,
                    "active": False, "owns_gil": False, "frames": other},
                   {"pid": pid, "thread_id": 3, "thread_name": "Thread-2", "os_thread_id": pid + 2,
                    "active": False, "owns_gil": False, "frames": other}]}
        (out / "dumps" / f"node{r // 8}-rank{r}-{pid}.json").write_text(
            json.dumps(doc, separators=(",", ":")))


def timed_to(cmd: list[str], env: dict[str, str], sink: Path) -> tuple[float, int]:
    """CPU seconds (user + system) the command used, and the bytes it wrote: CPU time, not
    wall time, so that other load on a shared machine moves the figures less."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(sink, "wb") as out:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr.decode()[-2000:]}")
    return elapsed, sink.stat().st_size


def bench_saved(sizes: list[int], repeat: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    base = Path("/tmp/mldebug-bench-hang-saved")
    text_at: dict[int, float] = {}
    print(f"saved dumps: CPU seconds, median of {repeat} alternating runs; cpus={os.cpu_count()}")
    for n in sizes:
        d = base / str(n)
        write_saved(d, n)
        subprocess.run([sys.executable, "-c", FLOOR, str(d / "dumps")], check=True)  # warm cache
        floor = [sys.executable, "-c", FLOOR, str(d / "dumps")]
        text = [sys.executable, "-m", "mldebug", "hang", "analyze", str(d)]
        js = [*text, "--json"]
        t_floor, t_text, t_json = [], [], []
        size_text = size_json = 0
        for _ in range(repeat):
            t_floor.append(timed_to(floor, env, base / "floor.out")[0])
            e, size_text = timed_to(text, env, base / "text.out")
            t_text.append(e)
            e, size_json = timed_to(js, env, base / "json.out")
            t_json.append(e)
        f, tx, j = (statistics.median(x) for x in (t_floor, t_text, t_json))
        text_at[n] = tx
        print(f"  {n:6d} ranks  json-floor {f:6.2f}s  text {tx:6.2f}s ({tx / f:4.2f}x floor, "
              f"{size_text / 1e3:.0f} KB)  --json {j:6.2f}s ({j / tx:4.2f}x text, "
              f"{size_json / 1e6:.1f} MB)")
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        print(f"  text {a} -> {b} ranks: {text_at[b] / text_at[a]:.2f}x for {b / a:.0f}x the "
              "ranks")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--saved", metavar="N,N", help="only the saved-dump benchmark at these sizes")
    args = p.parse_args()
    if args.saved:
        bench_saved([int(x) for x in args.saved.split(",")], args.repeat)
        return 0
    print(f"mldebug hang benchmark: {args.ranks} hung ranks, median of {args.repeat} alternating runs")
    for mode, recipe, ours in bench_collection(args.ranks, args.repeat):
        print(f"  {mode:12s} recipe {recipe:6.2f}s  mldebug {ours:6.2f}s  ratio {ours / recipe:5.2f}x")
    a = bench_analysis(10_000)
    print(f"  analysis of 10,000 synthetic rank dumps (+ JSON dict): {a:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
