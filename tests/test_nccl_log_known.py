"""Known NCCL bugs by version (mldebug/nccllog/known_issues.json) in nccl-log reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mldebug.nccllog import known
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines

REAL = Path(__file__).parent / "fixtures" / "nccl" / "real"


def _report(lines: list[str]):
    return analyze([parse_lines(lines, "t.log")])


def _log(version: str, *body: str) -> list[str]:
    return [f"gpu01:3301:3301 [2] NCCL INFO NCCL version {version}\n",
            *(f"gpu01:3301:3400 [2] {b}\n" for b in body)]


def _known(report) -> list:
    return [f for f in report.findings if f.code == "nccl-log-known-bug"]


def test_table_rows_are_well_formed_and_sourced() -> None:
    rows = json.loads(known.PATH.read_text())["rows"]
    assert len(rows) >= 9 and len({r["id"] for r in rows}) == len(rows)
    for row in known.load():
        assert row.sources and all(s.startswith("https://github.com/NVIDIA/") or
                                   s.startswith("https://github.com/pytorch/") for s in row.sources)
        last, fixed = known.version_tuple(row.last), known.version_tuple(row.fixed)
        assert last is not None and fixed is not None and last < fixed, row.id
        if row.first:
            first = known.version_tuple(row.first)
            assert first is not None and first <= last, row.id
        assert (row.message is None) != (row.env is None), row.id


def test_uds_bind_in_2_20_3_is_the_known_commsplit_bug_fixed_in_2_20_5() -> None:
    warn = ("misc/ipcsocket.cc:57 NCCL WARN UDS: Binding to socket "
            "/tmp/nccl-socket-2-e647f8d8e15809a1 failed : Address already in use (98)")
    hits = _known(_report(_log("2.20.3+cuda12.3", warn)))
    assert len(hits) == 1
    f = hits[0]
    assert "2.20.3" in f.title and "fixed in 2.20.5" in f.title
    assert "https://github.com/NVIDIA/nccl/issues/1185" in f.detail
    assert "2.20.5" in f.fix
    # the fixed version and an unrelated message do not match
    assert not _known(_report(_log("2.20.5+cuda12.3", warn)))
    assert not _known(_report(_log("2.20.3+cuda12.3", "misc/socket.cc:1 NCCL WARN Net : "
                                   "Connection closed by remote peer node2<4711>")))


def test_source_file_is_part_of_the_signature() -> None:
    cuda = "NCCL WARN Cuda failure 'invalid argument'"
    assert _known(_report(_log("2.18.3+cuda12.1", f"transport.cc:154 {cuda}")))
    assert not _known(_report(_log("2.18.3+cuda12.1", f"enqueue.cc:1500 {cuda}")))
    assert not _known(_report(_log("2.18.6+cuda12.1", f"transport.cc:154 {cuda}")))


def test_a_setting_can_be_the_signature() -> None:
    env = "NCCL INFO NCCL_SET_THREAD_NAME set by environment to 1"
    hits = _known(_report(_log("2.12.10+cuda11.6", env)))
    assert hits and "fixed in 2.12.12" in hits[0].title
    assert not _known(_report(_log("2.12.12+cuda11.6", env)))
    assert not _known(_report(_log("2.12.10+cuda11.6", env.replace(" 1", " 0"))))


def test_info_level_signature_in_a_real_log() -> None:
    path = REAL / "nccl-too-old-rtx5090-2.25.1.log"
    body = [ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith("# ")]
    hits = _known(_report(body))
    assert hits and "fixed in 2.26.2" in hits[0].title


@pytest.mark.parametrize("version,expect", [("2.18.1", True), ("2.18.0", True),
                                             ("2.18.3", False), ("2.19.4", False)])
def test_open_lower_bound(version: str, expect: bool) -> None:
    warn = ("misc/shmutils.cc:62 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-Xy1 (size 9637888)")
    assert bool(_known(_report(_log(version + "+cuda12.1", warn)))) is expect


def test_a_setting_that_differs_between_ranks_can_be_the_signature() -> None:
    def host(i: int, cross: str | None, version: str) -> list[str]:
        out = [f"n{i}:{i}:{i} [0] NCCL INFO NCCL version {version}\n",
               f"n{i}:{i}:{i} [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0\n"]
        if cross is not None:
            out.append(f"n{i}:{i}:{i} [0] NCCL INFO NCCL_CROSS_NIC set by environment to {cross}\n")
        return out
    mixed = host(1, "0", "2.20.5+cuda12.4") + host(2, "1", "2.20.5+cuda12.4") + host(3, None, "2.20.5+cuda12.4")
    hits = _known(_report(mixed))
    assert hits and "fixed in 2.21.5" in hits[0].title
    assert not _known(_report(host(1, "0", "2.20.5+cuda12.4") + host(2, "0", "2.20.5+cuda12.4")))
    assert not _known(_report(host(1, "0", "2.21.5+cuda12.4") + host(2, "1", "2.21.5+cuda12.4")))
