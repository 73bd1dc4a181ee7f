"""The FR benchmark's distinct-timeline rounds run end to end on a small set, floor included:
the figures in docs/benchmarks.md come from this script, so it must not rot. No timing is
asserted; the answer and the lines' shape are."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_fr_distinct_round_prints_the_floor_and_the_ratio_to_it(tmp_path: Path) -> None:
    # 64 files: the loader's worker processes are used, as on the 1,024-file set
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fr.py"), "--sets", "",
         "--distinct", "64x200", "--floor", "--rounds", "1", "--root", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    floor = re.search(r"^distinct 64x200 \[floor #1\]: ([\d.]+) s wall, ([\d.]+) s CPU "
                      r"\(vm ([\d.]+) s\): read \+ pickle\.loads \+ free only, (\d+) entries$",
                      out, re.M)
    assert floor, out
    assert int(floor.group(4)) == 64 * 200  # every file was unpickled
    ours = re.search(r"^distinct 64x200 \[this #1\]: ([\d.]+) s wall, ([\d.]+)x the floor, .*"
                     r"culprits \[21, 22\] kind p2p .* timelines 64$", out, re.M)
    assert ours, out
    # the ratio is of the two wall times, which are printed rounded to 0.01 s
    wall, ratio, low = float(ours.group(1)), float(ours.group(2)), float(floor.group(1))
    assert (wall - 0.005) / (low + 0.005) - 0.005 <= ratio <= (wall + 0.005) / (low - 0.005) + 0.005
