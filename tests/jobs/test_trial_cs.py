"""Trial CS (several processes sharing a directory): a graceful stop longer than a lease, a worker stopped while its
server does not answer, and commands run side by side with no server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import tinystore
from tinystore.server import paths

from ..cli.support import cli_argv
from ..helpers import ServerProcess, open_store, stop_sidecar, write_tokens
from .util import wait_state

# (some 5 s on an idle machine, where 10,000,000 took 2.6 s, under the 3 s lease: the test showed nothing then)
SLOW = "with recursive c(i) as (select 1 union all select i + 1 from c where i < 20000000) select count(*) from c"


# contract: STORE-05
# contract: JOB-05
async def test_a_stop_longer_than_a_lease_does_not_lose_a_healthy_workers_attempt(tmp_path: Path) -> None:
    # the server refused renewals while it stopped, and its lease timers ran on: a stop that lasted longer than a
    # lease (a slow read under way) ended the running attempt "worker lost", dead with attempts=1
    directory = tmp_path / "s"
    server = ServerProcess(directory).start()
    store = await tinystore.open(directory, reconnect_timeout=60)
    other = await tinystore.open(directory)
    try:
        q = store.queue("mail", attempts=1, lease="2s")
        release = asyncio.Event()
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> str:
            started.set()
            await release.wait()
            return "sent"

        worker = q.work(handler)
        jid = await q.add({"to": "a@example.com"})
        await asyncio.wait_for(started.wait(), 10)
        db = await other.database("app")
        slow = asyncio.ensure_future(db.scalar(SLOW))  # (the stop lets it finish: the stop lasts as long)
        await asyncio.sleep(0.3)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        await asyncio.to_thread(server.proc.wait, 60)  # type: ignore[union-attr]
        took = time.monotonic() - began
        assert took > 2.5  # (longer than the lease: else this shows nothing)
        server = ServerProcess(directory).start()  # (at once: the worker reaches it within a lease)
        slow.cancel()  # (a read is sent again to the next server: not waited for)
        await asyncio.gather(slow, return_exceptions=True)
        release.set()
        job = await wait_state(q, jid, "succeeded", "failed", "dead", timeout=15)
        assert (job.state, job.attempts, job.result) == ("succeeded", 1, "sent"), job
        await worker.stop()
    finally:
        await other.close()
        await store.close()
        server.stop()


async def test_a_worker_stops_in_time_while_its_server_does_not_answer(tmp_path: Path) -> None:
    # worker.stop(grace="1s") took 35 s with the server frozen (its unwait and hand-back waited for the connection
    # to be found dead), and called the attempt reporting its end a handler that ignored its cancel
    directory = tmp_path / "s"
    async with open_store("sidecar", directory) as store:
        q = store.queue("mail")

        async def handler(value: Any, run: tinystore.Run) -> str:
            await asyncio.sleep(0.5)
            return "sent"

        worker = q.work(handler)
        jid = await q.add({"to": "a@example.com"})
        await asyncio.sleep(0.2)
        info = paths.read_address(directory)
        assert info is not None
        pid = int(info["pid"])
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(0.6)  # (the handler returns; its report waits for the server)
            began = time.monotonic()
            await worker.stop(grace="1s")
            assert time.monotonic() - began < 1 + 10 + 2  # grace + 10 s, and a moment (it was 35 s)
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_state(q, jid, "succeeded")  # the report goes through once the server answers
    await stop_sidecar(directory)


def test_commands_side_by_side_with_no_server(tmp_path: Path) -> None:
    # with no server, each command opens the store itself: three of four run together failed at once (in use)
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    d = str(directory)
    procs = [
        subprocess.Popen(cli_argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for args in (["status", d], ["status", d], ["jobs", d, "queues"], ["jobs", d, "queues"])
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors


# contract: JOB-05
async def test_a_worker_that_cannot_reach_a_next_server_stops_its_handler_before_the_next_attempt(
    tmp_path: Path,
) -> None:
    # (trial CT) after a graceful stop, a worker that could not reach the next server (another address, a network
    # cut) never gave its attempt up, and ran its handler on beside the job's next attempt: the lease counts from
    # the stopping server's last word. (trial CV) It looked at it every half lease: up to that much overlap
    directory = tmp_path / "s"
    tokens, admin, _ = write_tokens(tmp_path)
    servers = [ServerProcess(directory, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()]
    stores = [await tinystore.connect(servers[0].tcp, token=admin, reconnect_timeout=60)]
    running: dict[str, int] = {}
    overlaps: list[tuple[str, dict[str, int]]] = []
    started = asyncio.Event()

    def handler_of(name: str) -> Any:
        async def handler(value: Any, run: tinystore.Run) -> str:
            if running:
                overlaps.append((name, dict(running)))
            running[name] = run.attempt
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                running.pop(name, None)
            return "sent"

        return handler

    try:
        q1 = stores[0].queue("mail", attempts=3, lease="3s", backoff=("10ms", "10ms"))
        w1 = q1.work(handler_of("first"))
        jid = await q1.add({"to": "a@example.com"})
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(1.75)  # (three quarters into a renewal's cycle of a second)
        assert servers[0].stop() == 0
        # the next server, at another address: the first worker cannot reach it
        servers.append(ServerProcess(directory, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start())
        stores.append(await tinystore.connect(servers[1].tcp, token=admin))
        q2 = stores[1].queue("mail")
        w2 = q2.work(handler_of("second"))
        job = await wait_state(q2, jid, "running", timeout=5)
        for _ in range(200):
            job = await wait_state(q2, jid, "running", timeout=5)
            if job.attempts == 2 and "second" in running:
                break
            await asyncio.sleep(0.05)
        assert (job.attempts, list(running)) == (2, ["second"]), (job, running)
        assert not overlaps, overlaps  # the first handler had ended when the second began
        await w2.stop(grace=0)
        await w1.stop(grace=0)
    finally:
        for store in stores:
            await asyncio.wait_for(store.close(), 30)
        for server in servers:
            server.stop()
