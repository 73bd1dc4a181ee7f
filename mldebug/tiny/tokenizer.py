"""Shrink a tokenizer to a small vocab, or train a tiny one when the source has none.

``shrink_tokenizer_json`` is pure (a tokenizer.json dict in, a smaller one out): it keeps the
lowest ids plus every special token and the alphabet that lets the tokenizer encode any text
(byte-level bytes, byte-fallback ``<0xNN>`` pieces, single ASCII characters), renumbers them
densely, keeps the BPE merges whose parts and result survive, and re-points the post-processor.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError
from mldebug.tiny import spm
from mldebug.tiny.corpus import CORPUS, SAMPLE_TEXT

DEFAULT_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


@dataclass
class TokenizerResult:
    kind: str  # "shrunk-json" | "shrunk-spm" | "trained"
    vocab_size: int  # tokens in the new tokenizer
    source_vocab_size: int | None
    id_map: dict[int, int] = field(default_factory=dict)  # old id -> new id, kept tokens
    role_ids: dict[str, int] = field(default_factory=dict)  # bos/eos/pad/unk -> new id
    notes: list[str] = field(default_factory=list)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def _walk(obj: Any) -> Iterator[dict[str, Any]]:
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def _is_byte_level(tj: dict[str, Any]) -> bool:
    return any(d.get("type") == "ByteLevel"
               for part in ("pre_tokenizer", "decoder") for d in _walk(tj.get(part)))


def _vocab_items(model: dict[str, Any]) -> list[tuple[str, int]]:
    vocab = model["vocab"]
    if model["type"] == "Unigram":
        return [(piece, i) for i, (piece, _score) in enumerate(vocab)]
    return list(vocab.items())


def forced_tokens(tj: dict[str, Any]) -> set[str]:
    """Tokens that must survive: specials, unk, and the alphabet."""
    model = tj["model"]
    present = {tok for tok, _ in _vocab_items(model)}
    keep = {t["content"] for t in tj.get("added_tokens") or [] if t["content"] in present}
    unk = model.get("unk_token")
    if model["type"] == "Unigram" and model.get("unk_id") is not None:
        unk = model["vocab"][model["unk_id"]][0]
    if unk:
        keep.add(unk)
    if model["type"] == "BPE" and _is_byte_level(tj):
        keep |= set(bytes_to_unicode().values()) & present
    if model.get("byte_fallback"):
        keep |= {f"<0x{b:02X}>" for b in range(256)} & present
    prefix = model.get("continuing_subword_prefix") or ""
    for c in (chr(i) for i in range(33, 127)):
        for t in (c, "\u2581" + c, prefix + c if prefix else None):
            if t and t in present:
                keep.add(t)
    if "\u2581" in present:
        keep.add("\u2581")
    return keep


def shrink_tokenizer_json(tj: dict[str, Any], n: int, keep_ids: set[int] | frozenset[int] = frozenset(),
                          ) -> tuple[dict[str, Any], dict[int, int]]:
    """A tokenizer.json with at most ``n`` tokens, and old id -> new id for every kept token.

    ``keep_ids`` are ids the model config refers to (special/image tokens): they survive too.
    """
    tj = copy.deepcopy(tj)
    model = tj["model"]
    kind = model.get("type")
    if kind not in ("BPE", "WordPiece", "WordLevel", "Unigram"):
        raise UsageError(f"tokenizer model type {kind!r} cannot be shrunk.",
                         "Pass --no-tokenizer, or a source with a BPE/WordPiece/Unigram tokenizer.")
    items = _vocab_items(model)
    by_id = {i: tok for tok, i in items}
    added = {t["id"]: t["content"] for t in tj.get("added_tokens") or []}
    forced_tok = forced_tokens(tj)
    all_ids = sorted(set(by_id) | set(added))
    forced = {i for tok, i in items if tok in forced_tok} | set(added) | (set(keep_ids) & set(all_ids))
    # config ids the tokenizer lacks (an image token, say) need free slots of their own
    reserve = len(set(keep_ids) - set(all_ids))
    kept = spm.choose_kept(all_ids, forced, max(1, n - reserve))
    old_to_new = {old: new for new, old in enumerate(kept)}
    if kind == "Unigram":
        model["vocab"] = [model["vocab"][i] if i in by_id else [added[i], 0.0] for i in kept]
        if model.get("unk_id") is not None:
            model["unk_id"] = old_to_new[model["unk_id"]]
    else:
        new_vocab = {(by_id.get(i) or added[i]): old_to_new[i] for i in kept}
        model["vocab"] = new_vocab
        if kind == "BPE":
            model["merges"] = [m for m in model.get("merges") or [] if _merge_kept(m, new_vocab)]
    for t in tj.get("added_tokens") or []:
        t["id"] = old_to_new[t["id"]]
    tok_to_new = {(by_id.get(i) or added[i]): old_to_new[i] for i in kept}
    _remap_post_processor(tj.get("post_processor"), tok_to_new)
    return tj, old_to_new


def _merge_kept(m: Any, vocab: dict[str, int]) -> bool:
    a, b = m.split(" ", 1) if isinstance(m, str) else m
    return a in vocab and b in vocab and (a + b) in vocab


def _remap_post_processor(pp: Any, tok_to_new: dict[str, int]) -> None:
    for d in _walk(pp):
        if "ids" in d and "tokens" in d:
            d["ids"] = [tok_to_new.get(t, i) for t, i in zip(d["tokens"], d["ids"], strict=False)]
        for key in ("sep", "cls"):
            v = d.get(key)
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str):
                d[key] = [v[0], tok_to_new.get(v[0], v[1])]


def train_tokenizer_json(n: int, specials: tuple[str, ...] = DEFAULT_SPECIALS) -> dict[str, Any]:
    """A byte-level BPE trained on the built-in corpus: encodes any text, at most ``n`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS.split("\n"), trainer=trainer)
    return dict(json.loads(tok.to_str()))


def spm_to_tokenizer_json(model_bytes: bytes) -> dict[str, Any]:
    """A fast (tokenizers) equivalent of a SentencePiece model, built from its pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = spm.read_pieces(model_bytes)
    unk = next((i for i, p in enumerate(pieces) if p.type == spm.UNKNOWN), 0)
    byte_fallback = any(p.type == spm.BYTE for p in pieces)
    if spm.model_type(model_bytes) == "bpe":
        vocab = {p.piece: i for i, p in enumerate(pieces)}
        merges = _merges_from_vocab(vocab, {p.piece: p.score for p in pieces})
        model: Any = models.BPE(vocab=vocab, merges=merges, unk_token=pieces[unk].piece,
                                byte_fallback=byte_fallback, fuse_unk=True)
    else:
        model = models.Unigram([(p.piece, p.score) for p in pieces], unk_id=unk,
                               byte_fallback=byte_fallback)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    dec: list[Any] = [decoders.Metaspace(replacement="\u2581", prepend_scheme="always")]
    if byte_fallback:
        dec = [decoders.ByteFallback(), *dec]
    tok.decoder = decoders.Sequence(dec)
    specials = [p.piece for p in pieces if p.type in (spm.CONTROL, spm.UNKNOWN, spm.USER_DEFINED)]
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return dict(json.loads(tok.to_str()))


def _merges_from_vocab(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece BPE vocab: each piece from two shorter pieces."""
    found = []
    for piece, pid in vocab.items():
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in vocab and b in vocab:
                found.append((pid, vocab[a], vocab[b], a, b))
    found.sort()
    return [(a, b) for _pid, _ia, _ib, a, b in found]


def _special_roles(cfg: dict[str, Any], tj: dict[str, Any], old_to_new: dict[int, int]) -> dict[str, int]:
    roles = {}
    vocab_of = _token_lookup(tj)
    for role in ("bos", "eos", "pad", "unk"):
        tok = cfg.get(f"{role}_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str) and tok in vocab_of:
            roles[role] = vocab_of[tok]
    return roles


def _token_lookup(tj: dict[str, Any]) -> dict[str, int]:
    model = tj["model"]
    out = {tok: i for tok, i in _vocab_items(model)}
    for t in tj.get("added_tokens") or []:
        out[t["content"]] = t["id"]
    return out


def make_tokenizer(source_dir: Path | None, n: int, out_dir: Path,
                   keep_ids: set[int] | frozenset[int] = frozenset(),
                   extra_specials: dict[str, str] | None = None) -> TokenizerResult:
    """Write a tokenizer of at most ``n`` tokens into ``out_dir`` and validate it.

    ``extra_specials`` (attribute -> token text, e.g. ``image_token``: ``<image>``) are tokens a
    processor looks up: a trained tokenizer gets them as special tokens, and the config keys
    that point at them are pinned to their ids through ``role_ids``.
    """
    extra = dict(extra_specials or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_cfg: dict[str, Any] = {}
    if source_dir and (source_dir / "tokenizer_config.json").is_file():
        tok_cfg = json.loads((source_dir / "tokenizer_config.json").read_text())
    tj_path = source_dir / "tokenizer.json" if source_dir else None
    spm_path = next((source_dir / s for s in ("tokenizer.model", "spiece.model",
                                               "sentencepiece.bpe.model")
                     if source_dir and (source_dir / s).is_file()), None)
    notes: list[str] = []
    if tj_path and tj_path.is_file():
        src = json.loads(tj_path.read_text())
        src_size = len(_token_lookup(src))
        new, old_to_new = shrink_tokenizer_json(src, n, keep_ids)
        kind = "shrunk-json"
        if spm_path:
            notes.append(f"{spm_path.name} not copied: tokenizer.json is the tokenizer now")
    elif spm_path:
        data = spm_path.read_bytes()
        src_size = len(spm.read_pieces(data))
        trimmed, kept = spm.trim(data, n, keep_ids)
        (out_dir / spm_path.name).write_bytes(trimmed)
        _check_spm(out_dir / spm_path.name, n)
        new = spm_to_tokenizer_json(trimmed)
        old_to_new = {old: new_i for new_i, old in enumerate(kept)}
        kind = "shrunk-spm"
        notes.append(f"{spm_path.name} trimmed to {len(kept)} pieces; tokenizer.json built from it")
        tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    else:
        new = train_tokenizer_json(n, DEFAULT_SPECIALS + tuple(extra.values()))
        old_to_new = {}
        src_size = None
        kind = "trained"
        notes.append("source has no tokenizer: trained a byte-level BPE on the built-in corpus")
        tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "model_max_length": 128}
    (out_dir / "tokenizer.json").write_text(json.dumps(new, ensure_ascii=False))
    tok_cfg.pop("vocab_file", None)
    tok_cfg.pop("merges_file", None)
    if isinstance(tok_cfg.get("added_tokens_decoder"), dict):
        tok_cfg["added_tokens_decoder"] = {
            str(old_to_new[int(k)]): v for k, v in tok_cfg["added_tokens_decoder"].items()
            if int(k) in old_to_new}
    lookup = _token_lookup(new)
    present = {name: text for name, text in extra.items() if text in lookup}
    if present:
        tok_cfg["extra_special_tokens"] = {**(tok_cfg.get("extra_special_tokens") or {}),
                                           **present}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False))
    if source_dir:
        for name in ("special_tokens_map.json", "chat_template.jinja"):
            if (source_dir / name).is_file():
                shutil.copy2(source_dir / name, out_dir / name)
    size = len(lookup)
    validate_tokenizer(out_dir, n)
    roles = _special_roles(tok_cfg, new, old_to_new)
    roles.update({name: lookup[text] for name, text in present.items()})
    return TokenizerResult(kind, size, src_size, old_to_new, roles, notes)


def _check_spm(path: Path, n: int) -> None:
    import sentencepiece as sp

    proc = sp.SentencePieceProcessor(model_file=str(path))
    ids = proc.encode(SAMPLE_TEXT)
    if proc.get_piece_size() > n or any(i >= n for i in ids):
        raise MldebugError(f"the trimmed {path.name} has ids outside the vocab of {n}.",
                           "Report this with the source model.")


def validate_tokenizer(out_dir: Path, n: int) -> None:
    """Load with AutoTokenizer; every id of a sample text must be < n and decode back."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(out_dir))
    except Exception as e:  # transformers raises many types when files disagree
        raise MldebugError(f"the shrunk tokenizer in {out_dir} does not load: {type(e).__name__}: {e}",
                           "Pass --no-tokenizer to skip it, and report this with the source.") from e
    ids = tok.encode(SAMPLE_TEXT, add_special_tokens=False)
    if not ids or max(ids) >= n:
        raise MldebugError(f"the shrunk tokenizer produced ids outside the vocab of {n}.",
                           "Report this with the source model.")
    back = str(tok.decode(ids, skip_special_tokens=True))
    if "".join(back.split()).lower() != "".join(SAMPLE_TEXT.split()).lower():
        raise MldebugError("the shrunk tokenizer does not round-trip text: "
                           f"{SAMPLE_TEXT!r} came back as {back!r}.",
                           "Pass a larger --vocab so the alphabet fits.")
