"""Analysis of real torch-written dumps kept as fixtures (tests/fixtures/fr/README.md)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from conftest import run_cli

from mldebug.fr.analyze import analyze, describe
from mldebug.fr.loader import load

FIX = Path(__file__).parent / "fixtures" / "fr"


def test_tutorial_crash_tie_is_decided_by_call_sites():
    a = analyze(load([FIX / "tutorial_crash"]))
    (m,) = a.mismatches
    assert (m.kind, m.seq, m.culprit_ranks, m.began_at) == ("missing", 5, [0], 3)
    assert "decided by the call sites" in m.reasoning
    assert "fr_tutorial_crash.py:45, a line that issued no other collective" in m.reasoning
    assert a.culprits == [0]
    (err,) = [f for f in a.findings if f.severity.value == "error"]
    assert err.code == "fr-missing" and "culprit rank(s) 0" in err.title


def test_tutorial_crash_without_frames_stays_an_open_tie(tmp_path):
    """Without call sites nothing decides it: the report says so instead of guessing."""
    for f in (FIX / "tutorial_crash").iterdir():
        doc = pickle.loads(f.read_bytes())
        for e in doc["entries"]:
            e["frames"] = []
        (tmp_path / f.name).write_bytes(pickle.dumps(doc))
    (m,) = analyze(load([tmp_path])).mismatches
    assert m.culprit_ranks == [1] and "a tie" in m.reasoning


def test_uneven_all_gather_pickle_and_json_agree():
    for sub in ("pickle", "json"):
        a = analyze(load([FIX / "uneven_all_gather" / sub]))
        (m,) = a.mismatches
        assert (m.kind, m.seq, m.culprit_ranks) == ("missing", 3, [1]), (sub, m.to_dict())
        assert m.groups[0].description == "all_gather in=[[2]] out=[[3,2]] Float", sub
        assert [lag.rank for lag in a.lagging] == [1], sub  # JSON: pg_status numbers are strings


def test_string_dtypes_are_never_split_into_characters(tmp_path):
    """A dtype field written as one string ('float32') stays one dtype."""
    for f in (FIX / "uneven_all_gather" / "json").iterdir():
        doc = json.loads(f.read_text())
        for e in doc["entries"]:
            e["input_dtypes"] = "float32"
            e["output_dtypes"] = ["float32"]
        (tmp_path / f.name).write_text(json.dumps(doc))
    ds = load([tmp_path])
    e = ds.entries_of(0)[-1]
    assert e.input_dtypes == ("float32",) and describe(e).endswith(" float32")
    r = run_cli("fr", "analyze", str(tmp_path), env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "float32" in r.stdout and "2/3/a/f/l/o/t" not in r.stdout
