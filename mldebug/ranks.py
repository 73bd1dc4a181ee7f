"""Rank processes on this node: the process table, which processes are ranks, and which job
each belongs to (run id, SLURM job, MPI job, MASTER_ADDR:PORT, launcher).

Shared by every capability that looks at live ranks (hang, its --signal route, memory top,
fr): one rule for "what is a rank", "what is mldebug itself" and "which job". Stdlib only
(Python 3.7+): node scripts bundle it with ``mldebug.dist`` and ``mldebug.nodekit``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from mldebug.dist import RANK_VARS, identity_from_env, read_environ


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _read_proc(path: str, limit: int = 1 << 20) -> bytes | None:
    """A /proc file's bytes, at most ``limit`` (os-level reads: the process table reads
    hundreds of these, and a Python file object costs more than the read)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        left = limit
        while left > 0:
            b = os.read(fd, min(left, 8192))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def list_processes(root: int | None = None) -> dict[int, dict[str, Any]]:
    """pid -> {ppid, state, uid, cmdline, comm} for every process this node shows us.

    ``root``: only the part of the table ``find_ranks(pid=root)`` looks at - that process,
    its descendants, and the ancestors of it and of this process. Every process's stat is
    still read (the parent links), but command lines and owners only of those: on a shared
    node of hundreds of processes that is a third of the reads.
    """
    stats: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdecimal():
            continue
        raw = _read_proc(f"/proc/{entry}/stat", 4096)
        if not raw:
            continue
        stat = raw.decode(errors="replace")
        rparen = stat.rfind(")")
        fields = stat[rparen + 2:].split(None, 2)
        if len(fields) < 2:
            continue
        try:
            stats[int(entry)] = (int(fields[1]), fields[0], stat[stat.find("(") + 1:rparen])
        except ValueError:
            continue
    wanted: Iterable[int] = stats
    if root is not None:
        keep: set[int] = set()
        for p in (root, os.getpid()):  # ancestors: the launcher's, mldebug's own chain
            while p in stats and p not in keep:
                keep.add(p)
                p = stats[p][0]
        keep.add(root)
        children: dict[int, list[int]] = {}
        for p, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(p)
        todo, seen = [root], {root}
        while todo:  # descendants
            for c in children.get(todo.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        keep |= seen
        wanted = [p for p in stats if p in keep]
    procs: dict[int, dict[str, Any]] = {}
    for pid in wanted:
        ppid, state, comm = stats[pid]
        cmdline = (_read_proc(f"/proc/{pid}/cmdline") or b"").decode(
            errors="replace").split("\0")
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        procs[pid] = {
            "pid": pid,
            "ppid": ppid,
            "state": state,
            "uid": uid,
            "comm": comm,
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


def job_home(env: dict[str, str], host: str, pid: int, ppid: int) -> str:
    """The name of one job's folder on this node (``/tmp/mldebug-fr-<uid>/<this>``): the job
    key (``job_of``) made a file name, then the launcher process the rank runs under (its pid
    and start time). Every local rank of one launcher shares it; two jobs with one key in turn
    (torchrun on the same MASTER_PORT without --rdzv-id: ``master:...`` both times) never do,
    nor does a new launcher that was given an old one's pid. A process without a launcher
    key is a job of its own (``pid-<pid>``)."""
    key = job_of(env, host, None)["key"]
    who, started = (ppid, start_time(ppid)) if key else (pid, start_time(pid))
    name = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:120] if key else "pid"
    return f"{name}-{who}-{started if started is not None else 0}"


def _net_tag(pid: int) -> str:
    """``""`` when ``pid`` shares this process's network namespace, else ``@net<inode>``: two
    containers on one host may each run a job on 127.0.0.1:29500, which are two jobs."""
    try:
        theirs, ours = os.readlink(f"/proc/{pid}/ns/net"), os.readlink("/proc/self/ns/net")
    except OSError:
        return ""
    return "" if theirs == ours else "@net" + "".join(ch for ch in theirs if ch.isdecimal())


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
        launcher = launcher_above(p, procs)
        job = job_of(env, host or "", launcher)
        if job["key"] and job["key"].startswith("master:") and "/" in job["key"]:
            job["key"] += _net_tag(p)  # loopback: one job per network namespace (containers)
        if not has_rank or pid is not None or rx is not None:
            # chosen by --pid/--pattern: analysed as the user asked (the advice for a lone
            # rank-carrying process is to select it so; that must then work)
            job["lone"] = False
        cands[p] = dict(info, identity=ident.to_dict(), has_rank=has_rank, job=job)
        own = own_pid(p)
        if own is not None:  # in a container / pid namespace: the pid it knows itself by
            cands[p]["ns_pid"] = own
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
    separate_users(targets)
    return targets, errors


def separate_users(targets: list[dict[str, Any]]) -> None:
    """Processes of different users never share a job: where one job key on this node spans
    several owners (another user's process with the same MASTER_ADDR:PORT and a RANK), each
    owner's processes get the key qualified with their uid (``KEY@uidN``), so the analysis
    keeps them apart instead of naming the stranger a suspect of the caller's job."""
    owners: dict[str, set[int]] = {}
    for t in targets:
        key = (t.get("job") or {}).get("key")
        if key is not None:
            owners.setdefault(key, set()).add(t.get("uid", -1))
    for t in targets:
        job = t.get("job") or {}
        key = job.get("key")
        if key is not None and len(owners[key]) > 1:
            t["job"] = dict(job, key=f"{key}@uid{t.get('uid', -1)}")


def resolve_user(user: str) -> int | None:
    """A user name or numeric uid as a uid; None when this node has no such user."""
    if user.isdecimal():
        return int(user)
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def proc_status(pid: int) -> dict[str, str]:
    """State and TracerPid (and the rest) of /proc/PID/status; empty when unreadable."""
    out = {}
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): pid + start time
    names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_sample(pid: int, tid: int | None = None) -> dict[str, Any] | None:
    """The main thread's (``tid``, default the pid: the main thread of a process) scheduler state and CPU ticks (utime+stime), the process's ticks and
    its read+write bytes (rchar+wchar, sockets included: a gloo collective that completes
    moves them). None when the process is gone. Reads three small /proc files, bounded."""
    fields = []
    for path in (f"/proc/{pid}/task/{tid or pid}/stat", f"/proc/{pid}/stat"):
        try:
            with open(path, "rb") as f:
                text = f.read(4096).decode(errors="replace")
            rest = text[text.rindex(")") + 2:].split()
            fields.append((rest[0], int(rest[11]) + int(rest[12])))
        except (OSError, ValueError, IndexError):
            return None
    io = None
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            io_text = f.read(4096).decode(errors="replace")
        counts = dict(line.split(":", 1) for line in io_text.splitlines() if ":" in line)
        io = int(counts["rchar"]) + int(counts["wchar"])
    except (OSError, ValueError, KeyError):
        pass  # another user's process: /proc/PID/io needs ptrace read access
    return {"t": round(time.monotonic(), 4), "state": fields[0][0], "ticks": fields[0][1],
            "proc_ticks": fields[1][1], "io": io}


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: signal 0 reaches it (or is refused: another user's) and it
    is not a zombie (a zombie has exited: nothing more will come from it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError:  # a pid out of range
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096).decode(errors="replace")
        return text[text.rindex(")") + 2:].split()[0] != "Z"
    except (OSError, ValueError, IndexError):
        return True


def ns_pids(pid: int) -> list[int]:
    """The pid of ``pid`` in each pid namespace it is in, this /proc's first, its own last
    (``NSpid`` of /proc/PID/status); [] when unreadable (gone, or a kernel before 4.1)."""
    for line in (read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return []
    return []


def own_pid(pid: int) -> int | None:
    """The pid ``pid`` (of this /proc) has in its own pid namespace, when that differs (a rank
    in a container or ``unshare --pid``: what it prints and writes in file names)."""
    ns = ns_pids(pid)
    return ns[-1] if len(ns) > 1 and ns[-1] != pid else None


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``); None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def nested_pids() -> dict[int, list[int]]:
    """Own pid -> pids in this /proc of every process in a nested pid namespace (containers,
    ``unshare --pid``): one pass over /proc for ``host_pid`` to look up many registrations."""
    table: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if entry.isdecimal():
            ns = ns_pids(int(entry))
            if len(ns) > 1 and ns[-1] != ns[0]:
                table.setdefault(ns[-1], []).append(ns[0])
    return table


INIT_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's initial pid namespace (PROC_PID_INIT_INO)


def ns_tag() -> str:
    """``""`` in the initial pid namespace, ``-ns<inode>`` inside a nested one: a file name
    part that keeps pid 5 of one container apart from pid 5 of another sharing a directory."""
    ns = pid_namespace()
    if ns is None or ns == INIT_PID_NAMESPACE:
        return ""
    inode = "".join(ch for ch in ns if ch.isdecimal())
    return f"-ns{inode}" if inode else ""


def host_pid(pid: int, start: int | None = None,
             table: dict[int, list[int]] | None = None, pidns: str | None = None) -> int | None:
    """The pid in this /proc of the process that calls itself ``pid`` (its ``os.getpid()``,
    written into a registration) and started at ``start`` (clock ticks, ``start_time``).

    The same process when this namespace shows ``pid`` with that start time; otherwise a
    process of a nested pid namespace (a container, ``unshare --pid``) whose own pid is
    ``pid`` and whose start time matches (``table``: ``nested_pids()``, computed here when
    not given) and, with ``pidns`` (the rank's ``pid_namespace()``), whose namespace is that
    one: two containers' pid 1 started in the same clock tick are still told apart. Only an
    unambiguous match is taken. None: no such process runs here (gone, or its pid reused)."""
    if pidns is not None and _pidns_of(pid) not in (pidns, None):
        pass  # this namespace's process with that number is another one
    elif start is None:
        if alive(pid) and own_pid(pid) is None:
            return pid
    elif start_time(pid) == start and alive(pid):
        return pid
    found = [h for h in (nested_pids() if table is None else table).get(pid, ())
             if h != pid and alive(h) and (start is None or start_time(h) == start)
             and (pidns is None or _pidns_of(h) in (pidns, None))]
    return found[0] if len(found) == 1 else None


def _pidns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def launcher_above(pid: int, procs: dict[int, dict[str, Any]]) -> tuple[int, str] | None:
    """The nearest launcher above ``pid`` in ``procs``: (its pid, its name), or None."""
    return next(((a, name) for a in _ancestors(pid, procs)
                 if a in procs and (name := launcher_of(procs[a]))), None)


def hidden_ranks(procs: dict[int, dict[str, Any]], targets: list[dict[str, Any]],
                 uid: int | None, opts: Any) -> dict[int, dict[str, Any]]:
    """Python processes under a launcher whose environment cannot be read (no ptrace rights:
    a non-dumpable rank) and so were not found as ranks: pid -> info with its launcher. Only
    within this run's selection (user, --pid, --pattern); none with --slurm-job (its job id
    is in the environment that cannot be read)."""
    if getattr(opts, "slurm_job", None):
        return {}
    taken = {t["pid"] for t in targets} | {w["pid"] for t in targets
                                           for w in t.get("workers", ())}
    rx = re.compile(opts.pattern) if getattr(opts, "pattern", None) else None
    me = os.getpid()
    out: dict[int, dict[str, Any]] = {}
    for p, info in procs.items():
        if p in taken or p == me or info["state"] in ("Z", "X"):
            continue
        if uid is not None and info["uid"] != uid:
            continue
        if not is_python(info) or is_mldebug(info):
            continue
        if rx is not None and not rx.search(" ".join(info["cmdline"])):
            continue
        launcher = launcher_above(p, procs)
        if launcher is None:
            continue
        if getattr(opts, "pid", None) is not None and opts.pid != p and opts.pid != launcher[0]:
            continue
        try:
            read_environ(p)
            continue  # readable: find_ranks saw it and it is no rank
        except OSError:
            pass
        out[p] = dict(info, launcher=launcher)
    return out
