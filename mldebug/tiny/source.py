"""Resolve make-tiny's SOURCE: a model type, a config.json, or a local model directory.

Nothing here touches the network: a SOURCE that looks like a hub id gets an error that says
what to pass instead.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.errors import UsageError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja")
SPM_NAMES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


@dataclass
class Source:
    kind: str  # "model_type" | "config" | "directory"
    name: str
    config: dict[str, Any]
    directory: Path | None = None

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    def tokenizer_json(self) -> Path | None:
        if self.directory and (self.directory / "tokenizer.json").is_file():
            return self.directory / "tokenizer.json"
        return None

    def spm_model(self) -> Path | None:
        if self.directory:
            for n in SPM_NAMES:
                if (self.directory / n).is_file():
                    return self.directory / n
        return None


def known_model_types() -> list[str]:
    from transformers import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def close_matches(name: str, known: list[str], n: int = 5) -> list[str]:
    norm = name.lower().replace("-", "_")
    found = difflib.get_close_matches(norm, known, n=n, cutoff=0.6)
    found += [k for k in known if norm and norm in k and k not in found]
    return found[:n]


def _read_config(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read {path} as a JSON config: {e}",
                         "Pass a valid config.json (as save_pretrained writes it).") from e
    if not isinstance(d, dict) or "model_type" not in d:
        raise UsageError(f"{path} has no 'model_type' field, so its architecture is unknown.",
                         "Add \"model_type\": \"<type>\" (e.g. llama) to it, or pass the model type.")
    return d


def resolve(source: str) -> Source:
    """Turn SOURCE into a config dict (full size) and, for directories, the files beside it."""
    from transformers import AutoConfig

    p = Path(source).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise UsageError(f"{p} has no config.json.",
                             "Pass a local clone of a model repository (with config.json), a "
                             "config.json file, or a model type such as llama.")
        d = _read_config(cfg)
        _check_type(d["model_type"])
        return Source("directory", str(p), _full_config(d), p)
    if p.is_file():
        d = _read_config(p)
        _check_type(d["model_type"])
        return Source("config", str(p), _full_config(d), None)
    if "/" in source or source.endswith(".json"):
        raise UsageError(
            f"{source!r} is not a local file or directory, and make-tiny never downloads.",
            "Clone the repository first (git clone https://huggingface.co/<id>; the weights "
            "are not needed: GIT_LFS_SKIP_SMUDGE=1) and pass the directory, or pass its "
            "config.json, or a model type such as llama.")
    _check_type(source)
    return Source("model_type", source, AutoConfig.for_model(source).to_dict(), None)


def _check_type(model_type: str) -> None:
    known = known_model_types()
    if model_type in known:
        return
    near = close_matches(model_type, known)
    fix = (f"Did you mean: {', '.join(near)}?" if near
           else "Run 'python -c \"from transformers import CONFIG_MAPPING; print(list(CONFIG_MAPPING))\"' for the list.")
    raise UsageError(f"unknown model type {model_type!r} (not in this transformers).", fix)


def _full_config(d: dict[str, Any]) -> dict[str, Any]:
    """The file's fields completed with the class defaults, as a plain dict."""
    from mldebug.tiny.build import make_config

    return dict(make_config(d).to_dict())
