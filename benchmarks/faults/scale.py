"""The fault matrix at scale: one real small case, tiled to 1,024-16,384 ranks, read by the
offline routes (`mldebug hang analyze`, `mldebug log`, `mldebug fr analyze`), each timed and
scored on the culprit it names.

    python benchmarks/faults/scale.py --classes skip_collective,thread_lock --sizes 1024,16384

For each class a real 4-rank case runs first (benchmarks/faults/job.py under torchrun, its
hang snapshot saved with `mldebug hang --out`, its output and its flight-recorder dumps kept).
Then every rank of the large job is a copy of one small rank: the culprit's material at a
rank drawn from the seed, the victims' material everywhere else, with the rank, host, pid,
world size and group members rewritten (8 ranks a node). Lines without a rank prefix
(torchrun's own) are left out of the large log: they name the small job's ranks.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalogue import BY_NAME  # noqa: E402
from runner import PY, Options, _env, draw, kill_tree, start, wait_for_fault  # noqa: E402

PREFIX = re.compile(rb"^\[rank(\d+)\]:")


def small_case(name: str, work: Path, timeout: float) -> tuple[Path, list[int]]:
    """Run the 4-rank case; keep its saved hang snapshot, output and dumps."""
    case = draw(BY_NAME[name], 4, 0)
    run = start(case, work, Options(timeout=timeout))
    try:
        if wait_for_fault(run, Options(timeout=timeout)) is None:
            raise SystemExit(f"{name}: the fault never took effect:\n{run.log.read_text()[-2000:]}")
        subprocess.run([PY, "-m", "mldebug", "hang", "--pid", str(run.procs[0].pid),
                        "--out", str(run.side / "hang"), "--json"], capture_output=True,
                       env=_env(), timeout=120, check=True)
        deadline = time.monotonic() + timeout + 45
        while run.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        kill_tree(run.procs)
    doc, _, _ = timed(["hang", "analyze", str(run.side / "hang"), "--json"])
    if culprits_of("hang", doc) != case.truth:  # a snapshot taken too late (a loaded machine)
        raise SystemExit(f"{name}: the 4-rank snapshot named {culprits_of('hang', doc)}, not "
                         f"{case.truth}: nothing to tile; run it again on a quieter machine")
    return run.side, case.truth


def template(big: int, culprit_big: int, small_culprits: list[int], small: int) -> int:
    """The small rank whose material big rank ``big`` copies."""
    victims = [r for r in range(small) if r not in small_culprits] or [0]
    if big == culprit_big and small_culprits:
        return small_culprits[0]
    return victims[big % len(victims)]


def tile_hang(src: Path, dst: Path, n: int, pick: Any) -> None:
    docs = {}
    for p in (src / "dumps").glob("*.json"):
        d = json.loads(p.read_text())
        if (d.get("identity") or {}).get("rank") is not None:
            docs[d["identity"]["rank"]] = d
    (dst / "dumps").mkdir(parents=True)
    for name in (".mldebug-hang",):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    for r in range(n):
        d = json.loads(json.dumps(docs[pick(r)]))
        host, pid = f"node{r // 8}", 1000 + r % 8
        d["host"], d["pid"] = host, pid
        ident = d["identity"]
        ident.update(rank=r, local_rank=r % 8, world_size=n, local_world_size=8,
                     node_rank=r // 8)
        for t in d.get("dump") or []:
            t["pid"] = pid
        (dst / "dumps" / f"{host}-rank{r}-{pid}.json").write_text(
            json.dumps(d, separators=(",", ":")))


def tile_log(src: Path, dst: Path, n: int, pick: Any) -> None:
    per: dict[int, list[bytes]] = {}
    for line in src.read_bytes().splitlines(keepends=True):
        m = PREFIX.match(line)
        if m:
            per.setdefault(int(m.group(1)), []).append(line[m.end():])
    with open(dst, "wb") as out:
        for r in range(n):
            k = pick(r)
            tag = f"[rank{r}]:".encode()
            for body in per.get(k, []):
                body = body.replace(f"fr_rank{k}".encode(), f"fr_rank{r}".encode())
                body = body.replace(f"rank {k} ".encode(), f"rank {r} ".encode())
                out.write(tag + body)


def tile_fr(src: Path, dst: Path, n: int, pick: Any) -> None:
    dumps = {}
    for p in src.glob("fr_rank*"):
        with open(p, "rb") as f:
            d = pickle.load(f)  # our own job's dumps, written minutes ago on this machine
        dumps[int(d["rank"])] = d
    dst.mkdir(parents=True)
    members = json.dumps(list(range(n)))
    for r in range(n):
        d = dict(dumps[pick(r)])
        d["rank"] = r
        cfg = {}
        for k, v in (d.get("pg_config") or {}).items():
            cfg[k] = {**v, "ranks": members} if isinstance(v, dict) else v
        d["pg_config"] = cfg
        if isinstance(d.get("mldebug"), dict):
            d["mldebug"] = {**d["mldebug"], "world_size": n, "host": f"node{r // 8}"}
        with open(dst / f"fr_rank{r}", "wb") as f:
            pickle.dump(d, f, protocol=2)


def timed(args: list[str]) -> tuple[dict[str, Any] | None, float, float]:
    """The command's JSON, wall seconds and CPU seconds (user + system: on a shared machine
    the CPU figure moves less with the other load than the wall one)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([PY, "-m", "mldebug", *args], capture_output=True, text=True, env=_env())
    dt = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        return json.loads(r.stdout), dt, cpu
    except json.JSONDecodeError:
        return None, dt, cpu


def culprits_of(route: str, doc: dict[str, Any] | None) -> list[int] | None:
    if doc is None:
        return None
    if route == "hang":
        return sorted({s["rank"] for j in doc.get("jobs", []) for s in j.get("suspects", [])})
    if route == "log":
        return list(doc.get("culprits") or [])
    return list(doc.get("culprit_ranks") or [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", default="skip_collective,thread_lock,busy_python")
    p.add_argument("--sizes", default="1024,4096,16384")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mldebug-faults-scale-"))
    rows = []
    try:
        for name in a.classes.split(","):
            side, truth = small_case(name, work, a.timeout)
            for n in (int(x) for x in a.sizes.split(",")):
                c = random.Random(f"{name}/{n}/{a.seed}").randrange(n)

                def pick(r: int, c: int = c, truth: list[int] = truth) -> int:
                    return template(r, c, truth, 4)

                big = work / f"{name}-{n}"
                tile_hang(side / "hang", big / "hang", n, pick)
                tile_log(side / "out.log", big / "out.log", n, pick)
                if (side / "fr").is_dir() and any((side / "fr").glob("fr_rank*")):
                    tile_fr(side / "fr", big / "fr", n, pick)
                runs = [("hang", ["hang", "analyze", str(big / "hang"), "--json"]),
                        ("log", ["log", str(big / "out.log"), "--json"])]
                if (big / "fr").is_dir():
                    runs.append(("fr", ["fr", "analyze", str(big / "fr"), "--json"]))
                for route, args in runs:
                    doc, dt, cpu = timed(args)
                    got = culprits_of(route, doc)
                    ok = got == [c]
                    rows.append((name, n, route, cpu, got, c, ok))
                    print(f"{name:18} {n:6d} ranks  {route:4}  {dt:6.2f} s wall "
                          f"{cpu:6.2f} s CPU  named "
                          f"{got if got is None or len(got) < 6 else got[:5] + ['...']} "
                          f"(culprit {c}) {'right' if ok else 'WRONG'}", flush=True)
                shutil.rmtree(big)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    right = sum(r[-1] for r in rows)
    worst = max((r[3] for r in rows if r[1] == max(int(x) for x in a.sizes.split(","))),
                default=0.0)
    print(f"\n{right}/{len(rows)} right; slowest offline route at the largest size: "
          f"{worst:.1f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
