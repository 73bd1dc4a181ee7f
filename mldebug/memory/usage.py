"""``see_memory_usage``: one line of GPU and CPU memory numbers per call, on any rank.

After the DeepSpeed utility the book uses: gc before sampling, the CUDA allocator's counters
(MA, Max_MA, CA, Max_CA), what the device really uses (NV, from NVML, for the right device
whatever the form of CUDA_VISIBLE_DEVICES), this process's RSS and the node's used memory,
with deltas since the previous call and the peaks reset after. torch is never imported here:
the CUDA columns appear when the program has imported torch and CUDA is available.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mldebug.dist import identity

GiB = 1024.0**3


@dataclass
class MemoryUsage:
    """The numbers behind one see_memory_usage line (bytes; None where not measurable)."""

    message: str
    host: str
    rank: int | None
    ma: int | None = None
    max_ma: int | None = None
    ca: int | None = None
    max_ca: int | None = None
    nv: int | None = None
    proc_rss: int = 0
    node_used: int = 0
    node_total: int = 0

    @property
    def node_percent(self) -> float:
        return 100.0 * self.node_used / self.node_total if self.node_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, previous: MemoryUsage | None = None) -> str:
        """'MA 3.73 GiB (+3.73) | ... | CPU proc 0.70 GiB (+0.19) / node 84.26 GiB (4.2%)'."""
        def col(name: str, attr: str) -> str | None:
            v = getattr(self, attr)
            if v is None:
                return None
            text = f"{name} {v / GiB:.2f} GiB"
            if previous is not None and getattr(previous, attr) is not None:
                d = (v - getattr(previous, attr)) / GiB
                if abs(d) >= 0.005:
                    text += f" ({d:+.2f})"
            return text

        cols = [col("MA", "ma"), col("Max_MA", "max_ma"), col("CA", "ca"),
                col("Max_CA", "max_ca"), col("NV", "nv"), col("CPU proc", "proc_rss")]
        node = f"node {self.node_used / GiB:.2f} GiB ({self.node_percent:.1f}%)"
        body = " | ".join(c for c in cols if c)
        return f"{self.message}: {body} / {node}"


_previous: dict[int, MemoryUsage] = {}


def _cuda_numbers(torch: Any, empty_cache: bool) -> tuple[dict[str, int], int | None, str | None]:
    if empty_cache:
        torch.cuda.empty_cache()
    dev = torch.cuda.current_device()
    nums = {"ma": torch.cuda.memory_allocated(dev), "max_ma": torch.cuda.max_memory_allocated(dev),
            "ca": torch.cuda.memory_reserved(dev), "max_ca": torch.cuda.max_memory_reserved(dev)}
    uuid = getattr(torch.cuda.get_device_properties(dev), "uuid", None)
    return nums, dev, str(uuid) if uuid is not None else None


def sample(message: str = "", empty_cache: bool = False) -> MemoryUsage:
    """Collect the numbers now (gc first); does not print and does not reset peaks."""
    import psutil

    gc.collect()
    ident = identity()
    u = MemoryUsage(message, ident.host, ident.rank)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        from mldebug.memory.nvml import used_bytes

        nums, dev, uuid = _cuda_numbers(torch, empty_cache)
        for k, v in nums.items():
            setattr(u, k, v)
        u.nv = used_bytes(dev or 0, os.environ, uuid=uuid)
    u.proc_rss = psutil.Process().memory_info().rss
    vm = psutil.virtual_memory()
    u.node_used, u.node_total = vm.total - vm.available, vm.total
    return u


def see_memory_usage(message: str, force: bool = True, ranks: Sequence[int] | str = (0,),
                     empty_cache: bool = False) -> MemoryUsage | None:
    """Print one ``[host:rank]``-prefixed line of memory numbers and return them.

    ``force=False`` makes the call free (leave it in production code); ``ranks`` says who
    prints (``"all"``: every rank, lines never interleaved); every rank samples and resets its
    peaks either way, so the numbers stay per-interval on all ranks.
    """
    if not force:
        return None
    u = sample(message, empty_cache)
    prev = _previous.get(os.getpid())
    _previous[os.getpid()] = u
    rank = u.rank if u.rank is not None else 0
    if ranks == "all" or (not isinstance(ranks, str) and rank in set(ranks)):
        from mldebug.printing import rank_print

        rank_print(u.line(prev))
    torch = sys.modules.get("torch")
    if torch is not None and u.ma is not None:
        torch.cuda.reset_peak_memory_stats()
    return u
