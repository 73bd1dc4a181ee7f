"""GPU and NCCL RAS signals (mldebug/hang/gpu.py) on recorded outputs (tests/fixtures/gpu,
written to the programs' formats: see its README): the parsers, the device-wedge and
dead-rank classes, and the node collector running replayed nvidia-smi / a hanging ncclras."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from test_hang_analyze import ALLREDUCE, BARRIER, proc

from mldebug.hang.analyze import analyze
from mldebug.hang.gpu import (
    SignalError,
    check_polls,
    parse_ras_json,
    parse_smi_csv,
    ras_findings,
    wedged_gpus,
)
from mldebug.hang.model import Collection

FIX = Path(__file__).parent / "fixtures" / "gpu"


def smi(name: str) -> list[dict]:
    return parse_smi_csv((FIX / name).read_text())


def ras(name: str) -> dict:
    return parse_ras_json((FIX / name).read_text())


def poll(smi_rows=None, ras_doc=None) -> dict:
    return {"smi": smi_rows, "ras": ras_doc, "errors": []}


def test_parsers_read_the_recorded_outputs():
    rows = smi("smi-idle.csv")
    assert [g["index"] for g in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["util"] == 0 and rows[0]["power_w"] == 71.4 and rows[4]["util"] is None
    dead = ras("ncclras-dead-rank.json")
    [comm] = dead["communicators"]
    assert comm["size"] == 4 and [r["rank"] for r in comm["ranks"]] == [0, 1, 2]
    assert comm["missing"] == [{"rank": 3, "host": "10.0.0.1", "pid": 4103,
                                "unresponsive": True, "dead": True}]
    assert comm["ranks"][0]["counts"]["AllReduce"] == 520


@pytest.mark.parametrize("text,needle", [
    ("not json", "not JSON"),
    ('{"communicators": 3}', "no communicators list"),
    ('{"communicators": [{"size": 4, "ranks": [{"rank": "x", "pid": 1}]}]}', "rank is not an integer"),
    ("[" * 100000, "not JSON"),
])
def test_garbled_ncclras_is_one_clear_error(text, needle):
    with pytest.raises(SignalError, match=needle):
        parse_ras_json(text)


@pytest.mark.parametrize("text,needle", [
    ("0, GPU-x, 100\n", "3 fields"), ("0, GPU-x, nan, 1, 2, 3\n", "finite"),
    ("-1, GPU-x, 1, 1, 2, 3\n", "index"), ("0, GPU-x, lots, 1, 2, 3\n", "not a number"),
])
def test_garbled_nvidia_smi_is_one_clear_error(text, needle):
    with pytest.raises(SignalError, match=needle):
        parse_smi_csv(text)


def test_two_polls_busy_and_flat_are_a_device_wedge_idle_is_not():
    assert wedged_gpus([poll(smi("smi-wedged-1.csv")), poll(smi("smi-wedged-2.csv"))]) == [0, 1, 2, 3]
    assert wedged_gpus([poll(smi("smi-idle.csv")), poll(smi("smi-idle.csv"))]) == []
    assert wedged_gpus([poll(smi("smi-wedged-1.csv"))]) == []  # one poll says nothing

    procs = [proc(r, ALLREDUCE) for r in range(4)]
    coll = Collection(processes=procs, gpu={"node1": [poll(smi("smi-wedged-1.csv")),
                                                      poll(smi("smi-wedged-2.csv"))]})
    report = analyze(coll)
    assert report.jobs[0].hang_class.value == "device-wedge"
    assert report.verdict.startswith("Device-side wedge: ")
    assert any(f.code == "gpu-busy-flat" for f in report.findings)
    idle = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(4)],
                              gpu={"node1": [poll(smi("smi-idle.csv")), poll(smi("smi-idle.csv"))]}))
    assert idle.jobs[0].hang_class.value == "same-collective"
    # another host's GPUs never count for this job
    other = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(4)],
                               gpu={"node9": [poll(smi("smi-wedged-1.csv")),
                                              poll(smi("smi-wedged-2.csv"))]}))
    assert other.jobs[0].hang_class.value == "same-collective"


def test_ras_dead_rank_and_ranks_behind():
    procs = [proc(r, ALLREDUCE) for r in range(3)] + [proc(3, BARRIER)]
    coll = Collection(processes=procs, gpu={"node1": [poll(ras_doc=ras("ncclras-dead-rank.json")),
                                                      poll(ras_doc=ras("ncclras-dead-rank.json"))]})
    report = analyze(coll)
    assert report.jobs[0].hang_class.value == "dead-rank"
    f = next(f for f in report.findings if f.code == "ras-missing-ranks")
    assert "rank 3 considered dead" in f.title
    behind = [poll(ras_doc=ras("ncclras-behind-1.json")), poll(ras_doc=ras("ncclras-behind-2.json"))]
    assert ras_findings(behind) == {"dead": [], "unresponsive": [],
                                    "behind": {"0x8d2a5f3c91e04b77": [2]}, "moved": False}
    report = analyze(Collection(processes=[proc(r, ALLREDUCE) for r in range(4)],
                                gpu={"node1": behind}))
    f = next(f for f in report.findings if f.code == "ras-counts-behind")
    assert "rank 2 launched fewer" in f.title and "did not move" in f.title


def test_polls_from_a_node_are_checked_again():
    good = check_polls([poll(smi("smi-idle.csv"), ras("ncclras-behind-1.json"))])
    assert good[0]["ras"]["communicators"][0]["ranks"][2]["counts"]["AllReduce"] == 639
    for bad in ("x", [1], [{"smi": [{"index": "0"}]}], [{"ras": {"communicators": [{"size": "4"}]}}]):
        with pytest.raises((SignalError, AttributeError, TypeError)):
            check_polls(bad)


def test_node_collector_polls_replayed_nvidia_smi_twice_and_bounds_a_hanging_ncclras(tmp_path):
    """nvidia-smi is asked twice (its movement is the signal); a ncclras that hangs is killed
    at its timeout, reported once, and not asked again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    (bin_dir / "nvidia-smi").write_text(  # replays the recorded polls in order
        f'#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 1)\necho $((n + 1)) > {count}\n'
        f'cat {FIX}/smi-wedged-$n.csv\n')
    ras_runs = tmp_path / "ras-runs"
    (bin_dir / "ncclras").write_text(  # a RAS that never answers
        f"#!/bin/sh\necho run >> {ras_runs}\nexec sleep 60\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        r = run_cli("hang", "--pid", str(rank.pid), "--json", env=env, timeout=120)
        report = json.loads(r.stdout)  # a lone process is no job; the signals are there
        [polls] = report["gpu"].values()
        assert [p["smi"][0]["power_w"] for p in polls] == [351.27, 352.04]  # two polls
        errors = [e["error"] for e in report["errors"]]
        assert errors == ["ncclras did not answer within 7s (killed)"], errors  # once per node
        # the second poll does not wait for the wedged ncclras again
        assert ras_runs.read_text().count("run") == 1 and polls[1]["ras"] is None
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr
    finally:
        rank.kill()
        rank.wait()
