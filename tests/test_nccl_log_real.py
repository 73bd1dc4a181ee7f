"""nccl-log on real logs from public issue threads: the report names the cause the thread states.

Each fixture under tests/fixtures/nccl/real/ starts with '# source:', '# cause:' and
'# expect:' lines (README.md there lists them); the header is not fed to the parser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines

REAL = Path(__file__).parent / "fixtures" / "nccl" / "real"
FILES = sorted(REAL.glob("*.log"))


def _header(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^# (\w+): (.*)$", path.read_text(), re.M))


def _report(path: Path):
    body = [line for line in path.read_text().splitlines(keepends=True)
            if not line.startswith("# ")]
    return analyze([parse_lines(body, path.name)])


def test_there_are_at_least_25_real_logs_covering_nccl_2_3_to_2_27():
    assert len(FILES) >= 25
    versions = {_header(p)["nccl"] for p in FILES}
    assert {"2.3.7", "2.4", "2.7.8", "2.27"} <= versions
    assert all(_header(p)["source"].startswith("https://github.com/") for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_report_names_the_stated_cause(path: Path) -> None:
    head = _header(path)
    report = _report(path)
    codes = {f.code for f in report.findings}
    assert "nccl-log-empty" not in codes, "a real NCCL log must never read as empty"
    for want in head["expect"].split(","):
        if "=" in want:  # a parsed fact, e.g. transport=Socket
            key, value = want.split("=", 1)
            if key == "transport":
                assert value in {p.transport for p in report.processes}, \
                    [(p.key, p.transport) for p in report.processes]
            elif key == "socket_ifname":
                assert {p.env.get("NCCL_SOCKET_IFNAME") for p in report.processes} == {value}
            else:
                raise AssertionError(f"unknown expectation {want}")
        else:
            assert want in codes, (want, sorted(codes))
    for f in report.findings:
        assert f.fix, f"finding {f.code} has no fix"
