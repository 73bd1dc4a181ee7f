"""NCCL interface-list syntax, the cross-node diff, finding merging and the presets."""

from __future__ import annotations

import subprocess

import pytest
from envfacts import make

from mldebug.env import ifname, presets
from mldebug.env.diff import diff, merge_findings
from mldebug.env.report import build_report
from mldebug.errors import UsageError
from mldebug.findings import Severity

NAMES = ["lo", "eth0", "eth1", "eth10", "docker0", "ib0", "ibs108", "virbr0"]


@pytest.mark.parametrize("value,expected", [
    ("eth", ["eth0", "eth1", "eth10"]),               # prefix
    ("=eth0", ["eth0"]),                               # exact
    ("==eth0", ["eth0"]),                              # parseStringList skips the 2nd '='
    ("^^docker", ["lo", "eth0", "eth1", "eth10", "ib0", "ibs108", "virbr0"]),
    ("=eth0,eth1", ["eth0", "eth1"]),
    ("^docker", ["lo", "eth0", "eth1", "eth10", "ib0", "ibs108", "virbr0"]),
    ("^=docker0,lo", ["eth0", "eth1", "eth10", "ib0", "ibs108", "virbr0"]),
    ("eth1", ["eth1", "eth10"]),                       # prefix, so eth10 too
    ("=", NAMES),                                      # empty list matches everything
])
def test_socket_ifname_like_nccl(value, expected):
    assert ifname.select(ifname.parse(value), NAMES) == expected


def test_ib_hca_ports():
    spec = ifname.parse("=mlx5_0:1,mlx5_1")
    ports = [("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_10", 1)]
    assert ifname.select_ports(spec, ports) == [("mlx5_0", 1), ("mlx5_1", 1)]
    assert ifname.select_ports(ifname.parse("^mlx5_bond_0:1"), [("mlx5_bond_0", 1), ("mlx5_0", 1)]) \
        == [("mlx5_0", 1)]


def test_one_character_value_ignored_and_auto_order():
    assert ifname.socket_ifname_ignored("e") and not ifname.socket_ifname_ignored("=e")
    assert ifname.auto_select(["lo", "docker0", "eth0", "ib0"]) == ["ib0"]
    assert ifname.auto_select(["lo", "docker0", "eth0"]) == ["eth0"]
    assert ifname.auto_select(["lo", "docker0"]) == ["docker0"]


def test_diff_reports_env_and_version_differences_with_odd_nodes():
    nodes = [make({"NCCL_SOCKET_IFNAME": "eth", "RANK": str(i)}, host=f"node{i}") for i in range(3)]
    nodes[2].env["NCCL_SOCKET_IFNAME"] = "ib"
    nodes[2].torch["version"] = "2.8.0+cu128"
    rows, findings = diff(nodes)
    by_key = {r.key: r for r in rows}
    assert by_key["NCCL_SOCKET_IFNAME"].odd == ["node2"]
    assert by_key["torch"].odd == ["node2"]
    assert "RANK" not in by_key  # differs by design
    sev = {f.code: f for f in findings}
    assert sev["env-diff-torch"].severity is Severity.ERROR
    assert sev["env-diff-variables"].hosts == ("node2",)
    # eth on node0/1 selects eth0; ib on node2 selects nothing
    assert by_key["nccl socket ifaces"].values == {"node0": "eth0", "node1": "eth0", "node2": "none"}


def test_diff_of_ib_hca_selection():
    from envfacts import ib

    hcas = ib("mlx5_0", "mlx5_1")
    nodes = [make({"NCCL_IB_HCA": "=mlx5_0"}, host="a", ib_devices=hcas),
             make({"NCCL_IB_HCA": "=mlx5_0"}, host="b", ib_devices=hcas),
             make({"NCCL_IB_HCA": "=mlx5_0"}, host="c", ib_devices=ib("mlx5_1"))]
    rows, findings = diff(nodes)
    row = {r.key: r for r in rows}["nccl ib ports"]
    assert row.values == {"a": "mlx5_0:1", "b": "mlx5_0:1", "c": "none"} and row.odd == ["c"]


def test_diff_of_identical_nodes_is_empty():
    rows, findings = diff([make(host="a"), make(host="b")])
    assert rows == [] and findings == []


def test_same_finding_on_many_nodes_is_merged():
    report = build_report([make({"CUDA_LAUNCH_BLOCKING": "1"}, host=h) for h in ("a", "b", "c")])
    blocking = [f for f in report.findings if f.code == "debug-setting-on"]
    assert len(blocking) == 1 and blocking[0].hosts == ("a", "b", "c")
    assert merge_findings([]) == []


def test_unreachable_node_is_an_error():
    report = build_report([make(host="a")], {"b": "unreachable: ssh connection refused"})
    assert report.has_errors
    assert any(f.code == "node-unreachable" and f.hosts == ("b",) for f in report.findings)


@pytest.mark.parametrize("name", ["hang", "nccl", "cuda-sync", "oom"])
def test_presets_are_valid_shell_with_a_reason_per_line(name):
    text = presets.render(name)
    exports = [ln for ln in text.splitlines() if ln.startswith("export ")]
    assert exports and all("  # " in ln for ln in exports)
    # bash accepts it and the variables really get set
    names = [ln.split()[1].split("=")[0] for ln in exports]
    out = subprocess.run(["bash", "-c", text + "\n" + "; ".join(f'echo "${n}"' for n in names)],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert all(v for v in out[:len(names)])


def test_preset_contents_and_off():
    hang = presets.render("hang")
    for var in ("TORCH_NCCL_DESYNC_DEBUG=1", "TORCH_FR_BUFFER_SIZE=2000",
                "TORCH_NCCL_DUMP_ON_TIMEOUT=1", "TORCH_FR_DUMP_TEMP_FILE="):
        assert f"export {var}" in hang
    assert "NCCL_DEBUG_FILE=/tmp/nccl-log.%h.%p.txt" in presets.render("nccl")
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in presets.render("oom")
    off = presets.render("off")
    for var in ("TORCH_FR_BUFFER_SIZE", "NCCL_DEBUG", "CUDA_LAUNCH_BLOCKING",
                "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        assert f"unset {var}\n" in off
    with pytest.raises(UsageError):
        presets.render("nope")
