"""Trim a SentencePiece ``.model`` at the protobuf wire level (no protobuf package needed).

A ``ModelProto`` is a sequence of fields; field 1 repeats once per piece (a ``SentencePiece``
message: piece=1 string, score=2 float, type=3 enum). Trimming drops piece fields and copies
every other field byte for byte, so trainer/normalizer specs survive untouched.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclass
class Piece:
    piece: str
    score: float
    type: int
    raw: bytes  # the whole field (tag + length + body), re-emitted as is


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint in SentencePiece model")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(field number, wire type, value bytes, whole field bytes) for each top-level field."""
    out = []
    pos = 0
    while pos < len(buf):
        start = pos
        tag, pos = _varint(buf, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            _, pos = _varint(buf, pos)
            val = buf[start:pos]
        elif wt == 1:
            val = buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            val = buf[pos:pos + n]
            pos += n
        elif wt == 5:
            val = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt} in SentencePiece model")
        if pos > len(buf):
            raise ValueError("truncated SentencePiece model")
        out.append((num, wt, val, buf[start:pos]))
    return out


def parse_piece(field_value: bytes, raw: bytes) -> Piece:
    piece, score, typ = "", 0.0, NORMAL
    for num, wt, val, _ in _fields(field_value):
        if num == 1 and wt == 2:
            piece = val.decode("utf-8")
        elif num == 2 and wt == 5:
            score = struct.unpack("<f", val)[0]
        elif num == 3 and wt == 0:
            typ = _enum_value(val)  # varint fields keep their tag: see _fields
    return Piece(piece, score, typ, raw)


def _enum_value(tag_and_varint: bytes) -> int:
    _, pos = _varint(tag_and_varint, 0)
    value, _ = _varint(tag_and_varint, pos)
    return value


def read_pieces(data: bytes) -> list[Piece]:
    return [parse_piece(val, raw) for num, wt, val, raw in _fields(data) if num == 1 and wt == 2]


def model_type(data: bytes) -> str:
    """unigram / bpe / word / char, from trainer_spec.model_type (unigram when absent)."""
    for num, wt, val, _ in _fields(data):
        if num == 2 and wt == 2:
            for n2, w2, v2, _raw in _fields(val):
                if n2 == 3 and w2 == 0:
                    return MODEL_TYPES.get(_enum_value(v2), "unigram")
    return "unigram"


def forced_ids(pieces: list[Piece]) -> set[int]:
    """Pieces any text needs: control/unknown/user-defined, byte fallback, single ASCII chars."""
    keep = set()
    for i, p in enumerate(pieces):
        if p.type in (UNKNOWN, CONTROL, USER_DEFINED, BYTE):
            keep.add(i)
        elif len(p.piece) == 1 and (p.piece == "\u2581" or 32 < ord(p.piece) < 127):
            keep.add(i)
    return keep


def choose_kept(candidates: Iterable[int], forced: set[int], n: int) -> list[int]:
    """Every forced id, then candidates in order until ``n`` are kept (sorted old ids).

    Shared by SentencePiece trimming and tokenizer.json shrinking."""
    if len(forced) > n:
        from mldebug.errors import UsageError

        raise UsageError(
            f"a vocab of {n} cannot hold the {len(forced)} tokens this tokenizer needs "
            "(special tokens plus the alphabet that lets it encode any text).",
            f"Pass --vocab {len(forced)} or more.")
    kept = set(forced)
    for i in candidates:
        if len(kept) >= n:
            break
        kept.add(i)
    return sorted(kept)


def trim(data: bytes, n: int, keep_ids: set[int] | frozenset[int] = frozenset()) -> tuple[bytes, list[int]]:
    """A model with at most ``n`` pieces (old ids in ``kept`` order) and the kept old ids."""
    pieces = read_pieces(data)
    forced = forced_ids(pieces) | {i for i in keep_ids if 0 <= i < len(pieces)}
    reserve = len({i for i in keep_ids if not 0 <= i < len(pieces)})
    kept = choose_kept(range(len(pieces)), forced, max(1, n - reserve))
    keep_set = set(kept)
    out = bytearray()
    idx = 0
    for num, wt, _val, raw in _fields(data):
        if num == 1 and wt == 2:
            if idx in keep_set:
                out += raw
            idx += 1
        else:
            out += raw
    return bytes(out), kept
