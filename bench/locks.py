"""Locks: uncontended hold-and-release cycles per second, and hand-over latency on one contended key.

    python bench/locks.py [--quick] [--only a,b] [--out FILE]

- hold_release_N: N concurrent callers, each holding and releasing a key of its own (uncontended), back to
  back: cycles per second in all.
- handover_p50_us / _p99_us: 8 tasks take one key in turn (each waits in line, holds, releases); the time
  from a holder's block end to the next holder's block start. handovers: holds per second.

Systems: tinystore embedded and sidecar (ours), the original's embedded mode and sidecar, and redis-py's
asyncio Lock on a redis-server of this run (unix socket, no persistence). A redis-py Lock waits by polling:
it tries again every `sleep` seconds (0.1 by default); this run uses sleep=0.001, its best hand-over.
"""

from __future__ import annotations

from typing import Any

from common import RedisServer, Sizes, rate, redis_server, soft
from workloads import CONTENDERS, LOCK_CALLERS, case_timeout, handover, measure_tinystore

SYSTEMS = ["tinystore_embedded", "tinystore_sidecar", "redis_lock", "original_embedded", "original_sidecar"]
GOAL = "locks: >= 1.5x the original's rate and above Redis's"
REDIS_SLEEP = 0.001
CHECKS = (
    [
        (
            f"{mode} hold/release ({n} callers) >= 1.5x original {mode}",
            f"tinystore_{mode}",
            f"hold_release_{n}",
            f"original_{mode}",
            f"hold_release_{n}",
            1.5,
        )
        for mode in ("embedded", "sidecar")
        for n in LOCK_CALLERS
    ]
    + [
        (
            f"{mode} hold/release ({n} callers) > redis Lock",
            f"tinystore_{mode}",
            f"hold_release_{n}",
            "redis_lock",
            f"hold_release_{n}",
            1.0,
        )
        for mode in ("embedded", "sidecar")
        for n in LOCK_CALLERS
    ]
    + [
        (
            f"{mode} hand-overs/s >= 1.5x original {mode}",
            f"tinystore_{mode}",
            "handovers",
            f"original_{mode}",
            "handovers",
            1.5,
        )
        for mode in ("embedded", "sidecar")
    ]
)


async def measure(system: str, sizes: Sizes) -> dict[str, Any]:
    result = await measure_tinystore("locks", system, sizes)
    if result is not None:
        return result
    if system == "redis_lock":
        with redis_server() as server:
            return await redis_lock_load(server, sizes)
    raise ValueError(system)


async def redis_lock_load(server: RedisServer, sizes: Sizes) -> dict[str, Any]:
    import redis
    import redis.asyncio as aioredis

    results: dict[str, Any] = {"version": f"redis-py {redis.__version__}, {server.version}"}
    client = aioredis.Redis(unix_socket_path=server.unix_socket)
    try:
        await client.ping()

        async def cycle(i: int) -> None:
            async with client.lock(f"own-{i}", timeout=30, sleep=REDIS_SLEEP, blocking_timeout=10):
                pass

        for callers in LOCK_CALLERS:
            await soft(
                results,
                f"hold_release_{callers}",
                rate(cycle, callers, sizes.seconds, sizes.warmup),
                case_timeout(sizes),
            )

        def hold() -> Any:
            return client.lock("hot", timeout=30, sleep=REDIS_SLEEP, blocking_timeout=60)

        await soft(results, "handover", handover(hold, sizes.seconds), case_timeout(sizes))
    finally:
        await client.aclose()
    return results


if __name__ == "__main__":
    from common import run_benchmark

    run_benchmark(
        "locks",
        __doc__ or "",
        SYSTEMS,
        measure,
        goal=GOAL,
        checks=CHECKS,
        units={
            "hold_release_N": "hold-and-release cycles per second, N callers on keys of their own",
            "handovers": "holds per second of one key taken in turn by 8 tasks",
            "handover_pXX_us": "a holder's block end to the next holder's block start, microseconds",
        },
        params={
            "callers": list(LOCK_CALLERS),
            "contenders": CONTENDERS,
            "ttl": "30s",
            "redis_lock": {"timeout": 30, "sleep": REDIS_SLEEP},
        },
    )
