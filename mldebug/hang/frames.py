"""Reading one stack: what kind each frame is (user code, a library, torch, mldebug), which
collective or wait the innermost frames are in, which threads are background. Shared by the
hang analysis and its rules (``mldebug.hang.rules``), which must not import each other.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterable, Sequence

from mldebug.hang.model import StackFrame, Thread
from mldebug.ours import our_module

# torch.distributed entry points a rank can block in (names of the Python functions).
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "barrier",
    "monitored_barrier", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "send_object_list", "recv_object_list", "new_group",
    "new_subgroups", "init_process_group", "destroy_process_group",
})
# torch functions that are a collective wait in disguise.
_TORCH_WAITS = {
    ("torch/autograd/", "_engine_run_backward"): "backward",
    ("torch/autograd/", "backward"): "backward",
    ("torch/distributed/rendezvous.py", "_create_c10d_store"): "init_process_group",
    ("torch/distributed/elastic/rendezvous", "next_rendezvous"): "init_process_group",
}
_NATIVE_WAITS = (("c10d::Work::wait", "wait"), ("c10d::ProcessGroupNCCL::WorkNCCL::wait", "wait"))

_DIST_LIBRARIES = ("deepspeed", "megatron", "fairscale", "accelerate", "apex")
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"threading", "concurrent"}
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_SIMPLE_REPR = re.compile(r"^-?[0-9][0-9_.eE+-]*$|^(True|False|None)$|^'[^']{0,40}'$")


# -- frames ----------------------------------------------------------------------------
# Packages whose frames are never the user's code, for text dumps, which carry only
# package-relative names (deepspeed/runtime/engine.py); any other top-level name is the user's
# (src/train/loop.py, trapdata/worker.py).
KNOWN_LIBRARIES = frozenset({
    "accelerate", "apex", "datasets", "deepspeed", "fairscale", "flash_attn", "huggingface_hub",
    "hydra", "lightning", "lightning_fabric", "lightning_utilities", "megatron", "nemo", "numpy",
    "omegaconf", "peft", "pytorch_lightning", "ray", "safetensors", "tokenizers", "tqdm",
    "transformer_engine", "transformers", "triton", "trl", "vllm", "wandb", "xformers",
})


# mldebug's own modules (the package's top-level names, read from its directory): their
# frames in a rank (the trace ring's tracer, the watchdog, printflock, the debugger's wait) are
# ours, never the culprit's location.
# what a rank does in each of our modules, for "in mldebug: ..."
OUR_ROLES = {
    "trace": "the execution ring (mldebug.trace)", "capture": "the watchdog (mldebug.watchdog)",
    "debugger": "the debugger (mldebug.breakpoint)", "printing": "printflock (mldebug.print)",
    "numerics": "the numerics hooks", "memory": "the memory tracker",
}


def is_ours(f: StackFrame) -> bool:
    """A Python frame of mldebug's own package (``mldebug/trace/ring.py``), by path."""
    if f.native:
        return False
    return _ours(f) is not None


def _ours(f: StackFrame) -> str | None:
    return our_module(f.short or f.filename) or (our_module(f.filename) if f.short else None)


def our_role(frames: Iterable[StackFrame]) -> str | None:
    """What mldebug does in this stack, innermost first ("the debugger ..."), or None."""
    for f in frames:
        if is_ours(f):
            return OUR_ROLES.get(_ours(f) or "", "mldebug")
    return None


def without_ours(frames: list[StackFrame]) -> list[StackFrame]:
    """The stack with mldebug's own frames taken out (the same list when there are none)."""
    if not any(frame_kind(f) == "mldebug" for f in frames):
        return frames
    return [f for f in frames if frame_kind(f) != "mldebug"]


@functools.lru_cache(maxsize=1 << 16)
def frame_kind(f: StackFrame) -> str:
    """'native', 'mldebug' (our own frames), 'torch', 'library' (other packages, stdlib) or
    'user'."""
    if f.native:
        return "native"
    if is_ours(f):
        return "mldebug"
    path = f.filename.replace("\\", "/")
    short = (f.short or path).replace("\\", "/")
    if "/torch/" in path or short.startswith("torch/"):
        return "torch"
    if short.startswith("<frozen") or "/site-packages/" in path or "/dist-packages/" in path:
        return "library"
    if re.search(r"/lib/python3\.\d+/", path):
        return "library"
    if "/" not in path or path == short:  # text dumps carry short names only
        top = short.split("/", 1)[0].removesuffix(".py")
        if top in _STDLIB:
            return "library"
        if "/" in short and top in KNOWN_LIBRARIES:  # deepspeed/runtime/engine.py
            return "library"
    return "user"


def python_frames(frames: Iterable[StackFrame]) -> list[StackFrame]:
    return [f for f in frames if not f.native]


def user_frames(frames: Iterable[StackFrame]) -> list[StackFrame]:
    return [f for f in frames if frame_kind(f) == "user"]


def where(frames: Sequence[StackFrame]) -> str:
    """The innermost user frame, else the innermost Python frame, else the innermost frame."""
    for pick in (user_frames(frames), python_frames(frames), list(frames)):
        if pick:
            return pick[0].location
    return "(no frames)"


def call_site(frames: Sequence[StackFrame]) -> str | None:
    users = user_frames(frames)
    if not users:
        return None
    f = users[0]
    return f"{f.display_file}:{f.line} in {f.name}"


def collective_of(frames: Sequence[StackFrame]) -> str | None:
    """Name the torch.distributed call the innermost frames are blocked in, if any.

    Python frames decide; a native ``c10d::Work::wait`` (with --native) names the wait on an
    async collective's handle when no Python collective frame is there.
    """
    native_wait = None
    for f in frames:
        if f.native:
            for sym, name in _NATIVE_WAITS:
                if native_wait is None and f.name.startswith(sym):
                    native_wait = name
            continue
        kind = frame_kind(f)
        if kind == "user":
            # the innermost Python code is the user's own: not in a collective, unless it
            # waits on an async collective's Work handle
            return native_wait
        path = (f.short or f.filename).replace("\\", "/")
        if "torch/distributed/" in path and f.name in COLLECTIVES:
            return f.name
        for (frag, fname), label in _TORCH_WAITS.items():
            if frag in path and f.name == fname:
                return label
        name = f.name.rsplit(".", 1)[-1]
        if name in COLLECTIVES and ("/comm/" in path or "/distributed/" in path
                                    or path.split("/", 1)[0] in _DIST_LIBRARIES
                                    or any(f"/{lib}/" in path for lib in _DIST_LIBRARIES)):
            return name  # deepspeed.comm, ZeRO, megatron wrappers (before torch's frames)
    return native_wait


# The two stages of torch.distributed's start-up a rank can wait in: reaching the job's store
# (rendezvous: MASTER_ADDR:MASTER_PORT, the elastic agent's store) and, once there, building
# the process group (every rank publishes its address and waits for the others').
_STORE_STAGE = frozenset({"_create_c10d_store", "_env_rendezvous_handler", "_tcp_rendezvous_handler",
                          "rendezvous", "next_rendezvous", "_rendezvous_helper"})
_GROUP_STAGE = frozenset({"_new_process_group_helper", "_store_based_barrier",
                          "_create_process_group_wrapper", "_new_group_with_tag"})


def startup_stage(frames: Sequence[StackFrame]) -> tuple[str, StackFrame] | None:
    """("store", frame) for a rank still reaching the job's store in init_process_group,
    ("group", frame) for one past it, building the process group; None otherwise. The
    innermost such torch frame below the user's code decides."""
    for f in frames:
        if f.native:
            continue
        if frame_kind(f) == "user":
            return None
        path = (f.short or f.filename).replace("\\", "/")
        if "torch/distributed/" not in path:
            continue
        name = f.name.rsplit(".", 1)[-1]
        if name in _STORE_STAGE:
            return "store", f
        if name in _GROUP_STAGE:
            return "group", f
    return None


# What a frame waits in, checked on the frames inside libraries (before the first user
# frame); the outermost match names the wait (Queue.get, not the Condition.wait inside it).
# (label, native symbol prefixes, (python file fragment, function names))
WAITS: tuple[tuple[str, tuple[str, ...], tuple[str, frozenset[str]]], ...] = (
    ("dataloader", (), ("torch/utils/data/", frozenset({"_try_get_data", "_get_data"}))),
    ("cuda-sync", ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                   "cuStreamSynchronize", "cuCtxSynchronize", "cudaMemcpy",
                   "at::native::_local_scalar_dense"),
     ("torch/cuda/", frozenset({"synchronize"}))),
    ("subprocess", (), ("subprocess.py", frozenset({"wait", "_wait", "_try_wait", "communicate"}))),
    ("queue", (), ("queue", frozenset({"get", "put"}))),  # queue.py, multiprocessing/queues.py
    ("thread-join", (), ("threading.py", frozenset({"join", "_wait_for_tstate_lock"}))),
    ("event", (), ("threading.py", frozenset({"wait"}))),
    ("lock", ("lock_PyThread_acquire_lock", "rlock_acquire", "PyThread_acquire_lock"),
     ("threading.py", frozenset({"acquire"}))),
    ("sleep", ("time_sleep", "pysleep", "clock_nanosleep", "__nanosleep", "nanosleep"),
     ("", frozenset())),
    ("fs-read", ("read", "__libc_read", "__read_nocancel", "pread64", "__libc_pread",
                 "open64", "__libc_open64", "__open64", "openat", "__openat64", "stat", "statx",
                 "__GI___libc_read", "__GI___open64"),
     ("", frozenset())),
)


def _wait_label(f: StackFrame) -> str | None:
    if f.native:
        for label, syms, _ in WAITS:
            for sym in syms:
                if f.name == sym or (len(sym) > 8 and f.name.startswith(sym)):
                    return label
        return None
    path = (f.short or f.filename).replace("\\", "/")
    short_name = f.name.rsplit(".", 1)[-1]  # py-spy >= 3.11 qualifies: Queue.get
    for label, _, (frag, names) in WAITS:
        if frag and frag in path and short_name in names:
            return label
    return None


def wait_of(frames: Sequence[StackFrame]) -> tuple[str, StackFrame] | None:
    """What the innermost frames wait in (label, frame), or None.

    Only the frames below the first user frame count: a rank that called ``queue.get``
    waits in the queue whatever the user code around it does.
    """
    found = None
    for f in frames:
        if not f.native and frame_kind(f) == "user":
            break
        label = _wait_label(f)
        if label is not None:
            found = (label, f)
    return found


# Threads every healthy rank has, which never make a rank a suspect: torch's NCCL watchdog
# and heartbeat monitor (C++; a Python frame only when py-spy shows it), the DataLoader pin
# memory thread, torch.compile's worker pool, tqdm's monitor, idle executor workers.
BACKGROUND_THREADS: tuple[tuple[str, str], ...] = (
    ("torch/utils/data/_utils/pin_memory.py", ""),
    ("torch/_inductor/compile_worker/", ""),
    ("torch/_inductor/async_compile.py", ""),
    ("tqdm/_monitor.py", ""),
    ("concurrent/futures/thread.py", "_worker"),
    ("torch/distributed/elastic/", ""),
    ("torch/distributed/", "_watchdog"),
    ("torch/distributed/", "heartbeat"),
)


def is_background(t: Thread) -> bool:
    """A known non-culprit thread (see BACKGROUND_THREADS), judged by its outermost frames."""
    low = t.name.lower()
    if "watchdog" in low or "heartbeat" in low or low.startswith("pt_"):
        return True
    for f in t.frames[-3:]:
        path = (f.short or f.filename).replace("\\", "/")
        for frag, name in BACKGROUND_THREADS:
            if frag in path and (not name or name in f.name):
                return True
    return False
