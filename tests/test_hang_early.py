"""The CLI's fast path for a plain local `mldebug hang PID`: which command lines start the
dumps before the parsers are built, and that the parsed command line takes that collection
over only when its node options are the same."""

from __future__ import annotations

import argparse

import pytest

import mldebug.cli as cli
from mldebug.hang import early, node
from mldebug.hang.options import CollectOptions


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """What the fast path would start: the node options of ``_hang_fast_args``' argv."""
    seen: list[argparse.Namespace] = []
    monkeypatch.delenv("WCOLL", raising=False)
    monkeypatch.delenv("_ARGCOMPLETE", raising=False)
    return seen


def fast(argv: list[str], seen: list[argparse.Namespace]) -> bool:
    got = cli._hang_fast_args(list(argv))
    if got is not None:
        seen.append(node.fast_opts(*got))
    return got is not None


@pytest.mark.parametrize("argv", [
    ["hang"], ["hang", "--json"], ["hang", "--native", "--all-users"],
    ["hang", "123"], ["hang", "--pid", "123"], ["hang", "--pid", "123", "--json"],
    ["hang", "123", "--native", "--all", "--all-threads", "--show-secrets"],
    ["hang", "--locals", "--pid", "123", "--nonblocking", "--all-users"],
])
def test_plain_local_hang_starts_early_with_the_options_the_parser_gives(
        started: list[argparse.Namespace], argv: list[str]) -> None:
    assert fast(argv, started)
    args = cli.build_parser("hang").parse_args(
        [*argv[:1], "--pid", *argv[1:]] if argv[1:2] and argv[1].isdigit() else argv)
    from mldebug.hang.options import options_from_args

    want = node.parser().parse_args(options_from_args(args).node_args())
    assert [vars(o) for o in started] == [vars(want)]


@pytest.mark.parametrize("argv", [
    ["hang", "--pid"], ["hang", "--pid", "x"], ["hang", "--pid", "1", "--pid", "2"],
    ["hang", "--native", "123"], ["hang", "123", "--nodes", "n[1-2]"], ["hang", "123", "--out", "d"],
    ["hang", "123", "--signal"], ["hang", "123", "--watch", "1"], ["hang", "123", "--timeout", "5"],
    ["hang", "123", "--fr"], ["hang", "analyze", "d"], ["hang", "--help"], ["hang", "123", "--"],
    ["env"], [], ["hang", "--pid=123"], ["hang", "١٢٣"],
])
def test_anything_else_takes_the_plain_path(started: list[argparse.Namespace],
                                            argv: list[str]) -> None:
    assert not fast(argv, started)
    assert started == []


def test_fast_opts_are_the_parsers_defaults_and_flags() -> None:
    """``fast_opts`` builds the node options without argparse: its defaults are the parser's,
    every fast-path flag sets what the parser sets, and anything else is refused."""
    assert vars(node.fast_opts(None)) == vars(node.parser().parse_args([])) == node.DEFAULTS
    assert set(node.FAST_FLAGS) == cli._HANG_NODE_FLAGS
    for flag in node.FAST_FLAGS:
        assert vars(node.fast_opts(7, [flag])) == \
            vars(node.parser().parse_args(["--pid", "7", flag]))
    with pytest.raises(ValueError):
        node.fast_opts(7, ["--watch"])


def test_the_fast_path_loads_no_argparse_before_its_dumps_start() -> None:
    """The CLI's fast path starts the dumps before argparse, dataclasses (with inspect),
    shutil (zlib, bz2, lzma) and the debug-server route load: modules loaded by the
    interpreter's own start (a .pth hook) do not count."""
    import subprocess
    import sys

    code = ("import sys; base = set(sys.modules); import mldebug.cli as c; "
            "from mldebug.hang import early, node; "
            "o = node.fast_opts(*c._hang_fast_args(['hang', '--pid', '1'])); "
            "print(sorted(m for m in ('argparse', 'dataclasses', 'shutil', 'socket', "
            "'mldebug.hang.debugserver') if m in sys.modules and m not in base))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_wcoll_means_nodes(started: list[argparse.Namespace],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WCOLL", "/etc/hosts.pdsh")
    assert not fast(["hang", "123"], started)
    assert not fast(["hang"], started)


class FakeLocal:
    made: list[argparse.Namespace] = []

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.joined = False
        FakeLocal.made.append(opts)

        class T:
            def join(_self) -> None:
                self.joined = True

        self._thread = T()


def test_take_hands_over_only_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early, "Local", FakeLocal)
    monkeypatch.setattr(early, "_EARLY", None)
    FakeLocal.made = []
    opts = node.parser().parse_args(CollectOptions(pid=5).node_args())
    early.start_early(opts)
    first = early._EARLY[1]  # type: ignore[index]
    assert early.take(node.parser().parse_args(["--pid", "5"])) is first
    assert early._EARLY is None
    early.start_early(opts)  # not these options: the early one ends, a new one starts
    other = early.take(node.parser().parse_args(["--pid", "6"]))
    assert first is not other and FakeLocal.made[-1].pid == 6
    assert FakeLocal.made[-2] == opts
    early.start_early(opts)
    early.drop()
    assert early._EARLY is None


def test_main_in_process_leaves_no_early_collection(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """main() is also called in-process: no collection the fast path started outlives it."""
    monkeypatch.delenv("WCOLL", raising=False)
    assert cli.main(["hang", "--pid", "999999999", "--json"]) == 1  # no such process
    assert early._EARLY is None
