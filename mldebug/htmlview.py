"""One self-contained HTML page (data and drawing script inline, no network), Chrome
trace-event JSON, and the one way mldebug writes such a single output file (``--html FILE``,
``--trace-event FILE``; ``mem plot`` uses the same escaping). Each capability draws its own
view (``fr/view.py``, ``trace/view.py``, ``hang/view.py``, ``memory/view.py``) from the results
its analysis produced; this shared module knows nothing of them (docs/views.md).

Every string from outside (frame names, host names, op names) reaches the page either as
inline JSON, where ``<``, ``>``, ``&`` and ``/`` are escaped so that nothing can close the
script or spell a URL, or through ``esc``; the scripts only ever set ``textContent``, never
``innerHTML``. The page loads nothing: no CDN, no font, no fetch.

Files are checked before any work (``check_target``) and written atomically (``write_file``):
a temporary name in the same directory, opened ``O_NOFOLLOW|O_EXCL`` with mode 0600, renamed
over the target. An existing file is replaced only with ``--force`` and only when mldebug
wrote it (``GENERATOR`` near its start), as docs/safety.md says for directories.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError

SEQ_STEP_US = 1000  # trace-event time axis when there are no times: 1 ms per entry
GENERATOR = "mldebug-view"  # in the first bytes of every file written here: --force's marker
_MARK_BYTES = 512


def esc(s: object) -> str:
    """Text for HTML (element content or a quoted attribute); '/' too, so no 'scheme://'."""
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;").replace("/", "&#47;"))


def embed(data: Any) -> str:
    """``data`` as a JavaScript literal that is safe inside ``<script>``: JSON with ``<``,
    ``>``, ``&``, ``/`` and the two JS line separators escaped (still valid JSON)."""
    return (json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("/", "\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


BASE_CSS = """body{font:13px system-ui,sans-serif;margin:14px;color:#222}
h2{margin:4px 0 8px;font-size:17px}h3{margin:14px 0 6px;font-size:14px}
.muted{color:#777}.bad{color:#c0392b;font-weight:600}.ok{color:#2e7d32}
.card{border:1px solid #ddd;border-radius:4px;padding:6px 9px;margin:6px 0;background:#fafafa}
.finding b{display:block}.fix{color:#555;margin-top:3px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;
vertical-align:top;font-size:12px}th{background:#f0f0f0}
#tip{position:absolute;background:#fff;border:1px solid #888;padding:4px 6px;
pointer-events:none;display:none;white-space:pre;font:12px monospace;z-index:9;max-width:900px}
.lbl{font:11px monospace;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;cursor:pointer}
.sw{display:inline-block;width:11px;height:11px;margin:0 4px 0 10px;vertical-align:middle}
"""

# helpers every view's script uses: elements built with textContent only
BASE_JS = r"""
function h(tag, cls, text) { const e = document.createElement(tag);
  if (cls) e.className = cls; if (text !== undefined && text !== null) e.textContent = String(text);
  return e; }
function add(parent, ...kids) { for (const k of kids) parent.appendChild(k); return parent; }
function fold(rs) { if (!rs.length) return "-"; const s = [...rs].sort((a, b) => a - b), out = [];
  let a = s[0], b = s[0];
  for (const x of s.slice(1)) { if (x === b + 1) { b = x; continue; }
    out.push(a === b ? "" + a : a + "-" + b); a = b = x; }
  out.push(a === b ? "" + a : a + "-" + b); return out.join(","); }
const TIP = document.getElementById("tip");
function tip(ev, text) { if (!text) { TIP.style.display = "none"; return; }
  TIP.textContent = text; TIP.style.left = (ev.pageX + 12) + "px";
  TIP.style.top = (ev.pageY + 12) + "px"; TIP.style.display = "block"; }
function findings(box, fs) { for (const f of fs) { const d = h("div", "card finding");
  add(d, h("b", f.severity === "error" ? "bad" : "", f.title));
  if (f.detail) add(d, h("div", "", f.detail)); if (f.fix) add(d, h("div", "fix", "Fix: " + f.fix));
  box.appendChild(d); } }
const PALETTE = ["#4e79a7","#f28e2b","#59a14f","#b07aa1","#76b7b2","#edc948","#9c755f",
  "#ff9da7","#bab0ac","#86bcb6","#d37295","#8cd17d","#499894","#f1ce63","#a0cbe8","#ffbe7d",
  "#79706e","#d4a6c8","#fabfd2","#b6992d"];
"""


def page(title: str, kind: str, data: Any, script: str, body: str = "", css: str = "") -> str:
    """The whole page: ``data`` is ``D`` in ``script``; ``body`` is static markup (no outside
    text in it); the page marks itself done with ``document.body.dataset.rendered``."""
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<meta name="generator" content="{GENERATOR} {esc(kind)}">'
            f"<title>{esc(title)}</title><style>{BASE_CSS}{css}</style></head><body>"
            f'<h2 id="title">{esc(title)}</h2>{body}<div id="tip"></div>\n'
            f"<script>\nconst D = {embed(data)};\n{BASE_JS}\n{script}\n"
            "document.body.dataset.renderMs = String(Math.round(performance.now()));\n"
            "document.body.dataset.rendered = '1';\n</script></body></html>\n")


def check_target(path: str | Path, *, force: bool, flag: str) -> Path:
    """Refuse before any work what ``write_file`` would refuse: an existing file without
    ``--force`` (or one mldebug did not write), a link, a directory, a missing or read-only
    directory. Returns the path (``~`` expanded)."""
    p = Path(path).expanduser()
    if p.is_symlink():
        raise UsageError(f"{flag} {p} is a symbolic link; mldebug does not write through links.",
                         "Pass the real file path, or a new one.")
    if p.is_dir():
        raise UsageError(f"{flag} {p} is a directory.", "Pass a file name, e.g. view.html.")
    if p.exists():
        if not force:
            raise UsageError(f"{p} already exists.",
                             f"Pass --force to replace it (only a file mldebug wrote), or "
                             f"another {flag} FILE.")
        if not _written_by_us(p):
            raise UsageError(f"--force refused: {p} was not written by mldebug, so it is not "
                             "replaced.", f"Pass another {flag} FILE, or remove it yourself.")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: the directory {parent} does not exist.",
                         f"Create it first (mkdir -p {parent}) or pass another path.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MldebugError(f"cannot write {p}: the directory {parent} is not writable.",
                           f"Pass a {flag} path in a directory you can write.")
    why = shared_parent_reason(parent)
    if why:
        raise UsageError(f"{flag} {p}: the directory {parent} {why}, so another user could "
                         "swap the file while mldebug writes it (--out refuses the same).",
                         f"Pass a {flag} path in a directory you own (or a sticky one of root's, "
                         "like /tmp).")
    return p


def shared_parent_reason(parent: Path) -> str | None:
    """Why a file must not be written into ``parent``, or None: a directory of another user
    (they rename what is in it, sticky bit or not), or one others can write without the
    sticky bit. Root's sticky /tmp and the user's own directories are fine."""
    import stat

    from mldebug.privdir import owner_name

    try:
        st = os.stat(parent)
    except OSError:
        return None  # the writability check above answers for it
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to {owner_name(st.st_uid)}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return f"can be written by other users (mode {mode:04o}, no sticky bit)"
    return None


def _written_by_us(p: Path) -> bool:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        return GENERATOR.encode() in os.read(fd, _MARK_BYTES)
    finally:
        os.close(fd)


def write_file(path: str | Path, text: str, *, force: bool, flag: str) -> Path:
    """Write ``text`` to ``path`` atomically, mode 0600 (checks as ``check_target``)."""
    from mldebug.outdir import write_error

    p = check_target(path, force=force, flag=flag)
    data = text.encode()
    tmp = p.parent / f".{p.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except OSError as e:
        err = write_error(p, e)
        raise (err or MldebugError(f"cannot write {p}: {e.strerror or e}.",
                                   "Pass a path on a writable file system.")) from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return p



def add_view_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                       trace_event: bool = False, force: bool = True, what: str = "") -> None:
    """--html FILE (and --trace-event FILE), with --force unless the command has one."""
    p.add_argument("--html", metavar="FILE",
                   help=f"also write a self-contained HTML view{what} (opens offline; "
                        "docs/views.md)")
    if trace_event:
        p.add_argument("--trace-event", metavar="FILE", dest="trace_event",
                       help="also write Chrome trace-event JSON (Perfetto, chrome://tracing)")
    if force:
        p.add_argument("--force", action="store_true",
                       help="replace an existing --html/--trace-event file mldebug wrote")


def check_view_targets(args: argparse.Namespace) -> None:
    """Refuse bad output paths before any work (exists without --force, unwritable dir)."""
    force = bool(getattr(args, "force", False))
    if getattr(args, "html", None):
        check_target(args.html, force=force, flag="--html")
    if getattr(args, "trace_event", None):
        check_target(args.trace_event, force=force, flag="--trace-event")


def write_views(args: argparse.Namespace, html: Callable[[], str] | None,
                trace: Callable[[], str] | None = None) -> list[Path]:
    """Write what was asked for; the paths written (said on stderr by the caller)."""
    import sys

    force = bool(getattr(args, "force", False))
    out = []
    if getattr(args, "html", None) and html is not None:
        out.append(write_file(args.html, html(), force=force, flag="--html"))
    if getattr(args, "trace_event", None) and trace is not None:
        out.append(write_file(args.trace_event, trace(), force=force, flag="--trace-event"))
    for p in out:
        print(f"mldebug: wrote {p}", file=sys.stderr)
    return out


# Chrome trace-event JSON (JSON object form): the marker first, one event per line
def trace_event_doc(events: list[dict[str, Any]], other: dict[str, Any]) -> str:
    # the marker first: --force replaces only a file whose first bytes carry it
    head = json.dumps({"otherData": dict(other, generator=GENERATOR), "displayTimeUnit": "ms"},
                      separators=(",", ":"))[:-1]
    body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
    return f'{head},"traceEvents":[\n{body}\n]}}\n'


def trace_event_process(pid: int, name: str, sort: int) -> list[dict[str, Any]]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": sort}}]
