"""nccl-log on awkward input: pipes, stdin, devices, huge and hostile lines, arbitrary text."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import REPO, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from mldebug.errors import UsageError
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import MAX_LINE, load, parse_text

LINE = "node1:11:12 [0] NCCL INFO comm 0x55aa rank 0 nranks 2 cudaDev 0 busId 1000 - Init START\n"
WARN = "node2:21:22 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.1<1234> failed : Connection refused\n"


def test_a_fifo_is_read_like_a_file(tmp_path: Path) -> None:
    fifo = tmp_path / "nccl.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:
            f.write(LINE + WARN)

    t = threading.Thread(target=write)
    t.start()
    [log] = load([fifo])
    t.join()
    assert log.nccl_lines == 2 and set(log.processes) == {"node1:11", "node2:21"}


def test_stdin_as_dash_and_dev_stdin() -> None:
    for name in ("-", "/dev/stdin"):
        r = subprocess.run([sys.executable, "-m", "mldebug", "nccl-log", name, "--json"],
                           input=LINE + WARN, capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
        assert r.returncode == 0, r.stderr
        assert '"nccl-log-connect"' in r.stdout


def test_devices_and_missing_files_get_their_own_message(tmp_path: Path) -> None:
    r = run_cli("nccl-log", "/dev/zero")
    assert r.returncode == 2 and "is a device" in r.stderr and "does not exist" not in r.stderr
    r = run_cli("nccl-log", str(tmp_path / "missing.log"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        load([empty])
    except UsageError as e:
        assert "no log files" in str(e)
    else:
        raise AssertionError("an empty directory must be an error")


def test_a_200kb_line_of_repeated_init_text_parses_in_linear_time() -> None:
    """The line made the old INIT regex quadratic (21 s); a bound, not a benchmark."""
    line = "node1:1:1 [0] NCCL INFO " + "comm 0x1 rank 1 nranks 2 " * 8000
    start = time.process_time()
    log = parse_text(line + "\n" + line)
    assert time.process_time() - start < 2.0
    assert log.nccl_lines == 2


def test_over_long_lines_are_cut_and_reported(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with open(big, "w") as f:
        f.write(LINE)
        f.write("x" * (3 * MAX_LINE) + "\n")
        f.write(WARN)
    [log] = load([big])
    assert log.long_lines == 1 and log.nccl_lines == 2
    codes = {f.code for f in analyze([log]).findings}
    assert "nccl-log-input-bound" in codes


def test_catch_all_counts_nccl_lines_in_unknown_shapes() -> None:
    text = "some launcher junk ~~ NCCL WARN something odd happened\nNCCL INFO but what\n"
    report = analyze([parse_text(text)])
    codes = {f.code for f in report.findings}
    assert "nccl-log-empty" not in codes and "nccl-log-unknown-shape" in codes
    assert any("something odd happened" in f.title for f in report.findings)


def test_rerun_hint_only_when_there_is_truly_nothing() -> None:
    assert {f.code for f in analyze([parse_text("hello\n")]).findings} == {"nccl-log-empty"}
    bare = analyze([parse_text("NCCL version 2.7.8+cuda11.1\n")])
    assert "nccl-log-empty" not in {f.code for f in bare.findings}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([LINE, WARN, "NCCL version 2.7.8+cuda11.1\n", "[rank1]:",
                                 "comm 0x", " - Init COMPLETE", "\x1b[0m", "[1,2]<stdout>:",
                                 "NCCL WARN", "\n", "Got completion with error 12"]),
                max_size=40), st.text(max_size=80))
def test_arbitrary_mixtures_parse_or_report_never_crash(parts: list[str], noise: str) -> None:
    import io

    from rich.console import Console

    from mldebug.nccllog.report import render

    report = analyze([parse_text("".join(parts) + noise + "\n" + noise + ":1:2 [0] NCCL WARN x")])
    assert all(f.fix for f in report.findings)
    report.to_dict()
    render(report, Console(file=io.StringIO(), width=100))


def test_host_names_hostlist_cannot_fold_still_render() -> None:
    import io

    from rich.console import Console

    from mldebug.nccllog.report import render

    text = "\n".join(f"{h}:1:1 [0] misc/socket.cc:1 NCCL WARN socketStartConnect: Connect to "
                     "10.0.0.1<1> failed : Connection refused"
                     for h in ("a,b", "<cluster_name>", "node1", "node2"))
    report = analyze([parse_text(text)])
    buf = io.StringIO()
    render(report, Console(file=buf, width=120))
    assert "node[1-2]" in buf.getvalue() and "a,b" in buf.getvalue()


def test_binary_compressed_and_non_utf8_inputs_get_one_clear_line(tmp_path: Path) -> None:
    import gzip

    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64)
    packed = tmp_path / "nccl.log.gz"
    packed.write_bytes(gzip.compress(WARN.encode()))
    latin = tmp_path / "latin1.log"
    latin.write_bytes(b"caf\xe9 \xff " + WARN.encode())
    for path, words in ((binary, "is binary, not a text log"),
                        (packed, "is a compressed file, not a text log")):
        r = run_cli("nccl-log", str(path))
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert words in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    r = run_cli("nccl-log", str(latin))  # undecodable bytes are replaced, the line is read
    assert r.returncode == 0 and "connection refused" in r.stdout.lower(), r.stdout
    # among text logs a binary file is named, not fatal
    report = analyze(load([binary, latin]))
    assert "nccl-log-not-text" in {f.code for f in report.findings}
    assert "nccl-log-connect" in {f.code for f in report.findings}
