"""NCCL 2.31's diagnostics report (``NCCL DIAG`` lines) read into findings. Pure.

NCCL prints the report on the standard output of rank 0's process, each line as
``<host>:<pid> NCCL DIAG <body>`` (src/diagnostics*.cc ``DIAG_PRINT``; the docs show the body
alone), at communicator init with ``NCCL_RUN_DIAGNOSTICS=1`` (active checks: P2P between GPU
pairs, ``ib_write_bw`` between nodes) and ``NCCL_RUN_RAS_DIAGNOSTICS=1`` (or ``ncclras -D``:
the RAS checks compare GPU inventory, CUDA driver, ECC, NVLink and NCCL_* settings across
ranks). Result lines are tagged ``[OK]`` or ``[INFO]`` (a condition to review)::

    NCCL DIAG === NCCL Diagnostics ===
    NCCL DIAG [INFO] p2p: write mismatch srcRank=0 srcCudaDev=0 srcNvmlDev=0 dstRank=1
        dstCudaDev=1 dstNvmlDev=1 path=NVL handle=CUMEM_POSIX_FD expected=0x.. got=0x..
        verify=0x..; check the single-node NVLink topology ...
    NCCL DIAG [INFO] p2p: only 52/56 GPU-to-GPU peer accesses passed verification
    NCCL DIAG [INFO] net bw: cross-nic rank 3 (node0): 265.1 Gbit/s, >30% off median 391.5
        Gbit/s in comm 0x7a3f9b2c41d05e88
    NCCL DIAG [INFO] NCCL environment: mismatch across 8 ranks in comm 0x1234 for NCCL_DEBUG
    NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=INFO on rank(s) {0,1,2,3}

A finding names only the ranks, GPU pairs and hosts the lines name; a rank list NCCL cut
(``...``) is said to be cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mldebug.findings import Finding, Severity
from mldebug.render import fold_ints

NEEDLE = "NCCL DIAG"
MAX_LINES = 4096  # DIAG lines kept per file
MAX_BODY = 8192  # characters of a DIAG line read (patterns are bounded; this bounds their sum)
_LINE = re.compile(r"NCCL DIAG (?:\[(?P<level>OK|INFO)\] +)?(?P<body>.*)")
_HOSTPID = re.compile(r"(?P<host>[^\s:\[\]]{1,200}):(?P<pid>\d{1,10})$")
_CHECK = re.compile(r"(?P<check>[A-Za-z][\w ./-]{0,40}?): (?P<text>.*)")
_FIELD = re.compile(r"\b(?P<k>srcRank|srcCudaDev|dstRank|dstCudaDev|path|handle|reason)="
                    r"(?P<v>[\w-]{1,40})")
_PARTIAL = re.compile(r"only (?P<passed>\d{1,9})/(?P<tested>\d{1,9}) ")
_RCCL_PARTIAL = re.compile(r"p2p: (?P<passed>\d{1,9})/(?P<tested>\d{1,9}) directed GPU P2P edges")
_COMM = re.compile(r"\bin comm (?P<comm>0x[0-9a-fA-F]{1,16})")
_ACROSS = re.compile(r"\bacross (?P<n>\d{1,9}) (?:ranks|RAS peers)")
_RANKSET = re.compile(r"rank\(s\) \{(?P<list>[\d, ]{0,4000})(?P<cut>\.\.\.|…)?[^}]{0,60}\}"
                      r"(?P<rest>.{0,80})")
_ENV_VALUE = re.compile(r"(?P<var>NCCL_[A-Z0-9_]{1,60})=(?P<value>.{0,200}?) on rank\(s\) ")
_ENV_MISMATCH = re.compile(r"mismatch across (?P<n>\d{1,9}) ranks in comm (?P<comm>0x[0-9a-fA-F]+)"
                           r" for (?P<var>NCCL_[A-Z0-9_]{1,60})")
_BW_RANK = re.compile(r"(?P<mode>[\w-]{1,20}) rank (?P<rank>\d{1,9}) \((?P<host>[^)\s]{1,200})\): "
                      r"(?P<bw>[\d.]{1,12}) Gbit/s, >30% off median (?P<median>[\d.]{1,12})")
P2P_FAILURES = ("destination buffer unavailable", "local CUDA setup failed",
                "local HIP setup failed", "peer-memory import failed", "write mismatch",
                "read mismatch", "topology check failed", "launch/check failed", "setup failed",
                "check returned", "active check returned", "resource cleanup failed")


@dataclass
class DiagLine:
    host: str | None
    pid: int | None
    level: str | None  # OK / INFO / None (header, completion)
    check: str  # 'p2p', 'net bw', 'NCCL environment', ... ('' for header lines)
    text: str  # after 'check: '
    line: str  # the whole body, cut at 300


def read_line(line: str) -> DiagLine | None:
    """One DIAG line (anything before 'NCCL DIAG' is a launcher prefix and host:pid)."""
    at = line.find(NEEDLE)
    if at < 0:
        return None
    m = _LINE.match(line, at)
    if m is None:
        return None
    head = line[:at].rstrip().rsplit(None, 1)
    hp = _HOSTPID.search(head[-1]) if head else None
    body = m["body"].strip()[:MAX_BODY]  # the longest real line is ~400 characters
    c = _CHECK.match(body) if m["level"] else None
    return DiagLine(hp["host"] if hp else None, int(hp["pid"]) if hp else None, m["level"],
                    c["check"].strip() if c else "", c["text"] if c else body, body[:300])


@dataclass
class _Pair:
    kind: str
    src: str
    dst: str
    path: str
    advice: str


@dataclass
class _Env:
    var: str
    comm: str
    nranks: int | None
    values: list[tuple[str, list[int], bool]] = field(default_factory=list)


def _ranks(m: re.Match[str]) -> tuple[list[int], bool]:
    ranks = [int(x) for x in re.findall(r"\d{1,9}", m["list"])][:4096]
    return ranks, bool(m["cut"])


def findings(lines: Iterable[DiagLine]) -> list[Finding]:
    lines = list(lines)
    if not lines:
        return []
    hosts = sorted({d.host for d in lines if d.host})
    out: list[Finding] = []
    pairs: list[_Pair] = []
    partial: list[str] = []
    envs: dict[tuple[str, str], _Env] = {}
    last_env: _Env | None = None
    bw: list[DiagLine] = []
    other: dict[str, list[DiagLine]] = {}
    ok: list[DiagLine] = []
    for d in lines:
        if d.level == "OK":
            ok.append(d)
            continue
        if d.level != "INFO":
            continue
        if d.check == "p2p":
            kind = next((k for k in P2P_FAILURES if d.text.startswith(k)), None)
            fields = {m["k"]: m["v"] for m in _FIELD.finditer(d.text)}
            if kind and "srcRank" in fields and "dstRank" in fields:
                src = f"rank {fields['srcRank']} (GPU {fields.get('srcCudaDev', '?')})"
                dst = f"rank {fields['dstRank']} (GPU {fields.get('dstCudaDev', '?')})"
                advice = d.text.split("; ", 1)[1] if "; " in d.text else ""
                pairs.append(_Pair(kind, src, dst, fields.get("path", "?"), advice))
            elif _PARTIAL.match(d.text) or _RCCL_PARTIAL.search(d.line) or kind:
                partial.append(d.line)
            else:
                other.setdefault(d.check, []).append(d)
        elif d.check == "NCCL environment":
            if (m := _ENV_MISMATCH.search(d.text)) is not None:
                key = (m["var"], m["comm"])
                last_env = envs.setdefault(key, _Env(m["var"], m["comm"], int(m["n"])))
            elif (v := _ENV_VALUE.search(d.text)) is not None and last_env is not None \
                    and v["var"] == last_env.var and (r := _RANKSET.search(d.text)):
                ranks, cut = _ranks(r)
                last_env.values.append((v["value"], ranks, cut))
            elif "differ across ranks" not in d.text:
                other.setdefault(d.check, []).append(d)
        elif d.check == "net bw":
            bw.append(d)
        else:
            other.setdefault(d.check, []).append(d)
    if pairs:
        out.append(_p2p_finding(pairs, partial, hosts))
    elif partial:
        out.append(Finding(
            Severity.ERROR, "NCCL diagnostics: P2P verification failed between GPUs",
            "\n".join(partial[:4]) + "\n(the lines do not name the GPU pairs: NCCL prints one "
            "line per failed pair on rank 0's standard output)",
            "check the NVLink/PCIe peer paths: 'nvidia-smi topo -m' and 'nvidia-smi topo -p2p "
            "n' (NVLink) or 'p' (PCIe), the IOMMU mode and PCIe ACS settings on bare metal.",
            "nccl-log-diag-p2p", tuple(hosts)))
    for env in envs.values():
        out.append(_env_finding(env))
    if bw:
        out.append(_bw_finding(bw, hosts))
    for check, ds in other.items():
        ranks = sorted({x for d in ds for r in [_RANKSET.search(d.text)] if r
                        for x in _ranks(r)[0]})
        cut = any(r and r["cut"] for d in ds for r in [_RANKSET.search(d.text)])
        out.append(Finding(
            Severity.WARNING, f"NCCL diagnostics: {check or 'report'} needs review"
            + (f" (rank(s) {fold_ints(ranks)}{' and more' if cut else ''})" if ranks else ""),
            "\n".join(d.line for d in ds[:6]) + (f"\n... {len(ds) - 6} more line(s)"
                                                  if len(ds) > 6 else ""),
            "compare the ranks the lines name with the others (same GPU model and count, driver,"
            " ECC counters, NVLinks active, NCCL_* settings); see NCCL's troubleshooting "
            "guide, 'RAS Diagnostics'.", "nccl-log-diag-info"))
    if ok and not out:
        out.append(Finding(
            Severity.INFO, f"NCCL diagnostics passed ({len(ok)} check(s) [OK])",
            "\n".join(d.line for d in ok[:6]),
            "nothing to fix in what was checked: with P2P verified, look at the network between"
            " nodes or the application instead.", "nccl-log-diag-ok"))
    return out


def _p2p_finding(pairs: list[_Pair], partial: list[str], hosts: list[str]) -> Finding:
    by_kind: dict[str, list[_Pair]] = {}
    for p in pairs:
        by_kind.setdefault(p.kind, []).append(p)
    detail = []
    for kind, ps in by_kind.items():
        shown = ", ".join(f"{p.src} -> {p.dst} over {p.path}" for p in ps[:6])
        detail.append(f"{kind}: {shown}" + (f" and {len(ps) - 6} more pair(s)" if len(ps) > 6
                                             else ""))
    detail += partial[:2]
    advice = next((p.advice for p in pairs if p.advice), "")
    n = len({(p.src, p.dst) for p in pairs})
    return Finding(
        Severity.ERROR, f"NCCL diagnostics: P2P failed on {n} GPU pair(s) "
        f"({pairs[0].src} -> {pairs[0].dst} over {pairs[0].path}"
        + (" and others)" if n > 1 else ")"),
        "\n".join(detail) + "\nA failed check before any traffic points at the system (GPU, "
        "interconnect, driver or container setup), not the application.",
        (advice + ".") if advice else "check the named GPU pairs with 'nvidia-smi topo -m' and "
        "'nvidia-smi topo -p2p'.", "nccl-log-diag-p2p", tuple(hosts))


def _env_finding(env: _Env) -> Finding:
    """Names the odd ranks only when one group is smaller than the others and complete."""
    values = sorted(env.values, key=lambda v: len(v[1]))
    parts = [f"{env.var}={value or '(empty)'} on rank(s) {fold_ints(ranks)}"
             + (" and more (NCCL cut the list)" if cut else "") for value, ranks, cut in values]
    # the odd ones out: one group, smaller than every other, listed whole (no list cut)
    odd = values[0] if len(values) > 1 and len(values[0][1]) < len(values[1][1]) \
        and not any(cut for _, _, cut in values) else None
    title = f"NCCL diagnostics: {env.var} differs across ranks of comm {env.comm}"
    if odd is not None:
        title += f" (rank(s) {fold_ints(odd[1])}: {env.var}={odd[0]})"
    return Finding(
        Severity.WARNING, title,
        f"RAS diagnostics compared {env.nranks} ranks: " + "; ".join(parts or ["(values not "
                                                                             "listed)"]) + ".",
        f"set {env.var} the same way for every rank (the launcher's environment, a per-node "
        "profile or /etc/nccl.conf on some nodes), or unset it.", "nccl-log-diag-env")


def _bw_finding(lines: list[DiagLine], hosts: list[str]) -> Finding:
    slow = [m for d in lines if (m := _BW_RANK.search(d.text))]
    failed = [d.line for d in lines if "timed out" in d.text or "failed" in d.text
              or "unable to complete" in d.text]
    named = sorted({(int(m["rank"]), m["host"], m["mode"], m["bw"], m["median"]) for m in slow})
    if named:
        title = ("NCCL diagnostics: network bandwidth of rank(s) "
                 + ", ".join(f"{r} ({h})" for r, h, *_ in named[:6]) + " is over 30% off median")
        detail = "\n".join(f"rank {r} on {h}: {bw} Gbit/s {mode}, median {med}"
                           for r, h, mode, bw, med in named[:8])
    else:
        title = "NCCL diagnostics: the network bandwidth check has notes to review"
        detail = ""
    detail = "\n".join(x for x in [detail, *failed[:4], *(d.line for d in lines[:3]
                                                         if not named and not failed)] if x)
    slow_hosts = sorted({h for _, h, *_ in named}) or hosts
    return Finding(
        Severity.WARNING if named or failed else Severity.INFO, title, detail,
        "check the named node's NICs (ibstat: rate and state, cabling, PCIe width of the HCA, "
        "ib_write_bw by hand between the pair) before blaming NCCL.", "nccl-log-diag-net-bw",
        tuple(slow_hosts))
