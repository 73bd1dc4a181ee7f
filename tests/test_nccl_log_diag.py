"""NCCL 2.31 diagnostics (NCCL DIAG lines): the docs' examples and lines from NCCL's format
strings name the cause; the same rule on lines written differently; never more ranks than
the lines carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from mldebug.findings import Severity
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.diag import read_line
from mldebug.nccllog.parse import load, parse_text

FIX = Path(__file__).parent / "fixtures" / "nccl_log_diag"


def _findings(path: Path):
    return analyze(load([path])).findings


def _by_code(findings, code):
    return [f for f in findings if f.code == code]


def test_readme_lists_every_fixture_with_its_source():
    readme = (FIX / "README.md").read_text()
    for p in FIX.glob("*.log"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| {p.name} "))
        assert "https://docs.nvidia.com/" in row or "src/diagnostics" in row


def test_line_shapes():
    d = read_line("[rank0]: node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=INFO "
                  "on rank(s) {0,1}")
    assert d is not None and (d.host, d.pid, d.level, d.check) == ("node042", 12345, "INFO",
                                                                    "NCCL environment")
    d = read_line("NCCL DIAG === NCCL Diagnostics ===")
    assert d is not None and d.host is None and d.level is None
    assert read_line("NCCL INFO comm 0x1 rank 0") is None


def test_docs_p2p_ok_is_info_only():
    fs = _findings(FIX / "p2p-ok-docs.log")
    (f,) = _by_code(fs, "nccl-log-diag-ok")
    assert f.severity is Severity.INFO and "network between nodes" in f.fix
    assert not [x for x in fs if x.severity is not Severity.INFO]


def test_docs_p2p_partial_names_no_pair_it_does_not_have():
    (f,) = _by_code(_findings(FIX / "p2p-partial-docs.log"), "nccl-log-diag-p2p")
    assert "52/56" in f.detail and "do not name the GPU pairs" in f.detail
    assert "rank" not in f.title and f.hosts == ()


def test_pair_failures_from_source_formats_name_the_pairs_and_nccls_advice():
    (f,) = _by_code(_findings(FIX / "p2p-pair-from-source.log"), "nccl-log-diag-p2p")
    assert f.severity is Severity.ERROR and "2 GPU pair(s)" in f.title
    assert "rank 2 (GPU 2) -> rank 5 (GPU 5) over NVL" in f.detail
    assert "rank 5 (GPU 5) -> rank 2 (GPU 2)" in f.detail
    assert "cuMem POSIX-FD sharing" in f.fix and f.hosts == ("dgx-a07",)


def test_same_p2p_rule_on_other_hosts_ranks_and_reason():
    text = ("[1,0]<stdout>:gb200-r3n1:777 NCCL DIAG [INFO] p2p: write mismatch srcRank=9 "
            "srcCudaDev=1 srcNvmlDev=1 dstRank=14 dstCudaDev=2 dstNvmlDev=2 path=NVL "
            "handle=CUMEM_FABRIC expected=0x4000000200000001 got=0x0000000000000abc "
            "verify=0x0000000000000def; check the IMEX domain with 'nvidia-imex-ctl -H -N' "
            "(nodes READY, connectivity C) and verify access to "
            "/dev/nvidia-caps-imex-channels/channel*\n")
    (f,) = _by_code(analyze([parse_text(text)]).findings, "nccl-log-diag-p2p")
    assert "rank 9 (GPU 1) -> rank 14 (GPU 2)" in f.title and "write mismatch" in f.detail
    assert "nvidia-imex-ctl" in f.fix and f.hosts == ("gb200-r3n1",)


def test_docs_net_bw_names_the_slow_rank_and_node():
    (f,) = _by_code(_findings(FIX / "net-bw-docs.log"), "nccl-log-diag-net-bw")
    assert "3 (node0)" in f.title and "265.1" in f.detail and f.hosts == ("node0",)


def test_docs_env_mismatch_of_two_equal_groups_names_no_odd_one_out():
    (f,) = _by_code(_findings(FIX / "ras-env-mismatch-docs.log"), "nccl-log-diag-env")
    assert "NCCL_DEBUG differs" in f.title and "rank(s) 4" not in f.title
    assert "NCCL_DEBUG=INFO on rank(s) 0-3" in f.detail
    assert "NCCL_DEBUG=WARN on rank(s) 4-7" in f.detail


def test_env_mismatch_written_differently_names_the_single_odd_rank():
    lines = [
        "trn-17:4242 NCCL DIAG [INFO] NCCL environment: mismatch across 16 ranks in comm "
        "0xfeed for NCCL_SOCKET_IFNAME",
        "trn-17:4242 NCCL DIAG [INFO] NCCL environment: NCCL_SOCKET_IFNAME=ens5 on rank(s) "
        "{0,1,2,3,4,5,6,7,8,9,10,11,12,14,15}",
        "trn-17:4242 NCCL DIAG [INFO] NCCL environment: NCCL_SOCKET_IFNAME=eth0 on rank(s) {13}",
    ]
    (f,) = _by_code(analyze([parse_text("\n".join(lines))]).findings, "nccl-log-diag-env")
    assert "rank(s) 13: NCCL_SOCKET_IFNAME=eth0" in f.title
    # a cut list ('...') is never read as complete: no odd one out then
    lines[1] = lines[1].replace("14,15}", "14,...}")
    (f,) = _by_code(analyze([parse_text("\n".join(lines))]).findings, "nccl-log-diag-env")
    assert "rank(s) 13" not in f.title and "NCCL cut the list" in f.detail


def test_docs_ras_ok_report():
    fs = _findings(FIX / "ras-ok-docs.log")
    (f,) = _by_code(fs, "nccl-log-diag-ok")
    assert "5 check(s)" in f.title
    assert all(x.severity is Severity.INFO for x in fs)


@pytest.mark.parametrize("line", [
    "node1:1 NCCL DIAG [INFO] GPU inventory: mismatch across 8 ranks in comm 0x12: "
    "NVIDIA H100 on rank(s) {0,1,2,3,4,5,6}",
    "NCCL DIAG [INFO] ECC: uncorrected volatile DRAM errors on rank(s) {5}",
])
def test_other_ras_checks_are_shown_with_the_ranks_they_list(line: str) -> None:
    (f,) = _by_code(analyze([parse_text(line)]).findings, "nccl-log-diag-info")
    assert f.severity is Severity.WARNING and "rank(s)" in f.title


def test_net_bw_notes_without_a_slow_rank_or_failure_are_info():
    line = ("node0:1 NCCL DIAG [INFO] net bw: shared devices present: ranks sharing a device "
            "split its bandwidth in comm 0x1")
    (f,) = _by_code(analyze([parse_text(line)]).findings, "nccl-log-diag-net-bw")
    assert f.severity is Severity.INFO and "rank(s)" not in f.title


def test_hostile_diag_lines_are_read_in_bounded_time():
    import time

    bad = ["x:1 NCCL DIAG [INFO] NCCL environment: " + "NCCL_A=1 on rank(s) {" * 3000,
           "x:1 NCCL DIAG [INFO] p2p: write mismatch " + "srcRank=1 " * 6000,
           "NCCL DIAG [INFO] " + ":" * 60000]
    t0 = time.process_time()
    for _ in range(20):
        analyze([parse_text("\n".join(bad))])
    assert time.process_time() - t0 < 5
