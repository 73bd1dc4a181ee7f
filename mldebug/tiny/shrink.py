"""Shrink a transformers config dict: one canonical map of size-like fields, applied recursively.

Pure functions over plain dicts (a config's ``to_dict()``), so every rule is tested without
transformers or torch. The shrunk dict is what the config class is *constructed* from:
transformers 5 configs are strict dataclasses validated at construction, so derived fields
(``head_dim``, ``layer_types``, token ids) must be right before the config object exists.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mldebug.errors import UsageError

# Canonical roles -> every attribute name transformers models use for them.
ROLES: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model", "embed_dim", "dim", "model_dim", "n_embed",
               "projection_dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers",
               "encoder_layers", "decoder_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "d_kv", "kv_channels"),
    "intermediate": ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim",
                     "decoder_ffn_dim", "ffn_hidden_size", "moe_intermediate_size",
                     "shared_expert_intermediate_size"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "experts_per_tok": ("num_experts_per_tok", "moe_topk", "num_selected_experts"),
    "shared_experts": ("n_shared_experts", "num_shared_experts"),
    "positions": ("max_position_embeddings", "n_positions", "n_ctx", "max_source_positions",
                  "max_target_positions"),
    "vocab": ("vocab_size",),
    "image_size": ("image_size",),
    "patch_size": ("patch_size",),
}
# Size fields whose None means "derive it" and that we still set when asked to shrink.
SET_WHEN_NONE = {"n_inner"}
# Integer layer-count thresholds that must stay within the new layer count.
LAYER_THRESHOLDS = ("max_window_layers", "first_k_dense_replace")
# Lists of layer indices (not per-layer values).
INDEX_LIST_SUFFIX = "_layers"
TOKEN_ID_LISTS = ("begin_suppress_tokens", "suppress_tokens")


@dataclass
class ShrinkSpec:
    """Target sizes. ``explicit`` names the fields the user set (constraint errors blame those)."""

    hidden: int = 16
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None  # None: 2 for GQA sources, heads for MHA, 1 for MQA
    intermediate: int = 32
    vocab: int = 1024
    experts: int = 4
    experts_per_tok: int | None = None  # None: min(source, experts // 2 or 1)
    positions: int = 128
    image_size: int = 32
    patch_size: int = 8
    overrides: dict[str, Any] = field(default_factory=dict)  # --set key=value (dotted paths)
    explicit: frozenset[str] = frozenset()


@dataclass
class Change:
    """One field whose value changed; ``path`` is dotted through sub-configs."""

    path: str
    before: Any
    after: Any
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "before": self.before, "after": self.after, "why": self.why}


@dataclass
class ShrinkResult:
    config: dict[str, Any]
    changes: list[Change]
    notes: list[str]
    token_id_map: dict[int, int]


def role_of(key: str) -> str | None:
    for role, names in ROLES.items():
        if key in names:
            return role
    return None


def is_sub_config(value: Any) -> bool:
    return isinstance(value, Mapping) and "model_type" in value


def layer_keys(d: Mapping[str, Any]) -> list[str]:
    return [k for k in ROLES["layers"] if isinstance(d.get(k), int)]


def block_signatures(d: Mapping[str, Any], n_layers: int) -> list[tuple[Any, ...]]:
    """What kind of block each layer is: its entries in per-layer lists and index lists."""
    per_layer = per_layer_lists(d, n_layers)
    index_lists = index_lists_of(d, n_layers)
    sigs = []
    for i in range(n_layers):
        sig: list[Any] = [(k, _hashable(d[k][i])) for k in per_layer]
        sig += [(k, i in set(d[k])) for k in index_lists]
        step = d.get("decoder_sparse_step")
        if isinstance(step, int) and step > 1:
            sig.append(("decoder_sparse_step", (i + 1) % step == 0))
        k_dense = d.get("first_k_dense_replace")
        if isinstance(k_dense, int) and k_dense > 0:
            sig.append(("first_k_dense_replace", i < k_dense))
        window = d.get("max_window_layers")
        if isinstance(window, int) and d.get("use_sliding_window") and "layer_types" not in per_layer:
            sig.append(("max_window_layers", i >= window))
        sigs.append(tuple(sig))
    return sigs


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


PER_LAYER_NAMES = ("block_types", "attn_type_list", "layers_block_type", "hybrid_override_pattern")


def per_layer_lists(d: Mapping[str, Any], n_layers: int) -> list[str]:
    """Keys holding one value per layer (``layer_types``, ``mlp_layer_types``, ...)."""
    index_lists = set(index_lists_of(d, n_layers))
    return [k for k, v in d.items()
            if isinstance(v, (list, str)) and len(v) == n_layers and n_layers > 1
            and ("layer" in k or "pattern" in k or k in PER_LAYER_NAMES or role_of(k) is not None)
            and (isinstance(v, list) or k in PER_LAYER_NAMES)
            and not _is_token_key(k) and k not in index_lists]


def index_lists_of(d: Mapping[str, Any], n_layers: int) -> list[str]:
    """Keys holding lists of layer indices (``mlp_only_layers``, ...)."""
    return [k for k, v in d.items()
            if k.endswith(INDEX_LIST_SUFFIX) and isinstance(v, list)
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n_layers for x in v)
            and all(a < b for a, b in zip(v, v[1:], strict=False))]


def select_layers(signatures: list[tuple[Any, ...]], n: int) -> list[int]:
    """Indices of the layers to keep: one of each block type first, then the earliest others."""
    first_of: dict[tuple[Any, ...], int] = {}
    for i, s in enumerate(signatures):
        first_of.setdefault(s, i)
    keep = set(first_of.values())
    for i in range(len(signatures)):
        if len(keep) >= n:
            break
        keep.add(i)
    return sorted(keep)


def reindex_layers(d: dict[str, Any], kept: list[int], n_layers: int) -> list[Change]:
    """Edit per-layer lists, index lists and layer thresholds in ``d`` for the kept layers."""
    changes: list[Change] = []
    per_layer = per_layer_lists(d, n_layers)
    index_lists = index_lists_of(d, n_layers)
    old_mlp_only = set(d.get("mlp_only_layers") or [])
    for k in per_layer:
        new: Any = [d[k][i] for i in kept]
        if isinstance(d[k], str):
            new = "".join(new)
        changes.append(Change(k, summarize(d[k]), new, f"kept layers {kept}"))
        d[k] = new
    for k in index_lists:
        old = set(d[k])
        new = [pos for pos, i in enumerate(kept) if i in old]
        if new != d[k]:
            changes.append(Change(k, d[k], new, f"kept layers {kept}"))
            d[k] = new
    # Thresholds: express the kept layers' kinds with the new numbering.
    k_dense = d.get("first_k_dense_replace")
    if isinstance(k_dense, int) and k_dense > 0:
        new_k = sum(1 for i in kept if i < k_dense)
        if new_k != k_dense:
            changes.append(Change("first_k_dense_replace", k_dense, new_k, "kept layers"))
            d["first_k_dense_replace"] = new_k
    window = d.get("max_window_layers")
    if isinstance(window, int):
        new_w = sum(1 for i in kept if i < window)
        if new_w != window:
            changes.append(Change("max_window_layers", window, new_w, "kept layers"))
            d["max_window_layers"] = new_w
    step = d.get("decoder_sparse_step")
    if isinstance(step, int) and step > 1 and isinstance(d.get("mlp_only_layers"), list):
        dense = [pos for pos, i in enumerate(kept) if (i + 1) % step != 0 or i in old_mlp_only]
        changes.append(Change("decoder_sparse_step", step, 1, "sparse layers moved to mlp_only_layers"))
        d["decoder_sparse_step"] = 1
        d["mlp_only_layers"] = dense
    return changes


def summarize(v: Any) -> Any:
    if isinstance(v, list) and len(v) > 6:
        return f"[{len(v)} entries]"
    return v


def _partial_rotary(d: Mapping[str, Any]) -> float:
    for k in ("partial_rotary_factor", "rotary_pct"):
        if isinstance(d.get(k), (int, float)):
            return float(d[k])
    rope = d.get("rope_parameters")
    if isinstance(rope, Mapping) and isinstance(rope.get("partial_rotary_factor"), (int, float)):
        return float(rope["partial_rotary_factor"])
    return 1.0


def _uses_rope(d: Mapping[str, Any]) -> bool:
    return any(k in d for k in ("rope_parameters", "rope_theta", "rotary_pct", "rotary_dim",
                                "partial_rotary_factor"))


def first_of_role(d: Mapping[str, Any], role: str) -> tuple[str, Any] | None:
    for k in ROLES[role]:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            return k, d[k]
    return None


def pick_heads(hidden: int, want: int, src_heads: int, d: Mapping[str, Any],
                explicit: bool) -> int:
    """Heads that divide hidden and give an even rotary width; the user's value or an error."""
    rot = _partial_rotary(d) if _uses_rope(d) else 0.0
    min_hd = 2 * len(mrope_section(d) or [])  # each multimodal rope section needs >= 1 pair
    candidates = [want] if explicit else [h for h in range(min(want, src_heads), 0, -1)]
    for h in candidates:
        if h < 1 or hidden % h:
            continue
        hd = hidden // h
        if rot and int(hd * rot) % 2:
            continue
        if hd < min_hd:
            continue
        return h
    if min_hd and hidden % want == 0 and hidden // want < min_hd:
        raise UsageError(
            f"constraint violated: multimodal rotary sections {mrope_section(d)} need head_dim "
            f">= {min_hd}, but hidden {hidden} / heads {want} = {hidden // want}.",
            f"Pass fewer --heads or a larger --hidden (head_dim >= {min_hd}).")
    if hidden % want:
        raise UsageError(
            f"constraint violated: hidden size {hidden} must be a multiple of the number of "
            f"attention heads {want} (each head gets hidden/heads dimensions).",
            f"Pass --heads that divides --hidden (e.g. --heads {_divisor_near(hidden, want)}) "
            f"or a --hidden that is a multiple of {want} (e.g. --hidden {want * max(1, hidden // want + 1)}).")
    hd = hidden // want
    raise UsageError(
        f"constraint violated: rotary embeddings need an even rotary width, but head_dim "
        f"{hd} x partial_rotary_factor {rot:g} = {hd * rot:g}.",
        f"Pass a --hidden/--heads pair whose head_dim x {rot:g} is even (e.g. --heads {max(1, want // 2)}).")


def mrope_section(d: Mapping[str, Any]) -> list[int] | None:
    rope = d.get("rope_parameters")
    if isinstance(rope, Mapping) and isinstance(rope.get("mrope_section"), list):
        return list(rope["mrope_section"])
    return None


def scale_sections(sections: list[int], total: int) -> list[int]:
    """Proportional integer sections summing to ``total``, each at least 1."""
    s = sum(sections) or 1
    out = [max(1, sec * total // s) for sec in sections]
    while sum(out) > total:
        i = max(range(len(out)), key=lambda j: out[j])
        out[i] -= 1
    out[0] += total - sum(out)
    return out


def _divisor_near(n: int, want: int) -> int:
    divs = [k for k in range(1, n + 1) if n % k == 0]
    return min(divs, key=lambda k: (abs(k - want), -k))


def pick_kv(heads: int, src_heads: int, src_kv: int | None, want: int | None,
             explicit: bool) -> int:
    if want is not None and explicit:
        if want < 1 or heads % want:
            raise UsageError(
                f"constraint violated: key/value heads {want} must divide attention heads {heads} "
                "(grouped-query attention shares each kv head among heads/kv query heads).",
                f"Pass --kv-heads that divides {heads}, e.g. --kv-heads {_divisor_near(heads, want)}.")
        return want
    if src_kv is None or src_kv == src_heads:
        return heads  # multi-head attention stays multi-head
    if src_kv == 1:
        return 1  # multi-query stays multi-query
    target = want if want is not None else 2
    return math.gcd(heads, target) or 1


def _text_vocab(d: Mapping[str, Any]) -> int | None:
    if isinstance(d.get("vocab_size"), int):
        return int(d["vocab_size"])
    for key in ("text_config", "decoder", "language_config", "llm_config"):
        sub = d.get(key)
        if isinstance(sub, Mapping) and isinstance(sub.get("vocab_size"), int):
            return int(sub["vocab_size"])
    return None


def collect_token_ids(d: Mapping[str, Any], out: set[int]) -> None:
    for k, v in d.items():
        if is_sub_config(v) or (isinstance(v, Mapping) and k.endswith("config")):
            collect_token_ids(v, out)
        elif _is_token_key(k):
            for x in _ints(v):
                out.add(x)


def _is_token_key(k: str) -> bool:
    return (k.endswith("_token_id") or k.endswith("_token_ids") or k.endswith("_token_index")
            or k in TOKEN_ID_LISTS)


def _ints(v: Any) -> list[int]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [x for item in v for x in _ints(item)]
    return []


def token_id_map(ids: set[int], new_vocab: int, fixed: Mapping[int, int] | None = None) -> dict[int, int]:
    """Old id -> new id: ids below the vocab stay; the rest take the top free slots in order."""
    mapping = dict(fixed or {})
    taken = set(mapping.values()) | {i for i in ids if 0 <= i < new_vocab and i not in mapping}
    slot = new_vocab - 1
    for old in sorted(i for i in ids if i >= new_vocab and i not in mapping):
        while slot in taken and slot >= 0:
            slot -= 1
        if slot < 0:
            raise UsageError(f"vocab {new_vocab} is too small to hold the special token ids.",
                             "Pass a larger --vocab.")
        mapping[old] = slot
        taken.add(slot)
    return mapping


def remap_token_ids(d: dict[str, Any], mapping: Mapping[int, int], path: str,
                    changes: list[Change]) -> None:
    for k, v in list(d.items()):
        if is_sub_config(v) or (isinstance(v, dict) and k.endswith("config")):
            remap_token_ids(v, mapping, f"{path}{k}.", changes)
        elif _is_token_key(k):
            new = _map_ids(v, mapping)
            if new != v:
                changes.append(Change(path + k, v, new, "token id inside the new vocab"))
                d[k] = new


def _map_ids(v: Any, mapping: Mapping[int, int]) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return mapping.get(v, v)
    if isinstance(v, list):
        return [_map_ids(x, mapping) for x in v]
    return v


def _fix_multimodal(d: dict[str, Any], path: str, changes: list[Change]) -> None:
    """Token counts per image follow the shrunk vision tower (gemma3, llava)."""
    vision = d.get("vision_config")
    if not isinstance(vision, Mapping):
        return
    image, patch = vision.get("image_size"), vision.get("patch_size")
    if not (isinstance(image, int) and isinstance(patch, int) and patch):
        return
    side = image // patch
    if isinstance(d.get("mm_tokens_per_image"), int):
        tokens_side = math.isqrt(d["mm_tokens_per_image"])
        new_side = max(k for k in range(1, side + 1) if side % k == 0 and k <= max(1, side // 2))
        new = new_side * new_side
        if new != d["mm_tokens_per_image"] or tokens_side != new_side:
            changes.append(Change(path + "mm_tokens_per_image", d["mm_tokens_per_image"], new,
                                  "pooled patches per image"))
            d["mm_tokens_per_image"] = new
    if isinstance(d.get("image_seq_length"), int):
        new = side * side
        if new != d["image_seq_length"]:
            changes.append(Change(path + "image_seq_length", d["image_seq_length"], new,
                                  "patches per image"))
            d["image_seq_length"] = new


def apply_overrides(d: dict[str, Any], overrides: Mapping[str, Any], changes: list[Change]) -> None:
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        cur: Any = d
        for p in parts[:-1]:
            if not isinstance(cur, dict) or p not in cur or not isinstance(cur[p], dict):
                raise UsageError(f"--set {dotted}: the config has no sub-config {p!r}.",
                                 "Use a dotted path that exists, e.g. text_config.hidden_size=32.")
            cur = cur[p]
        last = parts[-1]
        if last not in cur:
            raise UsageError(f"--set {dotted}: the config has no field {last!r}.",
                             f"Fields here: {', '.join(sorted(k for k in cur if not k.startswith('_'))[:20])} ...")
        _check_override_type(dotted, cur[last], value)
        changes.append(Change(dotted, summarize(cur[last]), value, "--set"))
        cur[last] = value


def _check_override_type(dotted: str, current: Any, value: Any) -> None:
    """``--set hidden_size=abc``: a number field gets a number (a one-line error otherwise)."""
    if isinstance(current, bool) or current is None:
        return
    if isinstance(current, int) and not (isinstance(value, int) and not isinstance(value, bool)):
        raise UsageError(f"--set {dotted}={json.dumps(value)}: {dotted} is an integer "
                         f"(now {current}).", f"Pass a whole number, e.g. --set {dotted}={current}.")
    if isinstance(current, float) and (isinstance(value, bool)
                                       or not isinstance(value, (int, float))
                                       or not math.isfinite(value)):
        raise UsageError(f"--set {dotted}={json.dumps(value)}: {dotted} is a finite number "
                         f"(now {current:g}).", f"Pass a number, e.g. --set {dotted}={current:g}.")


def check_source(d: Mapping[str, Any], path: str = "") -> None:
    """Sizes a model cannot have (0 heads, negative layers) are the source's fault: say so."""
    for role in ("hidden", "heads", "layers"):
        for k in ROLES[role]:
            v = d.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v < 1:
                raise UsageError(f"the source config has {path}{k}={v}; a model needs at least 1.",
                                 f"Fix {k} in the config.json (the real model's value).")
    for k, v in d.items():
        if is_sub_config(v):
            check_source(v, f"{path}{k}.")


def check_constraints(d: Mapping[str, Any], path: str = "") -> list[str]:
    """Every divisibility / range constraint the shrink must keep; returns violations."""
    bad: list[str] = []
    hid, heads = first_of_role(d, "hidden"), first_of_role(d, "heads")
    if hid and heads and heads[1] and hid[1] % heads[1]:
        bad.append(f"{path}{hid[0]}={hid[1]} is not a multiple of {heads[0]}={heads[1]}")
    kv = first_of_role(d, "kv_heads")
    if kv and heads and kv[1] and heads[1] % kv[1]:
        bad.append(f"{path}{kv[0]}={kv[1]} does not divide {heads[0]}={heads[1]}")
    exp, topk = first_of_role(d, "experts"), first_of_role(d, "experts_per_tok")
    if exp and topk and exp[1] > 0 and topk[1] > exp[1]:
        bad.append(f"{path}{topk[0]}={topk[1]} exceeds {exp[0]}={exp[1]}")
    lk = layer_keys(d)
    if "num_hidden_layers" in lk:
        for k in ("layer_types", "mlp_layer_types"):
            if isinstance(d.get(k), list) and len(d[k]) != d["num_hidden_layers"]:
                bad.append(f"{path}{k} has {len(d[k])} entries but num_hidden_layers="
                           f"{d['num_hidden_layers']}")
    vocab = _text_vocab(d)
    if vocab:
        ids: set[int] = set()
        collect_token_ids(d, ids)
        for i in sorted(ids):
            if i >= vocab:
                bad.append(f"{path}token id {i} is outside the vocab of {vocab}")
    for k, v in d.items():
        if is_sub_config(v):
            bad += check_constraints(v, f"{path}{k}.")
    return bad
