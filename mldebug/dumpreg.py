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
from mldebug.ranks import start_time

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
    this host that installed a dump handler."""
    found: dict[int, dict[str, Any]] = {}
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
            pid = entry["pid"]
            if entry.get("start_time") != start_time(pid):
                continue  # a stale entry: that process is gone (or its pid reused)
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
