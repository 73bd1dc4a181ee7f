"""shrink-layers: cut a real checkpoint's layer stack to N layers, one of each block type kept.

``plan_layers`` is pure (config dict in, plan out). ``slice_safetensors`` copies only the kept
layers' tensors, renumbered 0..N-1, reading each tensor lazily with ``safe_open`` so the rest
of the checkpoint never enters memory.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError
from mldebug.findings import Finding, Severity, findings_to_json
from mldebug.outdir import MARKER, check_out, staged
from mldebug.tiny.make import layers_raised
from mldebug.tiny.shrink import (
    Change,
    block_signatures,
    is_sub_config,
    layer_keys,
    reindex_layers,
    select_layers,
)
from mldebug.tiny.source import read_config

STACK_RE = re.compile(r"^(?P<prefix>(?:.*\.)?(?:layers|layer|h|block|blocks))\.(?P<idx>\d+)\.(?P<rest>.+)$")
SKIP_COPY = {".git", "original", MARKER}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")


@dataclass
class LevelPlan:
    path: str  # "" for the top level, "text_config." for a sub-config
    n_before: int
    kept: list[int]


@dataclass
class LayerPlan:
    config: dict[str, Any]
    levels: list[LevelPlan]
    changes: list[Change]
    notes: list[str] = field(default_factory=list)


def plan_layers(config: Mapping[str, Any], n: int) -> LayerPlan:
    """The config with every layer stack cut to ``n`` layers (more if block types need it)."""
    if n < 1:
        raise UsageError(f"--layers must be at least 1, got {n}.", "Pass e.g. --layers 2.")
    d = json.loads(json.dumps(config))
    levels: list[LevelPlan] = []
    changes: list[Change] = []
    notes: list[str] = []

    def walk(level: dict[str, Any], path: str) -> None:
        lk = layer_keys(level)
        if lk:
            main = "num_hidden_layers" if "num_hidden_layers" in lk else lk[0]
            n_src = level[main]
            sigs = block_signatures(level, n_src)
            want = min(n, n_src)
            if len(set(sigs)) > want:
                notes.append(f"{path or 'config'}: {len(set(sigs))} block types, so "
                             f"{len(set(sigs))} layers kept instead of {want}")
            kept = select_layers(sigs, want)
            if len(kept) < n_src:
                for c in reindex_layers(level, kept, n_src):
                    c.path = path + c.path
                    changes.append(c)
                for k in lk:
                    new = min(level[k], len(kept))
                    if new != level[k]:
                        changes.append(Change(path + k, level[k], new, "layers"))
                        level[k] = new
                levels.append(LevelPlan(path, n_src, kept))
        for k, v in level.items():
            if is_sub_config(v):
                walk(v, f"{path}{k}.")
    walk(d, "")
    if not levels:
        raise UsageError("nothing to shrink: the config has no layer count larger than "
                         f"{n}.", "Pass a smaller --layers, or check config.json.")
    return LayerPlan(d, levels, changes, notes)


def stack_of(name: str) -> tuple[str, int, str] | None:
    m = STACK_RE.match(name)
    if not m:
        return None
    return m.group("prefix"), int(m.group("idx")), m.group("rest")


def assign_stacks(names: list[str], levels: list[LevelPlan]) -> dict[str, LevelPlan]:
    """Which config level each tensor stack (``model.layers``, ``vision_tower...layers``) is."""
    counts: dict[str, int] = {}
    for nm in names:
        s = stack_of(nm)
        if s:
            counts[s[0]] = max(counts.get(s[0], 0), s[1] + 1)
    out: dict[str, LevelPlan] = {}
    for prefix, count in counts.items():
        cands = [lv for lv in levels if lv.n_before == count]
        if len(cands) > 1:
            hint = [lv for lv in cands if _matches(prefix, lv.path)]
            cands = hint or [lv for lv in cands if lv.path in ("", "text_config.")] or cands
        if cands:
            out[prefix] = cands[0]
    return out


def _matches(prefix: str, path: str) -> bool:
    p = prefix.lower()
    if path.startswith("vision"):
        return "vision" in p or "visual" in p
    if path.startswith("text") or path == "":
        return "vision" not in p and "visual" not in p and "audio" not in p
    if path.startswith("audio"):
        return "audio" in p
    return path.split("_")[0].rstrip(".") in p


def rename_map(names: list[str], levels: list[LevelPlan]) -> dict[str, str]:
    """Old tensor name -> new name for the tensors that stay; dropped layers are absent."""
    stacks = assign_stacks(names, levels)
    out = {}
    for nm in names:
        s = stack_of(nm)
        if s and s[0] in stacks:
            kept = stacks[s[0]].kept
            if s[1] in kept:
                out[nm] = f"{s[0]}.{kept.index(s[1])}.{s[2]}"
        else:
            out[nm] = nm
    return out


def _weight_index(model_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file, for one file or a sharded checkpoint."""
    idx = model_dir / "model.safetensors.index.json"
    if idx.is_file():
        return dict(json.loads(idx.read_text())["weight_map"])
    single = model_dir / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), "pt") as f:
            return {k: "model.safetensors" for k in f.keys()}  # noqa: SIM118
    raise UsageError(f"{model_dir} has no safetensors weights (model.safetensors or "
                     "model.safetensors.index.json).",
                     "--out slices safetensors only; use --in-place to edit just config.json, "
                     "or convert the checkpoint to safetensors first.")


def slice_safetensors(src: Path, dst: Path, levels: list[LevelPlan]) -> dict[str, Any]:
    """Write only the kept tensors (renumbered) from ``src`` into ``dst``; returns stats."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    weight_map = _weight_index(src)
    renames = rename_map(list(weight_map), levels)
    by_file: dict[str, list[str]] = {}
    for old in renames:
        by_file.setdefault(weight_map[old], []).append(old)
    new_map: dict[str, str] = {}
    total = 0
    for fname in sorted(by_file):
        tensors = {}
        with safe_open(str(src / fname), "pt") as f:
            meta = f.metadata() or {"format": "pt"}
            for old in by_file[fname]:
                t = f.get_tensor(old)
                tensors[renames[old]] = t
                total += t.numel() * t.element_size()
        out_name = fname if len(by_file) > 1 else "model.safetensors"
        save_file(tensors, str(dst / out_name), metadata=meta)
        for new in tensors:
            new_map[new] = out_name
    if len(by_file) > 1:
        (dst / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))},
            indent=2))
    return {"tensors_before": len(weight_map), "tensors_after": len(new_map),
            "bytes_after": total, "dropped": sorted(set(weight_map) - set(renames))}


@dataclass
class LayersReport:
    model_dir: str
    out: str
    levels: list[LevelPlan]
    changes: list[Change]
    findings: list[Finding]
    slice_stats: dict[str, Any] | None = None
    load_s_before: float | None = None
    load_s_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["levels"] = [lv.__dict__ for lv in self.levels]
        d["changes"] = [c.to_dict() for c in self.changes]
        d["findings"] = findings_to_json(self.findings)
        if self.slice_stats:
            d["slice_stats"] = {k: v for k, v in self.slice_stats.items() if k != "dropped"}
            d["slice_stats"]["dropped_count"] = len(self.slice_stats["dropped"])
        return d


def time_load(model_dir: Path) -> float:
    """Seconds to load a checkpoint with the Auto class its config names (CPU)."""
    import gc

    from mldebug.tiny.build import count_params_meta, make_config, pick_auto_class

    cfg = json.loads((model_dir / "config.json").read_text())
    _, auto_cls = pick_auto_class(cfg["model_type"], cfg.get("architectures"))
    config = make_config(cfg)
    count_params_meta(config, auto_cls)  # import the modeling code outside the timed part
    t0 = time.perf_counter()
    model = auto_cls.from_pretrained(str(model_dir), config=config)
    elapsed = time.perf_counter() - t0
    del model
    gc.collect()
    return elapsed


def shrink_layers(model_dir: Path, n: int, *, out: Path | None, in_place: bool,
                  measure: bool = True, force: bool = False) -> LayersReport:
    from mldebug.tiny.build import offline
    from mldebug.tiny.make import _quiet

    offline()
    _quiet()
    if out is not None:
        out = check_out(out, force=force, inputs=[model_dir])
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{model_dir} has no config.json.", "Pass a local model directory.")
    src_cfg = read_config(cfg_path)
    plan = plan_layers(src_cfg, n)
    findings = [layers_raised(n) for n in plan.notes]
    report = LayersReport(str(model_dir), str(out or model_dir), plan.levels, plan.changes,
                          findings)
    if in_place:
        if measure:
            report.load_s_before = time_load(model_dir)
        backup = model_dir / "config.json.orig"
        if not backup.exists():
            shutil.copy2(cfg_path, backup)
        cfg_path.write_text(json.dumps(plan.config, indent=2) + "\n")
        for lv in plan.levels:
            if lv.kept != list(range(len(lv.kept))):
                first = list(range(len(lv.kept)))
                findings.append(Finding(
                    Severity.WARNING, f"{lv.path or 'config'}: in place, layers {first} load the "
                    f"weights of source layers {first} but have the block types of layers "
                    f"{lv.kept}", fix="Use --out DIR for a copy with exactly the kept layers' "
                    "weights.", code="shrink-layers-in-place-weights"))
        findings.append(Finding(
            Severity.INFO, f"original config kept as {backup}",
            fix=f"Restore it with: mv {backup} {cfg_path}", code="shrink-layers-backup"))
        if measure:
            report.load_s_after = time_load(model_dir)
        return report
    assert out is not None
    try:
        with staged(out) as tmp:
            report.slice_stats = slice_safetensors(model_dir, tmp, plan.levels)
            for p in model_dir.iterdir():
                if p.name in SKIP_COPY or p.name.endswith(WEIGHT_SUFFIXES) \
                        or p.name in ("config.json", "model.safetensors.index.json"):
                    continue
                if p.is_file():
                    shutil.copy2(p, tmp / p.name)
            (tmp / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
            if measure:
                time_load(tmp)  # warm-up (and proof the result loads): caches, lazy imports
                report.load_s_before = time_load(model_dir)
                report.load_s_after = time_load(tmp)
    except MldebugError:
        raise
    except Exception as e:
        raise MldebugError(f"shrinking {model_dir} failed: {type(e).__name__}: {e}",
                           "Nothing was written; report this with the model's config.json.") from e
    return report
