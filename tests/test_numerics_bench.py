"""The numerics benchmark runs end to end (one short round): the figures in
docs/benchmarks.md come from this script, so it must not rot. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


def test_bench_numerics_prints_every_configuration_and_the_sync_count() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_numerics.py"), "--rounds", "1",
         "--steps", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for name in ("none", "transformers", "mldebug", "mldebug fwd-only", "mldebug sync",
                 "floor (no bookkeeping)"):
        row = [line for line in lines if line.startswith(f"{name}  ")]
        assert len(row) == 1, (name, proc.stdout)
        fields = row[0][len(name):].split()
        assert len(fields) == 4 and all(float(f) >= 0 for f in fields[:2]), row
    assert "mldebug default mode host syncs per step: 2 " in proc.stdout, proc.stdout
