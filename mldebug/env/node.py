# ruff: noqa: UP031  (%-formatting kept: this file runs on whatever python3 a node has)
"""Gather the environment facts of one node and print them as one ``MLDEBUG-JSON`` line.

Stdlib-only on purpose: ``mldebug env --nodes`` sends this file's source to every node
bundled with ``mldebug.nodekit`` (``mldebug.fanout.NodeJob``), so it must run on a bare ``python3`` (3.7+), and the
local run uses the very same script. It never imports torch: torch facts come from a child
interpreter with a timeout, so a broken or slow torch install is reported, never fatal.
nvidia-ml-py is used when it happens to be importable (optional).

Arguments: ``--torch-timeout S`` (default 10), ``--torch-import`` (also import torch in the
child), ``--check-port HOST:PORT`` (repeatable), ``--resolve-timeout S`` (default 3).
"""

import json
import os
import platform
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

from mldebug.nodekit import ArgumentParser, emit, find_py_spy, short_hostname

# Environment families worth reporting (prefixes) and single names.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "CUDA_",
                "PYTORCH_", "TORCH_CPP_", "TORCH_SHOW_", "GLOO_", "TORCHELASTIC_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "OMP_NUM_THREADS",
             "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_NNODES",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
             "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "PYTHON_DISABLE_REMOTE_DEBUG")

# Runs in a child interpreter (argv[1] == "import" also imports torch). The default
# "static" mode reads torch/version.py and asks libnccl for its version without importing
# torch, which takes seconds on a busy node; "import" adds what only a live torch knows.
TORCH_PROBE = r"""
import ast, glob, json, os, sys, time
t0 = time.time()
out = {"mode": sys.argv[1]}
import importlib.util
spec = importlib.util.find_spec("torch")
if spec is None or not spec.origin:
    print("TORCHPROBE " + json.dumps({"installed": False})); sys.exit(0)
tdir = os.path.dirname(spec.origin)
out["installed"] = True
out["path"] = tdir
vpath = os.path.join(tdir, "version.py")
with open(vpath) as f:
    tree = ast.parse(f.read(), vpath)
names = {"__version__": "version", "cuda": "cuda", "hip": "hip", "git_version": "git_version",
         "debug": "debug"}
for node in tree.body:
    target = value = None
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign):
        target, value = node.target, node.value
    if isinstance(target, ast.Name) and target.id in names and value is not None:
        try:
            out[names[target.id]] = ast.literal_eval(value)
        except ValueError:
            pass
if "version" not in out:
    raise RuntimeError("%s/version.py defines no __version__" % tdir)
out["cuda_build"] = bool(glob.glob(os.path.join(tdir, "lib", "libtorch_cuda*.so")))
site = os.path.dirname(tdir)
libs = (glob.glob(os.path.join(tdir, "lib", "libnccl.so*"))
        + glob.glob(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so*")))
if libs:
    out["nccl_lib"] = libs[0]
    try:
        import ctypes
        v = ctypes.c_int()
        if ctypes.CDLL(libs[0]).ncclGetVersion(ctypes.byref(v)) == 0:
            n = v.value
            out["nccl"] = ("%d.%d.%d" % (n // 10000, n % 10000 // 100, n % 100) if n >= 20900
                           else "%d.%d.%d" % (n // 1000, n % 1000 // 100, n % 100))
    except OSError as e:
        out["nccl_error"] = str(e)[:200]
if sys.argv[1] == "import":
    print("TORCHSTATIC " + json.dumps(out), flush=True)  # kept if the import hangs
    t1 = time.time()
    import torch
    out["import_s"] = round(time.time() - t1, 2)
    out["version"] = torch.__version__
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
    except Exception as e:
        out["cuda_available"] = False
        out["cuda_error"] = repr(e)[:300]
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        import torch.distributed as dist
        out["backends"] = {n: bool(getattr(dist, "is_%s_available" % n, lambda: False)())
                           for n in ("nccl", "gloo", "mpi", "ucc", "xccl")}
    except Exception as e:
        out["dist_error"] = repr(e)[:300]
out["probe_s"] = round(time.time() - t0, 2)
print("TORCHPROBE " + json.dumps(out))
"""


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _limit(value):
    return None if value == resource.RLIM_INFINITY else int(value)


# ---------------------------------------------------------------- torch (child process)
def start_torch_probe(mode):
    """Start the torch probe now; it runs while the other facts are gathered."""
    try:
        return subprocess.Popen([sys.executable, "-c", TORCH_PROBE, mode], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
    except OSError as e:
        return e


def finish_torch_probe(proc, started, timeout):
    if isinstance(proc, OSError):
        return {"status": "error", "error": "could not start %s: %s" % (sys.executable, proc)}
    remaining = max(0.1, timeout - (time.time() - started))
    try:
        out, err = proc.communicate(timeout=remaining)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            proc.kill()
        out, _ = proc.communicate()
        doc = {}  # type: dict
        for line in out.splitlines():
            if line.startswith("TORCHSTATIC "):
                doc = json.loads(line[len("TORCHSTATIC "):])
        doc.update({"status": "timeout", "timeout_s": timeout,
                    "error": "the torch probe did not finish within %gs" % timeout})
        return doc
    for line in out.splitlines():
        if line.startswith("TORCHPROBE "):
            doc = json.loads(line[len("TORCHPROBE "):])
            doc["status"] = "ok" if doc.get("installed") else "missing"
            return doc
    lines = [ln.strip() for ln in err.strip().splitlines() if ln.strip()]
    where = [ln for ln in lines if ln.startswith("File ")]
    error = lines[-1] if lines else "the probe printed nothing (exit code %s)" % proc.returncode
    if where:
        error += " (" + where[-1] + ")"
    return {"status": "error", "returncode": proc.returncode, "error": error}


# ---------------------------------------------------------------- system
def os_facts():
    pretty = None
    text = _read("/etc/os-release", "") or ""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    return {
        "name": pretty or platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "container": os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
        "glibc": _glibc(),
        "cpu_model": _cpu_model(),
    }


def _glibc():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read(65536)  # the first processor's block is enough
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("model name", "Model", "cpu model")):
            return line.split(":", 1)[1].strip()
    return None


# Distributions a bug report about distributed training usually needs.
PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "flash-attn", "flash_attn",
            "numpy", "triton", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-cudnn-cu12",
            "nvidia-cudnn-cu13", "megatron-core", "vllm", "xgboost", "mldebug")


def package_facts():
    """Installed versions of PACKAGES in the interpreter that runs this script."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {}
    out = {}
    for name in PACKAGES:
        try:
            out[name.replace("_", "-")] = metadata.version(name)
        except Exception:  # noqa: BLE001 - not installed or broken metadata
            continue
    return out


def topology_facts(timeout=5.0):
    """``nvidia-smi topo -m`` when nvidia-smi exists (bounded in time and size)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "nvidia-smi topo -m failed: %s" % e
    return r.stdout[:16384].decode("utf-8", "replace")


def python_facts():
    return {"version": platform.python_version(), "executable": sys.executable,
            "implementation": platform.python_implementation()}


def env_facts():
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


# ---------------------------------------------------------------- network
SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40


def _ipv4(name):
    try:
        import fcntl
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def _flags(name, sysdir):
    """Kernel interface flags; the ioctl includes IFF_RUNNING, which sysfs 'flags' omits."""
    try:
        import fcntl
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFFLAGS,
                                 struct.pack("256s", name.encode()[:15]))
        return struct.unpack("H", packed[16:18])[0]
    except (OSError, ImportError):
        text = _read(os.path.join(sysdir, "flags"))
        flags = int(text, 16) if text else 0
        if _read(os.path.join(sysdir, "operstate")) in ("up", "unknown"):
            flags |= IFF_RUNNING
        return flags


def _ipv6_by_name():
    found = {}  # type: dict
    text = _read("/proc/net/if_inet6", "") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6:
            raw = parts[0]
            addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
            try:
                addr = socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, addr))
            except OSError:
                pass
            found.setdefault(parts[5], []).append(addr)
    return found


def interface_kind(name, sysdir):
    """ib / ethernet / bond / bridge / docker / loopback / virtual, from name and sysfs."""
    if name == "lo":
        return "loopback"
    if name.startswith("docker") or name.startswith("br-") or name.startswith("veth"):
        return "docker"
    if name.startswith("virbr"):
        return "virtual"
    if os.path.isdir(os.path.join(sysdir, "bonding")) or name.startswith("bond"):
        return "bond"
    if os.path.isdir(os.path.join(sysdir, "bridge")):
        return "bridge"
    if _read(os.path.join(sysdir, "type")) == "32" or name.startswith("ib"):
        return "ib"
    if not os.path.exists(os.path.join(sysdir, "device")):
        return "virtual"
    return "ethernet"


def interfaces():
    out = []
    v6 = _ipv6_by_name()
    base = "/sys/class/net"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = sorted(n for _, n in socket.if_nameindex())
    for name in names:
        sysdir = os.path.join(base, name)
        try:
            flags = _flags(name, sysdir)
        except ValueError:
            flags = 0
        addrs = []
        v4 = _ipv4(name)
        if v4:
            addrs.append(v4)
        addrs += v6.get(name, [])
        out.append({
            "name": name,
            "kind": interface_kind(name, sysdir),
            "up": bool(flags & IFF_UP),
            "running": bool(flags & IFF_RUNNING),
            "addresses": addrs,
            "mtu": int(_read(os.path.join(sysdir, "mtu"), "0") or 0),
            "speed_mbps": _int_or_none(_read(os.path.join(sysdir, "speed"))),
        })
    return out


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def ib_devices():
    base = "/sys/class/infiniband"
    out = []  # type: list
    try:
        devs = sorted(os.listdir(base))
    except OSError:
        return out
    for dev in devs:
        ports = []
        pdir = os.path.join(base, dev, "ports")
        try:
            port_names = sorted(os.listdir(pdir), key=lambda p: int(p) if p.isdecimal() else 0)
        except OSError:
            port_names = []
        for p in port_names:
            d = os.path.join(pdir, p)
            ports.append({
                "port": int(p) if p.isdecimal() else p,
                "state": (_read(os.path.join(d, "state"), "") or "").split(":")[-1].strip(),
                "link_layer": _read(os.path.join(d, "link_layer"), ""),
                "rate": _read(os.path.join(d, "rate"), ""),
            })
        out.append({"name": dev, "ports": ports})
    return out


# ---------------------------------------------------------------- limits, ptrace, cores
def limits_facts():
    shm = shm_free = None  # type: object
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_frsize * st.f_blocks
        shm_free = st.f_frsize * st.f_bavail
    except OSError:
        pass
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    core = resource.getrlimit(resource.RLIMIT_CORE)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "shm_bytes": shm,
        "shm_free_bytes": shm_free,
        "memlock_soft": _limit(memlock[0]),
        "memlock_hard": _limit(memlock[1]),
        "core_soft": _limit(core[0]),
        "core_hard": _limit(core[1]),
        "nofile_soft": _limit(nofile[0]),
        "cgroup_memory_bytes": cgroup_memory_limit(),
    }


def cgroup_memory_limit():
    """The cgroup memory limit of this process (v2 memory.max or v1), None when unlimited."""
    rel = ""
    for line in (_read("/proc/self/cgroup", "") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[0] == "0" or "memory" in parts[1].split(",")):
            rel = parts[2]
            break
    for path in ("/sys/fs/cgroup" + rel + "/memory.max", "/sys/fs/cgroup/memory.max",
                 "/sys/fs/cgroup/memory" + rel + "/memory.limit_in_bytes",
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read(path)
        if text is None:
            continue
        if text == "max":
            return None
        value = _int_or_none(text)
        if value is not None and value < (1 << 60):
            return value
        return None
    return None


CAP_SYS_PTRACE = 19


def ptrace_facts():
    cap_eff = 0
    for line in (_read("/proc/self/status", "") or "").splitlines():
        if line.startswith("CapEff:"):
            cap_eff = int(line.split()[1], 16)
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    return {
        "yama_ptrace_scope": _int_or_none(scope),
        "cap_sys_ptrace": bool(cap_eff >> CAP_SYS_PTRACE & 1),
        "uid": os.geteuid(),
    }


def core_facts():
    pattern = _read("/proc/sys/kernel/core_pattern")
    handler = None
    if pattern and pattern.startswith("|"):
        prog = os.path.basename(pattern[1:].split()[0]) if pattern[1:].split() else ""
        handler = prog
    return {"pattern": pattern, "pipe_handler": handler}


def py_spy_facts():
    path = find_py_spy()
    if path is None:
        return {"path": None}
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
        return {"path": path, "version": r.stdout.strip().replace("py-spy ", ""),
                "runs": r.returncode == 0}
    except (OSError, subprocess.SubprocessError) as e:
        return {"path": path, "runs": False, "error": str(e)[:200]}


# ---------------------------------------------------------------- GPUs (optional NVML)
def gpu_facts():
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        return {"source": None, "devices": [], "note": "nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return {"source": "nvml", "devices": [], "note": "no NVIDIA driver: %s" % e}
    try:
        def s(v):
            return v.decode() if isinstance(v, bytes) else str(v)
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = []
        for i, h in enumerate(handles):
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            devices.append({"index": i, "name": s(pynvml.nvmlDeviceGetName(h)),
                            "memory_bytes": int(mem.total),
                            "bus_id": s(pynvml.nvmlDeviceGetPciInfo(h).busId)})
        p2p = []
        cap = getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", 0)
        names = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "NS", 5: "NS", 6: "U"}
        for i, a in enumerate(handles):
            row = []
            for j, b in enumerate(handles):
                if i == j:
                    row.append("X")
                    continue
                try:
                    row.append(names.get(int(pynvml.nvmlDeviceGetP2PStatus(a, b, cap)), "U"))
                except Exception:
                    row.append("U")
            p2p.append(row)
        return {"source": "nvml", "driver": s(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(),
                "devices": devices, "p2p": p2p}
    except Exception as e:
        return {"source": "nvml", "devices": [], "note": "NVML query failed: %s" % e}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# ---------------------------------------------------------------- rendezvous reachability
def _with_timeout(fn, timeout):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            box["error"] = str(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return None, "did not answer within %gs" % timeout
    return box.get("value"), box.get("error")


def resolve(host, timeout):
    value, error = _with_timeout(
        lambda: sorted({ai[4][0] for ai in socket.getaddrinfo(host, None)}), timeout)
    return {"host": host, "addresses": value or [], "error": error}


def check_port(spec, timeout):
    if spec == "master":  # this node's MASTER_ADDR:MASTER_PORT
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            return {"target": "MASTER_ADDR:MASTER_PORT", "open": False,
                    "error": "MASTER_ADDR and MASTER_PORT are not both set"}
        spec = "%s:%s" % (addr, port)
    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    out = {"target": spec, "open": False}
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            out["open"] = True
    except ValueError:
        out["error"] = "not HOST:PORT"
    except OSError as e:
        out["error"] = e.strerror or str(e)
    return out


# ---------------------------------------------------------------- main
def _safe(errors, name, fn, *args):
    """One broken fact source (odd /sys, exotic kernel) must not cost the whole report."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported in the document
        errors[name] = "%s: %s" % (type(e).__name__, e)
        return None


def collect(torch_timeout=10.0, ports=(), resolve_timeout=3.0, torch_import=False):
    started = time.time()
    probe = start_torch_probe("import" if torch_import else "static")
    errors = {}  # type: dict
    env = env_facts()
    facts = {
        "schema": 1,
        "host": short_hostname(),
        "os": _safe(errors, "os", os_facts) or {},
        "python": python_facts(),
        "env": env,
        "interfaces": _safe(errors, "interfaces", interfaces) or [],
        "ib_devices": _safe(errors, "ib_devices", ib_devices) or [],
        "limits": _safe(errors, "limits", limits_facts) or {},
        "ptrace": _safe(errors, "ptrace", ptrace_facts) or {},
        "core": _safe(errors, "core", core_facts) or {},
        "py_spy": _safe(errors, "py_spy", py_spy_facts) or {},
        "gpus": _safe(errors, "gpus", gpu_facts) or {},
        "master_addr": resolve(env["MASTER_ADDR"], resolve_timeout) if env.get("MASTER_ADDR")
        else None,
        "ports": [check_port(p, resolve_timeout) for p in ports],
        "packages": _safe(errors, "packages", package_facts) or {},
        "topology": _safe(errors, "topology", topology_facts),
    }
    facts["torch"] = finish_torch_probe(probe, started, torch_timeout)
    facts["errors"] = errors
    facts["collect_s"] = round(time.time() - started, 2)
    return facts


def main(argv):
    p = ArgumentParser(prog="mldebug-env-node",
                       description="Print this node's environment facts as one JSON line.")
    p.add_argument("--torch-timeout", type=float, default=10.0,
                   help="seconds the torch probe (a child interpreter) may take")
    p.add_argument("--resolve-timeout", type=float, default=3.0,
                   help="seconds for resolving MASTER_ADDR and each --check-port host")
    p.add_argument("--torch-import", action="store_true", help="also import torch in the child")
    p.add_argument("--check-port", action="append", default=[], metavar="HOST:PORT",
                   help="check this TCP port is reachable (repeatable; 'master' = MASTER_ADDR)")
    a = p.parse_args(argv)
    emit(collect(a.torch_timeout, a.check_port, a.resolve_timeout, a.torch_import))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
