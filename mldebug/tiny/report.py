"""Human output of make-tiny, shrink-layers and make-tiny-dataset: ``render(report, console)``.

The reports are built by ``make``, ``layers`` and ``dataset``; this module only prints them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mldebug.findings import render_findings

if TYPE_CHECKING:
    from rich.console import Console


def render(report: Any, console: Console) -> None:
    """Print any tiny-command report (model, layers or dataset) and its findings."""
    from mldebug.tiny.dataset import DatasetReport
    from mldebug.tiny.layers import LayersReport

    if isinstance(report, LayersReport):
        _render_layers(report, console)
    elif isinstance(report, DatasetReport):
        _render_dataset(report, console)
    else:
        _render_model(report, console)
    if report.findings:
        render_findings(report.findings, console)


def _changes_table(title: str, changes: list[Any]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("field", "before", "after", "why"):
        t.add_column(col)
    for ch in changes:
        t.add_row(ch.path, json.dumps(ch.before), json.dumps(ch.after), ch.why)
    return t


def _render_model(r: Any, con: Console) -> None:
    from rich.table import Table

    from mldebug.tiny.make import human_bytes, human_count

    t = Table(title=f"make-tiny {r.model_type} -> {r.out}", title_justify="left")
    t.add_column("")
    t.add_column("source", justify="right")
    t.add_column("tiny", justify="right")
    t.add_row("parameters", human_count(r.params_before), human_count(r.params_after))
    est = " (est.)" if r.bytes_before_estimated else ""
    before = "?" if r.params_before is None and r.bytes_before_estimated else \
        human_bytes(r.bytes_before) + est
    t.add_row("weights on disk", before, human_bytes(r.bytes_after))
    if r.tokenizer:
        t.add_row("tokenizer vocab", str(r.tokenizer["vocab_before"] or "-"),
                  f"{r.tokenizer['vocab_after']} ({r.tokenizer['kind']})")
    if r.processor:
        t.add_row("processor", "", r.processor["class"])
    con.print(t)
    con.print(_changes_table("changed fields", r.changes))
    checks = ["forward" + (" (with an image)" if r.image_checked else "")]
    if r.generated:
        checks.append("generate")
    if r.processor:
        checks.append(f"AutoProcessor on {r.processor['input']}")
    checks.append("reload match")
    con.print(f"validated: {' + '.join(checks)} ({r.model_class}). Rebuild: {r.out}/make_tiny.sh")


def _render_layers(r: Any, con: Console) -> None:
    con.print(_changes_table(f"shrink-layers {r.model_dir} -> {r.out}", r.changes))
    for lv in r.levels:
        con.print(f"{lv.path or 'model'}: kept source layers {lv.kept} of {lv.n_before}")
    if r.slice_stats:
        s = r.slice_stats
        con.print(f"weights: {s['tensors_after']} of {s['tensors_before']} tensors kept "
                  f"({len(s['dropped'])} dropped), {s['bytes_after'] / 2**20:.1f} MiB written")
    if r.load_s_before is not None and r.load_s_after is not None:
        ratio = r.load_s_before / r.load_s_after if r.load_s_after else float("inf")
        con.print(f"load time: {r.load_s_before:.2f} s before, {r.load_s_after:.2f} s after "
                  f"({ratio:.1f}x faster)")


def _render_dataset(r: Any, con: Console) -> None:
    from rich.table import Table

    t = Table(title=f"make-tiny-dataset {r.source} -> {r.out}", title_justify="left")
    for col in ("split", "source rows", "kept", "file"):
        t.add_column(col)
    for (split, c), f in zip(r.splits.items(), r.files, strict=True):
        t.add_row(split, str(c["before"]), str(c["after"]), f)
    con.print(t)
    con.print(f"selection: {r.select}; columns: {', '.join(r.columns)}")
    con.print("validated: datasets.load_dataset(DIR) loads it")
