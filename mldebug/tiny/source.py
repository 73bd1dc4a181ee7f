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

MAX_CONFIG_BYTES = 8 * 2**20  # the largest real config.json files are a few hundred KB


@dataclass
class Source:
    kind: str  # "model_type" | "config" | "directory"
    name: str
    config: dict[str, Any]
    directory: Path | None = None

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


def known_model_types() -> list[str]:
    from transformers import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def close_matches(name: str, known: list[str], n: int = 5) -> list[str]:
    norm = name.lower().replace("-", "_")
    found = difflib.get_close_matches(norm, known, n=n, cutoff=0.6)
    found += [k for k in known if norm and norm in k and k not in found]
    return found[:n]


def read_config(path: Path) -> dict[str, Any]:
    """A config.json as a dict, bounded in size and nesting; any defect is a UsageError."""
    fix = "Pass a valid config.json (as save_pretrained writes it)."
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}.", fix) from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"{path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; it is not a "
                         "model config.", fix)
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start}), so not a JSON config.",
                         fix) from e
    except RecursionError as e:
        raise UsageError(f"{path} is nested too deeply to be a model config.", fix) from e
    except ValueError as e:  # json.JSONDecodeError, and Python's limit on huge integers
        raise UsageError(f"{path} is not valid JSON: {e}.", fix) from e
    if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
        raise UsageError(f"{path} has no 'model_type' text field, so its architecture is unknown.",
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
        d = read_config(cfg)
        _check_type(d["model_type"])
        return Source("directory", str(p), _full_config(d), p)
    if p.is_file():
        d = read_config(p)
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
    from mldebug.tiny.shrink import check_source

    check_source(d)

    return dict(make_config(d, "source").to_dict())
