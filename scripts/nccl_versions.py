#!/usr/bin/env python3
"""Regenerate mldebug/nccllog/versions.json (NCCL release x GPU architecture, fixes by
release) from an NCCL git tree.

    python scripts/nccl_versions.py --repo /path/to/nccl.git [--out FILE]

For every release tag vX.Y.Z-N it reads, with ``git show`` (no checkout):

- ``makefiles/common.mk``: the default ``NVCC_GENCODE`` — the GPU architectures a build of
  that release has kernels for (SASS ``sm_XX``) and PTX (``compute_XX``, JIT-compiled for newer
  GPUs) — evaluated for each CUDA toolkit version in ``CUDA_VERSIONS`` (the makefile picks
  the list by the nvcc it finds; ``NCCL version 2.25.1+cuda12.2`` names that CUDA);
- the tag's commit message (NCCL's release notes): the bullets that say ``Fix ...``.

Which fixed bug a log's messages show is kept in known_issues.json (symptom -> version
range); the script checks that each of its rows is fixed in a release of this table, or exits 1.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "mldebug" / "nccllog" / "versions.json"
KNOWN = OUT.with_name("known_issues.json")
TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)-(\d+)$")
# toolkits a release may be built with (the makefile's branches test major/minor only)
CUDA_VERSIONS = ["8.0", "9.0", "9.2", "10.0", "10.2", "11.0", "11.1", "11.8", "12.0", "12.2",
                 "12.4", "12.8", "12.9", "13.0", "13.1"]
ASSIGN = re.compile(r"^\s*([A-Z0-9_]+)\s*(\?=|\+=|:=|=)\s*(.*)$")
TEST = re.compile(r'ifeq \(\$\(shell test (.*?); echo \$\$\?\),\s*0\)')
FIX = re.compile(r"^\s*(?:[*-]\s+)?(Fix(?:ed|es)?\b.*)$")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def _expand(value: str, env: dict[str, str]) -> str:
    for _ in range(8):
        new = re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: env.get(m[1], ""), value)
        if new == value:
            break
        value = new
    return value


def _test(expr: str, major: int, minor: int) -> bool:
    """Evaluate a shell ``test`` expression of the makefile (-eq/-ne/-ge/-gt/-le/-lt joined by
    -a, then -o) for one CUDA version."""
    expr = re.sub(r'"0?\$\(CUDA_MAJOR\)"', str(major), expr)
    expr = re.sub(r'"0?\$\(CUDA_MINOR\)"', str(minor), expr)
    ops = {"-eq": int.__eq__, "-ne": int.__ne__, "-ge": int.__ge__, "-gt": int.__gt__,
           "-le": int.__le__, "-lt": int.__lt__}
    for alt in expr.split(" -o "):
        ok = True
        for term in alt.split(" -a "):
            a, op, b = term.split()
            ok = ok and ops[op](int(a), int(b))
        if ok:
            return True
    return False


def gencode(makefile: str, cuda: str) -> tuple[list[int], list[int]]:
    """(SASS archs, PTX archs) of the default NVCC_GENCODE for one CUDA version."""
    major, minor = (int(x) for x in cuda.split("."))
    text = makefile.replace("\\\n", " ")
    env: dict[str, str] = {}
    stack: list[list[bool]] = []  # [taking, taken-before] per open ifeq

    def active() -> bool:
        return all(s[0] for s in stack)
    lines = text.splitlines()
    start = next((i for i, raw in enumerate(lines) if ASSIGN.match(raw) and "_GENCODE" in raw), 0)
    for raw in lines[start:]:  # from the first *_GENCODE definition to the $(info ...) line
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.startswith("CXXFLAGS") or "NVCC_GENCODE is" in line:
            break
        if line.startswith("ifeq") or line.startswith("else ifeq"):
            m = TEST.search(line)
            if m is None:
                raise SystemExit(f"unknown makefile condition: {line}")
            value = _test(m[1], major, minor)
            if line.startswith("else"):
                prev = stack[-1]
                prev[0] = not prev[1] and value
                prev[1] = prev[1] or value
            else:
                stack.append([value, value])
            continue
        if line == "else":
            stack[-1][0] = not stack[-1][1]
            stack[-1][1] = True
            continue
        if line == "endif":
            stack.pop()
            continue
        m = ASSIGN.match(line)
        if m is None or not active():
            continue
        name, op, value = m[1], m[2], m[3]
        if name in ("CUDA_VERSION", "CUDA_MAJOR", "CUDA_MINOR"):
            continue
        if op == "?=" and env.get(name):
            continue
        value = _expand(value, env)
        env[name] = (env.get(name, "") + " " + value).strip() if op == "+=" else value
    codes = env.get("NVCC_GENCODE", "")
    sass = sorted({int(x) for x in re.findall(r"code=sm_(\d+)", codes)})
    ptx = sorted({int(x) for x in re.findall(r"code=compute_(\d+)", codes)})
    return sass, ptx


def fixes(message: str) -> list[str]:
    """The 'Fix ...' bullets of a release commit message (continuation lines joined)."""
    out: list[str] = []
    current: list[str] | None = None
    for line in message.splitlines():
        m = FIX.match(line)
        if m:
            current = [m[1].strip()]
            out.append("")
            out[-1] = current[0]
            continue
        if current is not None and line.strip() and not line.lstrip().startswith(("*", "-")) \
                and (line.startswith("   ") or line[0].islower()):
            current.append(line.strip())
            out[-1] = " ".join(current)
            continue
        current = None
    return [f[:300] for f in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="an NCCL git tree or mirror (its .git dir)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    tags = [t for t in git(args.repo, "tag").split() if TAG.match(t)]
    tags.sort(key=lambda t: tuple(int(x) for x in TAG.match(t).groups()))  # type: ignore[union-attr]
    releases = []
    for tag in tags:
        commit = git(args.repo, "rev-list", "-n1", tag).strip()
        try:
            mk = git(args.repo, "show", f"{tag}:makefiles/common.mk")
        except subprocess.CalledProcessError:
            continue
        builds: list[dict] = []
        for cuda in CUDA_VERSIONS:
            sass, ptx = gencode(mk, cuda)
            if builds and builds[-1]["sass"] == sass and builds[-1]["ptx"] == ptx:
                continue
            builds.append({"cuda": cuda, "sass": sass, "ptx": ptx})
        msg = git(args.repo, "log", "-1", "--format=%B", tag)
        m = TAG.match(tag)
        assert m is not None
        releases.append({"version": ".".join(m.groups()[:3]), "tag": tag, "commit": commit[:12],
                         "date": git(args.repo, "log", "-1", "--format=%cs", tag).strip(),
                         "builds": builds, "fixes": fixes(msg)})
    out = Path(args.out)
    old = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    known = json.loads(KNOWN.read_text(encoding="utf-8"))["rows"]
    by_version = {r["version"]: r for r in releases}
    bad = 0
    for row in known:
        if row["fixed"] not in by_version:
            print(f"known_issues.json {row['id']}: fixed in {row['fixed']}, which is not an NCCL "
                  "release tag", file=sys.stderr)
            bad += 1
    doc = {
        "about": old.get("about", ""),
        "source": "https://github.com/NVIDIA/nccl (tags vX.Y.Z-N: makefiles/common.mk, "
                  "release commit messages); generated by scripts/nccl_versions.py",
        "arch_names": old.get("arch_names", {}),
        "gpu_names": old.get("gpu_names", []),
        "releases": releases,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{len(releases)} releases, {sum(len(r['fixes']) for r in releases)} fixes, "
          f"{len(known)} known_issues rows checked -> {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
