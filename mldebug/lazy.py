"""Lazy exports for a package ``__init__``: a name is imported from its module on first use,
so ``import mldebug`` (and ``mldebug.numerics``) never import torch for a command that does
not need it."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing itself costs ~5 ms of every `mldebug` start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def exports(package: str, table: Mapping[str, str], namespace: dict[str, Any]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``table`` maps each exported name to the
    module that defines it; a resolved name is cached in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace.get("__all__", table))

    return __getattr__, __dir__
