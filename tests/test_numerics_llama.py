"""DebugUnderflowOverflow on a tiny HF Llama built from a config (no downloads)."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mldebug.numerics import DebugUnderflowOverflow, OverflowDetected  # noqa: E402


def tiny_llama() -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def batch() -> dict[str, Any]:
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids, "use_cache": False}


def plant_inf(module: torch.nn.Module) -> None:
    """Put one inf into the module's output (registered before the detector's hooks)."""
    def hook(mod: torch.nn.Module, args: Any, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            out = out.clone()
            out[0, 3, 5] = float("inf")
            return out
        out.logits[0, 3, 5] = float("inf")
        return out
    module.register_forward_hook(hook)


def test_names_the_decoder_layer_with_the_planted_inf() -> None:
    model = tiny_llama()
    plant_inf(model.model.layers[2])
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        with pytest.raises(OverflowDetected, match="model.layers.2"):
            model(**batch())
    report = debug.report
    assert report is not None
    assert (report.first.module, report.first.cls) == ("model.layers.2", "LlamaDecoderLayer")
    assert [e.ctx for e in report.first.entries if e.nonfinite] == ["output"]
    # everything before it, including layers 0 and 1, was finite
    assert all(not f.nonfinite for f in report.frames[:-1])
    assert any(f.module == "model.layers.1" for f in report.frames)


def test_logits_inside_the_model_output_are_checked() -> None:
    model = tiny_llama()
    plant_inf(model)  # only the root's CausalLMOutputWithPast.logits carries the inf
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        with pytest.raises(OverflowDetected):
            model(**batch())
    assert debug.report is not None
    assert debug.report.first.module == ""
    assert "output.logits has inf" in debug.report.culprit
    ctxs = [e.ctx for e in debug.report.first.entries]
    assert "input['input_ids']" in ctxs and "output.loss" in ctxs

    # the transformers anchor does not descend into ModelOutput: it misses the same inf
    from transformers.debug_utils import DebugUnderflowOverflow as Anchor

    model = tiny_llama()
    plant_inf(model)
    Anchor(model)
    with contextlib.redirect_stdout(io.StringIO()):
        out = model(**batch())
    assert not torch.isfinite(out.logits).all()


def test_clean_training_step_checks_forward_and_backward_once_each() -> None:
    model = tiny_llama()
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        for _ in range(2):
            model(**batch()).loss.backward()
    assert debug.report is None and debug.checks == 4
    assert debug.batch_number == 2
