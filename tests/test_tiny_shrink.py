"""Pure shrink rules over config dicts: no model is built here."""

from __future__ import annotations

import pytest

from mldebug.errors import UsageError
from mldebug.tiny.dataset import choose_indices, fit_size
from mldebug.tiny.layers import plan_layers, rename_map, stack_of
from mldebug.tiny.shrink import (
    ShrinkSpec,
    block_signatures,
    check_constraints,
    select_layers,
    token_id_map,
)
from mldebug.tiny.shrinker import shrink_config


def llama_like(**kw):
    d = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
         "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    d.update(kw)
    return d


def test_widths_and_derived_fields_follow_the_shrink():
    r = shrink_config(llama_like(), ShrinkSpec())
    c = r.config
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (16, 4, 2)
    assert c["head_dim"] == 4  # not the stale 128
    assert c["num_hidden_layers"] == 2 and c["intermediate_size"] == 32
    assert c["vocab_size"] == 1024 and c["max_position_embeddings"] == 128
    assert check_constraints(c) == []
    paths = {ch.path for ch in r.changes}
    assert {"hidden_size", "head_dim", "num_key_value_heads"} <= paths


def test_attention_kind_is_kept_mha_and_mqa():
    mha = shrink_config(llama_like(num_key_value_heads=32), ShrinkSpec()).config
    assert mha["num_key_value_heads"] == mha["num_attention_heads"] == 4
    mqa = shrink_config(llama_like(num_key_value_heads=1), ShrinkSpec()).config
    assert mqa["num_key_value_heads"] == 1


def test_layer_types_keep_one_layer_of_each_type_in_lockstep():
    types = ["sliding_attention"] * 5 + ["full_attention"]
    d = llama_like(num_hidden_layers=24, layer_types=types * 4)
    r = shrink_config(d, ShrinkSpec(layers=2))
    assert r.config["num_hidden_layers"] == 2
    assert r.config["layer_types"] == ["sliding_attention", "full_attention"]
    # three block types with --layers 2: raised to 3, with a note
    d3 = llama_like(num_hidden_layers=6, layer_types=["a", "a", "b", "b", "c", "c"])
    r3 = shrink_config(d3, ShrinkSpec(layers=2, explicit=frozenset({"layers"})))
    assert r3.config["layer_types"] == ["a", "b", "c"] and r3.config["num_hidden_layers"] == 3
    assert any("raised to 3" in n for n in r3.notes)


def test_moe_experts_top_k_and_dense_layer_indices():
    d = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
         "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
         "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
         "num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": [0, 1, 2],
         "decoder_sparse_step": 1}
    r = shrink_config(d, ShrinkSpec())
    c = r.config
    assert c["num_experts"] == 4 and c["num_experts_per_tok"] == 2
    assert c["moe_intermediate_size"] == 32
    # layer 0 is dense (mlp_only), layer 3 the first sparse one: both block kinds kept
    assert c["num_hidden_layers"] == 2 and c["mlp_only_layers"] == [0]
    with pytest.raises(UsageError, match="experts per token 8"):
        shrink_config(d, ShrinkSpec(experts_per_tok=8))


def test_nested_sub_configs_and_token_ids_move_inside_the_vocab():
    d = {"model_type": "gemma3", "image_token_index": 262144, "boi_token_index": 255999,
         "mm_tokens_per_image": 256,
         "text_config": {"model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2304,
                         "num_hidden_layers": 26, "num_attention_heads": 8,
                         "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                         "intermediate_size": 9216, "bos_token_id": 2, "eos_token_id": [1, 106],
                         "pad_token_id": 0, "sliding_window": 4096,
                         "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4
                         + ["sliding_attention"] * 2},
         "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                           "num_hidden_layers": 27, "num_attention_heads": 16,
                           "intermediate_size": 4304, "image_size": 896, "patch_size": 14}}
    r = shrink_config(d, ShrinkSpec())
    c = r.config
    t, v = c["text_config"], c["vision_config"]
    assert t["hidden_size"] == 16 and t["head_dim"] == 4 and t["query_pre_attn_scalar"] == 4
    assert t["layer_types"] == ["sliding_attention", "full_attention"]
    assert v["hidden_size"] == 16 and v["num_hidden_layers"] == 2
    assert v["image_size"] == 32 and v["patch_size"] == 8
    assert c["mm_tokens_per_image"] == 4  # 4x4 patches pooled to 2x2
    ids = [c["image_token_index"], c["boi_token_index"], *t["eos_token_id"]]
    assert all(0 <= i < 1024 for i in ids) and len(set(ids)) == len(ids)
    assert t["eos_token_id"][0] == 1  # ids already inside the vocab stay


def test_pinned_token_ids_from_the_tokenizer_win():
    m = token_id_map({1, 2, 50256}, 100, fixed={50256: 7})
    assert m[50256] == 7 and m.get(1, 1) == 1 and 2 not in m
    m2 = token_id_map({5, 500, 600}, 100)
    assert m2[500] == 99 and m2[600] == 98


def test_user_constraint_violations_name_the_constraint():
    with pytest.raises(UsageError) as e:
        shrink_config(llama_like(), ShrinkSpec(hidden=16, heads=3,
                                               explicit=frozenset({"hidden", "heads"})))
    assert "multiple of the number of attention heads 3" in e.value.message
    assert "--heads" in e.value.fix
    with pytest.raises(UsageError, match="must divide attention heads 4"):
        shrink_config(llama_like(), ShrinkSpec(kv_heads=3, explicit=frozenset({"kv_heads"})))


def test_partial_rotary_width_stays_even():
    # gpt_neox: rotary on 25% of head_dim; 16/4 heads = 4 dims -> 1 rotary dim is odd
    d = {"model_type": "gpt_neox", "vocab_size": 50432, "hidden_size": 6144,
         "num_hidden_layers": 44, "num_attention_heads": 64, "intermediate_size": 24576,
         "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}
    c = shrink_config(d, ShrinkSpec()).config
    assert int(c["hidden_size"] // c["num_attention_heads"] * 0.25) % 2 == 0
    with pytest.raises(UsageError, match="even rotary width"):
        shrink_config(d, ShrinkSpec(heads=4, explicit=frozenset({"heads"})))


def test_set_overrides_and_bad_paths():
    r = shrink_config(llama_like(rms_norm_eps=1e-6), ShrinkSpec(overrides={"rms_norm_eps": 1e-5}))
    assert r.config["rms_norm_eps"] == 1e-5
    with pytest.raises(UsageError, match="no field 'nope'"):
        shrink_config(llama_like(rms_norm_eps=1e-6), ShrinkSpec(overrides={"nope": 1}))
    with pytest.raises(UsageError, match="num_hidden_layers"):
        shrink_config(llama_like(), ShrinkSpec(overrides={"layer_types": ["full_attention"] * 3}))


def test_select_layers_and_signatures():
    sigs = block_signatures({"layer_types": ["f", "f", "f", "s"] * 2}, 8)
    assert select_layers(sigs, 2) == [0, 3]
    assert select_layers(sigs, 4) == [0, 1, 2, 3]


def test_plan_layers_and_tensor_renames():
    d = llama_like(num_hidden_layers=8, layer_types=["full_attention"] * 3 + ["sliding_attention"]
                   + ["full_attention"] * 4)
    plan = plan_layers(d, 2)
    assert plan.config["num_hidden_layers"] == 2
    assert plan.config["layer_types"] == ["full_attention", "sliding_attention"]
    assert plan.config["hidden_size"] == 4096  # widths untouched
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(8)] + ["model.norm.weight"]
    ren = rename_map(names, plan.levels)
    assert ren == {"model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
                   "model.layers.3.mlp.up_proj.weight": "model.layers.1.mlp.up_proj.weight",
                   "model.norm.weight": "model.norm.weight"}
    assert stack_of("transformer.h.11.attn.c_attn.weight") == ("transformer.h", 11,
                                                               "attn.c_attn.weight")
    with pytest.raises(UsageError, match="nothing to shrink"):
        plan_layers(llama_like(num_hidden_layers=2), 2)


def test_dataset_selection_and_image_fit():
    assert choose_indices(None, 10, 3, "first", 0) == [0, 1, 2]
    r = choose_indices(None, 100, 5, "random", 1)
    assert len(r) == 5 and r == sorted(r) and r == choose_indices(None, 100, 5, "random", 1)
    labels = ["a"] * 50 + ["b"] * 49 + ["c"]
    s = choose_indices(labels, 100, 4, "stratified", 0)
    assert {labels[i] for i in s} == {"a", "b", "c"} and len(s) == 4
    with pytest.raises(UsageError, match="3 distinct values"):
        choose_indices(labels, 100, 2, "stratified", 0)
    assert fit_size(200, 100, 32) == (32, 16)
    assert fit_size(20, 10, 32) == (20, 10)


def test_config_token_ids_survive_tokenizer_shrinking() -> None:
    from mldebug.tiny.tokenizer import shrink_tokenizer_json

    vocab = {f"word{i}": i for i in range(26)} | {"<img>": 40}
    tj = {"model": {"type": "WordLevel", "vocab": vocab, "unk_token": "word0"}, "added_tokens": []}
    new, old_to_new = shrink_tokenizer_json(tj, 10, keep_ids={40, 99})
    assert old_to_new[40] == 8  # kept, renumbered densely after the 8 lowest ids
    assert len(new["model"]["vocab"]) == 9  # one slot left free for id 99, absent from the tokenizer
    m = token_id_map({40, 99}, 10, fixed=old_to_new)
    assert m[40] == 8 and m[99] == 9


def test_sparse_step_becomes_explicit_dense_layers() -> None:
    # qwen2_moe-style: every 2nd layer is sparse, layer 1 forced dense via mlp_only_layers
    d = {"model_type": "qwen2_moe", "num_hidden_layers": 8, "hidden_size": 64,
         "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
         "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    c = shrink_config(d, ShrinkSpec(layers=3, explicit=frozenset({"layers"}))).config
    # kinds: layer 0 dense (step), 1 dense (mlp_only), 3 sparse -> kept [0, 1, 3]
    assert c["num_hidden_layers"] == 3 and c["decoder_sparse_step"] == 1
    assert c["mlp_only_layers"] == [0, 1]


def test_architecture_specific_derived_sizes() -> None:
    # deepseek multi-head latent attention: every head dim and the latent ranks follow
    ds = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
          "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
          "head_dim": 64, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
          "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 256,
          "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
          "rope_parameters": {"rope_type": "default"}}
    c = shrink_config(ds, ShrinkSpec()).config
    assert c["qk_rope_head_dim"] == c["qk_nope_head_dim"] == c["v_head_dim"] == 4
    assert c["kv_lora_rank"] == c["q_lora_rank"] == 16
    assert (c["n_group"], c["topk_group"], c["n_routed_experts"]) == (1, 1, 4)
    assert c["num_hidden_layers"] == 2 and c["first_k_dense_replace"] == 1  # one dense, one MoE
    # gptj: partial rotary given in dims, kept even and within head_dim
    gj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "rotary_dim": 64}
    c = shrink_config(gj, ShrinkSpec()).config
    assert c["rotary_dim"] <= c["n_embd"] // c["n_head"] and c["rotary_dim"] % 2 == 0
    # mamba2: ssm heads x head_dim == expand x hidden, groups divide heads
    m2 = {"model_type": "mamba2", "hidden_size": 4096, "num_heads": 128, "head_dim": 64,
          "expand": 2, "n_groups": 8, "num_hidden_layers": 64}
    c = shrink_config(m2, ShrinkSpec()).config
    assert c["num_heads"] * c["head_dim"] == c["expand"] * c["hidden_size"]
    assert c["num_heads"] % c["n_groups"] == 0
    # per-layer flag lists (smollm3 no_rope_layers) and per-layer sizes (gemma3n)
    sm = llama_like(num_hidden_layers=6, no_rope_layers=[1, 1, 1, 0, 1, 1],
                    intermediate_size=[9000] * 6)
    c = shrink_config(sm, ShrinkSpec()).config
    assert c["no_rope_layers"] == [1, 0] and c["intermediate_size"] == [32, 32]


def test_multimodal_rope_sections_sum_to_half_head_dim() -> None:
    d = llama_like(rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]})
    c = shrink_config(d, ShrinkSpec()).config
    hd = c["hidden_size"] // c["num_attention_heads"]
    sec = c["rope_parameters"]["mrope_section"]
    assert sum(sec) == hd // 2 and min(sec) >= 1
