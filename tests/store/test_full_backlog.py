"""A server out of file descriptors takes no connection, and its listen backlog fills: a Unix socket's connect then
fails with EAGAIN. From trial AO: ``open()`` took that for "no server" and started a sidecar every 2 s, then said
the directory was owned by another process; ``tinystore status`` said the same, and ``tinystore stop`` said no
server runs. Each now names a server that takes no connection, and ``stop`` stops it with SIGTERM (STORE-05).
(A server out of descriptors drains its backlog through those it keeps for the command line, refusing the clients
it lets in on them, since trial IK: the backlog stays full only while the server does not run, here SIGSTOPped.)"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tinystore.client.store import _can_connect
from tinystore.protocol import frames
from tinystore.protocol.frames import Connection
from tinystore.protocol.messages import Hello, encode
from tinystore.server import paths

from ..cli.support import run_cli

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")


# contract: STORE-05
def test_a_server_whose_backlog_is_full_is_named_so_and_stop_stops_it(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    log = (tmp_path / "serve.log").open("ab")
    server = subprocess.Popen(
        ["prlimit", "--nofile=48", sys.executable, "-m", "tinystore", "serve", str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    held: list[socket.socket] = []
    try:
        for _ in range(400):
            info = paths.read_address(directory)
            if info and Path(info["socket"]).exists():
                break
            time.sleep(0.05)
        sock = paths.socket_path(directory)
        server.send_signal(signal.SIGSTOP)
        hello = Connection("client").send_hello(
            encode(Hello(version=frames.PROTOCOL_VERSION, token="", client="test", pid=os.getpid()))
        )
        full = False
        for _ in range(2000):  # connections that say hello and stay: the server runs out of descriptors
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(sock))
            except BlockingIOError:
                s.close()
                full = True
                break
            s.setblocking(True)
            s.sendall(hello)
            held.append(s)
        assert full, "the backlog never filled"
        assert _can_connect(sock) is None
        status = run_cli("status", str(directory))
        assert status.returncode == 1 and "takes no connection: its queue of connections is full" in status.stderr
        assert "owned by another process" not in status.stderr and "no server is running" not in status.stderr
        stop = run_cli("stop", "--grace", "1s", str(directory))
        assert "sent it SIGTERM" in stop.stderr, stop.stderr
        assert stop.returncode == 1 and "it is suspended (SIGSTOP?), and stops once it runs again" in stop.stderr
        server.send_signal(signal.SIGCONT)
        assert server.wait(20) == 0  # (the SIGTERM it was sent: nothing else asked it to stop)
        assert not (directory / "server" / "sidecar.log").exists()  # no sidecar was started meanwhile
    finally:
        for s in held:
            s.close()
        if server.poll() is None:
            server.send_signal(signal.SIGCONT)
            server.kill()
            server.wait()
        log.close()
