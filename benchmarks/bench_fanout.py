"""Reading a fan-out's output: ``sh`` with its defaults, ``sh`` with its logging off, and the
plain ``subprocess`` reader ``mldebug.fanout`` uses, side by side in one run.

A stand-in for pdsh (a Python child) prints what 512 nodes answer to ``mldebug hang``: one
``host: MLDEBUG-JSON {...}`` line of ~8 KB per node; the command line carries a 26 KB argument,
as the bundled node script does. Each reader collects every line through a callback and
must see all of them, each parsed into a node result by the same ``PdshStream``. Prints the
parent's CPU seconds (median of REPEAT rounds,
interleaved) and the ratio to the subprocess reader. Usage:
python benchmarks/bench_fanout.py [NODES] [REPEAT]

``python benchmarks/bench_fanout.py memory [NODES]``: peak RSS of ``mldebug hang``'s caller
side when NODES nodes each answer a large document (8 ranks, a 30-frame main thread and two
20-frame threads each, as py-spy writes them), read through a fake ``pdsh`` on PATH that prints
every node's ``MLDEBUG-JSON`` line. "held": ``fanout.run`` without ``on_result`` (every
document returned, then folded into the hang collection: the flow before streaming);
"streamed": ``mldebug.hang.collect.collect`` (each node folded as it arrives, its document
dropped). Each runs in its own child process, side by side; "floor" is a child that imports
the same modules and collects nothing.
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

    from mldebug.fanout import PdshStream

    seen: list[str] = []
    stream = PdshStream([f"node{i}" for i in range(nodes)], lambda r: seen.append(r.host))
    kw = {"_log_msg": (lambda *a, **k: "pdsh")} if quiet else {}
    logging.getLogger("sh").setLevel(logging.WARNING if quiet else logging.NOTSET)
    proc = sh.Command(sys.executable)("-c", PRODUCER, str(nodes), BIG_ARG, _out=stream.out,
                                      _err=stream.err, _bg=True, _ok_code=list(range(256)),
                                      _tty_out=False, _new_session=True, _bg_exc=False, **kw)
    proc.wait(timeout=120)
    proc.process.wait()  # join sh's readers (wait(timeout) alone can return before them)
    stream.finish()
    return len(seen)


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


FAKE_PDSH = r'''#!PYTHON
import json, sys
hosts = open(sys.argv[sys.argv.index("-w") + 1][1:]).read().split()
def frame(i, f):
    return {"name": f"fn{i}", "filename": f"/venv/lib/python3.11/site-packages/model/{f}_{i}.py",
            "short_filename": f"model/{f}_{i}.py", "line": 10 + i, "module": None,
            "locals": None}
main = [frame(i, "layers") for i in range(30)]
other = [frame(i, "threading") for i in range(20)]
for host in hosts:
    procs = []
    for r in range(8):
        pid = 1000 + r
        threads = [{"pid": pid, "thread_id": t, "thread_name": name, "os_thread_id": pid + t,
                    "active": False, "owns_gil": False, "frames": frames}
                   for t, (name, frames) in enumerate([("MainThread", main),
                                                      ("Thread-1", other), ("Thread-2", other)])]
        procs.append({"pid": pid, "cmdline": ["python", "train.py"],
                      "identity": {"rank": r, "local_rank": r, "world_size": 8 * len(hosts)},
                      "dump": threads})
    sys.stdout.write(f"{host}: MLDEBUG-JSON " + json.dumps({"host": host, "processes": procs})
                     + "\n")
'''


def memory_child(variant: str, nodes: int) -> None:
    """One side of the memory comparison, in a fresh process: print peak RSS (KiB) and s."""
    import json
    import resource

    from mldebug.fanout import FanoutOptions, NodeJob, run
    from mldebug.hang.collect import (
        NODE_MODULES,
        NODE_SCHEMA,
        CollectOptions,
        collect,
        collection_from_results,
    )

    target = FanoutOptions(hosts=[f"node{i}" for i in range(nodes)], timeout=300)
    start = time.monotonic()
    if variant == "held":
        coll = collection_from_results(run(NodeJob(NODE_MODULES, CollectOptions(), NODE_SCHEMA),
                                           target, progress=False))
    elif variant == "streamed":
        _, coll, _ = collect(CollectOptions(), target)
    else:
        coll = None
    ranks = len(coll.processes) if coll is not None else 0
    print(json.dumps({"rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "s": time.monotonic() - start, "ranks": ranks}))


def bench_memory(nodes: int) -> None:
    import json
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        pdsh = Path(tmp) / "pdsh"
        pdsh.write_text(FAKE_PDSH.replace("PYTHON", sys.executable))
        pdsh.chmod(0o755)
        env = {**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}"}
        hosts = Path(tmp) / "h"
        hosts.write_text("node0\n")
        one = subprocess.run([str(pdsh), "-w", f"^{hosts}"], capture_output=True, env=env,
                             check=True).stdout
        print(f"{nodes} nodes x 8 ranks, {len(one) / 1024:.0f} KiB per node answer "
              f"({len(one) * nodes / 2**20:.0f} MiB in all); peak RSS of the caller")
        print(f"{'variant':<10} {'peak RSS MiB':>13} {'vs floor MiB':>13} {'s':>7} {'ranks':>7}")
        rows = {}
        for variant in ("floor", "held", "streamed"):
            r = subprocess.run([sys.executable, __file__, "memory-child", variant, str(nodes)],
                               capture_output=True, text=True, env=env, check=True)
            rows[variant] = json.loads(r.stdout.strip().splitlines()[-1])
        floor = rows["floor"]["rss_kib"] / 1024
        for variant, row in rows.items():
            mib = row["rss_kib"] / 1024
            print(f"{variant:<10} {mib:>13.0f} {mib - floor:>13.0f} {row['s']:>7.1f} "
                  f"{row['ranks']:>7}")
        held, streamed = (rows[v]["rss_kib"] / 1024 - floor for v in ("held", "streamed"))
        print(f"held / streamed, above the floor: {held / max(streamed, 1):.1f}x")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "memory-child":
        memory_child(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "memory":
        bench_memory(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        return
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
