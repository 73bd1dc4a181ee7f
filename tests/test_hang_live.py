"""mldebug hang against real hung torchrun jobs (gloo on CPU) and real py-spy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import run_cli
from jobs import RECIPES, independent_ranks, torchrun

pytestmark = pytest.mark.slow


def line_of(script: str, marker: str) -> int:
    text = (RECIPES / script).read_text().splitlines()
    return next(i for i, line in enumerate(text, 1) if marker in line)


def hang_json(*args: str) -> dict:
    r = run_cli("hang", "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def mismatch_job(tmp_path_factory):
    job = torchrun("collective_mismatch.py", 4, tmp_path_factory.mktemp("job") / "log")
    try:
        job.wait_ready()
        yield job
    finally:
        job.stop()


def signatures(report: dict) -> dict[int, list]:
    return {p["rank"]: [(f["name"], f["line"]) for f in report["stacks"][p["threads"][0]["stack"]]]
            for p in report["processes"]}


# Tests select the job with --pid: other jobs may run on this machine at the same time.
def test_collective_mismatch_names_rank0_at_the_extra_all_reduce(mismatch_job):
    report = hang_json("--pid", str(mismatch_job.pid))
    extra = line_of("collective_mismatch.py", "# extra")
    assert [s["rank"] for s in report["suspects"]] == [0]
    assert report["suspects"][0]["call_site"] == f"collective_mismatch.py:{extra} in buggy"
    groups = {tuple(g["ranks"]): g for g in report["groups"]}
    assert groups[(1, 2, 3)]["collective"] == "barrier"
    assert groups[(0,)]["collective"] == "all_reduce"
    assert report["missing_ranks"] == [] and report["errors"] == []
    p0 = next(p for p in report["processes"] if p["rank"] == 0)
    assert p0["world_size"] == 4 and p0["local_rank"] == 0 and p0["run_id"]


def test_the_job_is_left_alive_and_unchanged_after_three_runs(mismatch_job):
    job = ("--pid", str(mismatch_job.pid))
    before = signatures(hang_json(*job))
    pids = mismatch_job.rank_pids()
    for _ in range(3):
        r = run_cli("hang", *job)
        assert r.returncode == 0
        assert "Suspect: rank 0" in r.stdout
    for pid in pids.values():
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert signatures(hang_json(*job)) == before


def test_pid_of_the_launcher_finds_its_ranks_and_native_still_names_rank0(mismatch_job):
    report = hang_json("--pid", str(mismatch_job.pid), "--native")
    assert sorted(p["rank"] for p in report["processes"]) == [0, 1, 2, 3]
    assert [s["rank"] for s in report["suspects"]] == [0]
    frames = report["stacks"][report["processes"][0]["threads"][0]["stack"]]
    assert any(f["native"] for f in frames)


def test_out_then_analyze_gives_the_same_verdict(mismatch_job, tmp_path):
    out = tmp_path / "saved"
    live = hang_json("--pid", str(mismatch_job.pid), "--out", str(out))
    assert len(list((out / "dumps").glob("*.json"))) == 4
    assert (out / "report.json").exists() and "Suspect" in (out / "report.txt").read_text()
    r = run_cli("hang", "analyze", str(out), "--json")
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)
    assert again["suspects"] == live["suspects"]


def test_watch_marks_every_group_stuck(mismatch_job):
    report = hang_json("--pid", str(mismatch_job.pid), "--watch", "1")
    assert {g["state"] for g in report["groups"]} == {"stuck"}


def test_missing_py_spy_is_an_error_and_exit_code_1(mismatch_job):
    r = run_cli("hang", "--pid", str(mismatch_job.pid), "--py-spy", "/nonexistent/py-spy", "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert any("py-spy was not found" in e["error"] for e in report["errors"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged user")
def test_ptrace_denied_is_reported_with_the_fix(mismatch_job, tmp_path):
    # An unprivileged user may read other users' command lines but not ptrace them.
    env = dict(os.environ, PYTHONPATH=str(RECIPES.parent), HOME=str(tmp_path))
    tmp_path.chmod(0o777)
    import sys

    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
         "mldebug", "hang", "--all-users", "--pattern", "collective_mismatch", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    report = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    errors = [e["error"] for e in report["errors"]]
    assert errors and all("ptrace denied" in e for e in errors), errors
    assert "kernel.yama.ptrace_scope=0" in errors[0]


@pytest.mark.parametrize("script,args,suspect,needle", [
    ("hang_outside_collective.py", (), 2, "not in any collective"),
    ("hang_different_collectives.py", (), 3, "in broadcast"),
    ("hang_loop_iterations.py", ("--locals",), 0, "different iterations"),
])
def test_recipes_name_their_culprit(tmp_path, script, args, suspect, needle):
    job = torchrun(script, 4, tmp_path / "log")
    try:
        job.wait_ready()
        report = hang_json("--pid", str(job.pid), *args)
        assert [s["rank"] for s in report["suspects"]] == [suspect], report["suspects"]
        assert needle in report["suspects"][0]["reason"]
        if script == "hang_loop_iterations.py":  # without locals the stacks are identical
            plain = hang_json("--pid", str(job.pid))
            assert plain["verdict"]["kind"] == "same-place" and plain["suspects"] == []
    finally:
        job.stop()


def test_killed_rank_is_missing_and_the_others_wait_in_init(tmp_path):
    job = independent_ranks("hang_missing_rank.py", 4, tmp_path / "log")
    try:
        pids = job.wait_ready()
        psutil.Process(pids[3]).kill()
        psutil.Process(pids[3]).wait(10) if psutil.pid_exists(pids[3]) else None
        report = hang_json("--pattern", "hang_missing_rank")
        assert report["missing_ranks"] == [3]
        assert report["missing"][0]["expected_host"]
        assert {g["collective"] for g in report["groups"]} == {"init_process_group"}
        assert "Rank 3 of 4 is missing" in report["verdict"]["summary"]
        # the others are still in start-up: said so, with the node that should run it (up)
        miss = next(f for f in report["findings"] if f["code"] == "rank-not-started")
        assert "never joined" in miss["title"] and "node answered" in miss["detail"]
    finally:
        job.stop()


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "node[1-"], "cannot parse host list"),
    (["--nodes", "node1;reboot"], "invalid host name"),
    (["--pattern", "("], "not a valid regular expression"),
    (["--watch", "0"], "--watch must be a positive"),
    (["--timeout", "-1"], "--timeout must be positive"),
])
def test_usage_errors_exit_2_with_a_fix(args, needle):
    r = run_cli("hang", *args)
    assert r.returncode == 2
    assert needle in r.stderr


def test_user_selection(mismatch_job):
    report = hang_json("--pid", str(mismatch_job.pid), "--user", "root")
    assert len(report["processes"]) == 4
    r = run_cli("hang", "--pid", str(mismatch_job.pid), "--user", "nobody", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["processes"] == []
    r = run_cli("hang", "--user", "no-such-user-xyz", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["errors"][0]["error"].startswith("no user 'no-such-user-xyz'")


def test_no_job_running_exits_1_with_advice():
    r = run_cli("hang", "--pattern", "no-such-program-anywhere-xyz")
    assert r.returncode == 1
    assert "No rank processes were found" in r.stdout


def test_analyze_of_a_missing_path_is_a_usage_error(tmp_path):
    r = run_cli("hang", "analyze", str(tmp_path / "nope"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run_cli("hang", "analyze", str(tmp_path / "empty"))
    assert r.returncode == 2 and "holds no dump files" in r.stderr


def test_analyze_pasted_text_from_the_book_recipe():
    r = run_cli("hang", "analyze", str(Path(__file__).parent / "fixtures/hang/pdsh_pyspy_dump.txt"))
    assert r.returncode == 0
    assert "Suspect: gpu-node5:" in r.stdout


def test_fr_option_adds_the_flight_recorder_verdict(tmp_path):
    env = dict(os.environ, MLDEBUG_FR="1", MLDEBUG_FR_DIR=str(tmp_path / "frdir"))
    job = torchrun("collective_mismatch.py", 4, tmp_path / "log", env=env)
    try:
        job.wait_ready()
        r = run_cli("hang", "--pid", str(job.pid), "--fr", "--json", "--out",
                    str(tmp_path / "out"), env=env)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert [s["rank"] for s in report["suspects"]] == [0]
        fr = report["flight_recorder"]
        assert len(fr["files"]) == 4
        first = fr["analysis"]["mismatches"][0]
        assert first["culprit_ranks"] == [0] and first["kind"] == "type"
        assert len(list((tmp_path / "out" / "fr").iterdir())) == 4
    finally:
        job.stop()
