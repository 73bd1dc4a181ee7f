"""Numbers carried by file names: the rank or pid a dump file ends in.

One rule for hang and fr: the TRAILING number counts (``job42_rank3.json`` is rank 3, not
423), an extension after it is ignored, and an absurdly long digit run is no number at all.
"""

from __future__ import annotations

import os
import re

_TRAILING_NUM = re.compile(r"(\d+)(?:\.[A-Za-z]+)?$")
_MAX_DIGITS = 18  # far beyond any rank or pid, and far below Python's int-parsing limit


def trailing_number(name: str) -> int | None:
    """The number the base name of ``name`` ends in (before one alphabetic extension), or None."""
    m = _TRAILING_NUM.search(os.path.basename(name))
    if m is None or len(m.group(1)) > _MAX_DIGITS:
        return None
    return int(m.group(1))
