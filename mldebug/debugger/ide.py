"""``mldebug.breakpoint(ide="debugpy")``: an IDE (VS Code, PyCharm) attaches to the rank.

debugpy listens on 127.0.0.1 (a random port); the rank registers the session like a pdb one
(``mldebug pdb list`` shows it) and prints the ssh port-forward and a ``launch.json``
"attach" entry. debugpy has no token: on a node shared with other users, anyone there who
connects first gets the session - say so, and prefer pdb sessions there. debugpy is the
optional extra ``mldebug[ide]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from mldebug.debugger import registry
from mldebug.debugger.remote import label, log, session_doc
from mldebug.dist import identity


def launch_json(name: str, port: int) -> str:
    """The VS Code launch.json entry that attaches to a forwarded port."""
    return json.dumps({"name": name, "type": "debugpy", "request": "attach",
                       "connect": {"host": "127.0.0.1", "port": port}, "justMyCode": False})


def debugpy_session(*, on_continue: Callable[[], None] | None = None,
                    directory: str | None = None) -> bool:
    """Wait for an IDE, stop, and release the other ranks when it continues.

    Returns False (after saying why) when debugpy is not installed, so the caller falls back
    to a pdb session rather than failing the rank.
    """
    import os

    # debugpy warns about frozen stdlib modules on every start; it concerns stepping into
    # the stdlib only, and would be one more unexplained line per rank in the job log
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        import debugpy
    except ImportError:
        log("mldebug.breakpoint: ide='debugpy' needs debugpy (pip install 'mldebug[ide]'); "
            "opening a pdb session instead.")
        return False
    import sys

    ident = identity()
    _, port = debugpy.listen(("127.0.0.1", 0))
    caller = sys._getframe(2)
    try:
        path: str | None = registry.write(registry.private_dir(directory),
                                          session_doc("debugpy", ident, int(port), "", caller))
    except (registry.RegistryError, OSError) as e:  # the IDE can still attach: say why unlisted
        log(f"mldebug.breakpoint: the debugpy session is not listed by mldebug pdb list ({e})")
        path = None
    who = label(ident)
    log(f"mldebug.breakpoint: {who} waits for an IDE (debugpy) on 127.0.0.1:{port}.\n"
        f"  forward the port: ssh -N -L {port}:127.0.0.1:{port} {ident.host}\n"
        f"  launch.json: {launch_json(f'mldebug {who}', int(port))}\n"
        "  debugpy has no token: any user on this node may attach first.")
    debugpy.wait_for_client()
    debugpy.breakpoint()  # the IDE stops on the next line; the caller is one frame up
    if path is not None:
        registry.remove(path)
    if on_continue is not None:
        on_continue()
    return True
