"""The per-node part of ``mldebug hang``: find the rank processes here and py-spy each one.

Stdlib only (it imports nothing of mldebug but ``mldebug.dist`` and ``mldebug.errors``, which
are stdlib-only and travel with it), so it runs on nodes where mldebug is not installed: the fan-out sends this
file's source and ``dist.py``'s inside the command line. It prints one JSON document (see
``mldebug.nodekit.emit``). Run by hand: ``bin/mldebug-collect --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mldebug.dist import RANK_VARS, identity_from_env, read_environ
from mldebug.errors import PTRACE_FIX
from mldebug.nodekit import ArgumentParser, emit, find_py_spy, short_hostname

NODE_VERSION = 1


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def list_processes() -> dict[int, dict[str, Any]]:
    """pid -> {ppid, state, uid, cmdline, comm} for every process this node shows us."""
    procs: dict[int, dict[str, Any]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            continue
        rparen = stat.rfind(")")
        fields = stat[rparen + 2:].split()
        if len(fields) < 2:
            continue
        cmdline = (_read(f"/proc/{pid}/cmdline") or "").split("\0")
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        procs[pid] = {
            "pid": pid,
            "ppid": int(fields[1]),
            "state": fields[0],
            "uid": uid,
            "comm": stat[stat.find("(") + 1:rparen],
            "cmdline": [c for c in cmdline if c],
        }
    return procs


def is_python(info: dict[str, Any]) -> bool:
    names = [info["comm"]]
    if info["cmdline"]:
        names.append(os.path.basename(info["cmdline"][0]))
    return any(n.startswith(("python", "pypy")) for n in names)


def _ancestors(pid: int, procs: dict[int, dict[str, Any]]) -> list[int]:
    out = []
    seen = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        pid = procs[pid]["ppid"]
        out.append(pid)
    return out


def find_ranks(procs: dict[int, dict[str, Any]], *, pid: int | None = None,
               pattern: str | None = None, uid: int | None = None,
               host: str | None = None, slurm_job: str | None = None,
               environ: Callable[[int], dict[str, str]] = read_environ,
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Select the rank processes; returns (targets, errors).

    Default: Python processes whose environment carries a rank (torchrun, deepspeed,
    accelerate, srun, mpirun workers). Zombies are skipped. A launcher that wraps workers
    (torchrun under srun) and children that inherited a rank (DataLoader workers) are
    dropped, so each rank appears once.
    """
    errors: list[dict[str, Any]] = []
    me = os.getpid()
    mine = {me, *_ancestors(me, procs)}
    cands: dict[int, dict[str, Any]] = {}
    rx = re.compile(pattern) if pattern else None
    scope: set[int] | None = None
    if pid is not None:
        if pid not in procs:
            return [], [{"pid": pid, "error": f"no process {pid} on this node"}]
        scope = {pid} | {p for p in procs if pid in _ancestors(p, procs)}
    for p, info in procs.items():
        if p in mine or info["state"] in ("Z", "X"):
            continue
        if scope is not None and p not in scope:
            continue
        if uid is not None and info["uid"] != uid:
            continue
        if not is_python(info):
            continue
        if rx is not None and not rx.search(" ".join(info["cmdline"])):
            continue
        try:
            env = environ(p)
        except OSError:
            env = {}
        if slurm_job is not None and slurm_job not in (
                env.get("SLURM_JOB_ID"),
                f"{env.get('SLURM_ARRAY_JOB_ID')}_{env.get('SLURM_ARRAY_TASK_ID')}"):
            continue  # another job's process on a shared node
        ident = identity_from_env(env, host)
        has_rank = any(v in env for v in RANK_VARS)
        if not has_rank and rx is None and p != pid:
            continue
        cands[p] = dict(info, identity=ident.to_dict(), has_rank=has_rank)
    # drop launchers wrapping rank-carrying workers of another kind, and inherited copies
    drop = set()
    for p, info in cands.items():
        anc = _ancestors(p, procs)
        for a in anc:
            if a in cands:
                ai, pi = cands[a]["identity"], info["identity"]
                same = (ai["launcher"], ai["rank"], ai["run_id"]) == (
                    pi["launcher"], pi["rank"], pi["run_id"])
                if same and pi["rank"] is not None:
                    drop.add(p)  # a child that inherited its parent's rank (DataLoader worker)
                elif pi["rank"] is not None:
                    drop.add(a)  # a launcher above real workers
    if pid is not None and pid in cands and len(cands) > 1 and pid not in drop:
        if cands[pid]["identity"]["rank"] is None:
            drop.add(pid)  # --pid named the launcher: its ranks are the targets
    targets = [info for p, info in sorted(cands.items()) if p not in drop]
    return targets, errors


def resolve_user(user: str) -> int | None:
    """A user name or numeric uid as a uid; None when this node has no such user."""
    if user.isdigit():
        return int(user)
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def explain_pyspy_error(pid: int, stderr: str, rc: int) -> str:
    low = stderr.lower()
    if not os.path.exists(f"/proc/{pid}"):
        return f"process {pid} exited during the dump"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        return f"py-spy could not attach to pid {pid} (ptrace denied). {PTRACE_FIX}"
    if "no such process" in low:
        return f"process {pid} exited during the dump"
    if "failed to find python version" in low or "failed to get python version" in low:
        return f"pid {pid} is not a Python process py-spy can read ({stderr.strip()[:200]})"
    text = stderr.strip().splitlines()
    return f"py-spy failed on pid {pid} (exit code {rc}): {text[-1] if text else 'no message'}"


def dump(pid: int, py_spy: str, *, native: bool, nonblocking: bool, with_locals: bool,
         timeout: float) -> tuple[list[Any] | None, str | None]:
    cmd = [py_spy, "dump", "--pid", str(pid), "--json"]
    if native:
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    if with_locals:
        cmd.append("--locals")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, (f"py-spy did not finish within {timeout:g}s on pid {pid} (the process may "
                      "be in uninterruptible sleep, state D); raise --timeout or try --nonblocking")
    except OSError as e:
        return None, f"could not run py-spy ({py_spy}): {e.strerror}"
    if r.returncode != 0:
        return None, explain_pyspy_error(pid, r.stderr, r.returncode)
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        return None, f"py-spy printed unreadable output for pid {pid}: {r.stdout[:200]!r}"
    return data, None


def dump_all(targets: list[dict[str, Any]], py_spy: str, opts: argparse.Namespace,
             key: str) -> None:
    def one(info: dict[str, Any]) -> None:
        data, err = dump(info["pid"], py_spy, native=opts.native, nonblocking=opts.nonblocking,
                         with_locals=opts.locals, timeout=opts.timeout)
        info[key] = data
        if err:
            info.setdefault("error", err)

    if not targets:
        return
    # plain threads, not concurrent.futures: its import costs more than these dumps
    queue = list(reversed(targets))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                info = queue.pop()
            one(info)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(len(targets), max(1, opts.jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def collect(opts: argparse.Namespace) -> dict[str, Any]:
    """Find and dump the ranks on this node; the JSON document the caller receives."""
    start = time.monotonic()
    host = short_hostname()
    doc: dict[str, Any] = {"host": host, "node_version": NODE_VERSION, "processes": [],
                           "errors": [], "python": sys.executable}
    procs = list_processes()
    uid = None if opts.all_users or os.geteuid() == 0 else os.geteuid()
    if opts.user:
        uid = resolve_user(opts.user)
        if uid is None:
            doc["errors"].append({"pid": None, "error": f"no user {opts.user!r} on {host}"})
            doc["seconds"] = round(time.monotonic() - start, 3)
            return doc
    targets, errors = find_ranks(procs, pid=opts.pid, pattern=opts.pattern, uid=uid, host=host,
                                 slurm_job=opts.slurm_job)
    doc["errors"].extend(errors)
    py_spy = find_py_spy(opts.py_spy)
    doc["py_spy"] = py_spy
    if targets and py_spy is None:
        doc["errors"].append({"pid": None, "error": (
            f"py-spy was not found on {host} (looked beside {sys.executable} and on PATH). "
            "Install it next to the job's Python (pip install py-spy) or pass --py-spy PATH.")})
    elif targets:
        assert py_spy is not None
        dump_all(targets, py_spy, opts, "dump")
        if opts.watch:
            time.sleep(opts.watch)
            alive = [t for t in targets if t.get("dump") is not None]
            dump_all(alive, py_spy, opts, "dump_later")
    for t in targets:
        doc["processes"].append({
            "pid": t["pid"], "ppid": t["ppid"], "cmdline": t["cmdline"],
            "identity": t["identity"], "dump": t.get("dump"),
            "dump_later": t.get("dump_later"), "error": t.get("error"),
        })
    doc["seconds"] = round(time.monotonic() - start, 3)
    return doc


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="mldebug-collect",
                                description="Dump the stacks of the rank processes on this node "
                                            "as one JSON document (stdlib + py-spy only).")
    p.add_argument("--pid", type=int, help="this process (or its rank-carrying descendants)")
    p.add_argument("--pattern", help="regular expression on the command line")
    p.add_argument("--all-users", action="store_true", help="not only this user's processes")
    p.add_argument("--user", help="only this user's processes (name or uid)")
    p.add_argument("--slurm-job", help="only processes of this SLURM job (SLURM_JOB_ID)")
    p.add_argument("--native", action="store_true")
    p.add_argument("--nonblocking", action="store_true")
    p.add_argument("--locals", action="store_true")
    p.add_argument("--py-spy", help="py-spy binary (default: beside python, then PATH)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per py-spy dump")
    p.add_argument("--watch", type=float, default=0.0, help="dump again after this many seconds")
    p.add_argument("--jobs", type=int, default=16, help="dumps in parallel")
    p.add_argument("--pretty", action="store_true", help="indented JSON without the marker")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    doc = collect(opts)
    if opts.pretty:
        print(json.dumps(doc, indent=2))
    else:
        emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
