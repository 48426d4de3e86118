"""The workloads measured on a TinyStore, ours (spec/API.md) or the original (PyPI tinyshed-tinystore).

Both have the same shape of API for what is measured here (open, database/exec/one/tx, channel/publish/
subscribe, lock/hold, queue/add/work), so one piece of code measures both; `Flavor` holds the few calls
that differ. Standard library only: bench/peers/original.py runs it under Python 3.12 in its own venv.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import Sizes, import_ours, latency_summary, log, open_store, rate, run_original, soft

# ---------------------------------------------------------------- what differs


class Flavor:
    """Our API (spec/API.md)."""

    name = "ours"

    def queue(self, store: Any, name: str, *, db: Any = None, concurrency: int = 1) -> Any:
        # the worker's concurrency is given to work(); database= keeps the jobs in that file
        if db is not None:
            return store.queue(name, database=db)
        return store.queue(name)

    async def add_many(self, store: Any, queue: Any, values: list[Any]) -> None:
        await queue.add_many(values)


class OriginalFlavor(Flavor):
    """The original's documented API: a queue in a database is db.queue(); its concurrency caps work()."""

    name = "original"

    def queue(self, store: Any, name: str, *, db: Any = None, concurrency: int = 1) -> Any:
        return (db if db is not None else store).queue(name, concurrency=concurrency)

    async def add_many(self, store: Any, queue: Any, values: list[Any]) -> None:
        # no add_many: store.tx keeps each add for one commit, all or none
        async def fill(tx: Any) -> None:
            q = tx.with_(queue)
            for value in values:
                await q.add(value)

        await store.tx(fill)


def case_timeout(sizes: Sizes) -> float:
    return 2 * (sizes.seconds + sizes.warmup) + 60


# ---------------------------------------------------------------- SQL

ROWS = 10_000
SQL_CALLERS = (1, 32)
SQL_SETUP = (
    "create table items (id integer primary key, name text not null, value integer not null)",
    "insert into items (id, name, value) select value, 'item-' || value, value * 7 from "
    "(with recursive c(value) as (select 1 union all select value + 1 from c where value < 10000) "
    "select value from c)",
    "create table log (id integer primary key, name text not null, value integer not null)",
)
POINT_READ = "select id, name, value from items where id = ?"
INSERT = "insert into log (name, value) values (?, ?)"


async def sql_load(store: Any, sizes: Sizes, flavor: Flavor) -> dict[str, Any]:
    results: dict[str, Any] = {}
    db = await store.database("bench")
    for statement in SQL_SETUP:
        await db.exec(statement)
    row = await db.one(POINT_READ, 42)
    if not row or row["name"] != "item-42":
        raise RuntimeError(f"point read of id 42 gave {row!r}")
    rng = random.Random(7)

    async def read(_: int) -> None:
        await db.one(POINT_READ, rng.randrange(1, ROWS + 1))

    async def insert(i: int) -> None:
        await db.exec(INSERT, "row", i)

    for callers in SQL_CALLERS:
        await soft(
            results,
            f"point_read_{callers}",
            rate(read, callers, sizes.seconds, sizes.warmup),
            case_timeout(sizes),
        )
    for callers in SQL_CALLERS:
        await soft(
            results,
            f"insert_{callers}",
            rate(insert, callers, sizes.seconds, sizes.warmup),
            case_timeout(sizes),
        )
    return results


# ---------------------------------------------------------------- channels

VALUE_BYTES = 64
SUBSCRIBERS = (1, 16)
PUBLISHERS = 8  # concurrent publishing tasks
WINDOW = 256  # publishers wait while the slowest subscriber is this far behind (below every log's size)
LIVE_CALLERS = (1, 16)


def stamped(ns: int | None = None) -> str:
    """A 64-byte value that carries the time it was sent (perf_counter_ns, this process)."""
    return f"{time.perf_counter_ns() if ns is None else ns:020d}".ljust(VALUE_BYTES, "x")


def sent_at(value: str) -> int:
    return int(value[:20])


class Listeners:
    """Counts what n subscribers got, and when the last delivery came; wakes who waits for a level."""

    def __init__(self, n: int) -> None:
        self.got = [0] * n
        self.missed = [0] * n
        self.last = 0.0
        self.latencies: list[float] | None = None
        self.progress = asyncio.Event()
        self.need: int | None = None  # the lowest level someone waits for

    def handler(self, i: int) -> Any:
        def on_message(m: Any) -> None:
            self.got[i] += 1
            self.last = time.perf_counter()
            if self.latencies is not None:
                self.latencies.append((time.perf_counter_ns() - sent_at(m.value)) / 1e9)
            self._wake()

        return on_message

    def on_missed(self, i: int) -> Any:
        def missed(notice: Any) -> None:
            self.missed[i] += getattr(notice, "count", None) or 0
            self._wake()

        return missed

    def handled_min(self) -> int:
        """Messages every subscriber has had (handled or told missed)."""
        return min(g + m for g, m in zip(self.got, self.missed, strict=True))

    def _wake(self) -> None:
        if self.need is not None and self.handled_min() >= self.need:
            self.need = None
            self.progress.set()

    async def reach(self, level: int) -> None:
        """Returns once every subscriber has had `level` messages."""
        while self.handled_min() < level:
            self.need = level if self.need is None else min(self.need, level)
            self.progress.clear()
            await self.progress.wait()

    async def until(self, level: int, within: float) -> None:
        async with asyncio.timeout(within):
            await self.reach(level)


async def subscribed(branch: Any, n: int) -> tuple[Listeners, list[Any]]:
    listeners = Listeners(n)
    subs = [await branch.subscribe(listeners.handler(i), on_missed=listeners.on_missed(i)) for i in range(n)]
    return listeners, subs


async def delivery(branch: Any, n: int, seconds: float) -> dict[str, Any]:
    """Publishers send 64-byte values for `seconds`, at most WINDOW ahead of the slowest subscriber."""
    listeners, subs = await subscribed(branch, n)
    published = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def publisher() -> None:
        nonlocal published
        while time.perf_counter() < deadline:
            await listeners.reach(published + 1 - WINDOW)
            published += 1
            await branch.publish(stamped())

    try:
        await asyncio.gather(*(publisher() for _ in range(PUBLISHERS)))
        await listeners.until(published, 30)
    finally:
        for sub in subs:
            await sub.stop()
    elapsed = (listeners.last or time.perf_counter()) - start
    got = sum(listeners.got)
    return {
        f"delivered_{n}": round(got / elapsed, 1),
        f"published_{n}": round(published / elapsed, 1),
        f"missed_{n}": sum(listeners.missed),
    }


async def latency(branch: Any, n: int, seconds: float) -> dict[str, Any]:
    """One message at a time, the next once every subscriber has it: publish-to-handler latency."""
    listeners, subs = await subscribed(branch, n)
    listeners.latencies = []
    sent = 0
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            await branch.publish(stamped())
            sent += 1
            await listeners.until(sent, 10)
    finally:
        for sub in subs:
            await sub.stop()
    return latency_summary(listeners.latencies, f"latency_{n}")


async def channels_load(store: Any, sizes: Sizes, flavor: Flavor) -> dict[str, Any]:
    results: dict[str, Any] = {}
    channel = store.channel("bench")
    timeout = case_timeout(sizes)
    await soft(results, "warmup", _discard(delivery(channel.under("warmup"), 1, sizes.warmup)), timeout)
    for n in SUBSCRIBERS:
        await soft(results, f"delivered_{n}", delivery(channel.under(f"rate-{n}"), n, sizes.seconds), timeout)
    for n in SUBSCRIBERS:
        await soft(results, f"latency_{n}", latency(channel.under(f"latency-{n}"), n, sizes.seconds), timeout)
    db = await store.database("live")
    await db.exec(LIVE_TABLE)
    events = store.channel("live")
    for callers in LIVE_CALLERS:
        commit = tinystore_commit_and_publish(db, events, callers)
        live = live_updates(events.under(callers), commit, callers, sizes)
        await soft(results, f"live_{callers}", live, timeout)
    return results


async def _discard(coro: Any) -> dict[str, Any]:
    await coro
    return {}


LIVE_TABLE = "create table messages (id integer primary key, chat_id integer not null, body text not null)"
LIVE_INSERT = "insert into messages (chat_id, body) values (?, ?)"


def live_value(started_ns: int, row_id: int) -> str:
    """64 bytes: when the transaction began, and the row's id."""
    return f"{started_ns:020d}-{row_id:043d}"


def tinystore_commit_and_publish(db: Any, events: Any, chat_id: int) -> Any:
    async def commit_and_publish(started_ns: int) -> None:
        async def save(tx: Any) -> None:
            done = await tx.exec(LIVE_INSERT, chat_id, "hello")
            await tx.with_(events).under(chat_id).publish(live_value(started_ns, done.last_insert_rowid))

        await db.tx(save)

    return commit_and_publish


async def live_updates(branch: Any, commit_and_publish: Any, callers: int, sizes: Sizes) -> dict[str, Any]:
    """The seed's pattern: insert a row and publish at its commit, one tab listening.

    `commit_and_publish(started_ns)` does one; latency runs from its start to the tab's handler.
    """
    listeners, subs = await subscribed(branch, 1)
    listeners.latencies = []
    commits = 0

    async def op(_: int) -> None:
        nonlocal commits
        await commit_and_publish(time.perf_counter_ns())
        commits += 1

    try:
        per_s = await rate(op, callers, sizes.seconds, sizes.warmup)
        await listeners.until(commits, 30)
    finally:
        for sub in subs:
            await sub.stop()
    out: dict[str, Any] = {f"live_{callers}": round(per_s, 1)}
    out.update(latency_summary(listeners.latencies, f"live_{callers}_latency"))
    if sum(listeners.got) != commits:
        out[f"live_{callers}_undelivered"] = commits - sum(listeners.got)
    return out


# ---------------------------------------------------------------- locks

LOCK_CALLERS = (1, 32)
CONTENDERS = 8


async def locks_load(store: Any, sizes: Sizes, flavor: Flavor) -> dict[str, Any]:
    results: dict[str, Any] = {}
    lock = store.lock("bench", ttl="30s")

    async def cycle(i: int) -> None:
        async with lock.hold(f"own-{i}") as lease:
            if lease is None:
                raise RuntimeError("hold gave no lease")

    for callers in LOCK_CALLERS:
        await soft(
            results,
            f"hold_release_{callers}",
            rate(cycle, callers, sizes.seconds, sizes.warmup),
            case_timeout(sizes),
        )
    await soft(
        results,
        "handover",
        handover(lambda: lock.hold("hot", wait="60s"), sizes.seconds),
        case_timeout(sizes),
    )
    return results


async def handover(hold: Any, seconds: float) -> dict[str, Any]:
    """CONTENDERS tasks take one key in turn: the time from a holder's block end to the next holder's start.

    `hold()` gives a fresh async context manager that holds the key. Works for any lock with that shape.
    """
    released: list[float | None] = [None]
    samples: list[float] = []
    holds = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def contender() -> None:
        nonlocal holds
        while time.perf_counter() < deadline:
            async with hold():
                now = time.perf_counter()
                if released[0] is not None:
                    samples.append(now - released[0])
                holds += 1
                released[0] = time.perf_counter()
            await asyncio.sleep(0)

    await asyncio.gather(*(contender() for _ in range(CONTENDERS)))
    out: dict[str, Any] = {"handovers": round(holds / (time.perf_counter() - start), 1)}
    out.update(latency_summary(samples, "handover"))
    return out


# ---------------------------------------------------------------- jobs

ADD_CALLERS = (1, 32)
BATCH = 100  # jobs added in one transaction
WORKER_CONCURRENCY = 8
PRODUCERS = 8


def e2e_jobs(sizes: Sizes) -> int:
    """Jobs of one end-to-end run: 6,000 take one to three seconds for most systems (2,000 took a third of a
    second for ours, too short for a steady figure on a noisy machine)."""
    return 300 if sizes.quick else 6000


async def jobs_load(store: Any, sizes: Sizes, flavor: Flavor) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timeout = case_timeout(sizes)
    adds = flavor.queue(store, "adds")

    async def add(i: int) -> None:
        await adds.add({"n": i})

    for callers in ADD_CALLERS:
        await soft(results, f"add_{callers}", rate(add, callers, sizes.seconds, sizes.warmup), timeout)

    async def add_many(_: int) -> None:
        await flavor.add_many(store, adds, [{"n": k} for k in range(BATCH)])

    async def add_many_rate() -> float:
        return BATCH * await rate(add_many, 1, sizes.seconds, sizes.warmup)

    await soft(results, f"add_many_{BATCH}", add_many_rate(), timeout)

    db = await store.database("app")
    in_db = flavor.queue(store, "in-db", db=db)

    async def add_in_tx(_: int) -> None:
        async def fill(tx: Any) -> None:
            queue = tx.with_(in_db)
            for k in range(BATCH):
                await queue.add({"n": k})

        await db.tx(fill)

    async def add_in_tx_rate() -> float:
        return BATCH * await rate(add_in_tx, 1, sizes.seconds, sizes.warmup)

    await soft(results, f"add_tx_{BATCH}", add_in_tx_rate(), timeout)
    await soft(results, "end_to_end", end_to_end(store, flavor, e2e_jobs(sizes)), timeout + 60)
    await soft(results, "pickup", pickup(store, flavor, pickups(sizes)), timeout + 60)
    return results


def pickups(sizes: Sizes) -> int:
    """Jobs of one pickup run, one at a time."""
    return 30 if sizes.quick else 300


PICKUP_PAUSE = 0.002
"""Seconds between a job's start and the next add: the worker is waiting again by then."""


class Starts:
    """When handlers started, one at a time: ``mark()`` from a handler, ``await next()`` for its time
    (``time.perf_counter``). ``threaded``: handlers run in other threads (Huey's consumer)."""

    def __init__(self, threaded: bool = False) -> None:
        self.event: asyncio.Event | threading.Event = threading.Event() if threaded else asyncio.Event()
        self.at = 0.0

    def mark(self) -> None:
        self.at = time.perf_counter()
        self.event.set()

    async def next(self) -> float:
        event = self.event
        if isinstance(event, threading.Event):
            if not await asyncio.to_thread(event.wait, 10):
                raise TimeoutError("a job did not start within 10 s")
        else:
            async with asyncio.timeout(10):
                await event.wait()
        event.clear()
        return self.at


async def pickup_latency(total: int, add: Callable[[int], Awaitable[object]], starts: Starts) -> dict[str, Any]:
    """``total`` jobs added one at a time to an idle worker, each :data:`PICKUP_PAUSE` after the last one started:
    ``pickup_p50_us`` and ``pickup_p99_us`` from just before the add to the handler's start."""
    waits: list[float] = []
    for i in range(total):
        await asyncio.sleep(PICKUP_PAUSE)
        t0 = time.perf_counter()
        await add(i)
        waits.append(await starts.next() - t0)
    return latency_summary(waits, "pickup")


async def pickup(store: Any, flavor: Flavor, total: int) -> dict[str, Any]:
    """:func:`pickup_latency` of an idle worker of concurrency 1, ours or the original's."""
    queue = flavor.queue(store, "pickup", concurrency=1)
    starts = Starts()

    async def handler(value: Any, run: Any) -> None:
        starts.mark()

    async def add(i: int) -> None:
        await queue.add({"n": i})

    worker = queue.work(handler, concurrency=1)
    if asyncio.iscoroutine(worker):
        worker = await worker
    try:
        return await pickup_latency(total, add, starts)
    finally:
        await worker.stop()


async def end_to_end(store: Any, flavor: Flavor, total: int) -> dict[str, Any]:
    """A worker runs; producers add `total` no-op jobs; jobs per second from the first add to the last run."""
    queue = flavor.queue(store, "e2e", concurrency=WORKER_CONCURRENCY)
    ran = 0
    finished = asyncio.Event()

    async def noop(value: Any, run: Any) -> None:
        nonlocal ran
        ran += 1
        if ran >= total:
            finished.set()

    worker = queue.work(noop, concurrency=WORKER_CONCURRENCY)
    if asyncio.iscoroutine(worker):
        worker = await worker
    try:
        start = time.perf_counter()

        async def producer(p: int) -> None:
            for i in range(p, total, PRODUCERS):
                await queue.add({"n": i})

        await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
        added = time.perf_counter() - start
        try:
            async with asyncio.timeout(60):
                await finished.wait()
        except TimeoutError:
            log(f"  end_to_end: {ran} of {total} jobs ran within 60 s after the adds")
        elapsed = time.perf_counter() - start
    finally:
        await worker.stop()
    out: dict[str, Any] = {"end_to_end": round(ran / elapsed, 1), "end_to_end_adds": round(total / added, 1)}
    if ran < total:
        out["end_to_end_incomplete"] = f"{ran} of {total}"
    return out


# ---------------------------------------------------------------- ours and the original, as systems

LOADS = {"sql": sql_load, "channels": channels_load, "locks": locks_load, "jobs": jobs_load}


async def measure_tinystore(bench: str, system: str, sizes: Sizes) -> dict[str, Any] | None:
    """tinystore_{embedded,sidecar} (ours, in this process) or original_{embedded,sidecar} (a subprocess).

    None for any other system.
    """
    load = LOADS[bench]
    if system.startswith("tinystore_"):
        ts = import_ours()
        async with open_store(ts, system.removeprefix("tinystore_")) as store:
            return await load(store, sizes, Flavor())
    if system.startswith("original_"):
        timeout = 12 * case_timeout(sizes)
        return await run_original(bench, system.removeprefix("original_"), sizes, timeout)
    return None
