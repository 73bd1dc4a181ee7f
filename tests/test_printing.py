"""Rank-aware printing with real processes: whole lines, prefixes, tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

WRITER = r"""
import sys
from mldebug import printflock
me, n, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    block = "\n".join(f"[{me}:{i}:{j}] " + me * width for j in range(3))
    printflock(block)
"""


def intact(text: str, writers: list[str], n: int, width: int) -> list[str]:
    """Lines that are not exactly one writer's line (empty when nothing interleaved)."""
    bad = []
    seen = 0
    for line in text.splitlines():
        head, _, body = line.partition("] ")
        me = head[1:].split(":")[0]
        if me not in writers or body != me * width:
            bad.append(line[:80])
        seen += 1
    if seen != len(writers) * n * 3:
        bad.append(f"expected {len(writers) * n * 3} lines, got {seen}")
    return bad


def test_checker_detects_interleaving():
    good = "[a:0:0] aaaa\n[b:0:0] bbbb\n"
    assert intact(good, ["a", "b"], 1, 4) == ["expected 6 lines, got 2"]
    assert intact("[a:0:0] aa[b:0:0] bbbb\naa\n", ["a", "b"], 1, 4)


def test_four_processes_never_interleave(tmp_path):
    writers, n, width = ["a", "b", "c", "d"], 150, 30000  # lines far beyond PIPE_BUF
    env = dict(os.environ, PYTHONPATH=str(REPO), MLDEBUG_PRINT_LOCK=str(tmp_path / "lock"))
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, w, str(n), str(width)],
                                  stdout=f, env=env) for w in writers]
        for p in procs:
            assert p.wait(timeout=120) == 0
    assert intact(out.read_text(), writers, n, width) == []
    # the same through a pipe
    r = subprocess.run(
        ["bash", "-c", " & ".join(f"{sys.executable} -c '{WRITER}' {w} {n} {width}" for w in writers)
         + " & wait"], capture_output=True, text=True, env=env, timeout=120)
    assert intact(r.stdout, writers, n, width) == []


def test_rank_print_prefixes_every_line_and_numeric_host(tmp_path):
    code = ("from mldebug.printing import rank_print, make_prefix\n"
            "rank_print('line one\\nline two')\n"
            "rank_print('x', fmt='<{host}|{local_rank}/{world_size}>', numeric_host=True)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="5", LOCAL_RANK="1", WORLD_SIZE="8",
               MLDEBUG_PRINT_LOCK=str(tmp_path / "lock"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    host = __import__("socket").gethostname().split(".")[0]
    digits = "".join(c for c in host if c.isdigit()) or host
    assert r.stdout.splitlines() == [f"[{host}:5] line one", f"[{host}:5] line two",
                                     f"<{digits}|1/8> x"]


def test_excepthook_prints_the_whole_traceback_prefixed(tmp_path):
    code = ("from mldebug.printing import install_excepthook\ninstall_excepthook()\n"
            "def inner():\n    raise ValueError('boom\\nsecond line')\ninner()\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="3", MLDEBUG_PRINT_LOCK=str(tmp_path / "l"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0].endswith(":3] Traceback (most recent call last):")
    assert all(":3] " in line for line in lines)
    assert lines[-2].endswith("ValueError: boom") and lines[-1].endswith("] second line")
