"""Build a model from a shrunk config, validate it end to end, save it (needs torch + transformers).

Validation: build with random weights, run one forward (and ``generate`` for a few tokens when
the model can generate from text), ``save_pretrained``, reload with the Auto classes and
compare the reloaded forward with the original. Only a model that passes is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def offline() -> None:
    """Never reach the hub: every source here is local."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@dataclass
class Built:
    model: Any
    config: Any
    auto_class: str
    params: int
    generated: list[int] | None
    image_checked: bool = False


def config_class(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        raise UsageError(f"transformers does not know model type {model_type!r}.",
                         "Pass a model type transformers knows.") from None


def make_config(d: dict[str, Any], what: str = "shrunk") -> Any:
    """Construct (and so validate) the config object from a dict; ``what`` names it in errors."""
    cls = config_class(str(d["model_type"]))
    clean = {k: v for k, v in d.items() if k not in ("transformers_version",)}
    try:
        return cls.from_dict(clean)
    except Exception as e:  # strict dataclass validation raises its own types, not ValueError
        fix = ("Fix the field in the config.json." if what == "source"
               else "Adjust the sizes, or fix the field with --set key=value.")
        raise UsageError(f"transformers rejected the {what} {d['model_type']} config: "
                         f"{one_line(e)}", fix) from e


def one_line(e: BaseException) -> str:
    """An exception's text on one line (transformers' validation errors span several)."""
    return " ".join(str(e).split())


_AUTO_ORDER = (
    ("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
)


def pick_auto_class(model_type: str, architectures: list[str] | None = None) -> tuple[str, Any]:
    """The Auto class (name, class) to build and reload with: the source's own head if known."""
    import transformers
    from transformers.models.auto import modeling_auto

    if architectures:
        arch = architectures[0]
        for auto_name, mapping_name in _AUTO_ORDER:
            if arch in getattr(modeling_auto, mapping_name).values():
                return auto_name, getattr(transformers, auto_name)
        if isinstance(getattr(transformers, arch, None), type):
            return arch, getattr(transformers, arch)  # e.g. a classification head
    for auto_name, mapping_name in _AUTO_ORDER:
        if model_type in getattr(modeling_auto, mapping_name):
            return auto_name, getattr(transformers, auto_name)
    return "AutoModel", transformers.AutoModel


def from_config(cls: Any, config: Any) -> Any:
    """Random-init a model: Auto classes have from_config, model classes _from_config."""
    if hasattr(cls, "from_config"):
        return cls.from_config(config)
    return cls._from_config(config)


def count_params_meta(config: Any, auto_cls: Any) -> int:
    """Parameters of the model a config describes, without allocating weights."""
    import torch

    with torch.device("meta"):
        model = from_config(auto_cls, config)
    return sum(p.numel() for p in model.parameters())


def sample_inputs(model: Any, config: Any, auto_name: str, vocab_limit: int) -> dict[str, Any]:
    """Deterministic inputs for one forward pass of this kind of model."""
    import torch

    g = torch.Generator().manual_seed(0)
    text = config.get_text_config(decoder=True)
    vocab = min(int(getattr(text, "vocab_size", vocab_limit) or vocab_limit), vocab_limit)
    ids = torch.randint(0, max(2, vocab), (1, 8), generator=g)
    if auto_name == "AutoModelForSpeechSeq2Seq":
        mel = int(getattr(config, "num_mel_bins", 80))
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        dtype = next(model.parameters()).dtype
        return {"input_features": torch.randn(1, mel, frames, generator=g).to(dtype),
                "decoder_input_ids": ids[:, :4]}
    if auto_name == "AutoModelForSeq2SeqLM":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def image_inputs(model: Any, config: Any, text_ids: Any) -> dict[str, Any] | None:
    """Inputs with one image (pixel_values + as many image tokens as the tower yields)."""
    import torch

    vision = getattr(config, "vision_config", None)
    token = getattr(config, "image_token_id", None)
    if token is None:
        token = getattr(config, "image_token_index", None)
    size = getattr(vision, "image_size", None)
    if vision is None or token is None or not isinstance(size, int) \
            or not hasattr(model, "get_image_features"):
        return None
    g = torch.Generator().manual_seed(1)
    channels = int(getattr(vision, "num_channels", 3))
    dtype = next(model.parameters()).dtype
    pixels = torch.randn(1, channels, size, size, generator=g).to(dtype)
    with torch.no_grad():
        feats = model.get_image_features(pixel_values=pixels)
    f = getattr(feats, "pooler_output", None)
    if f is None:
        f = feats
    if isinstance(f, (list, tuple)):
        n = sum(int(x.shape[0]) for x in f)
    else:
        n = int(f.shape[0] * f.shape[1]) if f.dim() == 3 else int(f.shape[0])
    ids = torch.cat([text_ids[:, :1], torch.full((1, n), int(token)), text_ids[:, 1:]], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


def _logits(out: Any) -> Any:
    for name in ("logits", "last_hidden_state", "prediction_logits"):
        v = getattr(out, name, None)
        if v is not None:
            return v
    return out[0]


def build_and_validate(config: Any, auto_name: str, auto_cls: Any, dtype: str, out_dir: Path,
                       *, vocab_limit: int, seed: int = 0) -> Built:
    """Random-init, forward, generate, save to ``out_dir``, reload, compare. Raises on failure."""
    import torch

    torch.manual_seed(seed)
    what = f"{config.model_type} ({getattr(auto_cls, '__name__', auto_cls)})"
    try:
        model = from_config(auto_cls, config)
    except Exception as e:  # transformers raises many types from model constructors
        raise MldebugError(f"the tiny {what} could not be built: {type(e).__name__}: {e}",
                           "A size the config does not check was broken, or this transformers "
                           "cannot build the type at all; try --set key=value.") from e
    model.to(getattr(torch, DTYPES[dtype]))
    model.eval()
    inputs = sample_inputs(model, config, auto_name, vocab_limit)
    text_ids = inputs.get("input_ids")
    what = f"{config.model_type} ({type(model).__name__})"
    try:
        if auto_name == "AutoModelForImageTextToText":
            inputs = image_inputs(model, config, text_ids) or inputs
        with torch.no_grad():
            ref = _logits(model(**inputs)).float()
    except Exception as e:  # transformers raises many types from deep inside forward
        raise MldebugError(f"the tiny {what} failed its forward pass: {type(e).__name__}: {e}",
                           "A size constraint the config does not check was broken; fix it with "
                           "--set key=value or pick other sizes.") from e
    if not torch.isfinite(ref).all():
        raise MldebugError(f"the tiny {what} produced non-finite outputs.",
                           "Try --dtype fp32.")
    generated = None
    if auto_name not in ("AutoModelForSpeechSeq2Seq", "AutoModelForMaskedLM", "AutoModel") \
            and model.can_generate():
        try:
            with torch.no_grad():
                gen = model.generate(text_ids, max_new_tokens=3, do_sample=False,
                                     min_new_tokens=3)
            generated = [int(x) for x in gen[0].tolist()]
        except Exception as e:
            raise MldebugError(f"the tiny {what} failed to generate: {type(e).__name__}: {e}",
                               "Check the special token ids (--set eos_token_id=...).") from e
    model.save_pretrained(out_dir)
    try:
        reloaded = auto_cls.from_pretrained(out_dir, dtype=getattr(torch, DTYPES[dtype]))
        reloaded.eval()
        with torch.no_grad():
            again = _logits(reloaded(**inputs)).float()
    except Exception as e:
        raise MldebugError(f"the saved tiny {what} did not reload: {type(e).__name__}: {e}",
                           "This is a bug in the shrink rules for this architecture; report it "
                           "with the command line.") from e
    if again.shape != ref.shape or not torch.allclose(again, ref, atol=1e-4, rtol=1e-3):
        raise MldebugError(f"the reloaded tiny {what} gives different outputs than the one built.",
                           "Some weights were not saved or not tied back; report it with the command line.")
    params = sum(p.numel() for p in model.parameters())
    return Built(model, config, auto_name, params, generated, "pixel_values" in inputs)


def dir_size(path: Path, patterns: tuple[str, ...] = ("*.safetensors", "*.bin", "*.pt", "*.gguf")) -> int:
    total = 0
    for pat in patterns:
        total += sum(p.stat().st_size for p in path.glob(pat) if p.is_file())
    return total
