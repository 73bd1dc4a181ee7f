"""``install_excepthook``: uncaught exceptions printed whole, prefixed ``[host:rank]``, under
the print lock - and with ``debug=True`` a debugger opened at the frame that raised. It lives
with the debugger because of that second part; the prefixing is ``mldebug.printing``'s."""

from __future__ import annotations

import sys
import threading
import traceback
from types import TracebackType
from typing import IO

from mldebug.printing import DEFAULT_FORMAT, _write_locked, make_prefix, prefix_lines


def install_excepthook(fmt: str = DEFAULT_FORMAT, *, numeric_host: bool = False,
                       file: IO[str] | None = None, debug: bool = False) -> None:
    """Print uncaught exceptions (main thread and threads) whole, prefixed, under the lock.

    ``debug=True``: then open a debugger at the frame that raised (``mldebug.post_mortem``:
    on the terminal, or a session for ``mldebug pdb connect`` when there is none).
    """

    def _emit(exc_type: type[BaseException], exc: BaseException,
              tb: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        prefix = make_prefix(fmt, numeric_host=numeric_host)
        _write_locked(prefix_lines(text, prefix), file if file is not None else sys.stderr)
        if debug and tb is not None and not issubclass(exc_type, KeyboardInterrupt):
            from mldebug.debugger.hooks import post_mortem

            post_mortem(tb)

    def _thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        _emit(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)

    sys.excepthook = _emit
    threading.excepthook = _thread_hook
