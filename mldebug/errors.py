"""Every failure mldebug reports maps to an error with an actionable fix.

Messages name the thing, say what is wrong, and say what to do. Tests pin them.
"""

from __future__ import annotations


class MldebugError(Exception):
    """An error with a one-line message and a fix the user can act on."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()


class UsageError(MldebugError):
    """Bad command-line input; the CLI exits with code 2."""


PTRACE_FIX = (
    "Run as root, or allow ptrace: sudo sysctl -w kernel.yama.ptrace_scope=0 "
    "(containers: --cap-add=SYS_PTRACE). Without ptrace: mldebug hang --signal, with "
    "mldebug.watchdog() or mldebug.install_dump_handler() in the ranks."
)


def ptrace_denied(pid: int | None = None) -> str:
    who = f"pid {pid}" if pid is not None else "the process"
    return f"py-spy could not attach to {who} (ptrace denied). {PTRACE_FIX}"


def py_spy_missing(where: str = "this machine") -> str:
    return (
        f"py-spy was not found on {where}. Install it next to the job's Python "
        "(pip install py-spy) or pass --py-spy PATH."
    )


def process_gone(pid: int) -> str:
    return f"process {pid} exited before it could be inspected; nothing to do unless it should still run."


def torch_missing(feature: str) -> str:
    return (
        f"{feature} needs PyTorch, which is not installed in this Python. "
        "Install it: pip install 'mldebug[torch]' (or the torch build your cluster uses)."
    )
