"""Memory cgroups: this process's group, its effective limit, and fresh child groups.

cgroup v1 (a ``memory`` hierarchy: ``memory.max_usage_in_bytes``, ``memory.oom_control``) and
v2 (``memory.peak`` on kernels >= 5.19, ``memory.events``). Creating a child needs write
access to our own group (root, or a delegated v2 subtree); callers fall back when it fails.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

UNLIMITED = 1 << 62


class CgroupUnavailable(Exception):
    """No memory cgroup can be used here; the message says why."""


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of the cgroup mounts, from /proc/self/mountinfo."""
    out: list[tuple[str, str, str]] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) >= 5 and len(rparts) >= 3 and rparts[0] in ("cgroup", "cgroup2"):
            out.append((parts[4], rparts[0], rparts[2]))
    return out


def own_group(pid: int | str = "self") -> tuple[int, Path]:
    """(version, directory) of the memory cgroup ``pid`` is in."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as e:
        raise CgroupUnavailable(f"cannot read /proc/{pid}/cgroup: {e.strerror}") from None
    mounts = _mounts()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            for mnt, fstype, opts in mounts:
                if fstype == "cgroup" and "memory" in opts.split(","):
                    return 1, Path(mnt + path)
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            for mnt, fstype, _ in mounts:
                d = Path(mnt + path)
                if fstype == "cgroup2" and "memory" in _read(d / "cgroup.controllers").split():
                    return 2, d
    raise CgroupUnavailable("no cgroup with the memory controller (v1 'memory' hierarchy or "
                            "v2 with memory enabled) is mounted")


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _limit_file(version: int) -> str:
    return "memory.limit_in_bytes" if version == 1 else "memory.max"


def usage_of(path: Path) -> int | None:
    """Bytes a cgroup uses now (v1 usage_in_bytes, v2 memory.current)."""
    for name in ("memory.usage_in_bytes", "memory.current"):
        text = _read(path / name)
        if text.isdecimal():
            return int(text)
    return None


def limit(pid: int | str = "self") -> tuple[int | None, Path | None]:
    """The tightest memory limit over ``pid``'s cgroup and its ancestors, and whose it is."""
    try:
        version, d = own_group(pid)
    except CgroupUnavailable:
        return None, None
    best: tuple[int | None, Path | None] = (None, None)
    mount_root = next((Path(m) for m, _, _ in _mounts() if str(d).startswith(m)), Path("/"))
    while True:
        text = _read(d / _limit_file(version))
        if text and text != "max":
            v = int(text)
            if v < UNLIMITED and (best[0] is None or v < best[0]):
                best = (v, d)
        if d == mount_root or d.parent == d:
            break
        d = d.parent
    return best


@dataclass
class Group:
    """A child memory cgroup mldebug created (and removes)."""

    version: int
    path: Path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def set_limit(self, nbytes: int) -> None:
        (self.path / _limit_file(self.version)).write_text(str(nbytes))

    def peak(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _read(self.path / name)
        return int(text) if text.isdecimal() else None

    def oom_kills(self) -> int | None:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in _read(self.path / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdecimal():
                return int(value)
        return None

    def usage(self) -> int | None:
        text = _read(self.path / ("memory.usage_in_bytes" if self.version == 1 else "memory.current"))
        return int(text) if text.isdecimal() else None

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.path / "cgroup.procs").split() if x.isdecimal()]

    def remove(self) -> bool:
        """Remove the group if it is empty (a leftover daemon keeps it; we never kill it)."""
        try:
            os.rmdir(self.path)
            return True
        except OSError:
            return False


def create(purpose: str) -> Group:
    """A fresh child of our own memory cgroup; CgroupUnavailable says why not."""
    version, parent = own_group()
    if version == 2 and "memory" not in _read(parent / "cgroup.subtree_control").split():
        raise CgroupUnavailable(f"cgroup v2 {parent} does not delegate the memory controller to "
                                "children (memory not in cgroup.subtree_control)")
    if version == 1 and _read(parent / "memory.use_hierarchy") != "1":
        raise CgroupUnavailable(f"{parent} has memory.use_hierarchy=0: a child group would "
                                "escape this group's limit")
    path = parent / f"mldebug-{purpose}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        os.mkdir(path, 0o700)
    except OSError as e:
        raise CgroupUnavailable(f"cannot create a cgroup under {parent}: {e.strerror} "
                                "(run as root, or in a delegated cgroup v2 subtree)") from None
    g = Group(version, path)
    if version == 2 and not (path / "memory.peak").exists():
        g.remove()
        raise CgroupUnavailable("cgroup v2 without memory.peak (kernel older than 5.19)")
    return g
