"""Real torchrun jobs (gloo, CPU) that capture their own hang: the watchdog's dumps give the
verdict of a live `mldebug hang`, the ring names the branch, dump+abort fails the job with
code 54 (also with the GIL held), a GIL-holding C call is dumped by faulthandler, dump+continue dumps again, and with
ptrace forbidden `mldebug hang --signal` names the culprit where `mldebug hang` cannot."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from jobs import torchrun

RECIPE = "capture_rank_branch.py"


def job_env(tmp: Path, **kw: str) -> dict[str, str]:
    return dict(os.environ, MLDEBUG_DIR=str(tmp / "cap"), **kw)


def wait_files(d: Path, n: int, timeout: float = 90, pred=lambda doc: True) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        docs = []
        for f in d.glob("*.json") if d.is_dir() else ():
            try:
                docs.append(json.loads(f.read_text()))
            except ValueError:
                continue
        if len(docs) >= n and all(pred(x) for x in docs):
            return docs
        time.sleep(0.5)
    raise AssertionError(f"{n} files in {d} not there in {timeout}s: {list(d.glob('*'))}")


def report(*args: str, runner=run_cli) -> dict:
    r = runner(*args, "--json")
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def test_watchdog_dump_gives_the_live_verdict_and_trace_show_names_the_branch(tmp_path):
    job = torchrun(RECIPE, 3, tmp_path / "log", env=job_env(tmp_path, STALL_TIMEOUT="3"))
    try:
        job.wait_ready(settle=0)
        cap = tmp_path / "cap"
        wait_files(cap / "dumps", 3)
        wait_files(cap / "trace", 3)
        saved = report("hang", "analyze", str(cap))
        live = report("hang", "--pid", str(job.pid))
        assert [s["rank"] for s in saved["suspects"]] == [2], saved["suspects"]
        assert saved["suspects"] == live["suspects"]
        assert saved["verdict"] == live["verdict"]
        trace = report("trace", "show", str(cap))
        [div] = trace["divergences"]
        assert div["ranks"] == [2] and div["others"] == [0, 1]
        assert div["branch"]["text"] == "if rank == hang_rank and step == hang_step:"
        assert div["left_at"]["text"] == "validate(step)"
    finally:
        job.stop()


def test_dump_and_abort_fails_the_job_with_the_stall_exit_code(tmp_path):
    job = torchrun(RECIPE, 2, tmp_path / "log",
                   env=job_env(tmp_path, STALL_TIMEOUT="2", ON_STALL="dump+abort", HANG_RANK="1"))
    try:
        job.procs[0].wait(timeout=120)
        text = job.text()
        assert job.procs[0].returncode != 0
        assert re.search(r"exitcode\s*:\s*54", text), text[-2000:]
        assert "on_stall=dump+abort: exiting with code 54" in text
        assert list((tmp_path / "cap" / "dumps").glob("*rank1-*.json"))
    finally:
        job.stop()


def test_dump_and_abort_with_the_gil_held_fails_the_job_with_the_same_code(tmp_path):
    # rank 1 holds the GIL in a C call: no Python runs there, the kernel timer aborts it;
    # rank 0 installs no watchdog, so the only exit code torchrun sees is rank 1's
    job = torchrun(RECIPE, 2, tmp_path / "log",
                   env=job_env(tmp_path, STALL_TIMEOUT="2", ON_STALL="dump+abort", HANG_RANK="1",
                               NO_HANDLER_RANK="0", BLOCK="gil", GIL_SECONDS="120"))
    try:
        job.procs[0].wait(timeout=60)  # well before GIL_SECONDS: the abort, not the C call
        text = job.text()
        from mldebug.capture import STALL_EXIT_CODE

        assert STALL_EXIT_CODE == 54
        assert re.search(r"rank\s*:\s*1 .*\n\s*exitcode\s*:\s*54 ", text), text[-2000:]
        assert "exiting with code" not in text and "will exit with code 1" not in text
        [raw] = (tmp_path / "cap" / "faulthandler").glob("*-rank1-*.gil.txt")
        assert 'in hold_gil\n' in raw.read_text() and 'in validate\n' in raw.read_text()
        # no Python ran after the dump: hang analyze reads faulthandler's text itself
        saved = report("hang", "analyze", str(tmp_path / "cap"))
        [proc] = saved["processes"]
        assert proc["rank"] == 1 and saved["groups"][0]["where"].startswith("hold_gil (")
    finally:
        job.stop()


def test_gil_held_rank_known_only_by_faulthandler_text_gets_the_live_verdict(tmp_path):
    # rank 2 holds the GIL for longer than the test: its stacks exist only as faulthandler's
    # text in cap/faulthandler/, the others' as JSON; the analysis must match a live hang
    env = job_env(tmp_path, STALL_TIMEOUT="2", BLOCK="gil", GIL_SECONDS="120")
    job = torchrun(RECIPE, 3, tmp_path / "log", env=env)
    try:
        job.wait_ready(settle=0)
        cap = tmp_path / "cap"
        wait_files(cap / "dumps", 2)
        deadline = time.monotonic() + 60
        while not any(f.stat().st_size for f in (cap / "faulthandler").glob("*.gil.txt")):
            assert time.monotonic() < deadline, list((cap / "faulthandler").iterdir())
            time.sleep(0.5)
        assert not list((cap / "dumps").glob("*-rank2-*.json"))
        saved = report("hang", "analyze", str(cap))
        live = report("hang", "--pid", str(job.pid))
        assert [s["rank"] for s in saved["suspects"]] == [2], saved["verdict"]
        # the same culprit, place and verdict kind; the live run alone has the /proc samples
        # (faulthandler's text carries none), so only it can say "blocked" instead of
        # "outside any collective"
        keys = ("rank", "host", "pid", "call_site", "job")
        assert [{k: s[k] for k in keys} for s in saved["suspects"]] == \
            [{k: s[k] for k in keys} for s in live["suspects"]]
        assert live["suspects"][0]["reason"].startswith(saved["suspects"][0]["reason"] + "; ")
        assert saved["suspects"][0]["activity"] is None
        assert live["suspects"][0]["activity"] in ("blocked", "spinning")
        assert saved["verdict"]["kind"] == live["verdict"]["kind"] == "suspects"
        assert saved["verdict"]["class"] == "outside-collective"
        assert live["verdict"]["class"] == live["suspects"][0]["activity"]
        assert sorted(p["rank"] for p in saved["processes"]) == [0, 1, 2]
    finally:
        job.stop()


def test_gil_held_rank_dumped_by_faulthandler_and_continue_dumps_again(tmp_path):
    env = job_env(tmp_path, STALL_TIMEOUT="2", ON_STALL="dump+continue", BLOCK="gil",
                  GIL_SECONDS="10")
    job = torchrun(RECIPE, 3, tmp_path / "log", env=env)
    try:
        job.wait_ready(settle=0)
        dumps = tmp_path / "cap" / "dumps"
        docs = wait_files(dumps, 3, pred=lambda d: d["identity"]["rank"] == 2
                          or d["dump_later"] is not None)
        by_rank = {d["identity"]["rank"]: d for d in docs}
        held = by_rank[2]
        assert held["capture"]["route"] == "faulthandler", held["capture"]
        main = next(t for t in held["dump"] if t["thread_name"] == "MainThread")
        assert [f["name"] for f in main["frames"][:2]] == ["hold_gil", "validate"]
        for r in (0, 1):
            assert by_rank[r]["capture"]["route"] == "python"
            assert by_rank[r]["capture"]["stalled_for"] >= 4  # the 2x dump (4x follows)
        saved = report("hang", "analyze", str(tmp_path / "cap"))
        assert [s["rank"] for s in saved["suspects"]] == [2]
    finally:
        job.stop()


def run_without_ptrace(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as root but without CAP_SYS_PTRACE (what a container without SYS_PTRACE is)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = " ".join([sys.executable, "-m", "mldebug", *args])
    return subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", cmd],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("capsh") is None,
                    reason="needs root and capsh to drop CAP_SYS_PTRACE")
def test_signal_names_the_culprit_where_ptrace_is_forbidden(tmp_path):
    # the ranks make themselves non-dumpable (prctl(PR_SET_DUMPABLE, 0)); mldebug runs
    # without CAP_SYS_PTRACE: py-spy cannot attach, /proc/PID/environ cannot be read
    job = torchrun(RECIPE, 4, tmp_path / "log",
                   env=job_env(tmp_path, STALL_TIMEOUT="600", NO_PTRACE="1"))
    try:
        job.wait_ready()
        plain = report("hang", "--pattern", RECIPE, runner=run_without_ptrace)
        errors = [e["error"] for e in plain["errors"]]
        assert plain["suspects"] == [] and errors
        assert all("ptrace denied" in e and "mldebug hang --signal" in e for e in errors), errors
        sig = report("hang", "--signal", "--pattern", RECIPE, "--timeout", "10",
                     runner=run_without_ptrace)
        assert [s["rank"] for s in sig["suspects"]] == [2], sig
        assert "not in any collective" in sig["suspects"][0]["reason"]
        assert sorted(p["rank"] for p in sig["processes"]) == [0, 1, 2, 3]
        assert all(job.procs[0].poll() is None for _ in (0,))  # the job still runs
    finally:
        job.stop()


def test_dump_and_abort_keeps_every_ranks_dump_when_the_culprit_dumps_last(tmp_path):
    # the culprit's watchdog fires 4s after the others': without the evidence barrier the
    # others exit with 54 first and torchrun kills rank 1 before it writes its dump. The issue
    # asks for 10 runs in a row; 2 here (each a 4-rank torchrun on a shared 2-CPU machine).
    for attempt in range(2):
        cap = tmp_path / f"cap{attempt}"
        env = dict(os.environ, MLDEBUG_DIR=str(cap), STALL_TIMEOUT="2", HANG_RANK_TIMEOUT="6",
                   ON_STALL="dump+abort", HANG_RANK="1", HANG_STEP="1")
        job = torchrun(RECIPE, 4, tmp_path / f"log{attempt}", env=env)
        try:
            job.procs[0].wait(timeout=240)
            text = job.text()
            assert re.search(r"exitcode\s*:\s*54", text), text[-3000:]
            ranks = sorted(int(m) for f in (cap / "dumps").glob("*.json")
                           for m in re.findall(r"-rank(\d+)-", f.name))
            assert ranks == [0, 1, 2, 3], (attempt, ranks, text[-3000:])
            # the last rank to dump writes its note and exits; torchrun may then SIGTERM the
            # others before they write theirs: at least that one, and none missing anything
            notes = [json.loads(f.read_text()) for f in (cap / "abort").glob("*.exit")]
            assert notes and all(n["missing"] == [] for n in notes), notes
            assert "no dump from" not in text
            saved = report("hang", "analyze", str(cap))
            assert [s["rank"] for s in saved["suspects"]] == [1], saved["suspects"]
            assert saved["errors"] == []
            # every rank's ring was written with its dump: trace show misses none of the 4
            trace = report("trace", "show", str(cap))
            assert trace["world_size"] == 4 and trace["missing"] == [], trace["missing"]
            assert sorted(r["rank"] for r in trace["ranks"]) == [0, 1, 2, 3]
        finally:
            job.stop()


def test_abort_barrier_names_a_rank_that_died_before_its_dump(tmp_path):
    # a real member that exited without a dump: the barrier does not wait for it, its note
    # says so, and hang analyze turns the note into an error naming the rank and why
    from mldebug.capture.evidence import Barrier
    from mldebug.privdir import private_dir

    root = private_dir(tmp_path / "cap")
    fh, dumps = private_dir(root / "faulthandler"), private_dir(root / "dumps")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = Barrier(root, f"vm-rank1-{dead.pid}", {"rank": 1, "run_id": "r"}, dead.pid, fh, dumps)
    me = Barrier(root, f"vm-rank0-{os.getpid()}", {"rank": 0, "run_id": "r"}, os.getpid(),
                 fh, dumps)
    other_run = Barrier(root, "vm-rank1-1", {"rank": 1, "run_id": "older"}, 1, fh, dumps)
    assert other_run.run_id == "older"
    start = time.monotonic()
    note = me.wait(deadline_s=20)
    assert time.monotonic() - start < 10  # nobody alive to wait for
    assert note["dumped"] == ["rank 0"]
    assert note["missing"] == [{"rank": 1, "pid": dead.pid,
                                "why": "exited (or was killed) before writing a dump"}]
    assert gone.stem in {p.stem for p in (root / "abort").glob("*.member")}
    # rank 0's dump, as the watchdog writes it, then analyze the directory
    (dumps / f"{me.stem}.json").write_text(json.dumps({
        "format": "mldebug.hang.dump/1", "host": "vm", "pid": os.getpid(),
        "identity": {"rank": 0, "world_size": 2, "run_id": "r"},
        "dump": [{"pid": os.getpid(), "thread_id": 1, "thread_name": "MainThread",
                  "os_thread_id": os.getpid(), "active": False, "owns_gil": False,
                  "frames": [{"name": "main", "filename": "/x/train.py", "module": None,
                              "short_filename": "train.py", "line": 3, "locals": None}]}]}))
    saved = report("hang", "analyze", str(root))
    errs = [e["error"] for e in saved["errors"]]
    assert any(e.startswith(f"rank 1 (pid {dead.pid}) has no dump: exited (or was killed) "
                            "before writing a dump (rank 0 waited") for e in errs), errs
    assert saved["missing_ranks"] == [1]
