"""A local ``mldebug hang`` collection on a thread: started by ``options.start_local``, or
earlier by the CLI's fast path (``start_early``) before the parsers and the fan-out types load.

Imports only the node module (stdlib + ``ranks``/``nodekit``), so starting the dumps costs
nothing the plain path would not load anyway.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mldebug.fanout import FanoutOptions, NodeResult, OnResult

# the collection the CLI started before its parsers were built: its node options, its docs
_EARLY: tuple[Any, Local] | None = None


class Local:
    """This host's collection running on a thread; called as ``collect.collect``'s ``docs``
    (``options.DocsFn``: the collect options, the target, ``on_result``, progress)."""

    def __init__(self, node_opts: Any) -> None:
        from mldebug.hang import node

        self._box: dict[str, Any] = {}
        dumping = threading.Event()

        def work() -> None:
            try:
                self._box["doc"] = node.collect(node_opts, dumping=dumping.set)
            except BaseException as e:  # handed to the caller's thread, raised there
                self._box["error"] = e
            finally:
                dumping.set()

        self._thread = threading.Thread(target=work, name="mldebug-hang-local", daemon=True)
        self._thread.start()
        # the ranks are found and their dumps spawned before the caller imports anything
        # more: both are Python work, and sharing the GIL would only delay the py-spy runs
        dumping.wait()

    def __call__(self, _opts: Any, _target: FanoutOptions, on_result: OnResult,
                 _progress: bool = True) -> list[NodeResult]:
        from mldebug.fanout import NodeResult

        if self._thread.is_alive():  # what the analysis and the report load lazily, meanwhile
            import hostlist  # noqa: F401  (mldebug.hosts.collapse)

            import mldebug.hang.rules
            import mldebug.redact  # noqa: F401  (the output's redaction)
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        doc = self._box["doc"]
        on_result(NodeResult(doc["host"], data=doc))
        return [NodeResult(doc["host"])]


def start_early(node_opts: Any) -> None:
    """Start the collection now with ``node_opts`` (``node.fast_opts``' or ``node.parser()``'s:
    the same attributes); ``take`` hands it over when the parsed command line gives the same
    options."""
    global _EARLY
    _EARLY = (node_opts, Local(node_opts))


def take(node_opts: Any) -> Local:
    """The collection for ``node_opts``: the one started early if its options are these,
    else a new one (after the early one, if any, has ended: two py-spy on one rank collide)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None:
        if vars(early[0]) == vars(node_opts):  # fast_opts' namespace or argparse's
            return early[1]
        early[1]._thread.join()
    return Local(node_opts)


def drop() -> None:
    """Forget a collection started early and not taken (its dumps end first)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    if early is not None:
        early[1]._thread.join()
