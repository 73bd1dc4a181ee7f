"""Host lists: ``node[1-4,7]`` syntax (via python-hostlist), hostfiles, validation.

Host names are validated before they reach a command line, so nothing odd is ever passed
to pdsh or ssh.
"""

from __future__ import annotations

import re
from pathlib import Path

from mldebug.errors import UsageError

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,252})|\[[0-9A-Fa-f:.]+\])$")


def validate_host(host: str) -> str:
    """Return the host if it is a plausible host name or address, else raise UsageError."""
    if not _HOST_RE.match(host) or host.startswith("-"):
        raise UsageError(
            f"invalid host name {host!r}.",
            "Host names may contain letters, digits, '.', '-' and '_' only.",
        )
    return host


def expand(hostlist: str) -> list[str]:
    """Expand ``node[1-3],gpu07`` into a list of validated host names, order kept."""
    import hostlist as _hl

    try:
        hosts = _hl.expand_hostlist(hostlist.strip())
    except _hl.BadHostlist as e:
        raise UsageError(
            f"cannot parse host list {hostlist!r}: {e}.",
            "Use the SLURM form, e.g. node[1-4,7] or node1,node2.",
        ) from None
    seen: dict[str, None] = {}
    for h in hosts:
        seen.setdefault(validate_host(h), None)
    if not seen:
        raise UsageError(f"host list {hostlist!r} names no hosts.", "Pass e.g. node[1-4].")
    return list(seen)


def collapse(hosts: list[str]) -> str:
    """Fold host names back into the compact form: [node1,node2,node3] -> node[1-3]."""
    import hostlist as _hl

    if not hosts:
        return ""
    return str(_hl.collect_hostlist(sorted(set(hosts))))


def parse_hostfile(text: str, source: str = "hostfile") -> list[str]:
    """Hosts from a hostfile: one per line, DeepSpeed/Open MPI ``host slots=N``, MPICH ``host:N``.

    Comments (#) and blank lines are ignored. Host-list syntax on a line is expanded.
    """
    hosts: dict[str, None] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        token = line.split()[0]
        if ":" in token and not token.startswith("["):
            name, _, slots = token.partition(":")
            if not slots.isdecimal():
                raise UsageError(
                    f"{source}:{lineno}: cannot read {raw.strip()!r}.",
                    "Expected 'host', 'host slots=N' or 'host:N'.",
                )
            token = name
        try:
            for h in expand(token):
                hosts.setdefault(h, None)
        except UsageError as e:
            raise UsageError(f"{source}:{lineno}: {e.message}", e.fix) from None
    return list(hosts)


# A hostfile of 100,000 hosts with slots and comments stays far below this.
MAX_HOSTFILE_BYTES = 16 << 20


def read_hostfile(path: str | Path) -> list[str]:
    """Hosts of a hostfile, read with a size bound (``/dev/zero`` or a huge file is refused)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read hostfile {p}: {e.strerror}.", "Check the path.") from None
    if len(raw) > MAX_HOSTFILE_BYTES:
        raise UsageError(f"hostfile {p} is larger than {MAX_HOSTFILE_BYTES >> 20} MiB.",
                         "Pass a file with one host per line.")
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise UsageError(f"hostfile {p} is not UTF-8 text (byte {e.start}).",
                         "Pass a text file with one host per line.") from None
    hosts = parse_hostfile(text, str(p))
    if not hosts:
        raise UsageError(f"hostfile {p} lists no hosts.", "Put one host per line.")
    return hosts
