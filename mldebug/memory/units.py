"""Byte sizes for people: 1.50 GiB, and '512MiB' / '1G' / '300MB' back to bytes."""

from __future__ import annotations

import re

from mldebug.errors import UsageError

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4,
          "tb": 1000**4, "tib": 1024**4}


def fmt_bytes(n: float | int | None, signed: bool = False) -> str:
    """1536 -> '1.50 KiB'; None -> '-'."""
    if n is None:
        return "-"
    sign = "+" if signed and n > 0 else ("-" if n < 0 else "")
    v = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{v:.2f} {unit}"
        v /= 1024
    return f"{sign}{v:.2f} TiB"  # pragma: no cover


def parse_size(text: str) -> int:
    """'1GiB' -> 1073741824; plain numbers are bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read the size {text!r}.",
                         "Write a number with an optional unit, e.g. 512MiB, 1GiB, 2G.")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
