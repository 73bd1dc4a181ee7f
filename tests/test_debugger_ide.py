"""ide="debugpy": the rank listens on 127.0.0.1 and a minimal DAP client attaches and reads a
local variable of the frame that called mldebug.breakpoint()."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

import pytest
from conftest import run_cli
from test_debugger_remote import kill_tree, listening, start_script, wait_for

pytest.importorskip("debugpy")

IDE_JOB = r"""
import mldebug
def work():
    answer = 6 * 7
    mldebug.breakpoint(ide="debugpy")
    print("continued", answer, flush=True)
work()
"""


class Dap:
    """Just enough of the Debug Adapter Protocol: Content-Length framed JSON over TCP."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = b""
        self.seq = 0
        self.pending: list[dict[str, Any]] = []

    def send(self, command: str, **arguments: Any) -> int:
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command,
                           "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def _read(self) -> dict[str, Any]:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        size = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
        while len(self.buf) < size:
            self.buf += self._recv()
        body, self.buf = self.buf[:size], self.buf[size:]
        return json.loads(body)

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        assert chunk, "the adapter closed the connection"
        return chunk

    def wait(self, kind: str, name: str, seq: int | None = None) -> dict[str, Any]:
        """The next response to ``seq`` / event ``name``; other messages are kept for later."""
        for i, msg in enumerate(self.pending):
            if self._is(msg, kind, name, seq):
                return self.pending.pop(i)
        while True:
            msg = self._read()
            if self._is(msg, kind, name, seq):
                return msg
            self.pending.append(msg)

    @staticmethod
    def _is(msg: dict[str, Any], kind: str, name: str, seq: int | None) -> bool:
        if kind == "event":
            return msg.get("type") == "event" and msg.get("event") == name
        return msg.get("type") == "response" and msg.get("request_seq") == seq

    def request(self, command: str, **arguments: Any) -> dict[str, Any]:
        reply = self.wait("response", command, self.send(command, **arguments))
        assert reply["success"], reply
        return reply.get("body") or {}


def test_an_ide_attaches_over_dap_and_reads_a_local(tmp_path):
    proc, log, env = start_script(tmp_path, IDE_JOB, "ide.py")
    try:
        m = wait_for(log, r"waits for an IDE \(debugpy\) on 127.0.0.1:(\d+)", proc)
        port = int(m[1])
        text = log.read_text()
        assert f"ssh -N -L {port}:127.0.0.1:{port} " in text
        assert f'"connect": {{"host": "127.0.0.1", "port": {port}}}' in text
        listed = json.loads(run_cli("pdb", "list", "--json", env=env).stdout)
        assert [(s["kind"], s["port"], s["function"]) for s in listed["sessions"]] == [
            ("debugpy", port, "work")]
        assert any(f["code"] == "pdb-debugpy-no-token" for f in listed["findings"])
        # the debuggee and debugpy's adapter (the process that owns the port) listen on
        # 127.0.0.1 only, and nothing else uses the port
        import psutil

        assert [a for a in listening() if a[1] == port] == [("127.0.0.1", port)]
        adapter = {c.pid for c in psutil.net_connections("tcp")
                   if c.status == "LISTEN" and c.laddr.port == port}
        socks = [s for pid in {proc.pid, *adapter} for s in listening(pid)]
        assert len(adapter) == 1 and all(a == "127.0.0.1" for a, _ in socks), socks

        dap = Dap(port)
        dap.request("initialize", adapterID="mldebug-test", clientID="mldebug-test",
                    pathFormat="path", linesStartAt1=True, columnsStartAt1=True)
        attach_seq = dap.send("attach", justMyCode=False)
        dap.wait("event", "initialized")
        dap.request("configurationDone")
        assert dap.wait("response", "attach", attach_seq)["success"]
        stopped = dap.wait("event", "stopped")["body"]
        frames = dap.request("stackTrace", threadId=stopped["threadId"])["stackFrames"]
        work = next(f for f in frames if f["name"] == "work")
        scopes = dap.request("scopes", frameId=work["id"])["scopes"]
        local = next(s for s in scopes if s["name"].lower().startswith("local"))
        variables = dap.request("variables", variablesReference=local["variablesReference"])
        assert {v["name"]: v["value"] for v in variables["variables"]}["answer"] == "42"
        dap.request("continue", threadId=stopped["threadId"])
        deadline = time.monotonic() + 30
        while "continued 42" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "continued 42" in log.read_text()
        dap.request("disconnect")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            kill_tree(proc)
