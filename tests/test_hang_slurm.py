"""mldebug hang --slurm-job against a real (one-node) SLURM: srun --overlap into a running job,
with py-spy and with --signal (the ranks' own dump handlers).

SLURM is optional here: the test skips when the daemons cannot start (set
MLDEBUG_REQUIRE_SLURM=1 to make that a failure). .ci/run installs the packages.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest
from conftest import run_cli
from jobs import RECIPES, REPO, torchrun
from slurm import LocalSlurm, SlurmUnavailable

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    s = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        s.start()
    except (SlurmUnavailable, OSError) as e:
        s.stop()
        if os.environ.get("MLDEBUG_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLURM required but unavailable: {e}")
        pytest.skip(f"SLURM unavailable: {e}")
    yield s
    s.stop()


def test_slurm_job_names_the_culprit_and_ignores_other_jobs(slurm, tmp_path):
    out = tmp_path / "job.out"
    job = slurm.sbatch(f"{sys.executable} -m torch.distributed.run --standalone "
                       f"--nproc_per_node 4 {RECIPES / 'collective_mismatch.py'}", out)
    other = torchrun("hang_outside_collective.py", 2, tmp_path / "other.log")  # not in SLURM
    try:
        deadline = time.monotonic() + 180
        while len(re.findall(r"rank \d pid \d+ ready", out.read_text() if out.exists() else "")) < 4:
            assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
            time.sleep(0.5)
        other.wait_ready()
        r = run_cli("hang", "--slurm-job", job, "--json", env=slurm.env())
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert sorted(p["rank"] for p in report["processes"]) == [0, 1, 2, 3]
        assert all("collective_mismatch" in " ".join(p["cmdline"]) for p in report["processes"])
        assert [s["rank"] for s in report["suspects"]] == [0]
        r = run_cli("hang", "--slurm-job", "999999", "--json", env=slurm.env())
        assert r.returncode == 1
        assert "srun" in json.loads(r.stdout)["errors"][0]["error"]
    finally:
        slurm.scancel(job)
        other.stop()


def test_leftovers_of_earlier_runs_cannot_share_a_job_id(slurm, tmp_path):
    # FirstJobId is random per cluster start: ids from an earlier run's leftovers differ
    job = slurm.sbatch("sleep 60", tmp_path / "o")
    try:
        assert int(job) >= 100_000
    finally:
        slurm.scancel(job)


def test_signal_slurm_job_names_the_culprit_from_the_ranks_own_dumps(slurm, tmp_path):
    # every rank runs mldebug.watchdog() (its timeout far away: only the signal dumps); rank 2
    # is stuck outside the all_reduce the others wait in
    out = tmp_path / "job.out"
    job = slurm.sbatch(f"env PYTHONPATH={REPO} MLDEBUG_DIR={tmp_path / 'cap'} STALL_TIMEOUT=600 "
                       f"{sys.executable} -m torch.distributed.run --standalone "
                       f"--nproc_per_node 3 {RECIPES / 'capture_rank_branch.py'}", out)
    try:
        deadline = time.monotonic() + 120
        while len(re.findall(r"rank \d pid \d+ ready", out.read_text() if out.exists() else "")) < 3:
            assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
            time.sleep(0.5)
        time.sleep(1)  # rank 2 reaches validate(), the others the all_reduce
        r = run_cli("hang", "--signal", "--slurm-job", job, "--timeout", "10", "--json",
                    env=slurm.env())
        report = json.loads(r.stdout)
        assert sorted(p["rank"] for p in report["processes"]) == [0, 1, 2], report["errors"]
        assert [s["rank"] for s in report["suspects"]] == [2], report["verdict"]
        assert "validate" in report["suspects"][0]["call_site"]
        dumps = sorted(p.name for p in (tmp_path / "cap" / "dumps").glob("*.json"))
        assert len(dumps) == 3, dumps  # the stacks came from the ranks' handlers, not py-spy
        assert all(json.loads((tmp_path / "cap" / "dumps" / d).read_text())["capture"]["reason"]
                   == "signal" for d in dumps)
    finally:
        slurm.scancel(job)
