"""``tinystore lock DIR hold LOCK KEY -- COMMAND``: the command runs while the key is held, gets the fence, is
stopped when the lease is lost; ``tinystore status DIR`` lists the keys held and waited for."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store


async def cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tinystore",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.fixture
async def sidecar(tmp_path: Path) -> tinystore.Store:  # type: ignore[misc]
    async with open_store("sidecar", tmp_path / "store") as store:
        yield store


async def test_the_command_runs_holding_the_key_with_its_fence_and_its_exit_status(
    sidecar: tinystore.Store, tmp_path: Path
) -> None:
    directory = str(tmp_path / "store")
    done = tmp_path / "done"
    # (it runs until told: a second command started after a fixed while found the key free on a busy machine)
    script = f'echo "$TINYSTORE_FENCE"; while [ ! -e "{done}" ]; do sleep 0.05; done; exit 3'
    first = await cli("lock", directory, "hold", "cron", "nightly", "--", "sh", "-c", script)
    assert first.stdout is not None
    fence = int((await asyncio.wait_for(first.stdout.readline(), 20)).decode())
    assert fence >> 64 > 0
    # while it runs, the key is held: the status lists it, and a second run that will not wait fails
    status = await sidecar.status()
    rows = [r for r in status["locks"]["keys"] if r["lock"] == "cron"]
    assert rows and rows[0]["key"] == "nightly" and rows[0]["held"] == 1 and rows[0]["fences"] == [str(fence)]
    second = await cli("lock", directory, "hold", "cron", "nightly", "--wait", "0", "--", "echo", "twice")
    out, err = await asyncio.wait_for(second.communicate(), 20)
    assert second.returncode == 1 and out == b""
    assert b'error[in_use] lock cron: key "nightly": held (no wait)\n' in err
    done.touch()
    assert await asyncio.wait_for(first.wait(), 20) == 3
    # then it is free again
    async with sidecar.lock("cron").try_hold("nightly") as lease:
        assert lease is not None and lease.fence > fence


async def test_a_lost_lease_stops_the_command(sidecar: tinystore.Store, tmp_path: Path) -> None:
    directory = str(tmp_path / "store")
    script = 'trap "echo stopped; exit 7" TERM; echo started; while true; do sleep 0.05; done'
    holder = await cli(
        "lock", directory, "hold", "cron", "nightly", "--ttl", "1s", "--grace", "5s", "--", "sh", "-c", script
    )
    assert holder.stdout is not None and holder.stderr is not None
    assert (await asyncio.wait_for(holder.stdout.readline(), 20)).strip() == b"started"
    holder.send_signal(signal.SIGSTOP)  # the holder freezes (its command runs on): its lease runs out
    async with sidecar.lock("cron").hold("nightly", wait="5s") as lease:
        assert lease is not None
        holder.send_signal(signal.SIGCONT)
        out, err = await asyncio.wait_for(holder.communicate(), 20)
    assert out.strip() == b"stopped", (out, err)  # the command was told to stop (SIGTERM)
    assert holder.returncode == 1, (out, err)
    assert b"error[lost]" in err, (out, err)


async def test_status_lists_keys_held_and_waited_for(sidecar: tinystore.Store, tmp_path: Path) -> None:
    directory = str(tmp_path / "store")
    lock = sidecar.lock("summaries", ttl="30s")
    async with lock.hold(7):
        waiter = await cli("lock", directory, "hold", "summaries", "7", "--wait", "20s", "--", "true")
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            rows = (await sidecar.status())["locks"]["keys"]
            if rows and rows[0]["waiters"] == 1:
                break
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        shown = await cli("status", directory, "--json")
        out, _ = await asyncio.wait_for(shown.communicate(), 20)
        locks = json.loads(out)["locks"]
        assert locks["leases"] == 1 and locks["waiters"] == 1
        assert [(r["lock"], r["key"], r["held"], r["waiters"]) for r in locks["keys"]] == [("summaries", "7", 1, 1)]
        table = await cli("status", directory)
        out, _ = await asyncio.wait_for(table.communicate(), 20)
        assert b"locks: keys" in out and b"summaries" in out
    assert await asyncio.wait_for(waiter.wait(), 20) == 0


async def test_a_command_that_cannot_run_is_one_error_line(sidecar: tinystore.Store, tmp_path: Path) -> None:
    # from trial AX: it said "error: cannot run ..." with no code, unlike every other error of the command line
    proc = await cli("lock", str(tmp_path / "store"), "hold", "l", "k", "--", "/no/such/command")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 127
    assert err.decode().startswith("error[invalid] cannot run '/no/such/command': "), err
    assert err.decode().count("\n") == 1


@pytest.mark.parametrize(("ttl", "told"), [("nan", "lock l: --ttl: cannot read 'nan'"), ("0", "lock l: ttl 0s is")])
async def test_a_bad_ttl_is_worded_alike_however_it_is_bad(
    sidecar: tinystore.Store, tmp_path: Path, ttl: str, told: str
) -> None:
    # from trial DT: one that could not be read named the key as well ("lock l: key "k": --ttl: ..."), one out of
    # bounds did not ("lock l: ttl 0s is outside 1s .. 1h")
    proc = await cli("lock", str(tmp_path / "store"), "hold", "l", "k", "--ttl", ttl, "--", "true")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert err.decode().startswith(f"error[invalid] {told}"), err
