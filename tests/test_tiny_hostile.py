"""Careless and hostile input to the tiny commands: nothing of the user's is deleted, every bad
input is a one-line error (never a traceback, never a crash of the process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import run_cli

from mldebug.cli import main
from mldebug.errors import UsageError
from mldebug.outdir import MARKER, check_out, protected_reason

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _env() -> dict[str, str]:
    return {**os.environ, **OFFLINE}


def _one_line_error(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("mldebug: error: "), r.stderr
    return r.stderr


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@contextmanager
def tmpfs(where: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A real tmpfs mounted at ``where`` (tiny, or read-only); skip when mounting is not allowed."""
    where.mkdir()
    opts = f"size={size}" + (",ro" if read_only else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# -- --out and --force: only what mldebug wrote is ever replaced --------------------------------

def test_force_never_replaces_the_current_directory_holding_the_dataset(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    (work / "notes.txt").write_text("mine")
    before = _tree(work)
    for cmd in (["make-tiny-dataset", "train.jsonl", "-n", "1"], ["make-tiny", "llama"]):
        r = run_cli(*cmd, "--out", ".", "--force", cwd=work, env=_env(), timeout=120)
        err = _one_line_error(r, 2)
        assert "it is the current directory" in err
        assert _tree(work) == before


def test_force_never_replaces_an_ancestor_of_the_input(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "a"}\n')
    before = _tree(tmp_path)
    r = run_cli("make-tiny-dataset", str(data / "train.jsonl"), "-n", "1", "--out", str(tmp_path),
                "--force", env=_env())
    assert "contains the input" in _one_line_error(r, 2)
    assert _tree(tmp_path) == before


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from mldebug.tiny.make import make_tiny
    from mldebug.tiny.shrink import ShrinkSpec

    d = tmp_path_factory.mktemp("models") / "src-model"
    make_tiny("llama", d, ShrinkSpec(layers=3, explicit=frozenset({"layers"})), tokenizer=False)
    return d


def test_shrink_layers_force_never_replaces_the_parent_of_the_source(small_model: Path) -> None:
    parent = small_model.parent
    before = _tree(parent)
    r = run_cli("shrink-layers", str(small_model), "--layers", "1", "--out", str(parent),
                "--force", "--no-measure", env=_env())
    assert "contains the input" in _one_line_error(r, 2)
    assert _tree(parent) == before
    r = run_cli("shrink-layers", str(small_model), "--layers", "1", "--out", str(small_model),
                "--force", "--no-measure", env=_env())
    assert "it is the input" in _one_line_error(r, 2)
    assert _tree(parent) == before


def test_force_replaces_only_a_directory_mldebug_wrote(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "cut"
    assert main(["shrink-layers", str(small_model), "--layers", "1", "--out", str(out),
                 "--no-measure", "--json"]) == 0
    assert (out / MARKER).is_file() and (out / "config.json").is_file()
    assert main(["shrink-layers", str(small_model), "--layers", "2", "--out", str(out),
                 "--no-measure", "--force", "--json"]) == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "results.csv").write_text("step,loss\n1,2.3\n")
    r = run_cli("shrink-layers", str(small_model), "--layers", "1", "--out", str(theirs),
                "--force", "--no-measure", env=_env())
    err = _one_line_error(r, 2)
    assert "was not written by mldebug" in err and "rm -r" in err
    assert (theirs / "results.csv").read_text() == "step,loss\n1,2.3\n"


def test_root_home_and_cwd_are_protected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home / "proj")
    assert protected_reason(Path("/")) == "it is the root directory"
    assert protected_reason(home) == "it is your home directory ($HOME)"
    assert protected_reason(Path("~")) == "it is your home directory ($HOME)"
    assert protected_reason(Path(".")) == "it is the current directory"
    assert protected_reason(Path("..")) == "it is your home directory ($HOME)"
    assert protected_reason(tmp_path) == "it contains your home directory ($HOME)"
    monkeypatch.chdir(tmp_path)
    assert protected_reason(tmp_path.parent) == "it contains your home directory ($HOME)"
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(home / "proj")
    assert protected_reason(home) == "it contains the current directory"
    assert protected_reason(home / "proj" / "new") is None
    for p in (Path("/"), home, Path(".")):
        with pytest.raises(UsageError, match="never replaces"):
            check_out(p, force=True)


def test_out_that_is_a_file_or_a_symlink_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\x00" * 16)
    r = run_cli("make-tiny-dataset", str(f), "-n", "1", "--out", str(f), "--force", env=_env())
    assert "is a file" in _one_line_error(r, 2)
    assert f.read_bytes() == b"\x00" * 16
    target = tmp_path / "target"
    target.mkdir()
    (target / MARKER).write_text("{}")  # even a directory mldebug wrote is not reached via a link
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n')
    r = run_cli("make-tiny-dataset", str(tmp_path / "d.jsonl"), "-n", "1", "--out", str(link),
                "--force", env=_env())
    assert "symbolic link" in _one_line_error(r, 2)
    assert (target / "keep").read_text() == "x" and link.is_symlink()


def test_out_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "48k") as small:
        r = run_cli("make-tiny", "llama", "--out", str(small / "tiny"), env=_env(), timeout=180)
        assert "the disk is full" in _one_line_error(r, 1)
        assert list(small.iterdir()) == []


def test_out_on_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n')
    with tmpfs(tmp_path / "ro", "64k", read_only=True) as ro:
        r = run_cli("make-tiny-dataset", str(tmp_path / "d.jsonl"), "-n", "1",
                    "--out", str(ro / "tiny"), env=_env())
        assert "read-only" in _one_line_error(r, 1)


# -- bad values and bad files --------------------------------------------------------------------

def test_set_with_a_wrongly_typed_value_is_one_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    for item, words in (("hidden_size=abc", "hidden_size is an integer"),
                        ("rms_norm_eps=abc", "rms_norm_eps is a finite number"),
                        ("num_attention_heads=2.5", "num_attention_heads is an integer")):
        assert main(["make-tiny", "llama", "--out", str(tmp_path / "o"), "--set", item]) == 2
        err = capsys.readouterr().err
        assert words in err and "--set" in err and len(err.strip().splitlines()) == 2
    assert not (tmp_path / "o").exists()


BAD_CONFIGS: dict[str, tuple[bytes, str]] = {
    "not-utf8": (b'\xff\xfe{"model_type": "llama"}', "not UTF-8"),
    "not-json": (b'{"model_type": "llama",', "not valid JSON"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "type-not-text": (b'{"model_type": 5}', "no 'model_type' text field"),
    "hidden-text": (b'{"model_type": "llama", "hidden_size": "abc"}', "rejected the source"),
    "heads-zero": (b'{"model_type": "llama", "num_attention_heads": 0}', "at least 1"),
    "sub-config-text": (b'{"model_type": "gemma3", "text_config": "x"}', "rejected the source"),
    "huge-int": (b'{"model_type": "llama", "hidden_size": 1' + b"0" * 5000 + b"}",
                 "not valid JSON"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_invalid_config_json_is_one_line(name: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    raw, words = BAD_CONFIGS[name]
    (tmp_path / "config.json").write_bytes(raw)
    assert main(["make-tiny", str(tmp_path / "config.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert len(err.strip().splitlines()) == 2  # the message and the fix
    assert main(["shrink-layers", str(tmp_path), "--layers", "1", "--in-place"]) == 2
    assert words in capsys.readouterr().err or name in ("hidden-text", "heads-zero",
                                                        "sub-config-text")
    assert not (tmp_path / "o").exists()


def test_deeply_nested_jsonl_is_refused_before_the_parser_crashes(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"ok": 1}\n{"a": ' + "[" * 100_000 + "1" + "]" * 100_000 + "}\n")
    r = run_cli("make-tiny-dataset", str(deep), "-n", "1", "--out", str(tmp_path / "o"),
                env=_env())  # before the guard: exit -11 (SIGSEGV in pyarrow's JSON reader)
    err = _one_line_error(r, 2)
    assert "line 2 is nested more than 100 levels" in err
    d = tmp_path / "dir"
    d.mkdir()
    shutil.copy(deep, d / "part.json")
    r = run_cli("make-tiny-dataset", str(d), "-n", "1", "--out", str(tmp_path / "o"), env=_env())
    assert "part.json line 2" in _one_line_error(r, 2)


def test_depth_guard_ignores_brackets_in_strings_and_counts_across_lines(tmp_path: Path) -> None:
    from mldebug.tiny.dataset import check_json_depth

    f = tmp_path / "ok.jsonl"
    f.write_text(json.dumps({"text": "[" * 5000 + '\\"{' * 300}) + "\n" + '{"b": [[1]]}\n')
    check_json_depth(f)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads("[" * 150 + "]" * 150), indent=1))
    with pytest.raises(UsageError, match="line 101 is nested more than 100"):
        check_json_depth(pretty)
    pretty.write_text(json.dumps(json.loads("[" * 90 + "]" * 90), indent=1))
    check_json_depth(pretty)
