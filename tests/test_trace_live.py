"""`mldebug trace show --pid/--job`: a live job's ranks on this host write their rings on their
dump handler's signal and are shown side by side; other jobs are never signalled, ranks that
wrote none are named with the reason, bad selections are one line with the fix.

Real processes throughout: two torchrun jobs (gloo) of the same user, and plain Python "ranks"
(RANK/WORLD_SIZE/MASTER_ADDR set by hand, as srun does) for the cheap cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from jobs import free_port, kill_tree, torchrun

RANK_SCRIPT = textwrap.dedent("""
    import os, time
    import mldebug, mldebug.trace
    if os.environ.get("RING") == "1":
        mldebug.trace.enable(events="lines", ring=64)
    if os.environ.get("HANDLER") == "1":
        mldebug.install_dump_handler(poll=0.2)

    def train(step):
        return step + 1

    def evaluate(step):
        time.sleep(3600)

    rank = int(os.environ["RANK"])
    odd = int(os.environ.get("ODD_RANK", "-1"))
    step = 0
    while True:
        step += 1
        train(step)
        if step == 5:
            os.write(1, f"rank {rank} pid {os.getpid()} ready\\n".encode())
        if rank == odd and step == 5:
            evaluate(step)
        time.sleep(0.02)
""")


def start_ranks(tmp: Path, name: str, n: int, env: dict[str, str],
                per_rank: dict[int, dict[str, str]] | None = None) -> list[subprocess.Popen[bytes]]:
    """``n`` rank processes of one job (one MASTER_ADDR:PORT, as srun starts them), each
    with ``env`` and its own ``per_rank`` settings; returned once every one is ready."""
    d = tmp / name
    d.mkdir()
    script = d / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    log = d / "log"
    out = open(log, "wb")  # noqa: SIM115 - owned by the children
    procs = []
    for r in range(n):
        e = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "PYTHONPATH": str(REPO),
             "MLDEBUG_DIR": str(d / "cap"), **env, **(per_rank or {}).get(r, {})}
        procs.append(subprocess.Popen([sys.executable, str(script)], stdout=out,
                                      stderr=subprocess.STDOUT, env=e, cwd=d,
                                      start_new_session=True, stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + 60
    while log.read_text().count("ready") < n:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            kill_tree(*procs)
            raise AssertionError(log.read_text())
        time.sleep(0.2)
    time.sleep(0.5)
    return procs


def show(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli("trace", "show", *args, timeout=timeout)


def job_key(pid: int) -> str:
    """The key 'mldebug hang' prints for the job whose rank ``pid`` is."""
    r = run_cli("hang", "--pid", str(pid), "--json", timeout=120)
    [job] = json.loads(r.stdout)["jobs"]
    return str(job["key"])


def test_live_show_names_the_odd_rank_and_the_silent_ones(tmp_path):
    procs = start_ranks(tmp_path, "a", 3, {"RING": "1", "HANDLER": "1", "ODD_RANK": "1"},
                        {2: {"HANDLER": "0"}})
    try:
        # --pid of one rank selects that rank; its report names the job it belongs to
        key = job_key(procs[0].pid)
        assert key.startswith("master:"), key
        r = show("--job", key, "--json", "--timeout", "20")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["live"] is True and doc["job"] == key
        assert sorted(x["rank"] for x in doc["ranks"]) == [0, 1]
        [div] = doc["divergences"]
        assert div["ranks"] == [1] and div["left_at"]["text"] == "evaluate(step)", div
        assert div["branch"]["text"] == "if rank == odd and step == 5:", div
        # rank 2 has no handler: named with the reason, never signalled (SIGUSR1 uncaught
        # would have ended it)
        [miss] = doc["missing"]
        assert miss["rank"] == 2 and "no dump handler" in miss["reason"], miss
        assert "trace-rank-missing" in [f["code"] for f in doc["findings"]]
        assert all(p.poll() is None for p in procs)
        # --pid of one rank: that rank only; the others are 'not selected', not 'elsewhere'
        r = show("--pid", str(procs[0].pid), "--json", "--timeout", "20")
        one = json.loads(r.stdout)
        assert [x["rank"] for x in one["ranks"]] == [0] and one["job"] == key, one
        assert [m["rank"] for m in one["missing"]] == [1, 2]
        assert all(m["reason"].startswith("not selected: --pid named one rank")
                   and key in m["reason"] for m in one["missing"]), one["missing"]
        text = show("--job", key, "--timeout", "20")
        assert text.returncode == 0, text.stderr
        assert f"job {key}" in text.stdout
        assert "rank 1 left the others' path" in text.stdout
        assert "rank 2 (pid" in text.stdout and "no dump handler" in text.stdout
        assert "All ranks followed the same path" not in text.stdout
    finally:
        kill_tree(*procs)


def test_live_show_without_ring_or_handler_is_one_line_with_the_fix(tmp_path):
    no_ring = start_ranks(tmp_path, "r", 2, {"RING": "0", "HANDLER": "1"})
    no_handler = start_ranks(tmp_path, "h", 2, {"RING": "1", "HANDLER": "0"})
    try:
        r = show("--job", job_key(no_ring[0].pid), "--timeout", "20")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "the execution ring is not enabled in the job" in r.stderr, r.stderr
        assert "mldebug.trace.enable(" in r.stderr and "mldebug hang analyze" in r.stderr
        r = show("--job", job_key(no_handler[0].pid))
        assert r.returncode == 1 and "rank processes on this host has a dump handler" in r.stderr
        assert "no rank was signalled" in r.stderr and "install_dump_handler()" in r.stderr
        assert all(p.poll() is None for p in no_ring + no_handler)  # nothing was ended
    finally:
        kill_tree(*no_ring, *no_handler)


def test_live_show_bad_selections(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    r = show("--pid", str(gone.pid))
    assert r.returncode == 1 and f"no rank process of pid {gone.pid} on this host" in r.stderr
    assert "and  on" not in r.stderr and "Traceback" not in r.stderr
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        r = show("--pid", str(sleeper.pid))
        assert r.returncode == 1, r.stderr
        assert f"no rank process of pid {sleeper.pid} on this host." in r.stderr
        assert "'mldebug hang' lists the jobs and their keys" in r.stderr
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    r = show("--job", "no-such-job")
    assert r.returncode == 1 and "no rank process of job 'no-such-job' on this host" in r.stderr
    r = show(str(tmp_path), "--pid", "1")
    assert r.returncode == 2 and "not both" in r.stderr
    r = show("--pid", "1", "--timeout", "-1")
    assert r.returncode == 2


@pytest.mark.slow
def test_two_torchrun_jobs_only_the_selected_one_is_signalled_and_shown(tmp_path):
    pytest.importorskip("torch")

    def env(name: str, **kw: str) -> dict[str, str]:
        return dict(os.environ, MLDEBUG_DIR=str(tmp_path / name), STALL_TIMEOUT="600", **kw)

    # job A: the watchdog without the ring; job B: the ring, rank 1 takes the branch, rank 2
    # installs nothing
    a = torchrun("capture_rank_branch.py", 2, tmp_path / "a.log",
                 env=env("cap-a", NO_RING="1", HANG_RANK="0"))
    b = torchrun("capture_rank_branch.py", 3, tmp_path / "b.log",
                 env=env("cap-b", HANG_RANK="1", NO_HANDLER_RANK="2"))
    try:
        a.wait_ready(settle=0)
        pids_b = b.wait_ready(settle=2)
        r = show("--pid", str(b.pid), "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["job"].startswith("run:"), doc["job"]
        assert sorted((x["rank"], x["pid"]) for x in doc["ranks"]) == \
            [(0, pids_b[0]), (1, pids_b[1])]
        [div] = doc["divergences"]
        assert div["ranks"] == [1] and div["left_at"]["func"] == "main", div
        assert "validate" in div["left_at"]["text"], div
        assert [(m["rank"], m["pid"]) for m in doc["missing"]] == [(2, pids_b[2])]
        assert "no dump handler" in doc["missing"][0]["reason"]
        # job A was not signalled: its handlers wrote nothing
        assert not list((tmp_path / "cap-a" / "dumps").glob("*.json"))
        # --job with the key the report printed: the same ranks
        r = show("--job", doc["job"], "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        assert sorted(x["pid"] for x in json.loads(r.stdout)["ranks"]) == [pids_b[0], pids_b[1]]
        # no selection with two jobs here: both listed, nobody signalled, pick one
        r = show(timeout=300)
        assert r.returncode == 1 and "trace show compares the ranks of one job" in r.stderr
        assert doc["job"] in r.stderr and "--job" in r.stderr
        assert not list((tmp_path / "cap-a" / "dumps").glob("*.json"))
        # job A: its ranks answer with stacks but keep no ring - one line with the fix
        r = show("--pid", str(a.pid), timeout=300)
        assert r.returncode == 1, r.stdout
        assert "the execution ring is not enabled in the job" in r.stderr, r.stderr
        assert len(list((tmp_path / "cap-a" / "dumps").glob("*.json"))) == 2
        assert a.procs[0].poll() is None and b.procs[0].poll() is None  # both still run
    finally:
        a.stop()
        b.stop()


def test_hang_signal_keeps_two_jobs_without_a_run_id_apart(tmp_path):
    """The targeting rule behind --pid/--job on the signal route of `hang`: two srun-style
    jobs (no run id; MASTER_ADDR:PORT tells them apart) asked by signal are two jobs, each
    with its own verdict, never one job whose 'suspect' is the other job's rank."""
    a = start_ranks(tmp_path, "ja", 2, {"RING": "1", "HANDLER": "1", "ODD_RANK": "1"})
    b = start_ranks(tmp_path, "jb", 2, {"RING": "1", "HANDLER": "1"})
    try:
        r = run_cli("hang", "--signal", "--pattern", str(tmp_path), "--timeout", "20", "--json",
                    timeout=120)
        doc = json.loads(r.stdout)
        keys = sorted(j["key"] for j in doc["jobs"])
        assert len(keys) == 2 and all(k.startswith("master:") for k in keys), keys
        assert sorted(j["ranks"] for j in doc["jobs"]) == [2, 2], doc["jobs"]
    finally:
        kill_tree(*a, *b)
