#!/usr/bin/env python3
"""Regenerate the ``strings`` of mldebug/nccllog/catalogue.json from an NCCL git tree.

    python scripts/nccl_catalogue.py --repo /path/to/nccl.git [--tags v2.18.6-1 v2.30.7-1 ...]

For every tag it reads the sources under src/ (``git cat-file``, no checkout needed) and takes
the format string of every ``WARN(...)`` call, and of every ``INFO(...)`` call whose text reports
a failure or a fallback. Strings are keyed by their text; each records the files it appears in
and the tags (folded into ranges) in which it exists. The hand-written part of the catalogue
(components, their fixes, classification rules, causes) is kept; every string is then classified
with those rules, and the script exits 1 when one has no class (add a rule, then rerun).

For every occurrence it also reads the condition in the code that prints it (``conditions``):
the enclosing ``if (...)`` (or the ``else`` of one, or the ``fail:`` label the ``goto``s reach),
the calls tested there (or assigned just before the test), the errno names compared, the
``ncclResult_t`` returned right after, the macro the WARN lives in (SYSCHECK, CUDACHECK ...)
and what the line prints of the error (``strerror(errno)``, ``errno``) - each with the tags in
which it holds. ``condition_causes`` (hand-written) turn these into causes.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parent.parent / "mldebug" / "nccllog" / "catalogue.json"
# The newest tag of each minor release 2.12 .. 2.17; from 2.18 on every release tag is read
# (default_tags), so a condition that changed within a release is dated to the tag.
OLDER_TAGS = ["v2.12.12-1", "v2.13.4-1", "v2.14.3-1", "v2.15.5-1", "v2.16.5-1", "v2.17.1-1"]
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
ERRNO_NAMES = {n for n in dir(errno) if n.startswith("E")}  # EWOULDBLOCK, ENOTSUP aliases too


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


KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "defined", "do", "else",
            "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "decltype",
            "__builtin_expect", "likely", "unlikely", "NCCL_UNLIKELY", "NCCL_LIKELY", "case"}
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_ERRNO = re.compile(r"\b((?:WSA)?E[A-Z][A-Z0-9]+)\b")
_RESULT = re.compile(r"\b(nccl(?:[A-Z]\w*Error|InProgress|Success))\b")
_MACRO = re.compile(r"#\s*define\s+(\w+)\s*\(([^)]*)\)")
_LABEL = re.compile(r"(?<![:\w])([A-Za-z_]\w*)\s*:(?!:)\s*$")


def _blank(src: str) -> str:
    """``src`` with comments and the insides of string/char literals blanked (same offsets),
    so braces and parentheses can be counted."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in src[i:j]]
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out[i + 1:j] = " " * max(0, min(j, n) - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _open_before(s: str, pos: int, open_: str, close: str) -> int:
    """Index of the unmatched ``open_`` before ``pos`` (-1 if none)."""
    depth = 0
    for i in range(pos - 1, -1, -1):
        c = s[i]
        if c == close:
            depth += 1
        elif c == open_:
            if depth == 0:
                return i
            depth -= 1
    return -1


def _close_after(s: str, pos: int, open_: str, close: str) -> int:
    depth = 0
    for i in range(pos, len(s)):
        c = s[i]
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _if_test(s: str, end: int) -> str | None:
    """The condition of ``if (...)`` when ``s[:end]`` ends with it."""
    got = _if_at(s, end)
    return got[0] if got else None


def _if_at(s: str, end: int) -> tuple[str, int] | None:
    """(condition, where its 'if' starts) when ``s[:end]`` ends with ``if (...)``."""
    t = s[:end].rstrip()
    if not t.endswith(")"):
        return None
    o = _open_before(s, len(t) - 1, "(", ")")
    m = re.search(r"\bif\s*$", s[max(0, o - 12):o]) if o >= 0 else None
    if m is None:
        return None
    return s[o + 1:len(t) - 1], max(0, o - 12) + m.start()


def _else_chain(s: str, o: int) -> tuple[list[str], int] | None:
    """The conditions of every branch before the ``else {`` whose brace is at ``s[o]``
    (``if (A) {} else if (B) {} else {``: A and B), and where the first 'if' starts."""
    tests: list[str] = []
    at = o
    while re.search(r"\belse\s*$", s[max(0, at - 10):at]):
        prev = s[:at].rstrip()[:-4].rstrip()
        if not prev.endswith("}"):
            break
        po = _open_before(s, len(prev) - 1, "{", "}")
        got = _if_at(s, po) if po >= 0 else None
        if got is None:
            break
        tests.insert(0, got[0])
        at = got[1]
    return (tests, at) if tests else None


def _calls(text: str) -> list[str]:
    """Functions called in ``text``; NCCL's ALL_CAPS macros (NCCLCHECK ...) are not calls."""
    return list(dict.fromkeys(c for c in _CALL.findall(text)
                              if c not in KEYWORDS and not re.fullmatch(r"[A-Z0-9_]+", c)))


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\\\n", " ")).strip()


def condition(raw: str, s: str, at: int, end: int) -> dict:
    """What decides that the WARN/INFO at ``s[at:end]`` (``s``: blanked source) is printed."""
    cond: dict = {}
    line_start = s.rfind("\n", 0, at) + 1
    d = s.rfind("#define", max(0, at - 6000), at)
    m = _MACRO.match(s, d) if d >= 0 else None
    # inside the macro when every line from the #define to the WARN's ends with a backslash
    if m is not None and all(ln.rstrip().endswith("\\")
                             for ln in s[d:line_start].splitlines()):
        cond["macro"] = m.group(1)
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    else:
        params = []
    # the statement before the WARN: a single-statement 'if (...)' or a label
    stmt_start = max(s.rfind(c, 0, at) for c in ";{}") + 1
    head = s[stmt_start:at]
    got = _if_at(s, at) if head.strip() else None
    test, if_at = got if got else (None, -1)
    negated = False
    label = _LABEL.search(head)
    case = re.search(r"\bcase\s+(\w+)\s*:\s*$", head)
    if test is None and case:
        # 'case ETIMEDOUT:' of a switch over an errno or a result
        o = _open_before(s, at, "{", "}")
        sw = s[max(0, o - 200):o]
        sm = re.search(r"\bswitch\s*\((.*)\)\s*$", sw, re.S)
        cond["test"] = _clean(f"{sm.group(1) if sm else '?'} == {case.group(1)}")[:160]
        if case.group(1) in ERRNO_NAMES:
            cond["errno"] = [case.group(1)]
    elif test is None and label and label.group(1) not in ("default", "public", "private"):
        cond["label"] = label.group(1)
    elif test is None:
        o = _open_before(s, at, "{", "}")
        if o >= 0:
            got = _if_at(s, o)
            if got:
                test, if_at = got
            else:
                # the else of 'if (A) {} else if (B) {} else {': none of A, B held
                chain = _else_chain(s, o)
                if chain:
                    tests, if_at = chain
                    test = " || ".join(f"({t.strip()})" if len(tests) > 1 else t
                                       for t in tests)
                    negated = True
    calls: list[str] = []
    if test is not None:
        cond["test"] = _clean(test)[:160]
        if negated:
            cond["negated"] = True
        calls = _calls(test)
        names = set(re.findall(r"\w+", test))
        if (not calls or names & set(params)) and if_at >= 0:
            # 'if (hptr == MAP_FAILED)': the call is the assignment before the test
            prev_end = s.rfind(";", 0, if_at)
            prev_start = max(s.rfind(c, 0, prev_end) for c in ";{}") + 1
            prev = s[prev_start:prev_end]
            if names & set(re.findall(r"\w+", prev)):
                calls += [c for c in _calls(prev) if c not in calls]
        errnos = [e for e in (x.removeprefix("WSA") for x in _ERRNO.findall(test))
                  if e in ERRNO_NAMES]  # os/windows.cc tests WSAETIMEDOUT ...
        if errnos:
            cond["errno"] = list(dict.fromkeys(errnos))
    elif "label" in cond:
        # 'fail:': every call whose failure jumps there in this function
        fn = s.rfind("\n}", 0, at)
        body = s[fn + 1 if fn >= 0 else 0:at]
        for g in re.finditer(r"\bgoto\s+" + cond["label"] + r"\b|,\s*" + cond["label"]
                             + r"\s*\)\s*;", body):
            gat = stmt_start_of(body, g.start())
            stmt = body[gat:g.start()]
            if "goto" in g.group(0):
                o = _open_before(body, g.start(), "{", "}")
                t = _if_test(body, o) if o >= 0 else _if_test(body, gat)
                stmt = t or ""
                names = set(re.findall(r"\w+", stmt))
                if stmt and not _calls(stmt):
                    pe = body.rfind(";", 0, body.rfind("if", 0, o if o >= 0 else gat))
                    ps = max(body.rfind(c, 0, pe) for c in ";{}") + 1
                    if names & set(re.findall(r"\w+", body[ps:pe])):
                        stmt = body[ps:pe]
            calls += [c for c in _calls(stmt) if c not in calls and not c.endswith("GOTO")]
    fn = _function(s, at)
    if fn:
        cond["function"] = fn
    if params and any(c in params for c in calls):
        cond["call_from"] = "macro argument"
    calls = [c for c in calls if c not in params]
    if calls:
        cond["calls"] = calls[:8]
    # the result returned right after (within the block)
    tail_end = _close_after("{" + s[end:end + 1500], 0, "{", "}")
    tail = s[end:end + tail_end] if tail_end > 0 else s[end:end + 400]
    r = _RESULT.search(tail[:600])
    if r:
        cond["returns"] = r.group(1)
    a = _close_after("(" + s[end:end + 600], 0, "(", ")")
    args = raw[end:end + a - 1] if a > 0 else ""
    prints = []
    if re.search(r"strerror\s*\(", args):
        prints.append("strerror")
    if re.search(r"(?<![\w>.])errno\b(?!\s*\))", args) or re.search(r",\s*errno\s*\)?\s*$", args):
        prints.append("errno")
    if re.search(r"(?:nccl|cuda|cu)GetErrorString|ncclGetLastError", args):
        prints.append("result string")
    if prints:
        cond["prints"] = prints
    return cond


def _function(s: str, at: int) -> str | None:
    """The name of the function (or macro) whose body holds ``s[at]``."""
    o, outer = at, -1
    while True:
        o = _open_before(s, o, "{", "}")
        if o < 0:
            break
        outer = o
    if outer < 0:
        return None
    head = s[max(0, outer - 600):outer].rstrip()
    head = re.sub(r"\)\s*(?:const|noexcept|override|\s)*$", ")", head)
    if not head.endswith(")"):
        return None
    po = _open_before(head, len(head) - 1, "(", ")")
    m = re.search(r"([A-Za-z_]\w*)\s*$", head[:po]) if po >= 0 else None
    return m.group(1) if m and m.group(1) not in KEYWORDS else None


def stmt_start_of(s: str, pos: int) -> int:
    return max(s.rfind(c, 0, pos) for c in ";{}") + 1


def extract(src: str) -> list[tuple[str, str]]:
    """(level, format) of each WARN(...) and failure-reporting INFO(...) in one file."""
    return [(level, fmt) for level, fmt, _ in extract_conditions(src)]


def extract_conditions(src: str) -> list[tuple[str, str, dict]]:
    """(level, format, condition) of each WARN(...) and failure-reporting INFO(...)."""
    out = []
    blank = _blank(src)
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
        fmt, end = _literals(src, start)
        if not fmt or len(fmt) < 4:
            continue
        if level == "INFO" and not FAILURE_INFO.search(fmt):
            continue
        out.append((level, fmt, condition(src, blank, m.start(), end)))
    return out


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def scan(repo: str, tags: list[str]) -> dict[tuple[str, str], dict]:
    """(level, format) -> files, tags and {condition (JSON text): tags} over ``tags``.
    A file unchanged between tags (same blob) is read once."""
    found: dict[tuple[str, str], dict] = {}
    seen: dict[str, list[tuple[str, str, dict]]] = {}  # blob -> what it prints
    for tag in tags:
        files = []
        for row in _git(repo, "ls-tree", "-r", tag, "src").splitlines():
            meta, _, f = row.partition("\t")
            if f.endswith(SOURCE_EXT) and not f.startswith(SKIP_DIRS):
                files.append((meta.split()[2], f))
        todo = [(blob, f) for blob, f in files if blob not in seen]
        if todo:
            batch = "".join(f"{blob}\n" for blob, _ in todo)
            raw = subprocess.run(["git", "-C", repo, "cat-file", "--batch"], input=batch.encode(),
                                 check=True, capture_output=True).stdout
            pos = 0
            for blob, _ in todo:
                header_end = raw.index(b"\n", pos)
                size = int(raw[pos:header_end].split()[2])
                body = raw[header_end + 1:header_end + 1 + size].decode("utf-8", "replace")
                pos = header_end + 1 + size + 1
                seen[blob] = (extract_conditions(body)
                              if "WARN" in body or "INFO" in body else [])
        for blob, f in files:
            for level, fmt, cond in seen[blob]:
                e = found.setdefault((level, fmt), {"files": set(), "tags": set(),
                                                    "conditions": {}})
                e["files"].add(f[4:] if f.startswith("src/") else f)
                e["tags"].add(tag)
                e["conditions"].setdefault(json.dumps(cond, sort_keys=True), set()).add(tag)
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


MAX_CONDITIONS = 8


def conditions(by_text: dict[str, set[str]], order: list[str]) -> list[dict]:
    """The distinct conditions of one string, each with the tag ranges where it holds
    (the ones holding in the most tags first; empty ones left out)."""
    out = []
    for text, tags in sorted(by_text.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        cond = json.loads(text)
        if cond:
            out.append({**cond, "versions": fold(tags, order)})
    return out[:MAX_CONDITIONS]


def default_tags(repo: str) -> list[str]:
    """The newest tag of each release before 2.18, then every release tag from 2.18 on."""
    have = [t for t in _git(repo, "tag").split() if re.fullmatch(r"v2\.\d+\.\d+-\d+", t)]

    def key(t: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", t))
    later = sorted((t for t in have if key(t) >= (2, 18)), key=key)
    return [t for t in OLDER_TAGS if t in have] + later


def dump(data: dict) -> str:
    """The catalogue as JSON with one line per string (reviewable diffs when NCCL changes)."""
    head = {k: v for k, v in data.items() if k != "strings"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # drop the closing brace
    lines = [json.dumps(s, ensure_ascii=False) for s in data.get("strings", [])]
    return text + ',\n "strings": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="an NCCL git tree or mirror")
    ap.add_argument("--tags", nargs="*", default=None,
                    help="default: the newest of each release < 2.18, every tag from 2.18 on")
    ap.add_argument("--out", default=str(CATALOGUE))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mldebug.nccllog.catalogue import Catalogue

    path = Path(args.out)
    data = json.loads(path.read_text()) if path.exists() else {}
    args.tags = args.tags or default_tags(args.repo)
    found = scan(args.repo, args.tags)
    data["tags"] = [short(t) for t in args.tags]
    data["strings"] = [
        {"level": level, "format": fmt, "files": sorted(e["files"]),
         "versions": fold(e["tags"], args.tags),
         "conditions": conditions(e["conditions"], args.tags)}
        for (level, fmt), e in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    # errno names the condition causes use: Linux numbers and glibc's text, refreshed here
    data["errno"] = {n: [getattr(errno, n), os.strerror(getattr(errno, n))]
                     for n in data.get("errno", {}) if hasattr(errno, n)}
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
