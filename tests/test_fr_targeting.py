"""`mldebug fr trigger` / `fr watch` --pid / --job with two real jobs (torchrun, gloo) of the
same user recording into the same directory: only the selected job's ranks dump."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli
from envelope_check import check_envelope
from jobs import torchrun

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def trigger(*args: str) -> tuple[int, dict]:
    r = run_cli("fr", "trigger", *args, "--timeout", "90", "--json", timeout=300)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {"stderr": r.stderr})


def test_fr_trigger_and_watch_with_pid_or_job_dump_only_that_job(tmp_path):
    frdir = tmp_path / "fr"
    env = dict(os.environ, MLDEBUG_FR="1", MLDEBUG_FR_DIR=str(frdir))
    a = torchrun("collective_mismatch.py", 2, tmp_path / "a.log", env=env)
    b = torchrun("collective_mismatch.py", 2, tmp_path / "b.log", env=env)
    try:
        pids_a = a.wait_ready(settle=0)
        pids_b = b.wait_ready(settle=1.5)
        rc, doc = trigger("--dir", str(frdir), "--out", str(tmp_path / "t-a"), "--pid", str(a.pid))
        assert rc == 0, doc
        assert len(doc["files"]) == 2, doc  # job A's two ranks, not job B's
        check_envelope(doc, "fr.trigger", decides=False)  # no --analyze: nothing decided
        # --job KEY, with the key mldebug hang prints for job B
        hang = json.loads(run_cli("hang", "--pid", str(b.pid), "--json").stdout)
        assert check_envelope(hang, "hang")["culprits"] == [s["rank"] for s in hang["suspects"]]
        key = hang["jobs"][0]["key"]
        rc, doc = trigger("--dir", str(frdir), "--out", str(tmp_path / "t-b"), "--job", key)
        assert rc == 0 and len(doc["files"]) == 2, doc
        # without a selection both jobs dump (what the flags prevent)
        rc, doc = trigger("--dir", str(frdir), "--out", str(tmp_path / "t-all"))
        assert rc == 0 and len(doc["files"]) == 4, doc
        # ... and an analysis of both says it mixes jobs, naming them and the fix
        r = run_cli("fr", "trigger", "--dir", str(frdir), "--out", str(tmp_path / "t-mix"),
                    "--analyze", "--timeout", "90", timeout=300)
        assert "mldebug fr: note: rank processes of" in r.stderr, r.stderr
        assert "jobs run on this host" in r.stderr and "--job KEY" in r.stderr
        # fr watch takes the same selection
        r = run_cli("fr", "watch", "--dir", str(frdir), "--out", str(tmp_path / "w"),
                    "--interval", "0.5", "--pid", str(b.pid), "--timeout", "90", "--json",
                    timeout=400)
        assert r.returncode == 0, r.stderr
        w = json.loads(r.stdout)
        assert len(w["second"]["files"]) == 2, w
        assert check_envelope(w, "fr.watch")["culprits"] == w["analysis"]["culprit_ranks"]
        # a selection that finds nothing is one line with the fix, not every job
        r = run_cli("fr", "trigger", "--dir", str(frdir), "--job", "no-such-job")
        assert r.returncode == 1 and "no rank process of job 'no-such-job'" in r.stderr
        assert "Traceback" not in r.stderr
        assert sorted(pids_a) == sorted(pids_b) == [0, 1]
    finally:
        a.stop()
        b.stop()
