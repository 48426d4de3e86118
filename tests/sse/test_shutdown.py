"""From trial AU: `uvicorn app:app` serving event streams did not stop at SIGTERM while a browser kept one open
(it waited for the connection to close: a deploy waited for a tab). The first stream of a process puts
``end_streams`` before its signal handlers: the streams end, the browsers reconnect elsewhere, uvicorn stops."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


# contract: SSE-04
@pytest.mark.parametrize("workers", [1, 2])
def test_uvicorn_stops_at_sigterm_while_a_stream_is_open(tmp_path: Path, workers: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(os.environ, SHUTDOWN_APP_DIR=str(tmp_path / "store"))
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.sse.shutdown_app:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if workers > 1:
        argv += ["--workers", str(workers)]
    server = subprocess.Popen(argv, env=env, cwd=Path(__file__).parents[2], start_new_session=True)
    try:
        client = httpx.Client(timeout=httpx.Timeout(5, read=60))
        for _ in range(200):
            try:
                resp = client.send(client.build_request("GET", f"http://127.0.0.1:{port}/events/1"), stream=True)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        else:
            raise AssertionError("uvicorn did not come up")
        try:
            assert resp.status_code == 200
            time.sleep(0.3)
            server.send_signal(signal.SIGTERM)
            started = time.monotonic()
            # (uvicorn raises the signal it captured again once it stopped: a single process ends by it)
            assert server.wait(timeout=20) in (0, -signal.SIGTERM)
            assert time.monotonic() - started < 10
        finally:
            resp.close()
            client.close()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        subprocess.run(
            [sys.executable, "-m", "tinystore", "stop", str(tmp_path / "store")], capture_output=True, timeout=30
        )


# contract: SSE-04
def test_an_ignored_signal_stays_ignored() -> None:
    """From trial AW: the first stream replaced an ignored SIGINT (a program started with `&` from a script) with
    a handler: every SIGINT then ended the streams, and the programs it started no longer ignored it."""
    program = (
        "import signal, tinystore.sse as sse\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "sse._end_streams_at_shutdown()\n"
        "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN,"
        " getattr(signal.getsignal(signal.SIGTERM), 'ends_streams', False))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["True", "True"], (done.stdout, done.stderr)


@contextlib.contextmanager
def flooded(tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen[str], socket.socket]]:
    """A plain ``uvicorn tests.sse.shutdown_app:app`` (stderr piped), and a client with a 4 KiB receive buffer that
    asked for its ``/flood`` stream (events of 60 KB); both ended after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    argv = [sys.executable, "-m", "uvicorn", "tests.sse.shutdown_app:app", "--port", str(port)]
    server = subprocess.Popen(
        argv,
        env=dict(os.environ, SHUTDOWN_APP_DIR=str(tmp_path / "store"), **env),
        cwd=Path(__file__).parents[2],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    browser = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    browser.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        for _ in range(200):
            try:
                browser.connect(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("uvicorn did not come up")
        browser.sendall(b"GET /flood HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        yield server, browser
    finally:
        browser.close()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.communicate(timeout=10)
        subprocess.run(
            [sys.executable, "-m", "tinystore", "stop", str(tmp_path / "store")], capture_output=True, timeout=30
        )


# contract: SSE-04
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_uvicorn_stops_while_a_browser_takes_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    """From trial FJ: a plain `uvicorn app:app` (no --timeout-graceful-shutdown) did not stop at a Ctrl-C while a
    client that reads nothing held a stream: the stream gave up its write, but the connection's close waited for
    its buffers to drain, and uvicorn for the connection. Nor is anything logged at ERROR."""
    with flooded(tmp_path) as (server, _):
        time.sleep(1.5)  # (its events fill the buffers: the stream's write waits)
        server.send_signal(sig)
        started = time.monotonic()
        try:
            _, err = server.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError("uvicorn did not stop within 15 s of the signal") from None
        assert time.monotonic() - started < 12
        assert "ERROR" not in err, err


# contract: SSE-04
def test_a_slow_browser_that_reads_gets_every_event_handed_over_before_a_stop(tmp_path: Path) -> None:
    """From trial FL: at a stop, a stream whose write waited past END_GRACE had its connection closed at once, and
    a browser that read, slowly, lost the events already handed to the server; only one that takes nothing is cut."""
    sent = tmp_path / "sent"
    got = bytearray()
    with flooded(tmp_path, FLOOD_SENT=str(sent)) as (server, browser):
        browser.settimeout(20)
        started = time.monotonic()
        signalled = False
        while True:  # some 800 KB a second (4 KB a read): slower than the producer, never stopped
            if not signalled and time.monotonic() - started > 2.0:
                server.send_signal(signal.SIGINT)
                signalled = True
            chunk = browser.recv(30_000)
            if not chunk:
                break
            got += chunk
            time.sleep(0.005)
        server.communicate(timeout=20)
    handed_over = int(sent.read_text())
    events = [line for line in bytes(got).split(b"\n") if line.startswith(b"data: ")]
    assert len(events) >= handed_over + 1, (len(events), handed_over)
    assert all(e.endswith(b"}") for e in events)  # (none cut)
