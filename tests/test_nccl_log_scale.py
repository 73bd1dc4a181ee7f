"""nccl-log at scale: 1,024 ranks on 128 hosts give one screen plus a line per problem."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rich.console import Console

from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines
from mldebug.nccllog.report import render

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from nccl_synth import rank_lines  # noqa: E402


def test_1024_ranks_fold_into_one_screen() -> None:
    world = 1024
    logs = [parse_lines(rank_lines(r, world), f"rank{r}") for r in range(world)]
    report = analyze(logs)
    codes = [f.code for f in report.findings]
    # identical findings across hosts are one finding each, with the hosts folded
    assert codes.count("nccl-log-iface-virtual") == 1
    assert codes.count("nccl-log-ib-completion") == 1
    virtual = next(f for f in report.findings if f.code == "nccl-log-iface-virtual")
    assert set(virtual.hosts) == {"node64", "node128"} and "node[64,128]" in virtual.detail
    init = next(f for f in report.findings if f.code == "nccl-log-init-incomplete")
    assert "rank(s) 1021 never completed" in init.title
    assert "node128:11021" in init.detail  # host and pid of the rank that never completed
    # identical process rows are one row
    assert len(report.groups) <= 4 and sum(g.count for g in report.groups) == world
    buf = io.StringIO()
    render(report, Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert out.count("\n") <= 60 + len(report.findings), out
    assert "node[1-128]" in out or "node[1-63,65-127]" in out
