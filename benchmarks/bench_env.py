"""How long `mldebug env` takes next to the anchor `python -m torch.utils.collect_env`.

Runs each command REPEAT times in this one process, side by side, and prints the median wall
time and the ratio to collect_env. Also checks that `mldebug env` never loaded torch into its
own process (the probe runs in a child). Usage: python benchmarks/bench_env.py [REPEAT]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   cwd=REPO, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    cases = {
        "mldebug env": [PY, "-m", "mldebug", "env"],
        "mldebug env --json": [PY, "-m", "mldebug", "env", "--json"],
        "mldebug env --torch-import": [PY, "-m", "mldebug", "env", "--torch-import"],
        "python -m torch.utils.collect_env": [PY, "-m", "torch.utils.collect_env"],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):  # interleaved, so load changes hit every case alike
        for name, argv in cases.items():
            times[name].append(wall(argv))
    anchor = statistics.median(times["python -m torch.utils.collect_env"])
    print(f"{'command':<36} {'median s':>9} {'min s':>7} {'vs collect_env':>15}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<36} {med:9.2f} {min(ts):7.2f} {med / anchor:14.2f}x")
    probe = subprocess.run(
        [PY, "-c", "import io,contextlib,sys; from mldebug.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()): main(['env'])\n"
         "print('torch' in sys.modules)"], capture_output=True, text=True, cwd=REPO)
    print(f"torch imported in the mldebug env process: {probe.stdout.strip()}")


if __name__ == "__main__":
    main()
