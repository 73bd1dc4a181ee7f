"""The regression guard (`benchmarks/run.py --against REV`): a figure over 1.15x is measured
again before it is flagged. The measurements are scripted (a figure's seconds per tree and
per round); the worktree of REV, the byte-compiling and the report are the real ones.

Not in the parallel tier: it adds a git worktree to this checkout, which two workers doing the
same at once would race on."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import run as guard  # noqa: E402


def _guard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, first: float, again: float,
           confirm: int) -> int:
    """The guard on ``--only help``, 2 rounds, with `help` on this tree taking ``first`` times
    REV's seconds in those rounds and ``again`` times in the rounds after them."""
    seen: collections.Counter[tuple[str, ...]] = collections.Counter()

    def measure(argv, tree, env, cwd, clean_py=None):
        key = (*argv, str(tree))
        seen[key] += 1
        this = Path(tree) == guard.REPO
        factor = (first if seen[key] <= 2 else again) if this and "--help" in argv else 1.0
        return guard.Run(0.05 * factor, 0.04 * factor, 10.0, True, "")

    monkeypatch.setattr(guard, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["run.py", "--against", "HEAD", "--only", "help",
                                      "--rounds", "2", "--confirm", str(confirm),
                                      "--data", str(tmp_path)])
    return guard.main()


def test_a_first_reading_the_second_does_not_repeat_is_not_flagged(monkeypatch, tmp_path,
                                                                   capsys):
    assert _guard(monkeypatch, tmp_path, first=1.3, again=1.0, confirm=3) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("help "))
    assert "1.30x" in line and "not confirmed: 1.00x over 3 more rounds" in line
    assert "WORSE" not in line


def test_a_reading_that_repeats_is_flagged_with_both_ratios(monkeypatch, tmp_path, capsys):
    assert _guard(monkeypatch, tmp_path, first=1.3, again=1.25, confirm=3) == 3
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("help "))
    assert "1.30x" in line and "WORSE (again over 3 rounds: 1.25x)" in line
    assert "1 figure(s) more than 15% worse" in out


def test_without_confirmation_the_first_reading_decides(monkeypatch, tmp_path, capsys):
    assert _guard(monkeypatch, tmp_path, first=1.3, again=1.0, confirm=0) == 3
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("help "))
    assert line.endswith("WORSE")


def test_a_figure_under_the_threshold_is_measured_once(monkeypatch, tmp_path, capsys):
    assert _guard(monkeypatch, tmp_path, first=1.1, again=2.0, confirm=3) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("help "))
    assert "1.10x" in line and "confirmed" not in line and "WORSE" not in line
