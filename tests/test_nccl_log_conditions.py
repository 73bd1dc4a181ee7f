"""Same component, different cause (issue 41 item 1): the condition in NCCL's source that prints
a message, and the errno / result the line prints, decide the cause - not the file it lives in.

- the extractor (scripts/nccl_catalogue.py) on C written like NCCL's, and the catalogue's
  conditions for the strings the causes rely on (and, with an NCCL tree at hand, that they are
  what the tree gives);
- real lines from public threads (tests/fixtures/nccl_log_conditions/README.md) name the cause;
- the same rule names the same cause on lines written differently (other NCCL versions' formats,
  hosts, interfaces, ranks, prefixes) and another cause when only the errno differs;
- coverage per NCCL version: the share of format strings whose condition gets a cause, pinned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mldebug.nccllog import catalogue
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import load, parse_lines

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "nccl_log_conditions"
REAL = ROOT / "tests" / "fixtures" / "nccl" / "real"
MIRROR = os.environ.get("NCCL_SRC", "/work/.mirror/NVIDIA+nccl/repo")
sys.path.insert(0, str(ROOT / "scripts"))
import nccl_catalogue  # type: ignore[import-not-found]  # noqa: E402

CAT = catalogue.load()
RULE = {r.id: r for r in CAT.cond_rules}


def _report(text: str):
    return analyze([parse_lines(text.splitlines(keepends=True), "t.log")])


def _named(report, rule_id: str, code: str | None = None) -> list:
    """Findings that name the cause of ``rule_id`` (its cause text, from the condition)."""
    cause = RULE[rule_id].cause
    return [f for f in report.findings if cause in f.detail and (code is None or f.code == code)]


# ------------------------------------------------------------------ the extractor
C_SOURCE = r'''
#define SYSCHECKVAL(call, name, retval) do { \
  SYSCHECKSYNC(call, name, retval); \
  if (retval == -1) { \
    WARN("Call to " name " failed : %s", strerror(errno)); \
    return ncclSystemError; \
  } \
} while (false)

static ncclResult_t socketConnectCheck(struct ncclSocket* sock, int errCode, const char f[]) {
  if (errCode == 0) {
    sock->state = ncclSocketStateConnected;
  } else if (errCode == ECONNREFUSED || errCode == ETIMEDOUT) {
    retry(sock); /* a brace { in a comment */
  } else {
    WARN("%s: connect to %s failed : %s", f, "peer{", strerror(errCode));
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t ncclShmOpen(char* path, int create) {
  ncclResult_t ret = ncclSuccess;
  SYSCHECKGOTO(fd = open(path, O_RDWR), "open", ret, fail);
  if (fallocate(fd, 0, 0, size) != 0) {
    WARN("Error: failed to extend %s to %ld bytes, error: %s (%d)", path, size, strerror(errno), errno);
    ret = ncclSystemError;
    goto fail;
  }
  hptr = (char*)mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (hptr == MAP_FAILED) WARN("Error: Could not map %s, error: %s", path, strerror(errno));
  return ret;
fail:
  WARN("Error while %s shared memory segment %s", create ? "creating" : "attaching to", path);
  return ret;
}

static ncclResult_t socketFinalizeAccept(struct ncclSocket* sock) {
  if (magic != sock->magic) {
    WARN("socketFinalizeAccept: wrong magic %lx != %lx", magic, sock->magic);
    return ncclSuccess;
  }
  switch (err) {
    case EADDRINUSE: WARN("Address %s in use", "x"); return ncclSystemError;
  }
  return ncclSuccess;
}
'''


def test_the_extractor_reads_the_condition_that_prints_each_string() -> None:
    got = {fmt: cond for _, fmt, cond in nccl_catalogue.extract_conditions(C_SOURCE)}
    assert got["Call to %s failed : %s"] == {
        "macro": "SYSCHECKVAL", "test": "retval == -1", "returns": "ncclSystemError",
        "prints": ["strerror"]}
    # the else of an if/else-if chain: the errnos it is printed for are the ones NOT listed
    c = got["%s: connect to %s failed : %s"]
    assert c["negated"] and c["errno"] == ["ECONNREFUSED", "ETIMEDOUT"]
    assert c["function"] == "socketConnectCheck" and c["returns"] == "ncclSystemError"
    c = got["Error: failed to extend %s to %ld bytes, error: %s (%d)"]
    assert c["calls"] == ["fallocate"] and c["prints"] == ["strerror", "errno"]
    assert c["function"] == "ncclShmOpen"
    # 'if (hptr == MAP_FAILED)' without braces: the call is the assignment before the test
    assert got["Error: Could not map %s, error: %s"]["calls"] == ["mmap"]
    # the 'fail:' label: every call whose failure jumps there
    c = got["Error while %s shared memory segment %s"]
    assert c["label"] == "fail" and {"open", "fallocate"} <= set(c["calls"])
    c = got["socketFinalizeAccept: wrong magic %lx != %lx"]
    assert c["test"] == "magic != sock->magic" and c["returns"] == "ncclSuccess"
    assert got["Address %s in use"]["errno"] == ["EADDRINUSE"]


def _entry(fmt: str) -> dict:
    [s] = [s for s in json.loads(catalogue.PATH.read_text())["strings"] if s["format"] == fmt]
    return s


def test_the_catalogue_holds_the_conditions_the_causes_rely_on() -> None:
    magic = _entry("socketFinalizeAccept: wrong magic %lx != %lx")
    assert any(c.get("test") == "magic != sock->magic" and c["function"] == "socketFinalizeAccept"
               for c in magic["conditions"])
    extend = _entry("Error: failed to extend %s to %ld bytes, error: %s (%d)")
    assert all(c["calls"] == ["fallocate"] and c["returns"] == "ncclSystemError"
               for c in extend["conditions"])
    connect = _entry("%s: connect to %s failed : %s")
    assert all(c.get("negated") and "ECONNREFUSED" in c["errno"] for c in connect["conditions"])
    seg = _entry("Error while %s shared memory segment %s (size %ld), error: %s (%d)")
    assert any("open" in c.get("calls", ()) and c.get("label") == "fail" for c in seg["conditions"])
    data = json.loads(catalogue.PATH.read_text())
    assert data["errno"]["ENOENT"] == [2, "No such file or directory"]
    assert data["errno"]["ENOSPC"] == [28, "No space left on device"]
    # every tag from 2.18 on is read, the older ones kept
    assert {"2.12.12", "2.18.1", "2.26.2", "2.30.7"} <= set(data["tags"])


@pytest.mark.skipif(not Path(MIRROR).is_dir(), reason="no NCCL git tree (set NCCL_SRC)")
def test_the_conditions_are_what_the_nccl_tree_gives() -> None:
    have = subprocess.run(["git", "-C", MIRROR, "tag"], capture_output=True, text=True).stdout
    if "v2.18.6-1" not in have.split():
        pytest.skip("the NCCL tree lacks v2.18.6-1")
    found = nccl_catalogue.scan(MIRROR, ["v2.18.6-1"])
    key = CAT.tags.index("2.18.6")
    stale = []
    for s in json.loads(catalogue.PATH.read_text())["strings"]:
        e = found.get((s["level"], s["format"]))
        if e is None:
            continue
        want = {json.dumps(json.loads(t), sort_keys=True) for t in e["conditions"]
                if json.loads(t)}
        held = {json.dumps({k: v for k, v in c.items() if k != "versions"}, sort_keys=True)
                for c in s["conditions"]
                if any(CAT.tags.index(a) <= key <= CAT.tags.index(b) for a, b in c["versions"])}
        if len(s["conditions"]) < nccl_catalogue.MAX_CONDITIONS and want != held:
            stale.append(s["format"])
    assert not stale, f"{len(stale)} strings with other conditions in 2.18.6: rerun the script"


# ------------------------------------------------------------------ real lines
@pytest.mark.parametrize("path, rule_id, code", [
    (FIX / "wrong-magic-efa-2.19.3.log", "socket-foreign-client", "nccl-log-socket"),
    (FIX / "shm-enoent-attach-2.2x.log", "shm-missing-segment", "nccl-log-shm"),
    (FIX / "shm-enoent-ray-size0.log", "shm-missing-segment", "nccl-log-shm"),
    (FIX / "connect-no-route-2.20.log", "connect-unreachable", "nccl-log-connect"),
    (REAL / "shm-ci-runner-timestamped.log", "shm-no-space", "nccl-log-shm"),
    (REAL / "ibv-reg-mr-memlock-title.log", "ibv-reg-memlock", None),
    (REAL / "ibv-modify-qp-redacted-2.27.log", "ibv-qp-unreachable", "nccl-log-ib-modify-qp"),
    (REAL / "ibv-modify-qp-unreachable.log", "ibv-qp-unreachable", "nccl-log-ib-modify-qp"),
], ids=lambda v: v.name if isinstance(v, Path) else None)
def test_real_lines_get_the_cause_of_their_condition(path: Path, rule_id: str,
                                                      code: str | None) -> None:
    report = analyze(load([path]))
    named = _named(report, rule_id, code)
    assert named, [(f.code, f.title, f.detail[:300]) for f in report.findings]
    assert "Decided by: NCCL's" in named[0].detail
    if RULE[rule_id].fix:
        assert RULE[rule_id].fix in named[0].fix


def test_one_component_two_causes_enoent_is_not_a_full_dev_shm() -> None:
    enoent = analyze(load([FIX / "shm-enoent-attach-2.2x.log"]))
    enospc = analyze(load([REAL / "shm-ci-runner-timestamped.log"]))
    [a] = [f for f in enoent.findings if f.code == "nccl-log-shm"]
    [b] = [f for f in enospc.findings if f.code == "nccl-log-shm"]
    assert "not a full /dev/shm" in a.title and "--shm-size" not in a.fix
    assert "too small" in b.title and "--shm-size" in b.fix
    # SYSCHECK's 'Call to open failed' is part of the same finding, not a second one
    assert not any("Call to open failed" in f.title for f in enoent.findings)


def test_wrong_magic_is_not_called_a_firewall_problem() -> None:
    report = analyze(load([FIX / "wrong-magic-efa-2.19.3.log"]))
    [f] = _named(report, "socket-foreign-client")
    assert "not a firewall" in f.detail and "firewalls" not in f.fix
    assert "socketFinalizeAccept()" in f.detail and "returns ncclSuccess" in f.detail


# ------------------------------------------------------------------ the same rule, other lines
def _line(prefix: str, host: str, dev: int, src: str, msg: str) -> str:
    return f"{prefix}{host}:{4000 + dev}:{5000 + dev} [{dev}] {src} NCCL WARN {msg}\n"


VARIANTS = [
    # (lines, rule id, code): formats of other NCCL versions, other hosts, ranks, peers
    ([("", "node7", 3, "misc/socket.cc:431", "socketFinalizeAccept: wrong magic 474554202f20 != "
       "9a3f8e2b7c1d0e55")], "socket-foreign-client", "nccl-log-socket"),
    ([("[rank5]: ", "gpu-a100-12.cluster", 5, "misc/socket.cc:522",
       "socketFinalizeAccept: wrong magic 0 != 5327f0e088587e42")], "socket-foreign-client", None),
    # NCCL 2.12-2.21: no errno in the segment line; SYSCHECK's line before it has it
    ([("", "dgx-03", 1, "include/shm.h:28", "Call to open failed : No such file or directory"),
      ("", "dgx-03", 1, "misc/shmutils.cc:112",
       "Error while attaching to shared memory segment /dev/shm/nccl-AbC123 (size 9637888)")],
     "shm-missing-segment", "nccl-log-shm"),
    ([("3: ", "h100-node-17", 7, "misc/shmutils.cc:132", "Error while attaching to shared memory "
       "segment /dev/shm/nccl-Zq9x01 (size 4194304), error: No such file or directory (2)")],
     "shm-missing-segment", "nccl-log-shm"),
    # the same lines with another errno: another cause
    ([("", "h100-node-17", 7, "misc/shmutils.cc:132", "Error while creating shared memory "
       "segment /dev/shm/nccl-Zq9x01 (size 4194304), error: No space left on device (28)")],
     "shm-no-space", "nccl-log-shm"),
    ([("", "node2", 0, "os/linux.cc:820", "Error: failed to extend /dev/shm/nccl-Qr5t2w to "
       "33554436 bytes, error: No space left on device (28)")], "shm-no-space", "nccl-log-shm"),
    ([("", "node2", 0, "misc/shmutils.cc:132", "Error while attaching to shared memory segment "
       "/dev/shm/nccl-Qr5t2w (size 33554432), error: Permission denied (13)")],
     "shm-permission", "nccl-log-shm"),
    ([("", "node2", 2, "misc/shmutils.cc:132", "Error while creating shared memory segment "
       "/dev/shm/nccl-Qr5t2w (size 33554432), error: File exists (17)")],
     "shm-exists", "nccl-log-shm"),
    ([("", "node2", 2, "os/linux.cc:812", "Error: Could not map /dev/shm/nccl-Qr5t2w size "
       "33554436, error: Cannot allocate memory (12)")], "shm-no-memory", None),
    # connect: four formats (2.12-2.15, 2.16-2.23, 2.24-2.26, 2.27+), three errnos
    ([("", "worker-0", 0, "include/socket.h:409", "Net : Connect to 192.168.1.9<54263> failed : "
       "Connection refused")], "connect-refused", "nccl-log-connect"),
    # 2.16-2.23 retry refused and timed-out connects, then print how often: the counter tested
    ([("[default3]:", "worker-1", 3, "misc/socket.cc:475", "socketStartConnect: exceeded "
       "timeouts (20)")], "connect-timeout-retries", "nccl-log-connect"),
    ([("", "worker-1", 1, "misc/socket.cc:541", "socketPollConnect: exceeded retries (34)")],
     "connect-refused-retries", None),
    ([("", "worker-1", 1, "include/socket.h:409", "Net : Connect to [fd00::15]<40311> failed : "
       "No route to host")], "connect-unreachable", "nccl-log-connect"),
    ([("", "worker-2", 6, "include/socket.h:409", "Net : Connect to 172.31.7.40<53117> failed "
       ": Connection timed out")], "connect-timeout", "nccl-log-connect"),
    ([("", "worker-3", 2, "os/linux.cc:287", "ncclOsSocketPollConnect: connect to "
       "10.0.0.2<45678> returned Connection timed out, exceeded error retry count after 35 "
       "attempts")], "connect-timeout", "nccl-log-connect"),
    ([("", "worker-4", 4, "misc/socket.cc:533", "socketPollConnect: Connect to 10.1.0.4<51111> "
       "returned 111(Connection refused) errno 115(Operation now in progress)")],
     "connect-refused", "nccl-log-connect"),
    # verbs: the errno returned decides
    ([("", "gpu-r3-07", 2, "misc/ibvwrap.cc:278", "Call to ibv_reg_mr failed with error Cannot "
       "allocate memory")], "ibv-reg-memlock", None),
    ([("", "gpu-r3-07", 2, "misc/ibvwrap.cc:278", "Call to ibv_reg_mr failed with error Bad "
       "address")], "ibv-reg-gpu", None),
    ([("", "gpu-r3-08", 6, "misc/ibvwrap.cc:262", "Call to ibv_modify_qp failed with 110 "
       "Connection timed out, on dev mlx5_6:1, curr state INIT, next state RTR, local GID index "
       "3, local GID ::ffff:10.9.8.7, remote GID ::ffff:10.9.9.7")],
     "ibv-qp-unreachable", "nccl-log-ib-modify-qp"),
    ([("", "gpu-r3-08", 6, "misc/ibvwrap.cc:262", "Call to ibv_modify_qp failed with 22 Invalid "
       "argument, on dev mlx5_6:1, curr state INIT, next state RTR, local GID index 7, local GID "
       "fe80::ba59:9f03:11:2a, remote GID fe80::ba59:9f03:11:3b")],
     "ibv-qp-invalid", "nccl-log-ib-modify-qp"),
]


@pytest.mark.parametrize("lines, rule_id, code", VARIANTS,
                         ids=[f"{i}-{v[1]}" for i, v in enumerate(VARIANTS)])
def test_the_same_rule_names_the_cause_on_lines_written_differently(lines, rule_id, code) -> None:
    report = _report("".join(_line(*w) for w in lines))
    named = _named(report, rule_id, code)
    assert named, [(f.code, f.title, f.detail[:300]) for f in report.findings]
    others = {r.id for r in CAT.cond_rules if r.cause != RULE[rule_id].cause and r.cause in
              " ".join(f.detail for f in report.findings)}
    assert not others, others  # one cause, not two


@pytest.mark.parametrize("msg", [
    "socketStartConnect: Connect to 10.0.0.2<45678> failed : Connection timed out",  # 2.16-2.23
    "bootstrapNetConnect: Connect to 10.0.0.2<45678> failed : Connection refused",  # 2.24-2.26
    "ncclOsSocketStartConnect: connect to 10.0.0.2<45678> failed : No route to host",  # 2.27+
])
def test_a_connect_failed_line_is_never_read_as_an_errno_its_condition_excludes(msg) -> None:
    # NCCL prints 'Connect to %s failed' only for errnos it does not retry: refused, timed out
    # and unreachable connects retry and end in 'exceeded retries/timeouts' instead, so the
    # condition rules these readings out (such a line is from another build: no cause claimed)
    e = CAT.lookup(msg)
    assert e is not None and all(c.get("negated") for c in e.conditions)
    assert CAT.condition_cause(e, msg) is None
    [f] = [f for f in _report(_line("", "n1", 0, "misc/socket.cc:483", msg)).findings
           if f.code == "nccl-log-connect"]
    assert "Decided by" not in f.detail
    other = msg.rsplit(": ", 1)[0] + ": Software caused connection abort"
    assert CAT.condition_cause(CAT.lookup(other), other) is None  # no rule for ECONNABORTED


def test_a_gpu_architecture_condition_is_a_version_problem_naming_the_version() -> None:
    text = ("gpu-b200-1:100:100 [0] NCCL INFO NCCL version 2.27.3+cuda12.4\n"
            "gpu-b200-1:100:200 [0] enqueue.cc:1100 NCCL WARN FP8 reduction support begins "
            "with sm90 capable devices.\n")
    report = _report(text)
    [f] = _named(report, "gpu-arch-version")
    assert "version problem" in f.detail and "NCCL here: 2.27.3+cuda12.4" in f.detail
    assert RULE["gpu-arch-version"].kind == "version"


def test_errno_is_read_from_the_text_or_the_number_printed() -> None:
    assert CAT.errno_of("failed : No such device or address") == "ENXIO"
    assert CAT.errno_of("returned 113(No route to host) errno 115(Operation now in progress)") \
        == "EHOSTUNREACH"
    assert CAT.errno_of("Call to recv failed, errno 104") == "ECONNRESET"
    assert CAT.errno_of("size 9637888") is None  # a number that is not an errno
    assert CAT.errno_of("x" * 100_000 + "No space left on device") is None  # bounded


# ------------------------------------------------------------------ coverage per version
def coverage() -> dict[str, tuple[int, int]]:
    """Per catalogued NCCL version: (strings, strings whose condition gets a cause)."""
    def holds(vs, v):
        k = catalogue._vkey(v)
        return any(catalogue._vkey(a) <= k <= catalogue._vkey(b) for a, b in vs)
    out = {}
    for v in CAT.tags:
        es = [e for e in CAT.entries if holds(e.versions, v)]
        got = [e for e in es if any(CAT.condition_rules(e, c) for c in e.conditions
                                    if holds(c.get("versions", []), v))]
        out[v] = (len(es), len(got))
    return out


# pinned (docs/nccl-log.md, 'Causes from the condition in NCCL's source'): a drop fails
PINNED = {"2.12.12": (218, 36), "2.18.6": (304, 56), "2.22.3": (336, 60), "2.26.6": (434, 64),
          "2.28.9": (482, 70), "2.30.7": (854, 96)}


def test_condition_coverage_per_nccl_version_does_not_drop() -> None:
    cov = coverage()
    table = {v: f"{n} strings, {k} ({k / n:.1%}) with a condition-level cause"
             for v, (n, k) in cov.items()}
    print(json.dumps(table, indent=1))
    for v, (n, k) in PINNED.items():
        assert cov[v][0] == n, (v, cov[v])  # the catalogue changed: update the pinned figures
        assert cov[v][1] >= k, (v, cov[v], table)
    assert all(k / n >= 0.10 for n, k in cov.values()), table
