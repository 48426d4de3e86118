"""A lock holder in a process of its own, for the freeze and fault tests: ``python -m tests.locks.actor JSON``.

It reaches the store of ``dir`` as any other process would (``tinystore.open(dir)``: the directory's server,
or a sidecar it starts) and prints one JSON object a line on stdout for each thing that happens to it.

Modes (``mode`` in the JSON):

- ``freeze``: hold ``key`` of ``lock`` (``ttl``) and sleep in the block, its loop alive and renewing, until
  the lease is lost (the test stops this process with SIGSTOP for longer than the ttl). Then, as a holder
  that woke up would, it renews and releases its lease by id (``renew``, ``release`` events).
- ``fenced``: hold the key, then block the loop in synchronous work (reading a line of stdin, as a long
  computation or a GC pause would; the test adds SIGSTOP), then write the seed's fenced update with its fence.
- ``fault``: until ``until`` (a Unix time), hold the counter's key and increment the counter row through a
  fenced write (``counter`` events: the fence and whether the write was accepted), whatever befalls it.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import tinystore
from tinystore.protocol.locks import Release, Released, Renew, Renewed


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def freeze(store: tinystore.Store, cfg: dict[str, Any]) -> None:
    lock = store.lock(cfg["lock"], ttl=cfg["ttl"])
    lease_id = 0
    try:
        async with lock.hold(cfg["key"], wait=cfg.get("wait", 10)) as lease:
            lease_id = lease.id
            say(event="held", fence=str(lease.fence), lease=lease.id, pid=__import__("os").getpid())
            await asyncio.sleep(60)
    except tinystore.LostError as exc:
        say(event="lost", message=exc.message, lost_set=lease.lost.is_set())
    try:
        got = await store._call("locks.renew", Renew(lease=lease_id), Renewed)
        say(event="renew", code="ok", expires_at_ms=got.expires_at_ms)
    except tinystore.TinystoreError as exc:
        say(event="renew", code=exc.code, message=exc.message)
    released = await store._call("locks.release", Release(lease=lease_id), Released)
    say(event="release", released=released.released)


async def fenced(store: tinystore.Store, cfg: dict[str, Any]) -> None:
    db = await store.database(cfg["db"])
    lock = store.lock(cfg["lock"], ttl=cfg["ttl"])
    try:
        async with lock.hold(cfg["key"], wait=cfg.get("wait", 10)) as lease:
            fence = f"{lease.fence:040d}"
            say(event="held", fence=fence)
            sys.stdin.readline()  # synchronous work: the loop is blocked (and the test stops the process)
            done = await db.exec(
                "update chats set summary = ?, summary_fence = ? where id = ? and summary_fence < ?",
                cfg["summary"],
                fence,
                cfg["chat"],
                fence,
            )
            say(event="wrote", changes=done.changes)
    except tinystore.LostError as exc:
        say(event="lost", message=exc.message)


async def fault(store: tinystore.Store, cfg: dict[str, Any]) -> None:
    db = await store.database(cfg["db"])
    lock = store.lock("counter", ttl=cfg["ttl"])
    until = cfg["until"]
    while time.time() < until:
        fence = ""
        sent = False
        try:
            async with lock.hold("c", wait=cfg.get("wait", 3)) as lease:
                fence = f"{lease.fence:040d}"
                say(event="held", fence=fence)
                await asyncio.sleep(random.uniform(0, 0.02))
                time.sleep(random.uniform(0, 0.03))  # noqa: ASYNC251 -- synchronous work: a freeze here writes at once
                sent = True
                done = await db.exec(
                    "update counter set value = value + 1, fence = ? where id = 1 and fence < ?", fence, fence
                )
                say(event="counter", fence=fence, accepted=done.changes == 1)
        except tinystore.TinystoreError as exc:
            say(event="error", code=exc.code, fence=fence, message=exc.message[:200])
            if sent:
                say(event="counter", fence=fence, accepted=None)  # sent, its outcome unheard
            await asyncio.sleep(0.05)


async def main() -> None:
    cfg = json.loads(sys.argv[1])
    store = await tinystore.open(cfg["dir"])
    try:
        await {"freeze": freeze, "fenced": fenced, "fault": fault}[cfg["mode"]](store, cfg)
    finally:
        await store.close()
    say(event="done")


if __name__ == "__main__":
    asyncio.run(main())
