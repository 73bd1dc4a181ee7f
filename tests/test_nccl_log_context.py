"""nccl-log reads context, not one line: the WARN's source file and the setup line before it
decide the component of a generic WARN, and hosts of one job are compared with each other."""

from __future__ import annotations

from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines


def _report(lines: list[str]):
    return analyze([parse_lines([ln + "\n" for ln in lines], "ctx.log")])


def _codes(report) -> set[str]:
    return {f.code for f in report.findings}


def test_source_file_decides_a_generic_cuda_failure() -> None:
    nvls = _report(["h1:10:11 [0] transport/nvls.cc:598 NCCL WARN Cuda failure 1 'invalid argument'"])
    assert "nccl-log-nvls" in _codes(nvls)
    f = next(f for f in nvls.findings if f.code == "nccl-log-nvls")
    assert "transport/nvls.cc:598" in f.detail
    launch = _report(["h1:10:11 [0] enqueue.cc:1500 NCCL WARN Cuda failure 1 'invalid argument'"])
    assert "nccl-log-cuda" in _codes(launch)


def test_the_setup_line_before_a_generic_warn_decides_it() -> None:
    lines = ["h1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
             "h1:10:11 [0] NCCL INFO misc/utils.cc:30 -> 1",  # unwinding: not context
             "h1:10:11 [0] misc/argcheck.cc:1 NCCL WARN Cuda failure 'invalid argument'"]
    report = _report(lines)
    f = next(f for f in report.findings if f.code == "nccl-log-p2p")
    assert "via P2P/IPC/read" in f.detail and "setting up" in f.detail
    # the same WARN without that line is a CUDA failure
    assert "nccl-log-cuda" in _codes(_report(lines[2:]))
    # a specific WARN keeps its own component whatever came before
    spec = _report([lines[0], "h1:10:11 [0] misc/shmutils.cc:1 NCCL WARN Error: failed to "
                    "extend /dev/shm/nccl-abc to 9637888 bytes"])
    assert "nccl-log-p2p" not in _codes(spec)


def _host(i: int, gid: str, driver: int, mtu: int, plugin: str) -> list[str]:
    h = f"node{i}"
    return [f"{h}:{100 + i}:{100 + i} [0] NCCL INFO cudaDriverVersion {driver}",
            f"{h}:{100 + i}:{100 + i} [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to {gid}",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO NCCL_DEBUG_FILE set by environment to /tmp/n.{h}",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO NET/Plugin: Loaded net plugin {plugin}",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.{i}<0>",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO Using network IB",
            f"{h}:{100 + i}:{200 + i} [0] NCCL INFO NET/IB: Dev 0 Port 1 qpn 1234 mtu {mtu} GID 3 (0/A0B0C0D)"]


def test_hosts_that_differ_are_named_with_folded_host_lists() -> None:
    lines: list[str] = []
    for i in range(1, 17):
        odd = i > 8
        lines += _host(i, "0" if odd else "3", 12020 if i == 16 else 12040,
                       5 if i == 3 else 3, "libnccl-net-ofi.so" if odd else "libnccl-net.so")
    report = _report(lines)
    diffs = {f.title: f for f in report.findings if f.code == "nccl-log-host-difference"}
    gid = diffs["hosts differ in NCCL_IB_GID_INDEX"]
    assert "hosts node[1-8] use NCCL_IB_GID_INDEX=3" in gid.detail
    assert "hosts node[9-16] use NCCL_IB_GID_INDEX=0" in gid.detail
    assert "hosts differ in NCCL_DEBUG_FILE" not in diffs  # per-host by design
    drv = diffs["hosts differ in CUDA driver"]
    assert "host node16 uses CUDA driver 12.2" in drv.detail and drv.hosts == ("node16",)
    assert "host node3 uses IB MTU 5" in diffs["hosts differ in InfiniBand MTU"].detail
    assert "hosts differ in net plugin" in diffs
    assert "hosts differ in transport" not in diffs  # all IB


def test_uniform_hosts_give_no_difference() -> None:
    lines: list[str] = []
    for i in range(1, 5):
        lines += _host(i, "3", 12040, 3, "libnccl-net.so")
    assert "nccl-log-host-difference" not in _codes(_report(lines))


def test_unhandled_error_names_the_component_of_the_warn_before_it() -> None:
    report = _report([
        "h1:10:11 [0] misc/ibvwrap.cc:1 NCCL WARN Call to ibv_reg_mr failed with error "
        "Cannot allocate memory errno 12",
        "RuntimeError: NCCL error: unhandled system error, NCCL version 2.18.6"])
    f = next(f for f in report.findings if f.code == "nccl-log-unhandled-error")
    assert "ibv_reg_mr" in f.title and "memory registration" in f.detail
