"""NCCL's interface-list syntax (NCCL_SOCKET_IFNAME, NCCL_IB_HCA), parsed by NCCL's own rules.

From NCCL's ``parseStringList``/``matchIfList`` (src/misc/utils.cc) and ``ncclFindInterfaces``
(src/misc/socket.cc): a leading ``^`` excludes, a following ``=`` makes the names exact
(otherwise each entry is a prefix), one more leading ``^``/``=`` is skipped by
``parseStringList`` (so ``==eth0`` still means exactly eth0), entries are comma separated, ``name:port`` restricts a
port (used by NCCL_IB_HCA), an empty list matches everything, and NCCL_SOCKET_IFNAME is only
honoured when longer than one character (a one-character value is silently ignored and NCCL
auto-detects instead). Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IfSpec:
    """A parsed NCCL interface list."""

    raw: str
    exclude: bool = False
    exact: bool = False
    entries: tuple[tuple[str, int], ...] = field(default_factory=tuple)  # (prefix, port|-1)

    def matches(self, name: str, port: int = -1) -> bool:
        """True when NCCL would use interface/device ``name`` (port ``port``, -1 = any)."""
        return _match_list(name, port, self.entries, self.exact) != self.exclude

    def describe(self) -> str:
        how = "exactly" if self.exact else "starting with"
        names = ", ".join(p if port < 0 else f"{p}:{port}" for p, port in self.entries)
        return f"{'all except' if self.exclude else 'only'} interfaces {how} {names or '(none)'}"


def parse(value: str) -> IfSpec:
    """Parse like NCCL: optional ``^``, optional ``=``, then ``name[:port]`` entries."""
    s = value
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    if s[:1] in ("^", "="):  # parseStringList skips one more leading '^' or '='
        s = s[1:]
    entries: list[tuple[str, int]] = []
    for item in s.split(","):
        name, sep, port = item.partition(":")
        if not name:
            continue
        entries.append((name, _atoi(port) if sep else -1))
    return IfSpec(value, exclude, exact, tuple(entries))


def _atoi(text: str) -> int:
    digits = ""
    for ch in text.strip():
        if not ch.isdecimal():
            break
        digits += ch
    return int(digits) if digits else 0


def _match_list(name: str, port: int, entries: tuple[tuple[str, int], ...], exact: bool) -> bool:
    if not entries:
        return True
    for prefix, eport in entries:
        hit = name == prefix if exact else name.startswith(prefix)
        if hit and (port == -1 or eport == -1 or port == eport):
            return True
    return False


def socket_ifname_ignored(value: str) -> bool:
    """NCCL ignores NCCL_SOCKET_IFNAME unless it is longer than one character."""
    return len(value) <= 1


def select(spec: IfSpec, names: Iterable[str]) -> list[str]:
    return [n for n in names if spec.matches(n)]


def select_ports(spec: IfSpec, ports: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(d, p) for d, p in ports if spec.matches(d, p)]


# NCCL's automatic choice when NCCL_SOCKET_IFNAME is unset (socket.cc): ib*, then anything
# but docker*/lo/virbr*, then docker*, then lo, then virbr*.
AUTO_ORDER = ("ib", "^docker,lo,virbr", "docker", "lo", "virbr")


def auto_select(names: Iterable[str]) -> list[str]:
    names = list(names)
    for rule in AUTO_ORDER:
        chosen = select(parse(rule), names)
        if chosen:
            return chosen
    return []
