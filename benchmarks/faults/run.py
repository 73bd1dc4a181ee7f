"""The fault matrix: inject faults into real gloo torchrun jobs, run every route that can
see each, and print the scoreboard (precision, recall, class accuracy, false suspects on the
no-culprit cases, seconds to verdict), each route beside the tool a user would use instead.

    python benchmarks/faults/run.py --quick            # one case per class, 4 ranks (~5 min)
    python benchmarks/faults/run.py                    # every class at 2, 4 and 8 ranks
    python benchmarks/faults/run.py --classes flock,sigstop --seeds 3 --json out.json
    python benchmarks/faults/run.py --stragglers --ranks 2,4  # slow ranks (stragglers.py)
    python benchmarks/faults/run.py --routes numerics   # NanSentinel's rows (numerics.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalogue import BY_NAME, FAULTS  # noqa: E402
from runner import Options, cases, run_all  # noqa: E402
from score import markdown, score, text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one case per class at 4 ranks")
    p.add_argument("--classes", help="comma-separated fault names (default: all); --list")
    p.add_argument("--list", action="store_true", help="list the fault classes and exit")
    p.add_argument("--docs", action="store_true", help="print docs/faults.md's table and exit")
    p.add_argument("--ranks", default="2,4,8", help="world sizes (default 2,4,8)")
    p.add_argument("--seeds", type=int, default=1, help="cases per class and world size")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=3, help="cases run at once (default 3)")
    p.add_argument("--timeout", type=float, default=12.0, help="the jobs' collective timeout")
    p.add_argument("--no-peers", action="store_true", help="skip the peer tools")
    p.add_argument("--routes", default="hang,watch,log,fr,trace,why",
                   help="routes to run (default hang,watch,log,fr,trace,why; why: `mldebug why`"
                        " on the dead job's log and dumps; numerics alone: NanSentinel's rows)")
    p.add_argument("--json", metavar="FILE", help="write every outcome and the scores here")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--keep", action="store_true", help="keep each case's directory")
    p.add_argument("--cluster", action="store_true",
                   help="run each case across 2 nodes of a local sshd cluster (root, pdsh, "
                        "sshd; one case at a time)")
    p.add_argument("--pool", action="store_true",
                   help="run the poolable cases one after another in shared jobs (ranks start "
                        "once; their log route reads each case's part of the output; no fr)")
    p.add_argument("--stragglers", action="store_true",
                   help="run the straggler rows instead (benchmarks/faults/stragglers.py): "
                        "a rank slower in data, compute or communication, and even jobs")
    a = p.parse_args(argv)
    if a.stragglers:
        import stragglers

        ranks_s = [int(x) for x in (a.ranks if a.ranks != "2,4,8" else "2,4").split(",")]
        return stragglers.main(ranks_s, a.seeds, a.first_seed, min(a.jobs, 2), a.json,
                               lambda s: print(s, file=sys.stderr), a.keep)
    if a.routes == "numerics":  # its own catalogue of rows: benchmarks/faults/numerics.py
        from numerics import main as numerics_main

        return numerics_main(["--seeds", str(a.seeds), "--first-seed", str(a.first_seed)]
                             + (["--markdown"] if a.markdown else [])
                             + (["--json", a.json] if a.json else []))
    if a.docs:
        from runner import docs_table

        print(docs_table())
        return 0
    if a.list:
        for f in FAULTS:
            print(f"{f.name:24} {f.family:10} {'/'.join(f.routes):18} {f.what}")
        return 0
    names = [n.strip() for n in a.classes.split(",")] if a.classes else None
    bad = [n for n in names or [] if n not in BY_NAME]
    if bad:
        print(f"run.py: no such fault class: {', '.join(bad)} (see --list)", file=sys.stderr)
        return 2
    ranks = [4] if a.quick else [int(x) for x in a.ranks.split(",")]
    todo = cases(names, ranks, 1 if a.quick else a.seeds, a.first_seed)
    opts = Options(timeout=a.timeout, peers=not a.no_peers, keep=a.keep,
                   routes=tuple(a.routes.split(",")), pool=a.pool)
    t0 = time.monotonic()
    print(f"fault matrix: {len(todo)} case(s), {a.jobs} at a time, collective timeout "
          f"{a.timeout:.0f} s", file=sys.stderr)
    if a.cluster:
        from runner import run_cluster

        todo = [c for c in todo if c.fault.launcher == "torchrun" and c.ranks % 2 == 0
                and c.ranks >= 2 * max(1, c.fault.min_ranks // 2)]
        outcomes = run_cluster(todo, opts, progress=lambda s: print(s, file=sys.stderr))
    else:
        outcomes = run_all(todo, opts, jobs=a.jobs,
                           progress=lambda s: print(s, file=sys.stderr))
    wall = time.monotonic() - t0
    scores = score(outcomes)
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    when = datetime.date.today().isoformat()
    print(f"\nfault matrix, {when}, commit {commit}: {len(todo)} cases "
          f"({len({c.fault.name for c in todo})} classes, ranks {','.join(map(str, ranks))}) "
          f"in {wall:.0f} s")
    print(markdown(scores) if a.markdown else text(scores))
    print("\nwrong or unanswered, per route:")
    for s in scores.values():
        for w in s.wrong:
            print(f"  {s.route}: {w}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": when, "commit": commit, "wall_s": round(wall, 1),
            "scores": {k: v.to_dict() for k, v in scores.items()},
            "outcomes": [o.to_dict() for o in outcomes]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
