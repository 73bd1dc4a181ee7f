"""Reading a fan-out's output: ``sh`` with its defaults, ``sh`` with its logging off, and the
plain ``subprocess`` reader ``mldebug.fanout`` uses, side by side in one run.

A stand-in for pdsh (a Python child) prints what 512 nodes answer to ``mldebug hang``: one
``host: MLDEBUG-JSON {...}`` line of ~8 KB per node; the command line carries a 26 KB argument,
as the bundled node script does. Each reader collects every line through a callback and
must see all of them. Prints the parent's CPU seconds (median of REPEAT rounds,
interleaved) and the ratio to the subprocess reader. Usage:
python benchmarks/bench_fanout.py [NODES] [REPEAT]
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time

PRODUCER = ("import sys\nn=int(sys.argv[1]); doc='{\"processes\":[' + ','.join(['1']*4000) + ']}'\n"
            "for i in range(n): sys.stdout.write(f'node{i}: MLDEBUG-JSON {doc}\\n')\n")
BIG_ARG = "A" * 26_000  # the base64 node script in the real command line


def via_sh(nodes: int, quiet: bool) -> int:
    import sh

    lines: list[str] = []
    kw = {"_log_msg": (lambda *a, **k: "pdsh")} if quiet else {}
    logging.getLogger("sh").setLevel(logging.WARNING if quiet else logging.NOTSET)
    proc = sh.Command(sys.executable)("-c", PRODUCER, str(nodes), BIG_ARG, _out=lines.append,
                                      _err=lines.append, _bg=True, _ok_code=list(range(256)),
                                      _tty_out=False, _new_session=True, _bg_exc=False, **kw)
    proc.wait(timeout=120)
    proc.process.wait()  # join sh's readers (wait(timeout) alone can return before them)
    return len(lines)


def via_subprocess(nodes: int) -> int:
    from mldebug.fanout import PdshStream, _run_streaming

    seen: list[str] = []
    _run_streaming(["-c", PRODUCER, str(nodes), BIG_ARG], dict(os.environ), 120,
                   PdshStream([f"node{i}" for i in range(nodes)], lambda r: seen.append(r.host)),
                   program=sys.executable)
    return len(seen)


def cpu(fn, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    n = fn(*args)
    assert n == args[0], (fn, n)
    return time.process_time() - start


def main() -> None:
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    logging.basicConfig(level=logging.WARNING)  # an application that configured logging
    cases = {
        "sh, defaults": lambda: cpu(via_sh, nodes, False),
        "sh, logging off": lambda: cpu(via_sh, nodes, True),
        "mldebug.fanout reader": lambda: cpu(via_subprocess, nodes),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            times[name].append(fn())
    base = statistics.median(times["mldebug.fanout reader"])
    print(f"{nodes} node answers of ~8 KB, parent CPU seconds, median of {repeat}")
    print(f"{'reader':<24} {'median s':>9} {'vs mldebug':>11}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:<24} {m:>9.3f} {m / base:>10.2f}x")


if __name__ == "__main__":
    main()
