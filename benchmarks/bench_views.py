"""Benchmark: what ``fr analyze --html`` costs at 1,024 ranks x 2,000 collectives.

On the sets benchmarks/bench_fr.py builds (an SPMD job with one rank's tensor of another size
near the end; and the pipeline-like set where every rank records its own timeline), in one
run, interleaved round by round so the machine's load hits both sides alike:

- ``fr analyze DIR --json`` against ``fr analyze DIR --json --html FILE`` (fresh subprocesses,
  wall time, the median of --rounds): the ratio is what writing the view adds;
- the HTML file's size;
- in one process, the seconds of loading + analysis and of building the page (its share of
  fr analyze's own work, without the noise of process start-up on a loaded machine);
- the time headless Chromium takes to load and draw it: from navigation start to the moment
  the page's script has drawn everything (``performance.now()`` at the end of the script,
  which the page stores in ``data-render-ms``), and the wall time of the driver's load.

    .venv/bin/python benchmarks/bench_views.py                  # both 1024x2000 sets
    .venv/bin/python benchmarks/bench_views.py --sets 64x2000 --distinct '' --rounds 5

Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian chromium, chromium-driver) and
selenium for the render figure. Not a test: prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from bench_fr import make_distinct, make_set  # noqa: E402


def _analyze(d: Path, html: Path | None) -> float:
    cmd = [sys.executable, "-m", "mldebug", "fr", "analyze", str(d), "--json"]
    if html is not None:
        cmd += ["--html", str(html), "--force"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
    wall = time.perf_counter() - t
    if r.returncode not in (0, 1):
        raise SystemExit(f"fr analyze failed: {r.stderr.decode()[-2000:]}")
    return wall


def _render(html: Path, rounds: int) -> tuple[float, float]:
    """(median ms to drawn, by the page's clock; median wall s of the driver's load)."""
    import pytest  # browser.py reports an unavailable browser through pytest
    from browser import chromium, open_view, severe

    try:
        with chromium() as b:
            page_ms, walls = [], []
            for _ in range(rounds):
                walls.append(open_view(b, html, timeout=120))
                page_ms.append(float(b.execute_script("return document.body.dataset.renderMs")))
                errors = severe(b)
                if errors:
                    print(f"  JS errors: {errors[:3]}")
                b.get("about:blank")
            return statistics.median(page_ms), statistics.median(walls)
    except (pytest.skip.Exception, pytest.fail.Exception) as e:
        print(f"  no browser: {e}")
        return float("nan"), float("nan")


INPROC = """
import sys, time
from mldebug.fr.loader import load
from mldebug.fr.analyze import analyze
from mldebug.fr.view import fr_html
t = time.perf_counter(); ds = load([sys.argv[1]]); t1 = time.perf_counter()
a = analyze(ds); t2 = time.perf_counter()
html = fr_html(ds, a); t3 = time.perf_counter()
print(f"inproc load_s={t1 - t:.2f} analyze_s={t2 - t1:.2f} html_s={t3 - t2:.2f} "
      f"html_share={(t3 - t2) / (t2 - t):.3f}")
"""


def _inprocess(d: Path) -> str:
    """Load, analyse and build the page in one process: the page's share of fr analyze's
    own work, free of the start-up noise of separate processes on a loaded machine."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", INPROC, str(d)], capture_output=True, text=True,
                       env=env, cwd=REPO)
    return (r.stdout.strip() or r.stderr[-500:]).removeprefix("inproc ")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sets", default="1024x2000", help="SPMD sets, RANKSxENTRIES")
    p.add_argument("--distinct", default="1024x2000", help="pipeline-like sets")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--root", default="/tmp/mldebug-bench-fr")
    a = p.parse_args()
    root = Path(a.root)
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]} rounds={a.rounds}")
    jobs = [(f"spmd {s}", make_set(root, *map(int, s.split("x")), culprit=int(s.split("x")[0]) // 3))
            for s in filter(None, a.sets.split(","))]
    jobs += [(f"distinct {s}", make_distinct(root, *map(int, s.split("x"))))
             for s in filter(None, a.distinct.split(","))]
    print(f"{'set':>20} {'analyze_s':>10} {'+html_s':>8} {'ratio':>6} {'html_MB':>8} "
          f"{'render_ms':>10} {'load_s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, d in jobs:
            html = Path(tmp) / (name.replace(" ", "-") + ".html")
            plain, with_html = [], []
            for _ in range(a.rounds):
                plain.append(_analyze(d, None))
                with_html.append(_analyze(d, html))
            mp, mh = statistics.median(plain), statistics.median(with_html)
            ms, load = _render(html, a.rounds)
            print(f"{name:>20} {mp:10.2f} {mh:8.2f} {mh / mp:6.2f} "
                  f"{html.stat().st_size / 1e6:8.2f} {ms:10.0f} {load:7.2f}", flush=True)
            print(f"{'':>20} in one process: {_inprocess(d)}", flush=True)


if __name__ == "__main__":
    main()
