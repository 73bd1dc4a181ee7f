"""The shared Finding type: ordering, JSON round trip, rendering with the fix."""

from __future__ import annotations

import io

from rich.console import Console

from mldebug.findings import Finding, Severity, findings_to_json, render_findings, worst
from mldebug.render import fold_ints


def test_order_json_and_render():
    fs = [Finding(Severity.HINT, "try X", fix="do X"),
          Finding(Severity.ERROR, "NCCL_SOCKET_IFNAME=eth9 selects no interface",
                  detail="interfaces here: eth0, lo", fix="export NCCL_SOCKET_IFNAME=eth0",
                  code="nccl-ifname", hosts=("node1",))]
    assert worst(fs) is Severity.ERROR
    js = findings_to_json(fs)
    assert [j["severity"] for j in js] == ["error", "hint"]
    assert Finding.from_dict(js[0]) == fs[1]
    buf = io.StringIO()
    render_findings(fs, Console(file=buf, no_color=True, width=100))
    out = buf.getvalue().splitlines()
    assert out[0].startswith("ERROR   NCCL_SOCKET_IFNAME=eth9 selects no interface  [node1]")
    assert "fix: export NCCL_SOCKET_IFNAME=eth0" in out[2]
    buf = io.StringIO()
    render_findings([], Console(file=buf, no_color=True))
    assert buf.getvalue().strip() == "No problems found."


def test_fold_ints():
    assert fold_ints([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert fold_ints([]) == ""


def test_finding_hosts_are_folded():
    hosts = tuple(f"node{i}" for i in range(1, 65)) + ("gpu07",)
    buf = io.StringIO()
    render_findings([Finding(Severity.WARNING, "memlock too low", hosts=hosts)],
                    Console(file=buf, no_color=True, width=100))
    assert buf.getvalue().splitlines()[0].endswith("[gpu07,node[1-64]]")
