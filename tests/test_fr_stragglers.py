"""Stragglers from real gloo jobs: rank 2 sleeps 30 ms before every all_reduce (named), nobody
sleeps (nobody named), and the sleeper's dumps copied with one node's clock shifted."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, run_cli
from jobs import kill_tree

from mldebug.fanout import FanoutOptions
from mldebug.fr.analyze import analyze
from mldebug.fr.collect import for_hang
from mldebug.fr.loader import load

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _start(out: Path, sleeper: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, MLDEBUG_FR_DIR=str(out), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
         str(REPO / "recipes" / "fr_straggler.py"), "--sleeper", str(sleeper), "--sleep-ms",
         "30", "--steps", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("strag")
    dirs = {"sleeper": base / "sleeper", "none": base / "none"}
    procs = {name: _start(d, 2 if name == "sleeper" else -1) for name, d in dirs.items()}
    for name, p in procs.items():  # both at once: the wall time of one
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, (name, err.decode(errors="replace")[-3000:])
    return dirs


def test_the_sleeping_rank_is_named(runs):
    r = run_cli("fr", "analyze", str(runs["sleeper"]), "--json")
    doc = json.loads(r.stdout)
    (st,) = doc["stragglers"]
    assert st["rank"] == 2 and doc["straggler_collectives"] == 200
    assert st["times_last"] >= 180 and 20 <= st["late_ms_median"] <= 80, st
    (f,) = [f for f in doc["findings"] if f["code"] == "fr-straggler"]
    assert f["title"].startswith("rank 2 ") and "arrived last at" in f["title"]


def test_nobody_is_named_without_a_sleeper(runs):
    a = analyze(load([runs["none"]]))
    assert a.straggler_window == 200 and a.stragglers == []


@pytest.mark.parametrize("shift_ns", [7_000_000_000, -25_000_000, -3_600_000_000_000])
def test_a_node_with_a_shifted_clock_does_not_move_the_verdict(runs, tmp_path, shift_ns):
    """Ranks 0-1 on nodeA, 2-3 on nodeB whose clock is off by ``shift_ns``."""
    for f in runs["sleeper"].glob("fr_rank*"):
        doc = pickle.loads(f.read_bytes())
        node_b = doc["rank"] >= 2
        doc["mldebug"]["host"] = "nodeB" if node_b else "nodeA"
        if node_b:
            for e in doc["entries"]:
                e["time_created_ns"] += shift_ns
        (tmp_path / f.name).write_bytes(pickle.dumps(doc))
    a = analyze(load([tmp_path]))
    assert [s.rank for s in a.stragglers] == [2], [s.to_dict() for s in a.stragglers]
    assert a.stragglers[0].host == "nodeB" and 20 <= a.stragglers[0].late_ms_median <= 80


def test_watch_on_a_live_job_names_the_sleeper_and_hang_fr_finds_its_directory(tmp_path):
    """One live job for two checks: ``fr watch``, and ``mldebug hang --fr``'s trigger
    (``mldebug.fr.collect.for_hang``) finding ranks whose MLDEBUG_FR_DIR is not the default."""
    d = tmp_path / "d"
    env = dict(os.environ, MLDEBUG_FR_DIR=str(d), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    log = tmp_path / "log"
    with open(log, "wb") as f:
        job = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
             str(REPO / "recipes" / "fr_straggler.py"), "--steps", "100000"],
            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while log.read_text(errors="replace").count(" ready") < 4:
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        time.sleep(1.0)
        r = run_cli("fr", "watch", "--dir", str(d), "--interval", "3", "--out",
                    str(tmp_path / "w"), "--timeout", "20", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        a = doc["analysis"]
        assert a["straggler_collectives"] >= 10 and [s["rank"] for s in a["stragglers"]] == [2]
        assert doc["since"]["0"] > 0  # the window starts after the first dump's collectives
        assert len(list((tmp_path / "w" / "1").iterdir())) == 4, (doc["first"], log.read_text())

        ranks = [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
        doc, analysis, _ = for_hang(FanoutOptions(), tmp_path / "hang-fr", 20.0, tmp_path / "elsewhere",
                                 pids=ranks)
        assert len(doc["files"]) == 4 and analysis is not None, doc
        assert doc["recorders_elsewhere"] == [{"dir": str(d), "ranks": [0, 1, 2, 3]}]
        assert any(f"had their recorder in {d}" in n for n in analysis.notes)
    finally:
        kill_tree(job)
