"""SSE fan-out: open event streams one web process holds while a message fans out to all of them.

    python bench/sse.py [--quick] [--only a,b] [--out FILE]

One web process (uvicorn, uvloop, h11; its own process) serves N open event streams of one chat (N = 100 and
1,000), read by N HTTP clients in the benchmark's process. A publisher in the benchmark's process publishes
a small event ({"kind": "message", "n": ..., "t": ...}) one at a time; each is timed from just before the
publish to its arrival at each client (the same monotonic clock, one machine).

- last_N_p50_us / last_N_p99_us: over the events, the time until the LAST of the N streams has it.
- each_N_p50_us / each_N_p99_us: over every (event, stream) pair, the time until that stream has it.
- streams_N: streams that got every event (of N); lost_N: (event, stream) pairs that never arrived.
- rss_N_mb: the web process's resident memory with N streams open.

Systems:
- tinystore_embedded: the store inside the web process (serving its socket); the publisher connects to it
  and publishes on the channel; the web process serves tinystore.sse.event_stream(branch, request).
- tinystore_sidecar: the web process and the publisher both reach the directory's sidecar.
- sse_starlette_redis: sse-starlette's EventSourceResponse, each stream with its own Redis pub/sub
  subscription (redis-py asyncio + hiredis; the pattern of sse-starlette's examples); the publisher does
  PUBLISH. redis-server of this run on a unix socket, no persistence.
- sse_starlette_redis_shared: the same with one Redis subscription per process, fanned out in the process
  to a queue per stream (what a careful hand-written version does).

Goal: 1,000 streams with the last one's p99 under 250 ms, at least as good as the peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    BENCH,
    ROOT,
    Sizes,
    free_port,
    import_ours,
    latency_summary,
    log,
    redis_server,
    stop_servers_of,
    temp_dir,
)

SYSTEMS = ["tinystore_embedded", "tinystore_sidecar", "sse_starlette_redis", "sse_starlette_redis_shared"]
STREAMS = (100, 1000)
PEERS = ("sse_starlette_redis", "sse_starlette_redis_shared")
GOAL = "1,000 streams with the last one's p99 under 250 ms, at least as good as sse-starlette + Redis pub/sub"
CHANNEL = "chat-events"
BRANCH = "bench"
REDIS_CHANNEL = "chat-events:bench"
CHECKS = [
    (f"{mine} last-stream p99 at {n} streams <= {peer}", mine, f"last_{n}_p99_us", peer, f"last_{n}_p99_us", 1.0)
    for mine in ("tinystore_embedded", "tinystore_sidecar")
    for peer in PEERS
    for n in STREAMS
]


# ------------------------------------------------------------------------------------------ the web process


def serve_main(argv: list[str]) -> None:
    """``sse.py serve SYSTEM --port P --dir D [--redis SOCKET]``: the web process; prints ``ready`` once it
    serves, runs until SIGTERM."""
    import argparse

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route

    p = argparse.ArgumentParser()
    p.add_argument("system")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", default="")
    p.add_argument("--redis", default="")
    args = p.parse_args(argv)
    state: dict[str, Any] = {}

    if args.system.startswith("tinystore"):
        ts = import_ours()
        from tinystore.sse import event_stream

        async def events(request: Any) -> Any:
            return event_stream(state["branch"], request, event="message")

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> Any:
            embedded = args.system == "tinystore_embedded"
            store = await ts.open(args.dir, embedded=True) if embedded else await ts.open(args.dir, idle="0s")
            state["branch"] = store.channel(CHANNEL).under(BRANCH)
            try:
                yield
            finally:
                await store.close()

    else:
        import redis.asyncio as aioredis
        from sse_starlette.sse import EventSourceResponse

        shared = args.system == "sse_starlette_redis_shared"

        async def events(request: Any) -> Any:
            if shared:
                queue: asyncio.Queue[bytes] = asyncio.Queue()
                state["queues"].add(queue)

                async def gen() -> Any:
                    try:
                        while True:
                            yield {"event": "message", "data": (await queue.get()).decode()}
                    finally:
                        state["queues"].discard(queue)

                return EventSourceResponse(gen(), ping=15)

            async def gen_own() -> Any:
                pubsub = state["redis"].pubsub()
                await pubsub.subscribe(REDIS_CHANNEL)
                try:
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            yield {"event": "message", "data": message["data"].decode()}
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.unsubscribe(REDIS_CHANNEL)
                        await pubsub.aclose()

            return EventSourceResponse(gen_own(), ping=15)

        async def fan_out(pubsub: Any) -> None:
            async for message in pubsub.listen():
                if message["type"] == "message":
                    for q in state["queues"]:
                        q.put_nowait(message["data"])

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> Any:
            r = aioredis.Redis(unix_socket_path=args.redis)
            state["redis"] = r
            state["queues"] = set()
            task = None
            if shared:
                pubsub = r.pubsub()
                await pubsub.subscribe(REDIS_CHANNEL)
                task = asyncio.ensure_future(fan_out(pubsub))
            try:
                yield
            finally:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                await r.aclose()

    app = Starlette(routes=[Route("/events", events)], lifespan=lifespan)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="h11",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]

    def stop() -> None:
        if args.system.startswith("tinystore"):
            from tinystore.sse import end_streams

            end_streams()
        server.should_exit = True

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, stop)
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            sys.stdout.write("ready\n")
            sys.stdout.flush()
        await task

    import uvloop

    if os.environ.get("BENCH_SSE_GC_LOG"):  # report slow garbage collections of the web process
        import gc

        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[:] = [time.perf_counter()]
            elif started and (took := time.perf_counter() - started[0]) > 0.005:
                log(f"gc generation {info['generation']}: {took * 1000:.1f} ms, {info['collected']} collected")

        gc.callbacks.append(on_gc)
    profile = os.environ.get("BENCH_SSE_PROFILE")
    if profile:  # a cProfile of the web process, written at its end
        import cProfile

        with cProfile.Profile() as prof:
            uvloop.run(main())
        prof.dump_stats(profile)
    else:
        uvloop.run(main())


# ------------------------------------------------------------------------------------------ the clients


class Sink:
    """Arrivals of every event at every stream."""

    def __init__(self) -> None:
        self.arrivals: dict[int, list[float]] = {}
        self.waiters: dict[int, tuple[int, asyncio.Future[None]]] = {}
        self.lost_connections = 0

    def arrive(self, n: int, latency: float) -> None:
        got = self.arrivals.setdefault(n, [])
        got.append(latency)
        w = self.waiters.get(n)
        if w is not None and len(got) >= w[0] and not w[1].done():
            w[1].set_result(None)

    async def wait(self, n: int, count: int, timeout: float) -> bool:
        if len(self.arrivals.get(n, ())) >= count:
            return True
        fut = asyncio.get_running_loop().create_future()
        self.waiters[n] = (count, fut)
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiters.pop(n, None)


class Client(asyncio.Protocol):
    """One EventSource-like client: an HTTP/1.0 GET (no chunked encoding), reading ``data:`` lines."""

    def __init__(self, sink: Sink, request: bytes) -> None:
        self.sink = sink
        self.request = request
        self.buf = b""
        self.headers_done = False
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        buf = self.buf + data
        if not self.headers_done:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                self.buf = buf
                return
            status = buf[: buf.find(b"\r\n")]
            if b" 200 " not in status and not self.opened.done():
                self.opened.set_exception(RuntimeError(f"the stream answered {status.decode(errors='replace')}"))
            self.headers_done = True
            buf = buf[i + 4 :]
            if not self.opened.done():
                self.opened.set_result(None)
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                try:
                    value = json.loads(line[5:])
                    self.sink.arrive(int(value["n"]), now - float(value["t"]))
                except (ValueError, KeyError, TypeError):
                    pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.sink.lost_connections += 1
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("the stream closed before it opened"))


async def open_clients(port: int, n: int, sink: Sink) -> list[Client]:
    loop = asyncio.get_running_loop()
    request = b"GET /events HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
    clients: list[Client] = []
    for start in range(0, n, 100):
        batch = []
        for _ in range(min(100, n - start)):
            _, proto = await loop.create_connection(lambda: Client(sink, request), "127.0.0.1", port)
            batch.append(proto)
        await asyncio.wait_for(asyncio.gather(*(c.opened for c in batch)), 30)
        clients.extend(batch)
    return clients


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


# ------------------------------------------------------------------------------------------ one measurement


async def start_server(system: str, port: int, directory: Path, redis_socket: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(BENCH), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, str(Path(__file__).resolve()), "serve", system, "--port", str(port)]
    argv += ["--dir", str(directory), "--redis", redis_socket]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    if not line.startswith(b"ready"):
        proc.wait(10)
        raise RuntimeError(f"the {system} web process did not start (exit {proc.returncode})")
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def fan_out(system: str, n: int, events: int, redis_socket: str) -> dict[str, Any]:
    """N streams on one web process; `events` events published one at a time; the figures of this N."""
    with temp_dir("tsb-sse-") as directory:
        port = free_port()
        proc = await start_server(system, port, directory / "store", redis_socket)
        clients: list[Client] = []
        publisher: Any = None
        try:
            if system.startswith("tinystore"):
                ts = import_ours()
                publisher = await ts.open(str(directory / "store"))  # the web process's store, or the sidecar
                branch = publisher.channel(CHANNEL).under(BRANCH)

                async def publish(value: dict[str, Any]) -> None:
                    await branch.publish(value)
            else:
                import redis.asyncio as aioredis

                publisher = aioredis.Redis(unix_socket_path=redis_socket)

                async def publish(value: dict[str, Any]) -> None:
                    await publisher.publish(REDIS_CHANNEL, json.dumps(value))

            sink = Sink()
            clients = await open_clients(port, n, sink)
            # warm up until every stream is subscribed (the peer subscribes after its headers went out)
            k = -1
            deadline = time.monotonic() + 30
            while True:
                await publish({"kind": "message", "n": k, "t": time.monotonic()})
                if await sink.wait(k, n, 0.5) or time.monotonic() > deadline:
                    break
                k -= 1
            if len(sink.arrivals.get(k, ())) < n:
                raise RuntimeError(f"only {len(sink.arrivals.get(k, ()))} of {n} streams got the warm-up event")
            rss = rss_mb(proc.pid)
            last: list[float] = []
            each: list[float] = []
            for i in range(events):
                await publish({"kind": "message", "n": i, "t": time.monotonic()})
                await sink.wait(i, n, 10.0)
                got = sink.arrivals.get(i, [])
                each.extend(got)
                if len(got) == n:
                    last.append(max(got))
                await asyncio.sleep(0.02)
            complete = sum(1 for i in range(events) if len(sink.arrivals.get(i, ())) == n)
            lost = sum(n - len(sink.arrivals.get(i, ())) for i in range(events))
            out: dict[str, Any] = {
                f"streams_{n}": n if complete == events else n - max(0, lost),
                f"lost_{n}": lost,
                f"rss_{n}_mb": rss,
            }
            out.update(latency_summary(last, f"last_{n}"))
            out.update(latency_summary(each, f"each_{n}"))
            return out
        finally:
            for c in clients:
                if c.transport is not None:
                    c.transport.close()
            if publisher is not None:
                with contextlib.suppress(Exception):
                    await publisher.close() if system.startswith("tinystore") else await publisher.aclose()
            await asyncio.to_thread(stop_server, proc)
            await asyncio.to_thread(stop_servers_of, directory)


async def measure(system: str, sizes: Sizes) -> dict[str, Any]:
    events = 20 if sizes.quick else 60
    out: dict[str, Any] = {}
    peer = system in PEERS
    with redis_server() if peer else contextlib.nullcontext() as redis:
        for n in STREAMS:
            log(f"  {system}: {n} streams")
            out.update(await fan_out(system, n, events, redis.unix_socket if redis is not None else ""))
    if system.startswith("tinystore"):
        p99 = out.get("last_1000_p99_us")
        out["goal_1000_p99_under_250ms"] = p99 is not None and p99 < 250_000
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve_main(sys.argv[2:])
        sys.exit(0)
    from common import run_benchmark

    run_benchmark(
        "sse",
        __doc__ or "",
        SYSTEMS,
        measure,
        goal=GOAL,
        checks=CHECKS,
        units={
            "last_N_pXX_us": "from just before the publish until the last of N streams has the event, microseconds",
            "each_N_pXX_us": "from just before the publish until one stream has the event, microseconds",
            "streams_N": "open streams one web process held that got every event",
            "lost_N": "(event, stream) pairs that never arrived",
            "rss_N_mb": "the web process's resident memory with N streams open, MB",
        },
        params={"streams": list(STREAMS), "events_per_size": "20 with --quick, else 60", "http": "h11, HTTP/1.0"},
    )
