"""mldebug env reports: 1,024 saved node documents on one screen, --markdown, --check-port."""

from __future__ import annotations

import copy
import io

from conftest import run_cli
from envfacts import BASE, make
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from test_env_cli import clean_env

from mldebug.env.collect import facts_from_results
from mldebug.env.report import build_report, markdown, redact, render
from mldebug.fanout import NodeResult


def _fleet(n: int = 1024):
    nodes = []
    for i in range(1, n + 1):
        env = {"NCCL_SOCKET_IFNAME": "eth0" if i % 100 else "eth1", "NCCL_DEBUG": "WARN"}
        if i % 250 == 0:
            env["NCCL_IB_HCA"] = "mlx5_0"
        torch = {"version": "2.9.1+cu128" if i != 7 else "2.8.0+cu126", "status": "ok",
                 "nccl": "2.27.5" if i != 7 else "2.26.2"}
        nodes.append(make(env, host=f"node{i}", torch=torch))
    return nodes


def test_1024_saved_node_documents_read_on_one_screen() -> None:
    nodes = _fleet()
    unreachable = {f"node{i}": f"ssh: connect to host node{i} port 22: Connection refused"
                   for i in range(1025, 1035)}
    unreachable["node2000"] = "no answer before the deadline"
    report = build_report(nodes, unreachable)
    # unreachable nodes: one finding per reason, hosts folded
    down = [f for f in report.findings if f.code == "node-unreachable"]
    assert len(down) == 2 and "node[1025-1034]" in down[0].detail
    assert "<host>" in down[0].detail
    # a differing field lists its distinct values, majority first, with folded hosts
    torch = next(f for f in report.findings if f.code == "env-diff-torch")
    assert torch.detail.endswith("2.9.1+cu128 [node[1-6,8-1024]]; 2.8.0+cu126 [node7]")
    assert torch.hosts == ("node7",)
    variables = next(f for f in report.findings if f.code == "env-diff-variables")
    assert "NCCL_SOCKET_IFNAME: eth0 [" in variables.detail and len(variables.detail) < 1000
    assert all(len(f.detail) < 1500 for f in report.findings)
    buf = io.StringIO()
    render(report, Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert out.count("\n") < 80, out
    assert "node[1-6,8-1024]" in out and "node1, node2" not in out
    assert "mldebug env: 1024 node(s), 11 unreachable" in out


def test_redaction_of_secret_looking_values() -> None:
    assert redact("NCCL_IB_SECRET", "abc") == "<redacted>"
    assert redact("TORCH_DISTRIBUTED_X", "hf_abcdefghijklmnop") == "<redacted>"
    assert redact("MASTER_ADDR", "https://user:pw@host:1") == "https://user:<redacted>@host:1"
    assert redact("NCCL_SOCKET_IFNAME", "eth0") == "eth0"


def test_markdown_block_from_a_saved_fleet() -> None:
    text = markdown(build_report(_fleet(16)))
    for needle in ("| glibc | glibc 2.35 |", "| CPU | Intel(R) Xeon(R) Platinum 8480+ (96 CPUs) |",
                   "| NCCL | 2.27.5 |", "| GPUs | 8 x NVIDIA H100 80GB HBM3 |",
                   "Packages: numpy 2.1.3, torch 2.9.1+cu128, transformers 4.57.1",
                   "GPU0     X      NV18", "NCCL_SOCKET_IFNAME=eth0",
                   "- torch: 2.9.1+cu128 [node[1-6,8-16]]; 2.8.0+cu126 [node7]", "`env-diff-torch`"):
        assert needle in text, needle


def test_markdown_cli_redacts_secrets_and_check_port_without_master() -> None:
    env = clean_env(NCCL_IB_SECRET="s3cr3t-value", TORCH_DISTRIBUTED_X="hf_abcdefghijklmnopq",
                    NCCL_DEBUG="INFO")
    r = run_cli("env", "--markdown", env=env, timeout=90)
    assert r.returncode in (0, 1), r.stderr
    assert r.stdout.startswith("<details>") and "| Python |" in r.stdout
    assert "NCCL_DEBUG=INFO" in r.stdout and "NCCL_IB_SECRET=<redacted>" in r.stdout
    assert "s3cr3t" not in r.stdout and "hf_abc" not in r.stdout
    r = run_cli("env", "--check-port", "--json", env=clean_env(), timeout=90)
    assert '"check-port-no-master"' in r.stdout and '"port-unreachable"' not in r.stdout


def test_a_malformed_node_document_goes_to_unreachable_not_a_crash() -> None:
    bad = copy.deepcopy(BASE)
    bad["interfaces"] = 5  # wrongly typed
    facts, failed = facts_from_results([NodeResult("node1", copy.deepcopy(BASE)),
                                        NodeResult("node2", bad),
                                        NodeResult("node3", None, "no answer")])
    assert [f.host for f in facts] == ["node1"]
    reasons = {r.host: r.error for r in failed}
    assert reasons["node3"] == "no answer" and "malformed node document" in str(reasons["node2"])


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(BASE)), _JSON, max_size=6))
def test_any_node_document_parses_or_is_a_failure_with_a_reason(over: dict) -> None:
    doc = {**copy.deepcopy(BASE), **over}
    facts, failed = facts_from_results([NodeResult("n1", doc)])
    assert len(facts) + len(failed) == 1
    if facts:  # the rules, the diff and both renderings run on whatever parsed
        report = build_report(facts + [make(host="n2")])
        markdown(report)
        render(report, Console(file=io.StringIO(), width=120))
    else:
        assert failed[0].error and "malformed node document" in failed[0].error
