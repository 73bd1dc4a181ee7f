"""NCCL version x GPU architecture (mldebug/nccllog/versions.json, versions.py) and time
prefixes (NCCL_DEBUG_TIMESTAMP_FORMAT): a real thread's lines name the cause; the same rule
on lines written differently; no finding where the lines do not show the mismatch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mldebug.findings import Severity
from mldebug.nccllog import versions
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines, parse_text

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "nccl_log_versions"
REAL = ROOT / "tests" / "fixtures" / "nccl" / "real"
MIRROR = Path("/work/.mirror/NVIDIA+nccl/repo")


def _body(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith("# ")]


def _gpu_findings(text: str):
    return [f for f in analyze([parse_text(text)]).findings if f.code == "nccl-log-version-gpu"]


# ------------------------------------------------------------------ the table itself
def test_table_comes_from_nccl_tags_and_knows_the_architectures_of_each_build():
    t = versions.load()
    assert len(t.releases) >= 60 and all(re.fullmatch(r"v\d+\.\d+\.\d+-\d+", r.tag)
                                          for r in t.releases)
    rel = {r.text: r for r in t.releases}
    # makefiles/common.mk: Hopper SASS from 2.15 (CUDA >= 11.8), Blackwell from 2.25 (12.8)
    assert not any(versions.native(b, 90) for b in rel["2.14.3"].builds)
    b = versions.build_for(rel["2.15.5"], (11, 8))
    assert b is not None and 90 in b.sass
    assert versions.build_for(rel["2.25.1"], (12, 2)).sass[-1] == 90  # type: ignore[union-attr]
    assert {100, 120} <= set(versions.build_for(rel["2.25.1"], (12, 8)).sass)  # type: ignore[union-attr]
    # 2.27.3 with CUDA 13 drops the pre-Volta archs but keeps Blackwell; 2.30 adds sm_110
    assert 50 not in versions.build_for(rel["2.27.3"], (13, 0)).sass  # type: ignore[union-attr]
    assert 110 in versions.build_for(rel["2.30.7"], (13, 0)).sass  # type: ignore[union-attr]
    first = versions.first_native(120, t)
    assert first is not None and first[0].text == "2.25.1" and first[1].cuda == (12, 8)
    # release notes: the 'Fix ...' bullets, continuation lines joined
    assert any(f.startswith("Fix UDS connection failure when using ncclCommSplit")
               for f in rel["2.20.5"].fixes)
    assert "described in the XML" in next(f for f in rel["2.8.3"].fixes if "#379" in f)


def test_known_issues_are_fixed_in_releases_of_the_table():
    rows = json.loads((ROOT / "mldebug/nccllog/known_issues.json").read_text())["rows"]
    texts = {r.text for r in versions.load().releases}
    assert all(r["fixed"] in texts for r in rows), [r["fixed"] for r in rows]
    # the UDS row quotes a fix the 2.20.5 release notes list
    assert versions.release_note("2.20.5", "UDS connection failure") is not None


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no NVIDIA/nccl mirror on this machine")
def test_the_script_regenerates_the_committed_table(tmp_path: Path) -> None:
    out = tmp_path / "versions.json"
    (tmp_path / "known_issues.json").write_text(
        (ROOT / "mldebug/nccllog/known_issues.json").read_text())
    out.write_text((ROOT / "mldebug/nccllog/versions.json").read_text())
    r = subprocess.run([sys.executable, str(ROOT / "scripts/nccl_versions.py"), "--repo",
                        str(MIRROR), "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    new = json.loads(out.read_text())
    old = json.loads((ROOT / "mldebug/nccllog/versions.json").read_text())
    # the mirror may hold newer tags than the committed table: every committed row is the same
    by_tag = {r["tag"]: r for r in new["releases"]}
    assert all(by_tag[r["tag"]] == r for r in old["releases"])


# ------------------------------------------------------------------ real thread
def test_real_thread_rtx5090_with_nccl_2_14_names_the_missing_kernels():
    head = dict(re.findall(r"^# (\w+): (.*)$", (FIX / "rtx5090-2.14.3-pytorch-152077.log")
                           .read_text(), re.M))
    assert head["source"].startswith("https://github.com/")
    report = analyze([parse_lines(_body(FIX / "rtx5090-2.14.3-pytorch-152077.log"), "152077")])
    found = [f for f in report.findings if f.code == head["expect"]]
    assert len(found) == 1, [(f.code, f.title) for f in report.findings]
    f = found[0]
    assert f.severity is Severity.ERROR  # the log shows the failure it explains
    assert "2.14.3+cuda11.8" in f.title and "sm_120" in f.title
    assert "CUDA 11.8" in f.detail and "sm_80" in f.detail and "named symbol not found" in f.detail
    assert "NCCL >= 2.25.1 built with CUDA >= 12.8" in f.fix
    assert f.hosts == ("4d1a2ae696c8",)


def test_a_log_that_names_no_gpu_gets_no_version_gpu_finding():
    """NVIDIA/nccl#1637: RTX 5090 with 2.25.1+cuda12.2, but no line names the GPU."""
    report = analyze([parse_lines(_body(REAL / "nccl-too-old-rtx5090-2.25.1.log"), "1637")])
    assert "nccl-log-version-gpu" not in {f.code for f in report.findings}


# ------------------------------------------------------------------ written differently
def test_same_rule_on_another_version_host_and_gpu_named_by_ncclS_own_warn():
    # NCCL's own WARN (src/enqueue.cc: "cudaArch %d ncclMaxSharedMem %d exceeds device/fn
    # maxSharedMem %zu") on B200 hosts with a 2.21.5 built with CUDA 12.4
    text = "\n".join([
        "b200-n07:9001:9001 [3] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "b200-n07:9001:9001 [3] NCCL INFO cudaDriverVersion 12080",
        "b200-n07:9001:9001 [3] enqueue.cc:69 NCCL WARN cudaArch 1000 ncclMaxSharedMem 232448 "
        "exceeds device/fn maxSharedMem 232448",
        "b200-n08:9002:9002 [5] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ])
    (f,) = _gpu_findings(text)
    assert "2.21.5+cuda12.4" in f.title and "sm_100" in f.title and "Blackwell" in f.title
    assert f.severity is Severity.ERROR and "compute_90" in f.detail
    assert set(f.hosts) == {"b200-n07", "b200-n08"}
    assert "CUDA >= 12.8" in f.fix


def test_topology_dump_gpu_and_no_failure_is_a_warning_not_an_error():
    text = "\n".join([
        "gpu-3:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.1",
        '<gpu dev="0" sm="120" rank="0" gdr="1">',
    ])
    (f,) = _gpu_findings(text)
    assert f.severity is Severity.WARNING  # the lines show the mismatch, not a failure


@pytest.mark.parametrize("text", [
    # a build that has the kernels: 2.27.3 with CUDA 12.9 has sm_120
    "h:1:1 [0] NCCL INFO NCCL version 2.27.3+cuda12.9\n"
    "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with X",
    # no +cuda: 2.26.2 has sm_120 when built with CUDA >= 12.8 - the log cannot tell
    "h:1:1 [0] NCCL INFO NCCL version 2.26.2\nNVIDIA B200 with CUDA capability sm_100 is x",
    # sm_86 runs sm_80 SASS (same major): A10 with 2.10.3+cuda11.0
    "h:1:1 [0] NCCL INFO NCCL version 2.10.3+cuda11.0\n| 0  NVIDIA A10G   On |",
    # torch's list of the archs it was built for is not the GPU
    "h:1:1 [0] NCCL INFO NCCL version 2.14.3+cuda11.8\n"
    "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_90.",
])
def test_no_finding_where_the_build_has_or_may_have_the_kernels(text: str) -> None:
    assert _gpu_findings(text) == []


def test_without_cuda_suffix_a_release_with_no_build_for_the_gpu_is_still_named():
    (f,) = _gpu_findings("h:1:1 [0] NCCL INFO NCCL version 2.14.3\n"
                         "NVIDIA H100 80GB HBM3 with CUDA capability sm_90 is here")
    assert "sm_90" in f.title and "NCCL >= 2.15.1 built with CUDA >= 11.8" in f.fix


# ------------------------------------------------------------------ time prefixes
def test_timestamp_prefixes_parse_as_before_and_keep_the_time():
    text = "\n".join([
        # NCCL's default NCCL_DEBUG_TIMESTAMP_FORMAT '[%F %T] ' (src/debug.cc), WARN lines only
        "[2026-06-10 12:34:56] node1:123:456 [0] misc/socket.cc:50 NCCL WARN "
        "socketStartConnect: Connect to 10.0.0.2<45678> failed : Connection refused",
        "node1:123:456 [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        # '%F %T.%6f' subseconds
        "[2026-06-10 12:35:01.123456] node1:123:457 [1] misc/socket.cc:50 NCCL WARN "
        "socketStartConnect: Connect to 10.0.0.2<45678> failed : Connection refused",
        # a format of the user's: NCCL_DEBUG_TIMESTAMP_FORMAT='%s.%3f '
        "1781094901.123 node2:77:78 [3] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 3 - Init START",
    ])
    log = parse_text(text)
    p1, p2 = log.processes["node1:123"], log.processes["node2:77"]
    assert p1.version == "2.27.3+cuda12.9" and sum(p1.warn_counts.values()) == 2
    assert (p1.first_time, p1.last_time) == ("2026-06-10 12:34:56", "2026-06-10 12:35:01.123456")
    assert p2.first_time == "1781094901.123" and p2.comms["0x1"].started
    assert log.unparsed_nccl == 0
    d = analyze([log]).processes[0].to_dict()
    assert "first_time" in d and "last_time" in d
    assert {f.code for f in analyze([log]).findings} >= {"nccl-log-connect"}


def test_a_file_with_two_nccl_builds_does_not_guess_which_ran_on_the_gpu():
    text = "\n".join([
        "a:1:1 [0] NCCL INFO NCCL version 2.14.3+cuda11.8",
        "b:2:2 [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with X",
    ])
    assert _gpu_findings(text) == []
