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

``python benchmarks/bench_fanout.py ssh [NODES ...] [--rounds R] [--fanout F] [--only hang,env]``: the whole
fan-out through real ssh, side by side with plain ``pdsh -f F ... true``. One local sshd stands in
for every node (host names ``bench0..benchN-1`` all reach 127.0.0.1 through a generated ssh
config); its ``ForceCommand`` runs the command for the plain pdsh rows and, for mldebug's
rows, prints a canned node answer (so the node-side script is not what is measured: on a real
cluster it runs on the node's CPU). The figure is the CPU time (user+sys) of the caller's
process tree - mldebug's Python, pdsh and every ssh client - from ``wait4``, per command, the
median over interleaved rounds; "lost" counts nodes without an answer.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


SSHD_CONF = """Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_ed25519
AuthorizedKeysFile {d}/authorized_keys
PidFile {d}/sshd.pid
UsePAM no
StrictModes no
PermitRootLogin yes
MaxStartups 2000
MaxSessions 1000
AcceptEnv MLDEBUG_BENCH
ForceCommand /bin/sh {d}/answer.sh
LogLevel ERROR
"""
SSH_CONF = """Host *
  HostName 127.0.0.1
  Port {port}
  IdentityFile {d}/id_ed25519
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
"""
# The node side: mldebug's rows (MLDEBUG_BENCH names the command) get a canned answer of the
# document's shape; the plain pdsh rows run what they were given.
ANSWER = """if [ -n "$MLDEBUG_BENCH" ]; then exec cat "{d}/answer-$MLDEBUG_BENCH"; fi
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""
CANNED = {
    "hang": {"host": "benchnode", "processes": []},
    "fr": {"host": "benchnode", "ranks": []},
}


def _tree_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """CPU seconds (user+sys) of a command and every descendant it waited for, its wall
    seconds, and its stdout."""
    import subprocess
    import tempfile

    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err, subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
            text=True) as proc:
        out = proc.stdout.read() if proc.stdout else ""
        _, _, ru = os.wait4(proc.pid, 0)
        proc.returncode = 0
        err.seek(0)
        if argv[0] == "pdsh":  # plain pdsh: the hosts it says failed
            out += "".join(line for line in err if line.startswith("pdsh@"))
    return ru.ru_utime + ru.ru_stime, time.monotonic() - start, out


def _lost(kind: str, out: str, nodes: int) -> int:
    """Nodes without an answer, from the command's output (--json for mldebug's rows)."""
    import json

    if kind == "pdsh":
        return len({line.split(": ")[1] for line in out.splitlines()
                    if line.startswith("pdsh@") and ": " in line})
    try:
        doc = json.loads(out)
    except ValueError:
        return nodes
    if kind == "env":
        return len(doc.get("unreachable", {}))
    if kind == "hang":
        return len(doc.get("dead_hosts", []))
    return sum(1 for n in doc.get("nodes", [])  # fr trigger: the fan-out's errors say "node: "
               if any(str(e).startswith("node:") for e in n.get("errors", [])))


@contextmanager
def ssh_nodes() -> Iterator[Callable[[str], dict[str, str]]]:
    """One local sshd standing in for every ``benchN`` host; yields ``env_of(tag)``: the
    environment for pdsh/mldebug whose ssh reaches it, the node side answering the canned
    document ``tag`` ("hang", "env", "fr"; "" runs the command given)."""
    import json
    import shutil
    import socket
    import subprocess
    import tempfile
    from pathlib import Path

    if shutil.which("pdsh") is None or not Path("/usr/sbin/sshd").exists():
        raise RuntimeError("needs pdsh and /usr/sbin/sshd")
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as d:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key in ("id_ed25519", "host_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/{key}"],
                           check=True)
        shutil.copy(f"{d}/id_ed25519.pub", f"{d}/authorized_keys")
        Path(f"{d}/sshd.conf").write_text(SSHD_CONF.format(port=port, d=d))
        Path(f"{d}/ssh.conf").write_text(SSH_CONF.format(port=port, d=d))
        Path(f"{d}/answer.sh").write_text(ANSWER.format(d=d))
        # env's canned answer is this host's own node document (its facts are parsed)
        from mldebug.env.collect import NODE_MODULES, NODE_SCHEMA, NodeArgs
        from mldebug.fanout import FanoutOptions, NodeJob, run

        env_doc = run(NodeJob(NODE_MODULES, NodeArgs(), NODE_SCHEMA), FanoutOptions(),
                      progress=False)[0].data
        for name, doc in {**CANNED, "env": env_doc}.items():
            Path(f"{d}/answer-{name}").write_text("MLDEBUG-JSON " + json.dumps(doc) + "\n")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/sshd.conf"],
                                stderr=subprocess.DEVNULL)
        base_env = {**os.environ, "PDSH_RCMD_TYPE": "ssh"}
        base_env.pop("WCOLL", None)

        def env_of(tag: str) -> dict[str, str]:
            return {**base_env, "PDSH_SSH_ARGS_APPEND": f"-F {d}/ssh.conf"
                    + (f" -o SetEnv=MLDEBUG_BENCH={tag}" if tag else "")}

        try:
            time.sleep(0.5)
            yield env_of
        finally:
            sshd.kill()
            sshd.wait()


def bench_ssh(node_counts: list[int], rounds: int, fanout: int,
              only: set[str] | None = None) -> None:
    import shutil
    import tempfile
    from pathlib import Path

    py = [sys.executable, "-m", "mldebug"]
    with ssh_nodes() as env_of, tempfile.TemporaryDirectory() as d:
        for nodes in node_counts:
            hostlist = f"bench[0-{nodes - 1}]"
            hostfile = f"{d}/hosts-{nodes}"
            Path(hostfile).write_text("".join(f"bench{i}\n" for i in range(nodes)))
            # generous bounds: on a loaded machine ssh's handshake alone can take 10 s
            pdsh = ["pdsh", "-R", "ssh", "-S", "-f", str(fanout), "-t", "60", "-u", "120",
                    "-w", f"^{hostfile}"]
            ff = ["--nodes", hostlist, "--fanout", str(fanout), "--json",
                  "--connect-timeout", "60", "--timeout", "120"]
            cases = {
                "pdsh true": ("pdsh", "", pdsh + ["true"]),
                "pdsh 42 KB of A": ("pdsh", "", pdsh + ["true " + "A" * 42_000]),
                "hang --nodes": ("hang", "hang", py + ["hang", *ff]),
                "env --nodes": ("env", "env", py + ["env", *ff]),
                "fr trigger --nodes": ("fr", "fr", py + ["fr", "trigger", *ff,
                                                        "--out", f"{d}/fr-out"]),
            }
            cases = {k: v for k, v in cases.items()
                     if only is None or k == "pdsh true" or k.split()[0] in only}
            cpu_s: dict[str, list[float]] = {k: [] for k in cases}
            wall_s: dict[str, list[float]] = {k: [] for k in cases}
            lost: dict[str, int] = {k: 0 for k in cases}
            load = os.getloadavg()[0]
            for _ in range(rounds):
                for name, (kind, tag, argv) in cases.items():
                    shutil.rmtree(f"{d}/fr-out", ignore_errors=True)
                    c, w, out = _tree_cpu(argv, env_of(tag))
                    cpu_s[name].append(c)
                    wall_s[name].append(w)
                    lost[name] = max(lost[name], _lost(kind, out, nodes))
            load = max(load, os.getloadavg()[0])
            base = statistics.median(cpu_s["pdsh true"])
            print(f"{nodes} nodes, pdsh -f {fanout} over ssh, caller CPU (user+sys) of the "
                  f"process tree, median of {rounds} interleaved rounds, load average up to "
                  f"{load:.0f}")
            print(f"{'command':<22} {'CPU s':>7} {'vs pdsh true':>13} {'wall s':>7} {'lost':>5}")
            for name in cases:
                c = statistics.median(cpu_s[name])
                print(f"{name:<22} {c:>7.2f} {c / base:>12.2f}x "
                      f"{statistics.median(wall_s[name]):>7.1f} {lost[name]:>5}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "ssh":
        import argparse

        ap = argparse.ArgumentParser(prog="bench_fanout.py ssh")
        ap.add_argument("nodes", type=int, nargs="*", default=[512, 2048])
        ap.add_argument("--rounds", type=int, default=3)
        ap.add_argument("--fanout", type=int, default=64)
        ap.add_argument("--only", help="comma-separated: pdsh (the 42 KB row), hang, env, fr; "
                                       "plain pdsh true always runs")
        a = ap.parse_args(sys.argv[2:])
        bench_ssh(a.nodes, a.rounds, a.fanout, set(a.only.split(",")) if a.only else None)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "memory-child":
        memory_child(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "memory":
        bench_memory(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        return
    try:
        nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 512
        repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    except ValueError:
        raise SystemExit(f"usage: bench_fanout.py [NODES] [REPEAT] | ssh ... | memory [NODES]"
                         f" (got {' '.join(sys.argv[1:])!r}; --help explains each)") from None
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
