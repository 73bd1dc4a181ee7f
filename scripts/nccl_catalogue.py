#!/usr/bin/env python3
"""Regenerate the ``strings`` of mldebug/nccllog/catalogue.json from an NCCL git tree.

    python scripts/nccl_catalogue.py --repo /path/to/nccl.git [--tags v2.18.6-1 v2.30.7-1 ...]

For every tag it reads the sources under src/ (``git cat-file``, no checkout needed) and takes
the format string of every ``WARN(...)`` call, and of every ``INFO(...)`` call whose text reports
a failure or a fallback. Strings are keyed by their text; each records the files it appears in
and the tags (folded into ranges) in which it exists. The hand-written part of the catalogue
(components, their fixes, classification rules, causes) is kept; every string is then classified
with those rules, and the script exits 1 when one has no class (add a rule, then rerun).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parent.parent / "mldebug" / "nccllog" / "catalogue.json"
# The newest tag of each minor release from 2.12 on (what NCCL users run).
DEFAULT_TAGS = [
    "v2.12.12-1", "v2.13.4-1", "v2.14.3-1", "v2.15.5-1", "v2.16.5-1", "v2.17.1-1",
    "v2.18.6-1", "v2.19.4-1", "v2.20.5-1", "v2.21.5-1", "v2.22.3-1", "v2.23.4-1",
    "v2.24.3-1", "v2.25.1-1", "v2.26.6-1", "v2.27.7-1", "v2.28.9-1", "v2.29.7-1",
    "v2.30.7-1",
]
SKIP_DIRS = ("src/include/nvtx3/", "src/transport/net_ib/gdaki/doca-gpunetio/")
SOURCE_EXT = (".cc", ".cu", ".h", ".c", ".cpp", ".hpp")
# printf length macros from <inttypes.h> and NCCL's own, as they print
MACROS = {"PRIu64": "lu", "PRId64": "ld", "PRIx64": "lx", "PRIi64": "li", "PRIu32": "u",
          "PRId32": "d", "PRIx32": "x", "PRIX64": "lX", "PRIuPTR": "lu", "PRIxPTR": "lx",
          "NCCL_NET_HANDLE_MAXSIZE": "128"}
FAILURE_INFO = re.compile(
    r"fail|error|unable|cannot|can't|could not|couldn't|not supported|unsupported|disabl|"
    r"fall ?back|falling back|insufficient|too old|timed? ?out|abort|invalid|mismatch|"
    r"not found|no device|not available|unavailable|ignoring|ignored", re.I)
_STR = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def _literals(src: str, at: int) -> tuple[str | None, int]:
    """The format string that starts at ``src[at]`` (adjacent literals, PRI macros and
    ``#arg`` stringification joined), and where it ends; None if the first argument is not
    a literal (e.g. a variable)."""
    parts: list[str] = []
    i, n = at, len(src)
    while i < n:
        while i < n and src[i] in " \t\r\n\\":
            i += 1
        if src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i)
            i = n if j < 0 else j + 2
            continue
        if i < n and src[i] == '"':
            m = _STR.match(src, i)
            if not m:
                break
            parts.append(m.group(1))
            i = m.end()
            continue
        m = re.compile(r"#\s*(\w+)|(\w+)").match(src, i)
        if m and m.group(1):
            parts.append("%s")  # #name in a macro: the call's text
            i = m.end()
            continue
        if m and m.group(2) in MACROS and parts:
            parts.append(MACROS[m.group(2)])
            i = m.end()
            continue
        if m and parts and re.match(r'\s*"', src[m.end():m.end() + 20]):
            parts.append("%s")  # a macro parameter between literals: its text
            i = m.end()
            continue
        break
    if not parts:
        return None, i
    text = "".join(parts)
    text = text.replace('\\"', '"').replace("\\n", " ").replace("\\t", " ").replace("\\\\", "\\")
    return re.sub(r"\s+", " ", text).strip(), i


def extract(src: str) -> list[tuple[str, str]]:
    """(level, format) of each WARN(...) and failure-reporting INFO(...) in one file."""
    out = []
    for m in re.finditer(r"(?<![\w])(WARN|INFO)\s*\(", src):
        level = m.group(1)
        start = m.end()
        if level == "INFO":  # INFO(FLAGS, "fmt", ...): skip the flags argument
            comma = src.find(",", start, start + 300)
            if comma < 0 or src.startswith("...", start):
                continue
            start = comma + 1
        elif src.startswith("...", start):  # the macro's own definition
            continue
        fmt, _ = _literals(src, start)
        if not fmt or len(fmt) < 4:
            continue
        if level == "INFO" and not FAILURE_INFO.search(fmt):
            continue
        out.append((level, fmt))
    return out


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def scan(repo: str, tags: list[str]) -> dict[tuple[str, str], dict]:
    found: dict[tuple[str, str], dict] = {}
    for tag in tags:
        files = [f for f in _git(repo, "ls-tree", "-r", "--name-only", tag, "src").splitlines()
                 if f.endswith(SOURCE_EXT) and not f.startswith(SKIP_DIRS)]
        batch = "".join(f"{tag}:{f}\n" for f in files)
        raw = subprocess.run(["git", "-C", repo, "cat-file", "--batch"], input=batch.encode(),
                             check=True, capture_output=True).stdout
        pos = 0
        for f in files:
            header_end = raw.index(b"\n", pos)
            size = int(raw[pos:header_end].split()[2])
            body = raw[header_end + 1:header_end + 1 + size].decode("utf-8", "replace")
            pos = header_end + 1 + size + 1
            if "WARN" not in body and "INFO" not in body:
                continue
            for level, fmt in extract(body):
                e = found.setdefault((level, fmt), {"files": set(), "tags": set()})
                e["files"].add(f[4:] if f.startswith("src/") else f)
                e["tags"].add(tag)
    return found


def short(tag: str) -> str:
    return tag.lstrip("v").split("-")[0]


def fold(tags: set[str], order: list[str]) -> list[list[str]]:
    """Tags as [first, last] runs in release order."""
    runs: list[list[str]] = []
    prev = -2
    for i, t in enumerate(order):
        if t in tags:
            if i == prev + 1 and runs:
                runs[-1][1] = short(t)
            else:
                runs.append([short(t), short(t)])
            prev = i
    return runs


def dump(data: dict) -> str:
    """The catalogue as JSON with one line per string (reviewable diffs when NCCL changes)."""
    head = {k: v for k, v in data.items() if k != "strings"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # drop the closing brace
    lines = [json.dumps(s, ensure_ascii=False) for s in data.get("strings", [])]
    return text + ',\n "strings": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="an NCCL git tree or mirror")
    ap.add_argument("--tags", nargs="*", default=DEFAULT_TAGS)
    ap.add_argument("--out", default=str(CATALOGUE))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mldebug.nccllog.catalogue import Catalogue

    path = Path(args.out)
    data = json.loads(path.read_text()) if path.exists() else {}
    found = scan(args.repo, args.tags)
    data["tags"] = [short(t) for t in args.tags]
    data["strings"] = [
        {"level": level, "format": fmt, "files": sorted(e["files"]),
         "versions": fold(e["tags"], args.tags)}
        for (level, fmt), e in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    cat = Catalogue(data)
    missing = 0
    for s in data["strings"]:
        s["component"] = cat.classify(s["format"], s["files"])
        if s["component"] is None:
            missing += 1
            print(f"no class: {s['files'][0]}: {s['format']}", file=sys.stderr)
    path.write_text(dump(data))
    print(f"{len(data['strings'])} strings from {len(args.tags)} tags -> {path}; "
          f"{missing} without a class")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
