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
    node_argv = cli._hang_fast_args(list(argv))
    if node_argv is not None:
        seen.append(node.parser().parse_args(node_argv))
    return node_argv is not None


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
    assert started == [want]


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
