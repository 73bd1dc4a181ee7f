"""Run the fault matrix: for each case start a real torchrun job (gloo on CPU) that injects
one fault on ranks drawn from the seed, run every route that can see it and the tool a user
would use instead, and score what each said.

    python benchmarks/faults/run.py                     # every class, 2, 4 and 8 ranks
    python benchmarks/faults/run.py --quick             # one case per class, 4 ranks
    python benchmarks/faults/run.py --classes sigstop,flock --ranks 4 --seeds 3
    python benchmarks/faults/run.py --json results.json --markdown

Live routes run while the job hangs (before its collective timeout); dead-job routes read
what it left when it ended (its output, its flight-recorder dumps).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOB = HERE / "job.py"
sys.path.insert(0, str(HERE))

from catalogue import BY_NAME, FAULTS, Fault, job_fault  # noqa: E402
from score import Outcome  # noqa: E402

PY = sys.executable

# route class -> matrix class (catalogue's vocabulary)
HANG_CLASSES = {"desync": "desync", "blocked": "blocked", "spinning": "spinning",
                "outside-collective": "outside", "dead-rank": "dead", "slow": "healthy",
                "collective-idle": "network", "same-collective": "network",
                "device-wedge": "network", "stopped": "stopped", "launch": "launch",
                "debugger": "debugger", "same-place": "same-place", "none": "none"}


@dataclass
class Options:
    timeout: float = 12.0  # the jobs' collective timeout
    settle: float = 2.0  # after the injection, for the victims to reach their wait
    watch: float = 2.0
    duration: float = 14.0  # healthy jobs train this long
    peers: bool = True
    routes: tuple[str, ...] = ("hang", "watch", "log", "fr", "trace", "why")
    keep: bool = False
    verbose: bool = False
    pool: bool = False  # run the poolable cases in shared jobs (the quick subset)
    pool_duration: float = 6.0  # a pooled healthy case trains this long
    hold_margin: float = 4.0  # a pooled fault lets go this long after the timeout (job.py)


@dataclass
class Case:
    fault: Fault
    ranks: int
    seed: int
    injectors: list[int]
    truth: list[int]

    @property
    def name(self) -> str:
        return f"{self.fault.name}-r{self.ranks}-s{self.seed}"


def draw(f: Fault, ranks: int, seed: int) -> Case:
    """The culprit ranks of one case, drawn from the seed (never a fixed rank)."""
    rng = random.Random(f"{f.name}/{ranks}/{seed}")
    pool = list(range(ranks))
    if f.name == "p2p_wrong_peer":
        pool = list(range(ranks - 2))  # a sender with a stage two ahead of it
    if f.name == "rank_never_started":
        pool = list(range(1, ranks))  # rank 0 hosts the store of an srun-style launch
    injectors = sorted(rng.sample(pool, f.culprits)) if f.culprits else []
    truth = [] if f.culprit_is == "none" else injectors
    return Case(f, ranks, seed, injectors, truth)


@dataclass
class Running:
    case: Case
    side: Path
    procs: list[subprocess.Popen[bytes]]
    started: float
    log: Path
    notes: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # cross-node: the cluster nodes it runs on
    logs: list[Path] = field(default_factory=list)  # cross-node: each node's output

    def files(self, prefix: str) -> dict[int, str]:
        out = {}
        for p in self.side.glob(f"{prefix}-rank*"):
            try:
                out[int(p.name.rsplit("rank", 1)[1])] = p.read_text().strip()
            except (ValueError, OSError):
                pass
        return out

    def alive(self) -> bool:
        if self.nodes:
            return True  # ranks in other pid namespaces: the side files and the clock decide
        return any(p.poll() is None for p in self.procs)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MLDEBUG_FR_DIR", None)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timeout_of(f: Fault, opts: Options) -> float:
    """The case's collective timeout: the run's, or longer where the live routes read more
    ranks than the job has (two jobs), or where --watch runs after hang on the same hung job
    (at 12 s the desync jobs died inside watch's window: watch was scored on a dead job)."""
    watch = opts.timeout + opts.watch + 6 if "watch" in opts.routes and f.outcome == "hang" \
        else 0.0
    return max(opts.timeout, float(f.extra.get("min_timeout", 0)), watch)


def start(case: Case, base: Path, opts: Options) -> Running:
    f = case.fault
    side = base / case.name
    side.mkdir(mode=0o700)
    args = [str(JOB), "--fault", job_fault(f), "--culprits", ",".join(map(str, case.injectors)),
            "--side", str(side), "--mode", f.mode, "--timeout", str(timeout_of(f, opts))]
    if f.outcome == "ends" or f.name == "scheduler_sigterm":
        args += ["--duration", str(opts.duration if f.outcome == "ends" else 600)]
    if "trace" in opts.routes and "hang" in f.routes:
        args.append("--trace")
    log = side / "out.log"
    out = open(log, "ab")  # noqa: SIM115 - the children's, closed when they end
    env = _env()
    # where its ranks' flight recorders live, as a launcher's environment names it (a
    # directory set only in code is not found by `mldebug hang`'s own flight-recorder check)
    env["MLDEBUG_FR_DIR"] = str(side / "fr")
    procs = []
    common: dict[str, Any] = dict(stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True, stdin=subprocess.DEVNULL, cwd=side)
    if f.launcher == "independent":
        port = _free_port()
        for r in range(case.ranks):
            if r in case.injectors:
                continue  # this rank's process never starts
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(case.ranks),
                     LOCAL_WORLD_SIZE=str(case.ranks), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
            procs.append(subprocess.Popen([PY, *args], **{**common, "env": e}))
    elif f.launcher == "rdzv":
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc_per_node", str(max(1, case.ranks // 2)), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", case.name,
               "--rdzv-conf", f"join_timeout={int(opts.timeout)}", *args]
        procs.append(subprocess.Popen(cmd, **common))
    else:
        cmd = [PY, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={case.ranks}", *args]
        if f.launcher == "netns":  # its own network namespace: loopback only, ours to stall
            cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *cmd]
        procs.append(subprocess.Popen(cmd, **common))
        if f.launcher == "two-jobs":  # a healthy job of another user's beside the hung one
            other = side / "healthy-neighbour"
            other.mkdir(mode=0o700)
            with open(other / "out.log", "ab") as o:
                procs.append(subprocess.Popen(
                    [PY, "-m", "torch.distributed.run", "--standalone",
                     f"--nproc_per_node={case.ranks}", str(JOB), "--fault", "healthy",
                     "--side", str(other), "--timeout", str(opts.timeout),
                     "--duration", str(timeout_of(f, opts) + 15)],
                    **{**common, "stdout": o, "cwd": other,
                       "env": dict(env, MLDEBUG_FR_DIR=str(other / "fr"))}))
    out.close()
    return Running(case, side, procs, time.monotonic(), log)


def _wait(cond: Callable[[], bool], timeout: float, run: Running) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        if not run.alive():
            return cond()
        time.sleep(0.1)
    return False


def wait_for_fault(run: Running, opts: Options) -> float | None:
    """Wait until the fault is in place; the monotonic time it was, or None (never was)."""
    c, f = run.case, run.case.fault
    n = c.ranks - (len(c.injectors) if f.launcher == "independent" else 0)
    if f.outcome == "ends" or f.name == "scheduler_sigterm":
        ok = _wait(lambda: len(run.files("ready")) >= c.ranks, 90, run)
        time.sleep(1.0)
        return time.monotonic() if ok else None
    if f.family == "launch" or f.launcher == "independent":
        ok = _wait(lambda: len(run.files("started")) >= n, 90, run)
        if ok and c.injectors and f.launcher != "independent":
            ok = _wait(lambda: set(c.injectors) <= set(run.files("injected")), 30, run)
        t = time.monotonic()
        time.sleep(opts.settle + 1.0)  # the ranks reach their wait in init
        return t if ok else None
    if f.launcher == "netns":
        ok = _wait(lambda: bool(run.files("injected")), 90, run)
        if ok:  # the network below the collective stalls: every rank idle in it
            subprocess.run(["nsenter", "-t", str(run.procs[0].pid), "-n", "ip", "link", "set",
                            "lo", "down"], check=True, capture_output=True)
        t = time.monotonic()
        time.sleep(opts.settle)
        return t if ok else None
    if f.launcher == "two-jobs":
        neighbour = Running(c, run.side / "healthy-neighbour", run.procs[1:], run.started,
                            run.side / "healthy-neighbour" / "out.log")
        if not _wait(lambda: len(neighbour.files("ready")) >= c.ranks, 90, neighbour):
            return None
    ok = _wait(lambda: set(c.injectors) <= set(run.files("injected")), 90, run)
    t = time.monotonic()
    time.sleep(opts.settle)
    return t if ok else None


CLI_ENV: dict[str, str] = {}  # the cluster's ssh settings, in cross-node runs


def cli(*args: str, timeout: float = 120,
        save: Path | None = None) -> tuple[dict[str, Any] | None, float, str]:
    """Run the real mldebug CLI; its JSON, wall seconds and an error text. ``save``: where
    its output is kept beside the case (read with --keep)."""
    t0 = time.monotonic()
    try:
        r = subprocess.run([PY, "-m", "mldebug", *args], capture_output=True, text=True,
                           env={**_env(), **CLI_ENV}, timeout=timeout,
                           stdin=subprocess.DEVNULL, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0, f"timed out after {timeout:.0f} s"
    dt = time.monotonic() - t0
    if save is not None:
        with contextlib.suppress(OSError):
            save.write_text(r.stdout + (f"\n# stderr:\n{r.stderr}" if r.stderr else ""))
    try:
        return json.loads(r.stdout), dt, ""
    except json.JSONDecodeError:
        return None, dt, f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"


NEIGHBOUR = 1000  # a suspect in the healthy job beside a hung one: a false suspect, never a culprit


def hang_target(run: Running) -> list[str]:
    if run.nodes:
        return ["--nodes", ",".join(run.nodes)]
    if run.case.fault.launcher == "two-jobs":  # both jobs, as a plain `mldebug hang` sees them
        return ["--pattern", re.escape(str(run.side))]
    if run.case.fault.launcher == "independent":
        return ["--pattern", re.escape(str(run.side))]
    return ["--pid", str(run.procs[0].pid)]


def read_hang(doc: dict[str, Any]) -> tuple[list[int], str, str]:
    jobs = doc.get("jobs") or []
    ranks = sorted({s["rank"] for j in jobs for s in j.get("suspects", [])
                    if s.get("rank") is not None})
    v = doc.get("verdict") or {}
    kind = v.get("kind")
    cls = "healthy" if kind == "progress" else HANG_CLASSES.get(v.get("class", ""),
                                                                v.get("class", "?"))
    if kind == "no-processes":
        cls = "none"
    return ranks, cls, v.get("summary", "")


def route_hang(run: Running, watch: float | None) -> tuple[list[int] | None, str | None, float,
                                                           str, str]:
    args = ["hang", *hang_target(run), "--json"]
    if watch:
        args += ["--watch", str(watch)]
    doc, dt, err = cli(*args, save=run.side / ("watch.json" if watch else "hang.json"))
    if doc is None:
        return None, None, dt, "", err
    ranks, cls, summary = read_hang(doc)
    if run.case.fault.launcher == "two-jobs":
        # the verdict of the hung job; any suspect of the healthy one is a false suspect
        healthy = {int(p) for p in Running(run.case, run.side / "healthy-neighbour", [], 0,
                                           run.log).files("started").values()}
        ranks = []
        for j in doc.get("jobs") or []:
            mine = not any(p.get("pid") in healthy for p in j.get("suspects", []))
            for sp in j.get("suspects", []):
                if sp.get("rank") is not None:
                    ranks.append(sp["rank"] + (0 if mine and sp.get("pid") not in healthy
                                               else NEIGHBOUR))
            if j.get("suspects") and mine:
                v = j.get("verdict") or {}
                cls = HANG_CLASSES.get(v.get("class", ""), v.get("class", "?"))
        ranks = sorted(set(ranks))
    return ranks, cls, dt, summary, ""


def route_log(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    doc, dt, err = cli("log", *map(str, run.logs or [run.log]), "--json",
                       save=run.side / "log.json")
    if doc is None:
        return None, None, dt, "", err
    v = doc.get("verdict") or {}  # the envelope's (docs/json.md); class: mldebug.log.classes
    cls = v.get("class") or v.get("code") or "?"
    return list(v.get("culprits") or []), cls, dt, v.get("summary", ""), ""


POOLED_RUN: dict[int, bool] = {}  # runs of pooled cases (their ranks record no ring)


def route_trace(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    """`mldebug trace show --pid`: the live ranks write their execution rings now; the ranks
    the envelope's verdict names the culprits (a minority divergence, none when every ring
    moved between two reads)."""
    doc, dt, err = cli("trace", "show", "--pid", str(run.procs[0].pid), "--json",
                       save=run.side / "trace.json")
    if doc is None:
        return None, None, dt, "", err
    v = doc.get("verdict") or {}  # the envelope's (mldebug/cli/envelope.py _trace)
    ranks = sorted(v.get("culprits") or [])
    divs = [d for d in doc.get("divergences") or [] if d.get("ranks")]
    summary = v.get("summary") or "no divergence"
    if ranks and divs:
        left = divs[0].get("left_at") or {}
        summary = f"ranks {ranks} left at {left.get('file', '?')}:{left.get('line', '?')}"
    return ranks, None, dt, summary, ""


def fr_dumps(run: Running) -> list[Path]:
    d = run.side / "fr"
    return sorted(p for p in d.glob("fr_rank*") if p.is_file()) if d.is_dir() else []


def route_fr(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    dumps = fr_dumps(run)
    if not dumps:
        return None, None, 0.0, "", "no dump written"
    doc, dt, err = cli("fr", "analyze", *map(str, dumps), "--json",
                       save=run.side / "fr.json")
    if doc is None:
        return None, None, dt, "", err
    v = doc.get("verdict") or {}  # the envelope's; class: mldebug.fr.classes
    ranks, cls = list(v.get("culprits") or []), v.get("class") or "?"
    title = next((f.get("title", "") for f in doc.get("findings", [])), "")
    return ranks, cls, dt, title, ""


def route_why(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    """`mldebug why` on everything the dead job left: its launcher output (or per-rank logs)
    and the flight-recorder dumps its ranks wrote - never mldebug's outputs of the other
    routes (they are in run.side, not passed)."""
    inputs = [*map(str, run.logs or [run.log]), *map(str, fr_dumps(run))]
    doc, dt, err = cli("why", *inputs, "--json", save=run.side / "why.json")
    if doc is None:
        return None, None, dt, "", err
    v = doc.get("verdict") or {}  # the envelope's (mldebug/cli/envelope.py _why)
    return list(v.get("culprits") or []), v.get("class") or "?", dt, v.get("summary", ""), ""


# --- the peers: what a user would use instead ----------------------------------------------

def peer_pyspy(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    """Every rank's `py-spy dump`, folded by identical main-thread stacks; the ranks outside
    the biggest group are the odd ones out (a tie names nobody)."""
    pids = {r: int(p) for r, p in run.files("started").items()}
    pyspy = str(Path(PY).with_name("py-spy"))
    if not Path(pyspy).exists():
        pyspy = "py-spy"
    t0 = time.monotonic()
    stacks: dict[int, str] = {}
    lock = threading.Lock()

    def one(rank: int, pid: int) -> None:
        try:
            r = subprocess.run([pyspy, "dump", "--pid", str(pid), "--json"],
                               capture_output=True, text=True, timeout=30)
            threads = json.loads(r.stdout) if r.returncode == 0 else []
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            threads = []
        main = next((t for t in threads if t.get("thread_name") == "MainThread"),
                    threads[0] if threads else None)
        key = "(no stack)" if main is None else "\n".join(
            f"{fr['name']} {fr['filename']}:{fr['line']}" for fr in main.get("frames", []))
        with lock:
            stacks[rank] = key

    ts = [threading.Thread(target=one, args=(r, p)) for r, p in pids.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    if not stacks:
        return None, None, dt, "", "no rank to dump"
    groups: dict[str, list[int]] = {}
    for r, k in stacks.items():
        groups.setdefault(k, []).append(r)
    sizes = sorted((len(v) for v in groups.values()), reverse=True)
    if len(groups) == 1 or (len(sizes) > 1 and sizes[0] == sizes[1]):
        return [], None, dt, f"{len(groups)} distinct stack(s), no odd one out", ""
    biggest = max(groups.values(), key=len)
    odd = sorted(r for r in stacks if r not in biggest)
    return odd, None, dt, f"{len(groups)} distinct stacks", ""


ROOT_RE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)"
                     r".*?exitcode\s*:\s*(-?\d+)", re.S)


def peer_rootcause(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    """torchrun's "Root Cause (first observed failure)": the rank it names, if any (across
    nodes, each node's torchrun names its own: the first node's that names one)."""
    t0 = time.monotonic()
    text = "".join(p.read_text(errors="replace") for p in (run.logs or [run.log]) if p.exists())
    m = ROOT_RE.search(text)
    dt = time.monotonic() - t0
    if not m:
        return [], "healthy", dt, "no Root Cause section", ""
    code = int(m.group(2))
    cls = "dead" if code < 0 else "exception"
    return [int(m.group(1))], cls, dt, f"rank {m.group(1)} exitcode {code}", ""


def peer_torchfr(run: Running) -> tuple[list[int] | None, str | None, float, str, str]:
    """torch's own flight-recorder analyser on the same dumps: the ranks it reports."""
    dumps = fr_dumps(run)
    if not dumps:
        return None, None, 0.0, "", "no dump written"
    tfr = Path(PY).with_name("torchfrtrace")
    t0 = time.monotonic()
    try:
        r = subprocess.run([str(tfr), str(run.side / "fr"), "-p", "fr_rank"],
                           capture_output=True, text=True, timeout=120, env=_env())
    except subprocess.TimeoutExpired:
        return None, None, time.monotonic() - t0, "", "timed out"
    dt = time.monotonic() - t0
    out = r.stdout + r.stderr
    ranks: set[int] = set()
    for m in re.finditer(r"(?:[Mm]issing|culprit|not present)[^\n{]*\{([\d, ]+)\}", out):
        ranks |= {int(x) for x in m.group(1).replace(" ", "").split(",") if x}
    if r.returncode != 0 and not ranks:
        return None, None, dt, "", out.strip().splitlines()[-1][:200] if out.strip() else ""
    # its report names ranks, not a class of fault: scored on its culprits alone
    return sorted(ranks), None, dt, out.strip().splitlines()[0][:200] if out.strip() else "", ""


LIVE_PEER = ("pyspy", peer_pyspy)
PEERS = {"hang": "pyspy", "log": "rootcause", "fr": "torchfr"}


def kill_tree(procs: list[subprocess.Popen[bytes]]) -> None:
    import psutil

    victims: list[psutil.Process] = []
    for p in procs:
        try:
            victims += [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for v in victims:
        try:
            v.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=30)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


Record = Callable[..., None]


def recorder(case: Case, out: list[Outcome]) -> Record:
    f = case.fault

    def record(route: str, res: tuple[list[int] | None, str | None, float, str, str],
               peer: bool = False) -> None:
        culprits, cls, dt, summary, err = res
        out.append(Outcome(f.name, route, case.truth, list(f.classes), culprits, cls,
                           round(dt, 2), summary[:300], err[:300], case.ranks, case.seed, peer))
    return record


def live_routes(run: Running, t_fault: float | None, opts: Options, record: Record) -> None:
    """The routes that read the job while it hangs: they must finish before its timeout."""
    f = run.case.fault
    if f.outcome == "dies" and f.name != "scheduler_sigterm":
        return
    wanted = [r for r in ("hang", "watch", "trace") if r in opts.routes
              and (r in f.routes or r == "trace" and "hang" in f.routes)]
    if t_fault is None:
        for r in wanted:
            record(r, (None, None, 0.0, "", "the fault never took effect"))
        return
    if "hang" in wanted:
        record("hang", route_hang(run, None))
    if "watch" in wanted:
        record("watch", route_hang(run, opts.watch))
    if "trace" in wanted and not run.nodes and f.launcher == "torchrun" and \
            not POOLED_RUN.get(id(run)):
        record("trace", route_trace(run))
    if opts.peers and ("hang" in wanted or "watch" in wanted):
        record("pyspy", peer_pyspy(run), peer=True)
    if time.monotonic() - t_fault > timeout_of(f, opts) and f.outcome == "hang":
        run.notes.append("live routes ran past the collective timeout")


def dead_routes(run: Running, opts: Options, record: Record, fr: bool = True) -> None:
    """The routes that read what the job left once it ended."""
    f = run.case.fault
    if "log" in f.routes and "log" in opts.routes:
        record("log", route_log(run))
        if opts.peers:
            record("rootcause", peer_rootcause(run), peer=True)
    if fr and "fr" in f.routes and "fr" in opts.routes:
        record("fr", route_fr(run))
        if opts.peers:
            record("torchfr", peer_torchfr(run), peer=True)
    if "log" in f.routes and "why" in opts.routes:  # every dead-job case: its log, its dumps
        record("why", route_why(run))


def _finish(run: Running, out: list[Outcome], opts: Options) -> None:
    for o in out:
        if run.notes:
            o.error = "; ".join([o.error, *run.notes]).strip("; ")
    if not opts.keep:
        import shutil

        shutil.rmtree(run.side, ignore_errors=True)


def run_case(case: Case, base: Path, opts: Options) -> list[Outcome]:
    """One case in a job of its own: every route, the job's whole output and its dumps."""
    f = case.fault
    out: list[Outcome] = []
    record = recorder(case, out)
    run = start(case, base, opts)
    try:
        t_fault = wait_for_fault(run, opts) if f.outcome != "dies" or \
            f.name == "scheduler_sigterm" else None
        live_routes(run, t_fault, opts, record)
        if f.name == "scheduler_sigterm":
            run.procs[0].send_signal(signal.SIGTERM)  # what a scheduler's time limit sends
        limit = (opts.duration + 60 if f.outcome == "ends" else timeout_of(f, opts) + 45)
        _wait(lambda: not run.alive(), limit, run)
    finally:
        kill_tree(run.procs)
    dead_routes(run, opts, record)
    _finish(run, out, opts)
    return out


def poolable(f: Fault) -> bool:
    """Cases whose ranks can run one after another in one job: the fault ends by the
    collective timeout and leaves every rank alive (no launch, no process fault, no DDP/FSDP
    wrapper state)."""
    return (f.family in ("desync", "outside", "no-culprit") and f.launcher == "torchrun"
            and f.mode in ("manual", "subgroup", "pipeline") and f.name != "scheduler_sigterm"
            and f.outcome in ("hang", "ends") and f.survivable)


def run_pool(pool: list[Case], base: Path, opts: Options, tag: str,
             done: Callable[[Case, list[Outcome]], None]) -> list[Outcome]:
    """Several cases in one torchrun job, one after another (job.py --pool): the ranks start
    once. Each case is read live as in its own job; its log route reads the part of the
    job's output written while it ran. No flight-recorder route: a pooled rank's buffer
    holds the earlier cases' collectives too. A case that leaves its ranks stuck (they never
    end it, or never start the next) costs that pool: it is stopped, said in the case's
    outcomes, and a fresh pool takes the cases after it."""
    ranks = pool[0].ranks
    for c in pool:
        (base / c.name).mkdir(mode=0o700)
    results: list[Outcome] = []
    todo = list(pool)
    restarts = 0
    while todo:
        pdir = base / f"pool-{tag}-{restarts}"
        pdir.mkdir(mode=0o700)
        specs = [{"fault": job_fault(c.fault), "culprits": ",".join(map(str, c.injectors)),
                  "mode": c.fault.mode, "side": str(base / c.name),
                  "duration": opts.pool_duration if c.fault.outcome == "ends" else 0}
                 for c in todo]
        (pdir / "cases.json").write_text(json.dumps(specs))
        log = pdir / "out.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [PY, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={ranks}", str(JOB), "--pool", str(pdir / "cases.json"),
                 "--timeout", str(opts.timeout), "--side", str(pdir)],
                stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True,
                stdin=subprocess.DEVNULL, cwd=pdir)
        offset = 0
        first = True
        try:
            while todo:
                c = todo[0]
                # the ranks start a case once its part of the output before is read
                (base / c.name / "go").touch()
                got: list[Outcome] = []
                record = recorder(c, got)
                run = Running(c, base / c.name, [proc], time.monotonic(), log)
                POOLED_RUN[id(run)] = True
                began = _wait(lambda run=run: len(run.files("started")) >= ranks,  # type: ignore[misc]
                              90 if first else 30, run)
                first = False
                if not began:  # the case before left the ranks stuck: a fresh pool runs it
                    if restarts >= 3 or proc.poll() is not None and len(todo) == len(pool):
                        for r in ("hang", "watch", "log"):
                            if r in c.fault.routes and r in opts.routes:
                                record(r, (None, None, 0.0, "", "the pooled job never began it"))
                        done(c, got)
                        results += got
                        todo.pop(0)
                    break
                todo.pop(0)
                t_fault = wait_for_fault(run, opts)
                live_routes(run, t_fault, opts, record)
                (run.side / "looked").touch()  # a healthy case may end now
                ended = _wait(lambda run=run: len(run.files("done")) >= ranks,  # type: ignore[misc]
                              opts.pool_duration + 40 if c.fault.outcome == "ends" else
                              opts.timeout + opts.hold_margin + 30, run)
                end = log.stat().st_size
                with open(log, "rb") as f:
                    f.seek(offset)
                    (run.side / "out.log").write_bytes(f.read(end - offset))
                offset = end
                if todo:  # the next case may start now (its lines go in its own part)
                    (base / todo[0].name / "go").touch()
                run.log = run.side / "out.log"
                if not ended:
                    run.notes.append("its ranks did not end the pooled case (a fresh pool "
                                     "took the cases after it)")
                dead_routes(run, opts, record, fr=False)
                _finish(run, got, opts)
                done(c, got)
                results += got
                if not ended:
                    break
        finally:
            kill_tree([proc])
        restarts += 1
    return results


def cases(names: list[str] | None, ranks: list[int], seeds: int, first_seed: int = 0) -> list[Case]:
    faults = [BY_NAME[n] for n in names] if names else list(FAULTS)
    found = []
    for f in faults:
        for n in ranks:
            if n < f.min_ranks:
                continue
            for s in range(first_seed, first_seed + seeds):
                found.append(draw(f, n, s))
    return found


def run_all(todo: list[Case], opts: Options, jobs: int = 1,
            progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Every case; with ``opts.pool`` the poolable ones at each world size share ``jobs``
    pooled jobs, the rest run in jobs of their own, ``jobs`` at a time."""
    base = Path(tempfile.mkdtemp(prefix="mldebug-faults-"))
    os.chmod(base, 0o700)
    results: list[Outcome] = []
    lock = threading.Lock()
    count = [0]

    def done(c: Case, got: list[Outcome]) -> None:
        with lock:
            count[0] += 1
            if progress:
                said = ", ".join(f"{o.route}={_brief(o)}" for o in got)
                progress(f"[{count[0]}/{len(todo)}] {c.name} culprit {c.truth or 'none'}: {said}")

    def single(c: Case) -> list[Outcome]:
        got = run_case(c, base, opts)
        done(c, got)
        return got

    tasks: list[Callable[[], list[Outcome]]] = []
    singles = todo
    if opts.pool:
        pooled = [c for c in todo if poolable(c.fault)]
        singles = [c for c in todo if not poolable(c.fault)]
        by_size: dict[int, list[Case]] = {}
        for c in pooled:
            by_size.setdefault(c.ranks, []).append(c)
        for n, group in by_size.items():
            k = max(1, min(jobs, len(group)))
            for i in range(k):
                part = group[i::k]
                tasks.append(lambda part=part, tag=f"r{n}-{i}": run_pool(part, base, opts, tag,
                                                                         done))
    tasks += [lambda c=c: single(c) for c in singles]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        for got in ex.map(lambda t: t(), tasks):
            results += got
    if not opts.keep:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return results


def _brief(o: Outcome) -> str:
    if o.culprits is None:
        return "no answer"
    mark = "" if o.exact and o.class_ok else "!"
    return f"{mark}{sorted(o.culprits) or '-'}/{o.cls}"


def docs_table() -> str:
    """The catalogue as docs/faults.md shows it (a test keeps the page in step)."""
    lines = ["| class | family | what the job does | a right verdict | verdict class | routes |",
             "|---|---|---|---|---|---|"]
    for f in FAULTS:
        mode = f" ({f.mode})" if f.mode != "manual" else ""
        lines.append(f"| `{f.name}`{mode} | {f.family} | {f.what} | {f.right} | "
                     f"{' or '.join(f.classes)} | {', '.join(f.routes)} |")
    return "\n".join(lines)


# --- across nodes: the local sshd cluster (tests/cluster.py) ---------------------------------

def start_on_cluster(case: Case, base: Path, opts: Options, cluster: Any) -> Running:
    """The case as one torchrun per node (--nnodes 2, ranks split evenly), each node an sshd
    in its own pid and UTS namespace: its ranks are visible only on that node."""
    f = case.fault
    side = base / case.name
    side.mkdir(mode=0o700)
    nodes = list(cluster.nodes)[:2]
    master = cluster.nodes[nodes[0]].address
    port = _free_port()
    args = [str(JOB), "--fault", job_fault(f), "--culprits", ",".join(map(str, case.injectors)),
            "--side", str(side), "--mode", f.mode, "--timeout", str(opts.timeout)]
    if f.outcome == "ends":
        args += ["--duration", str(opts.duration)]
    logs = []
    for i, node in enumerate(nodes):
        log = side / f"out-{node}.log"
        logs.append(log)
        cluster.spawn(node, (
            f"env PYTHONPATH={REPO} GLOO_SOCKET_IFNAME=lo {PY} -m torch.distributed.run "
            f"--nnodes 2 --nproc_per_node {case.ranks // 2} --node_rank {i} "
            f"--master_addr {master} --master_port {port} {' '.join(args)}"), str(log))
    return Running(case, side, [], time.monotonic(), logs[0], nodes=nodes, logs=logs)


def run_on_cluster(case: Case, base: Path, opts: Options, cluster: Any) -> list[Outcome]:
    f = case.fault
    out: list[Outcome] = []
    record = recorder(case, out)
    run = start_on_cluster(case, base, opts, cluster)
    try:
        t_fault = wait_for_fault(run, opts) if f.outcome != "dies" else None
        live_routes(run, t_fault, opts, record)
        # every rank ends by its timeout (or the job by its duration); then stop what is left
        end = time.monotonic() + (opts.duration + 20 if f.outcome == "ends" else
                                  opts.timeout + 25)
        while time.monotonic() < end:
            if all("training done" in p.read_text(errors="replace") or "Root Cause" in
                   p.read_text(errors="replace") for p in run.logs if p.exists()):
                break
            time.sleep(0.5)
    finally:
        for node in run.nodes:
            cluster.ssh(node, f"pkill -9 -f {run.side} || true", check=False)
    dead_routes(run, opts, record)
    _finish(run, out, opts)
    return out


def run_cluster(todo: list[Case], opts: Options,
                progress: Callable[[str], None] | None = None) -> list[Outcome]:
    """Every case across two nodes of a local sshd cluster, one at a time (the live routes
    read the nodes with --nodes, which sees every rank there)."""
    sys.path.insert(0, str(REPO / "tests"))
    from cluster import LocalCluster

    base = Path(tempfile.mkdtemp(prefix="mldebug-faults-"))
    os.chmod(base, 0o700)
    cluster = LocalCluster(base / "cluster", ["node1", "node2"])
    cluster.start()
    CLI_ENV.update({k: v for k, v in cluster.env().items() if k.startswith("PDSH")})
    results: list[Outcome] = []
    try:
        for i, c in enumerate(todo):
            got = run_on_cluster(c, base, opts, cluster)
            results += got
            if progress:
                said = ", ".join(f"{o.route}={_brief(o)}" for o in got)
                progress(f"[{i + 1}/{len(todo)}] {c.name} (2 nodes) culprit "
                         f"{c.truth or 'none'}: {said}")
    finally:
        cluster.stop()
        CLI_ENV.clear()
        if not opts.keep:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    return results
