"""PyTorch's distributed error strings (mldebug/log/torch_messages.json, from the torch 2.13
sources): one line per string through `mldebug log` gets a component-specific finding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mldebug.log import catalogue
from mldebug.log.analyze import analyze
from mldebug.log.parse import parse_lines

REPO = Path(__file__).resolve().parent.parent
DATA = json.loads((REPO / "mldebug" / "log" / "torch_messages.json").read_text())
# how each component's strings reach a log: the exception class PyTorch raises them with
CLASS = {"tcpstore-server": "torch.distributed.DistNetworkError", "tcpstore-client":
         "torch.distributed.DistNetworkError", "tcpstore": "torch.distributed.DistStoreError",
         "rendezvous": "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
         "elastic-agent": "torch.distributed.elastic.multiprocessing.api.SignalException",
         "c10d-api": "ValueError", "nccl-error": "torch.distributed.DistBackendError"}


def _line(text: str, component: str) -> list[str]:
    msg = text.replace("{}", "17")
    return ["[rank1]:Traceback (most recent call last):",
            '[rank1]:  File "/home/u/train.py", line 12, in main',
            f"[rank1]:{CLASS.get(component, 'RuntimeError')}: {msg}"]


def test_catalogue_is_data_with_versions_and_a_fix_per_component() -> None:
    comps = DATA["components"]
    assert len(DATA["messages"]) > 300
    for m in DATA["messages"]:
        assert m["versions"] and m["source"] and m["text"]
        assert m["component"] == "unclassified" or m["component"] in comps, m
    for c in comps.values():
        assert len(c["cause"]) > 40 and len(c["fix"]) > 40


def test_ninety_percent_of_the_strings_get_a_specific_finding() -> None:
    """One generated line per string, read by the parser (prefilter, traceback, classify) and
    the analysis: the finding must be the string's own component, not the catch-all."""
    hit, miss = 0, []
    for m in DATA["messages"]:
        report = analyze(parse_lines(_line(m["text"], m["component"])))
        codes = {f.code for f in report.findings}
        if m["component"] != "unclassified" and f"log-torch-{m['component']}" in codes:
            hit += 1
        else:
            miss.append(m["text"])
    assert hit / len(DATA["messages"]) >= 0.9, miss[:20]
    # the rest is listed in docs/log.md as unclassified
    docs = (REPO / "docs" / "log.md").read_text()
    for text in miss:
        assert text[:60] in docs, text


def test_real_lines_are_named() -> None:
    cases = {
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
        "peer [10.0.0.2]:41642": "gloo-transport",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use": "tcpstore-server",
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800088 "
        "milliseconds before timing out.": "nccl-watchdog",
    }
    for line, comp in cases.items():
        got = catalogue.match(line)
        assert got is not None and got.message.component == comp, line


def test_known_issue_table_matches_by_version() -> None:
    issues = catalogue.known_issues()
    assert issues, "the table is empty"
    k = issues[0]
    assert k.source.startswith("https://")
    lo = k.affected.split(",")[0].lstrip(">=<")
    assert catalogue.known_for(f"x {k.signature} y", lo) == k
    assert catalogue.known_for(f"x {k.signature} y", k.fixed_in) is None
    assert catalogue.known_for("nothing here", lo) is None
    lines = [f"PyTorch version: {lo}", "[rank0]:Traceback (most recent call last):",
             f"[rank0]:RuntimeError: {k.signature}"]
    report = analyze(parse_lines(lines))
    assert any(f.code == "log-torch-known-issue" and k.fixed_in in f.detail for f in report.findings)


def test_the_script_regenerates_the_strings_from_a_torch_tree() -> None:
    torch_dir = pytest.importorskip("torch").__file__
    assert torch_dir is not None
    out = subprocess.run([sys.executable, str(REPO / "tests" / "fixtures" / "log_catalogue" /
                                              "extract_torch_strings.py"), str(Path(torch_dir).parent)],
                         capture_output=True, text=True, timeout=300, check=True)
    got = {e["text"] for e in json.loads(out.stdout)}
    have = {m["text"] for m in DATA["messages"] if "libtorch_cpu" in m["source"] or m["source"].startswith("torch/")}
    assert have <= got, sorted(have - got)[:5]  # every extracted string of the catalogue is still there
    assert len(got - have) == 0, sorted(got - have)[:5]  # and none is missing from it
