"""A real 2-rank gloo DDP job (torchrun) where only rank 1 overflows: all ranks stop together."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_all_ranks_stop_at_the_same_step_and_only_rank_1_reports(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["MLDEBUG_PRINT_LOCK"] = str(tmp_path / "print.lock")
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "recipes" / "ddp_rank_overflow.py")],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
        stdin=subprocess.DEVNULL)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    stopped = dict(re.findall(r"STOPPED rank=(\d) step=(\d)", out))
    assert stopped == {"0": "2", "1": "2"}, out  # both ranks stop within the bad step
    report = [ln for ln in out.splitlines() if "Detected inf/nan" in ln]
    assert len(report) == 1 and re.match(r"\[[^:\]]+:1\] Detected inf/nan during batch_number=2$",
                                         report[0]), out
    assert re.search(r"\[[^:\]]+:1\] first inf/nan in forward at module\.fc2 \(Linear\)", out), out
    assert re.search(r"\[[^:\]]+:0\] DebugUnderflowOverflow: rank\(s\) 1 detected inf/nan", out), out
    assert "FINISHED" not in out
