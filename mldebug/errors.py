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


NO_PTRACE_ROUTE = ("Without ptrace: torch.distributed.debug.start_debug_server() in the ranks "
                   "(PyTorch 2.13+; mldebug hang then asks it), or mldebug hang --signal, with "
                   "mldebug.watchdog() or mldebug.install_dump_handler() in the ranks.")
PTRACE_FIX = (
    "Run as root, or allow ptrace: sudo sysctl -w kernel.yama.ptrace_scope=0 "
    "(containers: --cap-add=SYS_PTRACE). " + NO_PTRACE_ROUTE
)


def torch_missing(feature: str) -> str:
    return (
        f"{feature} needs PyTorch, which is not installed in this Python. "
        "Install it: pip install 'mldebug[torch]' (or the torch build your cluster uses)."
    )
