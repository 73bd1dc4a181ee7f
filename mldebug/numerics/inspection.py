"""Look at tensors while debugging: ``detect_overflow``, ``tensor_info``, a ``repr`` that shows
shapes, and a switch for lovely-tensors.

Statistics are reduced on the tensor's own device and brought back as one small tensor, so
inspecting a large GPU tensor copies a few numbers, not the tensor.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import IO, Any

import torch

from mldebug.numerics import _tensors

ATTRS = ("device", "dtype", "shape", "numel", "requires_grad", "grad", "stride",
         "is_contiguous", "data_ptr")


def detect_overflow(var: Any, ctx: str, *, file: IO[str] | None = None) -> bool:
    """Print ``"{ctx} has nans"`` / ``"{ctx} has infs"`` for a tensor or any pytree of them
    (tuples, lists, dicts, dataclasses, ModelOutput) and return True if any was found.

    Meant for intermediate values inside a ``forward`` that no module hook sees. One host
    sync per call.
    """
    leaves = [(c, t) for c, t in _tensors.iter_leaves(var, ctx, keep_scalars=False)
              if isinstance(t, torch.Tensor) and _tensors.classify(t) == "tensor"
              and (t.is_floating_point() or t.is_complex())]
    if not leaves:
        return False
    flags = []
    for _, t in leaves:
        t = _tensors.local_tensor(t).detach()
        if t.dtype in _tensors.FP8_DTYPES:
            t = t.float()  # fp8 has no isnan/isinf kernels
        flags.append(torch.stack([torch.isnan(t).any(), torch.isinf(t).any()]).cpu())
    host = torch.stack(flags).tolist()
    out = file if file is not None else sys.stdout
    detected = False
    for (name, _), (nan, inf) in zip(leaves, host, strict=True):
        if nan:
            print(f"{name} has nans", file=out)
        if inf:
            print(f"{name} has infs", file=out)
        detected = detected or bool(nan or inf)
    return detected


@dataclass
class TensorStats:
    """Values of a tensor, reduced on its device. min/max/mean/std are over the finite
    elements (nan and inf are counted instead); None where they do not apply."""

    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    abs_min: float | None = None
    abs_max: float | None = None
    nan: int = 0
    inf: int = 0


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """min/max/mean/std and abs min/max of the finite elements of ``t``, and its nan/inf
    counts, computed on ``t``'s device without a data-dependent shape (one small transfer)."""
    if _tensors.classify(t) != "tensor":
        return TensorStats()
    x = _tensors.local_tensor(t).detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype != torch.float64:
        x = x.double() if not x.is_floating_point() else x.float()
    finite = torch.isfinite(x)
    n = finite.sum()
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    xz = torch.where(finite, x, zero)
    mean = xz.sum() / n
    var = torch.where(finite, (x - mean) ** 2, zero).sum() / (n - 1).clamp(min=1)
    a = x.abs()
    vals = torch.stack([
        torch.where(finite, x, inf).min(), torch.where(finite, x, -inf).max(), mean,
        var.sqrt(), torch.where(finite, a, inf).min(), torch.where(finite, a, -inf).max(),
        torch.isnan(x).sum().to(x.dtype), torch.isinf(x).sum().to(x.dtype), n.to(x.dtype),
    ]).tolist()
    if vals[8] == 0:  # nothing finite: no values to describe
        return TensorStats(nan=int(vals[6]), inf=int(vals[7]))
    return TensorStats(vals[0], vals[1], vals[2], vals[3], vals[4], vals[5],
                       int(vals[6]), int(vals[7]))


def tensor_info(t: torch.Tensor, name: str | None = None, formatted: bool = False,
                stats: bool = True) -> str:
    """The book's ``get_tensor_metadata`` (device, dtype, shape, numel, requires_grad, grad,
    stride, is_contiguous, data_ptr) plus values: min/max/mean/std and nan/inf counts.

    ``formatted=True`` gives one attribute per line, else one comma-separated line.
    ``stats=False`` skips the values (no host sync at all).
    """
    def attr(a: str) -> Any:
        v = getattr(t, a)
        if callable(v):
            try:
                return v()
            except RuntimeError:  # data_ptr of meta/fake tensors
                return None
        return v

    txt = [f"{a}={attr(a)}" for a in ATTRS]
    if stats and _tensors.classify(t) == "tensor":
        s = tensor_stats(t)
        if s.min is not None:
            txt += [f"min={s.min:.4g}", f"max={s.max:.4g}", f"mean={s.mean:.4g}",
                    f"std={s.std:.4g}"]
        txt += [f"nan={s.nan}", f"inf={s.inf}"]
    if name is not None:
        txt.insert(0, f"{name}:")
    return "\n".join(txt) if formatted else ", ".join(txt)


def tensor_info_dict(t: torch.Tensor) -> dict[str, Any]:
    """``tensor_info`` as data (stats included), for tools and tests."""
    d: dict[str, Any] = {"device": str(t.device), "dtype": str(t.dtype),
                         "shape": list(t.shape), "numel": t.numel(),
                         "requires_grad": t.requires_grad, "stride": list(t.stride()),
                         "is_contiguous": t.is_contiguous()}
    d.update(asdict(tensor_stats(t)))
    return d


_ORIG_REPR: Callable[[torch.Tensor], str] | None = None


def _default_header(t: torch.Tensor) -> str:
    return f"tensor{list(t.shape)} {str(t.dtype).removeprefix('torch.')} {t.device}"


@contextlib.contextmanager
def _restoring() -> Iterator[None]:
    try:
        yield
    finally:
        unpatch_tensor_repr()


def patch_tensor_repr(values: bool = True,
                      header: Callable[[torch.Tensor], str] | None = None) -> contextlib.AbstractContextManager[None]:
    """Make ``repr(tensor)`` start with its shape, dtype and device (the book's ``__repr__``
    patch). ``values=False`` prints the header only. Calling it again replaces the patch.

    Returns a context manager: ``with patch_tensor_repr(): ...`` restores the original repr on
    exit; used as a plain call, the patch stays until ``unpatch_tensor_repr()``.
    """
    global _ORIG_REPR
    if _ORIG_REPR is None:
        _ORIG_REPR = torch.Tensor.__repr__
    orig = _ORIG_REPR
    head = header or _default_header

    def __repr__(t: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if not values:
            return head(t)
        return f"{head(t)} {orig(t, *args, **kwargs)}"

    torch.Tensor.__repr__ = __repr__  # type: ignore[method-assign,assignment]
    return _restoring()


def unpatch_tensor_repr() -> None:
    """Undo ``patch_tensor_repr``."""
    global _ORIG_REPR
    if _ORIG_REPR is not None:
        torch.Tensor.__repr__ = _ORIG_REPR  # type: ignore[method-assign,assignment]
        _ORIG_REPR = None


LOVELY_FIX = "Install it with: pip install lovely-tensors"


def lovely(enable: bool = True) -> Any:
    """Turn on lovely-tensors' one-line summaries (shape, stats, +Inf!/NaN! flags) for every
    tensor repr, or off with ``enable=False``. Returns the ``lovely_tensors`` module.

    Raises ImportError saying how to install it when it is missing.
    """
    try:
        lt = importlib.import_module("lovely_tensors")
    except ImportError as e:
        raise ImportError(
            f"lovely() needs the lovely-tensors package, which is not installed. {LOVELY_FIX} "
            "(or use mldebug.tensor_info / mldebug.patch_tensor_repr, which need nothing extra)."
        ) from e
    import torch

    if enable:
        # keep the originals: some lovely-tensors releases have no monkey_unpatch
        _LOVELY_SAVED.setdefault("repr", torch.Tensor.__repr__)
        _LOVELY_SAVED.setdefault("str", torch.Tensor.__str__)
        lt.monkey_patch()
    else:
        undo = getattr(lt, "monkey_unpatch", None)
        if callable(undo):
            undo()
        if "repr" in _LOVELY_SAVED:
            torch.Tensor.__repr__ = _LOVELY_SAVED.pop("repr")  # type: ignore[method-assign]
            torch.Tensor.__str__ = _LOVELY_SAVED.pop("str")  # type: ignore[method-assign]
    return lt


_LOVELY_SAVED: dict[str, Any] = {}
