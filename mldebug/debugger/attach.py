"""``mldebug pdb attach PID``: pdb in a running process that has no breakpoint in its code.

Python 3.14 added ``sys.remote_exec`` and ``python -m pdb -p PID`` (PEP 768): the target's
own interpreter runs the debugger at its next safe point. Older interpreters have no such
hook, so this refuses with the way that works there (``mldebug.breakpoint``) instead of
injecting code by other means. Stdlib only: it runs on the rank's node (over ``ssh -t``).
"""

from __future__ import annotations

import os
import subprocess
import sys

MIN_VERSION = (3, 14)


class AttachError(Exception):
    """Attaching cannot work for this process; the message says why and what to do."""


def interpreter(pid: int) -> str:
    """The executable of ``pid`` (its Python)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise AttachError(f"no process {pid} on this host") from None
    except OSError as e:
        raise AttachError(f"cannot inspect pid {pid}: {e.strerror} (run as its user or root)"
                          ) from None


def version_of(python: str, pid: int) -> tuple[int, int]:
    r = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    try:
        major, minor = (int(x) for x in r.stdout.split())
    except ValueError:
        raise AttachError(f"pid {pid} runs {python}, which is not a Python interpreter") from None
    return major, minor


def command(pid: int) -> list[str]:
    """``python -m pdb -p PID`` with the target's own interpreter; AttachError before 3.14."""
    python = interpreter(pid)
    version = version_of(python, pid)
    if version < MIN_VERSION:
        raise AttachError(
            f"pid {pid} runs Python {version[0]}.{version[1]}; attaching to a running process "
            "needs Python 3.14+ (sys.remote_exec, python -m pdb -p). Put "
            "mldebug.breakpoint(rank=N) in the code instead (a rank without a terminal serves "
            "a session for mldebug pdb connect), or run the job on Python 3.14+.")
    return [python, "-m", "pdb", "-p", str(pid)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        argv_pdb = command(int(args[0]))
    except (AttachError, ValueError, IndexError) as e:
        print(f"mldebug pdb attach: {e}", file=sys.stderr)
        return 1
    return subprocess.call(argv_pdb)


if __name__ == "__main__":
    sys.exit(main())
