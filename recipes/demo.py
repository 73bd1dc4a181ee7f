"""The quick-start demo: hang a real 4-rank job, let mldebug name the culprit, stop the job.

    make demo        (or: .venv/bin/python recipes/demo.py)

Launches recipes/collective_mismatch.py under torchrun (gloo on CPU) in the background,
waits until every rank is blocked, runs `mldebug hang` against it, then stops the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NPROC = 4


def stop_tree(pid: int) -> None:
    """Kill the launcher and every rank (torchrun starts workers in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def main() -> int:
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "mldebug-demo-job.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={NPROC}", str(HERE / "collective_mismatch.py")]
    print(f"demo: starting the hung job: torchrun --nproc_per_node={NPROC} "
          f"recipes/collective_mismatch.py  (log: {log})", flush=True)
    with open(log, "w") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while log.read_text().count(" ready") < NPROC:
            if job.poll() is not None or time.monotonic() > deadline:
                print(log.read_text(), file=sys.stderr)
                print("demo: the job did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        time.sleep(2)  # let every rank enter its collective
        print(f"demo: all {NPROC} ranks are up and blocked; asking mldebug why\n", flush=True)
        mldebug = [sys.executable, "-m", "mldebug"]
        rc = subprocess.call([*mldebug, "hang", "--pid", str(job.pid)])
        return rc
    finally:
        stop_tree(job.pid)
        job.wait()
        print("\ndemo: stopped the job", flush=True)


if __name__ == "__main__":
    sys.exit(main())
