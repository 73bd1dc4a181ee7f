"""Ready-made debugging environments, printed as shell ``export`` lines with the reason.

``mldebug env --preset hang`` prints lines to paste (or ``eval``) before relaunching a job;
``--preset off`` prints the ``unset`` lines for everything any preset sets, so the debug
settings do not leak into production runs. Names follow torch >= 2.9 (TORCH_FR_*); the
older names are given in the comments.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

from mldebug.errors import UsageError


class Setting(NamedTuple):  # not a dataclass: `mldebug --help` lists the names from here
    name: str
    value: str
    why: str


PRESETS: dict[str, tuple[str, list[Setting]]] = {
    "hang": ("find which collective and rank a hang is stuck on", [
        Setting("TORCH_NCCL_DESYNC_DEBUG", "1",
                "at watchdog timeout, name the rank/collective that fell out of step"),
        Setting("TORCH_FR_BUFFER_SIZE", "2000",
                "flight recorder on: last 2000 collectives per rank with stacks "
                "(torch<2.9: TORCH_NCCL_TRACE_BUFFER_SIZE)"),
        Setting("TORCH_NCCL_DUMP_ON_TIMEOUT", "1",
                "write the flight-recorder buffer to disk when the watchdog fires"),
        Setting("TORCH_FR_DUMP_TEMP_FILE", "/tmp/nccl_trace_rank_",
                "dump path prefix; each rank appends its rank number "
                "(torch<2.9: TORCH_NCCL_DEBUG_INFO_TEMP_FILE); read with 'mldebug fr analyze'"),
    ]),
    "nccl": ("see what NCCL chose: versions, transports, interfaces, errors", [
        Setting("NCCL_DEBUG", "INFO", "print NCCL's setup and every warning"),
        Setting("NCCL_DEBUG_SUBSYS", "INIT,NET,ENV,GRAPH",
                "init, network/transport choice, env settings and topology"),
        Setting("NCCL_DEBUG_FILE", "/tmp/nccl-log.%h.%p.txt",
                "one file per process (%h host, %p pid); analyse with 'mldebug nccl-log'"),
    ]),
    "cuda-sync": ("get the Python line of an asynchronous CUDA error", [
        Setting("CUDA_LAUNCH_BLOCKING", "1",
                "each kernel launch waits, so the traceback points at the failing op"),
    ]),
    "oom": ("reduce CUDA OOM from fragmentation", [
        Setting("PYTORCH_ALLOC_CONF", "expandable_segments:True",
                "segments grow instead of fragmenting (torch<2.9: PYTORCH_CUDA_ALLOC_CONF)"),
    ]),
}

# Also unset by "off": the older names of what the presets set.
OLD_NAMES = ["TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
             "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DESYNC_DEBUG"]


def names() -> list[str]:
    return [*PRESETS, "off"]


def render(name: str) -> str:
    """The shell text for a preset (or ``off``)."""
    if name == "off":
        seen: list[str] = []
        for _, settings in PRESETS.values():
            seen += [s.name for s in settings if s.name not in seen]
        seen += [n for n in OLD_NAMES if n not in seen]
        lines = ["# mldebug env --preset off: remove every debugging setting the presets add"]
        lines += [f"unset {n}" for n in seen]
        return "\n".join(lines) + "\n"
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}.",
                         "Choose one of: " + ", ".join(names()) + ".")
    purpose, settings = PRESETS[name]
    width = max(len(f"export {s.name}={shlex.quote(s.value)}") for s in settings)
    lines = [f"# mldebug env --preset {name}: {purpose}",
             "# undo with: eval \"$(mldebug env --preset off)\""]
    for s in settings:
        line = f"export {s.name}={shlex.quote(s.value)}"
        lines.append(f"{line:<{width}}  # {s.why}")
    return "\n".join(lines) + "\n"
