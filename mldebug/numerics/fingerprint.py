"""Observing a step's collectives: thin wrappers around ``torch.distributed``'s collective
functions that, while a sentinel step is open, fold each call's (op, reduce op, group, shape,
dtype) into the step's hash and keep the first entries.

Why wrappers: every collective a training step makes from Python goes through these module
functions - DDP's communication hook (``default_hooks`` calls ``dist.all_reduce``; the
sentinel always installs one), FSDP2 (``dist.all_gather_single`` and
``dist.reduce_scatter_single``), tensor parallelism, a user's metric all-reduce. A wrapper
costs one global read when no step is open and a few microseconds per collective when one
is; the flight recorder's dump (``_dump_*_trace``) pickles the whole ring buffer and exists
on NCCL only, and ``ProcessGroup`` hooks see completions, not the arguments. What is not
seen: collectives made in C++ without the Python API (DDP's builtin reducer without a hook,
its buffer broadcast), and point-to-point ops (send/recv differ per rank by design).

The wrappers are installed once per process (in ``torch.distributed`` and
``torch.distributed.distributed_c10d``, where each is the same function) and stay; a call
made by one wrapped function inside another (``all_gather_object`` -> ``all_gather``) is
counted once, as the outer call.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any

import torch

from mldebug.numerics.collectives import MASK, MAX_DIMS, MAX_ENTRIES, Entry, fold

# op -> the parameter that holds the data tensor (or list of tensors)
OPS: dict[str, str] = {
    "all_reduce": "tensor", "all_reduce_coalesced": "tensors", "reduce": "tensor",
    "broadcast": "tensor", "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor", "all_gather_coalesced": "input_tensor_list",
    "reduce_scatter": "output", "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "barrier": "", "gather": "tensor", "scatter": "tensor",
}
_SPLIT_OPS = ("all_to_all", "all_to_all_single")


class StepCollectives:
    """The current step's collectives on this rank: hash, count, the first entries."""

    __slots__ = ("hash", "count", "entries")

    def __init__(self) -> None:
        self.hash = 0
        self.count = 0
        self.entries: list[Entry] = []

    def reset(self) -> None:
        self.hash = 0
        self.count = 0
        self.entries = []

    def note(self, e: Entry) -> None:
        self.hash = fold(self.hash, e)
        self.count += 1
        if len(self.entries) < MAX_ENTRIES:
            self.entries.append(e)

    def value(self) -> int:
        """The hash with the count folded in (a step without collectives is 0... + count)."""
        return (self.hash ^ (self.count * 0x9E3779B97F4A7C15)) & MASK


_active: StepCollectives | None = None
_local = threading.local()
_installed = False
_lock = threading.Lock()


def activate(sc: StepCollectives | None) -> None:
    """Record into ``sc`` from now on (None: stop recording)."""
    global _active
    _active = sc


def active() -> StepCollectives | None:
    return _active


def _group_label(group: Any) -> str:
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return "world"
    try:
        return f"g{dist.get_world_size(group)}"
    except (RuntimeError, ValueError, TypeError):
        return "g?"


def _tensor_of(obj: Any) -> tuple[list[int], str]:
    t = obj
    n = None
    if isinstance(obj, (list, tuple)):
        n = len(obj)
        t = obj[0] if obj else None
    if isinstance(t, torch.Tensor):
        shape = list(t.shape)[:MAX_DIMS]
        if n is not None:
            shape = [n, *shape][:MAX_DIMS]
        return shape, str(t.dtype).removeprefix("torch.")
    return [], ""


def _entry(name: str, bound: inspect.Signature, pos: dict[str, int], args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> Entry:
    def arg(param: str) -> Any:
        i = pos.get(param)
        if param in kwargs:
            return kwargs[param]
        if i is not None and i < len(args):
            return args[i]
        p = bound.parameters.get(param)
        return None if p is None or p.default is inspect.Parameter.empty else p.default

    data = OPS[name]
    shape, dtype = _tensor_of(arg(data)) if data else ([], "")
    if name in _SPLIT_OPS:
        shape = shape[2:] if name == "all_to_all" else shape[1:]
    red = ""
    if "op" in pos:
        op = arg("op")
        red = str(getattr(op, "name", op))[:16] if op is not None else ""
    return [name, red, _group_label(arg("group")), shape, dtype]


def _wrap(name: str, fn: Any) -> Any:
    sig = inspect.signature(fn)
    pos = {p: i for i, p in enumerate(sig.parameters)}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sc = _active
        if sc is None or getattr(_local, "inside", False):
            return fn(*args, **kwargs)
        try:
            sc.note(_entry(name, sig, pos, args, kwargs))
        except Exception:  # never let the fingerprint break a collective
            sc.note([name, "?", "?", [], "?"])
        _local.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            _local.inside = False

    wrapper.__mldebug_fingerprint__ = fn  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    """Wrap the collective functions (once per process; idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name in OPS:
            fn = getattr(c10d, name, None)
            if fn is None or hasattr(fn, "__mldebug_fingerprint__"):
                continue
            w = _wrap(name, fn)
            setattr(c10d, name, w)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, w)
        _installed = True


def uninstall() -> None:
    """Put the original functions back (tests)."""
    global _installed
    with _lock:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name in OPS:
            for mod in (c10d, dist):
                w = getattr(mod, name, None)
                orig = getattr(w, "__mldebug_fingerprint__", None)
                if orig is not None:
                    setattr(mod, name, orig)
        _installed = False
