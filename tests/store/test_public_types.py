"""The public API as a typed user sees it: users' code checked with ``mypy --strict`` against ``src/``.

From trial U: a coroutine step was refused (API.md's own ``run.step("answer", lambda: model.answer(ask))``), a typed
channel or queue came back as ``Channel[Any]``/``Queue[Any]`` (so wrong payloads and handlers passed), ``tx.with_``
was ``Any``, correct code the docs show was refused (``after={(org, 7): id}``, ``keys=`` from a generator, migrations
as any ``os.PathLike`` or a tuple of pairs), and names of the API could not be imported from ``tinystore``.

Lines of ``BAD`` that end in ``# E`` must each get an error, and no other line may.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

SRC = Path(__file__).resolve().parents[2] / "src"

HEADER = """\
from __future__ import annotations

import dataclasses
import os
from collections.abc import Coroutine
from typing import Any

import msgspec

import tinystore
from tinystore.sse import event_stream
from tinystore import (
    ChannelIterator,
    Durability,
    Duration,
    Hold,
    JobError,
    JobState,
    StoreClock,
    TxChannel,
    TxQueue,
)


@dataclasses.dataclass
class ChatEvent:
    kind: str
    id: int


class Ask(msgspec.Struct):
    chat_id: int


class Model:
    async def answer(self, ask: Ask) -> str:
        return "ok"


class Folder(os.PathLike[str]):
    def __fspath__(self) -> str:
        return "./migrations"

"""

GOOD = """\
async def handler(ask: Ask, run: tinystore.Run) -> str:
    model = Model()
    text = await run.step("answer", lambda: model.answer(ask), type=str)
    n: int = await run.step("count", lambda: 3, type=int)
    anything: Any = await run.step("raw", lambda: {"a": 1})
    return text + str(n) + str(anything)


async def main(store: tinystore.Store, db: tinystore.Database) -> None:
    events = store.channel("chat-events", ChatEvent)
    await events.publish(ChatEvent("joined", 1))
    async for m in events.each():
        kind: str = m.value.kind
        print(kind)
    raw = store.channel("raw")
    await raw.publish({"any": ["json"]})
    asks = store.queue("asks", Ask, attempts=5, lease="30s", backoff=("1s", "1m"))
    asks.work(handler, concurrency=4)
    await asks.add(Ask(chat_id=1))
    await asks.add_many([Ask(chat_id=i) for i in range(3)], keys=(f"ask/{i}" for i in range(3)))
    job = await asks.get("some-id")
    if job is not None:
        chat_id: int = job.value.chat_id
        state: JobState = job.state
        errors: list[JobError] = job.errors
        print(chat_id, state, errors)
    page = await asks.list(state="stuck")
    print(page)

    async def save(tx: tinystore.SqlTx) -> int:
        bound: TxChannel[ChatEvent] = tx.with_(events)
        await bound.publish(ChatEvent("saved", 2))
        queued: TxQueue[Ask] = tx.with_(asks)
        await queued.add(Ask(chat_id=2))
        return 1

    one: int = await db.tx(save)
    print(one)

    async def insert(tx: tinystore.SqlTx) -> Coroutine[Any, Any, tinystore.Done]:
        return tx.exec("insert into t values (1)")  # (not awaited: db.tx awaits it; trial FR)

    inserted: tinystore.Done = await db.tx(insert)
    print(inserted.changes)
    clock: StoreClock = store.clock  # trial EL: the types of store.clock and of a lock's hold had no public name
    holding: Hold[tinystore.Lease | None] = store.lock("reports").try_hold("q3")
    print(clock, holding)
    done: tinystore.Done = await db.tx(lambda tx: tx.exec("insert into t values (1)"))
    job_id: str = await db.tx(lambda tx: tx.with_(asks).add(Ask(chat_id=7)))
    print(done, job_id)
    sub = await events.subscribe(lambda m: None, recursive=True, after={("org-1", 7): "1-1", "org-2": "2-1"})
    await sub.stop()
    it: ChannelIterator[ChatEvent] = events.each()
    print(it)
    await store.database("app", migrations=Folder())
    await store.database("app", migrations=(("001.sql", "create table t (a)"),))
    mode: Durability = "os"
    wait: Duration = "30s"
    other = await tinystore.open("./data", durability=mode, private=True, reconnect_timeout=wait)
    await other.close()
"""

BAD = """\
async def other(value: ChatEvent, run: tinystore.Run) -> None: ...


async def main(store: tinystore.Store) -> None:
    events = store.channel("chat-events", ChatEvent)
    await events.publish({"kind": 1})  # E
    async for m in events.each():
        print(m.value.no_such_field)  # E
    asks = store.queue("asks", Ask, attemps=5)  # E
    good = store.queue("asks", Ask)
    good.work(other)  # E
    await good.add(ChatEvent("x", 1))  # E
    job = await good.get("id")
    if job is not None and job.state == "completed":  # E
        pass
    await good.list(state="done")  # E
    await tinystore.open("./data", durability="fast")  # E
    print(asks)


async def in_tx(store: tinystore.Store, db: tinystore.Database, request: Any) -> None:
    # trial EL: a lambda that returns a coroutine made db.tx's result Any, and event_stream's messages were Any
    good = store.queue("asks", Ask)
    done = await db.tx(lambda tx: tx.exec("insert into t values (1)"))
    print(done.no_such_field)  # E
    job_id = await db.tx(lambda tx: tx.with_(good).add(Ask(chat_id=7), key="ask/7"))
    print(job_id + 1)  # E
    row = await db.tx(lambda tx: tx.one(Ask, "select 1 as chat_id"))
    print(row.chat_id if row is not None else 0, row.no_such_field if row else 0)  # E
    events = store.channel("chat-events", ChatEvent)
    event_stream(events.under(7), request, event=lambda m: m.value.knid)  # E
    event_stream(events, request, data=lambda m: m.value.kind + 1)  # E
    await db.tx(lambda tx: 3)  # E


async def misused(store: tinystore.Store) -> None:
    # trial FR: both passed mypy and pyright, and raised TypeError
    lease = await store.lock("l").hold(1)  # E
    with store.lock("l").hold(1):  # E
        pass
    print(lease)


async def events_of(store: tinystore.Store) -> None:
    # trial FR: a job event's kind and state were plain str
    async for m in store.channel("tinystore-jobs", tinystore.JobEvent).each():
        if m.value.kind == "done" or m.value.state == "completed":  # E
            pass
"""


def run_mypy(tmp_path: Path, body: str) -> list[str]:
    """mypy's errors for ``body`` (after HEADER), run in a process of its own (in this one, mypy would raise the
    recursion limit for every later test)."""
    source = tmp_path / "user_code.py"
    source.write_text(HEADER + textwrap.dedent(body))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--python-version",
            "3.11",
            source.name,
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1) and not done.stderr, done.stderr
    return [line for line in done.stdout.splitlines() if ": error:" in line]


def test_typed_users_code_that_runs_passes_mypy_strict(tmp_path: Path) -> None:
    errors = run_mypy(tmp_path, GOOD)
    assert errors == [], "\n".join(errors)


def test_wrong_payloads_handlers_options_and_states_are_mypy_errors(tmp_path: Path) -> None:
    errors = run_mypy(tmp_path, BAD)
    offset = HEADER.count("\n")
    expected = {offset + n for n, line in enumerate(BAD.splitlines(), 1) if line.endswith("# E")}
    got = {int(m.group(1)) for e in errors if (m := re.search(r"user_code\.py:(\d+):", e))}
    assert got == expected, "\n".join(errors)
