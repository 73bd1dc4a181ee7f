"""One JSON envelope for every command (docs/json.md, mldebug.cli.envelope): each of the 15
commands' real --json output is checked against it - here for the fast ones, in the tests that
already run the slow ones (make-tiny, shrink-layers, make-tiny-dataset, numerics report, trace
show, fr trigger/watch, a live hang); a test below proves none is left out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from envelope_check import check_envelope

from mldebug.cli import COMMANDS, main
from mldebug.cli.envelope import VERSIONS, wrap

FIX = Path(__file__).parent / "fixtures"
TESTS = Path(__file__).parent


def out(capsys, *argv: str, rc: int | None = 0) -> dict:
    """The --json document of ``mldebug ARGV`` run in-process; ``rc`` None: 0 or 1 (what this
    machine runs decides: mem top with no rank process is 1)."""
    got = main(list(argv))
    assert got == rc if rc is not None else got in (0, 1), got
    return json.loads(capsys.readouterr().out)


def test_hang_analyze_keeps_its_fields_beside_the_envelope(capsys):
    doc = out(capsys, "hang", "analyze", str(FIX / "hang" / "collective_mismatch"), "--json")
    v = check_envelope(doc, "hang.analyze")
    assert doc["schema"] == "mldebug.hang.analyze/3" and doc["legacy_schema"] == "mldebug.hang/2"
    assert (v["kind"], v["culprits"], v["class"], v["confidence"]) == \
        ("suspects", [0], "desync", "high")
    assert [s["rank"] for s in doc["suspects"]] == [0] and doc["groups"]  # the old fields
    assert doc["deprecated"] == {"legacy_schema": "schema"}


def test_log_verdict_is_the_envelope_with_the_old_finding_keys_kept(capsys):
    doc = out(capsys, "log", str(FIX / "log" / "torch213-gloo-size-mismatch.log"), "--json")
    v = check_envelope(doc, "log")
    assert (v["kind"], v["culprits"], v["class"], v["code"]) == \
        ("culprits", [3], "desync", "log-size-mismatch")
    assert v["confidence"] in ("high", "medium")
    # the Finding that was the verdict: its keys stay one release, marked
    assert v["title"] == v["summary"] and v["fix"] and doc["culprits"] == [3]
    assert doc["deprecated"]["verdict.title"] == "verdict.summary"
    assert "confidence" not in doc  # moved into the verdict


def test_log_with_nothing_wrong_is_an_ok_verdict(capsys, tmp_path):
    f = tmp_path / "ok.log"
    f.write_text("[rank0]: step 1 loss 0.5\n[rank1]: step 1 loss 0.5\n")
    v = check_envelope(out(capsys, "log", str(f), "--json"), "log")
    assert v["culprits"] == [] and v["kind"] in ("ok", "problems")


def test_fr_analyze_culprit_ranks_become_the_verdict(capsys):
    doc = out(capsys, "fr", "analyze", str(FIX / "fr" / "tutorial_crash"), "--json")
    v = check_envelope(doc, "fr.analyze")
    assert v["culprits"] == doc["culprit_ranks"] == [0] and v["class"] == "outside"
    assert doc["legacy_schema"] == "mldebug.fr.analysis/1"
    assert doc["deprecated"]["culprit_ranks"] == "verdict.culprits"


def test_fr_trigger_with_nothing_to_trigger(tmp_path):
    r = run_cli("fr", "trigger", "--dir", str(tmp_path / "none"), "--timeout", "1", "--json",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 1
    check_envelope(json.loads(r.stdout), "fr.trigger", decides=False)


def test_env_and_nccl_log_decide_from_their_worst_finding(capsys):
    doc = out(capsys, "env", "--json")
    v = check_envelope(doc, "env")
    assert doc["legacy_schema"] == 1 and v["culprits"] == []
    worst = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert (v["kind"] == "ok") == (not worst)
    doc = out(capsys, "nccl-log", str(FIX / "nccl" / "mixed-cluster.log"), "--json")
    v = check_envelope(doc, "nccl-log")
    assert v["kind"] == "problems" and v["code"] == next(
        f["code"] for f in doc["findings"] if f["severity"] in ("error", "warning"))


def test_dist_test_single_process(tmp_path):
    r = run_cli("dist-test", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    v = check_envelope(doc, "dist-test")
    assert v["kind"] == "ok" and doc["ok"] is True and doc["legacy_schema"] == "mldebug.dist-test/1"


def test_mem_top_peak_probe_plot(capsys, tmp_path):
    check_envelope(out(capsys, "mem", "top", "--json", rc=None), "mem.top")
    doc = out(capsys, "mem", "peak", "--json", "--", sys.executable, "-c", "pass")
    check_envelope(doc, "mem.peak")
    check_envelope(out(capsys, "mem", "probe", "--max", "64MiB", "--step", "32MiB", "--json"),
                   "mem.probe")
    import memsnap

    snap = memsnap.write(tmp_path / "a.pickle", memsnap.training(steps=2))
    doc = out(capsys, "mem", "plot", str(snap), "-o", str(tmp_path / "p.html"), "--json")
    check_envelope(doc, "mem.plot")
    assert doc["format"] == "mldebug.mem.plot/1" and doc["deprecated"]["format"] == "schema"


def test_pdb_docs_completion(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MLDEBUG_PDB_DIR", str(tmp_path / "pdb"))
    doc = out(capsys, "pdb", "list", "--json", rc=1)  # no session open
    check_envelope(doc, "pdb.list")
    assert doc["legacy_schema"] == "mldebug.pdb.list/1"
    check_envelope(out(capsys, "docs", "hang", "--json"), "docs")
    doc = out(capsys, "completion", "bash", "--json")
    check_envelope(doc, "completion")
    assert "mldebug" in doc["script"] and doc["install"].startswith('eval "$(mldebug')


def test_numerics_verdict_string_moves_to_verdict_text():
    doc = wrap({"verdict": "no non-finite value recorded", "first": None, "findings": [],
                "records": 3}, "numerics", "report")
    v = check_envelope(doc, "numerics.report")
    assert v["kind"] == "ok" and v["summary"] == doc["verdict_text"]
    assert doc["deprecated"] == {"verdict_text":
                                 "verdict.summary (verdict was this string before schema 2)"}


def test_a_library_caller_gets_the_document_as_it_was():
    doc = {"schema": "x/1", "findings": []}
    assert subprocess.run([sys.executable, "-c", (
        "from mldebug.cli.envelope import wrap; d = {'schema': 'x/1'}; "
        "assert wrap(dict(d)) == d")], env=dict(os.environ, PYTHONPATH=str(TESTS.parent)),
        timeout=60).returncode == 0
    assert doc == {"schema": "x/1", "findings": []}


def test_every_command_and_subcommand_with_json_is_checked_somewhere():
    """Every registered command, and every key of the envelope's version table, has a
    check_envelope call on real output in a test module (this one or a slow one)."""
    said = set()
    for f in TESTS.glob("test_*.py"):
        said |= set(re.findall(r'check_envelope\((?:[^()]|\([^()]*\))*?"([a-z][a-z.-]*)"\s*'
                               r'(?:,\s*decides=\w+)?\)', f.read_text()))
    assert set(COMMANDS) <= {k.split(".")[0] for k in said}, set(COMMANDS) - said
    # fr.watch, hang (live) and the slow ones live in the modules that run them
    assert set(VERSIONS) - said == set(), set(VERSIONS) - said
    assert said <= set(VERSIONS), said - set(VERSIONS)


def test_hang_live_json_on_a_lone_rank_process(tmp_path):
    """`mldebug hang --pid P --json` on a process with rank variables (no launcher): the live
    path writes the same envelope as hang analyze."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)"],
                         env=env)
    try:
        time.sleep(0.5)
        r = run_cli("hang", "--pid", str(p.pid), "--json", timeout=120)
        assert r.returncode in (0, 1), r.stderr
        doc = json.loads(r.stdout)
        v = check_envelope(doc, "hang")
        assert v["culprits"] == sorted({s["rank"] for s in doc["suspects"]
                                        if s["rank"] is not None})
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("key", sorted(VERSIONS))
def test_docs_json_md_lists_every_schema(key):
    text = (TESTS.parent / "docs" / "json.md").read_text()
    assert f"`mldebug.{key}/{VERSIONS[key]}`" in text, key
