"""`mldebug hang` through torch's debug server on a real gloo torchrun job where ptrace is
forbidden: the ranks make themselves non-dumpable and mldebug runs without CAP_SYS_PTRACE, so
py-spy cannot attach; each rank's torch.distributed.debug worker server answers instead, and
the report names the culprit, every rank's route and the job keeps running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from jobs import free_port, torchrun

RECIPE = "hang_debug_server.py"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("capsh") is None,
    reason="needs root and capsh to drop CAP_SYS_PTRACE")


def without_ptrace(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as root but without CAP_SYS_PTRACE (a container without SYS_PTRACE)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = " ".join([sys.executable, "-m", "mldebug", *args])
    return subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", cmd],
                          capture_output=True, text=True, env=env, timeout=180, cwd=REPO)


def report(*args: str) -> dict:
    r = without_ptrace(*args, "--json")
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def test_hang_without_ptrace_asks_the_debug_server(tmp_path):
    pytest.importorskip("torch.distributed.debug")
    # no py-spy on the ranks' PATH: their pyspy_dump handler fails, dump_traceback answers
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and p != venv_bin and not Path(p, "py-spy").exists())
    env = dict(os.environ, NO_PTRACE="1", DEBUG_PORT=str(free_port()), PATH=path,
               STALL_TIMEOUT="3", MLDEBUG_DIR=str(tmp_path / "cap"))
    job = torchrun(RECIPE, 4, tmp_path / "log", env=env)
    try:
        pids = job.wait_ready()
        rep = report("hang", "--pattern", RECIPE)
        assert [s["rank"] for s in rep["suspects"]] == [2], rep["verdict"]
        assert "not in any collective" in rep["suspects"][0]["reason"]
        procs = rep["processes"]
        assert {p["rank"]: p["pid"] for p in procs} == pids
        assert {p["route"] for p in procs} == {"debug-server"}, procs
        assert {p["route_detail"] for p in procs} == {"dump_traceback"}
        assert rep["errors"] == []
        assert "route-debug-server" in [f["code"] for f in rep["findings"]]
        # a --store that refuses and one that accepts and never answers: one line each, and
        # the ranks' own store still answers within the time
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(4)
            for bad, why in ((f"127.0.0.1:{free_port()}", "refused the connection"),
                             (f"127.0.0.1:{silent.getsockname()[1]}", "did not")):
                start = time.monotonic()
                r = report("hang", "--pattern", RECIPE, "--store", bad, "--timeout", "8")
                assert time.monotonic() - start < 60
                assert [s["rank"] for s in r["suspects"]] == [2], r["verdict"]
                errs = [e["error"] for e in r["errors"]]
                assert len(errs) == 1 and why in errs[0] and "(--store)" in errs[0], errs
        # --watch asks the servers a second time: every group stuck
        watch = report("hang", "--pattern", RECIPE, "--watch", "1")
        assert all("threads_later" in p for p in watch["processes"]), watch["processes"]
        assert {g["state"] for g in watch["groups"]} == {"stuck"}, watch["groups"]
        # the text report says which route answered
        text = without_ptrace("hang", "--pattern", RECIPE)
        assert "answered through torch's debug server (dump_traceback)" in text.stdout, \
            text.stdout + text.stderr
        # --signal asks the debug server before sending any signal (these ranks have no
        # handler: a signal would not be sent at all)
        sig = report("hang", "--signal", "--pattern", RECIPE, "--timeout", "10")
        assert [s["rank"] for s in sig["suspects"]] == [2], sig["verdict"]
        assert {p["route"] for p in sig["processes"]} == {"debug-server"}
        # the job still runs, and its servers still answer
        assert job.procs[0].poll() is None
        assert all(os.path.exists(f"/proc/{pid}") for pid in pids.values())
        again = report("hang", "--pattern", RECIPE)
        assert [s["rank"] for s in again["suspects"]] == [2]
        # mldebug's watchdog in the same ranks says the debug server is there
        assert "torch's debug server is up here (worker port" in job.text(), job.text()[-3000:]
        dumps = [json.loads(f.read_text()) for f in (tmp_path / "cap" / "dumps").glob("*.json")]
        assert dumps and all(isinstance(d["capture"].get("debug_server"), int) for d in dumps)
    finally:
        job.stop()
