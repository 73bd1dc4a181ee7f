"""``shrink_config``: a whole config (any depth of sub-configs) shrunk to a spec - each level
by ``mldebug.tiny.quirks.shrink_level``, then token ids, overrides and constraints from
``mldebug.tiny.shrink``. Above both, so neither imports the other."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from mldebug.errors import UsageError
from mldebug.tiny.quirks import shrink_level
from mldebug.tiny.shrink import (
    Change,
    ShrinkResult,
    ShrinkSpec,
    _fix_multimodal,
    _text_vocab,
    apply_overrides,
    check_constraints,
    check_source,
    collect_token_ids,
    is_sub_config,
    remap_token_ids,
    token_id_map,
)


def shrink_config(config: Mapping[str, Any], spec: ShrinkSpec,
                  token_ids: Mapping[int, int] | None = None) -> ShrinkResult:
    """Shrink a config dict (any depth of sub-configs) to ``spec``.

    ``token_ids`` pins special token ids to new ids (from a shrunk tokenizer); other ids at or
    above the new vocab move to the top free slots. Raises UsageError when a value the user
    passed breaks a constraint.
    """
    d = copy.deepcopy(dict(config))
    check_source(d)
    changes: list[Change] = []
    notes: list[str] = []
    src_vocab = _text_vocab(d)
    new_vocab = spec.vocab if src_vocab is None else min(src_vocab, spec.vocab)
    if "vocab" in spec.explicit:
        new_vocab = spec.vocab

    def walk(level: dict[str, Any], path: str) -> None:
        shrink_level(level, spec, path, changes, notes, new_vocab=new_vocab)
        for k, v in level.items():
            if is_sub_config(v):
                walk(v, f"{path}{k}.")
    walk(d, "")
    _fix_multimodal(d, "", changes)
    ids: set[int] = set()
    collect_token_ids(d, ids)
    mapping = token_id_map(ids, new_vocab, token_ids)
    remap_token_ids(d, mapping, "", changes)
    if spec.overrides:
        apply_overrides(d, spec.overrides, changes)
    bad = check_constraints(d)
    if bad:
        raise UsageError("constraint violated after shrinking: " + "; ".join(bad) + ".",
                         "Adjust the sizes (or the --set values) so these hold.")
    return ShrinkResult(d, changes, notes, {k: v for k, v in mapping.items() if k != v})
