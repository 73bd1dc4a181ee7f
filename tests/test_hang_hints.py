"""A hint with a fix for every everyday way a rank hangs, from real blocked processes.

recipes/hang_waits.py blocks one process per mode (sleep, queue, lock, Event, subprocess,
a FIFO that never answers as a hung network file system, two threads deadlocked, a stuck
DataLoader worker). Each runs as its own one-rank job (its own MASTER_PORT), so one
`mldebug hang --native --all-threads` run also shows several jobs analysed apart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_cli
from jobs import RECIPES, REPO, free_port

pytestmark = pytest.mark.slow

MODES = {
    "sleep": "wait-sleep",
    "queue": "wait-queue",
    "lock": "wait-lock",
    "event": "wait-event",
    "subprocess": "wait-subprocess",
    "fifo-read": "wait-fs-read",
    "thread-deadlock": "thread-deadlock",
    "dataloader": "wait-dataloader",
}


@pytest.fixture(scope="module")
def blocked(tmp_path_factory):
    log = tmp_path_factory.mktemp("waits")
    procs = {}
    for mode in MODES:
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONPATH=str(REPO))
        out = open(log / f"{mode}.log", "wb")  # noqa: SIM115 - owned by the child
        procs[mode] = subprocess.Popen([sys.executable, str(RECIPES / "hang_waits.py"), mode],
                                       stdout=out, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not all("ready" in (log / f"{m}.log").read_text() for m in MODES):
            assert time.monotonic() < deadline, "the blocked processes did not start"
            time.sleep(0.2)
        time.sleep(3)  # let each reach its blocking call (the DataLoader starts its worker)
        yield procs
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the recipe's own children too
            except ProcessLookupError:
                pass
            p.wait(30)


def test_each_way_to_hang_gets_its_hint_with_a_fix_and_its_own_job(blocked):
    r = run_cli("hang", "--native", "--all-threads", "--pattern", "hang_waits.py", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    by_pid = {j["key"]: j for j in report["jobs"]}
    assert len(report["jobs"]) == len(MODES)  # one job per MASTER_PORT, never merged
    assert report["findings"][0]["code"] == "jobs"
    job_of_pid = {p["pid"]: p["job"] for p in report["processes"]}
    for mode, code in MODES.items():
        job = by_pid[job_of_pid[blocked[mode].pid]]
        codes = {f["code"]: f for f in job["findings"]}
        assert code in codes, (mode, list(codes))
        assert codes[code]["fix"], mode
    dl = next(p for p in report["processes"] if p["pid"] == blocked["dataloader"].pid)
    assert dl.get("workers"), "the DataLoader worker of the rank is dumped too"
    worker_frames = report["stacks"][dl["workers"][0]["threads"][0]["stack"]]
    assert any(f["name"].endswith("__getitem__") for f in worker_frames)
    r = run_cli("hang", "--native", "--pattern", "hang_waits.py",
                "--job", job_of_pid[blocked["queue"].pid])
    assert r.returncode == 0 and "queue" in r.stdout and "jobs found" not in r.stdout
