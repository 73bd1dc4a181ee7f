"""`mldebug hang analyze` on raw faulthandler text: a real dump from a public thread, what a
watchdog leaves in DIR/faulthandler/ when no Python ran after the dump (dump+abort with the GIL
held), every marker of CPython's format, and hostile files (non-UTF-8, 100 MB lines, symlinks,
files of another user)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mldebug import cli
from mldebug.hang.collect import load
from mldebug.stacks import faulthandler_dumps

FIX = Path(__file__).parent / "fixtures" / "hang"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def analyze_json(capsys, *paths: str) -> dict:
    rc = cli.main(["hang", "analyze", *paths, "--json"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    return json.loads(out)


def fh_dump(main: list[tuple[str, str, int]], other: bool = True, current: str = "") -> str:
    """A dump as faulthandler writes it: the watchdog's thread first (newest), main last."""
    lines = []
    if other:
        lines += ["Thread 0x00007fd0dffff6c0 (most recent call first):",
                  '  File "/venv/lib/python3.11/threading.py", line 331 in wait',
                  '  File "/work/mldebug/capture/handler.py", line 146 in _loop', ""]
    lines.append(f"{current}Thread 0x00007fd1059e1b80 (most recent call first):")
    lines += [f'  File "{f}", line {n} in {name}' for name, f, n in main]
    return "\n".join(lines) + "\n"


ALLREDUCE = [("all_reduce", C10D, 3252), ("main", "/job/train.py", 65), ("<module>", "/job/train.py", 71)]
VALIDATE = [("validate", "/job/train.py", 46), ("main", "/job/train.py", 64),
            ("<module>", "/job/train.py", 71)]


def capture_dir(tmp: Path, raw_ranks: dict[int, str], json_ranks: list[int]) -> Path:
    """A watchdog's directory: JSON dumps (the Python route) and faulthandler texts."""
    d = tmp / "cap"
    for sub in ("dumps", "faulthandler"):
        (d / sub).mkdir(parents=True, mode=0o700)
    d.chmod(0o700)
    for r in json_ranks:
        frames = [{"name": n, "filename": f, "short_filename": None, "line": ln, "module": None,
                   "locals": None} for n, f, ln in ALLREDUCE]
        doc = {"format": "mldebug.hang.dump/1", "host": "vm", "pid": 100 + r,
               "identity": {"rank": r, "world_size": 3, "local_world_size": 3,
                            "run_id": "job7", "launcher": "torchrun"},
               "dump": [{"thread_name": "MainThread", "thread_id": 1, "os_thread_id": 100 + r,
                         "frames": frames}], "capture": {"route": "python"}}
        (d / "dumps" / f"vm-rank{r}-{100 + r}.json").write_text(json.dumps(doc))
        (d / "faulthandler" / f"vm-rank{r}-{100 + r}.txt").write_text("")  # never signalled
    for r, text in raw_ranks.items():
        (d / "faulthandler" / f"vm-rank{r}-{100 + r}.gil.txt").write_text(text)
    return d


def test_real_faulthandler_dump_from_a_public_thread_names_the_barrier(capsys):
    # pytorch/pytorch#54818: a test process timed out; its main thread waits in barrier
    rep = analyze_json(capsys, str(FIX / "faulthandler_pytorch_54818_barrier.txt"))
    [group] = rep["groups"]
    assert group["collective"] == "barrier", group
    assert group["where"] == "barrier (torch/distributed/distributed_c10d.py:2477)"
    [p] = rep["processes"]
    names = {t["name"] for t in p["threads"]}
    assert "MainThread" in names and len(p["threads"]) == 2  # the listener thread too
    assert rep["errors"] == []


def test_watchdog_dir_with_only_faulthandler_text_for_one_rank_names_it(tmp_path, capsys):
    # the abort route: rank 2 held the GIL, no Python ran to convert its text
    d = capture_dir(tmp_path, {2: "Timeout (0:00:02)!\n" + fh_dump(VALIDATE)}, [0, 1])
    rep = analyze_json(capsys, str(d))
    assert [s["rank"] for s in rep["suspects"]] == [2], rep["verdict"]
    assert "not in any collective" in rep["suspects"][0]["reason"]
    assert len(rep["jobs"]) == 1 and rep["jobs"][0]["key"] == "run:job7"  # one job, adopted
    by_rank = {p["rank"]: p for p in rep["processes"]}
    assert sorted(by_rank) == [0, 1, 2] and by_rank[2]["pid"] == 102
    assert [t["name"] for t in by_rank[2]["threads"]] == ["MainThread"]  # not the watchdog's


def test_a_rank_with_a_json_dump_is_not_read_twice_and_the_newest_text_wins(tmp_path):
    d = capture_dir(tmp_path, {0: fh_dump(VALIDATE)}, [0, 1])
    coll = load([str(d)])
    assert sorted(p.rank for p in coll.processes) == [0, 1]  # rank 0's JSON covers its text
    (d / "faulthandler" / "vm-rank2-102.txt").write_text(fh_dump(ALLREDUCE))
    (d / "faulthandler" / "vm-rank2-102.gil.txt").write_text(fh_dump(VALIDATE))
    os.utime(d / "faulthandler" / "vm-rank2-102.txt", (1, 1))
    [p2] = [p for p in load([str(d)]).processes if p.rank == 2]
    assert p2.main_thread().frames[0].name == "validate"


def test_every_marker_of_the_format():
    text = "\n".join([
        "Fatal Python error: Segmentation fault", "",
        "Thread 0x0000000000000002 [worker-1] (most recent call first):",  # 3.14 names
        "  <no Python frame>", "",
        "Current thread 0x0000000000000001 [MainThread] (most recent call first):",
        "  Garbage-collecting",
        '  File "/a/x.py", line 10 in f',
        '  File "/a/very/long/' + "p" * 500 + '...", line ??? in g',
        "  File ???, line 3 in h",
        "  ...",
        "",
        "Timeout (0:00:05.500000)!",
        "Thread 0x0000000000000001 (most recent call first):",
        '  File "/a/x.py", line 11 in f',
        "...",
    ])
    first, second = faulthandler_dumps(text, 42)
    assert [t["thread_name"] for t in first] == ["worker-1", "MainThread"]
    assert first[0]["frames"] == []
    assert [(f["name"], f["line"]) for f in first[1]["frames"]] == [("f", 10), ("g", 0), ("h", 3)]
    assert first[1]["frames"][2]["filename"] == "???"
    assert [(f["name"], f["line"]) for f in second[0]["frames"]] == [("f", 11)]
    # a repeated thread id starts the next dump too (a handler appending to one file)
    again = faulthandler_dumps(fh_dump(VALIDATE) + fh_dump(ALLREDUCE), 7, guess_main=True)
    assert [d[-1]["frames"][0]["name"] for d in again] == ["validate", "all_reduce"]
    assert again[0][-1]["thread_name"] == "MainThread" and again[0][-1]["os_thread_id"] == 7


def test_hostile_texts_are_bounded_and_skipped_with_their_reason(tmp_path, capsys):
    d = capture_dir(tmp_path, {}, [0, 1])
    fh = d / "faulthandler"
    # non-UTF-8 bytes and a 100 MB line before a real dump: the dump is still read
    with open(fh / "vm-rank2-102.gil.txt", "wb") as f:
        f.write(b"\xff\xfe garbage \x80\n")
        f.write(b"Thread 0x1 (most recent call first):" + b"x" * (100 << 20) + b"\n")
        f.write(fh_dump(VALIDATE).encode())
    rep = analyze_json(capsys, str(d))
    assert [s["rank"] for s in rep["suspects"]] == [2]
    # the same 100 MB file given directly: refused (too big for one dump), not read whole
    rep = analyze_json(capsys, str(fh / "vm-rank2-102.gil.txt"), str(d / "dumps"))
    assert any("larger than" in e["error"] for e in rep["errors"])
    os.unlink(fh / "vm-rank2-102.gil.txt")
    # a symlink to another file, and (as root) a text of another user: skipped, named
    secret = tmp_path / "secret.txt"
    secret.write_text(fh_dump(VALIDATE))
    os.symlink(secret, fh / "vm-rank2-102.gil.txt")
    root = os.geteuid() == 0
    if root:
        (fh / "vm-rank3-103.gil.txt").write_text(fh_dump(VALIDATE))
        os.chown(fh / "vm-rank3-103.gil.txt", 12345, 12345)
    rep = analyze_json(capsys, str(d))
    errors = {e["host"]: e["error"] for e in rep["errors"]}
    assert errors["vm-rank2-102.gil.txt"] == "a symbolic link: skipped", errors
    assert not root or "owned by uid 12345" in errors["vm-rank3-103.gil.txt"]
    assert sorted(p["rank"] for p in rep["processes"]) == [0, 1]
    # a faulthandler directory others can write: nothing in it is trusted
    os.unlink(fh / "vm-rank2-102.gil.txt")
    (fh / "vm-rank3-103.gil.txt").unlink(missing_ok=True)
    (fh / "vm-rank3-103.gil.txt").write_text(fh_dump(VALIDATE))
    fh.chmod(0o777)
    rep = analyze_json(capsys, str(d))
    assert any("can be written by other users" in e["error"] for e in rep["errors"])
    assert sorted(p["rank"] for p in rep["processes"]) == [0, 1]
