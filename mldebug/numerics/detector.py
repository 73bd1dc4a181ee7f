"""``DebugUnderflowOverflow``: name the first module whose forward or backward made an inf/nan.

Compatible with the book's / transformers' class (same arguments, same report), plus:
backward checks, keyword and ``ModelOutput`` traversal, a default mode with no host sync per
module, headroom warnings, ``[host:rank]`` prefixes, ``all_ranks_stop``, ``detach()`` and
``with`` use, and hooks that stay out of ``torch.compile`` graphs.

How the default mode stays cheap: each hook only launches ``abs`` + ``aminmax`` per tensor
and keeps the two 0-d results on the device. At the end of the root module's forward, and at
the end of each backward pass, all results are stacked and checked with one host sync. Only
when something is not finite are the numbers brought to the host and turned into frames;
the pure analysis in :mod:`mldebug.numerics.report` then names the first bad module.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import sys
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import IO, Any

import torch
from torch import nn

from mldebug.errors import MldebugError
from mldebug.numerics import _tensors
from mldebug.numerics.report import (
    DTYPE_MAX,
    Entry,
    HeadroomWarning,
    ModuleCall,
    OverflowReport,
    Phase,
    build_report,
    headroom_warnings,
    render_headroom,
    render_report,
    render_trace,
)

logger = logging.getLogger("mldebug.numerics")
logger.addHandler(logging.NullHandler())


class OverflowDetected(ValueError):
    """Raised when inf/nan was found; ``.report`` holds the frames (None on a rank that
    stopped because another rank found it)."""

    def __init__(self, message: str, report: OverflowReport | None = None) -> None:
        super().__init__(message)
        self.report = report


_compiling = torch.compiler.is_compiling


_PLAIN = (torch.Tensor, nn.Parameter)
_INPUT_NAMES = tuple(f"input[{i}]" for i in range(16))
_SCALARS = (bool, int, float, str)
_KWARG_NAMES: dict[str, str] = {}


def _cached_name(cache: dict[str, str], key: str, fmt: str) -> str:
    """``fmt.format(key)``, kept: hooks ask for the same few names on every call."""
    name = cache.get(key)
    if name is None:
        if len(cache) > 4096:
            cache.clear()
        name = cache[key] = fmt.format(key)
    return name


def _kwarg_name(key: str) -> str:
    """``input['x']`` for keyword argument ``x`` (as iter_leaves names it)."""
    return _cached_name(_KWARG_NAMES, key, "input[{!r}]")


_DTYPES: dict[torch.dtype, tuple[str, float]] = {}


def _dtype_info(dtype: torch.dtype) -> tuple[str, float]:
    """(name, largest finite value worth a headroom warning or inf), cached per dtype."""
    info = _DTYPES.get(dtype)
    if info is None:
        name = str(dtype)
        info = _DTYPES[dtype] = (name, DTYPE_MAX.get(name, math.inf))
    return info


_LIMITS_CACHE: dict[tuple[tuple[float, ...], float, torch.device], torch.Tensor] = {}


def _limits_tensor(limits: tuple[float, ...], fraction: float,
                   device: torch.device) -> torch.Tensor:
    """Headroom thresholds on the device. Copying a list to a GPU synchronises, so the tensor
    is cached: every step of a training loop records the same dtypes in the same order."""
    key = (limits, fraction, device)
    t = _LIMITS_CACHE.get(key)
    if t is None:
        if len(_LIMITS_CACHE) > 8:
            _LIMITS_CACHE.clear()
        t = _LIMITS_CACHE[key] = torch.tensor([v * fraction for v in limits], device=device)
    return t


# One recorded value: (ctx, slot or kind). An int indexes the pass's device results; a str
# says why there is no number ("none", "not a tensor", "empty", "meta"). Plain tuples: a hook
# records a few per module call, and building an object each time was a measurable cost.
_RawEntry = tuple[str, "int | str"]
# Who a gradient belongs to: (frame key, module, ctx such as "grad_output").
_Serve = tuple[Any, nn.Module, str]

_FAST = frozenset([torch.float32, torch.float16, torch.bfloat16, torch.float64])
_LIMITED = frozenset(d for d in (getattr(torch, n.removeprefix("torch."), None) for n in DTYPE_MAX)
                     if d is not None)
_GRAD_CTX: dict[str, str] = {}


def _grad_ctx(ctx: str) -> str:
    """``grad_output`` for ``output``."""
    return _cached_name(_GRAD_CTX, ctx, "grad_{}")


_FALSE: dict[torch.device, torch.Tensor] = {}


def _false(device: torch.device) -> torch.Tensor:
    """A 0-d False on ``device``, made once (only ever read, never written)."""
    t = _FALSE.get(device)
    if t is None:
        t = _FALSE[device] = torch.zeros((), dtype=torch.bool, device=device)
    return t


class _Pass:
    """Everything recorded during one forward or one backward pass, still on the device.

    The hooks do the least they can: reduce each new tensor once (two 0-d results on its
    device) and append one record. Frames, names, weights and the fan-out of a gradient to
    every frame it belongs to are only built by :meth:`to_frames`, i.e. when a report needs
    them."""

    def __init__(self, phase: Phase, batch_number: int,
                 info: dict[nn.Module, tuple[str, str]], eager_params: bool = False) -> None:
        self.phase: Phase = phase
        self.batch_number = batch_number
        self.info = info
        # forward: the weights were reduced by the hook (sync_every_module) rather than
        # when a report needs them
        self.eager_params = eager_params
        self.mins: list[torch.Tensor] = []
        self.maxs: list[torch.Tensor] = []
        self.dtypes: list[torch.dtype] = []
        self.floating: list[int] = []  # slots of floating results: the ones flags() checks
        self.limited = False  # a dtype with a headroom limit (fp16, bf16, fp8) was seen
        # forward: one (module, entries) per module call, in execution order
        self.calls: list[tuple[nn.Module, list[_RawEntry]]] = []
        # backward: one (serves, slot) per gradient, in the order they arrived
        self.grads: list[tuple[list[_Serve], int | str]] = []
        # id -> (weakref, version, slot): a tensor seen twice in a pass (one module's output
        # is the next one's input) is reduced once, unless it was changed in place
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}

    def reduce(self, value: Any) -> int | str:
        """The slot of ``value``'s (abs min, abs max), reduced now on its device, or why a
        value has no numbers. Hot path: every hook calls this for every value, so the
        common case (a plain tensor of a float dtype) takes the fewest Python steps."""
        tv = type(value)
        plain = tv is torch.Tensor or tv is nn.Parameter
        if plain:
            if value.is_meta or not value.numel():
                return _tensors.classify(value)
        elif value is None:
            return "none"
        elif not isinstance(value, torch.Tensor):
            return "not a tensor"
        else:
            kind = _tensors.classify(value)
            if kind != "tensor":
                return kind
        # inference tensors keep no version counter: never reuse their results
        version = -1 if value.is_inference() else value._version
        seen = self._seen.get(id(value))
        if seen is not None and seen[1] == version >= 0 and seen[0]() is value:
            return seen[2]
        slot = len(self.maxs)
        dtype = value.dtype
        if plain and dtype in _FAST:
            # gradients and no-grad activations need no detach (a view, ~0.5 us)
            lo, hi = torch.aminmax((value.detach() if value.requires_grad else value).abs())
        else:
            lo, hi = _tensors.abs_min_max(value)
        self.mins.append(lo)
        self.maxs.append(hi)
        self.dtypes.append(dtype)
        if dtype.is_floating_point:
            self.floating.append(slot)
            if dtype in _LIMITED:
                self.limited = True
        if version >= 0:
            self._seen[id(value)] = (weakref.ref(value), version, slot)
        return slot

    def flags(self, fraction: float) -> torch.Tensor:
        """A 2-element tensor: (any inf/nan, any value above its headroom limit); on the
        device of the results when they all live on one (the common case), else on the CPU.

        Only floating results count: an integer tensor is always finite and has no headroom
        limit, and leaving it out keeps the stack free of int/float promotion (3x slower)."""
        idx = self.floating
        if not idx:
            return torch.zeros(2)
        maxs = self.maxs
        try:
            mx = torch.stack([maxs[i] for i in idx])
        except RuntimeError:  # results on several devices: one check per device
            groups: dict[torch.device, list[int]] = {}
            for i in idx:
                groups.setdefault(maxs[i].device, []).append(i)
            return torch.stack([self._flags(torch.stack([maxs[i] for i in g]), g, fraction)
                                .cpu() for g in groups.values()]).amax(0)
        return self._flags(mx, idx, fraction)

    def _flags(self, mx: torch.Tensor, idx: list[int], fraction: float) -> torch.Tensor:
        bad = (~torch.isfinite(mx)).any()
        if fraction > 0 and self.limited:
            limits = tuple(_dtype_info(self.dtypes[i])[1] for i in idx)
            warn = (mx > _limits_tensor(limits, fraction, mx.device)).any()
        else:
            warn = _false(mx.device)
        return torch.stack([bad, warn]).float()

    def _raw_frames(self) -> list[tuple[nn.Module, list[_RawEntry]]]:
        """(module, entries) per frame in execution order; reduces the weights if needed."""
        if self.phase == "forward":
            if self.eager_params:
                return self.calls
            reduce = self.reduce
            return [(module, [(pname, reduce(p)) for pname, p in module._parameters.items()
                              if p is not None] + entries)
                    for module, entries in self.calls]
        # backward: a gradient goes to every frame it serves (grad_output of the module that
        # made the tensor, grad_input of each consumer); a frame's place is its last arrival
        by_key: dict[Any, list[Any]] = {}
        n = 0
        for serves, slot in self.grads:
            for key, module, ctx in serves:
                frame = by_key.get(key)
                if frame is None:
                    frame = by_key[key] = [module, [], 0]
                frame[1].append((ctx, slot))
                frame[2] = n
                n += 1
        return [(f[0], f[1]) for f in sorted(by_key.values(), key=lambda f: f[2])]

    def to_frames(self) -> list[ModuleCall]:
        """Bring every recorded number to the host (one transfer per device) as Frames."""
        raw = self._raw_frames()
        mins: list[float] = [0.0] * len(self.mins)
        maxs: list[float] = [0.0] * len(self.maxs)
        groups: dict[torch.device, list[int]] = {}
        for i, t in enumerate(self.maxs):
            groups.setdefault(t.device, []).append(i)
        for idx in groups.values():
            lows = torch.stack([self.mins[i] for i in idx]).double()
            highs = torch.stack([self.maxs[i] for i in idx]).double()
            both = torch.stack([lows, highs], dim=1).tolist()
            for i, (lo, hi) in zip(idx, both, strict=True):
                mins[i], maxs[i] = lo, hi
        out = []
        for n, (module, raw_entries) in enumerate(raw):
            name, cls = self.info.get(module) or ("?", type(module).__name__)
            entries = []
            for ctx, slot in raw_entries:
                if isinstance(slot, int):
                    entries.append(Entry(ctx, "tensor", mins[slot], maxs[slot],
                                         _dtype_info(self.dtypes[slot])[0], slot))
                else:
                    entries.append(Entry(ctx, slot))  # type: ignore[arg-type]
            out.append(ModuleCall(name, cls, self.phase, self.batch_number, n, entries))
        return out


# The model attribute naming the detector attached to it (a weak reference).
_ATTACHED = "_mldebug_overflow_detector"


class DebugUnderflowOverflow:
    """Detect inf/nan in weights, activations and gradients and report the first module.

    Book-compatible arguments: ``max_frames_to_save`` (frames shown before the bad one),
    ``trace_batch_nums`` (print every frame of these batches, detection off for them),
    ``abort_after_batch_num`` (raise after that batch's forward). Extras:

    - ``check_backward``: also check gradients, each attributed to the module whose backward
      produced it (tensor hooks on module inputs/outputs and parameters; no
      ``register_full_backward_hook``, so in-place ops keep working).
    - ``sync_every_module``: check after every module (one host sync each) and stop at the
      exact module, like the book's version. Default False: check once per pass.
    - ``headroom``: warn once per tensor when a finite abs max exceeds this fraction of its
      dtype's largest value (fp16, bf16, fp8); 0 disables.
    - ``all_ranks_stop``: all-reduce the flag so every rank stops together (needs an
      initialised ``torch.distributed`` process group; one collective per check).
    - ``print_report`` / ``file``: print the report (prefixed ``[host:rank]`` in a distributed
      job) besides logging it to the ``mldebug.numerics`` logger; ``detector.report`` keeps it.
    """

    def __init__(self, model: nn.Module, max_frames_to_save: int = 21,
                 trace_batch_nums: Iterable[int] | None = (),
                 abort_after_batch_num: int | None = None, *,
                 check_backward: bool = True, sync_every_module: bool = False,
                 headroom: float = 0.5, all_ranks_stop: bool = False,
                 print_report: bool = True, file: IO[str] | None = None) -> None:
        self.model = model
        self.max_frames_to_save = max_frames_to_save
        self.trace_batch_nums = set(trace_batch_nums or ())
        self.abort_after_batch_num = abort_after_batch_num
        self.check_backward = check_backward
        self.sync_every_module = sync_every_module
        self.headroom = headroom
        self.all_ranks_stop = all_ranks_stop
        self.print_report = print_report
        self.file = file
        self.batch_number = 0
        self.report: OverflowReport | None = None
        self.headroom_reports: list[HeadroomWarning] = []
        self.checks = 0  # host syncs spent on checks (the default mode: one per pass)
        self._warned: set[tuple[str, str, str]] = set()
        self._active = True
        self._handles: list[Any] = []
        self._names = {m: name for name, m in model.named_modules()}  # first name wins
        self._info = {m: (name, type(m).__name__) for m, name in self._names.items()}
        self._fwd = _Pass("forward", 0, self._info)
        self._bwd = _Pass("backward", 0, self._info)
        self._bwd_callback_queued = False
        self._calls = itertools.count()
        self._last_call: dict[nn.Module, Any] = {}
        self._grad_targets: dict[int, tuple[weakref.ref[torch.Tensor], int, list[_Serve]]] = {}
        attached = model.__dict__.get(_ATTACHED)
        if attached is not None and attached() is not None and attached()._active:
            raise MldebugError(
                "DebugUnderflowOverflow is already attached to this model; a second one would "
                "run every hook twice.",
                "Keep using the first detector, or call its .detach() before attaching another.")
        model.__dict__[_ATTACHED] = weakref.ref(self)  # plain attribute: not in state_dict
        self._register()

    # ---- lifecycle -------------------------------------------------------------------------
    def _register(self) -> None:
        self._handles.append(
            self.model.register_forward_pre_hook(self._root_pre_hook, with_kwargs=True))
        for module in self._names:
            self._handles.append(
                module.register_forward_hook(self._forward_hook, with_kwargs=True))
        if self.check_backward:
            seen: set[int] = set()
            for module in self._names:
                for pname, p in module.named_parameters(recurse=False):
                    if id(p) in seen or not p.requires_grad:
                        continue
                    seen.add(id(p))
                    hook = functools.partial(self._param_grad_hook, module, f"{pname}.grad")
                    self._handles.append(p.register_hook(hook))

    def detach(self) -> None:
        """Remove every hook this detector added; the model runs as if it was never here."""
        self._active = False
        attached = self.model.__dict__.get(_ATTACHED)
        if attached is not None and attached() is self:
            del self.model.__dict__[_ATTACHED]
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> DebugUnderflowOverflow:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.detach()

    # ---- forward ---------------------------------------------------------------------------
    def _tracing(self) -> bool:
        return self.batch_number in self.trace_batch_nums

    def _root_pre_hook(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not self._active or _compiling():
            return
        self._fwd = _Pass("forward", self.batch_number, self._info,
                          eager_params=self.sync_every_module)
        self._grad_targets.clear()
        if torch._C._current_graph_task_id() == -1:
            # not inside a backward: a backward that raised midway never ran its callback
            self._bwd_callback_queued = False

    def _forward_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self._active or _compiling():
            return
        rec = self._fwd
        reduce = rec.reduce
        if rec.eager_params:  # sync_every_module: the weights are checked with the module
            entries: list[_RawEntry] = [(pname, reduce(p)) for pname, p in
                                        module._parameters.items() if p is not None]
        else:  # reduced when a report needs them (an inf weight shows in the output)
            entries = []
        n = len(args)
        if n == 1 and type(args[0]) in _PLAIN:  # the common case: no walk
            inputs = [("input[0]", args[0])]
        elif n <= len(_INPUT_NAMES) and all(type(a) in _PLAIN for a in args):
            inputs = list(zip(_INPUT_NAMES, args, strict=False))
        else:
            inputs = list(_tensors.iter_leaves(args, "input"))
        if kwargs:
            # what iter_leaves(kwargs, "input", keep_scalars=False) yields, without a
            # generator per argument: tensors directly, scalars and None dropped
            for k, v in kwargs.items():
                tv = type(v)
                if tv in _PLAIN:
                    inputs.append((_kwarg_name(k), v))
                elif v is not None and tv not in _SCALARS:
                    inputs.extend(_tensors.iter_leaves(v, _kwarg_name(k), keep_scalars=False,
                                                       depth=1))
        if type(output) in _PLAIN:
            outputs = [("output", output)]
        else:
            outputs = list(_tensors.iter_leaves(output, "output"))
        for ctx, value in inputs:
            entries.append((ctx, reduce(value)))
        for ctx, value in outputs:
            entries.append((ctx, reduce(value)))
        rec.calls.append((module, entries))
        if self.check_backward and torch.is_grad_enabled():
            key = next(self._calls)
            self._last_call[module] = key
            self._hook_gradients(key, module, outputs)
            self._hook_gradients(key, module, inputs)
        if self.sync_every_module and not self._tracing():
            self._check(rec)
        if module is self.model:
            self._end_of_forward(rec)

    def _hook_gradients(self, key: int, module: nn.Module, values: list[tuple[str, Any]]) -> None:
        # One hook per tensor per pass, however many modules saw it: a module's output is
        # usually the next one's input. The hook fans out to every (frame, ctx) it serves.
        targets = self._grad_targets
        for ctx, value in values:
            tv = type(value)
            if tv is torch.Tensor:
                if not value.requires_grad:
                    continue
            elif tv is nn.Parameter or not isinstance(value, torch.Tensor) \
                    or not value.requires_grad:
                # a weight's gradient has its own hook (see _register); one more here each
                # step would pile up on the weight for good
                continue
            found = targets.get(id(value))
            version = -1 if value.is_inference() else value._version
            if found is not None and found[1] == version and found[0]() is value:
                found[2].append((key, module, _GRAD_CTX.get(ctx) or _grad_ctx(ctx)))
                continue
            if tv is torch.Tensor:
                if value.is_meta or not value.numel():
                    continue
            elif _tensors.classify(value) != "tensor":
                continue
            # changed in place since (ReLU(inplace=True), x += y): a new autograd node made
            # the current value, so it gets its own hook
            serves = [(key, module, _GRAD_CTX.get(ctx) or _grad_ctx(ctx))]
            targets[id(value)] = (weakref.ref(value), version, serves)
            node = value.grad_fn
            if node is not None:
                # a pre-hook on the node that made the tensor sees the same gradient as a
                # tensor hook, and costs a third to register
                node.register_prehook(
                    functools.partial(self._node_grad_hook, serves, value.output_nr))
            else:
                value.register_hook(functools.partial(self._tensor_grad_hook, serves))

    def _end_of_forward(self, rec: _Pass) -> None:
        tracing = self._tracing()
        if tracing:
            self._emit(render_trace(rec.to_frames(), self.batch_number), logging.INFO)
        else:
            self._check(rec)
        self.batch_number += 1
        if self.abort_after_batch_num is not None and self.batch_number > self.abort_after_batch_num:
            raise ValueError(
                f"DebugUnderflowOverflow: aborting after {self.batch_number} batches due to "
                f"`abort_after_batch_num={self.abort_after_batch_num}` arg")

    # ---- backward --------------------------------------------------------------------------
    def _start_backward(self) -> _Pass:
        self._bwd = _Pass("backward", max(self.batch_number - 1, 0), self._info)
        self._bwd_callback_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return self._bwd

    def _tensor_grad_hook(self, serves: list[_Serve], grad: Any) -> None:
        """The gradient of one tensor: reduce it once and note whom it serves (the frames
        are only built for a report)."""
        if not self._active or _compiling() or not isinstance(grad, torch.Tensor):
            return
        if self.batch_number - 1 in self.trace_batch_nums:
            return
        rec = self._bwd if self._bwd_callback_queued else self._start_backward()
        rec.grads.append((serves, rec.reduce(grad)))
        # A gradient arriving at a module (grad_output) is the one its consumer produced
        # (grad_input): check once the producing side is filed, so the culprit rule sees it.
        if self.sync_every_module and not all(s[2].startswith("grad_output") for s in serves):
            self._check(rec)

    def _node_grad_hook(self, serves: list[_Serve], index: int, grad_outputs: Any) -> None:
        if index < len(grad_outputs):
            self._tensor_grad_hook(serves, grad_outputs[index])

    def _param_grad_hook(self, module: nn.Module, ctx: str, grad: Any) -> None:
        key = self._last_call.get(module, ("param", module))
        self._tensor_grad_hook([(key, module, ctx)], grad)

    def _end_of_backward(self) -> None:
        self._bwd_callback_queued = False
        if not self._active:
            return
        self._check(self._bwd)

    # ---- checking and reporting ------------------------------------------------------------
    def _check(self, rec: _Pass) -> None:
        flags = rec.flags(self.headroom)
        stopped_by: list[int] = []
        if self.all_ranks_stop and torch.distributed.is_available() \
                and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            rank = torch.distributed.get_rank()
            device = flags.device
            if torch.distributed.get_backend() == "nccl" and device.type != "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
            vec = torch.zeros(2 * world, device=device)
            vec[rank] = flags[0].to(device)
            vec[world + rank] = flags[1].to(device)
            torch.distributed.all_reduce(vec)
            host = vec.tolist()  # the one host sync of this check
            stopped_by = [r for r in range(world) if host[r] > 0]
            bad, warn = host[rank] > 0, host[world + rank] > 0
        else:
            bad, warn = (v > 0 for v in flags.tolist())
        self.checks += 1
        if bad:
            self._report_overflow(rec)
        if stopped_by:
            others = ", ".join(map(str, stopped_by))
            msg = (f"DebugUnderflowOverflow: rank(s) {others} detected inf/nan during "
                   f"batch_number={rec.batch_number} ({rec.phase}); all_ranks_stop=True stops "
                   "this rank too (the report is in that rank's output).")
            self._emit(msg + "\n", logging.ERROR)
            self._active = False
            raise OverflowDetected(msg)
        if warn:
            self._report_headroom(rec)

    def _prefix(self) -> str:
        from mldebug.dist import identity
        from mldebug.printing import make_prefix

        ident = identity()
        return make_prefix(ident=ident) if ident.is_distributed else ""

    def _report_overflow(self, rec: _Pass) -> None:
        frames = rec.to_frames()
        report = build_report(frames, phase=rec.phase, batch_number=rec.batch_number,
                              max_frames=self.max_frames_to_save, prefix=self._prefix(),
                              headroom_fraction=self.headroom)
        if report is None:  # pragma: no cover - flags and frames disagree
            return
        self.report = report
        self._emit(render_report(report), logging.ERROR, prefixed=True)
        self._active = False  # one report per detector; the step is being aborted
        raise OverflowDetected(
            "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running "
            f"further. {report.culprit}. Please scroll up above this traceback to see the "
            "activation values prior to this event.", report)

    def _report_headroom(self, rec: _Pass) -> None:
        fresh = []
        for w in headroom_warnings(rec.to_frames(), self.headroom):
            key = (w.module, w.ctx, w.phase)
            if key not in self._warned:
                self._warned.add(key)
                fresh.append(w)
        if fresh:
            self.headroom_reports.extend(fresh)
            self._emit(render_headroom(fresh, rec.batch_number, self.headroom, self._prefix()),
                       logging.WARNING, prefixed=True)

    def _emit(self, text: str, level: int, prefixed: bool = False) -> None:
        logger.log(level, "%s", text.rstrip("\n"))
        if not self.print_report:
            return
        from mldebug.printing import prefix_lines, printflock

        prefix = "" if prefixed else self._prefix()
        printflock(prefix_lines(text, prefix) if prefix else text, end="",
                   file=self.file if self.file is not None else sys.stdout)
