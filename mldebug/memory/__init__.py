"""mldebug.memory: memory reports, PyTorch snapshots analysed offline, per-rank usage across
nodes, the peak of a whole process tree, and how much can really be allocated.

Imports nothing heavy: torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "see_memory_usage": "mldebug.memory.usage",
    "MemoryUsage": "mldebug.memory.usage",
    "record": "mldebug.memory.recorder",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mldebug.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
