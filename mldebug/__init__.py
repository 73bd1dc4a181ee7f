"""mldebug: debugging toolkit for distributed PyTorch jobs.

Everything heavy (torch, transformers) is imported lazily: ``import mldebug`` and the
``mldebug`` CLI start without torch.
"""

from __future__ import annotations

from mldebug._version import __version__
from mldebug.lazy import exports

# public name -> module that defines it; resolved on first attribute access
_LAZY: dict[str, str] = {
    "printflock": "mldebug.printing",
    "rank_print": "mldebug.printing",
    "install_excepthook": "mldebug.debugger.excepthook",
    "ForkedPdb": "mldebug.debugger.forked",
    "breakpoint": "mldebug.debugger.hooks",
    "post_mortem": "mldebug.debugger.hooks",
    "Finding": "mldebug.findings",
    "Severity": "mldebug.findings",
    "identity": "mldebug.dist",
    "DebugUnderflowOverflow": "mldebug.numerics",
    "detect_overflow": "mldebug.numerics",
    "tensor_info": "mldebug.numerics",
    "patch_tensor_repr": "mldebug.numerics",
    "lovely": "mldebug.numerics",
    "OverflowDetected": "mldebug.numerics",
    "NanSentinel": "mldebug.numerics",
    "NonFiniteDetected": "mldebug.numerics",
    "ReplicasDiverged": "mldebug.numerics",
    "watchdog": "mldebug.capture",
    "beat": "mldebug.capture",
    "install_dump_handler": "mldebug.capture",
    "see_memory_usage": "mldebug.memory.usage",
    "step": "mldebug.stepclock",
}

__all__ = ["__version__", *_LAZY]


__getattr__, __dir__ = exports('mldebug', _LAZY, globals())
