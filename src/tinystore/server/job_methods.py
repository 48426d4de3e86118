"""Jobs methods: ``jobs.open``, ``jobs.add``, ``jobs.claim``, ``jobs.renew``, ``jobs.report`` and the rest
(see :mod:`tinystore.protocol.jobs`), mapped onto the :class:`~tinystore.engines.jobs.JobsEngine`."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ..engines.jobs import JOBS_DB, TABLE, JobsEngine
from ..engines.sql import SqlTx
from ..errors import PermissionDeniedError
from ..protocol.jobs import (
    Add,
    Claim,
    Claimed,
    Find,
    Get,
    JobRow,
    OpenQueue,
    Page,
    Progress,
    QueueInfo,
    Release,
    ReleaseClaim,
    Renew,
    Report,
    Step,
    Unwait,
    Wait,
)
from ..protocol.jobs import List as ListRequest
from ..protocol.store import Empty

if TYPE_CHECKING:
    from .core import Core, Session


def engine_of(core: Core) -> JobsEngine:
    """The store's jobs engine (installed by :func:`install`)."""
    engine: JobsEngine = core.engines["jobs"]
    return engine


def install(core: Core) -> None:
    from .core import Method

    def listened(channel: str, branch: tuple[str, ...]) -> bool:
        """Whether a job event on ``branch`` could reach anyone. The engine asks before it even encodes one: a
        busy queue would otherwise leave one lingering branch per job in memory, for events that no subscriber
        could ever get."""
        channels = getattr(core, "channels", None)
        if channels is None:
            return False
        has_listeners = getattr(channels, "has_listeners", None)
        return True if has_listeners is None else bool(has_listeners(channel, branch))

    def publish(channel: str, branch: tuple[str, ...], payload: bytes) -> object:
        """Hand a job event to the channels engine (only asked for one ``listened`` let through)."""
        channels = getattr(core, "channels", None)
        return None if channels is None else channels.publish(channel, branch, payload)

    engine = JobsEngine(
        core.sql, core.clock, core.limits, publish=publish, listened=listened, spawn=core.spawn, epoch=core.epoch
    )
    core.engines["jobs"] = engine

    def own_tx(session: Session, tx_id: int) -> SqlTx:
        tx = core.sql.transactions.get(tx_id)
        if tx is None or tx_id not in session.transactions:
            raise core.sql.not_open(tx_id)
        return tx

    async def open_(session: Session, req: OpenQueue) -> QueueInfo:
        database = req.options.database
        if session.capability != "admin" and database is not None and database != JOBS_DB:
            await schema_guard(session, req.queue, database)
        info = await engine.open_queue(req.queue, req.options)
        if database is not None and database != JOBS_DB and session.capability == "admin":
            # an admin's first call of a queue in an application database makes its jobs tables there, so that
            # data tokens can use it (trial EL: a list() by the admin, as the message said, made nothing). Not
            # waited for: they queue behind any transaction that holds that database's writer, perhaps one of this
            # very client that waits for this answer (its first call of the queue inside the transaction shares
            # this open: CI saw a chat's post wait out tx_idle); a data token's call is let through meanwhile
            await engine.load(req.queue)
        return info

    async def schema_guard(session: Session, queue: str, database: str) -> None:
        """A queue in an application database needs its jobs tables there: making them (and the database) is a
        schema change, which needs the admin capability, as migrations do. Once made, any token opens it."""
        sql = core.sql
        if not sql.exists(database):
            raise PermissionDeniedError(
                f"queue {queue}: database {database} does not exist, and making one needs the admin capability; "
                f"this token has {session.capability!r}"
            )
        if engine.loaded_in(queue, database):
            return  # an admin's call loaded it, its tables made or on their way: a data token makes nothing
        db = sql.databases.get(database) or (await sql.open(database, []))[0]
        found = await db.read("select 1 from sqlite_master where type = 'table' and name = ?", [TABLE], "one")
        if not found.rows:
            raise PermissionDeniedError(
                f"queue {queue}: database {database} has no jobs tables yet, and making them needs the admin "
                f"capability: call the queue once with an admin token (`await queue.list(limit=1)`, or an add; "
                f"store.queue(...) alone makes nothing), as a deploy runs migrations; this token has "
                f"{session.capability!r}"
            )

    def add(session: Session, req: Add) -> Awaitable[list[str]]:
        if not req.tx:
            fut = engine.add_now(req.queue, req.jobs)  # the common case answers from a future: no task
            if fut is not None:
                return fut
        return add_later(session, req)

    async def add_later(session: Session, req: Add) -> list[str]:
        tx = own_tx(session, req.tx) if req.tx else None
        return await engine.add(req.queue, req.jobs, tx)

    async def claim(session: Session, req: Claim) -> list[Claimed]:
        return await engine.claim(session, req)

    def unwait(session: Session, req: Unwait) -> int:
        return engine.unwait(req.queue, req.worker)

    def renew(session: Session, req: Renew) -> list[str] | Awaitable[list[str]]:
        if engine.loaded(req.queue):
            return engine.renew(session, req.queue, req.attempts)
        return engine.renew_loading(session, req.queue, req.attempts)

    def report(session: Session, req: Report) -> Awaitable[bool]:
        fut = engine.report_now(session, req)
        return fut if fut is not None else engine.report(session, req)

    async def release(session: Session, req: Release) -> int:
        return await engine.release(req.queue, req.attempts)

    async def release_claim(session: Session, req: ReleaseClaim) -> int:
        return await engine.release_claim(req.queue, req.token)

    async def progress(session: Session, req: Progress) -> bool:
        return await engine.progress(req.queue, req.id, req.fence, req.progress)

    async def step(session: Session, req: Step) -> bool:
        return await engine.step(req.queue, req.id, req.fence, req.name, req.result)

    async def get(session: Session, req: Get) -> JobRow | None:
        return await engine.get(req.queue, req.id)

    async def find(session: Session, req: Find) -> JobRow | None:
        return await engine.find(req.id)

    async def list_(session: Session, req: ListRequest) -> Page:
        return await engine.list_jobs(req)

    async def cancel(session: Session, req: Get) -> bool:
        return await engine.cancel(req.queue, req.id)

    async def retry(session: Session, req: Get) -> bool:
        return await engine.retry(req.queue, req.id)

    async def wait(session: Session, req: Wait) -> JobRow | None:
        return await engine.wait(req.queue, req.id, req.seen, req.wait_ms)

    async def configure(session: Session, req: OpenQueue) -> QueueInfo:
        return await engine.configure(req.queue, req.options)

    async def queues(session: Session, req: Empty) -> list[QueueInfo]:
        return await engine.queues_info()

    def on_close(session: Session) -> None:
        engine.drop_peer(session)

    async def stop() -> None:
        await engine.close()

    def status() -> Any:
        return engine.status()

    core.session_close_hooks.append(on_close)
    core.stop_hooks.append(stop)
    core.status_hooks["jobs"] = status
    core.register(Method("jobs.open", OpenQueue, open_, write=True))
    core.register(Method("jobs.add", Add, add, write=True))
    core.register(Method("jobs.claim", Claim, claim, write=True))
    core.register(Method("jobs.unwait", Unwait, unwait))
    core.register(Method("jobs.renew", Renew, renew, write=True))
    core.register(Method("jobs.report", Report, report, write=True))
    core.register(Method("jobs.release", Release, release, write=True))
    core.register(Method("jobs.release_claim", ReleaseClaim, release_claim, write=True))
    core.register(Method("jobs.progress", Progress, progress, write=True))
    core.register(Method("jobs.step", Step, step, write=True))
    core.register(Method("jobs.get", Get, get))
    core.register(Method("jobs.find", Find, find))
    core.register(Method("jobs.list", ListRequest, list_))
    core.register(Method("jobs.cancel", Get, cancel, write=True))
    core.register(Method("jobs.retry", Get, retry, write=True))
    core.register(Method("jobs.wait", Wait, wait))
    core.register(Method("jobs.queues", Empty, queues))
    core.register(Method("jobs.configure", OpenQueue, configure, write=True, admin=True))
    core.spawn(engine.start(), name="jobs-start")

    async def stopping() -> None:
        await core.stopping.wait()
        engine.begin_stop()

    core.spawn(stopping(), name="jobs-stopping")
