"""Jobs: jobs added per second (single adds; batches in one transaction) and end-to-end no-op jobs per second.

    python bench/jobs.py [--quick] [--only a,b] [--out FILE]

- add_N: N concurrent callers each adding one job at a time: jobs per second.
- add_many_100: 100 jobs in one call, one transaction (ours: queue.add_many; the original: store.tx with
  tx.with_(queue).add, kept for one commit): jobs per second.
- add_tx_100: 100 jobs added inside one transaction of an application database, its queue in that file
  (ours: store.queue(..., database=db); the original: db.queue(...)): jobs per second.
- end_to_end: a worker of concurrency 8 runs; 8 producers add no-op jobs (6,000; 300 with --quick); jobs per
  second from the first add to the last job run. end_to_end_adds: the producers' add rate meanwhile.
- pickup_p50_us, pickup_p99_us: an idle worker of concurrency 1; one job added at a time (300; 30 with
  --quick), 2 ms after the last one started: from just before the add to the handler's start.

Systems: tinystore embedded and sidecar (ours; durability "full", each add on disk when it returns), the
original's embedded mode and sidecar (its jobs commit "full" by default), Huey with its SQLite storage
(SqliteHuey, fsync=True, a thread consumer of 8 workers in this process), and arq on a redis-server of this
run (unix socket, no persistence: its adds are not durable; an in-process worker, max_jobs=8, poll_delay
0.005 s instead of 0.5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from typing import Any

from common import RedisServer, Sizes, rate, redis_server, soft, temp_dir, thread_rate
from workloads import (
    ADD_CALLERS,
    BATCH,
    PRODUCERS,
    WORKER_CONCURRENCY,
    Starts,
    case_timeout,
    e2e_jobs,
    measure_tinystore,
    pickup_latency,
    pickups,
)

SYSTEMS = ["tinystore_embedded", "tinystore_sidecar", "huey", "arq", "original_embedded", "original_sidecar"]
GOAL = "jobs: end-to-end >= 3x Huey's, >= the Redis-based queue's (arq), >= 2x original's, with durable commits"
CHECKS = [
    check
    for mode in ("embedded", "sidecar")
    for check in (
        (f"{mode} end-to-end >= 3x huey", f"tinystore_{mode}", "end_to_end", "huey", "end_to_end", 3.0),
        (f"{mode} end-to-end >= arq", f"tinystore_{mode}", "end_to_end", "arq", "end_to_end", 1.0),
        (
            f"{mode} end-to-end >= 2x original {mode}",
            f"tinystore_{mode}",
            "end_to_end",
            f"original_{mode}",
            "end_to_end",
            2.0,
        ),
    )
]
ARQ_POLL_DELAY = 0.005
HUEY_CONSUMER = {
    "workers": WORKER_CONCURRENCY,
    "worker_type": "thread",
    "periodic": False,
    "initial_delay": 0.005,
    "backoff": 1.15,
    "max_delay": 0.05,
    "check_worker_health": False,
}


async def measure(system: str, sizes: Sizes) -> dict[str, Any]:
    result = await measure_tinystore("jobs", system, sizes)
    if result is not None:
        return result
    if system == "huey":
        return await huey_load(sizes)
    if system == "arq":
        with redis_server() as server:
            return await arq_load(server, sizes)
    raise ValueError(system)


# ---------------------------------------------------------------- Huey


async def huey_load(sizes: Sizes) -> dict[str, Any]:
    import huey
    from huey import SqliteHuey

    results: dict[str, Any] = {
        "version": huey.__version__,
        f"add_many_{BATCH}": {
            "unavailable": "Huey enqueues one task per call: no documented API adds several in one transaction"
        },
        f"add_tx_{BATCH}": {
            "unavailable": "Huey keeps its tasks in its own storage: it cannot add a task "
            "in a transaction of the application's database"
        },
    }
    timeout = case_timeout(sizes)
    with temp_dir() as directory:
        queue = SqliteHuey("bench", filename=str(directory / "huey.db"), fsync=True)
        ran = [0]
        target = [0]
        counted = threading.Lock()
        finished = threading.Event()

        @queue.task()
        def noop(n: int) -> None:
            with counted:
                ran[0] += 1
                if ran[0] >= target[0]:
                    finished.set()

        for callers in ADD_CALLERS:
            await soft(
                results,
                f"add_{callers}",
                asyncio.to_thread(thread_rate, noop, callers, sizes.seconds, sizes.warmup),
                timeout,
            )
        queue.flush()

        async def end_to_end() -> dict[str, Any]:
            total = e2e_jobs(sizes)
            target[0] = total
            consumer = _start_consumer(queue, HUEY_CONSUMER)
            try:
                start = time.perf_counter()

                def produce(p: int) -> None:
                    for i in range(p, total, PRODUCERS):
                        noop(i)

                producers = [asyncio.to_thread(produce, p) for p in range(PRODUCERS)]
                await asyncio.gather(*producers)
                added = time.perf_counter() - start
                await asyncio.to_thread(finished.wait, 60)
                elapsed = time.perf_counter() - start
            finally:
                await asyncio.to_thread(consumer.stop, True)
            return _e2e(ran[0], total, elapsed, added)

        await soft(results, "end_to_end", end_to_end(), timeout + 60)

        starts = Starts(threaded=True)

        @queue.task()
        def mark(n: int) -> None:
            starts.mark()

        async def pickup() -> dict[str, Any]:
            consumer = _start_consumer(queue, {**HUEY_CONSUMER, "workers": 1})
            try:
                return await pickup_latency(pickups(sizes), lambda i: asyncio.to_thread(mark, i), starts)
            finally:
                await asyncio.to_thread(consumer.stop, True)

        await soft(results, "pickup", pickup(), timeout + 60)
    return results


def _start_consumer(queue: Any, options: dict[str, Any]) -> Any:
    """A Huey consumer of ``queue``, started in this process's threads (its signal handlers undone: this process
    keeps its own)."""
    consumer = queue.create_consumer(**options)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    consumer.start()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    return consumer


def _e2e(ran: int, total: int, elapsed: float, added: float) -> dict[str, Any]:
    out: dict[str, Any] = {"end_to_end": round(ran / elapsed, 1), "end_to_end_adds": round(total / added, 1)}
    if ran < total:
        out["end_to_end_incomplete"] = f"{ran} of {total}"
    return out


# ---------------------------------------------------------------- arq


async def arq_load(server: RedisServer, sizes: Sizes) -> dict[str, Any]:
    import arq
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    results: dict[str, Any] = {
        "version": f"arq {arq.VERSION}, {server.version}",
        f"add_many_{BATCH}": {
            "unavailable": "arq enqueues one job per enqueue_job call: no documented API "
            "adds several in one transaction"
        },
        f"add_tx_{BATCH}": {
            "unavailable": "arq keeps its jobs in Redis: it cannot add a job in a "
            "transaction of the application's database"
        },
    }
    timeout = case_timeout(sizes)
    settings = RedisSettings(unix_socket_path=server.unix_socket)
    pool = await create_pool(settings)
    try:

        async def add(i: int) -> None:
            await pool.enqueue_job("noop", i)

        for callers in ADD_CALLERS:
            await soft(results, f"add_{callers}", rate(add, callers, sizes.seconds, sizes.warmup), timeout)
        await pool.flushall()

        async def end_to_end() -> dict[str, Any]:
            total = e2e_jobs(sizes)
            ran = 0
            finished = asyncio.Event()

            async def noop(ctx: Any, n: int) -> None:
                nonlocal ran
                ran += 1
                if ran >= total:
                    finished.set()

            worker = Worker(
                functions=[func(noop, name="noop")],
                redis_settings=settings,
                handle_signals=False,
                max_jobs=WORKER_CONCURRENCY,
                poll_delay=ARQ_POLL_DELAY,
            )
            running = asyncio.create_task(worker.async_run())
            try:
                start = time.perf_counter()

                async def producer(p: int) -> None:
                    for i in range(p, total, PRODUCERS):
                        await pool.enqueue_job("noop", i)

                await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
                added = time.perf_counter() - start
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(60):
                        await finished.wait()
                elapsed = time.perf_counter() - start
            finally:
                running.cancel()
                # close() cancels the worker's job tasks; a CancelledError of theirs may come out of it
                await asyncio.gather(running, worker.close(), return_exceptions=True)
            return _e2e(ran, total, elapsed, added)

        await soft(results, "end_to_end", end_to_end(), timeout + 60)

        async def pickup() -> dict[str, Any]:
            starts = Starts()

            async def mark(ctx: Any, n: int) -> None:
                starts.mark()

            worker = Worker(
                functions=[func(mark, name="mark")],
                redis_settings=settings,
                handle_signals=False,
                max_jobs=1,
                poll_delay=ARQ_POLL_DELAY,
            )
            running = asyncio.create_task(worker.async_run())
            try:
                return await pickup_latency(pickups(sizes), lambda i: pool.enqueue_job("mark", i), starts)
            finally:
                running.cancel()
                await asyncio.gather(running, worker.close(), return_exceptions=True)

        await soft(results, "pickup", pickup(), timeout + 60)
    finally:
        await pool.aclose()
    return results


if __name__ == "__main__":
    from common import run_benchmark

    run_benchmark(
        "jobs",
        __doc__ or "",
        SYSTEMS,
        measure,
        goal=GOAL,
        checks=CHECKS,
        units={
            "add_N": "jobs added per second, N concurrent callers, one job a call",
            f"add_many_{BATCH}": f"jobs added per second, {BATCH} in one call and transaction",
            f"add_tx_{BATCH}": f"jobs added per second, {BATCH} inside one application-database transaction",
            "end_to_end": "no-op jobs added and run per second, worker running meanwhile",
            "end_to_end_adds": "the producers' adds per second in the same run",
            "pickup_pN_us": "an idle worker: microseconds from just before an add to its handler's start",
        },
        params={
            "add_callers": list(ADD_CALLERS),
            "batch": BATCH,
            "worker_concurrency": WORKER_CONCURRENCY,
            "producers": PRODUCERS,
            "huey": {"storage": "SqliteHuey(fsync=True)", "consumer": HUEY_CONSUMER},
            "arq": {"max_jobs": WORKER_CONCURRENCY, "poll_delay": ARQ_POLL_DELAY, "durable": False},
            "tinystore_durability": "full (the default)",
        },
    )
