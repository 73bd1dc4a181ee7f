"""One test per model quirk in mldebug/tiny/quirks.py, each on the smallest config that shows it.

Adding a quirk: a function in quirks.py, its entry in QUIRKS, and a ``test_<name>`` here
(``test_every_quirk_has_its_test`` enforces it).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from mldebug.errors import UsageError
from mldebug.tiny import quirks
from mldebug.tiny.quirks import QUIRKS, Level
from mldebug.tiny.shrink import ShrinkSpec


def level(d: dict[str, Any], *, new_vocab: int = 1024, **spec: Any) -> Level:
    explicit = frozenset(spec)
    return Level(dict(d), ShrinkSpec(**spec, explicit=explicit), "", new_vocab)


def run_all(lv: Level) -> dict[str, Any]:
    for q in QUIRKS:
        q(lv)
    return lv.d


def test_every_quirk_has_its_test() -> None:
    tests = {n for n in dir(sys.modules[__name__]) if n.startswith("test_")}
    missing = [q.__name__ for q in QUIRKS if f"test_{q.__name__}" not in tests]
    assert missing == []
    assert all(q.__module__ == quirks.__name__ and q.__doc__ for q in QUIRKS)


def test_layers() -> None:
    lv = level({"num_hidden_layers": 6, "layer_types": ["a", "a", "b", "b", "c", "c"]}, layers=2)
    quirks.layers(lv)
    assert lv.d["num_hidden_layers"] == 3 and lv.d["layer_types"] == ["a", "b", "c"]
    assert any("raised to 3" in n for n in lv.notes)


def test_attention_heads() -> None:
    lv = level({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8})
    quirks.attention_heads(lv)
    assert (lv.hidden, lv.heads, lv.head_dim) == (16, 4, 4)
    assert lv.d["num_attention_heads"] == 4 and lv.d["num_key_value_heads"] == 2
    with pytest.raises(UsageError, match="multiple of the number of attention heads 3"):
        quirks.attention_heads(level({"hidden_size": 64, "num_attention_heads": 8}, heads=3))


def test_head_dim() -> None:
    lv = level({"head_dim": 256, "query_pre_attn_scalar": 256})
    lv.head_dim = 4
    quirks.head_dim(lv)
    assert lv.d == {"head_dim": 4, "query_pre_attn_scalar": 4}


def test_latent_attention() -> None:
    d = {"hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
         "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536}
    out = run_all(level(d))
    assert out["qk_rope_head_dim"] == out["qk_nope_head_dim"] == out["v_head_dim"] == 4
    assert out["kv_lora_rank"] == out["q_lora_rank"] == 16


def test_rotary_dim() -> None:
    gptj = {"n_embd": 4096, "n_head": 16, "rotary_dim": 64}  # a quarter of head_dim 256 rotates
    out = run_all(level(gptj, hidden=64, heads=2))
    assert out["rotary_dim"] == 32 // 4
    out = run_all(level(gptj))  # head_dim 4: a quarter would be 1 (odd): the whole head rotates
    assert out["rotary_dim"] == 4


def test_mamba2_heads() -> None:
    d = {"hidden_size": 2560, "num_heads": 80, "head_dim": 64, "expand": 2, "n_groups": 8}
    out = run_all(level(d))
    assert out["num_heads"] * out["head_dim"] == out["expand"] * out["hidden_size"]
    assert out["num_heads"] % out["n_groups"] == 0


def test_mrope_sections() -> None:
    d = {"hidden_size": 3584, "num_attention_heads": 28,
         "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]}}
    out = run_all(level(d, hidden=48, heads=4))
    assert sum(out["rope_parameters"]["mrope_section"]) == (48 // 4) // 2


def test_hidden() -> None:
    lv = level({"hidden_size": 768, "d_model": 768})
    lv.hidden = 16
    quirks.hidden(lv)
    assert lv.d == {"hidden_size": 16, "d_model": 16}


def test_intermediate() -> None:
    lv = level({"intermediate_size": [11008, 5504], "n_inner": None, "d_ff": 2048})
    quirks.intermediate(lv)
    assert lv.d == {"intermediate_size": [32, 32], "n_inner": 32, "d_ff": 32}


def test_experts() -> None:
    lv = level({"num_experts": 128, "num_experts_per_tok": 8, "n_shared_experts": 2,
                "n_group": 8, "topk_group": 4})
    quirks.experts(lv)
    assert lv.d == {"num_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "n_group": 1, "topk_group": 1}
    with pytest.raises(UsageError, match="experts per token 9"):
        quirks.experts(level({"num_experts": 8, "num_experts_per_tok": 2}, experts_per_tok=9))


def test_positions() -> None:
    lv = level({"max_position_embeddings": 131072, "sliding_window": 4096})
    quirks.positions(lv)
    assert lv.d == {"max_position_embeddings": 128, "sliding_window": 64}
    speech = level({"num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448})
    quirks.positions(speech)
    assert speech.d["max_source_positions"] == 1500 and speech.d["max_target_positions"] == 128


def test_vocab() -> None:
    lv = level({"vocab_size": 151936}, new_vocab=500)
    quirks.vocab(lv)
    assert lv.d["vocab_size"] == 500


def test_vision() -> None:
    lv = level({"image_size": 896, "patch_size": 14})
    quirks.vision(lv)
    assert lv.d == {"image_size": 32, "patch_size": 8}
    with pytest.raises(UsageError, match="multiple of patch size 8"):
        quirks.vision(level({"image_size": 896, "patch_size": 14}, image_size=30))
