"""mldebug nccl-log on log fixtures written in NCCL's own line formats."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import run_cli

from mldebug.findings import Severity
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import load, parse_text

FIX = Path(__file__).parent / "fixtures" / "nccl"


def by_code(report):
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.code, []).append(f)
    return out


def test_line_formats_old_new_and_launcher_prefixes():
    text = "\n".join([
        "node1:11:12 [3] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "[rank7]:node2:21:22 [1] NCCL INFO Using network IB",
        "[default2]:node3:31:32 [2] NCCL INFO Using network Socket",
        "5: node4:41:42 [0] NCCL INFO Using network IB",
        "[2024-06-01 10:12:13] node5:51:52 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: failed",
        "node6:61:62 [0] transport/net_ib.cc:100 (ncclIbConnect) NCCL WARN NET/IB : bad",
        "some unrelated application line",
    ])
    log = parse_text(text)
    procs = log.processes
    assert set(procs) == {f"node{i}:{i}1" for i in range(1, 7)}
    assert procs["node1:11"].version == "2.21.5+cuda12.4" and procs["node1:11"].devices == {3}
    assert procs["node2:21"].launcher_rank == 7 and procs["node3:31"].launcher_rank == 2
    assert procs["node4:41"].launcher_rank == 5
    assert procs["node5:51"].warns == ["socketStartConnect: failed"]
    assert procs["node6:61"].warns == ["NET/IB : bad"]
    assert log.nccl_lines == 6


def test_healthy_ib_job_per_process_files():
    report = analyze(load([FIX / "ib-healthy"]))
    assert [p.rank for p in report.processes] == [0, 1, 2, 3]
    assert [p.host for p in report.processes] == ["node1", "node1", "node2", "node2"]
    assert all(p.transport == "IB" for p in report.processes)
    assert report.processes[0].nets[0].interfaces == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert report.processes[0].nets[0].oob == "eno1:10.0.12.81<0>"
    assert report.processes[0].version == "2.21.5+cuda12.4"
    assert report.processes[2].env["NCCL_SOCKET_IFNAME"] == "eno1"
    [comm] = report.comms
    assert comm.completed == [0, 1, 2, 3] and comm.started_not_completed == [] and comm.absent == []
    # the book's grep | wc -l, per op, over all four files
    assert report.collectives == {0: {"AllGather": 32, "AllReduce": 20, "Broadcast": 12,
                                      "ReduceScatter": 8}}
    assert [f for f in report.findings if f.severity in (Severity.ERROR, Severity.WARNING)] == []


def test_collective_counts_match_grep_wc():
    text = (FIX / "ib-healthy" / "nccl-log.node1.40211.txt").read_text()
    report = analyze([parse_text(text)])
    for op, n in report.collectives[0].items():
        assert n == len(re.findall(rf"NCCL INFO {op}: opCount", text))


def test_mixed_cluster_problems_are_all_found():
    report = analyze(load([FIX / "mixed-cluster.log"]))
    found = by_code(report)
    mismatch = found["nccl-log-version-mismatch"][0]
    assert mismatch.severity is Severity.ERROR and "2.18.1+cuda12.1" in mismatch.detail
    virtual = {f.title for f in found["nccl-log-iface-virtual"]}
    assert "NCCL uses interface docker0 (loopback/container/virtual)" in virtual
    bond = found["nccl-log-ib-bond"][0]
    assert "mlx5_bond_0" in bond.title and "rank 2" in bond.detail and "rank 3" in bond.detail
    sock = found["nccl-log-socket-vs-ib"][0]
    assert sock.severity is Severity.ERROR
    assert "Socket: rank 4 (node3:9201), rank 5 (node3:9202)" in sock.detail
    odd = found["nccl-log-odd-interfaces"][0]
    # three choices, two processes each: the first seen (node1's) counts as the majority
    assert set(odd.hosts) == {"node2", "node3"}
    init = found["nccl-log-init-incomplete"][0]
    assert init.title.startswith("rank(s) 5 never completed init of communicator 0x1d4e2f6a8b9c0d11")
    # the two WARN kinds are now explained by their cause's rule, not a bare "NCCL WARN"
    [connect] = found["nccl-log-connect"]
    assert "socketStartConnect" in connect.detail
    assert "2 process(es)" in connect.detail and "rank 4" in connect.detail and "rank 5" in connect.detail
    assert "NCCL_SOCKET_IFNAME" in connect.fix
    assert any("Got completion from peer" in w.detail for w in found["nccl-log-ib-completion"])


def test_torchrun_log_with_rank_prefixes_and_split():
    [log] = load([FIX / "torchrun-socket-lo.log"], split=r"iteration: ")
    report = analyze([log])
    assert [p.rank for p in report.processes] == [0, 1]
    assert all(p.transport == "Socket" for p in report.processes)
    assert any(f.code == "nccl-log-iface-virtual" and "interface lo " in f.title
               for f in report.findings)
    # slice 0: before the first iteration; iteration N does N all-reduces + 1 all-gather, x2 ranks
    assert report.collectives == {
        0: {"Broadcast": 2},
        1: {"AllGather": 2, "AllReduce": 2},
        2: {"AllGather": 2, "AllReduce": 4},
        3: {"AllGather": 2, "AllReduce": 6},
    }


def test_book_fastsocket_line_hints_at_wrong_plugin():
    report = analyze(load([FIX / "fastsocket.log"]))
    [hint] = [f for f in report.findings if f.code == "nccl-log-plugin"]
    assert "FastSocket" in hint.title and hint.severity is Severity.HINT
    assert report.processes[0].nets[0].interfaces == ["ibs108", "ibs109", "ibs110", "ibs111"]


def test_file_without_nccl_lines():
    report = analyze([parse_text("hello\nworld\n")])
    assert [f.code for f in report.findings] == ["nccl-log-empty"]


def test_cli_json_and_human_output(tmp_path):
    r = run_cli("nccl-log", str(FIX / "mixed-cluster.log"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["findings"][0]["severity"] == "error"
    assert [c["comm_id"] for c in doc["communicators"]] == ["0x1d4e2f6a8b9c0d11"]
    assert doc["processes"][4]["transport"] == "Socket"

    r = run_cli("nccl-log", str(FIX / "ib-healthy"), "--split", "opCount 10 ",
                env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "Communicator init" in r.stdout and "Collective calls" in r.stdout
    assert "mlx5_0:1/IB" in r.stdout

    r = run_cli("nccl-log", str(tmp_path / "missing.log"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("nccl-log", str(FIX / "fastsocket.log"), "--split", "(")
    assert r.returncode == 2 and "regular expression" in r.stderr


def test_plugin_on_some_hosts_p2p_disabled_and_version_mismatch_in_real_line_shapes():
    # line shapes from NVIDIA/nccl-tests#227 (plugin), NVIDIA/nccl#1936 (no plugin) and
    # NVIDIA/nccl-tests#373 ('X set by environment to Y')
    text = "\n".join([
        "ai-worker01:5771:5783 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "ai-worker01:5771:5783 [0] NCCL INFO P2P plugin IBext_v8",
        "ai-worker01:5771:5783 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "ai-worker02:4940:4951 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "ai-worker02:4940:4951 [0] NCCL INFO P2P plugin IBext_v8",
        "ai-worker03:205632:205772 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. ",
        "ai-worker03:205632:205772 [0] NCCL INFO NCCL version 2.27.5+cuda12.9",
        "ai-worker03:205632:205772 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1",
        "ai-worker03:205633:205773 [1] NCCL INFO NCCL_P2P_DISABLE set by environment to 1",
    ])
    found = by_code(analyze([parse_text(text)]))
    [plugin] = found["nccl-log-plugin-mismatch"]
    assert "no plugin: ai-worker03" in plugin.detail and "ai-worker[01-02]" in plugin.detail
    assert plugin.hosts == ("ai-worker03",)
    [p2p] = found["nccl-log-p2p-disabled"]
    assert p2p.hosts == ("ai-worker03",) and "NCCL_P2P_DISABLE=1" in p2p.detail
    [mismatch] = found["nccl-log-version-mismatch"]
    assert "2.21.5+cuda12.4" in mismatch.detail and "2.27.5+cuda12.9" in mismatch.detail


def test_driver_older_than_the_runtime_from_the_numbers():
    text = ("n1:1:1 [0] NCCL INFO cudaDriverVersion 11040\n"
            "n1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    [f] = by_code(analyze([parse_text(text)]))["nccl-log-cuda-driver"]
    assert "CUDA 11.4" in f.detail and f.hosts == ("n1",)


def test_pytorch_watchdog_lines_point_to_mldebug_log(tmp_path):
    """A log with PyTorch's watchdog timeout but no NCCL_DEBUG lines is not 'empty'."""
    from mldebug.cli import main

    src = Path(__file__).parent / "fixtures" / "log" / "basicsr-737-same-collective.log"
    import contextlib
    import io
    import json as _json

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["nccl-log", str(src), "--json"]) == 0
    codes = [f["code"] for f in _json.loads(buf.getvalue())["findings"]]
    assert "nccl-log-torch-watchdog" in codes and "nccl-log-empty" not in codes
