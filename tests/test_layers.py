"""The architecture as a test: capabilities sit on the shared layer and never import each
other (``hang --fr`` through ``mldebug/hang/flight.py`` aside), the shared layer imports no
capability, and no module import cycle exists. Imports are read from the source (``ast``),
including the ones inside functions, so a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mldebug"
CAPABILITIES = {p.name for p in PKG.iterdir()
                if p.is_dir() and (p / "__init__.py").exists() and p.name not in ("cli",)}
# the one documented sideways import: `mldebug hang --fr` reads the flight recorder
ALLOWED = {("mldebug.hang.flight", "fr")}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        mod = _module(path)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("mldebug"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("mldebug"):
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        out[mod] = names
    return out


def _capability(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in CAPABILITIES else None


def test_no_capability_imports_another_and_the_shared_layer_imports_none():
    bad = []
    for mod, names in _imports().items():
        if mod.startswith("mldebug.cli") or mod == "mldebug" or mod == "mldebug.__main__":
            continue  # the CLI and the package's lazy exports sit above everything
        mine = _capability(mod)
        for name in names:
            theirs = _capability(name)
            if theirs is None or theirs == mine or (mod, theirs) in ALLOWED:
                continue
            bad.append(f"{mod} imports {name}" + ("" if mine else " (shared layer -> capability)"))
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle_between_modules():
    graph = _imports()
    modules = set(graph)
    edges = {m: {n for n in names if n in modules and n != m} for m, names in graph.items()}
    # a package's __init__ re-exporting its own submodules is not a cycle of design
    for m in edges:
        edges[m] = {n for n in edges[m] if not m.startswith(n + ".") and not n.startswith(m + ".")}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_one_private_directory_rule():
    """``st_mode & 0o0..`` (the private-directory check) is written once: mldebug/privdir.py."""
    import re

    found = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if p.name != "privdir.py" and re.search(r"st_mode\s*&\s*0o0", p.read_text())]
    assert found == []
