"""Trigger every rank's flight-recorder dump on this node and return the dumps (stdlib only).

This file is sent to each node by ``mldebug fr trigger --nodes`` (through mldebug.fanout), so
it imports nothing outside the standard library and nodes need no mldebug install. It is
also imported by ``mldebug.fr.collect`` for the local case.

Ranks that called ``mldebug.fr.enable()`` register in the dump directory
(``.mldebug-fr-<host>-<pid>.json`` and a FIFO ``.mldebug-fr-<host>-<pid>.trigger``; the host
is in the name because pids repeat across nodes sharing one directory, and a rank in a nested
pid namespace adds ``-ns<inode>`` because they repeat across containers too). For each registration of
a live process on this host the script writes a fresh token into the FIFO (non-blocking: a
rank that is not listening is reported, never waited on), then waits until the rank writes
``.mldebug-fr-<host>-<pid>.done`` naming that token and its dump file. When no rank registered but
PyTorch's native NCCL pipes exist (``<dir>/nccl/*.pipe``), it pokes those instead.

Output: one line ``MLDEBUG-JSON {"host":..., "ranks":[{"rank", "pid", "file", "mode",
"data"|"error"}], "notes":[...]}`` with each dump zlib-compressed and base64-encoded.

The directory is shared ground (/tmp): it is refused when it is a symlink, or another user
than its owner can write it; every file used in it (registration, FIFO, acknowledgement,
dump) is opened without following symlinks and must be what it claims (a FIFO, a regular
file) and belong to the directory's owner; a dump is read only from the place the protocol
names (``<dir>/triggered/<token>/fr_rank<R>``), never from a path a file in the directory
points to.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import stat
import sys
import time
import zlib
from typing import Any

from mldebug.nodekit import ArgumentParser, emit, read_fd, short_hostname
from mldebug.privdir import UnsafeDir, check_stat, owner_name
from mldebug.privdir import check_dir as _check_dir
from mldebug.privdir import private_dir as _private_dir
from mldebug.ranks import alive, host_pid, nested_pids, proc_status, read_text

REGISTRY_PREFIX = ".mldebug-fr-"


TRIGGERED = "triggered"  # <dir>/triggered/<token>/fr_rank<R>: one folder per trigger
MAX_DUMP_BYTES = 1 << 30  # per rank: a larger file is refused, not read
MAX_SMALL_BYTES = 1 << 16  # registrations and acknowledgements
_TOKEN = re.compile(r"^[0-9A-Za-z-]{1,64}$")
_DUMP_NAME = re.compile(r"^fr_rank([0-9]{1,9})$")


def default_dir() -> str:
    return os.environ.get("MLDEBUG_FR_DIR") or f"/tmp/mldebug-fr-{os.getuid()}"


# One folder per job under the default directory (``fr.enable()`` without a directory):
# ``/tmp/mldebug-fr-<uid>/<job home>/`` (mldebug.ranks.job_home), so no job's dumps replace
# another's. The folder's ``.mldebug-fr-job.json`` says whose it is (key, launcher, host).
HOME_INFO = ".mldebug-fr-job.json"
NATIVE_SUBDIR_NAME = "nccl"  # torch's own dumps and pipes (fr.recorder.NATIVE_SUBDIR)
NOT_HOMES = frozenset({TRIGGERED, NATIVE_SUBDIR_NAME, "raw"})  # a recorder directory's own
MAX_HOMES = 4096  # job folders looked at under one directory, newest first


def job_homes(dump_dir: str, limit: int = MAX_HOMES) -> list[str]:
    """The job folders under ``dump_dir`` (real directories, never a link, none of a
    recorder's own folders), newest first, at most ``limit``; their owner is checked where
    they are used."""
    found = []
    try:
        with os.scandir(dump_dir) as it:
            for n, e in enumerate(it):
                if n >= 4 * limit:
                    break
                if e.name in NOT_HOMES or e.name.startswith(".") or len(e.name) > 255:
                    continue
                if e.is_dir(follow_symlinks=False):
                    found.append((e.stat(follow_symlinks=False).st_mtime, e.path))
    except OSError:
        return []
    return [p for _, p in sorted(found, reverse=True)[:limit]]


def check_dir(path: str, uid: int | None = None) -> os.stat_result:
    """The directory's lstat when it is safe to use (``mldebug.privdir``'s rule; ``uid``: the
    owner it must have, None: any); raises UnsafeDir saying why and what to do."""
    return _check_dir(path, uid, "flight-recorder directory")


def private_dir(path: str) -> os.stat_result:
    """Create ``path`` mode 0700 (parents as needed) or accept it when it is already safe."""
    _private_dir(path, what="flight-recorder directory")
    return check_dir(path, os.getuid())


def open_in(dir_fd: int, name: str, owner: int, kind: str, flags: int = os.O_RDONLY) -> int:
    """Open ``name`` inside the directory ``dir_fd`` without following a symlink, and check it
    is a ``kind`` ("file", "fifo", "dir") belonging to ``owner``; raises OSError/ValueError."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a plain name inside the directory")
    extra = os.O_DIRECTORY if kind == "dir" else 0
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | extra, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        ok = {"file": stat.S_ISREG, "fifo": stat.S_ISFIFO, "dir": stat.S_ISDIR}[kind](st.st_mode)
        if not ok:
            raise ValueError(f"{name} is not a {kind}")
        if st.st_uid != owner:
            raise ValueError(f"{name} belongs to {owner_name(st.st_uid)}, not to the directory's "
                             f"owner {owner_name(owner)}")
        if kind == "dir":
            try:
                check_stat(st, name, owner)
            except UnsafeDir as e:
                raise ValueError(e.message) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_in(dir_fd: int, name: str, owner: int, limit: int) -> tuple[bytes, int]:
    """A regular file's bytes (at most ``limit``) and mode, opened as ``open_in`` does."""
    fd = open_in(dir_fd, name, owner, "file", os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            raise ValueError(f"{name} is {st.st_size} bytes, over the {limit}-byte limit")
        data = read_fd(fd, limit + 1)
        if len(data) > limit:
            raise ValueError(f"{name} grew over the {limit}-byte limit while read")
        return data, stat.S_IMODE(st.st_mode)
    finally:
        os.close(fd)


NOT_LISTENING = "not listening on its trigger FIFO"


def _stopped(pid: int) -> str | None:
    """A stopped process (SIGSTOP, job control, a debugger's stop) cannot read its FIFO: said
    at once instead of after the poke's wait."""
    state = proc_status(pid).get("State", "")
    return "stopped" if state.startswith(("T", "t")) else None


def _unread(dir_fd: int, name: str, owner: int) -> int | None:
    """Bytes of the trigger still unread in a rank's FIFO (FIONREAD; never blocks): a rank
    whose threads run reads its token at once and closes the FIFO to dump (0: no reader left),
    a frozen one leaves it there. None when that cannot be told."""
    import fcntl
    import termios

    try:
        fd = open_in(dir_fd, name, owner, "fifo", os.O_WRONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as e:
        return 0 if getattr(e, "errno", None) == errno.ENXIO else None
    try:
        buf = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)
    except OSError:
        return None
    finally:
        os.close(fd)


def silent_reason(pid: int) -> str:
    """Why a live rank did not answer the trigger, from /proc/PID/status (no ptrace): the
    rank is the finding - alive but stopped or frozen - never a slow recorder to wait for."""
    st = proc_status(pid)
    state = st.get("State", "?")
    tracer = st.get("TracerPid", "0")
    traced = ""
    if tracer not in ("", "0"):
        comm = (read_text(f"/proc/{tracer}/comm") or "?").strip()
        traced = f"; traced by pid {tracer} ({comm})"
    if state.startswith(("T", "t")):
        return (f"alive but stopped (State {state}{traced}): SIGSTOP, a job-control stop or a "
                f"debugger; it cannot dump until it runs again (kill -CONT {pid}, or detach "
                "the debugger). A stopped rank holds up every collective it is part of.")
    if state.startswith("D"):
        return (f"alive but in uninterruptible sleep (State {state}{traced}): stuck in a "
                "driver or file-system call; see its kernel stack in "
                f"/proc/{pid}/stack (root) and mldebug hang --native --pid {pid}.")
    return (f"alive (State {state}{traced}) but it never read its trigger: no Python thread of "
            "it runs - frozen in a C call holding the GIL, or a deadlock - so it is a prime "
            f"suspect. mldebug hang --native --pid {pid} reads it with py-spy.")


def _poke(dir_fd: int, name: str, owner: int, token: str, deadline: float) -> str | None:
    """Write the token into a FIFO inside the directory without ever blocking or following a
    symlink; returns an error or None."""
    while True:
        try:
            fd = open_in(dir_fd, name, owner, "fifo", os.O_WRONLY | os.O_NONBLOCK)
        except ValueError as e:
            return f"trigger FIFO refused: {e}"
        except OSError as e:
            if e.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)  # the listener is between two reads (or busy dumping)
                continue
            if e.errno == errno.ENXIO:
                return NOT_LISTENING + " (process stuck before enable()?)"
            if e.errno == errno.ELOOP:
                return "trigger FIFO refused: it is a symlink"
            return f"cannot open trigger FIFO: {e.strerror}"
        try:
            os.write(fd, (token + "\n").encode())
        except OSError as e:
            return f"cannot write trigger FIFO: {e.strerror}"
        finally:
            os.close(fd)
        return None


def _read_json(dir_fd: int, name: str, owner: int) -> dict[str, Any] | None:
    try:
        data, _ = read_in(dir_fd, name, owner, MAX_SMALL_BYTES)
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def registration(doc: dict[str, Any] | None, name: str) -> tuple[int, str, int | None]:
    """(pid, host, rank) of a registration document; ValueError saying what is malformed."""
    if doc is None:
        raise ValueError("not a JSON object (unreadable, too large, or not owned by the "
                         "directory's owner)")
    pid, host, rank = doc.get("pid"), doc.get("host"), doc.get("rank")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31:
        raise ValueError(f"'pid' is {str(pid)[:40]!r}, not a process id")
    if not isinstance(host, str) or not host or len(host) > 255:
        raise ValueError("'host' is not a host name")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)
                             or not 0 <= rank < 1 << 24):
        raise ValueError(f"'rank' is {str(rank)[:40]!r}, not a rank")
    if not re.fullmatch(re.escape(f"{REGISTRY_PREFIX}{host}-{pid}") + r"(-ns[0-9]{1,20})?\.json",
                        name):
        raise ValueError("its name does not match its host and pid")
    return pid, host, rank


def _encode(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 1)).decode()


def _fetch_dump(dir_fd: int, owner: int, token: str, file: Any) -> tuple[bytes, int, str]:
    """The acknowledged dump, read only from ``triggered/<token>/fr_rank<R>`` inside the
    directory; ValueError/OSError when the acknowledgement names anything else."""
    if not isinstance(file, str):
        raise ValueError("the acknowledgement names no file")
    parts = file.split("/")
    if len(parts) < 3 or parts[-3:-1] != [TRIGGERED, token] or not _DUMP_NAME.match(parts[-1]):
        raise ValueError(f"the acknowledgement names {file[:200]!r}, outside "
                         f"{TRIGGERED}/{token}/ of the directory: refused")
    tdir = open_in(dir_fd, TRIGGERED, owner, "dir")
    try:
        kdir = open_in(tdir, token, owner, "dir")
        try:
            data, mode = read_in(kdir, parts[-1], owner, MAX_DUMP_BYTES)
        finally:
            os.close(kdir)
    finally:
        os.close(tdir)
    return data, mode, parts[-1]


def named_owner(dump_dir: str) -> int | None:
    """The uid ``/tmp/mldebug-fr-<uid>`` (or its fallback ``...-XXXXXXXX``) belongs to by its
    name: another user's directory there is a plant. None: any owner (a directory chosen)."""
    named = re.fullmatch(r"mldebug-fr-([0-9]{1,9})(-[A-Za-z0-9_]{8})?",
                         os.path.basename(dump_dir.rstrip("/")))
    return int(named.group(1)) if named else None


def trigger(dump_dir: str, timeout: float, include_data: bool = True,
            max_bytes: int = MAX_DUMP_BYTES, pids: set[int] | None = None,
            uid: int | None = None) -> dict[str, Any]:
    """Trigger the ranks registered in ``dump_dir``; ``uid``: the owner it must have (default:
    the one its name says, else any)."""
    host = short_hostname()
    out: dict[str, Any] = {"host": host, "dir": dump_dir, "ranks": [], "notes": []}
    try:
        st = check_dir(dump_dir, uid if uid is not None else named_owner(dump_dir))
    except FileNotFoundError:
        out["notes"].append(f"{dump_dir} does not exist on {host}: no rank called "
                            "mldebug.fr.enable() with this directory here")
        return out
    except UnsafeDir as e:
        out["errors"] = [str(e)]
        out["notes"].append(f"{host}: {e}")
        return out
    owner = st.st_uid
    try:
        dir_fd = os.open(dump_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        out["notes"].append(f"cannot open {dump_dir}: {e.strerror}")
        return out
    try:
        _trigger_in(dir_fd, owner, dump_dir, host, timeout, include_data, max_bytes, pids, out)
    finally:
        os.close(dir_fd)
    return out


def _trigger_in(dir_fd: int, owner: int, dump_dir: str, host: str, timeout: float,
                include_data: bool, max_bytes: int, pids: set[int] | None,
                out: dict[str, Any]) -> None:
    deadline = time.monotonic() + timeout
    token = f"{time.time_ns()}-{os.getpid()}-{os.urandom(4).hex()}"
    waiting: list[dict[str, Any]] = []
    stale = 0
    table: dict[int, list[int]] | None = None  # pid namespaces nested in this one, once
    for name in sorted(os.listdir(dir_fd)):
        if not (name.startswith(REGISTRY_PREFIX + host + "-") and name.endswith(".json")):
            continue
        doc = _read_json(dir_fd, name, owner)
        try:
            own, _, rank = registration(doc, name)
        except ValueError as e:
            out["ranks"].append({"rank": None, "pid": None,
                                 "error": f"malformed registration {name}: {e}; ignored"})
            continue
        start = (doc or {}).get("start_time")
        start = start if isinstance(start, int) and not isinstance(start, bool) else None
        # the registration names the pid the rank has in its own namespace (a container's
        # rank 0 is pid 5 there, 4769 here): found by its start time, never by the number alone
        pidns = (doc or {}).get("pidns")
        pidns = pidns if isinstance(pidns, str) and len(pidns) < 64 else None
        pid = host_pid(own, start, {}, pidns)
        if pid is None:
            table = nested_pids() if table is None else table
            pid = host_pid(own, start, table, pidns)
        if pid is None:
            if pids is None or own in pids:
                stale += 1
            continue
        if pids is not None and pid not in pids:
            continue  # another job's rank
        item: dict[str, Any] = {"pid": pid, "rank": rank}
        if pid != own:
            item["ns_pid"] = own
        try:
            pid_uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            pid_uid = owner  # no /proc (not Linux): the directory's checks stand alone
        if pid_uid != owner:
            item["error"] = (f"registration {name} names pid {pid}, a process of "
                             f"{owner_name(pid_uid)}, not of the directory's owner {owner_name(owner)}; "
                             "ignored")
            out["ranks"].append(item)
            continue
        stopped = _stopped(pid)
        stem = name[:-len(".json")]  # .mldebug-fr-<host>-<pid>[-ns<inode>]
        err = stopped or _poke(dir_fd, stem + ".trigger", owner, token,
                               min(deadline, time.monotonic() + 5))
        if stopped or (err and err.startswith(NOT_LISTENING) and alive(pid)):
            item["error"] = "did not answer the trigger: " + silent_reason(pid)
            item["silent"] = True
            out["ranks"].append(item)
        elif err:
            item["error"] = err
            out["ranks"].append(item)
        else:
            item["_done"] = stem + ".done"
            item["_fifo"] = stem + ".trigger"
            waiting.append(item)
    if stale:
        out["notes"].append(f"{stale} registration(s) of processes that no longer run were ignored")
    if not waiting and not out["ranks"]:
        _native(dir_fd, owner, deadline, include_data, out)
    while waiting and time.monotonic() < deadline:
        for item in list(waiting):
            done = _read_json(dir_fd, item["_done"], owner)
            if not done or done.get("token") != token:
                continue
            waiting.remove(item)
            del item["_done"], item["_fifo"]
            r = done.get("rank", item["rank"])
            item["rank"] = r if isinstance(r, int) and not isinstance(r, bool) else item["rank"]
            if not done.get("file"):
                item["error"] = "the rank could not dump: " + str(done.get("error", "?"))[:500]
            else:
                item["file"] = str(done["file"])[:4096]
                try:
                    data, item["mode"], _ = _fetch_dump(dir_fd, owner, token, done["file"])
                    item["bytes"] = len(data)
                    if len(data) > max_bytes:
                        item["error"] = (f"dump is {len(data)} bytes, over what is left of the "
                                         f"per-node cap ({max_bytes} bytes); copy "
                                         f"{item['file']} by hand or raise --max-mb")
                    else:
                        max_bytes -= len(data)
                        if include_data:
                            item["data"] = _encode(data)
                except (OSError, ValueError) as e:
                    item["error"] = f"dump refused: {getattr(e, 'strerror', None) or e}"
            out["ranks"].append(item)
        if waiting:
            time.sleep(0.05)
    for item in waiting:
        del item["_done"]
        unread = _unread(dir_fd, item.pop("_fifo"), owner)
        if alive(item["pid"]) and unread == 0:
            item["error"] = (f"took the trigger but did not finish its dump within {timeout:g}s "
                             "(a loaded machine, or a large TORCH_FR_BUFFER_SIZE); raise "
                             "--timeout")
        elif alive(item["pid"]):
            item["error"] = (f"did not answer the trigger within {timeout:g}s: "
                             + silent_reason(item["pid"]))
            item["silent"] = True
        else:
            item["error"] = f"process {item['pid']} exited before it answered the trigger"
        out["ranks"].append(item)
    silent = [i for i in out["ranks"] if i.get("silent")]
    answered = [i for i in out["ranks"] if "file" in i and not i.get("error")]
    if silent and answered:
        out["notes"].append(
            f"{len(silent)} live rank(s) did not answer while {len(answered)} did: a rank "
            "whose recorder thread can run dumps within a second, so the silent ranks are "
            "the finding (stopped or frozen), not the ranks that answered")
    if not out["ranks"]:
        out["notes"].append(f"no rank on {host} is registered in {dump_dir}: call "
                            "mldebug.fr.enable() in the training script (or pass --dir)")


def _native(dir_fd: int, owner: int, deadline: float, include_data: bool,
            out: dict[str, Any]) -> None:
    """Fallback: PyTorch's own NCCL debug pipes (<stem><rank>.pipe) without mldebug.enable()."""
    try:
        nfd = open_in(dir_fd, "nccl", owner, "dir")
    except (OSError, ValueError):
        return
    try:
        pipes = sorted(n for n in os.listdir(nfd) if n.endswith(".pipe"))
        start = time.time()
        pending = []
        for pipe in pipes:
            target = pipe[: -len(".pipe")]
            err = _poke(nfd, pipe, owner, "1", min(deadline, time.monotonic() + 2))
            if err:
                out["ranks"].append({"rank": None, "file": target, "error": "native pipe " + err})
            else:
                pending.append(target)
        while pending and time.monotonic() < deadline:
            for target in list(pending):
                try:
                    fresh = os.stat(target, dir_fd=nfd, follow_symlinks=False).st_mtime >= start
                except OSError:
                    fresh = False
                if not fresh:
                    continue
                time.sleep(0.2)  # the watchdog writes in place
                pending.remove(target)
                digits = "".join(ch for ch in target if ch.isdecimal())
                item: dict[str, Any] = {"rank": int(digits[-9:]) if digits else None,
                                        "file": target, "native": True}
                try:
                    data, item["mode"] = read_in(nfd, target, owner, MAX_DUMP_BYTES)
                    item["bytes"] = len(data)
                    if include_data:
                        item["data"] = _encode(data)
                except (OSError, ValueError) as e:
                    item["error"] = f"dump refused: {getattr(e, 'strerror', None) or e}"
                out["ranks"].append(item)
            time.sleep(0.05)
        for target in pending:
            out["ranks"].append({"rank": None, "file": target,
                                 "error": "native NCCL pipe poked but no dump appeared in time"})
    finally:
        os.close(nfd)


def discover_dirs(only: set[int] | None = None) -> list[str]:
    """Dump directories of this node's processes: ``MLDEBUG_FR_DIR`` from each readable
    ``/proc/<pid>/environ`` (a rank that set its own directory) and, unless ``only`` names
    the job's pids (then only theirs are read), every user's default ``/tmp/mldebug-fr-<uid>``."""
    found: dict[str, None] = {}
    try:
        pids = ([str(p) for p in sorted(only)] if only is not None
                else [n for n in os.listdir("/proc") if n.isdecimal()])
    except OSError:
        pids = []
    key = b"MLDEBUG_FR_DIR="
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read(1 << 20)
        except OSError:
            continue
        if key not in env:
            continue
        for var in env.split(b"\0"):
            if var.startswith(key) and len(var) < 4096:
                found.setdefault(var[len(key):].decode(errors="replace"), None)
    try:
        for name in sorted(os.listdir("/tmp")) if only is None else []:
            # the default, or the private one fr.enable() made beside it when that was taken
            if re.fullmatch(r"mldebug-fr-[0-9]+(-[A-Za-z0-9_]{8})?", name):
                found.setdefault(os.path.join("/tmp", name), None)
    except OSError:
        pass
    return [d for d in found if d and os.path.isabs(d)]


MAX_FALLBACKS = 16


def fallback_dirs(dump_dir: str) -> list[str]:
    """The private directories ``fr.enable()`` made beside ``dump_dir`` when it was refused
    (another user created it first, or it was writable by all): ``NAME-XXXXXXXX``
    (mldebug.privdir.private_dir's fallback). Real directories only, never a link, at most
    MAX_FALLBACKS, newest first; their owner is checked when they are triggered."""
    parent, name = os.path.split(dump_dir.rstrip("/"))
    pattern = re.compile(re.escape(name) + r"-[A-Za-z0-9_]{8}")
    found = []
    try:
        with os.scandir(parent or "/") as it:
            for e in it:
                if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                    found.append((e.stat(follow_symlinks=False).st_mtime, e.path))
    except OSError:
        return []
    return [p for _, p in sorted(found, reverse=True)[:MAX_FALLBACKS]]


def trigger_all(dump_dir: str, timeout: float, include_data: bool = True,
                max_bytes: int = MAX_DUMP_BYTES, discover: bool = False,
                pids: set[int] | None = None) -> dict[str, Any]:
    """``trigger`` on ``dump_dir`` and, with ``discover``, on every other directory found;
    each rank item says which directory its recorder used (``dir``). ``pids``: only these
    processes are triggered (``mldebug hang --fr``: the job's ranks, not other jobs')."""
    dirs = [dump_dir] + fallback_dirs(dump_dir)
    dirs += [d for d in discover_dirs(pids) if d not in dirs] if discover else []
    owners: dict[str, int | None] = {}
    for base in list(dirs):  # each directory's job folders, owned as the directory is
        try:
            owner = check_dir(base, named_owner(base)).st_uid
        except (OSError, UnsafeDir):
            continue  # said when the directory itself is triggered
        for home in job_homes(base):
            if home not in owners:
                owners[home] = owner
                dirs.append(home)
    merged: dict[str, Any] = {}
    for d in dirs:
        if d != dump_dir and not os.path.isdir(d):
            continue
        doc = trigger(d, timeout, include_data, max_bytes, pids, owners.get(d))
        for item in doc["ranks"]:
            item["dir"] = d
            if "bytes" in item:
                max_bytes -= int(item["bytes"])
        if not merged:
            merged = doc
            continue
        merged["ranks"].extend(doc["ranks"])
        merged.setdefault("errors", []).extend(doc.get("errors", []))
        if doc["ranks"]:  # notes of empty extra directories would only be noise
            merged["notes"].extend(doc["notes"])
    if len(dirs) > 1 and any(i.get("dir") != dump_dir for i in merged["ranks"]):
        merged["notes"] = [n for n in merged["notes"] if "is registered in" not in n
                           and "does not exist on" not in n]
    merged["dirs"] = [d for d in dirs if d not in owners
                      or any(i.get("dir") == d for i in merged["ranks"])][:64]
    return merged


def list_homes(dump_dir: str, pids: set[int] | None = None,
               limit: int = MAX_HOMES) -> dict[str, Any]:
    """What ``mldebug fr trigger --list`` shows of this node: every job folder under
    ``dump_dir`` and its fallbacks (and those directories themselves when ranks registered
    there), newest first: the job's key, its live ranks (registrations of this host whose
    process runs), its dumps, when it last changed. ``pids``: only folders where one of
    these processes registered. Reads names and small files only, never a dump."""
    host = short_hostname()
    out: dict[str, Any] = {"host": host, "ranks": [], "homes": [], "notes": []}
    bases = [dump_dir] + fallback_dirs(dump_dir)
    for base in bases:
        try:
            owner = check_dir(base, named_owner(base)).st_uid
        except FileNotFoundError:
            continue
        except (OSError, UnsafeDir) as e:
            out["notes"].append(f"{host}: {getattr(e, 'message', None) or e}")
            continue
        for d in [base] + job_homes(base, limit):
            item = _home_item(d, owner, host, base)
            if item is None or (pids is not None and not set(item["pids"]) & pids):
                continue
            if d == base and not item["pids"] and not item["dumps"]:
                continue
            out["homes"].append(item)
            if len(out["homes"]) >= limit:
                out["notes"].append(f"more than {limit} job folders; the newest are listed")
                return out
    out["homes"].sort(key=lambda h: -h["mtime"])
    return out


def _home_item(d: str, owner: int, host: str, base: str) -> dict[str, Any] | None:
    try:
        st = check_dir(d, owner)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, UnsafeDir):
        return None
    try:
        info = _read_json(dfd, HOME_INFO, owner) or {}
        pids: list[int] = []
        ranks: list[int] = []
        dumps = 0
        newest = st.st_mtime
        names = os.listdir(dfd)[:10000]
        for name in names:
            if name.startswith(REGISTRY_PREFIX + host + "-") and name.endswith(".json") \
                    and name != HOME_INFO:
                doc = _read_json(dfd, name, owner)
                try:
                    own, _, rank = registration(doc, name)
                except ValueError:
                    continue
                start = (doc or {}).get("start_time")
                pidns = (doc or {}).get("pidns")
                pid = host_pid(own, start if isinstance(start, int) else None, {},
                               pidns if isinstance(pidns, str) and len(pidns) < 64 else None)
                if pid is not None:
                    pids.append(pid)
                    if rank is not None:
                        ranks.append(rank)
            elif _DUMP_NAME.match(name):
                dumps += 1
        for sub in (TRIGGERED, "nccl"):
            try:
                sfd = open_in(dfd, sub, owner, "dir")
            except (OSError, ValueError):
                continue
            try:
                for name in os.listdir(sfd)[:10000]:
                    if sub == "nccl":
                        dumps += bool(_DUMP_NAME.match(name))
                        continue
                    try:
                        tfd = open_in(sfd, name, owner, "dir")
                    except (OSError, ValueError):
                        continue
                    try:
                        newest = max(newest, os.fstat(tfd).st_mtime)
                        dumps += sum(1 for n in os.listdir(tfd)[:10000] if _DUMP_NAME.match(n))
                    finally:
                        os.close(tfd)
            finally:
                os.close(sfd)
    finally:
        os.close(dfd)
    key = info.get("key") if isinstance(info.get("key"), str) else None
    return {"dir": d, "base": base, "key": key[:300] if key else None,
            "launcher_pid": info.get("launcher_pid") if isinstance(
                info.get("launcher_pid"), int) else None,
            "pids": sorted(pids), "ranks": sorted(ranks), "dumps": dumps, "mtime": newest}


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="mldebug-fr-node")
    p.add_argument("--dir", default=None)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--no-data", action="store_true")
    p.add_argument("--max-bytes", type=int, default=MAX_DUMP_BYTES)
    p.add_argument("--discover", action="store_true")
    p.add_argument("--pids", default=None, help="comma-separated: only these processes")
    p.add_argument("--list", action="store_true", help="list the job folders, trigger nothing")
    a = p.parse_args(argv)
    pids = {int(x) for x in a.pids.split(",") if x.isdecimal()} if a.pids is not None else None
    if a.list:
        emit(list_homes(a.dir or default_dir(), pids))
        return 0
    doc = trigger_all(a.dir or default_dir(), a.timeout, include_data=not a.no_data,
                      max_bytes=a.max_bytes, discover=a.discover, pids=pids)
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
