"""Trial EG: a server under a memory limit (a container's) crashed (SIGSEGV) making a big answer: msgspec's encode to
bytes does when memory runs out as its buffer grows. It answers that call with an error now, and goes on."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess

BIG = (
    "with recursive c(x) as (select 1 union all select x + 1 from c where x < 60) "
    "select x, randomblob(1000000) as b from c"
)


def mapped(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


# contract: STORE-04
@pytest.mark.parametrize("room_mb", [10, 30, 60, 90])
async def test_a_server_short_of_memory_answers_a_big_read_with_an_error_and_goes_on(
    tmp_path: Path, room_mb: int
) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    client = await tinystore.open(directory, reconnect_timeout="3s")
    try:
        db = await client.database("app")
        assert await db.scalar("select 1") == 1
        assert server.proc is not None
        pid = server.proc.pid
        limit = mapped(pid) + room_mb * 1_000_000  # (room for the rows, not for them and their encoding too)
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        for _ in range(2):
            try:
                rows = await db.all(BIG)
            except (tinystore.UnavailableError, tinystore.LimitError) as exc:
                assert "out of memory" in str(exc)  # (making the answer, or SQLite's, running the statement)
            else:
                assert len(rows) == 60  # (room enough after all: no crash either)
            assert server.proc.poll() is None, (directory / "serve.log").read_text()[-3000:]
        assert await db.scalar("select 2") == 2
    finally:
        await client.close()
        server.stop()
    assert "Segmentation fault" not in (directory / "serve.log").read_text()
