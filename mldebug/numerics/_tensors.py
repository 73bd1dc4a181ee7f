"""Tensor plumbing for the hooks: walk any pytree, reduce a tensor to (abs min, abs max) on its
device without a host sync, and handle the dtypes and tensor kinds that break naive code
(fp8 has no ``isinf``, empty shards raise on ``min``, meta/fake tensors hold no data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

FP8_DTYPES = frozenset(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                 "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, n)
)
_CHUNK = 1 << 22  # elements upcast at a time for dtypes without native abs/min/max kernels
MAX_DEPTH = 6


def is_fake(t: torch.Tensor) -> bool:
    """Meta tensors and FakeTensors (tracing) carry shapes but no values."""
    if t.is_meta:
        return True
    return type(t).__name__ in ("FakeTensor", "FunctionalTensor")


def iter_leaves(obj: Any, ctx: str, *, keep_scalars: bool = True,
                depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Yield ``(ctx, leaf)`` for every leaf of tuples, lists, dicts, dataclasses and
    ``ModelOutput``. Names follow the book: ``input[0]``, ``output[0][1]``, ``output.logits``.

    ``keep_scalars=False`` drops None and other non-tensor leaves (used for keyword
    arguments and nested containers, which are full of flags).
    """
    if isinstance(obj, torch.Tensor):
        yield ctx, obj
        return
    if depth >= MAX_DEPTH:
        return
    if isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            yield from iter_leaves(x, f"{ctx}[{i}]", keep_scalars=keep_scalars and depth == 0,
                                   depth=depth + 1)
        return
    if isinstance(obj, Mapping):
        # ModelOutput is an OrderedDict *and* a dataclass: name its fields like attributes
        dotted = dataclasses.is_dataclass(obj)
        for k, v in obj.items():
            name = f"{ctx}.{k}" if dotted else f"{ctx}[{k!r}]"
            yield from iter_leaves(v, name, keep_scalars=False, depth=depth + 1)
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_leaves(getattr(obj, f.name, None), f"{ctx}.{f.name}",
                                   keep_scalars=False, depth=depth + 1)
        return
    if keep_scalars:
        yield ctx, obj


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor-like subclass, the tensor itself otherwise."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def abs_min_max(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(abs min, abs max) as 0-d tensors on ``t``'s device; no host sync.

    A nan anywhere makes both nan, an inf makes the max inf, so the max alone tells whether
    the tensor is finite. fp8 is upcast a chunk at a time (no fp8 abs/min/max kernels).
    """
    t = local_tensor(t).detach()
    if t.dtype in FP8_DTYPES or t.dtype == torch.bool:
        flat = t.reshape(-1)
        mins, maxs = [], []
        for start in range(0, flat.numel(), _CHUNK):
            part = torch.aminmax(flat[start:start + _CHUNK].float().abs())
            mins.append(part.min)
            maxs.append(part.max)
        if len(mins) == 1:
            return mins[0], maxs[0]
        return torch.stack(mins).min(), torch.stack(maxs).max()
    a = t.abs()
    if a.is_complex():  # pragma: no cover - abs of complex is real already
        a = a.real
    r = torch.aminmax(a)
    return r.min, r.max


def classify(t: torch.Tensor) -> str:
    """'tensor' when it has values to reduce, else why not ('empty', 'meta')."""
    if is_fake(t):
        return "meta"
    if t.numel() == 0:
        return "empty"
    return "tensor"
