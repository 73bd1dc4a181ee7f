"""The trailing number of a file name (rank or pid), shared by hang and fr."""

from __future__ import annotations

import pytest

from mldebug.names import trailing_number


@pytest.mark.parametrize(("name", "number"), [
    ("job42_rank3", 3),
    ("job42_rank3.json", 3),
    ("/runs/7/fr_rank12.pkl", 12),
    ("node1-4123.txt", 4123),
    ("rank0", 0),
    ("rank", None),
    ("rank3.tar.gz", None),
    ("dump" + "9" * 5000, None),
])
def test_trailing_number(name, number):
    assert trailing_number(name) == number
