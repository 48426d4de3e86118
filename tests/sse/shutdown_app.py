"""An app as docs/jobs.md shows it (one event_stream route, the store opened in the lifespan), for the test that
stops its uvicorn with SIGTERM while a stream is open."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tinystore
from tinystore.sse import SendEvent, event_stream, sse_response

stores: dict[str, tinystore.Store] = {}


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    stores["s"] = await tinystore.open(os.environ["SHUTDOWN_APP_DIR"])  # the sidecar: one per worker
    try:
        yield
    finally:
        await stores["s"].close()


async def events(request: Request) -> Response:
    return event_stream(stores["s"].channel("c").under(request.path_params["id"]), request)


async def flood(request: Request) -> Response:
    """Events of 60 KB, each awaited: a browser that reads nothing soon holds the stream's write."""

    sent_log = os.environ.get("FLOOD_SENT")  # (where the last event handed to the server is noted, when set)

    async def produce(send: SendEvent, closed: Any) -> None:
        for i in range(200):
            await send({"i": i, "pad": "p" * 60_000})
            if closed.is_set():
                break  # (handed to nobody: the stream ended)
            if sent_log:
                with open(sent_log, "w") as f:
                    f.write(str(i))
        await closed.wait()

    return sse_response(request, produce)


app = Starlette(routes=[Route("/events/{id}", events), Route("/flood", flood)], lifespan=lifespan)
