"""The step clock (``with mldebug.step():``, #44): what a rank writes, what the analysis
accepts from outside, and the straggler phase it gives (data / compute / communication) on
dumps and step files of simulated jobs whose timings follow a synchronous all_reduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fr_synth as synth
import pytest
from conftest import REPO

from mldebug.fr.analyze import analyze
from mldebug.fr.loader import load
from mldebug.fr.stragglers import DATA, STEP_COMMUNICATION, STEP_COMPUTE
from mldebug.stepclock import MAX_BYTES, PREFIX, RING, parse, read_beside

MS = 1_000_000


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=60)


def test_a_rank_writes_its_steps_beside_the_recorder_without_torch(tmp_path):
    code = ("import sys, time, mldebug\n"
            "for _ in range(5):\n"
            "    time.sleep(0.002)\n"
            "    with mldebug.step():\n"
            "        time.sleep(0.003)\n"
            "assert 'torch' not in sys.modules\n")
    r = _run(code, {"MLDEBUG_FR_DIR": str(tmp_path), "RANK": "3"})
    assert r.returncode == 0, r.stderr
    f = tmp_path / f"{PREFIX}3.json"
    assert (f.stat().st_mode & 0o777) == 0o600
    doc = json.loads(f.read_text())
    assert doc["rank"] == 3 and doc["steps"] == 5 and doc["clock"] == "time_ns"
    steps = parse(f.read_bytes(), 3)
    assert steps is not None and len(steps.enter) == 5
    inside = [(b - a) / MS for a, b in zip(steps.enter, steps.exit, strict=True)]
    between = [(steps.enter[i + 1] - steps.exit[i]) / MS for i in range(4)]
    assert min(inside) >= 3 and min(between) >= 2, (inside, between)
    # the dump loader never takes it for a dump (hidden)
    assert load([tmp_path]).dumps == {}


def test_without_a_directory_nothing_is_written_and_the_job_goes_on(tmp_path):
    r = _run("import mldebug\nwith mldebug.step():\n    pass\nprint('ok')\n",
             {"MLDEBUG_FR_DIR": "", "HOME": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_step_in_progress_is_left_out_and_the_ring_is_bounded():
    from mldebug.stepclock import _Clock

    c = _Clock()
    c.resolved = True  # nowhere to write
    for i in range(RING + 3):
        c.enter.append(10 + 2 * i)
        c.exit.append(11 + 2 * i)
    c.steps = RING + 3
    c.enter.append(10 + 2 * (RING + 3))
    c.inside = True
    doc = c.document()
    assert len(doc["enter"]) == len(doc["exit"]) == RING - 1
    assert all(b == a + 1 for a, b in zip(doc["enter"], doc["exit"], strict=True))


@pytest.mark.parametrize("doc", [
    {"version": 1, "rank": 0, "enter": [1, 2], "exit": [3]},  # lengths differ
    {"version": 1, "rank": 1, "enter": [1], "exit": [2]},  # another rank's
    {"version": 2, "rank": 0, "enter": [1], "exit": [2]},
    {"version": 1, "rank": 0, "enter": [5], "exit": [2]},  # exit before entry
    {"version": 1, "rank": 0, "enter": ["1"], "exit": [2]},
    {"version": 1, "rank": 0, "enter": [1.5], "exit": [2]},
    {"version": 1, "rank": 0, "enter": [True], "exit": [2]},
    {"version": 1, "rank": 0, "enter": [1 << 70], "exit": [1 << 71]},
    {"version": 1, "rank": 0, "enter": list(range(1, RING + 2)),
     "exit": list(range(2, RING + 3))},
    [1, 2, 3],
])
def test_hostile_step_files_are_refused(doc):
    assert parse(json.dumps(doc).encode(), 0) is None


def test_oversized_deep_and_linked_step_files_are_refused(tmp_path):
    assert parse(b"[" * 100_000 + b"]" * 100_000, 0) is None
    assert parse(b" " * (MAX_BYTES + 1), 0) is None
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"version": 1, "rank": 0, "enter": [1], "exit": [2]}))
    d = tmp_path / "dumps"
    d.mkdir()
    (d / f"{PREFIX}0.json").symlink_to(real)
    assert read_beside(str(d / "fr_rank0"), 0) is None  # never through a link
    (d / f"{PREFIX}1.json").write_text(real.read_text().replace('"rank": 0', '"rank": 1'))
    assert read_beside(str(d / "fr_rank1"), 1) is not None


def _sim(kind: str, world: int = 4, late: int = 2, n: int = 40, per_step: int = 1,
         extra_ms: float = 15.0) -> tuple[dict[int, dict], dict[int, dict]]:
    """Dumps (enqueue times only, as gloo records) and step files of a job whose every step
    reads a batch (20 ms), computes (20 ms) and all_reduces ``per_step`` times; a
    collective completes 2 ms after its last member enqueued it. Rank ``late``'s ``kind``
    (data, compute, comm: its first all_reduce returns later) takes ``extra_ms`` longer."""
    exit_prev = {r: 1_700_000_000_000 * MS + r * 13_001 for r in range(world)}
    entries: dict[int, list] = {r: [] for r in range(world)}
    steps: dict[int, dict] = {r: {"enter": [], "exit": []} for r in range(world)}
    seq = 0
    for k in range(n):
        jitter = [(k * 7 + r * 3) % 5 * 0.2 * MS for r in range(world)]
        enter = {r: exit_prev[r] + 20 * MS + jitter[r]
                 + (extra_ms * MS if kind == "data" and r == late else 0) for r in range(world)}
        t = {r: enter[r] + 20 * MS + (extra_ms * MS if kind == "compute" and r == late else 0)
             for r in range(world)}
        for j in range(per_step):
            seq += 1
            done = max(t.values()) + 2 * MS
            for r in range(world):
                e = synth.entry(seq, sizes=((4 + j,),), backend="gloo", state="scheduled")
                e["time_created_ns"] = int(t[r])
                e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = None
                entries[r].append(e)
                t[r] = done + (extra_ms * MS if kind == "comm" and r == late and j == 0
                               else 0) + 0.5 * MS
        for r in range(world):
            steps[r]["enter"].append(int(enter[r]))
            steps[r]["exit"].append(int(t[r] + MS))
            exit_prev[r] = t[r] + MS
    dumps = {r: synth.dump(r, entries[r], world=world) for r in range(world)}
    files = {r: {"version": 1, "rank": r, "steps": n, **steps[r]} for r in range(world)}
    return dumps, files


def _analyze(tmp_path: Path, kind: str, with_steps: bool = True, **kw):
    dumps, files = _sim(kind, **kw)
    synth.write(tmp_path, dumps, prefix="fr_rank")
    if with_steps:
        for r, doc in files.items():
            (tmp_path / f"{PREFIX}{r}.json").write_text(json.dumps(doc))
    return analyze(load([tmp_path]))


@pytest.mark.parametrize("per_step", [1, 3])
@pytest.mark.parametrize(("kind", "phase"), [("data", DATA), ("compute", STEP_COMPUTE),
                                             ("comm", STEP_COMMUNICATION)])
def test_the_step_clock_names_the_slow_phase(tmp_path, kind, phase, per_step):
    a = _analyze(tmp_path, kind, per_step=per_step)
    assert [s.rank for s in a.stragglers] == [2], [s.to_dict() for s in a.stragglers]
    st = a.stragglers[0]
    assert st.phase == phase, st.to_dict()
    assert 10 <= st.late_ms_median <= 20, st.to_dict()  # behind the others by the 15 ms
    assert st.step_ms is not None and st.step_ms_without is not None
    assert st.step_ms - st.step_ms_without == pytest.approx(st.late_ms_median, rel=0.3)
    assert not [f for f in a.findings if f.severity.name == "ERROR"]
    f = next(f for f in a.findings if f.code == "fr-straggler")
    assert phase in f.title and "step clock" in f.detail


def test_without_the_step_clock_gloo_dumps_cannot_tell(tmp_path):
    a = _analyze(tmp_path, "data", with_steps=False)
    assert [s.rank for s in a.stragglers] == [2] and "cannot tell" in a.stragglers[0].phase
    assert a.stragglers[0].data_ms is None


def test_an_even_job_with_step_clocks_names_nobody(tmp_path):
    a = _analyze(tmp_path, "even", world=2, per_step=3)
    assert a.stragglers == [] and a.straggler_window == 120
