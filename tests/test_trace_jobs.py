"""`torchrun ... -m mldebug.trace run SCRIPT`: one full trace file per rank, rank-prefixed."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_torchrun_module_form_writes_one_trace_per_rank(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("def step(i):\n    return i + 1\n\nfor i in range(4):\n    step(i)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", "-m", "mldebug.trace", "run", "--out",
                        str(tmp_path / "t"), str(script)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    files = sorted((tmp_path / "t").glob("*.trace"))
    assert len(files) == 2
    for rank, f in enumerate(files):
        assert f"-rank{rank}-" in f.name
        lines = f.read_text().splitlines()
        assert lines and all(x.startswith("[") and f":{rank}] " in x.split()[0] + " "
                              for x in lines)
        assert sum(":1 step: def step(i):" in x for x in lines) == 4
