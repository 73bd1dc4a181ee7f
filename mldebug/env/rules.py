"""Checks of one node's facts: pure functions ``NodeFacts -> list[Finding]``.

Every rule is a small function registered in ``RULES``; ``check(facts)`` runs them all.
Sources for names and semantics: torch's ProcessGroupNCCL.hpp / FlightRecorder.hpp (which
names alias which, and that the first-listed new name wins), c10's CUDAAllocatorConfig.h
(PYTORCH_CUDA_ALLOC_CONF is still read first by the CUDA allocator), NCCL's debug.cc
(NCCL_DEBUG levels and NCCL_DEBUG_SUBSYS names) and socket.cc/utils.cc (interface lists).
"""

from __future__ import annotations

from collections.abc import Callable

from mldebug.env import ifname
from mldebug.env.facts import NodeFacts
from mldebug.findings import Finding, Severity

GiB = 1 << 30

# old name -> (new name, since). torch reads both; the new name wins when both are set.
DEPRECATED: dict[str, tuple[str, str]] = {
    "NCCL_ASYNC_ERROR_HANDLING": ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2.2"),
    "NCCL_BLOCKING_WAIT": ("TORCH_NCCL_BLOCKING_WAIT", "2.2"),
    "NCCL_DESYNC_DEBUG": ("TORCH_NCCL_DESYNC_DEBUG", "2.2"),
    "NCCL_ENABLE_TIMING": ("TORCH_NCCL_ENABLE_TIMING", "2.2"),
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": (
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "2.2"),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": ("TORCH_FR_BUFFER_SIZE", "2.9"),
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": ("TORCH_FR_DUMP_TEMP_FILE", "2.9"),
    "TORCH_NCCL_TRACE_CPP_STACK": ("TORCH_FR_CPP_STACK", "2.9"),
    "PYTORCH_CUDA_ALLOC_CONF": ("PYTORCH_ALLOC_CONF", "2.9"),
}
# Names only torch >= 2.9 reads: on an older torch they do nothing.
NEW_IN_2_9 = {new: old for old, (new, since) in DEPRECATED.items() if since == "2.9"}

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
NCCL_SUBSYS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC",
               "ALLOC_HOST", "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS",
               "DESTROY", "ALL")
TRUE = ("1", "y", "yes", "t", "true")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUE


def _f(facts: NodeFacts, severity: Severity, code: str, title: str, detail: str = "",
       fix: str = "") -> Finding:
    return Finding(severity, title, detail, fix, code, (facts.host,))


def _int_env(facts: NodeFacts, name: str) -> int | None:
    try:
        return int(facts.env[name])
    except (KeyError, ValueError):
        return None


def _torch_version(facts: NodeFacts) -> tuple[int, int] | None:
    v = str(facts.torch.get("version") or "")
    parts = v.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------ deprecated names
def check_deprecated(facts: NodeFacts) -> list[Finding]:
    out = []
    env = facts.env
    for old, (new, since) in DEPRECATED.items():
        if old not in env:
            continue
        if new in env:
            if old == "PYTORCH_CUDA_ALLOC_CONF":
                used = "torch's CUDA allocator reads PYTORCH_CUDA_ALLOC_CONF first, the " \
                       "generic allocator config prefers PYTORCH_ALLOC_CONF"
            else:
                used = f"torch uses {new} and ignores {old}"
            if env[old] != env[new]:
                out.append(_f(facts, Severity.ERROR, "env-deprecated-conflict",
                              f"{old} and {new} are both set, to different values",
                              f"{old}={env[old]}, {new}={env[new]}: {used}.",
                              f"unset {old} and keep only {new}={env[new]} (or the value you meant)."))
            else:
                out.append(_f(facts, Severity.HINT, "env-deprecated-duplicate",
                              f"{old} is set next to its replacement {new} (same value)",
                              f"{old} was renamed {new} in torch {since}.",
                              f"unset {old}."))
            continue
        tv = _torch_version(facts)
        if since == "2.9" and tv is not None and tv < (2, 9):
            continue  # the old name is the right one for this torch
        out.append(_f(facts, Severity.WARNING, "env-deprecated",
                      f"{old} is deprecated; torch {since}+ calls it {new}",
                      f"{old}={env[old]} still works but warns, and may stop working.",
                      f"export {new}={env[old]}; unset {old}"))
    tv = _torch_version(facts)
    if tv is not None and tv < (2, 9):
        for new, old in NEW_IN_2_9.items():
            if new in facts.env and old not in facts.env:
                out.append(_f(facts, Severity.WARNING, "env-too-new",
                              f"{new} has no effect with torch {facts.torch.get('version')}",
                              f"torch before 2.9 only reads {old}.",
                              f"export {old}={facts.env[new]} (or upgrade torch to >= 2.9)."))
    return out


# ------------------------------------------------------------------ NCCL_DEBUG family
def check_nccl_debug(facts: NodeFacts) -> list[Finding]:
    out = []
    env = facts.env
    level = env.get("NCCL_DEBUG")
    if level is not None and level.strip().upper() not in NCCL_DEBUG_LEVELS:
        out.append(_f(facts, Severity.ERROR, "nccl-debug-invalid",
                      f"NCCL_DEBUG={level} is not a level NCCL knows",
                      "NCCL accepts VERSION, WARN, INFO, ABORT or TRACE; anything else leaves "
                      "logging off, so you will see nothing.",
                      "export NCCL_DEBUG=INFO (or WARN for errors only)."))
    subsys = env.get("NCCL_DEBUG_SUBSYS")
    if subsys:
        body = subsys[1:] if subsys.startswith("^") else subsys
        unknown = [s for s in body.split(",") if s.strip() and s.strip().upper() not in NCCL_SUBSYS]
        if unknown:
            out.append(_f(facts, Severity.WARNING, "nccl-debug-subsys-unknown",
                          f"NCCL_DEBUG_SUBSYS names unknown subsystems: {', '.join(unknown)}",
                          "Known: " + ", ".join(NCCL_SUBSYS) + " (a leading ^ inverts the list).",
                          "fix the spelling, e.g. export NCCL_DEBUG_SUBSYS=INIT,NET,ENV"))
    dfile = env.get("NCCL_DEBUG_FILE")
    if dfile:
        if "~" in dfile:
            out.append(_f(facts, Severity.ERROR, "nccl-debug-file-tilde",
                          f"NCCL_DEBUG_FILE={dfile} contains '~', which NCCL does not expand",
                          "NCCL opens the path literally, so the log file is not created where "
                          "you expect (or not at all).",
                          "use an absolute path, e.g. NCCL_DEBUG_FILE=$HOME/nccl.%h.%p.log "
                          "(the shell expands $HOME)."))
        missing = [t for t in ("%h", "%p") if t not in dfile]
        if missing:
            ws = _int_env(facts, "WORLD_SIZE") or _int_env(facts, "LOCAL_WORLD_SIZE")
            multi = ws is not None and ws > 1
            out.append(_f(facts, Severity.WARNING if multi else Severity.HINT,
                          "nccl-debug-file-shared",
                          f"NCCL_DEBUG_FILE={dfile} has no {' or '.join(missing)}",
                          ("Every rank opens the same file with mode 'w', so ranks overwrite "
                           "each other's logs" + (f" (WORLD_SIZE={ws})." if multi else
                                                  " on a multi-rank job.")),
                          "export NCCL_DEBUG_FILE=/path/nccl-log.%h.%p.txt "
                          "(%h = host name, %p = pid)."))
        if level is None or level.strip().upper() == "VERSION":
            out.append(_f(facts, Severity.HINT, "nccl-debug-file-unused",
                          "NCCL_DEBUG_FILE is set but NCCL_DEBUG is not INFO/WARN/TRACE",
                          "NCCL only writes the file when NCCL_DEBUG is above VERSION.",
                          "export NCCL_DEBUG=INFO (or unset NCCL_DEBUG_FILE)."))
    return out


# ------------------------------------------------------------------ interfaces
def _iface_list(facts: NodeFacts) -> str:
    parts = []
    for i in facts.interfaces:
        state = "" if i.usable else (" down" if not i.running else " no address")
        parts.append(f"{i.name} ({i.kind}{state})")
    return ", ".join(parts) or "none"


def _suggest_ifname(facts: NodeFacts) -> str:
    good = [i.name for i in facts.interfaces if i.usable and i.kind not in
            ("loopback", "docker", "virtual", "bridge")]
    if good:
        return f"export NCCL_SOCKET_IFNAME=={good[0]}" + (
            f"  (or ={','.join(good)})" if len(good) > 1 else "")
    return "unset NCCL_SOCKET_IFNAME to let NCCL choose"


def socket_selection(facts: NodeFacts) -> list[str] | None:
    """Interfaces NCCL would use for sockets on this node (None: NCCL auto-selects)."""
    value = facts.env.get("NCCL_SOCKET_IFNAME")
    usable = [i.name for i in facts.interfaces if i.usable]
    if value is None or ifname.socket_ifname_ignored(value):
        return ifname.auto_select(usable)
    return ifname.select(ifname.parse(value), usable)


def check_socket_ifname(facts: NodeFacts) -> list[Finding]:
    value = facts.env.get("NCCL_SOCKET_IFNAME")
    if not facts.interfaces:
        return []
    if value is not None and ifname.socket_ifname_ignored(value):
        return [_f(facts, Severity.WARNING, "nccl-socket-ifname-ignored",
                   f"NCCL_SOCKET_IFNAME={value!r} is ignored (one character or empty)",
                   "NCCL only honours values longer than one character and auto-detects "
                   "otherwise.", _suggest_ifname(facts))]
    chosen = socket_selection(facts) or []
    kinds = {i.name: i.kind for i in facts.interfaces}
    if value is not None:
        spec = ifname.parse(value)
        if not chosen:
            down = [i.name for i in facts.interfaces if spec.matches(i.name) and not i.usable]
            extra = f" ({', '.join(down)} matches but is down or has no address)" if down else ""
            return [_f(facts, Severity.ERROR, "nccl-socket-ifname-no-match",
                       f"NCCL_SOCKET_IFNAME={value} selects no interface{extra}",
                       f"It means {spec.describe()}. Interfaces here: {_iface_list(facts)}. "
                       "NCCL fails init with 'no socket interface found' or hangs.",
                       _suggest_ifname(facts))]
    if chosen and all(kinds.get(n) in ("loopback", "docker", "virtual") for n in chosen):
        how = f"NCCL_SOCKET_IFNAME={value}" if value is not None else "NCCL's automatic choice"
        return [_f(facts, Severity.WARNING if value is not None else Severity.HINT,
                   "nccl-socket-ifname-local-only",
                   f"{how} uses only {', '.join(chosen)}",
                   "Loopback and docker bridges do not reach other nodes: a multi-node job "
                   "hangs at init. Fine for a single node.",
                   _suggest_ifname(facts))]
    return []


def check_ib_hca(facts: NodeFacts) -> list[Finding]:
    out = []
    value = facts.env.get("NCCL_IB_HCA")
    ports = [(p.device, p.port) for p in facts.ib_ports]
    real = ", ".join(f"{d}:{p}" for d, p in ports) or "none"
    if value:
        spec = ifname.parse(value)
        if not ports:
            out.append(_f(facts, Severity.WARNING, "nccl-ib-hca-no-devices",
                          f"NCCL_IB_HCA={value} is set but this node has no InfiniBand devices",
                          "/sys/class/infiniband is empty or missing, so NCCL will fall back to "
                          "sockets (slow) or a network plugin.",
                          "check the HCAs are visible (ibv_devinfo; containers need the "
                          "/dev/infiniband devices), or unset NCCL_IB_HCA."))
            return out
        chosen = ifname.select_ports(spec, ports)
        if not chosen:
            out.append(_f(facts, Severity.ERROR, "nccl-ib-hca-no-match",
                          f"NCCL_IB_HCA={value} selects no HCA port",
                          f"It means {spec.describe()}. HCA ports here: {real}.",
                          "export NCCL_IB_HCA==" + ",".join(sorted({d for d, _ in ports
                                                                     if 'bond' not in d}))))
        else:
            inactive = [f"{p.device}:{p.port} ({p.state})" for p in facts.ib_ports
                        if (p.device, p.port) in chosen and p.state and p.state.upper() != "ACTIVE"]
            if inactive:
                out.append(_f(facts, Severity.WARNING, "nccl-ib-hca-inactive",
                              f"NCCL_IB_HCA selects ports that are not ACTIVE: {', '.join(inactive)}",
                              "NCCL skips or fails on ports whose link is down.",
                              "check cables/subnet manager (ibstat), or exclude them: "
                              "NCCL_IB_HCA=^=" + ",".join(i.split(" ")[0].split(":")[0]
                                                           for i in inactive)))
            bonds = sorted({d for d, _ in chosen if "bond" in d})
            if bonds and len({d for d, _ in chosen}) > len(bonds):
                out.append(_f(facts, Severity.WARNING, "nccl-ib-hca-bond",
                              f"NCCL_IB_HCA includes the bond device(s) {', '.join(bonds)}",
                              "Mixing a bonded RoCE device with the IB HCAs usually lowers "
                              "bandwidth.", "export NCCL_IB_HCA=^" + ",".join(bonds)))
    elif ports:
        devs = {d for d, _ in ports}
        bonds = sorted(d for d in devs if "bond" in d)
        if bonds and len(devs) > len(bonds):
            out.append(_f(facts, Severity.HINT, "nccl-ib-hca-bond",
                          f"NCCL will also use the bond device(s) {', '.join(bonds)}",
                          "NCCL_IB_HCA is unset, so every HCA is used, including "
                          f"{', '.join(bonds)}; that usually lowers bandwidth.",
                          "export NCCL_IB_HCA=^" + ",".join(bonds)))
    if ports and _truthy(facts.env.get("NCCL_IB_DISABLE")):
        out.append(_f(facts, Severity.WARNING, "nccl-ib-disabled",
                      f"NCCL_IB_DISABLE=1 while this node has InfiniBand HCAs ({real})",
                      "NCCL will run over TCP sockets, far slower than IB verbs.",
                      "unset NCCL_IB_DISABLE"))
    return out


# ------------------------------------------------------------------ debug settings left on
DEBUG_ONLY: dict[str, tuple[Callable[[str], bool], str]] = {
    "NCCL_DEBUG": (lambda v: v.strip().upper() in ("INFO", "TRACE"),
                   "verbose NCCL logging on every rank"),
    "CUDA_LAUNCH_BLOCKING": (_truthy, "every CUDA kernel launch waits for completion"),
    "TORCH_NCCL_BLOCKING_WAIT": (_truthy, "wait() blocks the CPU on every collective"),
    "NCCL_BLOCKING_WAIT": (_truthy, "wait() blocks the CPU on every collective"),
    "TORCH_DISTRIBUTED_DEBUG": (lambda v: v.strip().upper() in ("INFO", "DETAIL"),
                                "extra collective consistency checks and logging"),
    "TORCH_CPP_LOG_LEVEL": (lambda v: v.strip().upper() in ("INFO", "0"),
                            "verbose C++ logging"),
    "TORCH_USE_CUDA_DSA": (_truthy, "device-side assertions in every kernel"),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": (_truthy, "every allocation goes to cudaMalloc"),
    "TORCH_NCCL_NAN_CHECK": (_truthy, "a NaN scan of every collective's input"),
    "NCCL_P2P_DISABLE": (_truthy, "NVLink/PCIe peer-to-peer off: intra-node traffic is slow"),
    "NCCL_SHM_DISABLE": (_truthy, "shared-memory transport off"),
}


def check_debug_settings(facts: NodeFacts) -> list[Finding]:
    out = []
    for name, (is_on, why) in DEBUG_ONLY.items():
        value = facts.env.get(name)
        if value is not None and is_on(value):
            out.append(_f(facts, Severity.WARNING, "debug-setting-on",
                          f"{name}={value} is a debugging setting that slows production runs",
                          f"Effect: {why}.", f"unset {name} once you are done debugging."))
    return out


# ------------------------------------------------------------------ limits, ptrace, cores
def check_limits(facts: NodeFacts) -> list[Finding]:
    out = []
    shm = facts.limits.get("shm_bytes")
    if isinstance(shm, int) and shm < GiB:
        out.append(_f(facts, Severity.WARNING, "shm-small",
                      f"/dev/shm is only {shm / 2**20:.0f} MiB",
                      "NCCL's shared-memory transport and DataLoader workers need more; docker "
                      "gives 64 MiB by default, which fails with 'Bus error' or NCCL "
                      "'unhandled system error'.",
                      "docker run --shm-size=1g (or larger), or remount /dev/shm bigger."))
    memlock = facts.limits.get("memlock_soft", "absent")
    if memlock is not None and memlock != "absent":
        sev = Severity.WARNING if facts.ib_ports else Severity.HINT
        out.append(_f(facts, sev, "memlock-limited",
                      f"locked-memory limit is {int(memlock) // 1024} KiB, not unlimited",
                      "RDMA (InfiniBand) registers pinned buffers; a small memlock limit makes "
                      "NCCL fail or fall back.",
                      "ulimit -l unlimited (docker: --ulimit memlock=-1; limits.conf: "
                      "'* soft memlock unlimited')."))
    return out


def check_ptrace(facts: NodeFacts) -> list[Finding]:
    scope = facts.ptrace.get("yama_ptrace_scope")
    cap = bool(facts.ptrace.get("cap_sys_ptrace"))
    problem = None
    if scope == 3:
        problem = "kernel.yama.ptrace_scope=3 forbids ptrace entirely (until reboot)"
    elif scope == 2 and not cap:
        problem = "kernel.yama.ptrace_scope=2 allows ptrace only with CAP_SYS_PTRACE, which " \
                  "this user lacks"
    elif scope == 1 and not cap:
        problem = "kernel.yama.ptrace_scope=1 lets py-spy attach only to its own children"
    out = []
    if problem:
        out.append(_f(facts, Severity.WARNING, "ptrace-denied",
                      "py-spy cannot attach to running ranks, so 'mldebug hang' would fail",
                      problem + ".",
                      "sudo sysctl -w kernel.yama.ptrace_scope=0, or run as root; containers: "
                      "--cap-add=SYS_PTRACE."))
    if facts.py_spy and not facts.py_spy.get("path"):
        out.append(_f(facts, Severity.WARNING, "py-spy-missing",
                      "py-spy is not installed",
                      "'mldebug hang' samples rank stacks with py-spy.",
                      "pip install py-spy (next to the job's Python)."))
    elif facts.py_spy.get("path") and facts.py_spy.get("runs") is False:
        out.append(_f(facts, Severity.WARNING, "py-spy-broken",
                      f"py-spy at {facts.py_spy['path']} does not run",
                      str(facts.py_spy.get("error", "")), "reinstall it: pip install -U py-spy"))
    return out


def check_core(facts: NodeFacts) -> list[Finding]:
    out = []
    if facts.limits.get("core_soft") == 0:
        out.append(_f(facts, Severity.HINT, "core-disabled",
                      "core dumps are disabled (ulimit -c 0)",
                      "A segfaulting rank leaves no core file to open in gdb.",
                      "ulimit -c unlimited in the job script (persistent: "
                      "'* soft core unlimited' in /etc/security/limits.conf)."))
    handler = facts.core.get("pipe_handler") or ""
    if "apport" in handler:
        out.append(_f(facts, Severity.HINT, "core-apport",
                      "core files are sent to apport",
                      f"kernel.core_pattern={facts.core.get('pattern')}: cores land in "
                      "/var/crash or /var/lib/apport/coredump, often not at all for non-packaged "
                      "programs.",
                      "sudo sysctl -w kernel.core_pattern=/tmp/core-%e.%p.%h.%t"))
    elif "systemd-coredump" in handler:
        out.append(_f(facts, Severity.HINT, "core-systemd",
                      "core files are stored by systemd-coredump",
                      "Find them with 'coredumpctl list'; they are not in the working directory.",
                      "coredumpctl gdb PID, or set kernel.core_pattern to a path."))
    return out


# ------------------------------------------------------------------ rendezvous and world
def check_rendezvous(facts: NodeFacts) -> list[Finding]:
    out = []
    ma = facts.master_addr
    if ma and not ma.get("addresses"):
        out.append(_f(facts, Severity.ERROR, "master-addr-unresolvable",
                      f"MASTER_ADDR={ma.get('host')} does not resolve",
                      f"Name lookup: {ma.get('error') or 'no addresses'}. Every rank of this "
                      "node fails (or waits) at init_process_group.",
                      "use the master's IP address or a name every node resolves (check "
                      "/etc/hosts and DNS)."))
    for p in facts.ports:
        if p.get("target") == "MASTER_ADDR:MASTER_PORT" and "not both set" in str(p.get("error")):
            out.append(_f(facts, Severity.WARNING, "check-port-no-master",
                          "--check-port has nothing to check: MASTER_ADDR and MASTER_PORT are "
                          "not both set here",
                          "Without a value, --check-port checks MASTER_ADDR:MASTER_PORT of the "
                          "node's own environment; no network test was made.",
                          "export MASTER_ADDR=<master host> MASTER_PORT=29500 (as the job "
                          "does), or pass --check-port HOST:PORT."))
        elif not p.get("open"):
            out.append(_f(facts, Severity.ERROR, "port-unreachable",
                          f"{p.get('target')} is not reachable",
                          f"connect: {p.get('error') or 'failed'}. The rendezvous (TCPStore) "
                          "must be listening there before the other ranks connect.",
                          "check the master is running and that no firewall blocks the port; "
                          "pick a free MASTER_PORT if another job holds it."))
    port = facts.env.get("MASTER_PORT")
    if port is not None and not (port.isdecimal() and 0 < int(port) < 65536):
        out.append(_f(facts, Severity.ERROR, "master-port-invalid",
                      f"MASTER_PORT={port} is not a TCP port number",
                      "", "export MASTER_PORT=29500 (any free port 1024-65535)."))
    return out


def visible_gpus(facts: NodeFacts) -> int | None:
    count = facts.gpu_count
    cvd = facts.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        listed = [x for x in cvd.split(",") if x.strip()]
        return len(listed) if count is None else min(len(listed), count)
    return count


def check_world(facts: NodeFacts) -> list[Finding]:
    out = []
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in facts.env and _int_env(facts, name) is None:
            out.append(_f(facts, Severity.ERROR, "world-not-integer",
                          f"{name}={facts.env[name]} is not an integer", "",
                          f"set {name} to a number (launchers set it for you: don't export it "
                          "by hand)."))
    rank, ws = _int_env(facts, "RANK"), _int_env(facts, "WORLD_SIZE")
    lrank, lws = _int_env(facts, "LOCAL_RANK"), _int_env(facts, "LOCAL_WORLD_SIZE")
    if rank is not None and ws is not None and not 0 <= rank < ws:
        out.append(_f(facts, Severity.ERROR, "world-rank-range",
                      f"RANK={rank} is outside WORLD_SIZE={ws}", "",
                      "RANK must be 0..WORLD_SIZE-1; check the launcher settings."))
    if lrank is not None and lws is not None and not 0 <= lrank < lws:
        out.append(_f(facts, Severity.ERROR, "world-rank-range",
                      f"LOCAL_RANK={lrank} is outside LOCAL_WORLD_SIZE={lws}", "",
                      "LOCAL_RANK must be 0..LOCAL_WORLD_SIZE-1."))
    if ws is not None and lws is not None:
        if ws < lws:
            out.append(_f(facts, Severity.ERROR, "world-size-inconsistent",
                          f"WORLD_SIZE={ws} is smaller than LOCAL_WORLD_SIZE={lws}", "",
                          "WORLD_SIZE counts all ranks on all nodes; fix the launcher's "
                          "--nnodes/--nproc_per_node."))
        elif ws % lws:
            out.append(_f(facts, Severity.WARNING, "world-size-uneven",
                          f"WORLD_SIZE={ws} is not a multiple of LOCAL_WORLD_SIZE={lws}",
                          "Nodes run different numbers of ranks; intended only for "
                          "heterogeneous jobs.",
                          "use the same --nproc_per_node on every node."))
    gpus = visible_gpus(facts)
    count = facts.gpu_count
    cvd = facts.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and count:
        bad = [x for x in cvd.split(",") if x.strip().isdecimal() and int(x) >= count]
        if bad:
            out.append(_f(facts, Severity.ERROR, "cuda-visible-devices-invalid",
                          f"CUDA_VISIBLE_DEVICES={cvd} names GPUs this node does not have",
                          f"This node has {count} GPU(s): indices 0-{count - 1}.",
                          f"export CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(count))}"))
    if cvd is not None and not cvd.strip() and count:
        out.append(_f(facts, Severity.HINT, "cuda-visible-devices-empty",
                      "CUDA_VISIBLE_DEVICES is empty: every GPU is hidden",
                      "Useful to debug on CPU; a GPU job will see no device.",
                      "unset CUDA_VISIBLE_DEVICES"))
    if lws is not None and gpus and lws > gpus:
        out.append(_f(facts, Severity.ERROR, "world-more-ranks-than-gpus",
                      f"LOCAL_WORLD_SIZE={lws} but only {gpus} GPU(s) are visible",
                      "Ranks beyond the GPU count share devices or fail with 'invalid device "
                      "ordinal'; NCCL refuses two ranks on one GPU.",
                      f"run --nproc_per_node {gpus}, or fix CUDA_VISIBLE_DEVICES."))
    return out


# ------------------------------------------------------------------ torch, GPUs
def check_torch(facts: NodeFacts) -> list[Finding]:
    t = facts.torch
    status = t.get("status")
    py = facts.python.get("executable", "python")
    if status == "timeout":
        return [_f(facts, Severity.WARNING, "torch-probe-timeout",
                   f"inspecting torch{' ' + str(t['version']) if t.get('version') else ''} "
                   f"did not finish within {t.get('timeout_s')}s",
                   "The torch install is slow to load (network file system, cold cache) or "
                   "hangs at import; torch facts are missing from this report.",
                   f"time it: {py} -c 'import torch'; raise --torch-timeout if it is only slow.")]
    if status == "error":
        return [_f(facts, Severity.ERROR, "torch-broken",
                   f"torch is installed but broken in {py}",
                   str(t.get("error", "")),
                   f"reinstall torch in that environment: {py} -m pip install --force-reinstall "
                   "torch==<your version>")]
    if status == "missing":
        return [_f(facts, Severity.INFO, "torch-missing",
                   f"torch is not installed in {py}", "",
                   "run mldebug from the job's environment to see its torch.")]
    out = []
    gpus = facts.gpus.get("devices") or []
    if gpus and status == "ok" and not t.get("cuda") and not t.get("hip"):
        out.append(_f(facts, Severity.ERROR, "torch-cpu-build-on-gpu-node",
                      f"torch {t.get('version')} is a CPU-only build but this node has "
                      f"{len(gpus)} GPU(s)", "The job will not use the GPUs.",
                      "install a CUDA build of torch (see pytorch.org for the index URL)."))
    if t.get("cuda_available") is False and gpus:
        out.append(_f(facts, Severity.ERROR, "torch-cuda-unavailable",
                      "torch cannot use the GPUs",
                      str(t.get("cuda_error") or "torch.cuda.is_available() is False"),
                      "check the driver supports torch's CUDA version (nvidia-smi) and "
                      "CUDA_VISIBLE_DEVICES."))
    backends = t.get("backends") or {}
    if gpus and backends and not backends.get("nccl") and t.get("cuda"):
        out.append(_f(facts, Severity.WARNING, "torch-no-nccl",
                      "torch was built without NCCL", "The nccl backend is unavailable.",
                      "install an official CUDA build of torch."))
    return out


def check_gpus(facts: NodeFacts) -> list[Finding]:
    p2p = facts.gpus.get("p2p") or []
    bad = [f"GPU{i}-GPU{j}: {v}" for i, row in enumerate(p2p) for j, v in enumerate(row)
           if i < j and v not in ("OK", "X")]
    if bad:
        return [_f(facts, Severity.WARNING, "gpu-p2p-unsupported",
                   f"GPU peer-to-peer is not supported between {len(bad)} GPU pair(s)",
                   "; ".join(bad[:8]) + (" ..." if len(bad) > 8 else "") +
                   " (CNS chipset, GNS GPU, TNS topology not supported). Intra-node traffic "
                   "goes through host memory.",
                   "check IOMMU/ACS settings (NCCL troubleshooting guide); expected on some "
                   "low-end GPUs.")]
    return []


def check_collection(facts: NodeFacts) -> list[Finding]:
    errors = facts.raw.get("errors") or {}
    if not errors:
        return []
    return [_f(facts, Severity.WARNING, "collect-error",
               f"some facts could not be gathered: {', '.join(sorted(errors))}",
               "\n".join(f"{k}: {v}" for k, v in sorted(errors.items())),
               "the checks that need them were skipped; please report this with the detail.")]


RULES: list[Callable[[NodeFacts], list[Finding]]] = [
    check_collection,
    check_deprecated, check_nccl_debug, check_socket_ifname, check_ib_hca,
    check_debug_settings, check_limits, check_ptrace, check_core, check_rendezvous,
    check_world, check_torch, check_gpus,
]


def check(facts: NodeFacts) -> list[Finding]:
    """Every rule over one node's facts."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(facts))
    return out
