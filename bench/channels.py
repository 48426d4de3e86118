"""Channels: messages delivered per second to 1 and 16 subscribers, publish-to-handler latency, live updates.

    python bench/channels.py [--quick] [--only a,b] [--out FILE]

- delivered_N: 8 publishing tasks send 64-byte values, never more than 256 ahead of the slowest of N
  subscribers (the same back-pressure for every system, so nothing is dropped); messages handled per second,
  summed over the subscribers, from the first publish to the last delivery. published_N: publishes per second.
- latency_N_p50_us / _p99_us: one message at a time, the next once all N subscribers have it; from just
  before publish to each handler.
- live_N: the seed's "live updates": a transaction inserts a row and publishes at its commit, one listener,
  N concurrent callers; live_N_latency_*: from the transaction's start to the listener's handler.

Systems: tinystore embedded and sidecar (ours), the original's sidecar and embedded mode, and Redis pub/sub
through redis-py with hiredis (a redis-server of this run on a unix socket, no persistence; for live updates
the peer is aiosqlite (WAL, synchronous=FULL) committing the row, then a Redis PUBLISH).
"""

from __future__ import annotations

import asyncio
from typing import Any

from common import RedisServer, Sizes, redis_server, soft, temp_dir
from workloads import (
    LIVE_CALLERS,
    LIVE_INSERT,
    LIVE_TABLE,
    SUBSCRIBERS,
    case_timeout,
    delivery,
    latency,
    live_updates,
    live_value,
    measure_tinystore,
)

SYSTEMS = ["tinystore_embedded", "tinystore_sidecar", "redis", "original_embedded", "original_sidecar"]
GOAL = "sidecar delivery rate >= Redis's and >= original's, p99 no worse"
CHECKS = [
    (
        f"sidecar delivery ({n} sub) >= {peer}",
        "tinystore_sidecar",
        f"delivered_{n}",
        peer,
        f"delivered_{n}",
        1.0,
    )
    for peer in ("redis", "original_sidecar")
    for n in SUBSCRIBERS
] + [
    (
        f"sidecar p99 latency ({n} sub) <= {peer}",
        "tinystore_sidecar",
        f"latency_{n}_p99_us",
        peer,
        f"latency_{n}_p99_us",
        1.0,
    )
    for peer in ("redis", "original_sidecar")
    for n in SUBSCRIBERS
]


async def measure(system: str, sizes: Sizes) -> dict[str, Any]:
    result = await measure_tinystore("channels", system, sizes)
    if result is not None:
        return result
    if system == "redis":
        with redis_server() as server:
            return await redis_load(server, sizes)
    raise ValueError(system)


class RedisMessage:
    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value


class RedisSubscription:
    def __init__(self, pubsub: Any, reader: asyncio.Task[None]) -> None:
        self.pubsub = pubsub
        self.reader = reader

    async def stop(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.pubsub.aclose()


class RedisBranch:
    """A Redis pub/sub channel in the shape of a TinyStore branch: publish(value), subscribe(handler).

    Each subscriber has its own connection, as redis-py's PubSub does.
    """

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    async def publish(self, value: str) -> None:
        await self.client.publish(self.name, value)

    async def subscribe(self, handler: Any, on_missed: Any = None) -> RedisSubscription:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(self.name)
        while True:  # once confirmed, every later publish reaches it
            confirmation = await pubsub.get_message(timeout=5)
            if confirmation is None:
                raise RuntimeError(f"redis did not confirm SUBSCRIBE {self.name}")
            if confirmation["type"] == "subscribe":
                break
        return RedisSubscription(pubsub, asyncio.create_task(self._read(pubsub, handler)))

    @staticmethod
    async def _read(pubsub: Any, handler: Any) -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                handler(RedisMessage(message["data"]))


async def redis_load(server: RedisServer, sizes: Sizes) -> dict[str, Any]:
    import aiosqlite
    import redis
    import redis.asyncio as aioredis
    from redis.utils import HIREDIS_AVAILABLE

    results: dict[str, Any] = {
        "version": f"redis-py {redis.__version__}, hiredis {HIREDIS_AVAILABLE}, {server.version}",
        "live_peer": "aiosqlite commit (WAL, synchronous=FULL), then PUBLISH",
    }
    timeout = case_timeout(sizes)
    client = aioredis.Redis(unix_socket_path=server.unix_socket)
    try:
        await client.ping()
        await delivery(RedisBranch(client, "warmup"), 1, sizes.warmup)
        for n in SUBSCRIBERS:
            await soft(
                results,
                f"delivered_{n}",
                delivery(RedisBranch(client, f"rate-{n}"), n, sizes.seconds),
                timeout,
            )
        for n in SUBSCRIBERS:
            await soft(
                results,
                f"latency_{n}",
                latency(RedisBranch(client, f"latency-{n}"), n, sizes.seconds),
                timeout,
            )
        with temp_dir() as directory:
            async with aiosqlite.connect(directory / "live.db") as db:
                for statement in ("pragma journal_mode=wal", "pragma synchronous=full", LIVE_TABLE):
                    await db.execute(statement)
                await db.commit()
                for callers in LIVE_CALLERS:
                    name = f"live-{callers}"

                    async def commit_and_publish(started_ns: int, name: str = name, chat_id: int = callers) -> None:
                        cursor = await db.execute(LIVE_INSERT, (chat_id, "hello"))
                        row_id = cursor.lastrowid or 0
                        await db.commit()
                        await client.publish(name, live_value(started_ns, row_id))

                    await soft(
                        results,
                        f"live_{callers}",
                        live_updates(RedisBranch(client, name), commit_and_publish, callers, sizes),
                        timeout,
                    )
    finally:
        await client.aclose()
    return results


if __name__ == "__main__":
    from common import run_benchmark
    from workloads import PUBLISHERS, VALUE_BYTES, WINDOW

    run_benchmark(
        "channels",
        __doc__ or "",
        SYSTEMS,
        measure,
        goal=GOAL,
        checks=CHECKS,
        units={
            "delivered_N": "messages handled per second, summed over N subscribers",
            "published_N": "publishes per second in the same run",
            "missed_N": "messages the subscribers were told they missed",
            "latency_N_pXX_us": "publish-to-handler, microseconds",
            "live_N": "transactions (insert + publish) per second with N callers",
            "live_N_latency_pXX_us": "transaction start to the listener's handler, microseconds",
        },
        params={
            "value_bytes": VALUE_BYTES,
            "subscribers": list(SUBSCRIBERS),
            "publishers": PUBLISHERS,
            "window": WINDOW,
            "live_callers": list(LIVE_CALLERS),
        },
    )
