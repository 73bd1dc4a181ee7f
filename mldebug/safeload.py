"""Decoding outside data that arrives as pickles or JSON: flight-recorder dumps and memory
snapshots come from other machines and other users, so only plain containers, strings and
numbers are ever built, and nothing a hostile file nests can crash the process.

Also the one bounded reader of an input file (``read_input``): a regular file only (never a
device or a FIFO), at most ``limit`` bytes, sniffed before anything is decoded.
"""

from __future__ import annotations

import io
import json
import marshal
import os
import pickle
import re
import stat
from collections.abc import Callable
from functools import partial
from typing import Any

from mldebug.errors import MldebugError
from mldebug.nodekit import read_fd

# Globals a dump may name: containers that old picklers spell as globals. Nothing callable.
_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("__builtin__", "set"),
    ("__builtin__", "frozenset"), ("collections", "OrderedDict"),
}


class UnsafePickle(pickle.UnpicklingError):
    """The pickle asks for a Python object; flight-recorder dumps never do."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return dict  # ordered too; and only built-in types come out (``safe_loads``)
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickle(f"{module}.{name}")


class DeepNesting(pickle.UnpicklingError):
    """Tuples that could nest so deep that hashing one (a dict key, a set member) would
    overflow the C stack and kill the process (no recursion limit guards that), or
    containers nested deeper than any dump does."""


# Tuple-building opcodes (TUPLE, TUPLE1-3) cannot outnumber the bytes that spell them, so
# a pickle with few such bytes cannot nest tuples deeply; ~120,000 levels overflow an 8 MiB
# stack (CPython 3.11, x86-64: ~70 bytes a level).
_TUPLE_OPCODES = b"t\x85\x86\x87"
_OTHER_BYTES = bytes(sorted(set(range(256)) - set(_TUPLE_OPCODES)))
_COUNT_CHUNK = 4 << 20
_SAFE_TUPLE_BYTES = 20_000  # up to this many: decoded on the caller's stack
_STACK_PER_LEVEL = 256
_MAX_STACK = 1 << 30


def safe_loads(data: bytes) -> Any:
    """Decode a dump (pickle or JSON) building only plain data; raises on anything else.
    A pickle that could nest tuples deeply is decoded on a stack that fits them, then
    refused (``DeepNesting``) if it nests anything over 2,000 deep, so that whatever the
    caller hashes later cannot crash it."""
    need = stack_needed(data)
    if not need:
        return decode(data)
    doc = on_stack(need, partial(decode, data))
    try:
        marshal.dumps(doc)  # C speed; stops at ~2,000 levels of any container
    except ValueError as e:  # "too deeply nested" (the decoder builds only types it writes)
        raise DeepNesting(f"containers nested over 2,000 deep ({e}); refused") from None
    return doc


_LEADING_SPACE = re.compile(rb"\s*")


def _is_json(data: bytes) -> bool:
    """A JSON document (``_dump_fr_trace_json``) rather than a pickle; nothing is copied."""
    start = _LEADING_SPACE.match(data).end()  # type: ignore[union-attr]
    return data[start:start + 1] in (b"{", b"[")


def decode(data: bytes) -> Any:
    """``data`` as plain data. A pickle is read through a ``BufferedReader``: torch writes
    its dumps with protocol 2 (no frames), and without ``peek`` the C unpickler calls
    ``read`` once per opcode, which made a real dump 3.5-4x slower to decode than
    ``pickle.loads``; buffered, it decodes as fast (framed pickles too)."""
    if _is_json(data):
        return json.loads(data)  # nested too deep: RecursionError
    return _Restricted(io.BufferedReader(io.BytesIO(data))).load()


def stack_needed(data: bytes) -> int:
    """0 when decoding ``data`` and hashing what it holds is safe on an ordinary stack, else
    the stack size that fits the deepest tuples it could hold; ``DeepNesting`` over 1 GiB.
    Legitimate dumps land here too when their strings and numbers hold many such bytes (or
    torch writes a tuple per entry): a thread with a larger stack costs them nothing."""
    if _is_json(data):
        return 0  # JSON has no tuples
    bound = _count_tuple_opcodes(data)
    if bound <= _SAFE_TUPLE_BYTES:
        return 0
    need = bound * _STACK_PER_LEVEL + (8 << 20)
    if need > _MAX_STACK:
        raise DeepNesting(f"{bound:,} tuple-building bytes: tuples could nest that deep; "
                          "refused")
    return need


def _count_tuple_opcodes(data: bytes) -> int:
    """How many bytes of ``data`` are tuple-building opcodes: one pass at C speed (deleting
    every other byte), in chunks, so a file of nothing but such bytes is never copied whole;
    four ``count`` passes took 4x as long."""
    if len(data) <= _COUNT_CHUNK:
        return len(data.translate(None, _OTHER_BYTES))
    view = memoryview(data)
    return sum(len(bytes(view[i:i + _COUNT_CHUNK]).translate(None, _OTHER_BYTES))
               for i in range(0, len(data), _COUNT_CHUNK))


def on_stack(size: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread with a ``size``-byte stack (reserved, touched only as deep as
    it goes); its result or exception."""
    import threading

    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            err.append(e)

    try:
        old = threading.stack_size(size)
        try:
            t = threading.Thread(target=run, name="mldebug-decode", daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    except (RuntimeError, ValueError, MemoryError) as e:  # address-space limits (ulimit -v)
        raise DeepNesting(f"decoding it safely needs a thread with a {size >> 20} MiB stack, "
                          f"which could not start ({e}); refused") from None
    t.join()
    if err:
        raise err[0]
    return out[0]


class InputError(MldebugError):
    """An input file that cannot be read as asked: missing, not a regular file, too large."""


def read_input(path: str | os.PathLike[str], limit: int, what: str = "input",
               follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; larger is refused before it
    is read). Devices, FIFOs and directories are refused; ``follow=False`` also refuses a
    symlink (a name inside a directory another user can write)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == 40:  # ELOOP: a symlink with O_NOFOLLOW
            raise InputError(f"{path} is a symlink, not followed here.",
                             "Give the file it points to directly.") from None
        raise InputError(f"cannot read {what} {path}: {e.strerror}.",
                         "Check the path and its permissions.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO"
                    if stat.S_ISFIFO(st.st_mode) else "a device or socket")
            raise InputError(f"{path} is {kind}, not a regular file.",
                             f"Give a saved {what} file.")
        if st.st_size > limit:
            raise InputError(f"{path} is {st.st_size:,} bytes, over the {limit:,}-byte limit "
                             f"for a {what}.", "Give a smaller file, or only the part you need.")
        data = read_fd(fd, limit + 1)
        if len(data) > limit:
            raise InputError(f"{path} grew over the {limit:,}-byte limit while read.",
                             "Read it once it is complete.")
        return data
    finally:
        os.close(fd)


def sniff_pickle(data: bytes) -> bool:
    """Whether ``data`` starts like a pickle (protocol 2+ PROTO opcode) - checked before a
    large file is handed to the unpickler."""
    return len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5
