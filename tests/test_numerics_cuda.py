"""CUDA only: the default mode adds exactly its per-pass checks as host syncs, none per module."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mldebug.numerics import DebugUnderflowOverflow  # noqa: E402

pytestmark = pytest.mark.cuda


def count_syncs(step: Any) -> int:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_default_mode_syncs_once_per_pass(dtype: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", getattr(torch, dtype))
    ids = torch.randint(0, 128, (4, 64), device="cuda")

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    step()
    baseline = count_syncs(step)
    with DebugUnderflowOverflow(model, print_report=False) as debug:
        step()  # first step builds the cached headroom thresholds
        before = debug.checks
        with_detector = count_syncs(step)
        assert debug.checks - before == 2
    assert with_detector - baseline == 2, (baseline, with_detector)
    assert debug.report is None
