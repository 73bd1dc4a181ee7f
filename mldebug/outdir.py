"""Output directories (``--out DIR``): the names that lived here, now in ``mldebug.paths``.

``staged`` here yields the staging directory's path (for writers that take a path: safetensors,
tokenizers, datasets); new code uses ``mldebug.paths.staged``, whose ``Staged`` also writes by fd.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mldebug import paths
from mldebug.paths import MARKER, check_out, protected_reason, resolve, write_error

__all__ = ["MARKER", "check_out", "protected_reason", "resolve", "staged", "write_error"]


@contextmanager
def staged(out: Path, *, command: str = "") -> Iterator[Path]:
    """``mldebug.paths.staged``, yielding the path of the directory being built."""
    with paths.staged(out, command=command) as st:
        yield st.path
