"""NCCL release x GPU architecture (versions.json, generated from NCCL's makefiles and release
notes by scripts/nccl_versions.py): does the NCCL a log shows have kernels for the GPU the log
names? Pure: the parser hands over the GPU lines it saw (``gpu_from_line``).

A release's default build has native kernels (SASS) for the ``sm_XX`` of its NVCC_GENCODE and
PTX that the driver JIT-compiles for newer GPUs; which list depends on the CUDA it was built
with (``NCCL version 2.14.3+cuda11.8``). A GPU newer than the build's SASS is a version
problem: the finding names the first release (and CUDA) whose build has kernels for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mldebug.findings import Finding, Severity

PATH = Path(__file__).with_name("versions.json")
_VERSION = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,4})(?:\S*?\+cuda(\d{1,2})\.(\d{1,2}))?")
# what names a GPU's compute capability in a log line (and the needles that gate them)
GPU_NEEDLES = ("CUDA capability sm_", "cudaArch ", 'sm="', "NVIDIA ")
_TORCH_CC = re.compile(r"(?P<name>[\w .-]{0,60}?) ?with CUDA capability sm_(?P<cc>\d{2,3})\b")
_CUDA_ARCH = re.compile(r"\bcudaArch (?P<arch>\d{3,4})\b")
_XML_SM = re.compile(r"<gpu\b[^>]{0,200}?\bsm=\"(?P<cc>\d{2,3})\"")
_NAME = re.compile(r"\bNVIDIA (?P<name>(?:GeForce |Tesla |RTX )?[\w][\w -]{1,40})")
MAX_GPUS = 16  # distinct compute capabilities kept per file


@dataclass(frozen=True)
class Build:
    cuda: tuple[int, int]
    sass: tuple[int, ...]
    ptx: tuple[int, ...]


@dataclass(frozen=True)
class Release:
    version: tuple[int, int, int]
    tag: str
    commit: str
    builds: tuple[Build, ...]
    fixes: tuple[str, ...]

    @property
    def text(self) -> str:
        return ".".join(map(str, self.version))


@dataclass(frozen=True)
class Table:
    releases: tuple[Release, ...]
    arch_names: dict[int, str]
    gpu_names: tuple[tuple[re.Pattern[str], int], ...]

    def arch(self, cc: int) -> str:
        name = self.arch_names.get(cc) or self.arch_names.get(cc // 10 * 10, "")
        return f"sm_{cc}" + (f", {name}" if name else "")


def _cuda(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@lru_cache(maxsize=1)
def load() -> Table:
    doc = json.loads(PATH.read_text(encoding="utf-8"))
    rels = tuple(Release(tuple(int(x) for x in r["version"].split(".")),  # type: ignore[arg-type]
                         r["tag"], r["commit"],
                         tuple(Build(_cuda(b["cuda"]), tuple(b["sass"]), tuple(b["ptx"]))
                               for b in r["builds"]), tuple(r["fixes"]))
                 for r in doc["releases"])
    return Table(rels, {int(k): v for k, v in doc["arch_names"].items()},
                 tuple((re.compile(rx), cc) for rx, cc in doc["gpu_names"]))


def parse_version(text: str) -> tuple[tuple[int, int, int], tuple[int, int] | None] | None:
    """'2.14.3+cuda11.8' -> ((2, 14, 3), (11, 8)); the CUDA part is None when not printed."""
    m = _VERSION.match(text or "")
    if m is None:
        return None
    cuda = (int(m[4]), int(m[5])) if m[4] else None
    return (int(m[1]), int(m[2]), int(m[3])), cuda


def gpu_from_line(line: str, table: Table | None = None) -> tuple[int, str] | None:
    """(compute capability x 10, what named it) from one log line, or None: torch's 'NVIDIA
    GeForce RTX 5090 with CUDA capability sm_120 ...', NCCL's 'cudaArch 1200 ...', a topology
    dump's '<gpu ... sm="90"', or an NVIDIA product name (nvidia-smi)."""
    if "CUDA capability sm_" in line and (m := _TORCH_CC.search(line)):
        return int(m["cc"]), line.strip()[:200]
    if "cudaArch " in line and (m := _CUDA_ARCH.search(line)):
        return int(m["arch"]) // 10, line.strip()[:200]
    if 'sm="' in line and (m := _XML_SM.search(line)):
        return int(m["cc"]), line.strip()[:200]
    if "NVIDIA " in line and (m := _NAME.search(line)):
        for rx, cc in (table or load()).gpu_names:
            if rx.search(m["name"]):
                return cc, line.strip()[:200]
    return None


def release_for(version: tuple[int, int, int], table: Table) -> tuple[Release | None, bool]:
    """The release entry of ``version`` (exact), else the newest older one (False)."""
    best = None
    for r in table.releases:
        if r.version == version:
            return r, True
        if r.version < version:
            best = r
    return best, False


def build_for(release: Release, cuda: tuple[int, int]) -> Build | None:
    """The default build of ``release`` with that CUDA (the last row at or below it)."""
    rows = [b for b in release.builds if b.cuda <= cuda]
    return rows[-1] if rows else None


def native(build: Build, cc: int) -> bool:
    """SASS for ``cc``: an sm_XY of the same major at or below it (sm_80 runs on sm_86)."""
    return any(s // 10 == cc // 10 and s <= cc for s in build.sass)


def jit(build: Build, cc: int) -> int | None:
    """The newest PTX the driver can JIT-compile for ``cc`` (compute_XY <= cc), or None."""
    ok = [p for p in build.ptx if p <= cc]
    return max(ok) if ok else None


def _sass_for(build: Build, cc: int) -> int:
    return max(s for s in build.sass if s // 10 == cc // 10 and s <= cc)


def first_native(cc: int, table: Table) -> tuple[Release, Build] | None:
    """The first release whose default build (with some CUDA) has native kernels for ``cc``."""
    for r in table.releases:
        for b in r.builds:
            if native(b, cc):
                return r, b
    return None


@dataclass
class _Use:
    version: str
    cc: int
    evidence: str
    hosts: set[str]
    labels: list[str]


def findings(uses: Iterable[tuple[str, int, str, str, str]], failed: Sequence[str]) -> list[Finding]:
    """One finding per (NCCL version, GPU) whose build lacks native kernels for the GPU.

    ``uses``: (version text, compute capability, the line that named the GPU, host, process
    label) of the processes of a file that named a GPU; ``failed``: the failure lines of the
    log that a missing kernel explains ('no kernel image', 'named symbol not found', an
    unhandled CUDA error, maxSharedMem) - with them the finding is an error, without them a
    warning (the log shows the mismatch, not that it failed)."""
    table = load()
    merged: dict[tuple[str, int], _Use] = {}
    for version, cc, evidence, host, label in uses:
        u = merged.setdefault((version, cc), _Use(version, cc, evidence, set(), []))
        u.hosts.add(host)
        if label not in u.labels and len(u.labels) < 64:
            u.labels.append(label)
    out = []
    for u in merged.values():
        f = _finding(u, failed, table)
        if f is not None:
            out.append(f)
    return out


def _finding(u: _Use, failed: Sequence[str], table: Table) -> Finding | None:
    parsed = parse_version(u.version)
    if parsed is None:
        return None
    version, cuda = parsed
    rel, exact = release_for(version, table)
    if rel is None:
        return None
    if cuda is not None:
        build = build_for(rel, cuda)
        builds = [build] if build else []
    else:
        builds = list(rel.builds)
    if not builds or any(native(b, u.cc) for b in builds):
        return None  # this NCCL has (or may have: no +cuda printed) kernels for the GPU
    first = first_native(u.cc, table)
    if cuda is None and first is not None and first[0].version <= version:
        return None  # some build of this release has kernels for it: the log cannot tell
    b = builds[-1]
    ptx = jit(b, u.cc)
    arch = table.arch(u.cc)
    built = f"NCCL {u.version}" + ("" if exact else f" (table: {rel.text}, the nearest older "
                                   "release)")
    have = (f"its default build{' with CUDA ' + '.'.join(map(str, cuda)) if cuda else ''} has "
            f"kernels for sm_{', sm_'.join(map(str, b.sass))}"
            + (f" and PTX compute_{ptx}, which the driver must JIT-compile for this GPU"
               if ptx else " and no PTX this GPU can run"))
    where = (", ".join(u.labels[:4]) + (f" and {len(u.labels) - 4} more" if len(u.labels) > 4
                                        else ""))
    detail = (f"{built} runs on a {arch} GPU (compute capability {u.cc // 10}.{u.cc % 10}): "
              f"{have} (makefiles/common.mk of {rel.tag}, commit {rel.commit}).\n"
              f"GPU named by: {u.evidence[:200]}\nProcesses: {where}.")
    if failed:
        detail += f"\nFailure it explains: {failed[0][:200]}"
    fix = ("use an NCCL built for this GPU: "
           + (f"NCCL >= {first[0].text} built with CUDA >= {'.'.join(map(str, first[1].cuda))} "
              f"(its default build has sm_{_sass_for(first[1], u.cc)})"
              if first else "no NCCL release in the table has kernels for it yet")
           + " - a torch wheel / nvidia-nccl-cu* package for that CUDA or a newer container; "
           "if you build NCCL, add -gencode=arch=compute_XY,code=sm_XY for it to NVCC_GENCODE.")
    severity = Severity.ERROR if failed or ptx is None else Severity.WARNING
    title = (f"NCCL {u.version} has no kernels for this {arch} GPU"
             + (" (only PTX to JIT-compile)" if ptx else ""))
    return Finding(severity, title, detail, fix, "nccl-log-version-gpu", tuple(sorted(u.hosts)))


def fixes_between(old: tuple[int, int, int], new: tuple[int, int, int] | None = None) -> list[
        tuple[str, str]]:
    """(release, fix) of the releases after ``old`` up to ``new`` (default: the newest)."""
    table = load()
    return [(r.text, f) for r in table.releases
            if r.version > old and (new is None or r.version <= new) for f in r.fixes]


def release_note(version: str, text: str) -> str | None:
    """The 'Fix ...' line of release ``version``'s notes that contains ``text``, if any."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    rel, exact = release_for(parsed[0], load())
    if rel is None or not exact:
        return None
    low = text.lower()
    return next((f for f in rel.fixes if low in f.lower()), None)
