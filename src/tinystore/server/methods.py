"""The method table: maps each wire method to its engine call."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..durations import seconds
from ..errors import ClosedError, InUseError, InvalidError
from ..protocol.store import Advance, Backup, Empty, Stop
from . import backup as backups
from . import sql_methods

log = logging.getLogger("tinystore.server")

if TYPE_CHECKING:
    from .core import Core, Session


def install(core: Core) -> None:
    from .core import Method

    def status(session: Session, req: Empty) -> dict[str, Any]:
        return core.status()

    def advance(session: Session, req: Advance) -> float:
        if not core.clock.is_test:
            raise InvalidError("clock.advance: this store runs on the real clock (open it with clock=datetime)")
        core.clock.advance(req.seconds)
        return core.clock.now()

    def now(session: Session, req: Empty) -> float:
        return core.clock.now()

    def stop(session: Session, req: Stop) -> bool:
        grace = seconds(req.grace, "store.stop: grace")
        if core.mode == "embedded":
            raise InvalidError(
                f"store {core.directory}: the store is embedded in process {os.getpid()}; "
                "stop that program (or close its store) to stop it"
            )
        core.stop_grace = grace
        if not core.stop_requested.is_set() and core.mode != "private":
            log.info("asked to stop (tinystore stop, or stop_server()), grace %gs: stopping", grace)
        core.stop_requested.set()
        return True

    def ping(session: Session, req: Empty) -> bool:
        return True

    copying: list[asyncio.Task[Any]] = []  # the backup under way (one at a time)

    async def copy(dest: Path) -> dict[str, Any]:
        cancelled = threading.Event()
        ended = core.file_work()  # (the directory is let go only once the copy's thread has ended: trial EA)

        def run() -> dict[str, Any]:
            try:
                return backups.backup(core.directory, dest, cancelled)
            finally:
                ended.set()

        # at a stop's grace's end the copy stops between two steps, as a call under way is interrupted then (trial
        # HW: it learnt of the stop only once the listeners had closed, some seconds after the grace)
        at_grace_end = asyncio.ensure_future(core.grace_ended())
        at_grace_end.add_done_callback(lambda f: None if f.cancelled() else cancelled.set())
        try:
            return await asyncio.to_thread(run)
        except asyncio.CancelledError:
            cancelled.set()  # the store stops: the copy keeps nothing more as done, and writes no LOCK
            raise
        finally:
            at_grace_end.cancel()

    async def backup(session: Session, req: Backup) -> dict[str, Any]:
        if copying and not copying[0].done():
            raise InUseError(f"store {core.directory}: backup: another backup is under way; try again once it ended")
        dest = Path(req.dest)
        backups.check_destination(core.directory, dest)  # bad input at once, before anything is made
        task = core.spawn(copy(dest), name="backup")
        copying[:] = [task]
        try:
            return await asyncio.shield(task)  # a cancelled call leaves the copy going on to its end
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if task.cancelled() and (this is None or not this.cancelling()):
                raise ClosedError(
                    f"backup of store {core.directory} into {dest}: the store stopped during the backup; {dest} is "
                    "incomplete: remove it before trying again"
                ) from None
            raise

    core.register(Method("store.status", Empty, status))
    core.register(Method("store.ping", Empty, ping))
    core.register(Method("clock.advance", Advance, advance, write=True, admin=True))
    core.register(Method("clock.now", Empty, now))
    core.register(Method("store.stop", Stop, stop, write=True, admin=True))
    core.register(Method("store.backup", Backup, backup, admin=True))
    sql_methods.install(core)
    for name in ("channel_methods", "lock_methods", "job_methods"):
        try:
            module = __import__(f"{__package__}.{name}", fromlist=["install"])
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}":
                raise
            continue
        module.install(core)
