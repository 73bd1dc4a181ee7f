"""make-tiny end to end: source -> tokenizer -> shrunk config -> validated model -> DIR.

Everything is written into a temporary sibling of ``--out`` and renamed into place only after
the model passed validation, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.findings import Finding, Severity, findings_to_json
from mldebug.outdir import check_out, staged
from mldebug.tiny.processor import (
    BUILDERS,
    ships_processor,
    special_token_keys,
    special_tokens,
    write_and_check,
)
from mldebug.tiny.shrink import Change, ShrinkSpec, collect_token_ids
from mldebug.tiny.shrinker import shrink_config

BYTES_PER = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}


@dataclass
class TinyReport:
    source: str
    model_type: str
    out: str
    model_class: str
    params_before: int | None
    params_after: int
    bytes_before: int
    bytes_before_estimated: bool
    bytes_after: int
    changes: list[Change]
    findings: list[Finding] = field(default_factory=list)
    tokenizer: dict[str, Any] | None = None
    processor: dict[str, Any] | None = None  # {"class", "input"} when one was written
    generated: list[int] | None = None
    image_checked: bool = False
    command: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["changes"] = [c.to_dict() for c in self.changes]
        d["findings"] = findings_to_json(self.findings)
        return d


LAYERS_RAISED_FIX = ("Nothing to do: one layer of each block type is kept so every code path "
                     "runs; pass --layers with that number to ask for it.")
TOKENIZER_FIX = {
    "trained": "To shrink the model's own tokenizer instead, pass its local directory (with "
               "tokenizer.json or tokenizer.model) as SOURCE.",
    "shrunk-spm": "Nothing to do: AutoTokenizer loads the fast tokenizer.json.",
    "shrunk-json": "Nothing to do: AutoTokenizer loads tokenizer.json.",
}


def layers_raised(note: str) -> Finding:
    """The shrink kept more layers than asked, to keep every block type."""
    return Finding(Severity.INFO, note, fix=LAYERS_RAISED_FIX, code="tiny-layers-raised")


def tokenizer_finding(kind: str, note: str) -> Finding:
    return Finding(Severity.INFO, note, fix=TOKENIZER_FIX.get(kind, ""),
                   code=f"tiny-tokenizer-{kind}")


ROLE_KEYS = (("eos_token_id", "eos"), ("bos_token_id", "bos"), ("pad_token_id", "pad"),
             ("decoder_start_token_id", "pad"))


def processor_skipped(model_type: str, tokenizer_roles: dict[str, int] | None) -> Finding | None:
    """Why no processor is written for a model type whose real checkpoints ship one (or None)."""
    if model_type not in BUILDERS:
        if not ships_processor(model_type):
            return None
        why, fix = (f"mldebug has no tiny processor for {model_type} yet",
                    "Load the tokenizer alone (AutoTokenizer), or build the processor from its "
                    "classes with sizes matching config.json.")
    elif tokenizer_roles is None:
        why, fix = "--no-tokenizer: a processor needs the tokenizer", \
            "Drop --no-tokenizer to get AutoProcessor support."
    else:
        missing = sorted(set(special_tokens(model_type)) - set(tokenizer_roles))
        if not missing:
            return None
        why, fix = (f"the source tokenizer has no {', '.join(missing)} for the processor",
                    "Pass a source whose tokenizer has the processor's special tokens, or a "
                    "model type (a tokenizer with them is trained).")
    return Finding(Severity.WARNING, f"no processor written: {why}",
                   "AutoProcessor.from_pretrained(DIR) will not load this directory.", fix,
                   code="tiny-processor-skipped")


def role_pins(config: dict[str, Any], roles: dict[str, int],
              extra_keys: dict[str, str] | None = None) -> dict[int, int]:
    """Old special ids -> ids of the same role in a freshly trained tokenizer. ``extra_keys``:
    more config keys -> role (a processor's image tokens: image_token_index -> image_token)."""
    pins: dict[int, int] = {}
    keys = ROLE_KEYS + tuple((extra_keys or {}).items())

    def walk(d: dict[str, Any]) -> None:
        for key, role in keys:
            v = d.get(key)
            ids = v if isinstance(v, list) else [v]
            for old in ids:
                if isinstance(old, int) and not isinstance(old, bool) and role in roles:
                    pins.setdefault(old, roles[role])
        for v in d.values():
            if isinstance(v, dict) and "model_type" in v:
                walk(v)
    walk(config)
    return pins


def _source_bytes(src_dir: Path | None, params: int, config: dict[str, Any]) -> tuple[int, bool]:
    from mldebug.tiny.build import dir_size

    if src_dir:
        size = dir_size(src_dir)
        if size:
            return size, False
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", "")
    return params * BYTES_PER.get(dtype, 4), True


def _fill_decoder_start(config: dict[str, Any], changes: list[Change]) -> None:
    """Encoder-decoders generate from decoder_start_token_id; default it to the pad id (T5)."""
    if config.get("is_encoder_decoder") and config.get("decoder_start_token_id") is None \
            and config.get("bos_token_id") is None and isinstance(config.get("pad_token_id"), int):
        config["decoder_start_token_id"] = config["pad_token_id"]
        changes.append(Change("decoder_start_token_id", None, config["pad_token_id"],
                              "encoder-decoder generation starts from the pad id"))


def make_tiny(source: str, out: Path, spec: ShrinkSpec, *, dtype: str = "fp32",
              tokenizer: bool = True, force: bool = False, command: str = "") -> TinyReport:
    from mldebug.tiny.build import (
        build_and_validate,
        count_params_meta,
        dir_size,
        make_config,
        offline,
        one_line,
        pick_auto_class,
    )
    from mldebug.tiny.source import resolve

    offline()
    _quiet()
    src_path = Path(source).expanduser()
    out = check_out(out, force=force, inputs=[src_path] if src_path.exists() else [])
    src = resolve(source)
    with staged(out, command=command) as tmp:
        findings: list[Finding] = []
        tok_info = None
        pins: dict[int, int] = {}
        if tokenizer:
            from mldebug.tiny.tokenizer import make_tokenizer

            config_ids: set[int] = set()
            collect_token_ids(src.config, config_ids)
            tok = make_tokenizer(src.directory, spec.vocab, tmp, config_ids,
                                 special_tokens(src.model_type))
            tok_info = {"kind": tok.kind, "vocab_before": tok.source_vocab_size,
                        "vocab_after": tok.vocab_size}
            findings += [tokenizer_finding(tok.kind, n) for n in tok.notes]
            pins = role_pins(src.config, tok.role_ids, special_token_keys(src.model_type)) \
                if tok.kind == "trained" else tok.id_map
        result = shrink_config(src.config, spec, pins)
        findings += [layers_raised(n) for n in result.notes]
        _fill_decoder_start(result.config, result.changes)
        cfg = make_config(result.config)
        auto_name, auto_cls = pick_auto_class(src.model_type, src.config.get("architectures"))
        try:
            params_before: int | None = count_params_meta(make_config(src.config), auto_cls)
        except Exception as e:  # a source config this transformers cannot build
            params_before = None
            findings.append(Finding(
                Severity.WARNING, "the full-size source does not build in this transformers, "
                "so its size is unknown", f"{type(e).__name__}: {one_line(e)}",
                "Nothing to do for the tiny model; to see the source's size, use the "
                "transformers version its config.json names (transformers_version).",
                code="tiny-source-size-unknown"))
        bytes_before, estimated = _source_bytes(src.directory, params_before or 0, src.config)
        built = build_and_validate(cfg, auto_name, auto_cls, dtype, tmp,
                                   vocab_limit=tok.vocab_size if tok_info else spec.vocab)
        processor = None
        skipped = processor_skipped(src.model_type, tok.role_ids if tok_info else None)
        if skipped:
            findings.append(skipped)
        elif src.model_type in BUILDERS:
            processor = write_and_check(src.model_type, built.model, cfg, tmp).to_dict()
        report = TinyReport(
            source=source, model_type=src.model_type, out=str(out),
            model_class=type(built.model).__name__, params_before=params_before,
            params_after=built.params, bytes_before=bytes_before,
            bytes_before_estimated=estimated, bytes_after=dir_size(tmp),
            changes=result.changes, findings=findings, tokenizer=tok_info, processor=processor,
            generated=built.generated, image_checked=built.image_checked, command=command)
        write_card(tmp, report)
    return report


def _quiet() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def human_count(n: int | None) -> str:
    if n is None:
        return "?"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def write_card(d: Path, r: TinyReport) -> None:
    """README.md (what this is and how it was made) and make_tiny.sh (the rebuild command)."""
    est = " (estimated from parameters)" if r.bytes_before_estimated else ""
    lines = [
        f"# Tiny random {r.model_type}",
        "",
        f"Random weights, for debugging and tests only: it produces garbage. Built by "
        f"`mldebug make-tiny` from `{r.source}` ({r.model_class}).",
        "",
        "| | source | tiny |",
        "| --- | --- | --- |",
        f"| parameters | {human_count(r.params_before)} | {human_count(r.params_after)} |",
        f"| weights on disk | {human_bytes(r.bytes_before)}{est} | {human_bytes(r.bytes_after)} |",
    ]
    if r.tokenizer:
        lines.append(f"| tokenizer vocab | {r.tokenizer['vocab_before'] or '-'} | "
                     f"{r.tokenizer['vocab_after']} ({r.tokenizer['kind']}) |")
    lines += ["", "## Changed fields", "", "| field | before | after | why |",
              "| --- | --- | --- | --- |"]
    lines += [f"| `{c.path}` | {json.dumps(c.before)} | {json.dumps(c.after)} | {c.why} |"
              for c in r.changes]
    if r.findings:
        lines += ["", "## Notes", ""] + [f"- {f.title}" for f in r.findings]
    lines += ["", "## Rebuild", "", "```bash", r.command, "```", ""]
    (d / "README.md").write_text("\n".join(lines))
    (d / "make_tiny.sh").write_text(
        "#!/bin/sh\n# Rebuilds this directory (offline; needs mldebug[tiny]).\n"
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1\n" + r.command + "\n")
    (d / "make_tiny.sh").chmod(0o755)
    (d / "make_tiny_report.json").write_text(json.dumps(r.to_dict(), indent=2, default=str))
