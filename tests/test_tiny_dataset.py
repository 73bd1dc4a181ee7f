"""make-tiny-dataset on jsonl, parquet and image datasets; datasets.load_dataset reads the output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli
from envelope_check import check_envelope

from mldebug.cli import main

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def load(d: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    return datasets.load_dataset(str(d), cache_dir=str(tmp_path / "cache"))


def test_jsonl_stratified_covers_every_label(tmp_path: Path) -> None:
    src = tmp_path / "train.jsonl"
    with src.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"record {i}", "label": "rare" if i == 59 else i % 2})
                    + "\n")
    out = tmp_path / "tiny"
    r = run_cli("make-tiny-dataset", str(src), "--out", str(out), "-n", "4", "--select",
                "stratified", "--by", "label", "--seed", "3", "--json",
                env={**os.environ, "HF_DATASETS_OFFLINE": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert check_envelope(json.loads(r.stdout), "make-tiny-dataset") == {}
    assert json.loads(r.stdout)["splits"] == {"train": {"before": 60, "after": 4}}
    ds = load(out, tmp_path)["train"]
    assert len(ds) == 4
    assert {str(x) for x in ds["label"]} == {"0", "1", "rare"}
    assert "make-tiny-dataset" in (out / "README.md").read_text()


def test_parquet_splits_first_and_random(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    for split, n in (("train", 40), ("test", 10)):
        pq.write_table(pa.table({"x": list(range(n)), "s": [f"v{i}" for i in range(n)]}),
                       src / "data" / f"{split}-00000-of-00001.parquet")
    out = tmp_path / "first"
    assert main(["make-tiny-dataset", str(src), "--out", str(out), "-n", "3",
                 "--format", "parquet"]) == 0
    dd = load(out, tmp_path)
    assert dd["train"]["x"] == [0, 1, 2] and dd["test"]["x"] == [0, 1, 2]
    out2 = tmp_path / "random"
    assert main(["make-tiny-dataset", str(src), "--out", str(out2), "-n", "5", "--select",
                 "random", "--seed", "1"]) == 0
    xs = load(out2, tmp_path)["train"]["x"]
    assert len(xs) == 5 and xs == sorted(xs) and xs != [0, 1, 2, 3, 4]
    capsys.readouterr()


def test_images_shrink_keeping_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    imgs = [Image.new("RGB", (200, 100), (i * 20, 10, 10)) for i in range(8)]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": imgs, "label": list(range(8))}, features=feats) \
        .save_to_disk(str(tmp_path / "src"))
    out = tmp_path / "tiny-img"
    assert main(["make-tiny-dataset", str(tmp_path / "src"), "--out", str(out), "-n", "3",
                 "--image-size", "32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == \
        [("tiny-dataset-parquet-for-images", "info")] and doc["findings"][0]["fix"]
    ds = load(out, tmp_path)["train"]
    assert len(ds) == 3 and isinstance(ds.features["image"], datasets.Image)
    assert [im.size for im in ds["image"]] == [(32, 16)] * 3
    assert ds[1]["image"].getpixel((5, 5))[0] == 20  # the same pictures, smaller
    assert list(out.glob("data/*.parquet"))


def test_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-tiny-dataset", str(tmp_path / "nope.jsonl"), "--out",
                 str(tmp_path / "o"), "-n", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err
    src = tmp_path / "a.jsonl"
    src.write_text('{"a": 1}\n{"a": 2}\n')
    assert main(["make-tiny-dataset", str(src), "--out", str(tmp_path / "o"), "-n", "2",
                 "--select", "stratified"]) == 2
    assert "--by FIELD" in capsys.readouterr().err
    assert main(["make-tiny-dataset", str(src), "--out", str(tmp_path / "o"), "-n", "2",
                 "--select", "stratified", "--by", "b"]) == 2
    assert "no such column" in capsys.readouterr().err
    (tmp_path / "txt.xml").write_text("<a/>")
    assert main(["make-tiny-dataset", str(tmp_path / "txt.xml"), "--out", str(tmp_path / "o"),
                 "-n", "2"]) == 2
    assert "unknown data file type" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))
