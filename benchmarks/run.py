"""Regression guard: every benchmark figure on this tree and on another revision, interleaved.

    python benchmarks/run.py --against REV            # quick: a few minutes
    python benchmarks/run.py --against REV --full     # the issue-sized sets (tens of minutes)
    python benchmarks/run.py --against REV --only help,hang-live --rounds 5

REV is checked out into a temporary git worktree. Each figure is one command line of the
``mldebug`` CLI (or a tiny harness), run as a fresh process with ``PYTHONPATH`` set to one tree
or the other; the inputs (saved hang dumps, flight-recorder sets, logs) are generated once by
this tree's generators and read by both. Rounds alternate which tree goes first. For each
figure the median over rounds is printed for both trees with the ratio this/REV; a ratio above
1.15 (15% worse) is flagged ``WORSE``. "this" is the working tree as it is, uncommitted changes
included. Figures that need what this machine may lack (sshd + pdsh for the fan-out, torchrun
for the live hang) are skipped with the reason.

With ``--clean-install`` the start-up figures (``help`` and ``hang-live``) are also measured
as a user runs them: each tree is built into a wheel and installed (not editable, with its
required dependencies only, no extras) into a throwaway venv of the same base interpreter,
cached under ``--data`` by the hash of the tree's sources. The dev venv pays ``site`` start-up
that such an install does not: the editable-install finder and lovely-tensors' ``.pth`` hook
(the ``[torch]`` extra). Those rows are named ``*-clean``; their anchors (``python -c pass``,
the recipe) run beside them.

Anchors are commands that are the same on both trees, timed beside the figures they anchor and
printed as ``FIGURE / ANCHOR`` per tree: ``python -c pass`` for ``--help``, the serial py-spy
recipe for the live hang, and for ``fr analyze`` of the distinct set its floor (``fr-floor``:
the same number of forked processes only reading and unpickling the set's files with the C
unpickler, as ``benchmarks/bench_fr.py --floor`` does). A ratio to an anchor holds across this
VM's slow and fast minutes, where seconds do not.

A figure over 1.15 is measured again before it is flagged: ``--confirm N`` more interleaved
rounds of that figure alone (default 9; 0: flag on the first measurement). It is flagged
``WORSE`` only when the median over the new rounds is over 1.15 too; otherwise its line says
``not confirmed`` with the second ratio. On this shared VM a figure of a command nobody
changed reads 1.17-1.19x in one run of 5 rounds and 1.01-1.08x in the next: the first
measurement alone flags noise, and a closing note has to explain it.

Not a test: it prints figures and asserts nothing. Exit code 0, or 3 when a figure is flagged.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

WORSE = 1.15


@dataclass
class Run:
    wall: float
    cpu: float
    rss_mib: float
    ok: bool
    out: str


@dataclass
class Figure:
    """One command measured on both trees; ``metric`` is the number compared."""

    name: str
    argv: list[str]
    metric: str  # "wall" | "cpu" | "rss"
    what: str  # the command, as docs/benchmarks.md shows it
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[str], bool] | None = None  # the output must say this to count
    # the figures this one anchors: the same command on both trees (a floor to divide by),
    # never flagged; printed as FIGURE / this per tree
    anchors: tuple[str, ...] = ()
    clean: bool = False  # run by each tree's clean (non-editable) install: argv[0] replaced


def measure(argv: list[str], tree: Path, extra_env: dict[str, str], cwd: Path,
            clean_py: Path | None = None) -> Run:
    env = {**os.environ, **extra_env, "PYTHONPATH": str(tree), "NO_COLOR": "1"}
    if clean_py is not None:  # the installed package, as a user has it: nothing on PYTHONPATH
        del env["PYTHONPATH"]
        env["PATH"] = str(clean_py.parent) + os.pathsep + env.get("PATH", "")
        argv = [str(clean_py), *argv[1:]]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read(200_000)
    return Run(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, proc.returncode in (0, 1),
               text)


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mldebug-bench-rev-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(d), rev],
                   check=True)
    try:
        yield d
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(d)],
                       check=False)
        shutil.rmtree(d, ignore_errors=True)


def _source_hash(tree: Path) -> str:
    """What a wheel of ``tree`` is built from: pyproject, README and every file of mldebug/."""
    h = hashlib.sha256()
    files = [tree / "pyproject.toml", tree / "README.md"]
    files += sorted(f for f in (tree / "mldebug").rglob("*")
                    if f.is_file() and "__pycache__" not in f.parts)
    for f in files:
        h.update(str(f.relative_to(tree)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def clean_install(tree: Path, data: Path) -> Path:
    """A venv with ``tree`` installed as a user installs it (a wheel, not editable; required
    dependencies only, from this machine's pip configuration), made from the base interpreter
    of this Python without pip or setuptools (no ``.pth`` file at all); cached in ``data`` by
    the sources' hash. Returns its python."""
    venv = data / "clean-venvs" / _source_hash(tree)
    py = venv / "bin" / "python"
    if (venv / "ok").exists():
        return py
    shutil.rmtree(venv, ignore_errors=True)
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"  # a copy: a wheel build writes build/ and *.egg-info beside it
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(tree / name, src / name)
        shutil.copytree(tree / "mldebug", src / "mldebug",
                        ignore=shutil.ignore_patterns("__pycache__"))
        pip = [sys.executable, "-m", "pip"]
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        f"{tmp}/wheel", str(src)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
        wheel = next(Path(tmp, "wheel").glob("mldebug-*.whl"))
        subprocess.run([*pip, "--python", str(py), "install", "-q", str(wheel)], check=True,
                       stdout=subprocess.DEVNULL)
    (venv / "ok").write_text("")
    return py


def figures(data: Path, full: bool, only: set[str] | None, stack: ExitStack,
            clean: bool = False) -> list[Figure]:
    py = sys.executable
    figs: list[Figure] = []

    def want(name: str) -> bool:
        return only is None or name in only

    if want("help"):
        figs.append(Figure("help", [py, "-m", "mldebug", "--help"], "wall",
                           "python -m mldebug --help"))
        figs.append(Figure("python-c-pass", [py, "-c", "pass"], "wall",
                           "python -c pass (the anchor of --help; same on both trees)",
                           anchors=("help",)))
        if clean:
            figs.append(Figure("help-clean", [py, "-m", "mldebug", "--help"], "wall",
                               "python -m mldebug --help (clean install)", clean=True))
            figs.append(Figure("python-c-pass-clean", [py, "-c", "pass"], "wall",
                               "python -c pass (clean venv: the anchor of help-clean)",
                               anchors=("help-clean",), clean=True))
    if want("hang-analyze"):
        from bench_hang import write_saved

        n = 16_384 if full else 2_048
        saved = data / f"hang-saved-{n}"
        if not saved.exists():
            write_saved(saved, n)
        figs.append(Figure("hang-analyze", [py, "-m", "mldebug", "hang", "analyze", str(saved),
                                            "--json"], "cpu",
                           f"mldebug hang analyze DIR --json ({n} saved ranks)"))
    if want("fr-distinct"):
        from bench_fr import FLOOR, make_distinct

        ranks = 1024 if full else 256
        fr = make_distinct(data, ranks, 2000)
        for metric in ("wall", "rss"):
            figs.append(Figure(f"fr-distinct-{metric}",
                               [py, "-m", "mldebug", "fr", "analyze", str(fr), "--json"], metric,
                               f"mldebug fr analyze DIR --json ({ranks}x2000 distinct)",
                               check=lambda out: '"culprit_ranks"' in out))
        figs.append(Figure("fr-floor", [py, "-c", FLOOR, str(fr)], "wall",
                           "the same worker processes only unpickling the set's files (the "
                           "anchor of fr-distinct-wall; same on both trees)",
                           anchors=("fr-distinct-wall",),
                           check=lambda out: out.startswith("floor_entries")))
    if want("log"):
        from bench_log import write_log

        lines = 2_500 if full else 500
        log = data / f"log-1024x{lines}.txt"
        if not log.exists():
            write_log(log, 1024, lines, culprit=341)
        figs.append(Figure("log", [py, "-m", "mldebug", "log", str(log), "--json"], "cpu",
                           f"mldebug log FILE --json (1024 ranks x {lines} lines)"))
    if want("nccl-log"):
        from nccl_synth import write_job

        world = 8192 if full else 1024
        nd = data / f"nccl-{world}"
        if not nd.exists():
            write_job(nd, world)
        figs.append(Figure("nccl-log", [py, "-m", "mldebug", "nccl-log", *sorted(
            str(p) for p in nd.iterdir()), "--json"], "cpu",
            f"mldebug nccl-log FILES --json ({world} ranks)"))
    if want("hang-live"):
        figs += _hang_live(stack, py, clean)
    if want("fanout"):
        figs += _fanout(stack, py, 512 if full else 64)
    return figs


def _hang_live(stack: ExitStack, py: str, clean: bool = False) -> list[Figure]:
    if shutil.which("torchrun", path=str(Path(py).parent)) is None:
        print("skipped hang-live: no torchrun beside this Python")
        return []
    from jobs import torchrun

    # hung for the whole run: the recipe's collective times out after --timeout (600 s by
    # default), less than a loaded machine's run of every figure
    job = torchrun("collective_mismatch.py", 8, Path("/tmp/mldebug-bench-run-hang.log"),
                   "--timeout", "7200")
    stack.callback(job.stop)
    job.wait_ready(timeout=300, settle=3)
    path = {"PATH": str(Path(py).parent) + os.pathsep + os.environ["PATH"]}  # py-spy
    figs = [
        Figure("hang-live", [py, "-m", "mldebug", "hang", "--pid", str(job.pid)], "wall",
               "mldebug hang --pid LAUNCHER (8 hung ranks, Python stacks)", env=path,
               check=lambda out: "8 rank processes" in out),
        Figure("hang-recipe", ["bash", "-c", f"pgrep -P {job.pid} | xargs -I {{}} py-spy dump "
                               "--pid {}"], "wall",
               "pgrep -P LAUNCHER | xargs -I {} py-spy dump --pid {} (the anchor)", env=path,
               anchors=("hang-live", "hang-live-clean"),
               check=lambda out: out.count("Process ") >= 8),
    ]
    if clean:  # py-spy from that venv's bin (PATH), mldebug from its site-packages
        figs.append(Figure("hang-live-clean", [py, "-m", "mldebug", "hang", "--pid",
                                               str(job.pid)], "wall",
                           "mldebug hang --pid LAUNCHER (clean install)",
                           check=lambda out: "8 rank processes" in out, clean=True))
    return figs


def _fanout(stack: ExitStack, py: str, nodes: int) -> list[Figure]:
    from bench_fanout import ssh_nodes

    try:
        env_of = stack.enter_context(ssh_nodes())
    except RuntimeError as e:
        print(f"skipped fanout: {e}")
        return []
    hosts = f"bench[0-{nodes - 1}]"
    out: list[Figure] = []
    for tag, lost_key in (("hang", "dead_hosts"), ("env", "unreachable")):
        out.append(Figure(f"fanout-{tag}", [py, "-m", "mldebug", tag, "--nodes", hosts,
                                            "--json", "--connect-timeout", "60",
                                            "--timeout", "120"], "cpu",
                          f"mldebug {tag} --nodes {hosts} --json (caller CPU, ssh to one "
                          "local sshd)", env=env_of(tag),
                          check=functools.partial(_none_lost, lost_key)))
    return out


def _none_lost(key: str, out: str) -> bool:
    """Every node answered (a lost node costs less CPU: its run would not compare)."""
    import json

    try:
        return not json.loads(out).get(key)
    except ValueError:
        return False


def _interleaved(figs: list[Figure], rounds: int, trees: dict[str, Path], scratch: Path,
                 pys: dict[str, Path]) -> dict[tuple[str, str], list[Run]]:
    """Each figure on both trees, ``rounds`` times; the tree that goes first alternates."""
    runs: dict[tuple[str, str], list[Run]] = {(f.name, t): [] for f in figs for t in trees}
    for r in range(rounds):
        for f in figs:
            for t in (("this", "rev") if r % 2 == 0 else ("rev", "this")):
                runs[f.name, t].append(measure(f.argv, trees[t], f.env, scratch,
                                               pys[t] if f.clean else None))
    return runs


def _medians(f: Figure, runs: dict[tuple[str, str], list[Run]], trees: dict[str, Path],
             notes: list[str]) -> tuple[dict[str, float], list[str]]:
    """Per tree, the median of ``f``'s metric over its runs; and the trees where a run failed
    (noted in ``notes`` with the first failure's output)."""
    vals: dict[str, float] = {}
    failed: list[str] = []
    for t in trees:
        rs = runs[f.name, t]
        bad_runs = [x for x in rs if not (x.ok and (f.check is None or f.check(x.out)))]
        if bad_runs:
            failed.append(t)
            head = bad_runs[0].out[:300].replace("\n", "\n    ")
            notes.append(f"{f.name} on {t}: {len(bad_runs)} of {len(rs)} runs failed "
                         f"(ok={bad_runs[0].ok}); the first one's output:\n    {head}")
        vals[t] = statistics.median(
            {"wall": x.wall, "cpu": x.cpu, "rss": x.rss_mib}[f.metric] for x in rs)
    return vals, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, metavar="REV", help="git revision to compare")
    ap.add_argument("--full", action="store_true", help="the issue-sized sets (slow)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="comma-separated figure groups: help, hang-analyze, "
                                   "fr-distinct, log, nccl-log, hang-live, fanout")
    ap.add_argument("--clean-install", action="store_true",
                    help="also measure help and hang-live from a non-editable install of each "
                         "tree in a throwaway venv (cached in --data)")
    ap.add_argument("--confirm", type=int, default=9, metavar="N",
                    help="rounds that re-measure a figure over 1.15 before it is flagged "
                         "(0: flag on the first measurement)")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "mldebug-bench-data",
                    help="where generated inputs are kept between runs")
    a = ap.parse_args()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.against],
                         capture_output=True, text=True, check=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "mldebug"],
                           capture_output=True, text=True, check=True).stdout.strip()
    this = here + ("+changes" if dirty else "")
    a.data.mkdir(parents=True, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    flagged = 0
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        old = stack.enter_context(worktree(a.against))
        figs = figures(a.data, a.full, only, stack, a.clean_install)
        trees = {"this": REPO, "rev": old}
        pys = {t: clean_install(tree, a.data) for t, tree in trees.items()} \
            if a.clean_install else {}
        for tree in trees.values():  # as an install has them (PYTHONDONTWRITEBYTECODE may be set)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "mldebug")],
                           check=False, stdout=subprocess.DEVNULL)
        load = os.getloadavg()[0]
        runs = _interleaved(figs, a.rounds, trees, Path(scratch), pys)
        load = max(load, os.getloadavg()[0])
        print(f"this = {this}, rev = {rev} ({a.against}); median of {a.rounds} interleaved "
              f"rounds; {os.cpu_count()} CPUs, load average up to {load:.1f}")
        print(f"{'figure':<20} {'metric':<7} {'this':>9} {'rev':>9} {'this/rev':>9}  command")
        notes: list[str] = []
        for f in figs:
            vals, failed = _medians(f, runs, trees, notes)
            ratio = vals["this"] / vals["rev"] if vals["rev"] else float("nan")
            bad = f" (FAILED on {' and '.join(failed)}: not a measurement)" if failed else ""
            flag = ""
            worse = ratio > WORSE and not f.anchors and not failed
            if worse:
                flag = "  WORSE"
                if a.confirm > 0:  # measured again, alone, before it is flagged
                    again = _interleaved([f], a.confirm, trees, Path(scratch), pys)
                    vals2, failed2 = _medians(f, again, trees, notes)
                    ratio2 = vals2["this"] / vals2["rev"] if vals2["rev"] else float("nan")
                    worse = bool(failed2) or ratio2 > WORSE
                    if worse:
                        flag = f"  WORSE (again over {a.confirm} rounds: {ratio2:.2f}x)"
                    else:
                        flag = (f"  over 1.15 but not confirmed: {ratio2:.2f}x over "
                                f"{a.confirm} more rounds ({vals2['this']:.3f} / "
                                f"{vals2['rev']:.3f})")
            flagged += worse
            unit = "MiB" if f.metric == "rss" else "s"
            print(f"{f.name:<20} {f.metric + ' ' + unit:<7} {vals['this']:>9.3f} "
                  f"{vals['rev']:>9.3f} {ratio:>8.2f}x  {f.what}{bad}{flag}", flush=True)
        for note in notes:
            print(note)
        for anc in figs:
            for fig in anc.anchors:
                if (fig, "this") not in runs:  # not measured this run (--only, no clean)
                    continue
                # the anchor is the same command for both trees: its runs are pooled
                den = statistics.median(x.wall for t in trees for x in runs[anc.name, t])
                for t in trees:
                    num = statistics.median(x.wall for x in runs[fig, t])
                    print(f"{fig} / {anc.name} on {t}: {num / den:.2f}x")
    if flagged:
        print(f"{flagged} figure(s) more than {round((WORSE - 1) * 100)}% worse than {rev}")
    return 3 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
