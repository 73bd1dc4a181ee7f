"""Known causes in NCCL logs: one small function per cause, each returning ``Finding``s.

Every rule reads the ``Context`` (merged processes, WARN kinds grouped across processes,
failure signals, communicators) and returns findings with a fix. A rule that explains a WARN
kind marks it (``ctx.explain``) so the catch-all does not repeat it as a bare "NCCL WARN".
Add a cause: write a function here and append it to ``RULES``. Pure: no I/O.

The texts matched are NCCL's own (src/transport/net_ib.cc, misc/ibvwrap.cc, misc/socket.cc,
misc/shmutils.cc, include/shm.h, init.cc over 2.3 .. 2.27), each seen in a real log under
tests/fixtures/nccl/real/.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from mldebug.findings import Finding, Severity, fold_hosts
from mldebug.nccllog.catalogue import CondCause
from mldebug.nccllog.model import FROM_TRACEBACK, CommSummary, ProcessLog, Signal, WarnGroup
from mldebug.render import fold_ints

# container, bridge, overlay and tunnel interfaces: no other node reaches their addresses
VIRTUAL_IFACES = ("docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "tun", "tap")


@dataclass
class Context:
    procs: list[ProcessLog]
    warns: list[WarnGroup]
    signals: dict[str, Signal]
    comms: list[CommSummary]
    bare_versions: list[str]
    explained: set[str] = field(default_factory=set)  # WarnGroup keys a rule accounted for

    def warns_matching(self, test: Callable[[str], bool]) -> list[WarnGroup]:
        """WARN kinds whose message passes ``test``; they count as explained."""
        out = [w for w in self.warns if test(w.message)]
        self.explained.update(w.key for w in out)
        return out

    def hosts_of(self, groups: Iterable[WarnGroup]) -> list[str]:
        return sorted({h for g in groups for h in g.hosts})


def hosts_text(hosts: Iterable[str]) -> str:
    return fold_hosts(hosts) or "?"


def labels(procs: Sequence[ProcessLog]) -> str:
    """A few processes by name; many as folded ranks and hosts (one line at any scale)."""
    ranks = [p.rank for p in procs]
    if len(procs) <= 3:
        return ", ".join(p.label for p in procs)
    known = [r for r in ranks if r is not None]
    folded = fold_ints(known)
    head = f"ranks {folded}" if len(known) == len(ranks) and len(folded) <= 60 \
        else f"{len(procs)} processes"
    return f"{head} on {hosts_text(p.host for p in procs)}"


def origin_note(groups: Sequence[WarnGroup]) -> str:
    """'; read from torch's 'Last error:' line ...' when no NCCL_DEBUG line printed the WARN."""
    if groups and all(g.origin == FROM_TRACEBACK for g in groups):
        versions = sorted({v for g in groups for v in g.versions})
        return ("; the WARN text is the traceback's 'Last error:' line (torch's copy of NCCL's "
                "last WARN), not an NCCL_DEBUG line"
                + (f"; NCCL {', '.join(versions[:4])} per torch's error" if versions else ""))
    return ""


def _where(groups: Sequence[WarnGroup]) -> str:
    """'printed by 2 process(es): rank 4 (node3:9201), ...' or folded hosts when many."""
    names = list(dict.fromkeys(n for g in groups for n in g.processes))
    if len(names) <= 3:
        return f"{len(names)} process(es): {', '.join(names)}" + origin_note(groups)
    return (f"{len(names)} process(es) on {hosts_text(h for g in groups for h in g.hosts)}"
            + origin_note(groups))


def _f(severity: Severity, code: str, title: str, detail: str, fix: str,
       hosts: Iterable[str] = ()) -> Finding:
    return Finding(severity, title, detail, fix, code, tuple(sorted(set(hosts))))


def condition_cause(groups: Sequence[WarnGroup]) -> CondCause | None:
    """The cause the condition in NCCL's source gives for these WARN kinds, with the errno
    they print (catalogue.json condition_causes; the catalogue is loaded on demand): one that
    names an errno first, as the same failure is often printed twice, once without it."""
    from mldebug.nccllog.catalogue import load
    cat = load()
    found = [cc for g in groups if (cc := cat.condition_cause(
        cat.lookup(g.message), g.message, g.versions[0] if g.versions else None))]
    return next((cc for cc in found if cc.errno), found[0] if found else None)


def condition_note(cc: CondCause | None) -> str:
    return (f"\nCause (from the condition in NCCL's source and the errno printed): "
            f"{cc.rule.cause}.\nDecided by: {cc.evidence}." if cc is not None else "")


# ------------------------------------------------------------------ shared memory
SHM_CALL = re.compile(r"Call to (?:open|shm_open|ftruncate|fallocate|posix_fallocate|mmap) "
                      r"failed ?:")


def rule_shm(ctx: Context) -> list[Finding]:
    def is_shm(m: str) -> bool:
        return ("/dev/shm" in m or "shared memory segment" in m or "posix_fallocate" in m
                or "nccl-shm" in m) and ("No space" in m or "failed to extend" in m
                                         or "creating shared memory" in m
                                         or "attaching to shared memory" in m
                                         or "posix_fallocate" in m)
    groups = ctx.warns_matching(is_shm)
    if not groups:
        return []
    # the errno decides: ENOENT is a missing segment, EACCES a permission, ENOSPC a full
    # /dev/shm; a line without an errno (NCCL < 2.22) keeps the historical reading
    calls = [w for w in ctx.warns if w.key not in ctx.explained and SHM_CALL.match(w.message)]
    cc = condition_cause(groups + calls)
    if cc is not None and cc.rule.id.startswith("shm-"):
        ctx.explained.update(w.key for w in calls)  # SYSCHECK's 'Call to open failed: ...'

        return [_f(Severity.ERROR, "nccl-log-shm", cc.rule.title,
                   f"{groups[0].message}\n({_where(groups)})" + condition_note(cc),
                   cc.rule.fix or "", ctx.hosts_of(groups))]
    return [_f(Severity.ERROR, "nccl-log-shm", "/dev/shm is too small (or full) for NCCL",
               f"{groups[0].message}\n({_where(groups)})",
               "give the container more shared memory: docker run --shm-size=16g (or "
               "--ipc=host); on Kubernetes mount an emptyDir with medium: Memory at /dev/shm; "
               "remove stale /dev/shm/nccl-* files of dead jobs. NCCL_SHM_DISABLE=1 only "
               "hides it (slower).", ctx.hosts_of(groups))]


# ------------------------------------------------------------------ GPUDirect RDMA
def rule_gdr(ctx: Context) -> list[Finding]:
    procs = [p for p in ctx.procs if p.gdr_disabled]
    if not procs:
        return []
    hcas = sorted({h for p in procs for h in p.gdr_disabled})
    old = [p for p in procs if (v := _version_tuple(p.version)) is not None and v <= (2, 22, 3)]
    return [_f(Severity.WARNING, "nccl-log-gdr-disabled",
               "GPUDirect RDMA is disabled: network traffic is staged through host memory",
               f"NET/IB : GPU Direct RDMA Disabled for HCA {', '.join(hcas[:4])}"
               f"{' ...' if len(hcas) > 4 else ''} ({labels(procs)})",
               "load the peer-memory module on every node: modprobe nvidia-peermem (check "
               "lsmod | grep peermem)"
               + ("; this NCCL (<= 2.22.3) only looks for the old nv_peer_mem name, so with "
                  "nvidia-peermem upgrade NCCL or load nv_peer_mem" if old else "")
               + "; check NCCL_NET_GDR_LEVEL is not restricting it and that ACS/IOMMU is off.",
               (p.host for p in procs))]


# ------------------------------------------------------------------ InfiniBand / RoCE
IBV_WC_STATUS = {
    1: ("local length error", "a message was longer than the receive buffer: mismatched "
        "NCCL versions or settings between the peers"),
    2: ("local QP operation error", "check the HCA firmware and driver (ibv_devinfo)"),
    4: ("local protection error", "memory registration failed for the buffer: check "
        "nvidia-peermem / GPUDirect RDMA, ulimit -l (memlock) and NCCL_NET_GDR_LEVEL"),
    5: ("work request flushed", "a consequence of an earlier error on the same queue pair: "
        "look for the first completion error"),
    9: ("remote invalid request", "the peer rejected the request: mismatched NCCL versions "
        "or settings"),
    10: ("remote access error", "the peer's memory key was invalid: a peer process died or "
         "re-registered memory; check the peer's log"),
    11: ("remote operation error", "the peer HCA failed the operation: check the peer node"),
    12: ("transport retry counter exceeded", "the two NICs cannot reach each other over RDMA "
         "(or the link drops packets): on RoCE set NCCL_IB_GID_INDEX to the RoCE v2 GID "
         "with an IPv4 address (show_gids, often 3) and NCCL_IB_TC to the lossless class; "
         "on rail-optimised fabrics try NCCL_CROSS_NIC=0; test the pair with ib_write_bw; "
         "check ibstat link state and cabling"),
    13: ("RNR retry counter exceeded", "the receiver was not ready: raise NCCL_IB_RNR_RETRY "
         "or check the peer is alive"),
}
COMPLETION = re.compile(r"Got completion (?:from peer (?P<peer>\S{1,100}) )?with "
                        r"(?:error |status=)(?P<status>\d{1,4})")


def rule_ib_completion(ctx: Context) -> list[Finding]:
    by_status: dict[int, list[WarnGroup]] = defaultdict(list)
    peers: dict[int, set[str]] = defaultdict(set)
    for w in ctx.warns_matching(lambda m: "Got completion" in m):
        m = COMPLETION.search(w.message)
        status = int(m["status"]) if m else -1
        by_status[status].append(w)
        if m and m["peer"]:
            peers[status].add(m["peer"].split("<")[0])
    out = []
    for status, groups in sorted(by_status.items()):
        name, fix = IBV_WC_STATUS.get(status, ("unknown status", "see ibv_wc_status in "
                                              "infiniband/verbs.h; check ibstat on both ends"))
        link_local = any("fe80" in w.message for w in groups)
        peer = sorted(peers[status])
        out.append(_f(
            Severity.ERROR, "nccl-log-ib-completion",
            f"InfiniBand/RoCE completion error {status} ({name})",
            f"{groups[0].message}\n({_where(groups)}"
            + (f"; peers {', '.join(peer[:4])}{' ...' if len(peer) > 4 else ''}" if peer else "")
            + ")" + ("\nThe GIDs are link-local (fe80::), which do not route between subnets."
                     if link_local else ""),
            fix + (". Pick a routable GID with NCCL_IB_GID_INDEX (show_gids)" if link_local
                   else "") + ".", ctx.hosts_of(groups)))
    return out


MODIFY_QP = re.compile(r"ibv_modify_qp failed with (?:error )?(?P<err>[^,.]{1,80})")
GID_INDEX = re.compile(r"local GID index (?P<i>\d{1,4})")


def rule_ibv_modify_qp(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: "ibv_modify_qp failed" in m)
    if not groups:
        return []
    msg = groups[0].message
    m = MODIFY_QP.search(msg)
    err = m["err"].strip() if m else "?"
    gi = GID_INDEX.search(msg)
    rtr = "next state RTR" in msg or "timed out" in err.lower() or "110" in err
    fix = ("the queue pair could not connect to the peer's NIC: "
           + ("on rail-optimised fabrics (NIC n only reaches NIC n) set NCCL_CROSS_NIC=0; "
              if rtr else "")
           + "set NCCL_IB_GID_INDEX to a routable RoCE v2 GID (show_gids"
           + (f"; this run used index {gi['i']}" if gi else "") + "), check NCCL_IB_HCA "
           "selects only ports that are cabled and ACTIVE (ibstat), and test the pair with "
           "ib_write_bw.")
    cc = condition_cause(groups)  # the errno it returned: unreachable vs refused attributes
    cc = cc if cc is not None and cc.rule.id.startswith("ibv-qp") else None
    return [_f(Severity.ERROR, "nccl-log-ib-modify-qp",
               f"ibv_modify_qp failed ({err})", f"{msg}\n({_where(groups)})" + condition_note(cc),
               fix if cc is None or not cc.rule.fix else f"{cc.rule.fix} {fix}",
               ctx.hosts_of(groups))]


def rule_link_local_gid(ctx: Context) -> list[Finding]:
    procs = [p for p in ctx.procs if p.gid_link_local]
    if not procs or any(f for f in ctx.explained if "fe80" in f):
        return []
    return [_f(Severity.WARNING, "nccl-log-ib-link-local-gid",
               "RoCE uses a link-local (fe80::) GID",
               f"{labels(procs)} connect with GID index 0 (fe80::...), which does not route "
               "across subnets or VLANs.",
               "set NCCL_IB_GID_INDEX to the RoCE v2 GID with an IPv4 address (show_gids, "
               "often 3).", (p.host for p in procs))]


def rule_ib_bond_and_transports(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    bond: dict[str, list[ProcessLog]] = defaultdict(list)
    for p in ctx.procs:
        net = p.net
        if net is not None and net.plugin.startswith("IB"):
            for name in net.interfaces:
                if "bond" in name:
                    bond[name].append(p)
    for name, ps in bond.items():
        out.append(_f(Severity.WARNING, "nccl-log-ib-bond",
                      f"NCCL/IB includes the bond device {name}",
                      f"{labels(ps)} use {name} next to the IB HCAs; this usually lowers "
                      "bandwidth.", f"export NCCL_IB_HCA=^{name}"))
    ib = [p for p in ctx.procs if (p.transport or "").startswith("IB")]
    sock = [p for p in ctx.procs if p.transport == "Socket"]
    if ib and sock:
        out.append(_f(Severity.ERROR, "nccl-log-socket-vs-ib",
                      "some processes use TCP sockets while others use InfiniBand",
                      f"Socket: {labels(sock)}; IB: {labels(ib)}. The job runs at socket speed "
                      "or fails to connect.",
                      "on the socket nodes check the HCAs are visible (ibv_devinfo, "
                      "/dev/infiniband in containers, libibverbs installed) and "
                      "NCCL_IB_DISABLE is unset.", (p.host for p in sock)))
    for p in sock:
        names = [n for net in p.nets if net.plugin == "Socket" for n in net.interfaces]
        if (names and all(n.startswith("ib") for n in names)) or \
                p.env.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
            out.append(_f(Severity.WARNING, "nccl-log-socket-with-ib",
                          "NCCL uses TCP sockets although InfiniBand is present",
                          f"{p.label}: NET/Socket over {', '.join(names) or '?'}"
                          + (" with NCCL_IB_DISABLE set" if "NCCL_IB_DISABLE" in p.env else "")
                          + "; IB verbs would be much faster.",
                          "unset NCCL_IB_DISABLE; make sure libibverbs and /dev/infiniband "
                          "are available.", (p.host,)))
            break
    return out


# ------------------------------------------------------------------ interfaces
def _is_virtual(name: str) -> bool:
    return name == "lo" or name.startswith(VIRTUAL_IFACES)


def rule_virtual_interfaces(ctx: Context) -> list[Finding]:
    """Loopback/container/virtual interfaces in the Bootstrap or NET/Socket list; the fix names
    the real NIC printed beside them."""
    by_iface: dict[str, dict[str, ProcessLog]] = defaultdict(dict)
    real: dict[str, dict[str, None]] = defaultdict(dict)  # virtual name -> real NICs beside it
    for p in ctx.procs:
        names = list(p.bootstrap)
        net = p.net
        if net is not None and net.plugin == "Socket":
            names += net.interfaces
        virtual = [n for n in names if _is_virtual(n)]
        for name in virtual:
            by_iface[name][p.key] = p
            for n in names:
                if not _is_virtual(n) and len(real[name]) < 8:
                    real[name][n] = None
    one_host = len({p.host for p in ctx.procs}) <= 1
    kinds: dict[str, list[str]] = defaultdict(list)  # veth* are per container: one finding
    for name in by_iface:
        kinds[re.sub(r"[0-9a-f]{4,}$|\d+$", "", name) or name].append(name)
    out = []
    for kind, names in kinds.items():
        ps = list({k: p for n in names for k, p in by_iface[n].items()}.values())
        shown = names[0] if len(names) == 1 else f"{kind}* ({len(names)} of them)"
        nics = list(dict.fromkeys(n for v in names for n in real[v]))
        lo_alone = kind == "lo" and one_host  # loopback is fine within one node
        exclude = "^" + ",".join(dict.fromkeys(["lo", "docker", kind]))
        fix = (f"export NCCL_SOCKET_IFNAME={nics[0]} (the real NIC beside it; a prefix: "
               f"NCCL_SOCKET_IFNAME=={nics[0]} for exactly that name), or exclude the rest: "
               f"NCCL_SOCKET_IFNAME={exclude} (a leading ^ excludes every prefix listed; "
               "NCCL's default skips only lo and docker*)" if nics else
               f"export NCCL_SOCKET_IFNAME={exclude} (a leading ^ excludes every prefix "
               "listed), or name the right NIC, e.g. =eth0")
        if lo_alone:
            fix = "nothing to do while the job stays on one host; for several nodes: " + fix
        out.append(_f(Severity.HINT if lo_alone else Severity.WARNING, "nccl-log-iface-virtual",
                      f"NCCL uses interface {shown} (loopback/container/virtual)",
                      f"{labels(ps)} chose {', '.join(names[:3])}"
                      f"{' ...' if len(names) > 3 else ''}"
                      + (f" beside {', '.join(nics[:3])}" if nics else "")
                      + ("; fine while every rank is on this one host, but another node cannot "
                         "reach it." if lo_alone else
                         "; other nodes cannot reach it, so a multi-node job hangs at init or "
                         "fails with 'Connection refused' / 'Network is unreachable'."),
                      fix, (p.host for p in ps)))
    return out


def _address_range(item: str) -> str | None:
    """The address range of an interface item as NCCL prints it ('eth0:10.1.2.3<0>'): the
    private block, link-local, loopback, or a public /16; None if no address."""
    addr = item.split(":", 1)[1] if ":" in item else ""
    addr = addr.split("<", 1)[0].split("%", 1)[0]
    if not addr:
        return None
    parts = addr.split(".")
    if len(parts) == 4 and all(x.isdecimal() and len(x) <= 3 for x in parts):
        a, b = int(parts[0]), int(parts[1])
        if a == 10:
            return "10.0.0.0/8"
        if a == 172 and 16 <= b <= 31:
            return "172.16.0.0/12"
        if a == 192 and b == 168:
            return "192.168.0.0/16"
        if a == 127:
            return "127.0.0.0/8 (loopback)"
        if a == 169 and b == 254:
            return "169.254.0.0/16 (link-local)"
        if a == 100 and 64 <= b <= 127:
            return "100.64.0.0/10"
        return f"{a}.{b}.0.0/16"
    low = addr.lower()
    if low.startswith("fe80"):
        return "fe80::/10 (link-local)"
    if ":" in low:
        return "IPv6 " + ":".join(low.split(":")[:2]) + "::/32"
    return None


def rule_bootstrap_differences(ctx: Context) -> list[Finding]:
    """Hosts whose bootstrap (first socket interface) has another name or lies in another
    address range than the rest. Hosts on a virtual interface are rule_virtual_interfaces'."""
    names: dict[str, set[str]] = defaultdict(set)
    ranges: dict[str, set[str]] = defaultdict(set)
    seen: set[str] = set()
    for p in ctx.procs:
        if p.host in seen or not p.bootstrap_items or p.host == "(no host in line)":
            continue
        seen.add(p.host)
        name = p.bootstrap[0] if p.bootstrap else ""
        if not name or _is_virtual(name):
            continue
        names[name].add(p.host)
        r = _address_range(p.bootstrap_items[0])
        if r is not None:
            ranges[r].add(p.host)
    out: list[Finding] = []
    nets = {(n.plugin, *n.interfaces) for p in ctx.procs if (n := p.net) is not None}
    if len(names) > 1 and len(nets) <= 1:  # different NET choices: rule_odd_interfaces
        detail, odd = _sides({f"bootstrap {k}": v for k, v in names.items()})
        out.append(_f(Severity.WARNING, "nccl-log-bootstrap-iface-differs",
                      "hosts bootstrap NCCL over interfaces of different names", detail + ".",
                      "NCCL_SOCKET_IFNAME matches names by prefix: list each node's NIC of the "
                      f"shared network (e.g. NCCL_SOCKET_IFNAME={','.join(sorted(names)[:3])}) "
                      "or set it per node (/etc/nccl.conf), and check those NICs reach each "
                      "other.", odd))
    if len(ranges) > 1:
        detail, odd = _sides({f"an address in {k}": v for k, v in ranges.items()})
        out.append(_f(Severity.WARNING, "nccl-log-bootstrap-subnet-differs",
                      "hosts bootstrap NCCL from different address ranges", detail
                      + ". Their bootstrap addresses are unlikely to be on one network, so ranks "
                      "cannot connect (init hangs or 'Connection refused' / 'No route to host').",
                      "set NCCL_SOCKET_IFNAME on every node to the NIC of the network the nodes "
                      "share (ip -br addr on each), or route between those networks.", odd))
    return out


def rule_link_local_addresses(ctx: Context) -> list[Finding]:
    procs = [p for p in ctx.procs
             if any("fe80:" in i or "169.254." in i for i in p.bootstrap_items)]
    if not procs:
        return []
    items = sorted({i for p in procs for i in p.bootstrap_items if "fe80:" in i or "169.254." in i})
    return [_f(Severity.WARNING, "nccl-log-iface-link-local",
               "NCCL's interface list includes link-local addresses",
               f"{labels(procs)}: {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}. "
               "A link-local (fe80::/169.254.x) address only reaches its own link; a peer "
               "picking it cannot connect.",
               "set NCCL_SOCKET_IFNAME to the interface with the routable address (and "
               "NCCL_SOCKET_FAMILY=AF_INET if IPv6 is link-local only).",
               (p.host for p in procs))]


def rule_no_interface(ctx: Context) -> list[Finding]:
    sig = ctx.signals.get("no interface")
    unmatched = [p for p in ctx.procs
                 if p.env.get("NCCL_SOCKET_IFNAME") and not p.bootstrap and not p.nets]
    groups = ctx.warns_matching(lambda m: "Address family not supported" in m
                                or "no socket interface" in m.lower()
                                or "is neither AF_INET(2) nor AF_INET6(10)" in m)
    if sig is None and not unmatched and not groups:
        return []
    values = sorted({p.env["NCCL_SOCKET_IFNAME"] for p in unmatched})
    evidence = (sig.examples[0] if sig else groups[0].message if groups else "")
    detail = ((f"NCCL_SOCKET_IFNAME set by environment to {', '.join(values)} on "
               f"{labels(unmatched)}, and no 'Bootstrap : Using' line followed. ")
              if unmatched else "") + (evidence and f"Evidence: {evidence}") \
        + (f" ({_where(groups)})" if groups and origin_note(groups) else "")
    return [_f(Severity.ERROR, "nccl-log-no-interface",
               "NCCL found no usable network interface",
               detail.strip(),
               "the interface named in NCCL_SOCKET_IFNAME does not exist or has no address on "
               "these hosts (check 'ip -br addr' inside the container; use a prefix like "
               "=eth or ^lo,docker), or the container has no network (run with --net host).",
               [p.host for p in unmatched] + ctx.hosts_of(groups))]


# ------------------------------------------------------------------ firewalls and ports
CONNECT = re.compile(r"[Cc]onnect to (?P<peer>[^\s<]{1,100})(?:<(?P<port>\d{1,5})>)?")
CONNECT_WORDS = ("Connection refused", "Connection timed out", "No route to host",
                 "Network is unreachable", "Software caused connection abort",
                 "Call to connect", "socketStartConnect", "Connect to ")


def rule_connect(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: any(w in m for w in CONNECT_WORDS)
                                and "ibv_" not in m)
    if not groups:
        return []
    peers: set[str] = set()
    for w in groups:
        m = CONNECT.search(w.message)
        if m:
            peers.add(m["peer"] + (f":{m['port']}" if m["port"] else ""))
    refused = any("refused" in w.message for w in groups)
    loopback = sorted(p for p in peers if p.startswith(("127.", "::1", "localhost")))
    # refused, timed out and unreachable are three causes: the errno printed decides
    cc = condition_cause(groups)
    cc = cc if cc is not None and cc.rule.id.startswith("connect-") else None
    return [_f(Severity.ERROR, "nccl-log-connect",
               "NCCL could not open a TCP connection to another node"
               + (f" ({cc.rule.title})" if cc else " (connection refused)" if refused else ""),
               f"{groups[0].message}\n({_where(groups)}"
               + (f"; peers {', '.join(sorted(peers)[:4])}{' ...' if len(peers) > 4 else ''}"
                  if peers else "") + ")"
               + (f"\nThe peer address {loopback[0]} is loopback: a process advertised lo (or "
                  "a hostname resolving to 127.0.x.x), which no other process can reach; set "
                  "NCCL_SOCKET_IFNAME to the NIC the nodes share." if loopback else "")
               + condition_note(cc),
               cc.rule.fix if cc is not None and cc.rule.fix else
               "a connection between nodes failed: check NCCL_SOCKET_IFNAME selects a NIC every "
               "node can reach, and that firewalls (iptables/nftables, security groups) allow "
               "TCP between the nodes on all ports: NCCL's bootstrap and socket transport "
               "listen on ephemeral ports, not only MASTER_PORT.", ctx.hosts_of(groups))]


def rule_peer_closed(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: "Connection closed by remote peer" in m
                                or "Connection reset by peer" in m)
    if not groups:
        return []
    return [_f(Severity.WARNING, "nccl-log-peer-closed",
               "a peer closed its NCCL connection",
               f"{groups[0].message}\n({_where(groups)})",
               "the named peer's process exited or crashed first, or the network between the "
               "two dropped the connection: look at that host's log "
               "for the first error (this message is a consequence).", ctx.hosts_of(groups))]


# ------------------------------------------------------------------ plugins
def rule_plugins(ctx: Context) -> list[Finding]:
    by_plugin: dict[str, list[ProcessLog]] = defaultdict(list)
    for p in ctx.procs:
        if p.plugin is not None:
            by_plugin[p.plugin].append(p)
    out = []
    if "none" in by_plugin and len(by_plugin) > 1:
        without = by_plugin["none"]
        with_ = [p for k, ps in by_plugin.items() if k != "none" for p in ps]
        names = ", ".join(sorted(k for k in by_plugin if k != "none"))
        out.append(_f(Severity.ERROR, "nccl-log-plugin-mismatch",
                      "the NCCL network plugin loads on some hosts but not on others",
                      f"no plugin: {hosts_text(p.host for p in without)}; {names}: "
                      f"{hosts_text(p.host for p in with_)}.",
                      "install the same plugin (libnccl-net*.so) and LD_LIBRARY_PATH / "
                      "NCCL_NET_PLUGIN on every node, or none anywhere.",
                      (p.host for p in without)))
    for p in ctx.procs:  # a socket plugin (e.g. NET/FastSocket) over ib* NICs
        for net in p.nets:
            if net.plugin not in ("IB", "Socket") and not net.plugin.startswith("IB") \
                    and any(n.startswith("ib") for n in net.interfaces):
                out.append(_f(Severity.HINT, "nccl-log-plugin",
                              f"NCCL loaded the {net.plugin} network plugin over ib* interfaces",
                              f"{p.label}: NET/{net.plugin} : Using {' '.join(net.items)}. "
                              "Right on clouds that ship this plugin; on an InfiniBand cluster "
                              "expect NET/IB instead.",
                              "if you have IB HCAs, remove the plugin from LD_LIBRARY_PATH or "
                              "set NCCL_NET=IB."))
                return out
    return out


# ------------------------------------------------------------------ versions and CUDA
def _version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else None


def rule_version_mismatch(ctx: Context) -> list[Finding]:
    versions: dict[str, list[ProcessLog]] = defaultdict(list)
    for p in ctx.procs:
        if p.version:
            versions[p.version].append(p)
    extra = [v for v in ctx.bare_versions if v not in versions]  # not tied to a process
    if len(versions) + len(extra) < 2:
        return []
    parts = [f"{v}: {labels(ps)}" for v, ps in sorted(versions.items(), key=lambda kv: -len(kv[1]))]
    parts += [f"{v}: (a line without host)" for v in extra]
    minority = sorted(versions.items(), key=lambda kv: -len(kv[1]))[1:]
    return [_f(Severity.ERROR, "nccl-log-version-mismatch",
               "processes run different NCCL versions", "; ".join(parts),
               "use one environment (container image / venv) on every node.",
               (p.host for _, ps in minority for p in ps))]


def _runtime_major(version: str | None) -> int | None:
    m = re.search(r"\+cuda(\d+)\.", version or "")
    return int(m.group(1)) if m else None


def rule_cuda_driver(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: "CUDA driver version is insufficient" in m)
    sig = ctx.signals.get("cuda driver too old")
    old = [p for p in ctx.procs
           if p.cuda_driver and (rt := _runtime_major(p.version)) and p.cuda_driver // 1000 < rt]
    if not groups and sig is None and not old:
        return []
    detail = []
    if old:
        drv = old[0].cuda_driver or 0
        detail.append(f"{labels(old)}: driver supports CUDA {drv // 1000}.{drv % 1000 // 10}, "
                      f"NCCL {old[0].version} was built for a newer CUDA major.")
    if groups or sig:
        detail.append(groups[0].message if groups else sig.examples[0] if sig else "")
    return [_f(Severity.ERROR, "nccl-log-cuda-driver",
               "the GPU driver is older than the CUDA runtime NCCL was built for",
               "\n".join(detail),
               "upgrade the NVIDIA driver on these nodes (nvidia-smi shows the CUDA version it "
               "supports), or install a torch/NCCL build for the CUDA the driver supports.",
               [p.host for p in old] + ctx.hosts_of(groups))]


def rule_nccl_too_old_for_gpu(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: "maxSharedMem" in m or "named symbol not found" in m
                                or "no kernel image" in m or "compute capability" in m)
    sig = ctx.signals.get("no kernel for gpu")
    if not groups and sig is None:
        return []
    evidence = groups[0].message if groups else sig.examples[0] if sig else ""
    builds = sorted({p.version for p in ctx.procs if p.version})
    if builds:
        evidence += f"\nNCCL here: {', '.join(builds)} (the +cuda part is the CUDA it was built with)."
    return [_f(Severity.ERROR, "nccl-log-nccl-too-old-for-gpu",
               "this NCCL has no kernels for the GPU (too old, or built without its "
               "architecture)", evidence,
               "use an NCCL built for this GPU: Ampere (sm_80) needs NCCL >= 2.7 with CUDA "
               ">= 11.0, Hopper (sm_90) a CUDA >= 11.8 build (NCCL >= 2.15), Blackwell "
               "(sm_100/sm_120) a CUDA >= 12.8 build (NCCL >= 2.25); if you built NCCL "
               "yourself, add the architecture to NVCC_GENCODE.", ctx.hosts_of(groups))]


# ------------------------------------------------------------------ unhandled errors
def rule_unhandled(ctx: Context) -> list[Finding]:
    out = []
    for kind in ("unhandled system error", "unhandled cuda error", "internal error",
                 "remote error"):
        sig = ctx.signals.get(kind)
        if sig is None:
            continue
        cause = sig.preceding_warn
        torch = cause is not None and sig.warn_origin == FROM_TRACEBACK
        where = ""
        if cause:  # which part of NCCL that WARN comes from (catalogue, loaded on demand)
            from mldebug.nccllog.catalogue import load

            cls = load().describe(cause)
            where = f"\nThe WARN before it is about: {cls.title}." if cls else ""
        out.append(_f(Severity.ERROR, "nccl-log-unhandled-error",
                      f"NCCL failed with '{kind}'"
                      + (f"; torch's 'Last error:' (NCCL's WARN): {cause[:160]}" if torch and cause
                         else f"; the WARN before it: {cause[:160]}" if cause else ""),
                      f"{sig.examples[0]}\n(seen {sig.count} time(s))" + where
                      + ("\nThe WARN text comes from the traceback's 'Last error:' line "
                         "(torch's copy of NCCL's last WARN), not from an NCCL_DEBUG line."
                         if torch else ""),
                      ("the error code is generic; the 'Last error:' text in torch's "
                       "traceback is the WARN NCCL printed, the cause (see its own finding, "
                       "if any); NCCL_DEBUG=INFO shows what NCCL was doing before it."
                       if torch else
                       "the error code is generic; the WARN line NCCL printed just before it "
                       "is the cause (see its own finding, if any)." if cause else
                       "no NCCL WARN preceded it: rerun with NCCL_DEBUG=INFO "
                       "NCCL_DEBUG_SUBSYS=INIT,NET,ENV to see which call failed.")))
    return out


def rule_sysfs_topology(ctx: Context) -> list[Finding]:
    groups = ctx.warns_matching(lambda m: "Could not find real path of /sys" in m)
    if not groups:
        return []
    return [_f(Severity.ERROR, "nccl-log-sysfs-topology",
               "NCCL cannot read the GPU's PCI topology from /sys",
               f"{groups[0].message}\n({_where(groups)})",
               "NCCL needs the real /sys PCI tree to build its topology: under WSL2 it is "
               "missing (use native Linux, or a single process); in containers do not hide "
               "/sys; NCCL_TOPO_FILE can supply the topology by hand.", ctx.hosts_of(groups))]


# ------------------------------------------------------------------ P2P / SHM disabled
def rule_transports_disabled(ctx: Context) -> list[Finding]:
    per_host: dict[str, int] = defaultdict(int)
    for p in ctx.procs:
        per_host[p.host] += max(1, len(p.devices))
    out = []
    for var, what in (("NCCL_P2P_DISABLE", "GPU peer-to-peer (NVLink/PCIe P2P)"),
                      ("NCCL_SHM_DISABLE", "shared-memory transport")):
        procs = [p for p in ctx.procs if p.env.get(var, "0") not in ("0", "")
                 and per_host[p.host] > 1]
        if procs:
            out.append(_f(Severity.WARNING, f"nccl-log-{var[5:8].lower()}-disabled",
                          f"{var} is set: {what} between GPUs of a node is off",
                          f"{labels(procs)} run several GPUs per host with {var}="
                          f"{procs[0].env[var]}; traffic between them takes a slower path.",
                          f"unset {var} unless it works around a known hang (then fix the "
                          "cause: ACS/IOMMU on PCIe switches, a driver update), and compare "
                          "the speed with nccl-tests.", (p.host for p in procs)))
    return out


# ------------------------------------------------------------------ communicator init
def rule_init(ctx: Context) -> list[Finding]:
    out = []
    for c in ctx.comms:
        if c.started_not_completed:
            stuck = c.stuck_processes
            shown = ", ".join(stuck[:6]) + (f" and {len(stuck) - 6} more" if len(stuck) > 6 else "")
            out.append(_f(
                Severity.ERROR, "nccl-log-init-incomplete",
                f"rank(s) {_ranks(c.started_not_completed, c.nranks)} never completed init of "
                f"communicator {c.comm_id} ({c.nranks} ranks)",
                f"Init START was logged but no Init COMPLETE by {shown}; completed: "
                f"{_ranks(c.completed, c.nranks) or 'none'}.",
                "those ranks hang in bootstrap/transport setup: look at their WARN lines and "
                "NET choice; check firewalls and NCCL_SOCKET_IFNAME between the nodes.",
                {s.split(':')[0] for s in stuck}))
        if c.absent and (c.completed or c.started_not_completed):
            out.append(_f(
                Severity.WARNING, "nccl-log-init-absent",
                f"no init lines from rank(s) {_ranks(c.absent, c.nranks)} of communicator "
                f"{c.comm_id} ({c.nranks} ranks)",
                "Those ranks never reached NCCL init, or their logs are not among the files.",
                "pass every rank's log (NCCL_DEBUG_FILE=...%h.%p); if they are all there, the "
                "missing ranks died or hung before init_process_group's first collective."))
    return out


def _ranks(ranks: list[int], nranks: int, width: int = 60) -> str:
    """Folded ranks, or 'N of M' when even the folded form is too long for one line."""
    text = fold_ints(ranks)
    return text if len(text) <= width else f"{len(ranks)} of {nranks} ({text[:40]}...)"


def rule_odd_interfaces(ctx: Context) -> list[Finding]:
    choice: dict[str, tuple[str, ...]] = {}
    by_key = {}
    for p in ctx.procs:
        net = p.net
        if net is not None:
            choice[p.key] = (net.plugin, *net.interfaces)
            by_key[p.key] = p
    counts: dict[tuple[str, ...], list[ProcessLog]] = defaultdict(list)
    for k, v in choice.items():
        counts[v].append(by_key[k])
    if len(counts) < 2:
        return []
    ranked = sorted(counts.items(), key=lambda kv: -len(kv[1]))  # stable: first seen wins ties
    odd = [p for _, ps in ranked[1:] for p in ps]
    detail = "; ".join(f"{labels(ps)}: NET/{c[0]} " + ",".join(c[1:]) for c, ps in ranked[:6])
    if len(ranked) > 6:
        detail += f"; and {len(ranked) - 6} more choices"
    return [_f(Severity.WARNING, "nccl-log-odd-interfaces",
               "processes chose different network interfaces than the rest", detail,
               "make the nodes' NICs and NCCL_SOCKET_IFNAME / NCCL_IB_HCA uniform, "
               "or exclude the odd nodes.", (p.host for p in odd))]


# NCCL_* settings whose value differs per host or process by design
PER_HOST_VARS = ("NCCL_DEBUG_FILE", "NCCL_HOSTID", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE",
                 "NCCL_COMM_ID")
MAX_VALUE_SHOWN = 60


def _sides(values: dict[str, set[str]]) -> tuple[str, list[str]]:
    """'hosts node[1-8] use X; node9 uses Y' (most hosts first) and the minority hosts."""
    ranked = sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    parts = []
    for value, hosts in ranked[:6]:
        v = value if len(value) <= MAX_VALUE_SHOWN else value[:MAX_VALUE_SHOWN] + "..."
        parts.append(f"host{'s' if len(hosts) > 1 else ''} {hosts_text(hosts)} "
                     f"use{'' if len(hosts) > 1 else 's'} {v}")
    if len(ranked) > 6:
        parts.append(f"and {len(ranked) - 6} more values")
    return "; ".join(parts), sorted({h for _, hs in ranked[1:] for h in hs})


def rule_host_differences(ctx: Context) -> list[Finding]:
    """Within one job, hosts (or processes) that differ in what NCCL printed about its setup:
    CUDA driver, IB MTU, net plugin, transport, and every NCCL_* setting NCCL reported."""
    out: list[Finding] = []
    checks: list[tuple[str, str, dict[str, set[str]]]] = []
    driver: dict[str, set[str]] = defaultdict(set)
    mtu: dict[str, set[str]] = defaultdict(set)
    plugins: dict[str, set[str]] = defaultdict(set)
    transports: dict[str, set[str]] = defaultdict(set)
    env: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    with_env: list[ProcessLog] = []
    for p in ctx.procs:  # one pass: 8,192 processes cost a few ms
        host = p.host
        if p.cuda_driver:
            driver[f"CUDA driver {p.cuda_driver // 1000}.{p.cuda_driver % 1000 // 10}"].add(host)
        if p.mtu:
            mtu[f"IB MTU {p.mtu}"].add(host)
        if p.plugin is not None:
            plugins[p.plugin].add(host)
        t = p.transport
        if t is not None:
            transports[t].add(host)
        if p.env:
            with_env.append(p)
            for k, v in p.env.items():
                if k.startswith("NCCL_") and k not in PER_HOST_VARS:
                    env[k][f"{k}={v}"].add(host)
    checks.append(("CUDA driver", "install the same NVIDIA driver on every node (nvidia-smi).",
                   driver))
    checks.append(("InfiniBand MTU", "set the same MTU on every HCA port and switch (ibv_devinfo "
                   "shows active_mtu; on RoCE the NIC's MTU).", mtu))
    if "none" not in plugins:  # none vs one plugin: rule_plugins says it
        checks.append(("net plugin", "install the same NCCL net plugin (and NCCL_NET_PLUGIN) on "
                       "every node.", {f"plugin {k}": v for k, v in plugins.items()}))
    if not (any(t.startswith("IB") for t in transports) and "Socket" in transports):
        checks.append(("transport", "make the same network usable on every node (HCAs visible, "
                       "same plugin, same NCCL_NET / NCCL_IB_DISABLE).",
                       {f"NET/{k}": v for k, v in transports.items()}))
    for name in sorted(env):
        setting = env[name]
        unset = {p.host for p in with_env if name not in p.env}
        if unset:
            setting[f"no {name}"] = unset
        checks.append((name, f"set {name} the same way on every node (the launcher's "
                       "environment, /etc/nccl.conf, ~/.nccl.conf), unless a host needs it.",
                       setting))
    for what, fix, values in checks:
        if len(values) < 2:
            continue
        detail, odd = _sides(values)
        out.append(_f(Severity.WARNING, "nccl-log-host-difference",
                      f"hosts differ in {what}", detail + ".", fix, odd))
    return out


def rule_known_issues(ctx: Context) -> list[Finding]:
    """A WARN / failure line or an NCCL setting that matches a known NCCL bug of the version
    the process runs (known_issues.json, from NCCL's release notes)."""
    from mldebug.nccllog.known import load

    versions = sorted({p.version for p in ctx.procs if p.version} | set(ctx.bare_versions))
    out = []
    for row in load():
        hits: list[tuple[str, list[str], list[str]]] = []  # (evidence, versions, hosts)
        for w in ctx.warns:
            if row.matches_message(w.message, w.source):
                known = w.versions or versions
                vs = [v for v in known if row.affects(v)] if known else ["?"]
                if vs:
                    hits.append((w.message, vs, w.hosts))
        for sig in ctx.signals.values():
            for ex in sig.examples:
                if row.matches_message(ex):
                    vs = [v for v in versions if row.affects(v)]
                    if vs:
                        hits.append((ex, vs, []))
        if row.env and row.env_differs:
            with_env = [p for p in ctx.procs if p.env]
            values = {p.env.get(row.env, "(unset)") for p in with_env}
            procs = [p for p in with_env if row.affects(p.version)] \
                if len(values) > 1 and row.env in {k for p in with_env for k in p.env} else []
        else:
            procs = [p for p in ctx.procs if row.matches_env(p.env)
                     and row.affects(p.version)] if row.env else []
        if procs:
            assert row.env is not None
            hits.append((f"{row.env}={procs[0].env.get(row.env, '(unset)')} ({labels(procs)})"
                         + (" while other processes set it otherwise" if row.env_differs
                            else ""),
                         sorted({p.version or "" for p in procs}), [p.host for p in procs]))
        if not hits:
            continue
        vs = sorted({v for _, v_, _ in hits for v in v_} - {"?"})
        title = (f"known bug in NCCL {', '.join(vs)} (affects {row.range_text}), fixed in "
                 f"{row.fixed}" if vs else
                 f"matches a known bug of NCCL {row.range_text}, fixed in {row.fixed} (the "
                 "log does not show its NCCL version: check it is in that range)")
        out.append(_f(
            Severity.ERROR if vs else Severity.WARNING, "nccl-log-known-bug", title,
            f"{row.summary}.\nEvidence: {hits[0][0][:240]}\nSource: {', '.join(row.sources)}",
            f"upgrade NCCL to {row.fixed} or newer (a newer torch wheel / nvidia-nccl-cu* "
            "package or container)" + (f"; until then {row.workaround}" if row.workaround
                                       else "") + ".",
            [h for _, _, hs in hits for h in hs]))
    return out


def rule_torch_watchdog(ctx: Context) -> list[Finding]:
    """PyTorch's NCCL watchdog lines are about ranks, not the network: point to the command
    that reads them across ranks."""
    sig = ctx.signals.get("torch watchdog")
    if sig is None:
        return []
    return [_f(Severity.WARNING, "nccl-log-torch-watchdog",
               f"PyTorch's NCCL watchdog reported a collective timeout ({sig.count} line(s))",
               sig.examples[0][:300] if sig.examples else "",
               "run `mldebug log` on the same files: it compares the ranks' sequence numbers "
               "and names the rank that never reached the collective or failed first.")]


RULES: list[Callable[[Context], list[Finding]]] = [
    rule_shm,
    rule_gdr,
    rule_ib_completion,
    rule_ibv_modify_qp,
    rule_link_local_gid,
    rule_no_interface,
    rule_connect,
    rule_peer_closed,
    rule_plugins,
    rule_version_mismatch,
    rule_cuda_driver,
    rule_nccl_too_old_for_gpu,
    rule_unhandled,
    rule_sysfs_topology,
    rule_transports_disabled,
    rule_init,
    rule_ib_bond_and_transports,
    rule_virtual_interfaces,
    rule_link_local_addresses,
    rule_bootstrap_differences,
    rule_odd_interfaces,
    rule_torch_watchdog,
    rule_known_issues,
    rule_host_differences,
]


def warn_fix(msg: str) -> str:
    """A first step for a WARN no rule explains."""
    low = msg.lower()
    if "connect" in low or "socket" in low or "bootstrap" in low:
        return ("a connection between nodes failed: check NCCL_SOCKET_IFNAME selects a NIC every "
                "node can reach, and firewalls.")
    if "ibv_" in low or "net/ib" in low:
        return "an InfiniBand verbs call failed: check ibstat link state and memlock limits."
    if "cuda" in low:
        return "a CUDA call failed inside NCCL: look for an earlier CUDA error or OOM."
    return "search the message in the NCCL issue tracker; rerun with NCCL_DEBUG_SUBSYS=INIT,NET,ENV."
