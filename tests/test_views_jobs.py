"""Every HTML view made by the real commands on real torchrun (gloo) jobs, opened in headless
Chromium: it renders without a JS error, and the marked collective, the named ranks and the
divergence are in the DOM with the right text; a screenshot of each lands in the test's tmp
dir (and in docs/images/ with MLDEBUG_UPDATE_DOC_IMAGES=1). The trace-event files are checked
against the format's documented fields.

Three jobs, started together (one module fixture), cover the five views:
- capture_rank_branch.py (rank 2 leaves the others' path and blocks; watchdog rings, flight
  recorder on): ``trace show``, ``hang --watch``, ``fr trigger`` + ``fr analyze``;
- fr_straggler.py (rank 2 sleeps before every all_reduce): ``fr watch``, ``fr analyze``;
- memory_leak.py (rank 2 keeps 20 MB more each second): ``mem top --watch``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import chromium, open_view, severe, text
from conftest import REPO
from jobs import kill_tree
from trace_event_schema import validate

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

DOC_IMAGES = REPO / "docs" / "images"


def _cli(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "mldebug", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


def _start(recipe: str, nproc: int, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    full = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env)
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc_per_node={nproc}", str(REPO / "recipes" / recipe), *args],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full, cwd=REPO,
            start_new_session=True)


def _wait(pred, what: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not there in {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.3)


def _ready(log: Path, n: int) -> bool:
    return log.exists() and log.read_text(errors="replace").count(" ready") >= n


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    base = tmp_path_factory.mktemp("views")
    out: dict[str, object] = {"base": base}
    cap, frd, sd = base / "cap", base / "frd", base / "strag"
    procs = {
        "branch": _start("capture_rank_branch.py", 3, base / "branch.log", MLDEBUG_DIR=str(cap),
                         STALL_TIMEOUT="3", MLDEBUG_FR="1", MLDEBUG_FR_DIR=str(frd)),
        "strag": _start("fr_straggler.py", 3, base / "strag.log", "--steps", "100000",
                        MLDEBUG_FR_DIR=str(sd)),
        "leak": _start("memory_leak.py", 3, base / "leak.log", "--job", "--leak-rank", "2",
                       "--rate", "20", "--seconds", "120"),
    }
    try:
        for name in procs:
            _wait(lambda name=name: _ready(base / f"{name}.log", 3), f"{name} job ready",
                  base / f"{name}.log")
        time.sleep(1.0)
        env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
        # the two watches run side by side (seconds each)
        mem = subprocess.Popen([sys.executable, "-m", "mldebug", "mem", "top", "--watch", "5",
                                "--pid", str(procs["leak"].pid), "--html", str(base / "mem.html"),
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=REPO)
        w = _cli("fr", "watch", "--dir", str(sd), "--interval", "3", "--out", str(base / "w"),
                 "--timeout", "20", "--html", str(base / "watch.html"), "--json")
        assert w.returncode == 0, w.stderr
        out["watch"] = json.loads(w.stdout)
        m_out, m_err = mem.communicate(timeout=120)
        assert mem.returncode == 0, m_err
        out["mem"] = json.loads(m_out)
        a = _cli("fr", "analyze", str(base / "w" / "2"), "--html", str(base / "strag.html"),
                 "--json")
        assert a.returncode == 0, a.stderr
        out["strag"] = json.loads(a.stdout)

        _wait(lambda: len(list((cap / "trace").glob("*"))) >= 3 if (cap / "trace").is_dir()
              else False, "three rings", base / "branch.log")
        t = _cli("trace", "show", str(cap), "--html", str(base / "trace.html"), "--trace-event",
                 str(base / "trace.json"), "--json")
        assert t.returncode == 0, t.stderr
        out["trace"] = json.loads(t.stdout)
        h = _cli("hang", "--pid", str(procs["branch"].pid), "--watch", "2", "--html",
                 str(base / "hang.html"), "--json")
        assert h.returncode == 0, h.stderr
        out["hang"] = json.loads(h.stdout)
        tr = _cli("fr", "trigger", "--dir", str(frd), "--out", str(base / "trig"), "--timeout",
                  "20")
        assert tr.returncode == 0, tr.stderr
        f = _cli("fr", "analyze", str(base / "trig"), "--html", str(base / "fr.html"),
                 "--trace-event", str(base / "fr.json"), "--json")
        assert f.returncode == 0, f.stderr
        out["fr"] = json.loads(f.stdout)
        keep = os.environ.get("MLDEBUG_VIEWS_KEEP")  # a copy of the dumps and views, to look at
        if keep:
            shutil.copytree(base, keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock", "*.trigger"))
        yield out
    finally:
        for p in procs.values():
            kill_tree(p)


@pytest.fixture(scope="module")
def browser():
    with chromium() as d:
        yield d


def _show(browser, path: Path, name: str, tmp_path: Path, scroll: str = "",
          doc: bool = True) -> None:
    open_view(browser, path)
    assert severe(browser) == [], path
    if scroll:  # the part of the page this view is about, at the top of the screenshot
        browser.execute_script(f"document.querySelector({scroll!r}).scrollIntoView()")
    shot = tmp_path / f"{name}.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if doc and os.environ.get("MLDEBUG_UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(shot, DOC_IMAGES / f"view-{name}.png")


def test_fr_view_marks_the_hang_point_and_the_culprit(views, browser, tmp_path):
    doc = views["fr"]
    (m,) = doc["mismatches"]
    assert m["culprit_ranks"] == [2] and m["kind"] == "missing", m
    _show(browser, views["base"] / "fr.html", "fr", tmp_path)
    card = text(browser, "#mismatch0")
    assert f"collective #{m['seq']}: missing mismatch; culprit rank(s) 2" in card, card
    assert "capture_rank_branch.py" in card  # the call site of the ranks that enqueued it
    assert text(browser, "#culprit") == "Culprit rank(s): 2"
    marker = browser.find_element("css selector", "#wrap .mark")
    assert marker.text == f"\u25bc #{m['seq']}"
    lanes = browser.find_elements("css selector", "#labels .lbl")
    bad = [e.text for e in lanes if "bad" in e.get_attribute("class")]
    assert len(bad) == 1 and "rank 2" in bad[0], [e.text for e in lanes]
    assert any("ranks 0-1" in e.text for e in lanes)
    # a click unfolds the lane of ranks 0-1 into one row per rank
    folded = next(e for e in lanes if "ranks 0-1" in e.text)
    folded.click()
    rows = [e.text.strip() for e in browser.find_elements("css selector", "#labels .lbl")]
    assert any(r.startswith("rank 0") for r in rows) and any(r.startswith("rank 1") for r in rows)
    assert severe(browser) == []


def test_fr_trace_event_file_is_valid_and_links_the_ranks(views):
    doc = json.loads((views["base"] / "fr.json").read_text())
    validate(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2] and "culprit" in names[2]
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2}
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f"]
    assert starts and len(starts) == len(ends)  # every matched collective linked across ranks


def test_stragglers_view_names_the_sleeper_and_shows_the_skew(views, browser, tmp_path):
    assert [s["rank"] for s in views["strag"]["stragglers"]] == [2]
    _show(browser, views["base"] / "strag.html", "stragglers", tmp_path, "#strag")
    named = text(browser, "#stragglers")
    assert named.startswith("rank 2") and "ms late" in named, named
    assert "Clock-skew correction" in text(browser, ".skew")
    top = browser.find_elements("css selector", "#strag .lbl")
    assert top and top[0].text.startswith("rank 2"), [e.text for e in top]  # named on top
    assert [s["rank"] for s in views["watch"]["analysis"]["stragglers"]] == [2]
    _show(browser, views["base"] / "watch.html", "fr-watch", tmp_path, "#strag", doc=False)
    assert text(browser, "#stragglers").startswith("rank 2")


def test_trace_view_aligns_the_rings_and_marks_the_divergence(views, browser, tmp_path):
    (div,) = views["trace"]["divergences"]
    assert div["ranks"] == [2]
    _show(browser, views["base"] / "trace.html", "trace", tmp_path)
    card = text(browser, ".divergence")
    assert card.startswith("rank(s) 2 left the others' path at capture_rank_branch.py:"), card
    assert "if rank == hang_rank and step == hang_step:" in card and "ranks 0-1" in card
    left = browser.find_element("css selector", "#grid td.left")
    assert "validate(step)" in left.text
    heads = text(browser, "#grid th")
    assert "ranks 0-1" in heads and "rank 2" in heads
    doc = json.loads((views["base"] / "trace.json").read_text())
    validate(doc)
    assert any(e["ph"] == "X" and e["args"].get("left_here") for e in doc["traceEvents"])


def test_hang_watch_view_shows_each_group_stuck_and_the_suspect(views, browser, tmp_path):
    hang = views["hang"]
    assert [s["rank"] for s in hang["suspects"]] == [2], (  # what was said instead, and why
        hang.get("verdict"), [(g.get("ranks"), g.get("state"), g.get("wait")) for g in
                              hang.get("groups", [])], hang.get("errors"))
    _show(browser, views["base"] / "hang.html", "hang", tmp_path)
    assert text(browser, ".suspect").startswith("suspect rank 2")
    states = [e.text for e in browser.find_elements("css selector", ".st")]
    assert states and set(states) <= {"stuck", "spinning", "progressing", "mixed"}, states
    assert "stuck" in states
    assert "validate" in text(browser, "tr.suspect")


def test_mem_watch_view_draws_the_leaking_rank_apart(views, browser, tmp_path):
    leaks = [f for f in views["mem"]["findings"] if f["code"] == "mem-rss-leak"]
    assert len(leaks) == 1
    _show(browser, views["base"] / "mem.html", "mem", tmp_path)
    leak = text(browser, ".leak")
    assert leak.startswith("rank 2 (pid ") and "MiB/s" in leak, leak
    assert "3 rank process(es)" in text(browser, "#summary")
