"""Replay one training step on the rank where a non-finite value was born, under
``DebugUnderflowOverflow``, to name the first module, the phase and the tensor.

The replay runs rank-local: on the inner module of a DDP wrapper (under ``no_sync``), so no
collective runs on this rank alone. The caller hands over the batch and the RNG state saved at
the start of the step; the parameters are the ones of the step because the optimizer has not
stepped yet. The gradients of the step are moved aside (references, no copy) and put back, and
the RNG state is restored afterwards, so training continues as if the replay never ran.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from mldebug.numerics.detector import DebugUnderflowOverflow, OverflowDetected
from mldebug.numerics.report import OverflowReport

LossFn = Callable[[nn.Module, Any], Any]
NOT_REPRODUCIBLE = ("not reproducible on replay: suspect non-determinism or hardware "
                    "(silent data corruption)")


def rng_state() -> dict[str, Any]:
    """The RNG state a step starts from: CPU, and the current CUDA device's when CUDA is in
    use (the CUDA generator keeps seed and offset on the host: reading it does not sync)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = (torch.cuda.current_device(), torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        device, s = state["cuda"]
        torch.cuda.set_rng_state(s, device)


def call_model(model: nn.Module, batch: Any) -> Any:
    """The default forward: ``model(**batch)`` for a mapping, ``model(*batch)`` for a tuple or
    list, ``model(batch)`` otherwise."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in a model's output: a 0-d tensor, ``.loss``/``["loss"]``, else None."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    return None


def default_loss(model: nn.Module, batch: Any,
                 call: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> torch.Tensor:
    """The loss to replay: the model's own (a 0-d output or ``.loss``), else the sum of its
    first tensor output (enough to send gradients through every module). ``call``: the
    model's call as the step made it (args, kwargs), used instead of guessing from the batch."""
    out = model(*call[0], **call[1]) if call is not None else call_model(model, batch)
    loss = loss_of(out)
    if loss is not None:
        return loss
    if isinstance(out, torch.Tensor):
        return out.float().sum()
    from mldebug.numerics._tensors import iter_leaves

    for _, leaf in iter_leaves(out, "output"):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            return leaf.float().sum()
    raise ValueError("the model's output has no tensor to backward from; pass loss_fn=")


def summary(t: Any) -> str:
    """A one-line summary of a tensor by lovely-tensors (shape, stats, NaN!/+Inf! flags), or a
    plain one when lovely-tensors is not installed."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    try:
        import lovely_tensors

        return str(lovely_tensors.lovely(t.detach(), color=False))[:300]
    except Exception:  # not installed, or a tensor kind it cannot show
        t = t.detach()
        return f"tensor{list(t.shape)} {t.dtype} nan={int(t.isnan().sum())} inf={int(t.isinf().sum())}"


def _compiled_orig(m: nn.Module) -> nn.Module | None:
    """The original module of a ``torch.compile(m)`` wrapper (an ``OptimizedModule``), else
    None (told by duck typing: no import of torch._dynamo)."""
    orig = m.__dict__.get("_modules", {}).get("_orig_mod")
    if type(m).__name__ == "OptimizedModule" and isinstance(orig, nn.Module):
        return orig
    return None


def strip_compiled(name: str) -> str:
    """A parameter or module name without the ``_orig_mod`` segments ``torch.compile``
    wrappers add (``_orig_mod.layers.0.fc.weight`` -> ``layers.0.fc.weight``)."""
    if "_orig_mod" not in name:
        return name
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def call_target(model: nn.Module) -> nn.Module:
    """The module whose forward pre-hook sees the user's args eagerly: DDP's ``.module``
    (as the replay calls it), or a ``torch.compile`` wrapper itself (its hooks run before
    the compiled code; those of its ``_orig_mod`` would run inside the compiled graph, or
    not at all once it is compiled)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = model
    while isinstance(m, DDP):
        m = m.module
    return m


def find_ddp(model: nn.Module) -> nn.Module | None:
    """The ``DistributedDataParallel`` in ``DDP(m)``, ``DDP(torch.compile(m))`` or
    ``torch.compile(DDP(m))``, else None."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    m: nn.Module | None = model
    while m is not None:
        if isinstance(m, DDP):
            return m
        m = _compiled_orig(m)
    return None


def _inner(model: nn.Module) -> tuple[nn.Module, Any]:
    """The module to replay and a context that keeps DDP's reducer out of it: the original
    eager module, unwrapped through DDP's ``.module`` and ``torch.compile``'s ``_orig_mod``
    (so the detector's hooks run on every submodule, outside any compiled graph)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    quiet: Any = contextlib.nullcontext()
    m = model
    while True:
        if isinstance(m, DDP):
            quiet = m.no_sync()
            m = m.module
            continue
        orig = _compiled_orig(m)
        if orig is None:
            return m, quiet
        m = orig


def replay(model: nn.Module, batch: Any, rng: dict[str, Any],
           loss_fn: LossFn | None = None,
           call: tuple[tuple[Any, ...], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Re-run forward and backward of ``batch`` from ``rng`` under DebugUnderflowOverflow.

    Without ``loss_fn`` the model is called as the step called it (``call``: the args and
    kwargs its first call in the block had), else as ``call_model`` guesses from the batch.

    Returns a JSON-ready dict: ``status`` ("reproduced", "not reproduced", "error"),
    ``reproducible`` (bool, None on error), and when reproduced ``phase``, ``module``, ``cls``,
    ``tensor`` (the entry, e.g. ``grad_input[0]``), ``culprit`` (the detector's sentence),
    ``inputs_finite`` (the module's inputs, or the gradients arriving at it, were finite) and
    ``summary`` (lovely-tensors line of the inputs of that module when it can be had).
    """
    inner, quiet = _inner(model)
    params = [p for p in inner.parameters() if p.requires_grad]
    saved_grads = [p.grad for p in params]
    saved_rng = rng_state()
    report: OverflowReport | None = None
    error = ""
    captured: dict[str, Any] = {}
    det = None
    try:
        for p in params:
            p.grad = None
        set_rng_state(rng)
        det = DebugUnderflowOverflow(inner, print_report=False, headroom=0,
                                     file=io.StringIO())
        _capture_inputs(inner, captured)
        try:
            with quiet, torch.enable_grad():
                loss = loss_fn(inner, batch) if loss_fn is not None else \
                    default_loss(inner, batch, call)
                if isinstance(loss, torch.Tensor) and loss.requires_grad:
                    loss.backward()
                if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
                    error = "the replayed loss is not finite but no module output was"
        except OverflowDetected as e:
            report = e.report
    except Exception as e:  # the user's model failed on replay: say so, never hang the others
        error = f"replay failed: {type(e).__name__}: {str(e)[:200]}"
        return {"status": "error", "reproducible": None, "error": error}
    finally:
        if det is not None:
            det.detach()
        for h in captured.pop("_handles", []):
            h.remove()
        for p, g in zip(params, saved_grads, strict=True):
            p.grad = g
        set_rng_state(saved_rng)
    if report is None:
        if error:
            return {"status": "reproduced", "reproducible": True, "phase": "forward",
                    "module": "", "cls": type(inner).__name__, "tensor": "loss",
                    "culprit": error, "inputs_finite": True, "summary": ""}
        return {"status": "not reproduced", "reproducible": False, "culprit": NOT_REPRODUCIBLE}
    first = report.first
    bad = [e for e in first.entries if e.nonfinite]
    if first.phase == "forward":
        inputs = [e for e in first.entries if e.ctx.startswith("input")]
    else:
        inputs = [e for e in first.entries if e.is_gradient_in]
    inputs_finite = all(e.abs_max is not None and math.isfinite(e.abs_max) for e in inputs
                        if e.kind == "tensor")
    return {
        "status": "reproduced", "reproducible": True, "phase": first.phase,
        "module": first.module, "cls": first.cls,
        "tensor": bad[0].ctx if bad else "",
        "culprit": report.culprit, "inputs_finite": inputs_finite,
        "summary": captured.get(first.module, ""),
    }


def _capture_inputs(inner: nn.Module, captured: dict[str, Any]) -> None:
    """Keep a lovely-tensors line of each module's first input and output during the replay
    (only non-finite outputs, and their inputs, are summarised: the replay is the rare path)."""
    handles = []
    for name, m in inner.named_modules():
        def hook(mod: nn.Module, args: Any, out: Any, name: str = name) -> None:
            if name in captured or not isinstance(out, torch.Tensor):
                return
            if out.is_floating_point() and not bool(torch.isfinite(out.detach()).all()):
                x = args[0] if args and isinstance(args[0], torch.Tensor) else None
                captured[name] = (f"input {summary(x)}; " if x is not None else "") + \
                    f"output {summary(out)}"
        handles.append(m.register_forward_hook(hook))
    captured["_handles"] = handles
