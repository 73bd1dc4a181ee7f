"""The memory benchmark runs end to end on a small snapshot: the figures in docs/benchmarks.md
come from this script, so it must not rot. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_memory_prints_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--events", "5000",
         "--rounds", "1", "--work", "200000"], capture_output=True, text=True, timeout=600,
        cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for row in ("mldebug mem report", "_memory_viz stats", "mldebug mem plot .html",
                "_memory_viz trace_plot", "report / stats:", "http(s) URLs: 0",
                "mem peak (cgroup)", "mem peak (sampling 0.05s)"):
        assert row in proc.stdout, (row, proc.stdout)
    assert "exit code" not in proc.stdout, proc.stdout
