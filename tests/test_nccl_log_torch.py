"""nccl-log reads torch's NCCL error wrappers: the 'Last error:' text of a traceback is NCCL's
WARN, named by the same rules and catalogue as an NCCL_DEBUG WARN line (issue #41)."""

from __future__ import annotations

import json

import pytest

from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.model import FROM_TRACEBACK
from mldebug.nccllog.parse import parse_lines, parse_text


def _report(text: str):
    return analyze([parse_text(text, "tb.log")])


def _codes(report) -> set[str]:
    return {f.code for f in report.findings}


def _wrapper(version: str, reason: str = "internal error - please report this issue to the NCCL "
             "developers", where: str = "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970",
             prefix: str = "") -> str:
    return (f"{prefix}torch.distributed.DistBackendError: NCCL error in: {where}, {reason}, "
            f"NCCL version {version}\n{prefix}ncclInternalError: Internal check failed.\n")


CONNECT = "socketStartConnect: Connect to {ip}<{port}> failed : Software caused connection abort"


@pytest.mark.parametrize("version,ip,port,prefix,same_line", [
    ("2.19.3", "10.0.0.2", 45678, "", False),
    ("2.19.3", "10.0.0.2", 45678, "", True),
    ("2.18.1", "192.168.7.31", 29500, "[rank3]: ", False),
    ("2.21.5", "172.31.4.250", 61234, "[default0]:", True),
    ("2.14.3", "node-b.cluster.local", 40001, "", False),
])
def test_last_error_is_the_warn_whatever_the_layout(version, ip, port, prefix, same_line) -> None:
    warn = CONNECT.format(ip=ip, port=port)
    last = f"{prefix}Last error: {warn}\n" if same_line else f"{prefix}Last error:\n{prefix}{warn}\n"
    report = _report(_wrapper(version, prefix=prefix) + last)
    codes = _codes(report)
    assert "nccl-log-connect" in codes, codes
    [w] = report.warnings
    assert w.message == warn and w.origin == FROM_TRACEBACK and w.versions == [version]
    connect = next(f for f in report.findings if f.code == "nccl-log-connect")
    assert "'Last error:' line" in connect.detail and f"NCCL {version}" in connect.detail
    assert f"{ip}:{port}" in connect.detail
    unhandled = next(f for f in report.findings if f.code == "nccl-log-unhandled-error")
    assert "Last error" in unhandled.title and warn[:40] in unhandled.title
    assert "no NCCL WARN preceded it" not in unhandled.fix
    assert report.processes == []  # a traceback is not an NCCL process
    assert [p.version for p in report.tracebacks] == [version]
    if prefix.startswith("[rank3]"):
        assert [p.rank for p in report.tracebacks] == [3]
        assert "rank 3 (torch traceback)" in connect.detail


@pytest.mark.parametrize("warn", [
    CONNECT.format(ip="10.0.0.2", port=45678),
    "Error while creating shared memory segment /dev/shm/nccl-EoOvZr (size 7340384)",
    "Bootstrap : no socket interface found",
    "socketProgressOpt: Call to recv from 10.1.1.4<33759> failed : Connection reset by peer",
    "Cuda failure 'out of memory'",
    "Call to ibv_reg_mr failed with error Cannot allocate memory",
    "NET/IB : Got completion from peer 10.0.0.3<35522> with error 12, opcode 0, len 0, vendor err 129",
])
def test_the_traceback_warn_is_named_like_the_nccl_warn_line(warn: str) -> None:
    """The same rules and the same catalogue: the finding codes equal those of the WARN line
    NCCL_DEBUG would have printed (apart from torch's own 'unhandled error')."""
    line = _report(f"h1:10:11 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
                   f"h1:10:11 [0] NCCL WARN {warn}\n")
    tb = _report(_wrapper("2.21.5") + f"Last error:\n{warn}\n")
    assert _codes(tb) - {"nccl-log-unhandled-error"} == _codes(line) - {"nccl-log-unhandled-error"}
    assert _codes(tb) - {"nccl-log-unhandled-error"}, "the WARN was not named"


def test_a_warn_line_and_its_traceback_copy_are_one_warn() -> None:
    warn = CONNECT.format(ip="10.0.0.2", port=45678)
    text = (f"node1:200:201 [0] misc/socket.cc:484 NCCL WARN {warn}\n"
            + _wrapper("2.19.3", prefix="") + f"Last error:\n{warn}\n")
    report = _report(text)
    [w] = report.warnings
    assert w.processes == ["node1:200"] and w.origin == ""  # NCCL's own line said it
    assert report.tracebacks == []
    connect = next(f for f in report.findings if f.code == "nccl-log-connect")
    assert "'Last error:' line" not in connect.detail


def test_tracebacks_of_several_ranks_fold_into_one_finding() -> None:
    text = "".join(_wrapper("2.20.5", prefix=f"[rank{r}]: ") + f"[rank{r}]: Last error:\n"
                   f"[rank{r}]: " + CONNECT.format(ip="10.0.0.9", port=40000 + r) + "\n"
                   for r in range(4))
    report = _report(text)
    assert sorted(p.rank for p in report.tracebacks) == [0, 1, 2, 3]
    [connect] = [f for f in report.findings if f.code == "nccl-log-connect"]
    assert "4 process(es)" in connect.detail
    assert json.loads(json.dumps(report.to_dict()))["tracebacks"][0]["from_traceback"] is True


def test_remote_error_wrapper_and_other_reasons() -> None:
    text = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            "NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version "
            "2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote "
            "process exiting prematurely.\nLast error:\nNet : Connection closed by remote peer "
            "node7<50260>\n")
    report = _report(text)
    assert {"nccl-log-peer-closed", "nccl-log-unhandled-error"} <= _codes(report)
    old = ("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled "
           "system error, NCCL version 2.7.8\nncclSystemError: System call (e.g. socket, malloc) "
           "or external library call failed or device error.\nLast error:\n"
           "Error while creating shared memory segment /dev/shm/nccl-abc (size 9637888)\n")
    report = _report(old)
    assert "nccl-log-shm" in _codes(report)
    assert [p.version for p in report.tracebacks] == ["2.7.8"]


@pytest.mark.parametrize("text", [
    "Last error:\n",  # nothing follows
    _wrapper("2.19.3") + "Last error:\n\n\n\n",  # only blank lines follow
    _wrapper("2.19.3") + "Last error:\nh1:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n",
    "my app: retrying; Last error: disk quota exceeded\n",  # not torch's, no wrapper near
    "Last error:" * 5000 + "\n",
    "NCCL error in: " * 3000 + "\n",
    "NCCL error in: x:1, internal error, NCCL version 99999.1.1\nLast error: \x00\udcff\n",
    "ncclInternalError\nLast error:\n" + "x" * 200_000 + "\n",
])
def test_odd_input_is_never_a_traceback(text: str) -> None:
    report = analyze([parse_lines(text.splitlines(keepends=True), "odd")])
    for w in report.warnings:
        assert len(w.message) <= 2000
    if text.startswith("my app"):
        assert report.warnings == []
    if "NCCL INFO" in text:
        assert report.tracebacks == [] and report.processes[0].bootstrap == ["eth0"]
