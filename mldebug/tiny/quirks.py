"""How one config level is shrunk: one small function per model quirk, applied in ``QUIRKS`` order.

Adding support for a new kind of model means one function here, one entry in ``QUIRKS`` and its
test in ``tests/test_tiny_quirks.py``. Each function reads the source values from ``lv.d``,
writes the new ones with ``lv.set`` (which records a ``Change``), and may leave derived sizes
on ``lv`` (``hidden``, ``heads``, ``head_dim``) for the quirks after it. Pure: plain dicts only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mldebug.errors import UsageError
from mldebug.tiny.shrink import (
    ROLES,
    SET_WHEN_NONE,
    Change,
    ShrinkSpec,
    block_signatures,
    first_of_role,
    layer_keys,
    mrope_section,
    pick_heads,
    pick_kv,
    reindex_layers,
    scale_sections,
    select_layers,
    summarize,
)


@dataclass
class Level:
    """One config level being shrunk in place, and the sizes decided so far."""

    d: dict[str, Any]
    spec: ShrinkSpec
    path: str
    new_vocab: int
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    src_hidden: int | None = None  # the source's hidden size (before any change)
    src_heads: int | None = None
    hidden: int | None = None  # the new sizes, once decided
    heads: int | None = None
    head_dim: int | None = None

    def set(self, key: str, value: Any, why: str = "") -> None:
        if self.d.get(key) != value:
            self.changes.append(Change(self.path + key, summarize(self.d.get(key)), value, why))
            self.d[key] = value

    def explicit(self, name: str) -> bool:
        return name in self.spec.explicit

    def ints(self, role: str) -> list[str]:
        """Keys of this role that hold an integer here."""
        return [k for k in ROLES[role]
                if isinstance(self.d.get(k), int) and not isinstance(self.d.get(k), bool)]


def layers(lv: Level) -> None:
    """Keep ``--layers`` layers, at least one of each block type (layer_types, sparse steps...)."""
    lk = layer_keys(lv.d)
    if not lk:
        return
    main = "num_hidden_layers" if "num_hidden_layers" in lk else lk[0]
    n_src = lv.d[main]
    sigs = block_signatures(lv.d, n_src)
    n_types = len(set(sigs))
    want = min(n_src, lv.spec.layers)
    if n_types > want:
        if lv.explicit("layers") and lv.spec.layers < n_types:
            lv.notes.append(f"{lv.path or 'config'}: --layers {lv.spec.layers} raised to "
                            f"{n_types} to keep one layer of each of the {n_types} block types")
        want = min(n_src, n_types)
    kept = select_layers(sigs, want)
    for c in reindex_layers(lv.d, kept, n_src):
        c.path = lv.path + c.path
        lv.changes.append(c)
    for k in lk:
        lv.set(k, min(lv.d[k], len(kept)) if k != main else len(kept), "layers")


def attention_heads(lv: Level) -> None:
    """Heads that divide hidden (and give an even rotary width); kv heads that divide heads."""
    hid = first_of_role(lv.d, "hidden")
    heads_kv = first_of_role(lv.d, "heads")
    if hid:
        lv.src_hidden = hid[1]
        lv.hidden = lv.spec.hidden if lv.explicit("hidden") else min(hid[1], lv.spec.hidden)
    if not (heads_kv and lv.hidden):
        return
    lv.src_heads = heads_kv[1]
    lv.heads = pick_heads(lv.hidden, lv.spec.heads, heads_kv[1], lv.d, lv.explicit("heads"))
    lv.head_dim = lv.hidden // lv.heads
    for k in lv.ints("heads"):
        lv.set(k, lv.heads, "heads divide hidden")
    src_kv = first_of_role(lv.d, "kv_heads")
    kv = pick_kv(lv.heads, heads_kv[1], src_kv[1] if src_kv else None, lv.spec.kv_heads,
                 lv.explicit("kv_heads"))
    for k in lv.ints("kv_heads"):
        lv.set(k, kv, "kv heads divide heads")


def head_dim(lv: Level) -> None:
    """An explicit head_dim follows hidden / heads (gemma's query_pre_attn_scalar with it)."""
    if lv.head_dim is None:
        return
    for k in lv.ints("head_dim"):
        old = lv.d[k]
        lv.set(k, lv.head_dim, "hidden / heads")
        if lv.d.get("query_pre_attn_scalar") == old:
            lv.set("query_pre_attn_scalar", lv.head_dim, "follows head_dim")


def latent_attention(lv: Level) -> None:
    """Multi-head latent attention (deepseek): every head dim equal, ranks <= hidden."""
    if lv.head_dim is None or lv.hidden is None or not isinstance(lv.d.get("qk_rope_head_dim"), int):
        return
    for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "head_dim"):
        if isinstance(lv.d.get(k), int):
            lv.set(k, lv.head_dim, "latent attention head dims")
    for k in ("kv_lora_rank", "q_lora_rank"):
        if isinstance(lv.d.get(k), int):
            lv.set(k, min(lv.d[k], lv.hidden), "latent rank <= hidden")


def rotary_dim(lv: Level) -> None:
    """A rotary_dim (gptj, codegen) keeps its share of head_dim and stays even."""
    rd_src = lv.d.get("rotary_dim")
    if lv.head_dim is None or not isinstance(rd_src, int) or rd_src <= 0:
        return
    src_hd = (lv.src_hidden // lv.src_heads) if lv.src_hidden and lv.src_heads else lv.head_dim
    rd = lv.head_dim * rd_src // max(1, src_hd)
    lv.set("rotary_dim", rd if rd >= 2 and rd % 2 == 0 else lv.head_dim, "rotary part of head_dim")


def mamba2_heads(lv: Level) -> None:
    """Mamba2: heads x head_dim == expand x hidden, and n_groups divides heads."""
    if lv.heads is None or lv.hidden is None or not isinstance(lv.d.get("expand"), int) \
            or not isinstance(lv.d.get("head_dim"), int) or "n_groups" not in lv.d:
        return
    lv.set("head_dim", lv.hidden * lv.d["expand"] // lv.heads, "expand x hidden / heads")
    if isinstance(lv.d.get("n_groups"), int):
        lv.set("n_groups", math.gcd(lv.d["n_groups"], lv.heads), "groups divide heads")


def mrope_sections(lv: Level) -> None:
    """Multimodal rotary sections (qwen2-vl) must sum to head_dim / 2."""
    sections = mrope_section(lv.d)
    if lv.head_dim is None or not sections or sum(sections) == lv.head_dim // 2:
        return
    new_rope = dict(lv.d["rope_parameters"])
    new_rope["mrope_section"] = scale_sections(sections, lv.head_dim // 2)
    lv.set("rope_parameters", new_rope, "rotary sections sum to head_dim/2")


def hidden(lv: Level) -> None:
    """Every hidden-size alias gets the new hidden size."""
    if lv.hidden is None:
        return
    for k in lv.ints("hidden"):
        lv.set(k, lv.hidden, "hidden")


def intermediate(lv: Level) -> None:
    """Feed-forward widths, also per-layer lists of them and None-means-derived fields."""
    spec = lv.spec
    for k in ROLES["intermediate"]:
        v = lv.d.get(k)
        if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
            lv.set(k, [min(x, spec.intermediate) for x in v], "intermediate (per layer)")
            continue
        if isinstance(v, int) and v > 0 or (v is None and k in lv.d and k in SET_WHEN_NONE):
            target = spec.intermediate if lv.explicit("intermediate") else \
                min(v or spec.intermediate, spec.intermediate)
            lv.set(k, target, "intermediate")


def experts(lv: Level) -> None:
    """Mixture of experts: expert count, top-k <= experts, one shared expert, one group."""
    exp = first_of_role(lv.d, "experts")
    if not exp or exp[1] <= 0:
        return
    spec = lv.spec
    n_exp = spec.experts if lv.explicit("experts") else min(exp[1], spec.experts)
    for k in lv.ints("experts"):
        if lv.d[k] > 0:
            lv.set(k, n_exp, "experts")
    topk = first_of_role(lv.d, "experts_per_tok")
    if topk:
        if spec.experts_per_tok is not None:
            k_new = spec.experts_per_tok
            if k_new > n_exp or k_new < 1:
                raise UsageError(
                    f"constraint violated: experts per token {k_new} must be between 1 and "
                    f"the number of experts {n_exp}.",
                    f"Pass --experts-per-tok <= {n_exp} or more --experts.")
        else:
            k_new = min(topk[1], max(1, n_exp // 2))
        for k in lv.ints("experts_per_tok"):
            lv.set(k, k_new, "top-k <= experts")
    for k in lv.ints("shared_experts"):
        if lv.d[k] > 1:
            lv.set(k, 1, "shared experts")
    groups = lv.d.get("n_group")
    if isinstance(groups, int) and groups > 1:
        lv.set("n_group", 1, "expert groups divide experts")
        if isinstance(lv.d.get("topk_group"), int):
            lv.set("topk_group", 1, "topk_group <= n_group")


def positions(lv: Level) -> None:
    """Position tables shrink to ``--positions``; a sliding window stays inside them. A speech
    encoder (whisper: ``num_mel_bins``) keeps ``max_source_positions``: its feature extractor
    always yields 30 s = 2 x 1500 frames, and the encoder accepts exactly that many."""
    speech = "num_mel_bins" in lv.d
    for k in lv.ints("positions"):
        if speech and k == "max_source_positions":
            continue
        if lv.d[k] > 0:
            lv.set(k, min(lv.d[k], lv.spec.positions), "positions")
    sw = lv.d.get("sliding_window")
    if isinstance(sw, int) and sw > 0:
        lv.set("sliding_window", min(sw, max(2, lv.spec.positions // 2)), "window <= positions")


def vocab(lv: Level) -> None:
    """The vocab shrinks to the new tokenizer's size (token ids are remapped afterwards)."""
    if isinstance(lv.d.get("vocab_size"), int) and lv.d["vocab_size"] > lv.new_vocab:
        lv.set("vocab_size", lv.new_vocab, "vocab")


def vision(lv: Level) -> None:
    """A vision tower: image size a multiple of the patch size."""
    if not (isinstance(lv.d.get("image_size"), int) and isinstance(lv.d.get("patch_size"), int)):
        return
    image = lv.spec.image_size
    patch = min(lv.d["patch_size"], lv.spec.patch_size)
    if image % patch:
        raise UsageError(
            f"constraint violated: image size {image} must be a multiple of patch size {patch}.",
            "Pass --image-size that is a multiple of --patch-size.")
    lv.set("image_size", image if lv.explicit("image_size") else min(lv.d["image_size"], image),
           "image")
    lv.set("patch_size", patch, "patch")


# Order matters: layers first (per-layer lists), heads before every size derived from them.
QUIRKS: list[Callable[[Level], None]] = [
    layers, attention_heads, head_dim, latent_attention, rotary_dim, mamba2_heads,
    mrope_sections, hidden, intermediate, experts, positions, vocab, vision,
]


def shrink_level(d: dict[str, Any], spec: ShrinkSpec, path: str, changes: list[Change],
                 notes: list[str], *, new_vocab: int) -> None:
    """Shrink one config level in place (sub-configs are handled by the caller)."""
    lv = Level(d, spec, path, new_vocab, changes, notes)
    for quirk in QUIRKS:
        quirk(lv)
