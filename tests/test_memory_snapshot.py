"""mldebug mem report / compare / plot on snapshots that follow torch's documented schema."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys

import memsnap
import pytest
from conftest import REPO, run_cli
from envelope_check import check_envelope

from mldebug.cli import main
from mldebug.memory.plot import timeline
from mldebug.memory.snapshot import analyze, compare, load

MiB = 1024**2


def codes(findings):
    return {f.code for f in findings}


def test_leak_per_layer_is_named_with_its_site():
    rep = analyze(memsnap.training(layers=4, steps=3, leak=True), "x")
    d = rep.devices[0]
    assert d.before_trace == 4 * 16 * MiB  # the weights, allocated before the trace
    assert d.peak_allocated == 128 * MiB
    assert [s.site for s in d.leak_sites] == ["workspace/model.py:45 forward"]
    assert d.leak_sites[0].count == 12 and d.leak_sites[0].bytes == 24 * MiB
    assert "mem-leak-suspect" in codes(rep.findings)
    top = {s.site: s.bytes for s in d.top_at_peak}
    assert top["<allocated before the trace started>"] == 64 * MiB
    assert top["workspace/model.py:40 forward"] == 32 * MiB  # activations of 4 layers


def test_no_leak_no_suspect_and_weights_recorded_from_init_are_not_a_leak():
    rep = analyze(memsnap.training(leak=False, record_init=True), "x")
    d = rep.devices[0]
    assert d.before_trace == 0
    assert [s.site for s in d.never_freed] == ["workspace/model.py:20 __init__"]
    assert not d.leak_sites
    assert "mem-leak-suspect" not in codes(rep.findings)
    assert d.end_allocated == rep.allocated  # trace replay agrees with the segments


def test_fragmentation_pattern():
    rep = analyze(memsnap.training(leak=False, fragment=True), "x")
    f = [x for x in rep.findings if x.code == "mem-fragmentation"]
    assert f and "expandable_segments:True" in f[0].fix
    assert rep.stranded >= 6 * 18 * MiB
    clean = analyze(memsnap.training(leak=False), "x")
    assert "mem-fragmentation" not in codes(clean.findings)


def test_oom_event_with_site_and_state():
    rep = analyze(memsnap.training(oom=True), "x")
    ooms = rep.devices[0].ooms
    assert len(ooms) == 1 and ooms[0].requested == 40 * 1024 * MiB
    assert ooms[0].device_free == 300 * MiB and ooms[0].site == "workspace/model.py:50 forward"
    f = [x for x in rep.findings if x.code == "mem-oom"][0]
    assert "workspace/model.py:50 forward" in f.title and f.fix


def test_trace_without_free_requested_is_replayed_the_same():
    doc = memsnap.training()
    full = analyze(doc, "x").devices[0]
    doc["device_traces"][0] = [e for e in doc["device_traces"][0] if e["action"] != "free_requested"]
    skipped = analyze(doc, "x").devices[0]
    assert (skipped.peak_allocated, skipped.end_allocated) == (full.peak_allocated, full.end_allocated)


def test_segments_only_snapshot_says_there_is_no_trace():
    doc = memsnap.training()
    doc["device_traces"] = [[]]
    rep = analyze(doc, "x")
    assert not rep.devices and "mem-no-trace" in codes(rep.findings)


def test_compare_names_the_site_that_grew():
    rep = compare(memsnap.training(steps=2), memsnap.training(steps=5), "a", "b")
    assert rep.changes[0].site == "workspace/model.py:45 forward"
    assert rep.changes[0].delta == 3 * 4 * 2 * MiB
    assert rep.findings[0].code == "mem-grew"


def test_restricted_loader_refuses_objects_and_names_bad_files(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": Evil()}))
    with pytest.raises(Exception, match="refused .*builtins.print"):
        load(bad)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(pickle.dumps(memsnap.training())[:5000])
    with pytest.raises(Exception, match="truncated"):
        load(cut)
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps({"entries": []}))
    with pytest.raises(Exception, match="not a PyTorch memory snapshot"):
        load(other)
    big = memsnap.write(tmp_path / "big.pickle", memsnap.training())
    with pytest.raises(Exception, match="over the"):
        load(big, max_bytes=1000)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(Exception, match="truncated or not a snapshot"):
        load(deep)
    nest = tmp_path / "nest.pickle"  # {"segments": [], (((...))): 1}: hashing the key
    nest.write_bytes(b"\x80\x02}X\x08\x00\x00\x00segments]s)" + b"\x85" * 300_000 + b"K\x01s.")
    with pytest.raises(Exception, match="refused .*nested over 2,000 deep"):
        load(nest)
    as_json = tmp_path / "snap.json"
    as_json.write_text(json.dumps(memsnap.training()))
    assert analyze(load(as_json)).devices[0].peak_allocated == 128 * MiB
    link = tmp_path / "link.pickle"
    link.symlink_to(big)
    with pytest.raises(Exception, match="symlink"):
        load(link)


def test_cli_report_compare_json(tmp_path, capsys):
    a = memsnap.write(tmp_path / "a.pickle", memsnap.training(steps=2, oom=True))
    b = memsnap.write(tmp_path / "b.pickle", memsnap.training(steps=4))
    assert main(["mem", "report", str(a), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    check_envelope(doc, "mem.report")
    assert doc["format"] == "mldebug.mem.report/1"  # kept one release (deprecated: schema)
    assert {"mem-oom", "mem-leak-suspect"} <= {f["code"] for f in doc["findings"]}
    assert main(["mem", "compare", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    check_envelope(doc, "mem.compare")
    assert doc["changes"][0]["delta"] == 2 * 4 * 2 * MiB
    assert main(["mem", "report", str(tmp_path / "missing.pickle")]) == 1
    assert "cannot open the snapshot" in capsys.readouterr().err


def test_timeline_sums_to_the_replay():
    doc = memsnap.training(layers=3, steps=2)
    tl = timeline(doc, width=10_000)
    totals = [sum(s[j] for s in tl.series) for j in range(len(tl.points))]
    assert max(totals) == tl.peak == analyze(doc).devices[0].peak_allocated
    assert tl.sites[0] == "<allocated before the trace started>"


def test_plot_png_svg_html_offline(tmp_path):
    snap = memsnap.write(tmp_path / "mem.pickle", memsnap.training(oom=True))
    for name in ("t.png", "t.svg", "t.html"):
        r = run_cli("mem", "plot", str(snap), "-o", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "t.svg").read_bytes()[:2000]
    page = (tmp_path / "t.html").read_text()
    assert not re.search(r"https?:", page), "the HTML must not load anything from the network"
    assert "<canvas" in page and "workspace\\/model.py:45 forward" in page
    # a site whose file name is a URL cannot smuggle one in either
    doc = memsnap.training()
    for e in doc["device_traces"][0]:
        e["frames"] = [dict(f, filename="https://evil.example/x.py") if f["filename"] ==
                       "/workspace/model.py" else f for f in e["frames"]]
    evil = memsnap.write(tmp_path / "evil.pickle", doc)
    assert main(["mem", "plot", str(evil), "-o", str(tmp_path / "e.html")]) == 0
    assert not re.search(r"https?://", (tmp_path / "e.html").read_text())
    r = run_cli("mem", "plot", str(snap), "-o", str(tmp_path / "t.jpg"))
    assert r.returncode == 2 and "Name it .png, .svg or .html" in r.stderr


def test_mem_commands_do_not_import_torch(tmp_path):
    snap = memsnap.write(tmp_path / "mem.pickle", memsnap.training())
    code = (
        "import sys; from mldebug.cli import main\n"
        f"assert main(['mem', 'report', {str(snap)!r}]) == 0\n"
        f"assert main(['mem', 'plot', {str(snap)!r}, '-o', {str(tmp_path / 'x.html')!r}]) == 0\n"
        f"assert main(['mem', 'compare', {str(snap)!r}, {str(snap)!r}]) == 0\n"
        "main(['mem', 'top', '--pid', '1'])\n"
        "assert main(['mem', 'peak', '--', 'true']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs CUDA")
def test_real_snapshot_on_cuda(tmp_path):
    import torch

    import mldebug.memory

    with mldebug.memory.record(str(tmp_path / "real-{rank}.pickle")) as rec:
        keep = [torch.zeros(1024, 1024, device="cuda") for _ in range(4)]
        del keep[0]
    assert rec.written is not None
    rep = analyze(load(rec.written), str(rec.written))
    assert rep.devices and rep.devices[0].peak_allocated >= 4 * 4 * MiB
    assert main(["mem", "plot", str(rec.written), "-o", str(tmp_path / "real.png")]) == 0
