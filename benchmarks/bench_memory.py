"""Benchmark: `mldebug mem report` / `mem plot` against `python -m torch.cuda._memory_viz`
(`stats` / `trace_plot`) on the same generated snapshot, and the CPU overhead of `mem peak`.

The snapshot follows torch's schema (tests/memsnap.py): EVENTS trace events of a training
loop with a per-layer leak. Every command runs as a fresh subprocess, side by side in one run;
wall time includes start-up and loading; peak RSS is the child's own (wait4). `mem peak`
overhead: the CPU time (user+sys) of a CPU-bound program tree bare, under the cgroup method
and under psutil sampling (the minimum over rounds).

    .venv/bin/python benchmarks/bench_memory.py                  # 1,000,000 events
    .venv/bin/python benchmarks/bench_memory.py --events 100000 --rounds 1

Not a test: prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import memsnap  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO))


def timed(cmd: list[str]) -> tuple[float, int, int, str]:
    """(wall s, peak RSS bytes, exit code, stdout) of one subprocess."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=ENV, cwd=REPO)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace")
        if rc != 0:
            text += err.read().decode(errors="replace")[-500:]
    return wall, ru.ru_maxrss * 1024, rc, text


def cpu_of(cmd: list[str]) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_utime + ru.ru_stime


PROGRAM = """
import subprocess, sys
n = int(sys.argv[1])
if sys.argv[2] == "launch":
    ps = [subprocess.Popen([sys.executable, __file__, str(n), "work"]) for _ in range(2)]
    sys.exit(max(p.wait() for p in ps))
x = 0
for i in range(n):
    x += i * i
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=int, default=30_000_000, help="loop length of the program")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as d:
        snap = Path(d) / "snap.pickle"
        t = time.perf_counter()
        doc = memsnap.many_events(args.events)
        n = len(doc["device_traces"][0])
        memsnap.write(snap, doc)
        del doc
        print(f"snapshot: {n} trace events, {snap.stat().st_size / 2**20:.0f} MiB pickle "
              f"(generated in {time.perf_counter() - t:.0f}s)")
        runs = {
            "mldebug mem report": [py, "-m", "mldebug", "mem", "report", str(snap)],
            "_memory_viz stats": [py, "-m", "torch.cuda._memory_viz", "stats", str(snap)],
            "mldebug mem plot .html": [py, "-m", "mldebug", "mem", "plot", str(snap), "-o",
                                       f"{d}/m.html"],
            "mldebug mem plot .png": [py, "-m", "mldebug", "mem", "plot", str(snap), "-o",
                                      f"{d}/m.png"],
            "_memory_viz trace_plot": [py, "-m", "torch.cuda._memory_viz", "trace_plot",
                                       str(snap), "-o", f"{d}/v.html"],
        }
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.rounds):
            for name, cmd in runs.items():
                wall, rss, rc, text = timed(cmd)
                if rc != 0:
                    print(f"{name}: exit code {rc}: {text.strip()[-300:]}")
                w0, r0 = best.get(name, (1e9, 0))
                best[name] = (min(w0, wall), max(r0, rss))
        print(f"{'command':<26}{'wall s (min)':>14}{'peak RSS MiB':>14}")
        for name, (wall, rss) in best.items():
            print(f"{name:<26}{wall:>14.2f}{rss / 2**20:>14.0f}")
        print(f"report / stats: {best['mldebug mem report'][0] / best['_memory_viz stats'][0]:.2f}"
              f"   report / (stats + trace_plot): {best['mldebug mem report'][0] / (best['_memory_viz stats'][0] + best['_memory_viz trace_plot'][0]):.2f}"
              f"   plot .html / trace_plot: {best['mldebug mem plot .html'][0] / best['_memory_viz trace_plot'][0]:.2f}"
              f"   plot .png / trace_plot: {best['mldebug mem plot .png'][0] / best['_memory_viz trace_plot'][0]:.2f}")
        html = (Path(d) / "m.html").read_text()
        print(f"mldebug html: {len(html) / 2**20:.1f} MiB, http(s) URLs: "
              f"{html.count('http://') + html.count('https://')}; _memory_viz html loads "
              f"{(Path(d) / 'v.html').read_text().count('https://')} https resource(s)")
        prog = Path(d) / "prog.py"
        prog.write_text(PROGRAM)
        base = [py, str(prog), str(args.work), "launch"]
        cpu = {"bare": [], "mem peak (cgroup)": [], "mem peak (sampling 0.05s)": []}
        for _ in range(args.rounds):
            cpu["bare"].append(cpu_of(base))
            for label, method in (("mem peak (cgroup)", "cgroup"),
                                  ("mem peak (sampling 0.05s)", "sampling")):
                r = subprocess.run([py, "-m", "mldebug", "mem", "peak", "--json", "--method",
                                    method, "--", *base], capture_output=True, text=True, env=ENV)
                if "{" not in r.stdout:  # no writable cgroup here (not root)
                    print(f"{label}: unavailable: {r.stderr.strip()[:120]}")
                    continue
                rep = json.loads(r.stdout[r.stdout.index("{"):])
                cpu[label].append(rep["user"] + rep["sys"])
        bare = min(cpu["bare"])
        print(f"{'program CPU (user+sys)':<30}{'s (min)':>10}{'overhead':>10}")
        for label, values in cpu.items():
            if not values:
                continue
            print(f"{label:<30}{min(values):>10.2f}{100 * (min(values) / bare - 1):>9.1f}%")


if __name__ == "__main__":
    main()
