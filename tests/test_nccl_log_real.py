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


def test_there_are_at_least_48_real_logs_covering_nccl_2_3_to_2_27():
    assert len(FILES) >= 48
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
        if "~" in want:  # a finding code whose text names the cause, e.g. nccl-log-cuda~out of memory
            code, text = want.split("~", 1)
            named = [f for f in report.findings if f.code == code
                     and text.lower() in (f.title + f.detail + f.fix).lower()]
            assert named, (want, [(f.code, f.title, f.detail[:200]) for f in report.findings])
        elif "=" in want:  # a parsed fact, e.g. transport=Socket
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


def test_old_bare_version_line_belongs_to_the_process_before_it() -> None:
    report = _report(REAL / "veth-ansi-2.7.8.log")
    assert [p.version for p in report.processes] == ["2.7.8+cuda11.1"]
    report = _report(REAL / "lo-docker-2.3.7.log")
    assert [p.version for p in report.processes] == ["2.3.7+cuda9.0"]


def test_redacted_and_missing_ids_and_launcher_labels() -> None:
    redacted = _report(REAL / "ibv-modify-qp-redacted-2.27.log").processes
    assert [(p.host, p.devices) for p in redacted] == [("host-01.example.com", {5})]
    mpirun = _report(REAL / "mpirun-wsl-sysfs.log").processes
    assert sorted(p.rank for p in mpirun) == [0, 1]
    trainer = _report(REAL / "ifname-missing-trainer-prefix.log").processes
    assert [p.rank for p in trainer] == [3]
    kubeflow = _report(REAL / "ring-loop-back-hostid-2.12.12.log").processes
    assert [p.host for p in kubeflow] == ["card-16-final-4509-master-0"]  # 'pytorch ' label dropped
    ray = _report(REAL / "veth-ray-pid-prefix.log").processes
    assert [p.transport for p in ray] == ["Socket"]
    merged = _report(REAL / "merged-nics-ibext.log").processes[0]
    assert merged.net is not None and merged.net.interfaces == ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"]
    assert merged.plugin == "IBext_v8"
