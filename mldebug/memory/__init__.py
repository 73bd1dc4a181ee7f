"""mldebug.memory: memory reports, PyTorch snapshots analysed offline, per-rank usage across
nodes, the peak of a whole process tree, and how much can really be allocated.

Imports nothing heavy: torch and psutil are imported only inside the functions that need them.
"""

from __future__ import annotations

from mldebug.memory.recorder import record
from mldebug.memory.usage import MemoryUsage, see_memory_usage

__all__ = ["MemoryUsage", "record", "see_memory_usage"]
