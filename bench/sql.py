"""SQL: point reads by primary key from a 10,000-row table, and single-row inserts, with 1 and 32 callers.

    python bench/sql.py [--quick] [--only a,b] [--out FILE]

Systems: tinystore embedded and sidecar (ours), aiosqlite, plain sqlite3 in this process (the limit),
and the original TinyStore's embedded mode and sidecar. Every insert is durable when it returns: ours and
the original commit with durability "full"; aiosqlite and sqlite3 run WAL with synchronous=FULL and commit.
Prints one JSON object: ops/s per system and the ratios ours / peer. sqlite3's `insert_batch_32` is the
ceiling of `insert_32`: 32 rows in each durable commit, as many as 32 waiting callers can share.
"""

from __future__ import annotations

import random
import sqlite3
import time
from typing import Any

from common import Sizes, rate, run_benchmark, soft, temp_dir
from workloads import INSERT, POINT_READ, ROWS, SQL_CALLERS, SQL_SETUP, case_timeout, measure_tinystore

SYSTEMS = [
    "tinystore_embedded",
    "tinystore_sidecar",
    "aiosqlite",
    "sqlite3",
    "original_embedded",
    "original_sidecar",
]
GOAL = (
    "embedded point reads >= 3x aiosqlite and >= 3x original embedded; sidecar point reads and inserts "
    "with 32 callers >= 2x aiosqlite and >= 2x original sidecar"
)
CHECKS = [
    (
        "embedded point reads (1 caller) >= 3x aiosqlite",
        "tinystore_embedded",
        "point_read_1",
        "aiosqlite",
        "point_read_1",
        3.0,
    ),
    (
        "embedded point reads (32 callers) >= 3x aiosqlite",
        "tinystore_embedded",
        "point_read_32",
        "aiosqlite",
        "point_read_32",
        3.0,
    ),
    (
        "embedded point reads (1 caller) >= 3x original embedded",
        "tinystore_embedded",
        "point_read_1",
        "original_embedded",
        "point_read_1",
        3.0,
    ),
    (
        "embedded point reads (32 callers) >= 3x original embedded",
        "tinystore_embedded",
        "point_read_32",
        "original_embedded",
        "point_read_32",
        3.0,
    ),
    (
        "sidecar point reads (32 callers) >= 2x aiosqlite",
        "tinystore_sidecar",
        "point_read_32",
        "aiosqlite",
        "point_read_32",
        2.0,
    ),
    (
        "sidecar inserts (32 callers) >= 2x aiosqlite",
        "tinystore_sidecar",
        "insert_32",
        "aiosqlite",
        "insert_32",
        2.0,
    ),
    (
        "sidecar point reads (32 callers) >= 2x original sidecar",
        "tinystore_sidecar",
        "point_read_32",
        "original_sidecar",
        "point_read_32",
        2.0,
    ),
    (
        "sidecar inserts (32 callers) >= 2x original sidecar",
        "tinystore_sidecar",
        "insert_32",
        "original_sidecar",
        "insert_32",
        2.0,
    ),
]
PRAGMAS = ("pragma journal_mode=wal", "pragma synchronous=full")
BATCH = 32  # rows a commit in sqlite3's insert_batch_32: what 32 callers waiting each for its insert can share


async def measure(system: str, sizes: Sizes) -> dict[str, Any]:
    result = await measure_tinystore("sql", system, sizes)
    if result is not None:
        return result
    if system == "aiosqlite":
        return await aiosqlite_load(sizes)
    if system == "sqlite3":
        return await sqlite3_load(sizes)
    raise ValueError(system)


async def aiosqlite_load(sizes: Sizes) -> dict[str, Any]:
    """One aiosqlite connection shared by the callers, as an application holds one."""
    import aiosqlite

    results: dict[str, Any] = {"version": aiosqlite.__version__}
    with temp_dir() as directory:
        async with aiosqlite.connect(directory / "bench.db") as db:
            db.row_factory = aiosqlite.Row
            for statement in (*PRAGMAS, *SQL_SETUP):
                await db.execute(statement)
            await db.commit()
            rng = random.Random(7)

            async def read(_: int) -> None:
                await db.execute_fetchall(POINT_READ, (rng.randrange(1, ROWS + 1),))

            async def insert(i: int) -> None:
                await db.execute(INSERT, ("row", i))
                await db.commit()

            await run_cases(results, read, insert, sizes)
    return results


async def sqlite3_load(sizes: Sizes) -> dict[str, Any]:
    """The standard library's sqlite3 called straight from the loop: no thread hop, no server (the limit).

    Its calls block the loop, so 32 callers run one after another: the same figure as 1.
    """
    results: dict[str, Any] = {"version": sqlite3.sqlite_version}
    with temp_dir() as directory:
        db = sqlite3.connect(directory / "bench.db")
        try:
            db.row_factory = sqlite3.Row
            for statement in (*PRAGMAS, *SQL_SETUP):
                db.execute(statement)
            db.commit()
            rng = random.Random(7)

            async def read(_: int) -> None:
                db.execute(POINT_READ, (rng.randrange(1, ROWS + 1),)).fetchone()

            async def insert(i: int) -> None:
                db.execute(INSERT, ("row", i))
                db.commit()

            await run_cases(results, read, insert, sizes)
            await soft(results, "insert_batch_32", batch_rate(db, sizes), case_timeout(sizes))
        finally:
            db.close()
    return results


async def batch_rate(db: sqlite3.Connection, sizes: Sizes) -> float:
    """Rows a second when every commit carries 32 inserts, called straight from the loop (no thread hop).

    The ceiling of any store whose 32 callers each wait for their own durable insert: a commit can hold no more
    than the 32 rows its waiting callers sent, and it costs one fsync.
    """

    def batches(seconds: float) -> tuple[int, float]:
        rows, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            with db:
                db.executemany(INSERT, [("row", i) for i in range(BATCH)])
            rows += BATCH
        return rows, time.perf_counter() - start

    batches(sizes.warmup)
    rows, elapsed = batches(sizes.seconds)
    return rows / elapsed if elapsed > 0 else 0.0


async def run_cases(results: dict[str, Any], read: Any, insert: Any, sizes: Sizes) -> None:
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


if __name__ == "__main__":
    run_benchmark(
        "sql",
        __doc__ or "",
        SYSTEMS,
        measure,
        goal=GOAL,
        checks=CHECKS,
        units={
            "point_read_N": "ops/s with N concurrent callers",
            "insert_N": "ops/s with N concurrent callers",
            "insert_batch_32": "sqlite3 only: rows/s, 32 rows a durable commit, no caller, no thread hop: the "
            "ceiling of insert_32 for any store that answers each insert after its own commit's fsync",
        },
        params={
            "rows": ROWS,
            "callers": list(SQL_CALLERS),
            "point_read": POINT_READ,
            "insert": INSERT,
            "peer_pragmas": list(PRAGMAS),
            "tinystore_durability": "full (the default)",
        },
    )
