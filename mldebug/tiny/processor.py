"""Tiny processors (feature extractor / image processor + tokenizer) for models that ship one.

A real whisper, gemma3 or llava checkpoint is loaded with ``AutoProcessor``; the tiny one must be
too, with sizes that match the tiny model (image side, tokens per image, mel bins). Each
supported model type has one small builder in ``BUILDERS``; ``SPECIAL_TOKENS`` names the tokens
its processor looks up in the tokenizer (they are put into the tiny tokenizer at the ids the
config points to). Nothing is downloaded: processors are built from their classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError

# model type -> tokenizer attribute -> (token text, config key holding its id)
SPECIAL_TOKENS: dict[str, dict[str, tuple[str, str]]] = {
    "gemma3": {"boi_token": ("<start_of_image>", "boi_token_index"),
               "image_token": ("<image_soft_token>", "image_token_index"),
               "eoi_token": ("<end_of_image>", "eoi_token_index")},
    "llava": {"image_token": ("<image>", "image_token_index")},
}
SAMPLING_RATE = 16_000


@dataclass
class ProcessorCheck:
    """What was written and the tiny input it was checked on."""

    cls: str
    input: str

    def to_dict(self) -> dict[str, str]:
        return {"class": self.cls, "input": self.input}


def special_tokens(model_type: str) -> dict[str, str]:
    """Tokenizer attribute -> token text the processor of this model type needs."""
    return {name: text for name, (text, _key) in SPECIAL_TOKENS.get(model_type, {}).items()}


def special_token_keys(model_type: str) -> dict[str, str]:
    """Config key -> tokenizer attribute, to pin the config's ids to the tiny tokenizer's."""
    return {key: name for name, (_text, key) in SPECIAL_TOKENS.get(model_type, {}).items()}


def ships_processor(model_type: str) -> bool:
    """Whether transformers has a processor, image processor or feature extractor for it."""
    from transformers.models.auto import (
        feature_extraction_auto,
        image_processing_auto,
        processing_auto,
    )

    return any(model_type in m for m in (processing_auto.PROCESSOR_MAPPING_NAMES,
                                          image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES,
                                          feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES))


def _whisper(config: Any, tokenizer: Any) -> Any:
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    fe = WhisperFeatureExtractor(feature_size=int(config.num_mel_bins),
                                 sampling_rate=SAMPLING_RATE)
    return WhisperProcessor(feature_extractor=fe, tokenizer=tokenizer)


def _gemma3(config: Any, tokenizer: Any) -> Any:
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    side = int(config.vision_config.image_size)
    images = Gemma3ImageProcessorPil(size={"height": side, "width": side})
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer,
                           image_seq_length=int(config.mm_tokens_per_image))


def _llava(config: Any, tokenizer: Any) -> Any:
    from transformers import LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    side = int(config.vision_config.image_size)
    images = LlavaImageProcessorPil(size={"shortest_edge": side},
                                    crop_size={"height": side, "width": side})
    extra = 1 if config.vision_config.model_type == "clip_vision_model" else 0  # its CLS token
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer,
                          patch_size=int(config.vision_config.patch_size),
                          vision_feature_select_strategy=config.vision_feature_select_strategy,
                          num_additional_image_tokens=extra)


BUILDERS: dict[str, Callable[[Any, Any], Any]] = {
    "whisper": _whisper, "gemma3": _gemma3, "llava": _llava,
}


def sample_call(processor: Any, model_type: str) -> tuple[dict[str, Any], str]:
    """Run the processor on a tiny input of its kind: 1 s of audio, or a 40x30 image + text."""
    import numpy as np

    if model_type == "whisper":
        t = np.arange(SAMPLING_RATE, dtype=np.float32) / SAMPLING_RATE
        audio = 0.1 * np.sin(2 * np.pi * 440 * t)
        return dict(processor(audio=audio, sampling_rate=SAMPLING_RATE, return_tensors="pt")), \
            "1 s of 16 kHz audio"
    from PIL import Image

    image = Image.new("RGB", (40, 30), (200, 30, 60))
    prompt = f"{processor.image_token} what is this?"
    return dict(processor(images=image, text=prompt, return_tensors="pt")), \
        "a 40x30 RGB image and a prompt"


def write_and_check(model_type: str, model: Any, config: Any, out_dir: Path) -> ProcessorCheck:
    """Build the tiny processor, save it into ``out_dir``, load it back with AutoProcessor and run
    one tiny input through it and the model. Raises MldebugError when any step fails."""
    import torch
    from transformers import AutoProcessor, AutoTokenizer

    what = f"the tiny {model_type} processor"
    try:
        processor = BUILDERS[model_type](config, AutoTokenizer.from_pretrained(str(out_dir)))
        processor.save_pretrained(str(out_dir))
        loaded = AutoProcessor.from_pretrained(str(out_dir))
        inputs, described = sample_call(loaded, model_type)
    except Exception as e:  # transformers raises many types when processor parts disagree
        raise MldebugError(f"{what} could not be built or loaded back: {type(e).__name__}: "
                           f"{' '.join(str(e).split())}",
                           "Pass --no-tokenizer to write the model alone, and report this with "
                           "the command line.") from e
    dtype = next(model.parameters()).dtype
    inputs = {k: (v.to(dtype) if torch.is_floating_point(v) else v) for k, v in inputs.items()
              if k != "token_type_ids" or model_type == "gemma3"}
    if model_type == "whisper":
        inputs["decoder_input_ids"] = torch.tensor([[int(config.decoder_start_token_id)]])
    try:
        with torch.no_grad():
            out = model(**inputs)
    except Exception as e:
        raise MldebugError(f"the tiny {model_type} model rejected what {what} produced: "
                           f"{type(e).__name__}: {' '.join(str(e).split())}",
                           "The processor's sizes do not match the model's; report this with "
                           "the command line.") from e
    logits = getattr(out, "logits", None)
    if logits is None or not torch.isfinite(logits.float()).all():
        raise MldebugError(f"the tiny {model_type} model gave no finite logits for {what}'s "
                           "output.", "Try --dtype fp32.")
    return ProcessorCheck(type(loaded).__name__, described)
