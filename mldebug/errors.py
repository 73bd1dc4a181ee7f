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


# the import name of each optional dependency -> the extra of pyproject.toml that installs it
# (tests/test_cli_typos.py checks this table against pyproject's extras)
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "transformers": ("transformers", "tiny"),
    "tokenizers": ("tokenizers", "tiny"),
    "datasets": ("datasets", "tiny"),
    "safetensors": ("safetensors", "tiny"),
    "sentencepiece": ("sentencepiece", "tiny"),
    "pyarrow": ("pyarrow", "tiny"),
    "PIL": ("pillow", "tiny"),
    "matplotlib": ("matplotlib", "plot"),
    "pynvml": ("nvidia-ml-py", "gpu"),
    "debugpy": ("debugpy", "ide"),
    "lovely_tensors": ("lovely-tensors", "lovely"),
    "viztracer": ("viztracer", "bench"),
}


def missing_dependency(e: ModuleNotFoundError, command: str | None) -> MldebugError | None:
    """The error for an optional dependency that is not installed (None for any other
    missing module: that one is a bug): what needs it, and the pip line of its extra."""
    top = (e.name or "").split(".", 1)[0]
    if top not in OPTIONAL_MODULES:
        return None
    dist, extra = OPTIONAL_MODULES[top]
    who = f"mldebug {command}" if command else "this command"
    also = " (or the torch build your cluster uses)" if extra == "torch" else ""
    return MldebugError(f"{who} needs {dist}, which is not installed in this Python.",
                        f"Install it: pip install 'mldebug[{extra}]'{also}.")
