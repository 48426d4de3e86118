"""Trial CY: `tinystore stop` of a server whose server/ folder is gone, of a directory whose stale address names a
live process that is not its owner; VACUUM in a read-only transaction of the store's own database; `DIR/sql` that
is a file; an IPv6 address in a bind error."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths

from ..cli.support import popen_cli, run_cli
from ..helpers import ServerProcess, has_ipv6_loopback, open_store, write_tokens


def test_stop_stops_a_server_whose_server_folder_was_removed(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    server = ServerProcess(directory).start()
    assert server.proc is not None
    shutil.rmtree(directory / "server")
    time.sleep(0.5)
    done = run_cli("stop", str(directory), timeout=40)
    assert done.returncode == 0, done.stderr  # (it was refused, told to run the very same command)
    assert server.proc.wait(20) == 0
    server.stop()


async def test_stop_names_the_owner_when_a_stale_address_names_another_live_process(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ServerProcess(directory).start().kill()  # (its address is left behind)
    sleeper = subprocess.Popen(["sleep", "60"])
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        info = json.loads(paths.address_file(directory).read_text())
        info["pid"] = sleeper.pid  # the dead server's pid, taken by another process since
        paths.address_file(directory).write_text(json.dumps(info))
        done = await asyncio.to_thread(run_cli, "stop", str(directory))
        text = " ".join(done.stderr.split())
        assert done.returncode == 1 and "no server is running" not in text, text
        assert "`tinystore stop` stops a server only" in text, text
    finally:
        await store.close()
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_vacuum_in_a_read_only_transaction_of_the_stores_own_database_is_refused_as_a_write(
    tmp_path: Path, mode: str
) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        await store.queue("q").add({})
        jobs = await store.database("tinystore-jobs")
        for sql in ("VACUUM", "vacuum main", "vacuum;"):
            with pytest.raises(tinystore.PermissionDeniedError, match="is the store's own"):
                await jobs.tx(lambda tx, sql=sql: tx.all(sql), read_only=True)


async def test_a_file_where_the_sql_folder_goes_is_named(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    shutil.rmtree(directory / "sql")
    (directory / "sql").write_text("")
    with pytest.raises(tinystore.UnavailableError, match=r"sql is not a folder"):
        await tinystore.open(directory, embedded=True)
    started = time.monotonic()
    with pytest.raises(tinystore.UnavailableError, match=r"sql is not a folder"):
        await tinystore.open(directory)  # (a sidecar that cannot start says why at once)
    assert time.monotonic() - started < 10
    done = run_cli("status", str(directory))
    assert done.returncode == 1 and "sql is not a folder" in " ".join(done.stderr.split()), done.stderr


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_taken_ipv6_port_is_named_in_brackets(tmp_path: Path) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = popen_cli(
            "serve", str(tmp_path / "s"), "--listen", f"tcp://[::1]:{port}", "--tokens", str(tokens),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert f"tcp://[::1]:{port}" in err.decode(), err
