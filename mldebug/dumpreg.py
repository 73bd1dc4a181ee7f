"""The dump handlers' registry, read side: which live processes on this host installed
``mldebug.install_dump_handler()`` / ``mldebug.watchdog()``, where they write, and whether
they really catch their signal.

Each handler announces itself in its user's ``~/.cache/mldebug/capture/<host>-<pid>.json``
(``mldebug.capture.handler``); a collector (``trace show --pid``) reads the entries of the
users whose ranks it asks, trusting an entry only when the directory passes the private
directory rule, the file is the user's own, and pid + start time still name a live process.
Stdlib only (Python 3.7+), like the rest of the shared layer's node parts.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

from mldebug.nodekit import signal_in_mask
from mldebug.privdir import check_dir, registry_dir
from mldebug.ranks import host_pid, nested_pids

MAX_ENTRY = 1 << 20


def read_json_owned(path: Path, uid: int, limit: int = MAX_ENTRY) -> dict[str, Any] | None:
    """A JSON object in a file owned by ``uid``, read without following links, bounded;
    None when it is missing, someone else's, too large or not a JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def registry_entries(uids: set[int], host: str) -> dict[int, dict[str, Any]]:
    """pid -> registry entry (with ``uid`` added) of every live process of these users on
    this host that installed a dump handler. A rank in a nested pid namespace (a container,
    ``unshare --pid``) is keyed by its pid here; the entry keeps its own as ``ns_pid``."""
    found: dict[int, dict[str, Any]] = {}
    table: dict[int, list[int]] | None = None  # pid namespaces nested in this one, once
    for uid in uids:
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            continue
        reg = registry_dir(home)
        try:
            check_dir(reg, uid)
            names = os.listdir(reg)
        except Exception:  # noqa: BLE001 - no registry, or one we must not trust
            continue
        for name in names:
            if not (name.startswith(host + "-") and name.endswith(".json")):
                continue
            entry = read_json_owned(reg / name, uid)
            if not entry or not isinstance(entry.get("pid"), int):
                continue
            own, start = entry["pid"], entry.get("start_time")
            if not isinstance(start, int) or isinstance(start, bool):
                continue
            # the entry names the pid the rank has in its own namespace (a container's rank
            # is pid 5 there, 4769 here): found by its start time, never by the number alone
            pidns = entry.get("pidns") if isinstance(entry.get("pidns"), str) else None
            pid = host_pid(own, start, {}, pidns)
            if pid is None:
                table = nested_pids() if table is None else table
                pid = host_pid(own, start, table, pidns)
            if pid is None:
                continue  # a stale entry: that process is gone (or its pid reused)
            entry = dict(entry, pid=pid, **({"ns_pid": own} if own != pid else {}))
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
            except OSError:
                continue
            entry["uid"] = uid
            found[pid] = entry
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status; no ptrace).
    Never signal a process for which this is False: the default action may end it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return signal_in_mask(f.read(1 << 16).decode(errors="replace"), "SigCgt", signum)
    except (OSError, ValueError):
        return False


def inside(path: str, parent: str) -> bool:
    """Whether ``path`` lies strictly under ``parent`` (both normalised, no link resolved)."""
    p, d = os.path.normpath(path), os.path.normpath(parent)
    return p.startswith(d.rstrip("/") + "/")


def fresh_dump(entry: dict[str, Any], uid: int, since: float,
               limit: int = MAX_ENTRY) -> dict[str, Any] | None:
    """The stack dump a handler wrote after ``since`` (time.time()), read safely: only inside
    its own private directory, the user's own file, bounded; None when there is none yet."""
    d, dump = str(entry.get("dir", "")), str(entry.get("dump", ""))
    if not d or not inside(dump, d):
        return None
    try:
        check_dir(Path(d), uid)
        check_dir(Path(dump).parent, uid)
    except Exception:  # noqa: BLE001 - a directory we must not trust: no answer
        return None
    doc = read_json_owned(Path(dump), uid, limit)
    meta = (doc or {}).get("capture") or {}
    if doc is None or not isinstance(meta, dict) or not isinstance(meta.get("time"), (int, float)) \
            or meta["time"] < since:
        return None
    return doc


def fh_size(entry: dict[str, Any], uid: int) -> int:
    """Bytes in the handler's faulthandler file (its C-level route), -1 when there is none
    or it is not the user's own file inside the handler's directory."""
    fh = str(entry.get("faulthandler", ""))
    if not inside(fh, str(entry.get("dir", ""))):
        return -1
    try:
        st = os.lstat(fh)
    except OSError:
        return -1
    return st.st_size if st.st_uid == uid else -1
