"""SQL methods: ``sql.open``, ``sql.exec``, ``sql.query``, ``sql.begin``, ``sql.commit``, ``sql.rollback``.

The store's own databases (names starting with ``tinystore-``, such as ``tinystore-jobs``) are read-only to
clients, in every mode (the embedded SDK calls these methods too): ``sql.open`` with migrations, ``sql.begin``
of a transaction that writes and an ``sql.exec`` that writes raise ``PermissionDeniedError``. The engines open
and write them through the SQL engine itself, not through these methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from ..engines.sql import SqlDatabase, SqlTx
from ..engines.sql_guard import WRITER_ONLY, restricted_sql
from ..engines.sql_text import check_params, is_vacuum, is_vacuum_itself, same_migration
from ..errors import ClosedError, InUseError, InvalidError, PermissionDeniedError, TinystoreError
from ..names import RESERVED_DB_PREFIX, check_db_writable, reserved_db_error
from ..protocol.sql import Begin, Done, Exec, OpenDb, Opened, Query, Rows, TxRef

log = logging.getLogger("tinystore.server")

if TYPE_CHECKING:
    from .core import Core, Session

_MODES = frozenset({"all", "one", "scalar"})


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Take the outcome of ``task``, which its caller may no longer wait for (what it raised was its caller's)."""
    if not task.cancelled():
        task.exception()


def _after_commit(tx: SqlTx, fut: asyncio.Future[None]) -> None:
    if fut.cancelled() or fut.exception() is not None:
        return
    for hook in tx.after_commit:
        try:
            hook()
        except Exception:
            log.exception("transaction %s: after its commit", tx.id)


def install(core: Core) -> None:
    from .core import Method

    engine = core.sql
    # databases being made anew by an open, with what follows (see open_db): a later open of one waits for it
    making: dict[str, asyncio.Future[Opened]] = {}

    def own_tx(session: Session, tx_id: int) -> SqlTx:
        tx = engine.transactions.get(tx_id)
        if tx is None or tx_id not in session.transactions:
            raise engine.not_open(tx_id)
        return tx

    async def open_db(session: Session, req: OpenDb) -> Opened:
        migrations = [(m.name, m.text) for m in req.migrations]
        if req.db.startswith(RESERVED_DB_PREFIX):
            if migrations:
                raise reserved_db_error(req.db, "migrations are refused")
            if not engine.exists(req.db):
                raise reserved_db_error(req.db, "the store has not made it, and a client may not create it")
        if session.capability != "admin" and not engine.exists(req.db):
            raise PermissionDeniedError(
                f"database {req.db} does not exist, and making one needs the admin capability (as its migrations "
                f"do); this token has {session.capability!r}"
            )
        if migrations and session.capability != "admin":
            db, applied = await engine.open(req.db, [])
            known = {r[0]: r[1] for r in (await db.read("select name, text from _tinystore_migrations", [])).rows}
            if any(name not in known or not same_migration(known[name], text) for name, text in migrations):
                raise PermissionDeniedError(f"database {req.db}: running migrations needs the admin capability")
            return Opened(db=req.db, applied=[], path=str(db.path))
        pending = making.get(req.db)
        if pending is not None and engine.exists(req.db):
            # made, and what follows under way (the queues there told to begin anew): not opened before it is done
            await asyncio.wait([pending])  # (its outcome was its own caller's)
        if engine.exists(req.db):
            db, applied = await engine.open(req.db, migrations)
            return Opened(db=req.db, applied=applied, path=str(db.path))

        async def make() -> Opened:
            db, applied = await engine.open(req.db, migrations)
            await warn_of_queues(req.db)
            return Opened(db=req.db, applied=applied, path=str(db.path))

        # made now: the warning about queues that kept their jobs in a file of that name, and their tables
        # forgotten, follow whatever becomes of this call (trial GS: cancelled, the queue found its tables missing
        # for good, and nothing was said)
        made = making[req.db] = asyncio.ensure_future(make())  # (it ends as the engine closes, with its own error)
        made.add_done_callback(_retrieved)
        made.add_done_callback(lambda f: making.pop(req.db) if making.get(req.db) is f else None)
        return await asyncio.shield(made)

    async def warn_of_queues(name: str) -> None:
        """Database ``name`` was made now: say so loudly when a queue kept its jobs in a file of that name (trial FB:
        its file moved away, the application's `store.database(name)` made it anew, empty, and the queue went on
        in it without a word, its jobs out of sight)."""
        jobs = core.engines.get("jobs")
        if jobs is None:
            return
        try:
            queues = await jobs.queues_in(name)
        except TinystoreError:
            return
        if queues:
            log.warning(
                "database %s was made anew, empty, but queue(s) %s kept their jobs in a database of that name: its "
                "file %s was missing (moved or deleted?), and those jobs are not in the new one. To have them back, "
                "stop the store and put the file back (over the new one), or restore a backup",
                name,
                ", ".join(queues),
                db_path(name),
            )
            with contextlib.suppress(TinystoreError):
                await jobs.forget_tables(queues)  # (made anew in the new file at their next use, as it says)

    def db_path(name: str) -> str:
        return str(engine.directory / f"{name}.db")

    async def reopen(name: str) -> SqlDatabase:
        # a database that exists on disk but was not opened since this server started (a client that
        # reconnected after a restart): open it again, without migrations
        if not engine.exists(name):
            return engine.get(name)  # raises InvalidError: not open
        db, _ = await engine.open(name, [])
        return db

    async def exec_later(req: Exec, resend: bool) -> Any:
        return await (await reopen(req.db)).write(req.sql, req.params, resend=resend)

    async def query_later(req: Query, session: Session) -> Any:
        return await (await reopen(req.db)).read(req.sql, req.params, req.mode, owner=session)

    async def exec_reserved(req: Exec) -> Done:
        # a statement that only reads may go through exec: run it on a reader (read-only connections), where
        # one that writes fails before it changes anything
        db = engine.databases.get(req.db) or await reopen(req.db)
        try:
            rows = await db.read(req.sql, req.params, "all")
        except PermissionDeniedError:
            # (a data token's schema change, refused as any write is: trial HF, its PRAGMA optimize ran, on a reader)
            raise reserved_db_error(req.db, "a statement that writes is refused") from None
        except InvalidError as exc:
            if "readonly" in exc.message or WRITER_ONLY in exc.message:  # (VACUUM, a checkpoint: trial CR)
                raise reserved_db_error(req.db, "a statement that writes is refused") from None
            raise
        return Done(0, 0, rows.columns, list(map(list, rows.rows)))

    def restrict(session: Session, req: Exec | Query) -> None:
        """Mark the statement of a session without the admin capability (``restricted_sql``): SQLite's authorizer
        then refuses it every schema change as it is prepared, however it is spelled and wherever it runs (an exec,
        a read, a transaction's call), with ``PermissionDeniedError``."""
        if session.capability != "admin":
            req.sql = restricted_sql(req.sql)

    def tx_of(session: Session, tx_id: int, db: str) -> SqlTx:
        """This session's open transaction ``tx_id``, which must be of database ``db``."""
        tx = own_tx(session, tx_id)
        if tx.db.name != db:
            raise InvalidError(f"database {db}: transaction {tx_id} is a transaction of database {tx.db.name}")
        return tx

    def check_no_attempt_runs(req: Exec) -> None:
        """Refuse a VACUUM of the store's own database while attempts of its queues run: it holds the writer for as
        long as it takes, and their lease renewals wait behind it (trial HN: attempts were lost, and counted)."""
        jobs = core.engines.get("jobs")
        if jobs is None or not is_vacuum_itself(req.sql):
            return
        running = jobs.running_in(req.db)
        if running:
            raise InUseError(
                f"database {req.db}: VACUUM holds its writer while it runs, and the {running} attempt(s) running now "
                "would lose their leases waiting behind it: run it with no worker running (stop them, or wait)"
            )

    def exec_(session: Session, req: Exec) -> Any:
        restrict(session, req)
        if req.tx:
            return tx_of(session, req.tx, req.db).exec(req.sql, req.params)
        if req.db.startswith(RESERVED_DB_PREFIX):
            if session.capability == "admin" and is_vacuum(req.sql) and engine.exists(req.db):
                # VACUUM (or a WAL checkpoint) of the store's own database changes no row: an admin's runs on its
                # writer (trial HL: the jobs database, 60 MB after a spike of jobs that ended, could never shrink)
                check_no_attempt_runs(req)
                return exec_later(req, not session.local)
            return exec_reserved(req)
        db = engine.databases.get(req.db)
        if db is None:
            return exec_later(req, not session.local)
        return db.write_later(req.sql, req.params, not session.local)

    def answer_next_turn(rows: Rows) -> asyncio.Future[Rows]:
        fut: asyncio.Future[Rows] = asyncio.get_running_loop().create_future()
        fut.get_loop().call_soon(_settle, fut, rows)
        return fut

    def query(session: Session, req: Query) -> Any:
        mode = req.mode
        if mode not in _MODES:
            raise InvalidError(f"sql.query: mode {mode!r} is not all, one or scalar")
        restrict(session, req)  # (a transaction's reads run on the writer; a reader took some PRAGMAs: trial FF)
        if req.tx:
            return tx_of(session, req.tx, req.db).query(req.sql, req.params, mode)
        db = engine.databases.get(req.db)
        if db is None:
            return query_later(req, session)
        values = check_params(db.name, req.sql, req.params)
        # the usual read fits the inline budget: its rows, at once (no future, no thread)
        rows = db.read_now(req.sql, values, mode)
        if rows is not None:
            if db.turn_full():
                return answer_next_turn(rows)
            return rows
        return db.read_later(req.sql, values, mode, session)

    async def begin(session: Session, req: Begin) -> int:
        if not req.read_only:
            check_db_writable(req.db, "a transaction that writes is refused (db.tx(fn, read_only=True) may read)")
        db = engine.databases.get(req.db) or await reopen(req.db)
        fut = db.begin(session, req.read_only)
        try:
            tx = await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(lambda f: f.exception() or f.result().rollback())
            raise
        if session.closed:
            tx.rollback()
            raise ClosedError("the session closed while the transaction began")
        session.transactions.add(tx.id)
        return tx.id

    def unwanted_tx(session: Session, tx_id: int) -> None:
        # the client cancelled its begin once the transaction was open: it will never use it
        tx = engine.transactions.get(tx_id)
        session.transactions.discard(tx_id)
        if tx is not None and tx.owner is session:
            tx.abort(ClosedError(f"transaction {tx_id}: its client cancelled the begin"))

    async def commit(session: Session, req: TxRef) -> None:
        tx = own_tx(session, req.tx)
        fut = tx.commit()
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            # the commit goes on: so do its hooks (the jobs it added, the messages it published), once it is done
            fut.add_done_callback(partial(_after_commit, tx))
            raise
        finally:
            session.transactions.discard(tx.id)
        _after_commit(tx, fut)  # here, before the answer: what it published is heard after the commit returned

    async def rollback(session: Session, req: TxRef) -> None:
        tx = engine.transactions.get(req.tx)
        session.transactions.discard(req.tx)
        if tx is not None and tx.owner is session:
            await tx.rollback()

    def on_close(session: Session) -> None:
        for tx_id in list(session.transactions):
            tx = engine.transactions.get(tx_id)
            if tx is not None:
                tx.abort(ClosedError(f"transaction {tx_id}: its client went away"))
        session.transactions.clear()

    core.session_close_hooks.append(on_close)
    core.register(Method("sql.open", OpenDb, open_db))
    core.register(Method("sql.exec", Exec, exec_, write=True))
    core.register(Method("sql.query", Query, query))
    core.register(Method("sql.begin", Begin, begin, undo=unwanted_tx))
    core.register(Method("sql.commit", TxRef, commit, write=True))
    core.register(Method("sql.rollback", TxRef, rollback))


def _settle(fut: asyncio.Future[Rows], rows: Rows) -> None:
    if not fut.done():
        fut.set_result(rows)
