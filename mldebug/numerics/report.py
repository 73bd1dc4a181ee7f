"""The inf/nan report as data, and the pure functions that build and render it.

Hooks record plain numbers into :class:`ModuleCall` objects; everything here works on those
dataclasses only (no torch), so the analysis that names the first bad module is tested on
fixtures and reused for the forward and the backward pass. The text format is the one the
book and ``transformers.debug_utils.DebugUnderflowOverflow`` print::

    abs min  abs max  metadata
                      encoder.block.2.layer.1.dropout Dropout
    3.18e-04 6.27e+04 input[0]
    0.00e+00      inf output
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Phase = Literal["forward", "backward"]
EntryKind = Literal["tensor", "none", "not a tensor", "empty", "meta"]

PREFIX = " " * 17  # the width of the two number columns: "abs min  abs max"
HEADER = f"{'abs min':8} {'abs max':8} metadata"

# Largest finite value of the dtypes whose range is small enough to run out of.
DTYPE_MAX: dict[str, float] = {
    "torch.float16": 65504.0,
    "torch.bfloat16": 3.3895313892515355e38,
    "torch.float8_e4m3fn": 448.0,
    "torch.float8_e4m3fnuz": 240.0,
    "torch.float8_e5m2": 57344.0,
    "torch.float8_e5m2fnuz": 57344.0,
}


@dataclass
class Entry:
    """One line of a frame: a weight, an input, an output or a gradient."""

    ctx: str  # "weight", "input[0]", "output.logits", "grad_input[0]", ...
    kind: EntryKind = "tensor"
    abs_min: float | None = None
    abs_max: float | None = None
    dtype: str | None = None
    tensor: int | None = None  # same number = same tensor seen again in this pass

    @property
    def nonfinite(self) -> bool:
        """True when the tensor held an inf or a nan (its abs max is not finite)."""
        return self.kind == "tensor" and self.abs_max is not None and not math.isfinite(self.abs_max)

    @property
    def has_nan(self) -> bool:
        return self.kind == "tensor" and self.abs_max is not None and math.isnan(self.abs_max)

    @property
    def is_gradient_in(self) -> bool:
        """A gradient that arrived at the module's backward (w.r.t. its outputs)."""
        return self.ctx.startswith("grad_output")


@dataclass
class ModuleCall:
    """What one module call saw: its weights, inputs and outputs (or their gradients)."""

    module: str  # fully qualified name, "" for the root
    cls: str  # the module's class name
    phase: Phase = "forward"
    batch_number: int = 0
    index: int = 0  # position in execution order within its pass
    entries: list[Entry] = field(default_factory=list)

    @property
    def nonfinite(self) -> bool:
        return any(e.nonfinite for e in self.entries)

    @property
    def title(self) -> str:
        suffix = " (backward)" if self.phase == "backward" else ""
        return f"{self.module} {self.cls}{suffix}"


@dataclass
class HeadroomWarning:
    """A finite value already above ``fraction`` of its dtype's largest finite number."""

    module: str
    cls: str
    ctx: str
    dtype: str
    abs_max: float
    limit: float
    phase: Phase = "forward"

    @property
    def fraction(self) -> float:
        return self.abs_max / self.limit


@dataclass
class OverflowReport:
    """The frames that led to the first inf/nan, and which module it was."""

    batch_number: int
    phase: Phase
    frames: list[ModuleCall]  # the saved frames, oldest first, ending with ``first``
    first: ModuleCall
    culprit: str  # one sentence naming the module and the entry
    prefix: str = ""  # "[host:rank]" in a distributed job
    more_frames: int = 0  # frames recorded after ``first`` in the same pass (not shown)
    headroom: list[HeadroomWarning] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmt_value(v: float) -> str:
    """Format like the book: 8 wide, 2 decimals, scientific ("6.27e+04", "     inf")."""
    return f"{v:8.2e}"


def format_entry(entry: Entry) -> str:
    if entry.kind == "tensor":
        assert entry.abs_min is not None and entry.abs_max is not None
        return f"{fmt_value(entry.abs_min)} {fmt_value(entry.abs_max)} {entry.ctx}"
    if entry.kind == "none":
        return f"{'None':>17} {entry.ctx}"
    return f"{entry.kind:>17} {entry.ctx}"


def format_frame(frame: ModuleCall) -> str:
    lines = [f"{PREFIX} {frame.title}"]
    lines.extend(format_entry(e) for e in frame.entries)
    return "\n".join(lines)


def first_nonfinite_forward(frames: Sequence[ModuleCall]) -> int | None:
    """Index of the first frame (execution order) with an inf/nan anywhere in it."""
    for i, frame in enumerate(frames):
        if frame.nonfinite:
            return i
    return None


def first_nonfinite_backward(frames: Sequence[ModuleCall]) -> int | None:
    """Index of the first frame whose own backward produced an inf/nan.

    A module is to blame when a gradient it produced (w.r.t. its inputs or weights) is not
    finite while every gradient that arrived at it (w.r.t. its outputs) was finite. Frames
    are in the order their backward finished, so an inner module comes before its parent.
    When no frame qualifies (the bad gradient came from the loss itself), fall back to the
    first frame holding any inf/nan.
    """
    for i, frame in enumerate(frames):
        arrived = [e for e in frame.entries if e.is_gradient_in]
        produced = [e for e in frame.entries if not e.is_gradient_in]
        if any(e.nonfinite for e in produced) and not any(e.nonfinite for e in arrived):
            return i
    return first_nonfinite_forward(frames)


def describe_culprit(frame: ModuleCall) -> str:
    bad = [e for e in frame.entries if e.nonfinite]
    what = ", ".join(f"{e.ctx} has {'nan' if e.has_nan else 'inf'}" for e in bad)
    if frame.phase == "backward":
        return (f"first inf/nan produced by the backward of {frame.module or '<root>'} "
                f"({frame.cls}): {what}")
    return f"first inf/nan in forward at {frame.module or '<root>'} ({frame.cls}): {what}"


def build_report(frames: Sequence[ModuleCall], *, phase: Phase, batch_number: int,
                 max_frames: int, prefix: str = "",
                 headroom_fraction: float = 0.0) -> OverflowReport | None:
    """Find the first bad frame of a pass and keep the ``max_frames`` frames ending with it.

    ``headroom_fraction`` > 0 also lists the finite values in those frames that were already
    above that fraction of their dtype's max. Returns None when every frame is finite.
    """
    pick = first_nonfinite_forward if phase == "forward" else first_nonfinite_backward
    i = pick(frames)
    if i is None:
        return None
    start = max(0, i + 1 - max_frames)
    first = frames[i]
    kept = list(frames[start:i + 1])
    return OverflowReport(
        batch_number=batch_number,
        phase=phase,
        frames=kept,
        first=first,
        culprit=describe_culprit(first),
        prefix=prefix,
        more_frames=len(frames) - i - 1,
        headroom=headroom_warnings(kept, headroom_fraction) if headroom_fraction > 0 else [],
    )


def headroom_warnings(frames: Sequence[ModuleCall], fraction: float) -> list[HeadroomWarning]:
    """Finite values whose abs max is above ``fraction`` of their dtype's largest finite value."""
    out: list[HeadroomWarning] = []
    seen: set[int] = set()
    for frame in frames:
        for e in frame.entries:
            limit = DTYPE_MAX.get(e.dtype or "")
            if limit is None or e.kind != "tensor" or e.abs_max is None:
                continue
            if e.tensor is not None:  # one warning per tensor, where it first appeared
                if e.tensor in seen:
                    continue
                seen.add(e.tensor)
            if math.isfinite(e.abs_max) and e.abs_max > fraction * limit:
                out.append(HeadroomWarning(frame.module, frame.cls, e.ctx, e.dtype or "",
                                           e.abs_max, limit, frame.phase))
    return out


def render_report(report: OverflowReport) -> str:
    """The book's text report, with the culprit named at the end."""
    which = "forward" if report.phase == "forward" else "backward"
    lines = [
        "",
        f"Detected inf/nan during batch_number={report.batch_number}"
        + (" (backward)" if report.phase == "backward" else ""),
        f"Last {len(report.frames)} {which} frames:",
        HEADER,
    ]
    lines.extend(format_frame(f) for f in report.frames)
    lines.append("")
    lines.append(report.culprit)
    if report.more_frames:
        lines.append(f"({report.more_frames} later {which} frames of this batch not shown)")
    for w in report.headroom:
        lines.append(f"headroom: {w.ctx} of {w.module or '<root>'} ({w.cls}) reached "
                     f"{fmt_value(w.abs_max).strip()} = {w.fraction:.0%} of {w.dtype} max")
    text = "\n".join(lines) + "\n"
    if report.prefix:
        text = "\n".join(f"{report.prefix} {ln}" for ln in text.split("\n")[:-1]) + "\n"
    return text


def render_headroom(warnings: Sequence[HeadroomWarning], batch_number: int,
                    fraction: float, prefix: str = "") -> str:
    lines = [f"Headroom warning during batch_number={batch_number}: "
             f"{len(warnings)} value(s) above {fraction:.0%} of their dtype's max"]
    for w in warnings:
        where = f"{w.module or '<root>'} {w.cls}" + (" (backward)" if w.phase == "backward" else "")
        lines.append(f"  {fmt_value(w.abs_max)} {w.ctx} of {where}: {w.fraction:.0%} of "
                     f"{w.dtype} max {w.limit:.5g}")
    lines.append("  Values this close to the limit overflow after one more matmul or sum: "
                 "keep this part in fp32 (autocast(enabled=False)), rescale, or use bf16.")
    text = "\n".join(lines) + "\n"
    if prefix:
        text = "\n".join(f"{prefix} {ln}" for ln in text.split("\n")[:-1]) + "\n"
    return text


def render_trace(frames: Sequence[ModuleCall], batch_number: int) -> str:
    """Per-batch tracing output (``trace_batch_nums``), as the book shows it."""
    lines = ["", "", f"{PREFIX} *** Starting batch number={batch_number} ***", HEADER]
    lines.extend(format_frame(f) for f in frames)
    return "\n".join(lines) + "\n"
