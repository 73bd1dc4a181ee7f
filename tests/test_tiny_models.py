"""make-tiny over the architecture matrix: each result reloads with the Auto classes and runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli
from envelope_check import check_envelope

from mldebug.cli import main

pytest.importorskip("transformers")
pytest.importorskip("torch")

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# model type -> the Auto class a user would load it with
MATRIX = {
    "llama": "AutoModelForCausalLM", "mistral": "AutoModelForCausalLM",
    "qwen2": "AutoModelForCausalLM", "qwen3": "AutoModelForCausalLM",
    "qwen3_moe": "AutoModelForCausalLM", "mixtral": "AutoModelForCausalLM",
    "gemma2": "AutoModelForCausalLM", "gemma3": "AutoModelForImageTextToText",
    "gpt2": "AutoModelForCausalLM", "gpt_neox": "AutoModelForCausalLM",
    "t5": "AutoModelForSeq2SeqLM", "bart": "AutoModelForSeq2SeqLM",
    "bert": "AutoModelForMaskedLM", "whisper": "AutoModelForSpeechSeq2Seq",
    "llava": "AutoModelForImageTextToText",
}
GENERATES = {k for k, v in MATRIX.items() if v != "AutoModelForMaskedLM" and k != "whisper"}
# the types whose real checkpoints ship a processor (feature extractor / image processor)
PROCESSORS = {"whisper": "WhisperProcessor", "gemma3": "Gemma3Processor",
              "llava": "LlavaProcessor"}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("model_type", list(MATRIX))
def test_make_tiny_architecture(model_type: str, tmp_path: Path) -> None:
    import torch
    import transformers

    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec, check_constraints

    out = tmp_path / model_type
    report = make_tiny(model_type, out, ShrinkSpec(), command="mldebug make-tiny ...")
    assert report.params_after < report.params_before
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size < 1_000_000, f"{model_type}: {size} bytes on disk"
    assert (model_type in GENERATES) == (report.generated is not None)
    assert report.image_checked == (MATRIX[model_type] == "AutoModelForImageTextToText")
    # independent of make-tiny: load what a user would load, and run it
    config = transformers.AutoConfig.from_pretrained(out)
    assert check_constraints(config.to_dict()) == []
    model = getattr(transformers, MATRIX[model_type]).from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok.encode("Tiny models debug fast.", add_special_tokens=False)])
    text = config.get_text_config(decoder=True)
    assert int(ids.max()) < text.vocab_size
    inputs: dict[str, torch.Tensor] = {"input_ids": ids}
    if model_type == "whisper":
        frames = 2 * config.max_source_positions
        inputs = {"input_features": torch.randn(1, config.num_mel_bins, frames),
                  "decoder_input_ids": ids}
    elif config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :2]
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[-1] == text.vocab_size and torch.isfinite(logits).all()
    if model_type in GENERATES:
        gen = model.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert gen.shape[-1] >= 3
    assert [f.code for f in report.findings if f.code == "tiny-processor-skipped"] == []
    if model_type in PROCESSORS:
        assert report.processor is not None and report.processor["class"] == PROCESSORS[model_type]
        check_processor(model_type, out, model, config)
    else:
        assert report.processor is None and not (out / "preprocessor_config.json").exists()


def check_processor(model_type: str, out: Path, model: object, config: object) -> None:
    """What a user does with a real checkpoint: AutoProcessor, a raw input, the model."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    proc = transformers.AutoProcessor.from_pretrained(out)
    assert type(proc).__name__ == PROCESSORS[model_type]
    if model_type == "whisper":
        audio = np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1
        inputs = dict(proc(audio=audio, sampling_rate=16000, return_tensors="pt"))
        inputs["decoder_input_ids"] = torch.tensor([[config.decoder_start_token_id]])  # type: ignore[attr-defined]
    else:
        image = Image.new("RGB", (64, 48), (10, 200, 30))
        inputs = dict(proc(images=[image], text=f"{proc.image_token} describe", return_tensors="pt"))
        n_image = int((inputs["input_ids"] == config.image_token_id).sum())  # type: ignore[attr-defined]
        assert n_image > 0 and inputs["pixel_values"].shape[-1] == config.vision_config.image_size  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(**inputs).logits  # type: ignore[operator]
    assert torch.isfinite(logits).all()


def test_cli_writes_card_command_and_json(tmp_path: Path) -> None:
    out = tmp_path / "tiny-qwen3"
    env = {**os.environ, **OFFLINE}
    r = run_cli("make-tiny", "qwen3", "--out", str(out), "--layers", "3", "--dtype", "bf16",
                "--set", "rms_norm_eps=1e-5", "--json", env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    check_envelope(doc, "make-tiny")
    changed = {c["path"]: c["after"] for c in doc["changes"]}
    assert changed["num_hidden_layers"] == 3 and changed["rms_norm_eps"] == 1e-5
    assert doc["params_before"] > 1e9 > doc["params_after"]
    assert doc["tokenizer"]["kind"] == "trained"
    codes = {f["code"]: f for f in doc["findings"]}
    assert codes["tiny-tokenizer-trained"]["fix"]
    assert doc["processor"] is None
    script = (out / "make_tiny.sh").read_text()
    assert "make-tiny qwen3 --out" in script and "--layers 3" in script and "--dtype bf16" in script
    card = (out / "README.md").read_text()
    assert "num_hidden_layers" in card and "parameters" in card
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["num_hidden_layers"] == 3


def test_constraint_violation_is_a_usage_error_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "never"
    env = {**os.environ, **OFFLINE}
    r = run_cli("make-tiny", "llama", "--out", str(out), "--heads", "3", "--hidden", "16",
                env=env, timeout=180)
    assert r.returncode == 2
    assert "hidden size 16 must be a multiple of the number of attention heads 3" in r.stderr
    assert "--heads" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unknown_type_lists_close_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-tiny", "lama", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown model type 'lama'" in err and "llama" in err
    assert main(["make-tiny", "meta-llama/Llama-2-7b-hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "never downloads" in err and "git clone" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert main(["make-tiny", "llama", "--out", str(tmp_path / "full")]) == 2
    assert "--force" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_config_json_source_keeps_its_architecture(tmp_path: Path) -> None:
    import transformers

    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec

    cfg = transformers.AutoConfig.for_model("mistral", num_hidden_layers=40,
                                            architectures=["MistralForSequenceClassification"])
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    r = make_tiny(str(tmp_path / "config.json"), tmp_path / "out", ShrinkSpec(), tokenizer=False)
    assert r.model_class == "MistralForSequenceClassification"
    assert r.generated is None
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_processor_skipped_is_a_finding_in_json(tmp_path: Path) -> None:
    r = run_cli("make-tiny", "whisper", "--out", str(tmp_path / "w"), "--no-tokenizer", "--json",
                env={**os.environ, **OFFLINE}, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    skipped = [f for f in doc["findings"] if f["code"] == "tiny-processor-skipped"]
    assert len(skipped) == 1 and "--no-tokenizer" in skipped[0]["title"]
    assert skipped[0]["severity"] == "warning" and skipped[0]["fix"]
    assert doc["processor"] is None and not (tmp_path / "w" / "preprocessor_config.json").exists()
