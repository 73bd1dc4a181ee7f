"""Pure report analysis on hand-written frames: no torch, no hooks."""

from __future__ import annotations

import math

from mldebug.numerics.report import (
    Entry,
    ModuleCall,
    build_report,
    first_nonfinite_backward,
    format_entry,
    headroom_warnings,
    render_headroom,
    render_report,
    render_trace,
)

INF = math.inf
NAN = math.nan


def fwd(name: str, *entries: Entry, cls: str = "Linear") -> ModuleCall:
    return ModuleCall(name, cls, "forward", 0, 0, list(entries))


def bwd(name: str, *entries: Entry, cls: str = "Linear") -> ModuleCall:
    return ModuleCall(name, cls, "backward", 0, 0, list(entries))


def t(ctx: str, lo: float, hi: float, dtype: str = "torch.float16") -> Entry:
    return Entry(ctx, "tensor", lo, hi, dtype)


def test_entry_lines_match_the_book_columns() -> None:
    assert format_entry(t("output", 3.18e-04, 6.27e04)) == "3.18e-04 6.27e+04 output"
    assert format_entry(t("output", 0.0, INF)) == "0.00e+00      inf output"
    assert format_entry(Entry("output[1]", "none")) == "             None output[1]"
    assert format_entry(Entry("output", "not a tensor")) == "     not a tensor output"
    assert format_entry(Entry("weight", "empty")) == "            empty weight"


def test_forward_report_names_first_bad_frame_and_keeps_the_frames_before_it() -> None:
    frames = [fwd(f"l{i}", t("output", 1.0, 10.0 ** i)) for i in range(5)]
    frames.append(fwd("l5", t("input[0]", 1.0, 1e4), t("output", 0.0, INF)))
    frames.append(fwd("l6", t("input[0]", 0.0, INF), t("output", NAN, NAN)))
    report = build_report(frames, phase="forward", batch_number=3, max_frames=3)
    assert report is not None
    assert report.first.module == "l5"
    assert [f.module for f in report.frames] == ["l3", "l4", "l5"]
    assert report.more_frames == 1
    text = render_report(report)
    assert "Detected inf/nan during batch_number=3\nLast 3 forward frames:\n" in text
    assert "abs min  abs max  metadata\n                  l3 Linear\n" in text
    assert text.rstrip().endswith("(1 later forward frames of this batch not shown)")
    assert "first inf/nan in forward at l5 (Linear): output has inf" in text


def test_no_report_when_everything_is_finite() -> None:
    frames = [fwd("a", t("output", 0.0, 1.0)), fwd("b", Entry("output", "none"))]
    assert build_report(frames, phase="forward", batch_number=0, max_frames=21) is None


def test_nan_is_named_as_nan() -> None:
    report = build_report([fwd("a", t("output", NAN, NAN))], phase="forward",
                          batch_number=0, max_frames=21)
    assert report is not None and "output has nan" in report.culprit


def test_backward_blames_the_module_whose_own_backward_produced_the_inf() -> None:
    frames = [
        bwd("", t("grad_output", 1.0, 1.0), cls="Net"),
        bwd("fc2", t("grad_output", 1.0, 1.0), t("weight.grad", 0.0, 2.0),
            t("grad_input[0]", 0.1, 0.5)),
        # receives a finite gradient, hands back an inf: the culprit
        bwd("sqrt", t("grad_output", 0.1, 0.5), t("grad_input[0]", 0.0, INF), cls="Sqrt"),
        # receives the inf: it only passes it on
        bwd("fc1", t("grad_output", 0.0, INF), t("weight.grad", NAN, NAN)),
        bwd("", t("grad_output", 1.0, 1.0), t("grad_input[0]", 0.0, INF), cls="Net"),
    ]
    assert first_nonfinite_backward(frames) == 2
    report = build_report(frames, phase="backward", batch_number=0, max_frames=21)
    assert report is not None
    assert report.first.module == "sqrt"
    assert report.culprit == ("first inf/nan produced by the backward of sqrt (Sqrt): "
                              "grad_input[0] has inf")
    assert "(backward)" in render_report(report).splitlines()[1]


def test_backward_falls_back_to_first_bad_frame_when_the_loss_gradient_is_bad() -> None:
    frames = [bwd("head", t("grad_output", 0.0, INF), t("weight.grad", 0.0, INF))]
    assert first_nonfinite_backward(frames) == 0


def test_headroom_only_for_small_range_dtypes_and_finite_values() -> None:
    frames = [
        fwd("a", t("output", 0.0, 40000.0)),  # 61% of fp16 max
        fwd("b", t("output", 0.0, 30000.0)),  # 46%: below the default fraction
        fwd("c", t("output", 0.0, 1e30, dtype="torch.float32")),  # fp32 has room
        fwd("d", t("output", 0.0, 300.0, dtype="torch.float8_e4m3fn")),  # 67% of 448
        fwd("e", t("output", 0.0, INF)),  # already overflowed: not a headroom warning
    ]
    warnings = headroom_warnings(frames, 0.5)
    assert [(w.module, w.dtype) for w in warnings] == [
        ("a", "torch.float16"), ("d", "torch.float8_e4m3fn")]
    assert round(warnings[0].fraction, 2) == 0.61
    text = render_headroom(warnings, 7, 0.5, prefix="[n1:3]")
    assert text.startswith("[n1:3] Headroom warning during batch_number=7: 2 value(s) above 50%")
    assert all(line.startswith("[n1:3] ") for line in text.splitlines())


def test_report_prefix_goes_on_every_line() -> None:
    report = build_report([fwd("a", t("output", 0.0, INF))], phase="forward",
                          batch_number=0, max_frames=21, prefix="[node2:1]")
    assert report is not None
    lines = render_report(report).splitlines()
    assert lines and all(line.startswith("[node2:1]") for line in lines)


def test_trace_format() -> None:
    text = render_trace([fwd("shared", t("weight", 1e-6, 792.0), cls="Embedding")], 1)
    assert "                  *** Starting batch number=1 ***\nabs min  abs max  metadata\n" \
        "                  shared Embedding\n1.00e-06 7.92e+02 weight\n" in text
