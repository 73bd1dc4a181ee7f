"""ncclras output (text report, JSON document 2.28.7+, monitor PEER_DEAD lines): real
reports from public threads and NCCL's documented samples name what RAS saw, no more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldebug.cli import main
from mldebug.findings import Severity
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import load, parse_text
from mldebug.nccllog.ras import MAX_DOC, read_doc

FIX = Path(__file__).parent / "fixtures" / "nccl_log_ras"


def _codes(findings):
    return {f.code for f in findings}


def _one(findings, code):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, [(f.code, f.title) for f in findings]
    return found[0]


def test_readme_lists_every_fixture_with_its_source():
    readme = (FIX / "README.md").read_text()
    for p in FIX.iterdir():
        if p.name != "README.md":
            row = next(line for line in readme.splitlines() if line.startswith(f"| {p.name} "))
            assert "https://" in row


def test_mismatch_nccl_1911_names_the_30_behind_not_the_2_ahead():
    f = _one(analyze(load([FIX / "mismatch-2.26.2-nccl-1911.txt"])).findings,
             "nccl-log-ras-mismatch")
    assert f.title.startswith("RAS: 30 rank(s) of communicator #0-0 (fa93daea854b060b) are "
                              "behind in AllGather")
    assert "ranks 12-13 at 641" in f.title and "RAS lists only the ranks ahead" in f.detail
    assert f.hosts == ()  # the behind ranks' hosts are not in the report


def test_mismatch_written_differently_names_listed_ranks_when_they_are_behind():
    text = "\n".join([
        "Communicators... (0.12s)", "#3-1 (0123456789abcdef) MISMATCH",
        "  Communicator ranks have different AllReduce operation counts",
        "  1 rank has launched up to operation 17",
        "  63 ranks have launched up to operation 18",
        "  Rank 40 -- GPU 0 managed by process 991 on node gpu-node-05"])
    f = _one(analyze([parse_text(text)]).findings, "nccl-log-ras-mismatch")
    assert "rank(s) 40 of communicator #3-1" in f.title and "behind in AllReduce" in f.title
    assert f.hosts == ("gpu-node-05",)


def test_incomplete_nccl_1762_names_the_missing_process_and_distrusts_the_garbled_rest():
    fs = analyze(load([FIX / "incomplete-2.27.3-nccl-1762.txt"])).findings
    f = _one(fs, "nccl-log-ras-missing")
    assert "#0-0 (b3398875b8b2a063)" in f.title and "rank(s) 1" in f.title
    assert "pid 60004 on 10.4.109.13" in f.detail and f.hosts == ("10.4.109.13",)
    bug = _one(fs, "nccl-log-ras-known-bug")
    assert "#2-0" in bug.title and "2.29.2" in bug.fix and bug.severity is Severity.INFO


def test_same_incomplete_report_from_a_fixed_nccl_is_trusted():
    text = (FIX / "incomplete-2.27.3-nccl-1762.txt").read_text().replace(
        "NCCL version 2.27.3", "NCCL version 2.29.2")
    fs = analyze([parse_text(text)]).findings
    assert "nccl-log-ras-known-bug" not in _codes(fs)
    assert len([f for f in fs if f.code == "nccl-log-ras-missing"]) == 2


def test_ok_report_nccl_1730_is_info_and_the_watchdog_keeps_the_verdict():
    fs = analyze(load([FIX / "ok-while-hung-2.26.2-nccl-1730.txt"])).findings
    ok = _one(fs, "nccl-log-ras-ok")
    assert ok.severity is Severity.INFO
    worst = fs[0]  # sorted: the watchdog warning, not 'healthy'
    assert worst.code == "nccl-log-torch-watchdog"


def test_dead_process_in_the_text_report():
    text = "\n".join(["Communicators... (2.05s)", "Errors", "======", "", "DEAD",
                      "  1 job process is considered dead (unreachable via the RAS network)",
                      "  Process 3487984 on node 172.16.64.213 managing GPU 5"])
    f = _one(analyze([parse_text(text)]).findings, "nccl-log-ras-dead")
    assert "process 3487984 on 172.16.64.213 (GPU 5)" in f.title


def test_json_docs_sample_names_the_unresponsive_rank(capsys: pytest.CaptureFixture[str]):
    f = _one(analyze(load([FIX / "ras-json-2.29.1-docs.json"])).findings,
             "nccl-log-ras-missing")
    assert "rank(s) 1 of communicator 0xae94423cfbb2ef4a (size 2)" in f.title
    assert "unresponsive: rank 1 (pid 1524345 on 172.16.64.245, GPU 1)" in f.detail
    assert f.severity is Severity.ERROR
    assert main(["nccl-log", "--json", str(FIX / "ras-json-2.29.1-docs.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["code"] == "nccl-log-ras-missing"
    assert doc["verdict"]["culprits"] == []


def test_json_written_differently_async_error_dead_and_behind():
    doc = json.loads((FIX / "ras-json-2.29.1-docs.json").read_text())
    c = doc["communicators"][0]
    base = c["ranks"][0]
    c["ranks"] = [json.loads(json.dumps(base)) for _ in range(4)]
    for i, r in enumerate(c["ranks"]):
        r.update(rank=i, host=f"10.0.0.{i}", pid=100 + i, cuda_dev=i)
        r["collective_counts"]["AllReduce"] = 50 if i != 2 else 49
    c["ranks"][3]["status"]["async_error"] = 6
    c["size"] = 5
    c["missing_ranks"][0].update(rank=4, host="10.0.0.9")
    c["missing_ranks"][0]["status"]["considered_dead"] = True
    fs = analyze([_parsed(json.dumps(doc).encode())]).findings
    assert "considered dead: rank 4" in _one(fs, "nccl-log-ras-missing").detail
    err = _one(fs, "nccl-log-ras-error")
    assert "rank(s) 3" in err.title and "ncclRemoteError" in err.detail
    behind = _one(fs, "nccl-log-ras-behind")
    assert "rank(s) 2" in behind.title and behind.hosts == ("10.0.0.2",)


def _parsed(data: bytes):
    from mldebug.nccllog.model import ParsedLog
    log = ParsedLog("<json>")
    log.ras.append(read_doc(data, "<json>"))
    return log


@pytest.mark.parametrize("data,reason", [
    (b'{"nccl_version": "2.29.1", ' + b"[" * 100 + b"]" * 100 + b"}", "nested"),
    (b'{"nccl_version": "2.29.1", "communicators": 5}', "not a list"),
    (b'{"nccl_version": "2.29.1", "communicators": [', "not valid JSON"),
])
def test_hostile_json_is_one_clear_line(tmp_path: Path, data: bytes, reason: str) -> None:
    p = tmp_path / "ras.json"
    p.write_bytes(data)
    fs = analyze(load([p])).findings
    f = _one(fs, "nccl-log-ras-unreadable")
    assert reason in f.detail and "ncclras -f json" in f.fix


def test_size_bound():
    with pytest.raises(ValueError, match="over the"):
        read_doc(b" " * (MAX_DOC + 1), "<big>")


def test_monitor_peer_dead_line():
    f = _one(analyze(load([FIX / "monitor-peer-dead-docs.txt"])).findings, "nccl-log-ras-dead")
    assert "process 1524345 on 172.16.64.245 (GPU 1)" in f.title
