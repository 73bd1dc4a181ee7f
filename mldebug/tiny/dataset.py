"""make-tiny-dataset: N records of a dataset as plain data files ``load_dataset(DIR)`` reads.

Since ``datasets`` 4.0 no loading script runs, so the output is data files only (jsonl or
parquet, one per split, hub naming ``data/<split>-00000-of-00001.<ext>``) plus a README card
with the command that rebuilt it. Images are shrunk to fit a square of ``image_size`` pixels,
keeping their aspect ratio.
"""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError
from mldebug.findings import Finding, Severity, findings_to_json
from mldebug.lifetime import sigterm_unwinds
from mldebug.outdir import check_out, staged

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
                 ".arrow": "arrow"}


@dataclass
class DatasetReport:
    source: str
    out: str
    format: str
    select: str
    splits: dict[str, dict[str, int]]  # split -> {"before": rows, "after": rows}
    columns: list[str]
    image_columns: list[str]
    files: list[str]
    findings: list[Finding] = field(default_factory=list)
    command: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["findings"] = findings_to_json(self.findings)
        return d


def choose_indices(values: Sequence[Any] | None, total: int, n: int, how: str,
                   seed: int) -> list[int]:
    """Row indices to keep (sorted). Pure: ``values`` is the --by column for stratified."""
    n = min(n, total)
    if how == "first":
        return list(range(n))
    rng = random.Random(seed)
    if how == "random":
        return sorted(rng.sample(range(total), n))
    if how == "stratified":
        if values is None:
            raise UsageError("--select stratified needs --by FIELD.", "E.g. --by label.")
        first: dict[Any, int] = {}
        for i, v in enumerate(values):
            first.setdefault(_key(v), i)
        if len(first) > n:
            raise UsageError(
                f"the field has {len(first)} distinct values, more than -n {n}, so not every "
                "value can be covered.", f"Pass -n {len(first)} or more, or --select random.")
        keep = set(first.values())
        rest = [i for i in range(total) if i not in keep]
        keep |= set(rng.sample(rest, n - len(keep)))
        return sorted(keep)
    raise UsageError(f"unknown --select {how!r}.", "Use first, random or stratified.")


def _key(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _key(x)) for k, x in v.items()))
    return v


def fit_size(w: int, h: int, limit: int) -> tuple[int, int]:
    """Largest size within limit x limit with the same aspect ratio (never upscales)."""
    if w <= limit and h <= limit:
        return w, h
    scale = limit / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


MAX_JSON_DEPTH = 100  # pyarrow's JSON reader crashes the process (SIGSEGV) on deep nesting
_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')


def check_json_depth(path: Path, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse a JSON / JSON-lines file nested deeper than ``limit`` before a C parser sees it.

    Streams the file line by line; strings are cut out first so brackets inside them do not
    count. Linear in the file size.
    """
    depth = 0
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if b'"' in line:
                line = _JSON_STRING.sub(b"", line)
            opens = line.count(b"[") + line.count(b"{")
            if depth + opens > limit:
                deepest = depth
                for ch in line:
                    if ch in (0x5B, 0x7B):  # [ {
                        depth += 1
                        deepest = max(deepest, depth)
                    elif ch in (0x5D, 0x7D):  # ] }
                        depth = max(0, depth - 1)
                if deepest > limit:
                    raise UsageError(
                        f"{path} line {lineno} is nested more than {limit} levels deep; refusing "
                        "to parse it (deep nesting crashes the JSON reader).",
                        "Flatten the records, or remove the malformed line.")
            else:
                depth = max(0, depth + opens - line.count(b"]") - line.count(b"}"))


def _json_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p] if p.suffix.lower() in (".json", ".jsonl") else []
    return sorted(f for f in p.rglob("*") if f.suffix.lower() in (".json", ".jsonl")
                  and f.is_file() and not f.is_symlink())


def load_source(source: str, cache_dir: str | None = None) -> Any:
    """A DatasetDict from a data file, a directory of data files, or a save_to_disk directory."""
    import datasets

    p = Path(source).expanduser()
    if not p.exists():
        raise UsageError(f"{source} does not exist (make-tiny-dataset reads local data only).",
                         "Pass a jsonl/json/csv/parquet/arrow file, a directory of them, or a "
                         "datasets save_to_disk directory.")
    saved = p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file())
    if not saved:
        for f in _json_files(p):
            check_json_depth(f)
    try:
        if saved:
            ds = datasets.load_from_disk(str(p))
        elif p.is_dir():
            ds = datasets.load_dataset(str(p), cache_dir=cache_dir)
        else:
            builder = FILE_BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise UsageError(f"{p.name}: unknown data file type {p.suffix!r}.",
                                 f"Use one of {', '.join(FILE_BUILDERS)}.")
            if builder == "arrow":
                ds = datasets.Dataset.from_file(str(p))
            else:
                ds = datasets.load_dataset(builder, data_files={"train": str(p)},
                                          cache_dir=cache_dir)
    except UsageError:
        raise
    except Exception as e:  # datasets raises many types for unreadable data
        raise UsageError(f"cannot read {source} as a dataset: {type(e).__name__}: {e}",
                         "Check the file format, or convert it to jsonl/parquet.") from e
    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    return ds


def image_columns(features: Any) -> list[str]:
    import datasets

    return [k for k, f in features.items() if isinstance(f, datasets.Image)]


def make_tiny_dataset(source: str, out: Path, n: int, *, fmt: str = "jsonl",
                      image_size: int = 32, seed: int = 0, select: str = "first",
                      by: str | None = None, force: bool = False,
                      command: str = "") -> DatasetReport:
    from mldebug.tiny.build import offline

    offline()
    _quiet()
    if n < 1:
        raise UsageError(f"-n must be at least 1, got {n}.", "Pass e.g. -n 100.")
    if image_size < 1:
        raise UsageError(f"--image-size must be at least 1, got {image_size}.", "Pass e.g. 32.")
    if fmt not in ("jsonl", "parquet"):
        raise UsageError(f"unknown --format {fmt!r}.", "Use jsonl or parquet.")
    if select == "stratified" and not by:
        raise UsageError("--select stratified needs --by FIELD.", "E.g. --by label.")
    src_path = Path(source).expanduser()
    out = check_out(out, force=force, inputs=[src_path] if src_path.exists() else [])
    # keep copies out of ~/.cache; removed on SIGTERM too (it unwinds like Ctrl-C: #39)
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="mldebug-tiny-ds-") as cache:
        return _make(source, out, n, fmt, image_size, seed, select, by, command, cache)


def _make(source: str, out: Path, n: int, fmt: str, image_size: int, seed: int, select: str,
          by: str | None, command: str, cache_dir: str) -> DatasetReport:
    dd = load_source(source, cache_dir)
    findings: list[Finding] = []
    first = next(iter(dd.values()))
    imgs = image_columns(first.features)
    if imgs and fmt == "jsonl":
        fmt = "parquet"
        findings.append(Finding(
            Severity.INFO, f"image columns {imgs}: written as parquet (jsonl cannot hold images)",
            fix="Nothing to do; pass --format parquet to ask for it.",
            code="tiny-dataset-parquet-for-images"))
    if by and by not in first.column_names:
        raise UsageError(f"--by {by}: no such column.", f"Columns: {', '.join(first.column_names)}.")
    splits: dict[str, dict[str, int]] = {}
    files: list[str] = []
    with staged(out, command=command) as tmp:
        (tmp / "data").mkdir()
        for split, ds in dd.items():
            values = ds[by] if by else None
            idx = choose_indices(values, len(ds), n, select, seed)
            small = ds.select(idx)
            if imgs:
                small = small.map(lambda row: _shrink_images(row, imgs, image_size),
                                  load_from_cache_file=False, keep_in_memory=True)
            name = f"data/{split}-00000-of-00001.{fmt}"
            if fmt == "parquet":
                small.to_parquet(str(tmp / name))
            else:
                small.to_json(str(tmp / name), lines=True, force_ascii=False)
            files.append(name)
            splits[split] = {"before": len(ds), "after": len(small)}
        report = DatasetReport(source, str(out), fmt, select + (f" --by {by}" if by else ""),
                               splits, list(first.column_names), imgs, files, findings, command)
        _write_card(tmp, report, seed)
        _validate(tmp, splits, imgs, image_size, cache_dir)
    return report


def _quiet() -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def _shrink_images(row: dict[str, Any], cols: list[str], limit: int) -> dict[str, Any]:
    for c in cols:
        img = row[c]
        if img is not None and hasattr(img, "size"):
            size = fit_size(img.size[0], img.size[1], limit)
            if size != img.size:
                fmt = img.format
                img = img.resize(size)
                img.format = fmt
            row[c] = img
    return row


def _validate(d: Path, splits: dict[str, dict[str, int]], imgs: list[str], limit: int,
              cache_dir: str) -> None:
    import datasets

    try:
        loaded = datasets.load_dataset(str(d), cache_dir=cache_dir)
    except Exception as e:
        raise MldebugError(f"the tiny dataset does not load with load_dataset: {type(e).__name__}: {e}",
                           "Report this with the source dataset.") from e
    for split, counts in splits.items():
        if split not in loaded or len(loaded[split]) != counts["after"]:
            raise MldebugError(f"the tiny dataset's split {split!r} did not load back with "
                               f"{counts['after']} rows.", "Report this with the source dataset.")
        for c in imgs:
            for img in loaded[split][c]:
                if img is not None and max(img.size) > limit:
                    raise MldebugError(f"an image in column {c!r} is still {img.size}.",
                                       "Report this with the source dataset.")


def _write_card(d: Path, r: DatasetReport, seed: int) -> None:
    yaml = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split, f in zip(r.splits, r.files, strict=True):
        yaml += [f"  - split: {split}", f"    path: {f}"]
    lines = [*yaml, "---", "", "# Tiny dataset", "",
             f"{sum(s['after'] for s in r.splits.values())} records from `{r.source}` for "
             "fast debugging and tests, as plain data files: "
             "`datasets.load_dataset(\"<this directory>\")` loads them, no script needed.", "",
             "| split | source rows | kept |", "| --- | --- | --- |"]
    lines += [f"| {s} | {c['before']} | {c['after']} |" for s, c in r.splits.items()]
    lines += ["", f"- selection: {r.select} (seed {seed})", f"- format: {r.format}",
              f"- columns: {', '.join(r.columns)}"]
    if r.image_columns:
        lines.append(f"- images in {', '.join(r.image_columns)} shrunk to fit "
                     "the --image-size square, aspect ratio kept")
    lines += [f"- {f.title}" for f in r.findings]
    lines += ["", "## Rebuild", "", "```bash", r.command, "```", ""]
    (d / "README.md").write_text("\n".join(lines))
