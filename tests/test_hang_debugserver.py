"""The debug-server route's client parts against real components: a real torch TCPStore, a
real worker server (torch.distributed.debug.start_debug_server in a real rank), and servers
that refuse, accept and never answer, answer garbage, or answer too much - each one line,
bounded in time, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jobs import free_port, independent_ranks

from mldebug.hang import debugserver as ds
from mldebug.hang.debugserver import RouteError, StoreClient

pytest.importorskip("torch.distributed")
if importlib.util.find_spec("torch.distributed.debug") is None:
    pytest.skip("torch.distributed.debug (PyTorch 2.13+) is missing", allow_module_level=True)


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[int, object]]:
    """A real TCPStore server; a rank's registration written as start_debug_server does."""
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.PrefixStore("debug_server", dist.TCPStore("127.0.0.1", master.port,
                                                            is_master=False))
    client.set("rank0", "http://vm-a:4001")
    client.set("rank3", "http://vm-b:4003")
    yield master.port, master


class Silent:
    """A listening socket that accepts and never answers (``reply`` may answer instead)."""

    def __init__(self, reply: Callable[[socket.socket], None] | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.reply is not None:
                try:
                    self.reply(c)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def timed(fn: Callable[[], object]) -> tuple[float, str]:
    start = time.monotonic()
    with pytest.raises(RouteError) as e:
        fn()
    return time.monotonic() - start, str(e.value)


def test_registrations_from_a_real_tcpstore(store):
    port, _ = store
    with StoreClient("127.0.0.1", port, timeout=5, deadline=time.monotonic() + 10) as c:
        assert ds.registrations(c, [0, 1, 3]) == {0: "http://vm-a:4001", 3: "http://vm-b:4003"}
        assert ds.registrations(c, None, world_size=4) == {0: "http://vm-a:4001",
                                                           3: "http://vm-b:4003"}
        assert ds.registrations(c, None) == {0: "http://vm-a:4001", 3: "http://vm-b:4003"}
        assert ds.registrations(c, [7]) == {}  # a missing key: CHECK says so, no GET blocks


def test_a_store_that_refuses_is_one_line():
    port = free_port()
    took, msg = timed(lambda: StoreClient("127.0.0.1", port, timeout=3,
                                          deadline=time.monotonic() + 3))
    assert took < 3 and "refused the connection" in msg and f"127.0.0.1:{port}" in msg


def test_a_store_that_never_answers_is_bounded():
    srv = Silent()
    try:
        took, msg = timed(lambda: StoreClient("127.0.0.1", srv.port, timeout=1.5,
                                              deadline=time.monotonic() + 1.5))
        assert took < 4 and ("did not answer" in msg or "in time" in msg), msg
        # the total deadline holds even when each read is given longer
        took, msg = timed(lambda: StoreClient("127.0.0.1", srv.port, timeout=30,
                                              deadline=time.monotonic() + 1.0))
        assert took < 4, (took, msg)
    finally:
        srv.close()


def test_a_store_that_answers_garbage_is_one_line():
    srv = Silent(lambda c: (c.recv(64), c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")))
    try:
        _, msg = timed(lambda: StoreClient("127.0.0.1", srv.port, timeout=3,
                                           deadline=time.monotonic() + 3))
        assert "not a TCPStore" in msg, msg
    finally:
        srv.close()


def _fake_store(answer_check: bytes, get_size: int = 0) -> Silent:
    """Answers VALIDATE+PING like a TCPStore, then ``answer_check`` to a CHECK and a GET whose
    announced size is ``get_size``."""
    def reply(c: socket.socket) -> None:
        c.settimeout(5)
        data = b""
        while len(data) < 10:
            data += c.recv(64)
        c.sendall(data[6:10])  # the ping's nonce back
        c.recv(4096)
        c.sendall(answer_check)
        if get_size:
            c.recv(4096)
            c.sendall(struct.pack("<Q", get_size) + b"x" * 100)
    return Silent(reply)


def test_a_store_with_garbage_or_oversized_values_is_one_line():
    srv = _fake_store(b"\x07")
    try:
        with StoreClient("127.0.0.1", srv.port, timeout=3, deadline=time.monotonic() + 5) as c:
            with pytest.raises(RouteError, match="neither ready nor not-ready"):
                c.check(["/debug_server/rank0"])
    finally:
        srv.close()
    srv = _fake_store(b"\x00", get_size=1 << 40)
    try:
        with StoreClient("127.0.0.1", srv.port, timeout=3, deadline=time.monotonic() + 5) as c:
            with pytest.raises(RouteError, match="not a debug-server registration"):
                ds.registrations(c, [0])
    finally:
        srv.close()


def test_urls_and_store_options_are_checked():
    assert ds.parse_url("http://vm:4001") == ("vm", 4001)
    assert ds.parse_url("http://[::1]:80") == ("::1", 80)
    for bad in ("http://vm:0", "https://vm:1", "http://a b:1", "http://vm:99999", "vm:1",
                "http://vm:1/../x", "\x1b[2Jhttp://vm:1"):
        with pytest.raises(RouteError):
            ds.parse_url(bad)
    assert ds.parse_store("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert ds.parse_store("[::1]:29500") == ("::1", 29500)
    for bad in ("x", "host:", ":1", "h:70000", "h;rm:1"):
        with pytest.raises(ValueError):
            ds.parse_store(bad)
    assert ds.is_local(os.uname().nodename) and ds.is_local("127.0.0.1")
    assert not ds.is_local("203.0.113.9") and not ds.is_local("no-such-node-xyz")


def test_is_local_matches_short_names_but_never_a_part_of_an_address(monkeypatch):
    """A registered host is this node by its name, whole or short (node1 / node1.cluster),
    or by one of its addresses; a node whose host name is its address (10.0.0.5) must not
    take 10.0.0.6's ranks for its own: 10 == 10 is no host name match (every node of such a
    cluster reads the whole store and would ask its own server on another node's port)."""
    def named(name: str) -> None:
        monkeypatch.setattr(os, "uname", lambda: os.uname_result(
            ("Linux", name, "6", "#1", "x86_64")))

    named("node1")
    assert ds.is_local("node1.cluster", set()) and ds.is_local("node1", set())
    assert not ds.is_local("node2", set()) and not ds.is_local("node2.cluster", set())
    named("node1.cluster")
    assert ds.is_local("node1", set()) and not ds.is_local("node11", set())
    named("10.0.0.5")
    assert ds.is_local("10.0.0.5", set())
    assert not ds.is_local("10.0.0.6", set()) and not ds.is_local("10.1.2.3", {"10.0.0.5"})
    assert ds.is_local("10.0.0.6", {"10.0.0.6"})
    named("fd00::5")
    assert not ds.is_local("fd00::6", set())


def _http(reply: bytes, then_sleep: float = 0.0) -> Silent:
    def answer(c: socket.socket) -> None:
        c.recv(4096)
        c.sendall(reply)
        time.sleep(then_sleep)
    return Silent(lambda c: threading.Thread(target=answer, args=(c,), daemon=True).start())


def test_a_worker_server_that_hangs_refuses_or_answers_garbage_is_one_line():
    silent = Silent()
    try:
        took, msg = timed(lambda: ds.post("127.0.0.1", silent.port, "pyspy_dump", timeout=1.5))
        assert took < 4 and "did not answer pyspy_dump within" in msg, msg
        took, msg = timed(lambda: ds.dump("127.0.0.1", silent.port, timeout=2))
        assert took < 5, (took, msg)
    finally:
        silent.close()
    _, msg = timed(lambda: ds.post("127.0.0.1", free_port(), "ping", timeout=2))
    assert "refused the connection" in msg
    garbage = _http(b"\x00\x01garbage that is not HTTP\r\n\r\n")
    try:
        _, msg = timed(lambda: ds.post("127.0.0.1", garbage.port, "ping", timeout=2))
        assert "not HTTP" in msg or "closed the connection" in msg, msg
    finally:
        garbage.close()
    # a 200 that is no py-spy text and no faulthandler text: one line, with both reasons
    junk = _http(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    try:
        _, msg = timed(lambda: ds.dump("127.0.0.1", junk.port, timeout=3))
        assert "pyspy_dump answered no thread" in msg and "dump_traceback" in msg, msg
    finally:
        junk.close()


def test_a_worker_server_that_answers_too_much_is_cut():
    big = _http(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n" + b"x" * 1000)
    try:
        _, msg = timed(lambda: ds.post("127.0.0.1", big.port, "pyspy_dump", timeout=3))
        assert "announced 99999999999 bytes" in msg
    finally:
        big.close()
    endless = _http(b"HTTP/1.1 200 OK\r\n\r\n" + b"y" * (2 << 20), then_sleep=5)
    try:
        took, msg = timed(lambda: ds.post("127.0.0.1", endless.port, "pyspy_dump", timeout=4,
                                          limit=1 << 20))
        assert "more than 1 MiB" in msg and took < 4, (took, msg)
    finally:
        endless.close()


def test_py_spy_and_faulthandler_texts_become_threads():
    text = ("Process 4242: python train.py\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
            'Thread 4242 (idle): "MainThread"\n    wait (threading.py:327)\n'
            "    wait_for_data (hang_debug_server.py:33)\n    <module> (train.py:9)\n"
            'Thread 0x7F00 (active): "pt_workerserver"\n    clock_nanosleep (libc.so.6)\n')
    pid, threads = ds.pyspy_text_threads(text)
    assert pid == 4242 and [t["thread_name"] for t in threads] == ["MainThread",
                                                                    "pt_workerserver"]
    assert threads[0]["frames"][1] == {"name": "wait_for_data",
                                       "filename": "hang_debug_server.py", "module": None,
                                       "short_filename": "hang_debug_server.py", "line": 33,
                                       "locals": None}
    assert threads[1]["frames"][0]["line"] == 0 and threads[0]["os_thread_id"] == 4242
    fh = ("Current thread 0x00007f68faffd6c0 (most recent call first):\n  <no Python frame>\n\n"
          "Thread 0x00007f692440fb80 (most recent call first):\n"
          '  File "/tmp/train.py", line 15 in <module>\n')
    [main] = ds.traceback_threads(fh, 77)
    assert main["thread_name"] == "MainThread" and main["frames"][0]["line"] == 15


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[tuple[int, int]]:
    """One real rank running torch's debug server, stuck in wait_for_data: (its pid, the
    job's store port)."""
    tmp = tmp_path_factory.mktemp("dbgsrv")
    env = {"DEBUG_PORT": str(free_port()), "HANG_RANK": "0",
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    job = independent_ranks("hang_debug_server.py", 1, tmp / "log", extra_env=env)
    try:
        pids = job.wait_ready(timeout=120, settle=1.0)
        yield pids[0], _master_port(pids[0])
    finally:
        job.stop()


def _master_port(pid: int) -> int:
    from mldebug.dist import read_environ

    return int(read_environ(pid)["MASTER_PORT"])


def test_a_real_worker_server_answers_stacks(worker):
    pid, port = worker
    with StoreClient("127.0.0.1", port, timeout=5, deadline=time.monotonic() + 10) as c:
        regs = ds.registrations(c, [0])
    host, wport = ds.parse_url(regs[0])
    assert ds.is_local(host)
    assert [u for u, _ in ds.listening(wport)] == [os.geteuid()]
    said, threads, handler = ds.dump("127.0.0.1", wport, timeout=20)
    assert handler == "pyspy_dump" and said == pid  # py-spy is on the rank's PATH
    main = next(t for t in threads if t["thread_name"] == "MainThread")
    assert "wait_for_data" in [f["name"] for f in main["frames"]]
    status, body = ds.post("127.0.0.1", wport, "dump_traceback", timeout=10)
    fh = ds.traceback_threads(body.decode(), pid)
    assert status == 200 and "wait_for_data" in [
        f["name"] for f in next(t for t in fh if t["thread_name"] == "MainThread")["frames"]]
    status, body = ds.post("127.0.0.1", wport, "nosuch", timeout=5)
    assert status == 404  # an unknown handler: an answer, not an exception
