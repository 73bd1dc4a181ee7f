"""DebugUnderflowOverflow on real (small) models on CPU, and the tensor inspection helpers."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mldebug.numerics import (  # noqa: E402
    DebugUnderflowOverflow,
    OverflowDetected,
    detect_overflow,
    lovely,
    patch_tensor_repr,
    tensor_info,
    tensor_stats,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes"))
import backward_overflow  # noqa: E402
import fp16_overflow  # noqa: E402

FP16_MAX = 65504.0


def first_fp16_overflow_by_fp32_oracle() -> int:
    """The first layer whose output exceeds fp16's range, computed independently in fp32."""
    model, x = fp16_overflow.build(dtype=torch.float32)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            x = layer(x)
            if x.abs().max().item() > FP16_MAX:
                return i
    raise AssertionError("the recipe no longer overflows fp16")


@pytest.mark.parametrize("sync_every_module", [False, True])
def test_fp16_recipe_names_the_layer_that_overflows(sync_every_module: bool) -> None:
    expected = first_fp16_overflow_by_fp32_oracle()
    report = fp16_overflow.run(sync_every_module=sync_every_module, print_report=False)
    assert report is not None
    assert report.first.module == f"layers.{expected}"
    assert report.phase == "forward" and report.batch_number == 0
    out = [e for e in report.first.entries if e.ctx == "output"]
    assert out and out[0].abs_max == float("inf")
    # the frames before it show the activations growing towards fp16's limit
    before = [next(e.abs_max for e in f.entries if e.ctx == "output") for f in report.frames[:-1]]
    assert len(before) == expected
    assert before == sorted(before) and before[-1] > FP16_MAX / 2
    # the layer before the overflow had already used more than half of fp16's range
    assert any(w.module == f"layers.{expected - 1}" and w.ctx == "output"
               for w in report.headroom)
    # the default mode records the later frames and reports them; sync mode stops at once
    later = len(fp16_overflow.build()[0].layers) - expected - 1 + 1  # + the root frame
    assert report.more_frames == (0 if sync_every_module else later)


def test_default_mode_checks_once_per_pass() -> None:
    model, x = fp16_overflow.build(dtype=torch.float32)
    x.requires_grad_(True)
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        for _ in range(3):
            model(x * 1e-3).sum().backward()
    assert debug.report is None
    assert debug.checks == 6  # one per forward + one per backward, not one per module


def first_backward_overflow_by_fp32_oracle() -> str:
    """Going backward, the first layer with a gradient (input, weight or bias) beyond fp16's
    range, computed independently in fp32."""
    model, x = backward_overflow.build(dtype=torch.float32)
    acts = []
    h = x.requires_grad_(True)
    for layer in model.layers:
        h.retain_grad()
        acts.append(h)
        h = layer(h)
    backward_overflow.loss_fn(h).backward()
    for i in reversed(range(len(model.layers))):
        layer = model.layers[i]
        grads = [acts[i].grad, layer.weight.grad, layer.bias.grad]
        if any(g.abs().max().item() > FP16_MAX for g in grads):
            return f"layers.{i}"
    raise AssertionError("the recipe no longer overflows in backward")


def test_backward_recipe_names_the_module_whose_backward_made_the_inf() -> None:
    expected = first_backward_overflow_by_fp32_oracle()
    for sync in (False, True):
        report = backward_overflow.run(sync_every_module=sync, print_report=False)
        assert report is not None
        assert (report.phase, report.first.module) == ("backward", expected)
        arrived = [e for e in report.first.entries if e.ctx == "grad_output"]
        assert arrived and arrived[0].abs_max is not None and arrived[0].abs_max < FP16_MAX
        assert any(e.nonfinite for e in report.first.entries if e.ctx != "grad_output")


def test_transformers_anchor_misses_the_backward_overflow() -> None:
    from transformers.debug_utils import DebugUnderflowOverflow as Anchor

    model, x = backward_overflow.build()
    Anchor(model)
    with contextlib.redirect_stdout(io.StringIO()):
        out = model(x)  # no exception: the forward is finite and it checks forward only
        backward_overflow.loss_fn(out).backward()
    assert not torch.isfinite(model.layers[0].weight.grad).all()


class Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def run_batches(model: nn.Module, n: int) -> int:
    done = 0
    for i in range(n):
        try:
            model(torch.full((2, 4), float(i + 1)))
        except ValueError:
            return done
        done += 1
    return done


def test_trace_and_abort_match_the_transformers_anchor(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers.debug_utils import DebugUnderflowOverflow as Anchor

    torch.manual_seed(0)
    ours_model, anchor_model = Seq(), Seq()
    anchor_model.load_state_dict(ours_model.state_dict())
    d = DebugUnderflowOverflow(ours_model, trace_batch_nums=[1, 3], abort_after_batch_num=3,
                               check_backward=False)
    ours_done = run_batches(ours_model, 6)
    ours = capsys.readouterr().out
    Anchor(anchor_model, trace_batch_nums=[1, 3], abort_after_batch_num=3)
    anchor_done = run_batches(anchor_model, 6)
    anchor = capsys.readouterr().out
    assert ours_done == anchor_done == 3  # batches 0..2 complete; batch 3 raises at its end
    assert "*** Starting batch number=1 ***" in ours and "*** Starting batch number=3 ***" in ours
    assert "batch number=0" not in ours and "batch number=2" not in ours
    d.detach()

    def frame_lines(text: str) -> list[str]:
        return [ln for ln in text.splitlines()
                if ln.strip() and "***" not in ln and not ln.startswith("abs min")]

    # same frames, same numbers, same layout as the book's / transformers' version
    assert frame_lines(ours) == frame_lines(anchor)
    assert len(frame_lines(ours)) == 2 * (5 + 3 + 3)  # 2 batches x (a, b, root) frames


@dataclasses.dataclass
class Out:
    hidden: torch.Tensor
    extra: dict[str, torch.Tensor]


class KwargsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.sharded = nn.Parameter(torch.empty(0))  # like a ZeRO-3 / FSDP shard
        self.register_buffer("meta_buf", torch.empty(3, device="meta"), persistent=False)

    def forward(self, *, x: torch.Tensor, scale: torch.Tensor, flag: bool = True) -> Out:
        h = self.proj(x) * scale
        f8 = h.detach().to(torch.float8_e4m3fn)
        return Out(hidden=h, extra={"f8": f8, "meta": self.meta_buf, "n": 3})  # type: ignore[dict-item]


def test_kwargs_dataclass_dict_empty_meta_and_fp8_are_handled() -> None:
    model = KwargsModel()
    x = torch.randn(2, 4)
    with DebugUnderflowOverflow(model, trace_batch_nums=[0], print_report=False,
                                check_backward=False) as debug:
        model(x=x, scale=torch.tensor(2.0), flag=False)
        frames = debug._fwd.to_frames()
    root = frames[-1]
    ctxs = {e.ctx: e for e in root.entries}
    assert ctxs["sharded"].kind == "empty"
    assert ctxs["input['x']"].kind == "tensor"
    assert ctxs["input['x']"].abs_max == pytest.approx(x.abs().max().item())
    assert ctxs["output.hidden"].kind == "tensor"
    assert ctxs["output.extra['f8']"].dtype == "torch.float8_e4m3fn"
    assert ctxs["output.extra['meta']"].kind == "meta"
    assert "input['flag']" not in ctxs and "output.extra['n']" not in ctxs

    # an inf that only a keyword argument carries is found
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        with pytest.raises(OverflowDetected):
            model(x=x, scale=torch.tensor(float("inf")))
    assert debug.report is not None and debug.report.first.module == ""
    assert "input['scale'] has inf" in debug.report.culprit


def hooks_left(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks)
        n += len(m._forward_hooks_with_kwargs) + len(m._forward_pre_hooks_with_kwargs)
    for p in model.parameters():
        n += len(p._backward_hooks or {})
    return n


def test_detach_and_context_manager_remove_every_hook() -> None:
    model, x = backward_overflow.build()
    debug = DebugUnderflowOverflow(model, print_report=False)
    assert hooks_left(model) > 0
    debug.detach()
    assert hooks_left(model) == 0
    model(x).pow(2).mean().backward()  # the inf gradient goes unnoticed: nothing is attached
    with DebugUnderflowOverflow(model, print_report=False):
        assert hooks_left(model) > 0
    assert hooks_left(model) == 0


class WeightAsInput(nn.Module):
    """A weight handed to a child module as its input (tied embeddings, adapters)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.lin(self.w).sum()


def test_a_weight_passed_as_input_gathers_no_hooks_step_after_step() -> None:
    model = WeightAsInput()
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        attached = hooks_left(model)
        for _ in range(5):
            model(torch.randn(2, 4)).sum().backward()
        assert hooks_left(model) == attached  # one hook per weight, not one more per step
        model.w.data[0, 0] = float("inf")  # and an inf in it is still found
        with pytest.raises(OverflowDetected):
            model(torch.randn(2, 4)).sum().backward()
    assert debug.report is not None
    assert hooks_left(model) == 0


def test_headroom_warning_is_printed_once_and_kept() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).half()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(4) * 1000)
        model[0].bias.zero_()
    x = torch.full((1, 4), 40.0).half()  # output 40000: 61% of fp16 max
    buf = io.StringIO()
    with DebugUnderflowOverflow(model, file=buf) as debug:
        model(x)
        model(x)
    assert debug.report is None
    # one warning per tensor: the ReLU's input is the Linear's output, the root's output the
    # ReLU's
    assert [(w.module, w.ctx) for w in debug.headroom_reports] == [("0", "output"),
                                                                   ("1", "output")]
    text = buf.getvalue()
    assert text.count("Headroom warning during batch_number=0") == 1
    assert "batch_number=1" not in text


def test_hooks_are_not_traced_by_torch_compile() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    model = Seq()
    debug = DebugUnderflowOverflow(model, print_report=False)
    explanation = torch._dynamo.explain(model)(torch.randn(2, 4))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
    debug.detach()
    torch._dynamo.reset()


def test_detect_overflow_on_pytrees(capsys: pytest.CaptureFixture[str]) -> None:
    ok = {"a": torch.ones(3), "b": [torch.zeros(2), None, 5]}
    assert detect_overflow(ok, "ok") is False
    bad = {"a": torch.tensor([1.0, float("nan")]), "b": (torch.tensor([float("-inf")]),),
           "c": torch.tensor([float("inf")]).to(torch.float8_e5m2)}
    assert detect_overflow(bad, "after mlp") is True
    out = capsys.readouterr().out.splitlines()
    assert out == ["after mlp['a'] has nans", "after mlp['b'][0] has infs",
                   "after mlp['c'] has infs"]


def test_tensor_info_and_stats() -> None:
    x = torch.tensor([[1.0, -2.0], [float("nan"), float("inf")]], dtype=torch.float16)
    info = tensor_info(x, "x")
    assert info.startswith("x:, device=cpu, dtype=torch.float16, shape=torch.Size([2, 2]), "
                           "numel=4, requires_grad=False, grad=None, stride=(2, 1), "
                           "is_contiguous=True, data_ptr=")
    assert info.endswith(", min=-2, max=1, mean=-0.5, std=2.121, nan=1, inf=1")  # finite stats
    formatted = tensor_info(torch.arange(6.0).reshape(2, 3), formatted=True).splitlines()
    assert formatted[0] == "device=cpu" and "min=0" in formatted and "max=5" in formatted
    s = tensor_stats(torch.tensor([3.0, -4.0]))
    assert (s.min, s.max, s.mean, s.abs_min, s.abs_max, s.nan, s.inf) == (-4, 3, -0.5, 3, 4, 0, 0)
    assert tensor_stats(torch.empty(0)).max is None
    only_nan = tensor_stats(torch.tensor([float("nan"), float("inf")]))
    assert (only_nan.min, only_nan.nan, only_nan.inf) == (None, 1, 1)
    assert tensor_stats(torch.tensor([2, -7])).abs_max == 7  # integers too


def test_patch_tensor_repr_adds_shape_and_restores() -> None:
    x = torch.zeros(2, 3)
    plain = repr(x)
    with patch_tensor_repr():
        assert repr(x) == f"tensor[2, 3] float32 cpu {plain}"
    assert repr(x) == plain
    with patch_tensor_repr(values=False):
        assert repr(x) == "tensor[2, 3] float32 cpu"
    assert repr(x) == plain


def test_lovely_says_how_to_install_when_missing() -> None:
    try:
        import lovely_tensors  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install lovely-tensors"):
            lovely()
    else:  # pragma: no cover - depends on the environment
        lt = lovely()
        assert repr(torch.rand(4)).startswith("tensor[4] x∈[")  # lovely's summary form
        lovely(False)
        assert repr(torch.rand(4)).startswith("tensor([")
        assert lt is not None


def test_inference_mode_and_in_place_changes_are_seen() -> None:
    model = Seq()
    with DebugUnderflowOverflow(model, print_report=False) as debug, torch.inference_mode():
        model(torch.ones(2, 4))
        assert debug.report is None
        with pytest.raises(OverflowDetected):
            model(torch.full((2, 4), float("nan")))
    assert debug.report is not None and debug.report.first.module == "a"

    # a tensor changed in place after a module recorded it is measured again
    def poison(mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        out.mul_(float("inf"))

    model = Seq()
    model.register_forward_hook(poison)  # runs before the detector's hook on the root
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        with pytest.raises(OverflowDetected):
            model(torch.ones(2, 4))
    assert debug.report is not None and debug.report.first.module == ""


class InPlace(nn.Module):
    """In-place ops on module outputs and inputs: what register_full_backward_hook breaks."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))  # in place on fc1's output
        y = self.fc2(h)
        y += x  # in-place residual on a module's output
        return y


def test_in_place_ops_keep_working_and_gradients_are_unchanged() -> None:
    torch.manual_seed(0)
    plain, watched = InPlace(), InPlace()
    watched.load_state_dict(plain.state_dict())
    x = torch.randn(4, 8)
    plain(x).sum().backward()
    with DebugUnderflowOverflow(watched, print_report=False) as debug:
        watched(x).sum().backward()
    assert debug.report is None and debug.checks == 2
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)

    # full backward hooks, for comparison, refuse this model
    hooked = InPlace()
    hooked.act.register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(RuntimeError):
        hooked(x).sum().backward()


def test_checks_resume_after_a_backward_that_raised_midway() -> None:
    def boom(grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("user hook failed")

    model = Seq()
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        out = model(torch.ones(2, 4))
        model.a.weight.register_hook(boom)  # fails after the detector's first gradient hooks
        with pytest.raises(RuntimeError, match="user hook failed"):
            out.sum().backward()
        model.a.weight._backward_hooks.popitem()
        model(torch.ones(2, 4)).sum().backward()
    assert debug.checks == 3  # forward, forward, and the second backward


def test_report_goes_to_the_logger_and_the_chosen_file(caplog: pytest.LogCaptureFixture) -> None:
    model = Seq()
    buf = io.StringIO()
    with caplog.at_level("ERROR", logger="mldebug.numerics"):
        with DebugUnderflowOverflow(model, file=buf) as debug:
            with pytest.raises(OverflowDetected) as info:
                model(torch.full((2, 4), float("inf")))
    assert info.value.report is debug.report is not None
    assert "Detected inf/nan during batch_number=0" in buf.getvalue()
    assert any("Detected inf/nan during batch_number=0" in r.getMessage() for r in caplog.records)
    quiet = io.StringIO()
    with DebugUnderflowOverflow(Seq(), file=quiet, print_report=False) as debug:
        with pytest.raises(OverflowDetected):
            debug.model(torch.full((2, 4), float("nan")))
    assert quiet.getvalue() == "" and debug.report is not None


def test_a_second_detector_on_one_model_is_refused_until_the_first_detaches():
    from mldebug.errors import MldebugError

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    first = DebugUnderflowOverflow(model, print_report=False)
    hooks = len(model[0]._forward_hooks)
    with pytest.raises(MldebugError, match="already attached to this model"):
        DebugUnderflowOverflow(model, print_report=False)
    assert len(model[0]._forward_hooks) == hooks  # the refused one added nothing
    first.detach()
    second = DebugUnderflowOverflow(model, print_report=False)
    assert len(model[0]._forward_hooks) == hooks
    second.detach()
    assert "_mldebug_overflow_detector" not in model.state_dict()
