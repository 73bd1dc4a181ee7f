"""The node collector: process selection, py-spy error messages, and running stdlib-only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mldebug.fanout import MARKER, bundle
from mldebug.hang.collect import NODE_MODULES
from mldebug.hang.node import PTRACE_FIX, explain_pyspy_error, find_ranks

REPO = Path(__file__).resolve().parent.parent


def table(*rows: tuple[int, int, str, list[str]]) -> dict[int, dict]:
    return {pid: {"pid": pid, "ppid": ppid, "state": state, "uid": 0, "comm": cmd[0].split("/")[-1][:15],
                  "cmdline": cmd} for pid, ppid, state, cmd in rows}


def envs(mapping: dict[int, dict[str, str]]):
    return lambda pid: mapping.get(pid, {})


def worker_env(rank: int, **extra: str) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "job1", **extra}


def test_torchrun_under_srun_keeps_workers_drops_launcher_and_dataloader_children():
    procs = table(
        (10, 1, "S", ["/usr/bin/python3", "-m", "torch.distributed.run", "train.py"]),
        (11, 10, "S", ["/usr/bin/python3", "train.py"]),
        (12, 10, "S", ["/usr/bin/python3", "train.py"]),
        (13, 11, "S", ["/usr/bin/python3", "train.py"]),  # DataLoader worker of rank 0
        (14, 10, "Z", ["python3"]),  # zombie
        (20, 1, "S", ["/usr/bin/python3", "other.py"]),  # unrelated Python, no rank
        (30, 1, "S", ["/bin/bash"]),
    )
    env = envs({10: {"SLURM_PROCID": "0"},
                11: worker_env(0, SLURM_PROCID="0"), 12: worker_env(1, SLURM_PROCID="0"),
                13: worker_env(0, SLURM_PROCID="0"), 14: worker_env(1)})
    targets, errors = find_ranks(procs, environ=env, host="n1")
    assert [t["pid"] for t in targets] == [11, 12]
    assert [t["identity"]["rank"] for t in targets] == [0, 1]
    assert errors == []


def test_pid_of_a_launcher_selects_its_ranks_and_pattern_needs_no_rank():
    procs = table(
        (10, 1, "S", ["python", "-m", "torch.distributed.run", "a.py"]),
        (11, 10, "S", ["python", "a.py"]),
        (40, 1, "S", ["python", "b.py"]),
        (41, 40, "S", ["python", "b.py"]),
    )
    env = envs({11: worker_env(0), 41: worker_env(0, TORCHELASTIC_RUN_ID="job2")})
    targets, _ = find_ranks(procs, pid=10, environ=env)
    assert [t["pid"] for t in targets] == [11]
    targets, _ = find_ranks(procs, pattern=r"b\.py", environ=envs({}))
    assert [t["pid"] for t in targets] == [40, 41]
    targets, errors = find_ranks(procs, pid=99, environ=env)
    assert targets == [] and errors == [{"pid": 99, "error": "no process 99 on this node"}]


def test_pyspy_error_messages_are_actionable():
    me = os.getpid()
    msg = explain_pyspy_error(me, "Error: Permission Denied (os error 13)", 1)
    assert msg == f"py-spy could not attach to pid {me} (ptrace denied). {PTRACE_FIX}"
    assert "sysctl -w kernel.yama.ptrace_scope=0" in msg and "SYS_PTRACE" in msg
    assert explain_pyspy_error(2**22 + 12345, "whatever", 1) == f"process {2**22 + 12345} exited during the dump"
    assert "not a Python process" in explain_pyspy_error(me, "Error: Failed to find python version from target process", 1)


def test_bin_collector_runs_with_the_stdlib_only(tmp_path):
    # -I: isolated mode, no site-packages, no PYTHONPATH: only the stdlib and the repo files
    r = subprocess.run([sys.executable, "-I", str(REPO / "bin" / "mldebug-collect"), "--pid",
                        str(os.getpid()), "--pretty"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node_version"] == 1 and "processes" in doc


def test_bundled_node_script_runs_where_mldebug_is_not_installed(tmp_path):
    script = tmp_path / "node_script.py"
    script.write_text(bundle(NODE_MODULES, "mldebug.hang.node"))
    r = subprocess.run([sys.executable, "-I", str(script), "--pid", str(os.getpid())],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(MARKER)
    doc = json.loads(line[len(MARKER):])
    assert doc["host"] and isinstance(doc["processes"], list)
