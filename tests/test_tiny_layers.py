"""shrink-layers on a locally built 8-layer model whose block types are interleaved."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from envelope_check import check_envelope

from mldebug.cli import main

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TYPES = ["full_attention"] * 3 + ["sliding_attention"] + ["full_attention"] * 3 + \
    ["sliding_attention"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def eight_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec

    d = tmp_path_factory.mktemp("layers") / "gemma2-8"
    make_tiny("gemma2", d, ShrinkSpec(layers=8, overrides={"layer_types": TYPES},
                                      explicit=frozenset({"layers"})), tokenizer=False)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 8 and cfg["layer_types"] == TYPES
    return d


def test_out_keeps_one_layer_of_each_type_with_sliced_weights(eight_layers: Path,
                                                              tmp_path: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out = tmp_path / "two"
    r = run_cli("shrink-layers", str(eight_layers), "--layers", "2", "--out", str(out), "--json",
                env={**os.environ, **OFFLINE}, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    check_envelope(doc, "shrink-layers")
    assert doc["levels"] == [{"path": "", "n_before": 8, "kept": [0, 3]}]
    assert doc["load_s_before"] > 0 and doc["load_s_after"] > 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2
    assert cfg["layer_types"] == ["full_attention", "sliding_attention"]
    with safe_open(str(out / "model.safetensors"), "pt") as f_out, \
            safe_open(str(eight_layers / "model.safetensors"), "pt") as f_src:
        names = list(f_out.keys())
        layers = {n.split(".")[2] for n in names if n.startswith("model.layers.")}
        assert layers == {"0", "1"}
        q = "model.layers.{}.self_attn.q_proj.weight"
        assert torch.equal(f_out.get_tensor(q.format(1)), f_src.get_tensor(q.format(3)))
        assert torch.equal(f_out.get_tensor(q.format(0)), f_src.get_tensor(q.format(0)))
        assert torch.equal(f_out.get_tensor("model.norm.weight"),
                           f_src.get_tensor("model.norm.weight"))
        per_layer = sum(1 for n in f_src.keys() if n.startswith("model.layers.3."))  # noqa: SIM118
        assert len(names) == len(list(f_src.keys())) - 6 * per_layer  # noqa: SIM118
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert len(model.model.layers) == 2
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_in_place_edits_config_and_keeps_a_backup(eight_layers: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM

    d = tmp_path / "clone"
    shutil.copytree(eight_layers, d)
    assert main(["shrink-layers", str(d), "--layers", "2", "--in-place", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "config.json.orig" in out and "Use --out DIR" in out
    assert json.loads((d / "config.json.orig").read_text())["num_hidden_layers"] == 8
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and len(cfg["layer_types"]) == 2
    assert len(AutoModelForCausalLM.from_pretrained(d).model.layers) == 2


def test_bad_inputs(eight_layers: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shrink-layers", str(tmp_path / "missing"), "--layers", "2", "--in-place"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["shrink-layers", str(eight_layers), "--layers", "9", "--in-place"]) == 2
    assert "nothing to shrink" in capsys.readouterr().err
    no_st = tmp_path / "bin-only"
    no_st.mkdir()
    shutil.copy2(eight_layers / "config.json", no_st / "config.json")
    assert main(["shrink-layers", str(no_st), "--layers", "2", "--out", str(tmp_path / "o"),
                 "--no-measure"]) == 2
    assert "no safetensors weights" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))
