"""The HTML views and trace-event files without a job: nothing from a dump is executed or
injected, nothing is loaded from the network, output files follow the safety rules, and the
trace-event JSON has the documented fields. Browser checks use headless Chromium."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
from pathlib import Path

import fr_synth as synth
import pytest
from browser import chromium, open_view, severe, text
from conftest import run_cli
from trace_event_schema import validate

from mldebug.errors import MldebugError, UsageError
from mldebug.fr.analyze import analyze
from mldebug.fr.loader import from_docs
from mldebug.fr.traceevent import fr_trace
from mldebug.fr.view import fr_html
from mldebug.htmlview import GENERATOR, embed, esc, write_file

EVIL = "</script><script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>"


def _evil_dumps(d: Path) -> Path:
    """Rank 1 issues an extra all_reduce from a frame whose name, file and host are hostile."""
    frames = [{"name": EVIL, "filename": f"/job/{EVIL}.py", "line": 7},
              {"name": "main", "filename": "http://evil.example/x.py", "line": 1}]
    job = synth.spmd_job(4, 30, fault="extra", culprit=1, at=20)
    for e in job[1]["entries"]:
        e["frames"] = frames
        e["process_group"] = ("0", "default_pg")
    for r, doc in job.items():
        doc["mldebug"] = {"host": f"node{r}{EVIL}" if r == 1 else f"node{r}"}
    synth.write(d, job)
    return d


def _external_refs(html: str) -> list[str]:
    """Anything that would make a browser reach out: URLs in src/href, CSS url()/@import,
    fetch/XHR/WebSocket/EventSource, a second script tag."""
    found = re.findall(r"(?i)<[a-z][^>]*\b(?:src|href|action|srcset|poster)\s*=", html)
    found += re.findall(r"(?i)https?:\/\/|\/\/[a-z0-9.-]+\.[a-z]{2,}\/", html)
    found += re.findall(r"(?i)@import|url\(|\bfetch\(|XMLHttpRequest|WebSocket|EventSource"
                        r"|sendBeacon|<link|<iframe|<object|<embed", html)
    if html.lower().count("<script") != 1:
        found.append(f"{html.lower().count('<script')} script tags")
    return found


def test_embed_and_esc_leave_nothing_that_closes_a_script_or_spells_a_url():
    blob = embed({"a": EVIL + " http://x/ & \u2028"})
    assert "<" not in blob and ">" not in blob and "&" not in blob and "://" not in blob
    assert json.loads(blob) == {"a": EVIL + " http://x/ & \u2028"}
    assert esc(EVIL) == ("&lt;&#47;script&gt;&lt;script&gt;window.__pwned=1&lt;&#47;script&gt;"
                         "&lt;img src=x onerror=window.__pwned=2&gt;")


def test_fr_view_of_hostile_dumps_executes_nothing_and_loads_nothing(tmp_path):
    d = _evil_dumps(tmp_path / "d")
    out = tmp_path / "fr.html"
    r = run_cli("fr", "analyze", str(d), "--html", str(out), "--trace-event",
                str(tmp_path / "fr.json"))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert _external_refs(html) == [], _external_refs(html)
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    with chromium() as b:
        open_view(b, out)
        assert b.execute_script("return window.__pwned === undefined")
        assert b.find_elements("css selector", "img") == []
        assert severe(b) == []
        card = text(b, "#mismatch0")
        assert "culprit rank(s) 1" in card  # the frame name is shown as text, not run ...
        assert "<script>window.__pwned=1</script>" in card
        assert b.execute_script("return document.scripts.length") == 1
        assert b.execute_script(
            "return document.getElementById('mismatch0').title.includes("
            "'<script>window.__pwned=1</script>')")  # ... with the call site on hover
        labels = text(b, "#labels .lbl")
        assert "rank 1" in labels and "</script>" in labels  # the host name, as text
        b.save_screenshot(str(tmp_path / "evil.png"))
    validate(json.loads((tmp_path / "fr.json").read_text()))


def test_trace_event_of_a_synthetic_job_has_one_process_per_rank_and_flows(tmp_path):
    ds = from_docs((f"fr_rank{r}", d) for r, d in synth.spmd_job(4, 12, fault="size",
                                                                  culprit=3, at=9).items())
    doc = json.loads(fr_trace(ds, analyze(ds)))
    validate(doc)
    assert doc["otherData"]["generator"] == GENERATOR
    procs = sorted(e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name")
    assert procs == [0, 1, 2, 3]
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 4 * 12
    assert sum(e["ph"] == "s" for e in doc["traceEvents"]) == 12  # one flow per collective
    assert sum(e["ph"] == "t" for e in doc["traceEvents"]) == 12 * 2


def test_the_validator_rejects_what_the_format_forbids():
    good = {"traceEvents": [{"name": "a", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}]}
    validate(good)
    for bad in ({"name": "a", "ph": "X", "ts": 0, "pid": 0, "tid": 0},  # no dur
                {"name": "a", "ph": "X", "dur": 1, "pid": 0, "tid": 0},  # no ts
                {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {}},
                {"name": "f", "ph": "s", "ts": 0, "pid": 0, "tid": 0, "cat": "c"}):  # no id
        with pytest.raises(AssertionError):
            validate({"traceEvents": [*good["traceEvents"], bad]})
    with pytest.raises(AssertionError):  # a flow with no slice around it
        validate({"traceEvents": [*good["traceEvents"],
                                  {"name": "f", "ph": "s", "id": 1, "cat": "c", "ts": 9,
                                   "pid": 0, "tid": 0},
                                  {"name": "f", "ph": "f", "id": 1, "cat": "c", "ts": 9,
                                   "pid": 0, "tid": 0, "bp": "e"}]})


def test_perfetto_trace_processor_loads_the_trace_event_file(tmp_path):
    """Perfetto's Python package needs its trace_processor_shell binary, which it downloads on
    first use; offline that fails, so the test runs only where one is given."""
    tp_mod = pytest.importorskip("perfetto.trace_processor")
    shell = os.environ.get("MLDEBUG_TRACE_PROCESSOR")
    if not shell or not Path(shell).exists():
        pytest.skip("no trace_processor_shell binary (MLDEBUG_TRACE_PROCESSOR); the perfetto "
                    "package downloads it, which needs the network")
    ds = from_docs((f"fr_rank{r}", d) for r, d in synth.spmd_job(3, 10).items())
    f = tmp_path / "t.json"
    f.write_text(fr_trace(ds, analyze(ds)))
    tp = tp_mod.TraceProcessor(trace=str(f), config=tp_mod.TraceProcessorConfig(bin_path=shell))
    try:
        n = next(iter(tp.query("select count(*) as n from slice"))).n
        assert n == 30
    finally:
        tp.close()


def test_an_existing_output_is_refused_without_force_and_replaced_only_if_ours(tmp_path):
    d = synth.write(tmp_path / "d", synth.spmd_job(2, 5))[0].parent
    theirs = tmp_path / "notes.html"
    theirs.write_text("my notes")
    r = run_cli("fr", "analyze", str(d), "--html", str(theirs))
    assert r.returncode == 2 and "already exists" in r.stderr and "--force" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr
    r = run_cli("fr", "analyze", str(d), "--html", str(theirs), "--force")
    assert r.returncode == 2 and "not written by mldebug" in r.stderr
    assert theirs.read_text() == "my notes"
    ours = tmp_path / "v.html"
    assert run_cli("fr", "analyze", str(d), "--html", str(ours)).returncode == 0
    first = ours.read_text()
    assert run_cli("fr", "analyze", str(d), "--html", str(ours), "--force").returncode == 0
    assert ours.read_text() == first
    link = tmp_path / "link.html"
    link.symlink_to(ours)
    r = run_cli("fr", "analyze", str(d), "--html", str(link), "--force")
    assert r.returncode == 2 and "symbolic link" in r.stderr
    assert not list(tmp_path.glob(".*.tmp-*"))  # no temporary file left behind


def test_unwritable_directory_and_empty_dumps_are_one_clear_line(tmp_path):
    d = synth.write(tmp_path / "d", synth.spmd_job(2, 5))[0].parent
    r = run_cli("fr", "analyze", str(d), "--html", str(tmp_path / "nodir" / "v.html"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(ro)],
                       capture_output=True, text=True)
    if m.returncode == 0:
        try:
            r = run_cli("fr", "analyze", str(d), "--html", str(ro / "v.html"))
            assert r.returncode == 1 and "not writable" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
        finally:
            subprocess.run(["umount", str(ro)], check=True)
    elif os.geteuid() != 0:
        ro.chmod(0o500)
        r = run_cli("fr", "analyze", str(d), "--html", str(ro / "v.html"))
        assert r.returncode == 1 and "not writable" in r.stderr, r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "fr_rank0").write_bytes(pickle.dumps({"not": "a dump"}))
    r = run_cli("fr", "analyze", str(empty), "--html", str(tmp_path / "e.html"))
    assert r.returncode == 1 and "nothing to draw" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "e.html").exists()


def test_write_file_is_atomic_and_private(tmp_path):
    p = write_file(tmp_path / "a.html", f"<!-- {GENERATOR} -->x", force=False, flag="--html")
    assert p.read_text().endswith("x") and p.stat().st_mode & 0o777 == 0o600
    with pytest.raises(UsageError):
        write_file(p, "y", force=False, flag="--html")
    write_file(p, f"{GENERATOR} y", force=True, flag="--html")
    assert p.read_text() == f"{GENERATOR} y"
    with pytest.raises(MldebugError):
        write_file(tmp_path, "z", force=True, flag="--html")


def test_html_needs_watch_for_hang_and_mem_top():
    for args in (("hang", "--html", "x.html"), ("mem", "top", "--html", "x.html")):
        r = run_cli(*args)
        assert r.returncode == 2 and "--watch" in r.stderr, r.stderr


def test_fr_view_of_a_pipeline_job_keeps_one_lane_per_timeline():
    ds = from_docs((f"fr_rank{r}", synth.pipeline_rank(64, 200, r, culprit=21))
                   for r in range(64))
    a = analyze(ds)
    html = fr_html(ds, a)
    doc = json.loads(re.search(r"const D = (.*);\n", html).group(1))  # type: ignore[union-attr]
    assert len(doc["lanes"]) == 64 and all(len(lane["cells"]) == 200 for lane in doc["lanes"])
    assert a.mismatches and len(doc["marks"]) == len(a.mismatches)
    assert doc["marks"][0]["culprits"] == a.mismatches[0].culprit_ranks
    assert set(doc["marks"][0]["at"]) >= {str(k) for k in doc["marks"][0]["culprit_lanes"]}
