"""From trial AJ: the socket of a `tinystore serve` removed while it runs. A new `open(dir)` waited 20 s, then said
"connect to it with tinystore.open() instead of owning it" (it had called open). It now says at once that the
owner's socket is gone, and never starts a second server on the directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths

from ..helpers import ServerProcess


# contract: STORE-01
# contract: STORE-02
async def test_open_says_at_once_that_the_owners_socket_was_removed(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        sock = paths.socket_path(directory.resolve())
        sock.unlink()
        started = time.monotonic()
        with pytest.raises(tinystore.InUseError) as caught:
            await tinystore.open(directory)
        assert time.monotonic() - started < 10  # not the 20 s a sidecar is given to start
        message = caught.value.message
        assert f"(pid {server.proc.pid if server.proc else '?'}) whose socket {sock} is gone" in message, message
        assert "instead of owning it" not in message
        assert server.proc is not None and server.proc.poll() is None  # the owner goes on, alone
    finally:
        server.stop()


# contract: STORE-05
def test_stop_stops_a_server_whose_socket_was_removed(tmp_path: Path) -> None:
    """From trial AL: `tinystore stop DIR` said no server was running there; it now stops it with SIGTERM (as
    gracefully), saying so."""
    import subprocess
    import sys

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        paths.socket_path(directory.resolve()).unlink()
        done = subprocess.run(
            [sys.executable, "-m", "tinystore", "stop", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "lost its socket" in done.stderr and "sent it SIGTERM" in done.stderr, done.stderr
        assert server.proc is not None and server.proc.wait(10) == 0  # a graceful stop
    finally:
        server.stop()


# contract: STORE-05
def test_stop_refuses_an_embedded_store_whose_socket_was_removed(tmp_path: Path) -> None:
    """From trial AR: the SIGTERM meant for a server went to the program that embeds the store (it died, and stop
    then waited 15 s for it). docs/serving.md: `stop` refuses an embedded store, naming the program's pid."""
    import subprocess
    import sys
    import textwrap

    directory = tmp_path / "store"
    program = textwrap.dedent(
        """
        import asyncio, sys, tinystore
        async def main():
            store = await tinystore.open(sys.argv[1], embedded=True)
            print("ready", flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    child = subprocess.Popen([sys.executable, "-c", program, str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sock = paths.socket_path(directory.resolve())
        sock.unlink()
        done = subprocess.run(
            [sys.executable, "-m", "tinystore", "stop", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"error[invalid] store {directory}: the store is embedded in process {child.pid}")
        assert f"lost its socket {sock}" in done.stderr and "stop that program" in done.stderr, done.stderr
        assert child.poll() is None  # the program goes on
    finally:
        child.kill()
        child.wait()


# contract: STORE-05
def test_stop_signals_no_process_that_does_not_hold_the_directory(tmp_path: Path) -> None:
    """From trial AS: a server killed outright leaves its address; with its socket removed too, `tinystore stop`
    sent SIGTERM to whatever process had that pid now (pid reuse: here an unrelated `sleep`). It signals only the
    process that holds DIR/LOCK."""
    import json
    import signal
    import subprocess
    import sys

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    paths.socket_path(directory.resolve()).unlink()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        address = paths.address_file(directory.resolve())
        info = json.loads(address.read_text())
        info["pid"] = bystander.pid  # what a reused pid looks like
        address.write_text(json.dumps(info))
        done = subprocess.run(
            [sys.executable, "-m", "tinystore", "stop", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr
        assert f"no server runs there: its address names pid {bystander.pid}" in done.stderr, done.stderr
        time.sleep(0.2)
        assert bystander.poll() is None  # left alone
    finally:
        bystander.kill()
        bystander.wait()
        server.stop()
