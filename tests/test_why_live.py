"""#42 item 5: the join behind ``mldebug hang``. A live hang and ``mldebug why`` on what that
hang saved (``--out``) run the same joiner on the same evidence, so they say the same: the
culprit, the class, the code, the summary and the chain. Real torchrun jobs (gloo on CPU),
real py-spy; ``why`` never reads hang's own report back as evidence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli
from jobs import torchrun

pytest.importorskip("torch")

CASES = [  # recipe, its args, extra env, hang's flags, the culprit, the readers joined
    ("fr_skipped_collective.py", ("--timeout", "120"), {"MLDEBUG_FR": "1"}, ("--fr",), [3],
     ["fr", "hang"]),
    ("hang_different_collectives.py", (), {}, (), [3], ["hang"]),
]


def _norm(chain: list[dict[str, str]], out: Path) -> list[str]:
    """The chain's sentences with the source folders said alike (hang names its fr/ folder,
    why the folder it was given)."""
    return [c["text"].replace(f"{out}/fr", str(out)) for c in chain]


@pytest.mark.parametrize(("script", "args", "env", "flags", "culprit", "readers"), CASES,
                         ids=[c[0] for c in CASES])
def test_hang_and_why_on_what_it_saved_say_the_same(tmp_path, script, args, env, flags,
                                                    culprit, readers):
    job = torchrun(script, 4, tmp_path / "log", *args, env={**os.environ, **env})
    try:
        job.wait_ready()
        out = tmp_path / "hang"
        h = run_cli("hang", "--pid", str(job.pid), *flags, "--out", str(out), "--json",
                    timeout=180)
        assert h.returncode == 0, h.stderr[-3000:]
        live = json.loads(h.stdout)["why"]
        text = run_cli("hang", "analyze", str(out))  # the saved report still reads back
        assert text.returncode == 0, text.stderr[-2000:]
    finally:
        job.stop()
    w = run_cli("why", str(out), "--json")
    assert w.returncode == 0, w.stderr[-3000:]
    dead = json.loads(w.stdout)
    assert live["verdict"]["culprits"] == culprit, live["chain"]
    for key in ("kind", "culprits", "class", "confidence", "code", "summary"):
        assert live["verdict"][key] == dead["verdict"][key], (key, live["verdict"], dead["verdict"])
    assert _norm(live["chain"], out) == _norm(dead["chain"], out)
    assert sorted(s["reader"] for s in live["sources"]) == readers
    assert sorted(s["reader"] for s in dead["sources"]) == readers  # no report read as a log
    assert any("mldebug's own output" in n for n in dead["notes"]), dead["notes"]


def test_hang_text_shows_the_join_when_the_recorder_was_joined(tmp_path):
    job = torchrun("fr_skipped_collective.py", 4, tmp_path / "log", "--timeout", "120",
                   env={**os.environ, "MLDEBUG_FR": "1"})
    try:
        job.wait_ready()
        h = run_cli("hang", "--pid", str(job.pid), "--fr", timeout=180)
        plain = run_cli("hang", "--pid", str(job.pid), "--no-fr", timeout=180)
    finally:
        job.stop()
    assert h.returncode == 0, h.stderr[-3000:]
    lines = h.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("why: rank 3: "))
    assert "never enqueued all_reduce #2 of pg 0" in lines[head], lines[head]
    assert lines[head + 1].startswith("  1. fr "), lines[head:head + 4]
    # the stacks alone: the join is hang's own verdict, said once, not twice
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert not any(line.startswith("why: ") for line in plain.stdout.splitlines()), plain.stdout


def test_why_skips_what_mldebug_wrote_and_reads_a_users_report_txt(tmp_path):
    """The class, not the example: hang --out's report (its marker beside it) and any --out
    marker are mldebug's own output; a file of the same name in a user's folder is a log."""
    crash = ("[rank1]: Traceback (most recent call last):\n"
             "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    own = tmp_path / "own"
    own.mkdir()
    (own / ".mldebug-hang").write_text("written by mldebug hang --out; --force may replace "
                                       "this directory\n")
    (own / "report.txt").write_text(crash)
    (own / "job.log").write_text("[rank0]: step 1\n")
    r = run_cli("why", str(own), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"]["culprits"] == [], doc["verdict"]
    assert any(".mldebug-hang, report.txt: mldebug's own output" in n for n in doc["notes"])
    user = tmp_path / "user"
    user.mkdir()
    (user / "report.txt").write_text(crash)
    (user / ".mldebug-hang").write_text("planted by someone else\n")  # no mldebug marker
    doc = json.loads(run_cli("why", str(user), "--json").stdout)
    assert doc["verdict"]["culprits"] == [1], doc["verdict"]
    (user / ".mldebug-hang").unlink()
    (user / ".mldebug-hang").symlink_to(own / ".mldebug-hang")  # a link is never trusted
    doc = json.loads(run_cli("why", str(user), "--json").stdout)
    assert doc["verdict"]["culprits"] == [1], doc["verdict"]
