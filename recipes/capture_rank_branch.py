"""One rank hangs after a few steps, in a rank-dependent branch - caught by the job itself.

    MLDEBUG_DIR=$PWD/capture torchrun --standalone --nproc_per_node 4 \
        recipes/capture_rank_branch.py
    mldebug hang analyze capture        # names rank 2, outside any collective
    mldebug trace show capture          # names the `if` that rank 2 took and the others did not

Every rank runs ``mldebug.watchdog()`` and the execution ring (``mldebug.trace``). At step
HANG_STEP rank HANG_RANK takes the "validation" branch and blocks there (here on an event
nobody sets, as a stuck evaluation or data loader would) while the others wait in the
all_reduce of that step. After STALL_TIMEOUT seconds without a beat each rank writes its
stacks and ring into $MLDEBUG_DIR. Knobs (environment): STALL_TIMEOUT (5), ON_STALL (dump),
HANG_RANK (2), HANG_STEP (3), BLOCK=gil (block in a C call that holds the GIL for
GIL_SECONDS, 8), NO_PTRACE=1 (forbid ptrace on this process: prctl(PR_SET_DUMPABLE, 0)),
NO_HANDLER_RANK (this rank installs nothing), NO_RING=1 (the watchdog without the ring: its
stacks but no ring), MLDEBUG_FR=1 (also the flight recorder),
HANG_RANK_TIMEOUT (the hanging rank's own watchdog timeout: larger than STALL_TIMEOUT, the
culprit dumps last - under dump+abort the others wait for its dump before they exit, see
mldebug/capture/evidence.py).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import threading

import torch
import torch.distributed as dist
from gil_hold import hold_gil

import mldebug
import mldebug.trace

PR_SET_DUMPABLE = 4


def forbid_ptrace() -> None:
    """Like a container without SYS_PTRACE: nobody without CAP_SYS_PTRACE may attach."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def validate(step: int) -> None:
    """The branch only one rank takes: it never comes back."""
    if os.environ.get("BLOCK") == "gil":
        hold_gil(float(os.environ.get("GIL_SECONDS", "8")))
    threading.Event().wait()  # stuck: nobody sets this event


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    if os.environ.get("MLDEBUG_FR"):  # the flight recorder too (mldebug fr trigger)
        from mldebug.fr import enable as enable_flight_recorder

        enable_flight_recorder()
    if os.environ.get("NO_HANDLER_RANK") != str(rank):
        if os.environ.get("NO_RING") != "1":
            mldebug.trace.enable(events="lines", ring=256)
        stall = os.environ.get("STALL_TIMEOUT", "5")
        if str(rank) == os.environ.get("HANG_RANK", "2"):  # the culprit may dump last
            stall = os.environ.get("HANG_RANK_TIMEOUT", stall)
        mldebug.watchdog(timeout=float(stall),
                         on_stall=os.environ.get("ON_STALL", "dump"))
        if os.environ.get("NO_PTRACE") == "1":
            forbid_ptrace()
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    hang_step = int(os.environ.get("HANG_STEP", "3"))
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())  # one write: never interleaved
    for step in range(100):
        grad = torch.full((4,), float(step))
        if rank == hang_rank and step == hang_step:
            validate(step)
        dist.all_reduce(grad)
        mldebug.beat()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
