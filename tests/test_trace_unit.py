"""The execution ring (sys.settrace here, sys.monitoring on 3.12+ through pyenv), the
divergence analysis on ring files, `mldebug trace show` and `mldebug trace run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from envelope_check import check_envelope

from mldebug.trace.analyze import analyze
from mldebug.trace.model import Loc, RankTrace

# one rank takes the branch at line 8 (`if rank == 2 and step == 3`) and stops in it
JOB = """\
import os, sys
import mldebug.trace as tr

def work(x):
    return x + 1

def main(rank):
    for step in range(6):
        y = work(step)
        if rank == 2 and step == 3:
            special = y * 2
            return special
    return y

tr.enable(events=sys.argv[2], ring=int(sys.argv[3]))
main(int(sys.argv[1]))
print(tr.dump(sys.argv[4]))
"""


def run_ranks(tmp: Path, python: str, events: str, ring: int = 64, n: int = 4) -> Path:
    (tmp / "job.py").write_text(JOB)
    out = tmp / "cap" / "trace"
    for rank in range(n):
        env = dict(os.environ, PYTHONPATH=str(REPO), RANK=str(rank), WORLD_SIZE=str(n))
        r = subprocess.run([python, str(tmp / "job.py"), str(rank), events, str(ring), str(out)],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
    return tmp / "cap"


def pythons() -> list[str]:
    found = [sys.executable]
    for v in ("3.12.1", "3.13.0"):
        p = f"/root/.pyenv/versions/{v}/bin/python"
        if os.path.exists(p):
            found.append(p)
    return found


@pytest.mark.parametrize("python", pythons())
def test_lines_ring_and_show_name_the_branch(tmp_path, python):
    d = run_ranks(tmp_path, python, "lines")
    doc = json.loads(next((d / "trace").glob("*rank2*.json")).read_text())
    texts = [doc["locations"][i][3] for i in doc["threads"][0]["events"]]
    assert "special = y * 2" in texts
    assert not any("mldebug" in loc[0] for loc in doc["locations"])  # mldebug itself filtered
    r = run_cli("trace", "show", str(d), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    check_envelope(rep, "trace.show")
    [div] = rep["divergences"]
    assert div["ranks"] == [2] and div["others"] == [0, 1, 3]
    assert div["branch"]["text"] == "if rank == 2 and step == 3:"
    assert div["left_at"]["text"] == "special = y * 2"
    assert rep["findings"][0]["code"] == "trace-path-diverged"
    human = run_cli("trace", "show", str(d))
    assert "rank 2 left the others' path at job.py:11 in main" in human.stdout


@pytest.mark.parametrize("python", pythons())
def test_calls_ring_is_bounded_and_records_user_calls_only(tmp_path, python):
    d = run_ranks(tmp_path, python, "calls", ring=5, n=1)
    doc = json.loads(next((d / "trace").glob("*.json")).read_text())
    events = doc["threads"][0]["events"]
    assert len(events) == 5  # the ring keeps the last 5 of 7 calls
    assert {doc["locations"][i][2] for i in events} == {"work"}


def test_monitoring_is_used_on_312():
    p = "/root/.pyenv/versions/3.12.1/bin/python"
    if not os.path.exists(p):
        pytest.skip("no Python 3.12 here")
    code = ("import sys, mldebug.trace as t; r = t.enable(); "
            "print(r._tool is not None and sys.gettrace() is None)")
    r = subprocess.run([p, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.stdout.strip() == "True", r.stderr


# How often the ring's excluded path runs (a lookup that finds the file excluded) while a standard-library function (excluded by
# the filter) is called 1,000 times, and how often the filter itself was asked per file name.
COUNT_EXCLUDED = """\
import collections, json, textwrap
import mldebug.trace.ring as R

asked = collections.Counter()
def user_files(name):
    asked[name] += 1
    return name.endswith("count_job.py")

class Counting(set):  # counts the lookups that find an excluded file
    n = 0
    def __contains__(self, name):
        hit = set.__contains__(self, name)
        Counting.n += hit
        return hit

def mine(i):
    return textwrap.dedent("  x") * i

r = R.Ring("calls", 64, filter=user_files)
r.verdicts.skipped = Counting()
r.start()
for i in range(1000):
    mine(i)
r.stop()
events = [code.co_name for ring in r.rings.values() for code, _ in ring]
print(json.dumps({"excluded": Counting.n, "asked_max": max(asked.values()),
                  "events": events}))
"""


@pytest.mark.parametrize("python", pythons())
def test_excluded_code_costs_one_lookup_per_call_or_nothing_with_monitoring(tmp_path, python):
    """The filter is asked once per file name (the verdict is cached by name); below 3.12
    every call of excluded code still reaches the trace function, from 3.12 on an excluded
    code object is DISABLEd after its first event."""
    (tmp_path / "count_job.py").write_text(COUNT_EXCLUDED)
    r = subprocess.run([python, str(tmp_path / "count_job.py")], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["asked_max"] == 1
    assert got["events"] == ["mine"] * 64  # the ring still records the user's calls
    v = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                       capture_output=True, text=True).stdout.strip()
    if v == "True":
        assert got["excluded"] < 100, got["excluded"]
    else:
        assert got["excluded"] >= 1000, got["excluded"]


def _trace(rank: int, locs: list[Loc]) -> RankTrace:
    return RankTrace(host="h", pid=100 + rank, rank=rank, kind="lines", reason="stall",
                     events=locs)


def test_same_path_everywhere_has_no_divergence():
    a, b = Loc("t.py", 1, "f", "a()"), Loc("t.py", 2, "f", "b()")
    rep = analyze([_trace(r, [a, b, a, b]) for r in range(8)])
    assert rep.divergences == [] and len(rep.groups) == 1 and not rep.findings


def test_two_places_without_a_private_path_is_a_hint():
    a, b = Loc("t.py", 1, "f"), Loc("t.py", 2, "f")
    rep = analyze([_trace(0, [a, b, a]), _trace(1, [a, b, a]), _trace(2, [a, b])])
    assert rep.divergences == [] and [f.code for f in rep.findings] == ["trace-different-places"]


def test_show_skips_bad_files_with_a_reason(tmp_path):
    d = run_ranks(tmp_path, sys.executable, "calls", n=2)
    (d / "trace" / "junk.json").write_text("{not json")
    (d / "trace" / "other.json").write_text('{"format": "something/1"}')
    (d / "trace" / "link.json").symlink_to(next((d / "trace").glob("*rank0*")))
    r = run_cli("trace", "show", str(d), "--json")
    rep = json.loads(r.stdout)
    assert len(rep["ranks"]) == 2
    assert sorted(e.split(":")[0] for e in rep["errors"]) == ["junk.json", "other.json"]


def test_show_of_an_empty_dir_is_a_usage_error(tmp_path):
    r = run_cli("trace", "show", str(tmp_path))
    assert r.returncode == 2 and "no trace files" in r.stderr


def test_trace_run_writes_a_prefixed_timestamped_trace(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""\
        import sys
        def step(i):
            return i * 2
        for i in range(3):
            step(i)
        sys.exit(3)
    """))
    env = dict(os.environ, RANK="1", WORLD_SIZE="2")
    r = run_cli("trace", "run", "--lines", "--out", str(tmp_path / "t"), "--",
                sys.executable, str(script), env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    [f] = list((tmp_path / "t").glob("*.trace"))
    lines = f.read_text().splitlines()
    host = f.name.split("-rank1-")[0]
    assert all(x.startswith(f"[{host}:1] ") for x in lines)
    assert sum(" call " in x and ":2 step:" in x for x in lines) == 3
    assert any(" line " in x and "return i * 2" in x for x in lines)
    assert float(lines[-1].split()[1]) >= float(lines[0].split()[1])


def test_trace_run_refuses_a_non_python_command():
    r = run_cli("trace", "run", "--", "bash", "x.sh")
    assert r.returncode == 2 and "not a Python interpreter" in r.stderr


def test_many_ranks_stay_one_screen():
    common = [Loc("t.py", 1, "f"), Loc("t.py", 2, "f")]
    traces = [_trace(r, [*common, Loc("t.py", 100 + (r // 100) % 40, "g")] if r % 100 == 0 else common)
              for r in range(8000)]
    rep = analyze(traces)
    assert len(rep.divergences) == 40
    assert len(rep.findings) == 6 and rep.findings[-1].code == "trace-path-diverged-more"
    assert rep.findings[0].title == "ranks 0,4000 left the others' path at t.py:100 in g"


def test_show_names_the_missing_rank_and_why_from_the_abort_note(tmp_path):
    # rings of ranks 0, 2, 3 of 4 (rank 1's removed, as when torchrun killed it before it
    # wrote), and dump+abort's evidence note from a real barrier naming rank 1 and why
    from mldebug.capture.evidence import Barrier
    from mldebug.privdir import private_dir

    d = run_ranks(tmp_path, sys.executable, "lines")
    [ring1] = (d / "trace").glob("*rank1-*.json")
    ring1.unlink()
    r = run_cli("trace", "show", str(d), "--json")
    rep = json.loads(r.stdout)
    assert rep["world_size"] == 4  # from the rings' recorded identity
    assert rep["missing"] == [{"rank": 1, "pid": None, "reason": rep["missing"][0]["reason"]}]
    assert rep["missing"][0]["reason"].startswith("no ring file here, and no dump+abort note")

    fh, dumps = private_dir(d / "faulthandler"), private_dir(d / "dumps")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Barrier(d, f"vm-rank1-{dead.pid}", {"rank": 1, "run_id": "r"}, dead.pid, fh, dumps)
    me = Barrier(d, f"vm-rank0-{os.getpid()}", {"rank": 0, "run_id": "r"}, os.getpid(), fh,
                 dumps)
    me.wait(deadline_s=20)
    for target in (d, d / "trace"):  # the capture directory or its trace/ folder
        r = run_cli("trace", "show", str(target), "--json")
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        [miss] = rep["missing"]
        assert miss["rank"] == 1 and miss["pid"] == dead.pid
        assert miss["reason"].startswith("exited (or was killed) before writing a dump "
                                         "(rank 0 waited "), miss
        codes = [f["code"] for f in rep["findings"]]
        assert codes[0] == "trace-rank-missing" and "trace-path-diverged" in codes, codes
        assert rep["findings"][0]["fix"]
    human = run_cli("trace", "show", str(d)).stdout
    assert "mldebug trace: 3 of 4 ranks" in human
    assert "rank 1 missing: 3 of 4 ranks' rings here" in human
    assert f"rank 1 (pid {dead.pid}): exited (or was killed) before writing a dump" in human
    assert "All ranks followed the same path" not in human


def test_missing_ranks_are_bounded_and_absent_when_all_rings_are_there():
    from mldebug.trace.analyze import missing

    t = [RankTrace("h", 10 + r, r, "calls", "x", [Loc("a.py", 1, "f")], world_size=4)
         for r in (0, 1, 2, 3)]
    assert missing(t, []) == (4, [])
    rep = analyze(t[:1])  # world size from the ring, no notes
    assert [m.rank for m in rep.missing] == [1, 2, 3] and rep.world_size == 4
    assert rep.findings[0].code == "trace-rank-missing"
    # a noted rank past any world is listed, never expanded into a range
    world, miss = missing(t, [(10**12, 5, "why"), (None, 77, "gone")])
    assert world == 4 and [(m.rank, m.pid) for m in miss] == [(10**12, 5), (None, 77)]
    huge = [RankTrace("h", 1, 0, "calls", "x", [], world_size=10**12)]
    assert missing(huge, []) == (None, [])


def test_live_report_names_its_job_and_each_silent_rank_with_its_reason():
    """A live `trace show --pid/--job`: the job in the header and --json, the asked ranks'
    reasons, a rank of the world not on this host said so; never 'the same path'."""
    from io import StringIO

    from rich.console import Console

    from mldebug.trace.analyze import NOT_HERE
    from mldebug.trace.report import render

    a = Loc("t.py", 1, "f", "a()")
    t = [RankTrace("h", 10 + r, r, "lines", "signal", [a], world_size=4) for r in (0, 1)]
    rep = analyze(t, [], [(2, 12, "no dump handler, ...")], job="run:abc", live=True)
    doc = rep.to_dict()
    assert doc["job"] == "run:abc" and doc["live"] is True
    assert [(m["rank"], m["reason"]) for m in doc["missing"]] == [
        (2, "no dump handler, ..."), (3, NOT_HERE)]
    [f] = rep.findings
    assert f.code == "trace-rank-missing" and "dump handler" in f.fix and "DIR" not in f.fix
    buf = StringIO()
    render(rep, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert text.startswith("mldebug trace: 2 of 4 ranks on 1 host, lines events - job run:abc")
    assert "Missing (2): no ring from the signal" in text
    assert "rank 2 (pid 12): no dump handler" in text and "All ranks followed" not in text
    # a saved directory's report keeps its own wording and fix
    saved = analyze(t[:1])
    assert saved.job is None and "mldebug hang analyze DIR" in saved.findings[0].fix


def test_a_second_read_tells_slow_from_stuck():
    """Live `trace show`: ranks in different places are read again. Every ring moved: the job
    makes progress, the divergence is a branch (a hint, no culprit); only a minority moved:
    those ranks are busy elsewhere while the rest wait (culprits); the envelope agrees."""
    from mldebug.cli.envelope import wrap
    from mldebug.trace.analyze import moved

    a, b, c = Loc("t.py", 1, "f"), Loc("t.py", 2, "f"), Loc("t.py", 3, "slow")
    first = [_trace(0, [a, b]), _trace(1, [a, b]), _trace(2, [a, c])]
    later = [_trace(0, [b, a]), _trace(1, [b, a]), _trace(2, [c, c])]
    assert moved(first, later) == {("h", 100), ("h", 101), ("h", 102)}
    assert moved(first, first) == set() and moved(first, later[:1]) == {("h", 100)}
    rep = analyze(first, live=True)
    assert rep.divergences and not rep.progress
    assert wrap(rep.to_dict(), "trace", "show")["verdict"]["culprits"] == [2]
    slow = analyze(first, live=True, progress=2.0)
    assert slow.progress and slow.findings[0].code == "trace-progress"
    assert all(f.severity.value != "warning" for f in slow.findings)
    v = wrap(slow.to_dict(), "trace", "show")["verdict"]
    assert (v["kind"], v["culprits"], v["class"]) == ("ok", [], "healthy")
    # rank 2 spins in an evaluation (its ring wrapped: no shared history), 0 and 1 stand still
    spin = [_trace(0, [a, b]), _trace(1, [a, b]), _trace(2, [c] * 8)]
    busy = analyze(spin, live=True, busy=({("h", 102)}, 6.0))
    assert busy.busy == [2] and busy.findings[0].code == "trace-busy-elsewhere"
    assert "rank 2 kept running Python code while ranks 0-1 stood still" in busy.findings[0].title
    v = wrap(busy.to_dict(), "trace", "show")["verdict"]
    assert (v["kind"], v["culprits"], v["class"]) == ("culprits", [2], "spinning")
    # a majority moving is not a culprit (nor is the minority that stood still)
    assert analyze(spin, live=True, busy=({("h", 100), ("h", 101)}, 6.0)).busy == []


def test_a_rank_on_the_cpu_runs_a_rank_asleep_waits():
    """trace show's second look also reads /proc: a rank whose ring is one loop saturated
    (it reads the same each time) still runs when its main thread used the CPU."""
    from mldebug.cli.trace import BUSY_CPU, CLK_TCK, _runs

    def s(t: float, ticks: int, state: str = "S") -> dict[str, object]:
        return {"t": t, "ticks": ticks, "state": state}

    busy = int(CLK_TCK * 2 * BUSY_CPU) + 1  # a bit more than BUSY_CPU of a core over 2 s
    assert _runs(s(0, 0, "R"), s(2, busy, "S"))
    assert not _runs(s(0, 0), s(2, 1))  # asleep in a collective: a tick at most
    assert _runs(s(0, 0, "R"), s(2, 2, "R"))  # runnable at both on a loaded node, and ran
    assert not _runs(s(0, 5, "R"), s(2, 5, "R"))  # runnable but never scheduled: no tick
    assert not _runs(s(2, 0), s(2, busy)) and not _runs(s(0, 9), s(2, 3))  # bad pairs
