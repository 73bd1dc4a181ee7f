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
from mldebug.errors import NO_PTRACE_ROUTE, PTRACE_FIX
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


# Process names of launchers: the job a rank belongs to when its environment says nothing.
LAUNCHER_NAMES = {
    "torchrun": "torchrun", "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun", "deepspeed": "deepspeed",
    "deepspeed.launcher.launch": "deepspeed", "accelerate": "accelerate",
    "accelerate.commands.launch": "accelerate", "mpirun": "mpirun", "mpiexec": "mpirun",
    "orted": "mpirun", "prted": "mpirun", "hydra_pmi_proxy": "mpirun", "srun": "srun",
    "slurmstepd": "srun",
}
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")  # this node only: key by host too


def is_mldebug(info: dict[str, Any]) -> bool:
    """mldebug itself (the CLI, ``python -m mldebug``, this node script, bin/mldebug-collect):
    never a rank, whatever its environment or command line says."""
    argv = info["cmdline"][:4]
    for i, a in enumerate(argv):
        base = os.path.basename(a)
        if base in ("mldebug", "mldebug-collect") or "<mldebug-node>" in a:
            return True
        if a == "-m" and i + 1 < len(argv) and argv[i + 1].split(".")[0] == "mldebug":
            return True
    return False


def launcher_of(info: dict[str, Any]) -> str | None:
    """The launcher a process is, by its name or command line ("torchrun", "mpirun", ...)."""
    names = [info["comm"]] + [os.path.basename(a) for a in info["cmdline"][:4]]
    for i, a in enumerate(info["cmdline"][:4]):
        if a == "-m" and i + 1 < len(info["cmdline"]):
            names.append(info["cmdline"][i + 1])
    for n in names:
        if n in LAUNCHER_NAMES:
            return LAUNCHER_NAMES[n]
    return None


def job_of(env: dict[str, str], host: str, launcher: tuple[int, str] | None) -> dict[str, Any]:
    """The job a rank belongs to: a key every rank of one job shares across nodes.

    In order: torchrun/elastic run id, SLURM job + step, MPI job id, MASTER_ADDR:MASTER_PORT
    (qualified by host when it is a loopback address), the launcher process on this node.
    No key: a process with a rank variable and nothing around it (``lone``).
    """
    run_id = env.get("TORCHELASTIC_RUN_ID")
    master = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    name = launcher[1] if launcher else None
    if run_id and run_id not in ("none", "default"):
        key = f"run:{run_id}"
    elif env.get("SLURM_JOB_ID"):
        key = f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '?')}"
        name = name or "srun"
    elif env.get("OMPI_COMM_WORLD_SIZE") and env.get("OMPI_MCA_orte_hnp_uri"):
        key = f"mpi:{env['OMPI_MCA_orte_hnp_uri'].split(';')[0]}"
    elif env.get("PMI_JOBID") or env.get("PMIX_NAMESPACE"):
        key = f"mpi:{env.get('PMI_JOBID') or env.get('PMIX_NAMESPACE')}"
    elif master[0] and master[1]:
        addr = master[0]
        key = f"master:{host}/{addr}:{master[1]}" if addr in _LOOPBACK \
            else f"master:{addr}:{master[1]}"
    elif launcher:
        key = f"launcher:{host}:{launcher[0]}"
    else:
        return {"key": None, "launcher": None, "lone": True}
    return {"key": key, "launcher": name, "lone": False}


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
    mine |= {p for p, info in procs.items() if is_mldebug(info)}
    cands: dict[int, dict[str, Any]] = {}
    rx = re.compile(pattern) if pattern else None
    scope: set[int] | None = None
    if pid is not None:
        if pid not in procs:
            return [], [{"pid": pid, "error": f"no process {pid} on this node"}]
        if uid is not None and procs[pid]["uid"] != uid:
            return [], [{"pid": pid, "error": (
                f"process {pid} belongs to uid {procs[pid]['uid']}, outside this run's "
                f"selection (uid {uid}): only root may dump another user's processes; run as "
                "root or as that user")}]
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
        launcher = next(((a, name) for a in _ancestors(p, procs)
                         if a in procs and (name := launcher_of(procs[a]))), None)
        job = job_of(env, host or "", launcher)
        if not has_rank:
            job["lone"] = False  # chosen by --pid/--pattern: analysed as the user asked
        cands[p] = dict(info, identity=ident.to_dict(), has_rank=has_rank, job=job)
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
                    cands[a].setdefault("workers", []).append(info)
                elif pi["rank"] is not None:
                    drop.add(a)  # a launcher above real workers
    if pid is not None and pid in cands and len(cands) > 1 and pid not in drop:
        if cands[pid]["identity"]["rank"] is None:
            drop.add(pid)  # --pid named the launcher: its ranks are the targets
    targets = [info for p, info in sorted(cands.items()) if p not in drop]
    for t in targets:  # only direct workers of a kept rank stay attached to it
        t["workers"] = [w for w in t.get("workers", ()) if w["ppid"] == t["pid"]]
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


def proc_status(pid: int) -> dict[str, str]:
    """State and TracerPid (and the rest) of /proc/PID/status; empty when unreadable."""
    out = {}
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def explain_pyspy_error(pid: int, stderr: str, rc: int,
                        status: dict[str, str] | None = None, euid: int | None = None) -> str:
    """One line saying why py-spy failed on ``pid`` and what to do: a stopped or already
    traced process is named as such, never as "ptrace denied, run as root" to root."""
    low = stderr.lower()
    if not os.path.exists(f"/proc/{pid}"):
        return f"process {pid} exited during the dump"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        st = proc_status(pid) if status is None else status
        tracer = st.get("TracerPid", "0")
        if tracer not in ("", "0"):
            comm = (_read(f"/proc/{tracer}/comm") or "?").strip()
            return (f"py-spy could not attach to pid {pid}: it is already traced by pid "
                    f"{tracer} ({comm}), a debugger or another py-spy. Detach that tracer "
                    "(quit gdb/pdb, let the other dump finish) and run again.")
        if st.get("State", "").startswith(("T", "t")):
            return (f"py-spy could not attach to pid {pid}: the process is stopped (State "
                    f"{st['State']}), by SIGSTOP or a job-control stop. Resume it with "
                    f"kill -CONT {pid} if you stopped it, then run again.")
        if (os.geteuid() if euid is None else euid) == 0:
            return (f"py-spy could not attach to pid {pid} although running as root "
                    f"(ptrace denied: {stderr.strip()[:160]}). Containers: "
                    "--cap-add=SYS_PTRACE, or a seccomp/LSM profile that blocks ptrace. "
                    + NO_PTRACE_ROUTE)
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


def dump_jobs(opts: argparse.Namespace) -> int:
    """Dumps at once on this node: --jobs, or from this node's own CPUs (py-spy --native is
    CPU-heavy, one per CPU; plain dumps mostly wait on the target, several per CPU)."""
    if opts.jobs > 0:
        return int(opts.jobs)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(2, min(64, cpus * (1 if opts.native else 4)))


def dump_all(targets: list[dict[str, Any]], py_spy: str, opts: argparse.Namespace,
             key: str) -> None:
    def one(info: dict[str, Any]) -> None:
        for w in info.get("workers", ()) if key == "dump" else ():
            w["dump"], w["error"] = dump(w["pid"], py_spy, native=opts.native,
                                         nonblocking=opts.nonblocking, with_locals=False,
                                         timeout=opts.timeout)
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
               for _ in range(min(len(targets), dump_jobs(opts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def select_targets(opts: argparse.Namespace, host: str) -> tuple[
        dict[int, dict[str, Any]], list[dict[str, Any]] | None, list[dict[str, Any]], int | None]:
    """The process table, the rank processes this run looks at (``--pid``, ``--pattern``,
    ``--user``/``--all-users``, ``--slurm-job``), their errors, and the uid filter. Targets are
    None when ``--user`` names nobody on this host."""
    procs = list_processes()
    uid = None if opts.all_users or os.geteuid() == 0 else os.geteuid()
    if opts.user:
        uid = resolve_user(opts.user)
        if uid is None:
            return procs, None, [{"pid": None, "error": f"no user {opts.user!r} on {host}"}], None
    targets, errors = find_ranks(procs, pid=opts.pid, pattern=opts.pattern, uid=uid, host=host,
                                 slurm_job=opts.slurm_job)
    return procs, targets, errors, uid


def collect(opts: argparse.Namespace) -> dict[str, Any]:
    """Find and dump the ranks on this node; the JSON document the caller receives."""
    start = time.monotonic()
    host = short_hostname()
    doc: dict[str, Any] = {"host": host, "node_version": NODE_VERSION, "processes": [],
                           "errors": [], "python": sys.executable}
    procs, targets, errors, _ = select_targets(opts, host)
    doc["errors"].extend(errors)
    if targets is None:
        doc["seconds"] = round(time.monotonic() - start, 3)
        return doc
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
            "identity": t["identity"], "job": t.get("job"), "dump": t.get("dump"),
            "dump_later": t.get("dump_later"), "error": t.get("error"),
            "workers": [{"pid": w["pid"], "ppid": w["ppid"], "cmdline": w["cmdline"],
                         "identity": w["identity"], "dump": w.get("dump"),
                         "error": w.get("error")} for w in t.get("workers", ())],
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
    p.add_argument("--jobs", type=int, default=0,
                   help="dumps in parallel (default 0: from this node's CPU count)")
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
