"""One rank hangs outside any collective in a job that runs torch's debug server.

    torchrun --standalone --nproc_per_node 4 recipes/hang_debug_server.py &
    mldebug hang            # py-spy; where ptrace is forbidden, the debug server answers

Every rank calls ``torch.distributed.debug.start_debug_server()`` (PyTorch 2.13+): a worker
server per rank, registered in the job's TCPStore, that answers stack requests. Rank
HANG_RANK (2) then waits on an event nobody sets while the others wait in the all_reduce.
What mldebug should say: rank 2 is the suspect, "not in any collective", at wait_for_data;
with ptrace forbidden (NO_PTRACE=1 makes every rank non-dumpable, and mldebug runs without
CAP_SYS_PTRACE) every rank's route is "debug-server".

Knobs (environment): HANG_RANK (2), NO_PTRACE=1, DEBUG_PORT (the frontend's port on rank 0,
default 25999), STALL_TIMEOUT (also run mldebug.watchdog(); its stall line says the debug
server is up, with MLDEBUG_DIR for its dumps). Rank 0's HTTP frontend needs jinja2 and tabulate; without them torch raises
ImportError after the worker server is up and registered - the recipe says so and goes on,
as mldebug needs only the worker servers.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import threading

import torch
import torch.distributed as dist

PR_SET_DUMPABLE = 4


def wait_for_data() -> None:
    threading.Event().wait()  # stuck: nobody sets this event


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    from torch.distributed.debug import start_debug_server

    try:
        start_debug_server(port=int(os.environ.get("DEBUG_PORT", "25999")))
    except ImportError as e:  # the frontend's dependencies; the worker server already runs
        print(f"rank {rank}: debug frontend not started ({e}); worker server is up", flush=True)
    if os.environ.get("NO_PTRACE") == "1":
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    if os.environ.get("STALL_TIMEOUT"):  # mldebug's watchdog too: its stall line names the server
        import mldebug

        mldebug.watchdog(timeout=float(os.environ["STALL_TIMEOUT"]))
    dist.barrier()  # every rank registered before anyone reports ready
    os.write(1, f"rank {rank} pid {os.getpid()} ready\n".encode())
    hang_rank = int(os.environ.get("HANG_RANK", "2"))
    for step in range(1000):
        if rank == hang_rank and step == 1:
            wait_for_data()
        dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
