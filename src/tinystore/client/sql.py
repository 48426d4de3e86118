"""SQL databases in the SDK: :class:`Database` and :class:`SqlTx`."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import os
import stat
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

import msgspec
import msgspec.inspect
import msgspec.structs

from ..engines.sql_text import SqlParams, check_params
from ..errors import ClosedError, InvalidError, LimitError, LostError, TinystoreError, UnavailableError
from ..names import a_or_an, check_name
from ..protocol.messages import decode
from ..protocol.sql import Begin, Done, Exec, Migration, OpenDb, Opened, Query, Rows, TxRef
from ..protocol.values import shown
from .turns import pass_turn
from .unsendable import surrogate_named
from .wake import wake_first

if TYPE_CHECKING:
    from .channels import Channel, TxChannel
    from .jobs import Queue, TxQueue
    from .store import Store
    from .transport import Transport

T = TypeVar("T")
R = TypeVar("R")


class _TxMark:
    """A writing transaction of ``db.tx`` whose ``fn`` runs (``open``), as the context of ``fn`` sees it: a task
    started inside ``fn`` inherits the mark, and is free of it once ``fn`` has returned or raised."""

    __slots__ = ("extra", "open", "waiters")

    def __init__(self) -> None:
        self.open = True
        self.extra = 0  # writes of its context in flight past their method's share (see RemoteTransport.call)
        self.waiters: collections.deque[asyncio.Future[bool | None]] = collections.deque()  # writes waiting for it

    def given_back(self) -> None:
        """One of its writes past the share was answered: the first write of its context waiting may go."""
        self.extra -= 1
        self.wake_next()

    def wake_next(self) -> None:
        """The first write of its context waiting for a place past the share may look again (one is free)."""
        wake_first(self.waiters, True)


_active: contextvars.ContextVar[Mapping[tuple[int, str], _TxMark]] = contextvars.ContextVar(
    "tinystore_tx", default=types.MappingProxyType({})
)


def in_open_tx(key: tuple[int, str]) -> bool:
    """Whether this context runs inside the ``fn`` of a writing ``db.tx`` of the database ``key`` (``(id(store),
    name)``) that is still open: a write to that database would wait for the writer the transaction holds."""
    mark = _active.get().get(key)
    return mark is not None and mark.open


def open_tx_mark() -> _TxMark | None:
    """The mark of a writing ``db.tx`` still open whose ``fn`` this context runs inside (of any database), or
    ``None``."""
    for mark in _active.get().values():
        if mark.open:
            return mark
    return None


def read_migrations(
    migrations: str | os.PathLike[str] | Sequence[tuple[str, str]] | None, db: str = ""
) -> list[Migration]:
    """Migrations as (name, text): from a folder (its ``*.sql`` files, ``.SQL`` too, in name order, their bytes
    as they are; hidden ones, whose names begin with a dot, passed over) or a list (or tuple) of pairs.

    Raises ``InvalidError`` (naming database ``db``) when the folder does not exist (or the path is empty), a
    ``*.sql`` of it is not a file, cannot be read or is not UTF-8 text, or ``migrations`` is neither.
    """
    where = f"database {db}: migrations" if db else "migrations"
    if migrations is None:
        return []
    if isinstance(migrations, list | tuple):
        pairs = []
        for m in migrations:
            if not isinstance(m, list | tuple) or len(m) != 2 or not all(isinstance(x, str) for x in m):
                raise InvalidError(f"{where}: {shown(m)} is not a (name, SQL text) pair of strings")
            pairs.append(Migration(m[0], m[1]))
        return pairs
    if not isinstance(migrations, str | os.PathLike):
        raise InvalidError(
            f"{where}: {a_or_an(type(migrations).__name__)} is neither a folder of .sql files nor a list of "
            "(name, SQL text) pairs"
        )
    if not os.fspath(migrations):
        # ("" made a Path is the working folder: its .sql files, whatever they are, would apply; trial CR. A Path
        # made of "" is Path("."), which cannot be told from one meant so)
        raise InvalidError(f"{where}: an empty path is no folder of .sql files")
    folder = Path(migrations)
    if not folder.is_dir():
        # (trial HT: a folder that does not exist was told as "migrations is not a folder", its place unsaid)
        whole = folder.absolute()
        if not folder.exists():
            raise InvalidError(
                f"{where}: there is no folder {whole} (make it, with a .sql file for each migration: 001_init.sql, "
                "...; or give a list of (name, SQL text) pairs)"
            )
        raise InvalidError(f"{where}: {whole} is not a folder of .sql files")
    out = []
    try:
        # (002.SQL too: skipped, it was a migration that silently never ran; trial CR)
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".sql")
    except OSError as exc:
        raise InvalidError(f"{where}: the folder {folder} cannot be read: {exc.strerror or exc}") from None
    for p in found:
        if p.name.startswith("."):
            # hidden: an editor's lock or backup (Emacs' .#001.sql, a dangling link while the file is edited),
            # macOS's ._001.sql beside each file copied from its disks (trial CC)
            continue
        try:
            if not stat.S_ISREG(p.stat().st_mode):
                # (a FIFO: its read blocked the event loop for ever; trial CR)
                raise InvalidError(f"{where}: {p} is not a file (a folder, a FIFO or a device): rename it")
            # bytes as they are, not with newlines translated: "\r\n" in a string literal is data (trial CR)
            out.append(Migration(p.name, p.read_bytes().decode("utf-8")))
        except UnicodeDecodeError as exc:
            raise InvalidError(f"{where}: {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise InvalidError(f"{where}: {p} cannot be read: {exc.strerror or exc}") from None
    return out


def check_values(db: str, sql: str, params: tuple[Any, ...]) -> SqlParams:
    """Refuse, before anything is sent, a value SQLite cannot hold (``InvalidError`` naming the parameter)
    and a named placeholder given values in order (see :func:`~tinystore.engines.sql_text.check_params`)."""
    return check_params(db, sql, params)


def _split(name: str, what: str, args: tuple[Any, ...]) -> tuple[Any, str, tuple[Any, ...]]:
    if not args:
        raise InvalidError(f"database {name}: a SQL statement is needed")
    first = args[0]
    if isinstance(first, str):
        return None, str.__str__(first), args[1:]
    if not _is_type(first):
        raise InvalidError(
            f"database {name}: {what} takes the SQL text first, or a type and then the SQL text; {_short(first)} is "
            "not a type (a dataclass, msgspec Struct, TypedDict, ...) nor SQL text"
        )
    if len(args) < 2 or not isinstance(args[1], str):
        raise InvalidError(f"database {name}: after a type comes the SQL text")
    return first, str.__str__(args[1]), args[2:]


def _is_type(thing: Any) -> bool:
    """Whether ``thing`` may be what rows convert to: a class, or a typing form (``list[X]``, ``X | None``)."""
    return isinstance(thing, type) or typing.get_origin(thing) is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _sql_text(name: str, what: str, got: Any) -> str:
    """``got`` as plain ``str`` when it is text (a ``str`` subclass: a ``StrEnum`` member, say), else
    ``InvalidError``."""
    if isinstance(got, str):
        return str.__str__(got)
    _not_sql(name, what, got)


def _not_sql(name: str, what: str, got: Any) -> NoReturn:
    if _is_type(got):
        # the type given, by its name (trial CZ: it said "not type", the name of its metaclass)
        shown = f"the type {got.__qualname__ if isinstance(got, type) else repr(got)}"
        if what.endswith("exec"):
            hint = " (it returns a Done: the rows changed and the last rowid; it takes no type)"
        else:
            hint = " (it returns a value as SQLite gives it: it takes no type)"
    else:
        shown, hint = type(got).__name__, ""
    raise InvalidError(f"database {name}: {what} takes the SQL text first, not {shown}{hint}")


_NOT_FROM_TEXT = (bytes, bytearray, memoryview)
"""Types a row's text is never turned into (msgspec would read it as base64: a text that happens to be valid
base64 gave wrong bytes, trial CC)."""


_BoolPlan = tuple[str | None, dict[Any, frozenset[str]], frozenset[str]]


@functools.lru_cache(maxsize=256)
def _bool_columns(type_: Any) -> _BoolPlan:
    """The columns that ``type_`` (a dataclass, msgspec Struct or TypedDict; or a union of such with ``None``)
    reads as a ``bool`` (or ``bool | None``, a ``Literal`` of bools, or any of these ``Annotated``): SQLite has no
    boolean, and stores ``True`` and ``False`` as ``1`` and ``0``. A field that takes an ``int`` too (``int |
    bool``) takes the integer as it is.

    Returns ``(tag_field, by_tag, common)``: for a union of tagged msgspec Structs, the tag's column and each
    tag's bool columns (trial CH: a union whose "a" member has ``v: bool`` and "b" member ``v: int`` refused b's
    1); ``common``: the columns every member that has them reads as a bool (a row of no known tag, or no tags)."""
    try:
        info = msgspec.inspect.type_info(type_)
    except Exception:  # (not a type msgspec knows: msgspec.convert says why)
        return None, {}, frozenset()
    inspect_ = msgspec.inspect

    def bare(t: Any) -> Any:
        while isinstance(t, inspect_.Metadata):
            t = t.type
        return t

    def one_bool(t: Any) -> bool:
        return isinstance(t, inspect_.BoolType) or (
            isinstance(t, inspect_.LiteralType) and all(isinstance(v, bool) for v in t.values)
        )

    def is_bool(t: Any) -> bool:
        t = bare(t)
        if isinstance(t, inspect_.UnionType):
            kinds = [bare(u) for u in t.types if not isinstance(bare(u), inspect_.NoneType)]
            return bool(kinds) and all(one_bool(u) for u in kinds)
        return one_bool(t)

    info = bare(info)
    members = [bare(m) for m in (info.types if isinstance(info, inspect_.UnionType) else (info,))]
    judged: dict[str, bool] = {}
    by_tag: dict[Any, frozenset[str]] = {}
    tag_field = None
    for m in members:
        fields = getattr(m, "fields", ())
        for f in fields:
            judged[f.encode_name] = judged.get(f.encode_name, True) and is_bool(f.type)
        if getattr(m, "tag_field", None) is not None:
            tag_field = m.tag_field
            by_tag[m.tag] = frozenset(f.encode_name for f in fields if is_bool(f.type))
    return tag_field, by_tag, frozenset(name for name, bool_ in judged.items() if bool_)


@functools.lru_cache(maxsize=256)
def _struct_keys(type_: Any) -> frozenset[str] | None:
    """The column names a msgspec Struct made with ``forbid_unknown_fields=True`` takes (its fields' encoded names,
    and its tag's), else ``None``: columns the type does not name are ignored, for such a Struct too (trial CR:
    it raised on them)."""
    if not (isinstance(type_, type) and issubclass(type_, msgspec.Struct)):
        return None
    config = type_.__struct_config__
    if not config.forbid_unknown_fields:
        return None
    keys = {f.encode_name for f in msgspec.structs.fields(type_)}
    if isinstance(config.tag_field, str):
        keys.add(config.tag_field)
    return frozenset(keys)


def _convert(db: str, rows: Rows, type_: Any) -> list[Any]:
    """``rows`` as dicts, or as ``type_``: strictly (the values as SQLite gives them: a text is not read as a
    number, a bool or bytes), but for ``bool`` columns, which take the integers ``0`` and ``1``."""
    cols = rows.columns
    dicts = [dict(zip(cols, r)) for r in rows.rows]  # noqa: B905 (the keyword costs 0.2 µs a row)
    if type_ is None:
        return dicts
    try:
        tag_field, by_tag, common = _bool_columns(type_)
    except TypeError:  # (unhashable: not a type)
        tag_field, by_tag, common = None, {}, frozenset()
    if common or by_tag:
        for d in dicts:
            for c in common if tag_field is None else by_tag.get(d.get(tag_field), common):
                v = d.get(c)
                if type(v) is int and (v == 0 or v == 1):
                    d[c] = v == 1
    try:
        keep = _struct_keys(type_)
    except TypeError:  # (unhashable: not a type)
        keep = None
    if keep is not None:
        dicts = [{k: v for k, v in d.items() if k in keep} for d in dicts]
    try:
        return [msgspec.convert(d, type_, strict=True, builtin_types=_NOT_FROM_TEXT) for d in dicts]
    except (msgspec.ValidationError, TypeError) as exc:
        name = getattr(type_, "__name__", repr(type_))
        raise InvalidError(f"database {db}: a row does not fit {name}: {exc} (columns: {', '.join(cols)})") from None


class Queries:
    """What :class:`Database` and :class:`SqlTx` share: ``one()``, ``all()`` and ``scalar()``."""

    name: str
    _store: Store
    _transport: Transport
    _tx = 0  # the transaction the calls run in (0: none, each its own)
    _retry = True  # whether a read whose answer was lost is sent again

    def _check(self) -> None:
        """Raise when calls can no longer be made (a transaction that ended)."""

    def _query(self, sql: str, params: SqlParams, mode: str) -> Awaitable[Rows]:
        """The call that runs the read (awaited by the caller: no coroutine of its own in between)."""
        if self._tx:
            self._check()
        if self._store._dead is not None:
            raise self._store._dead
        return self._transport.call("sql.query", Query(self.name, sql, params, mode, self._tx), Rows, retry=self._retry)

    @overload
    async def one(self, sql: str, /, *params: Any) -> dict[str, Any] | None: ...
    @overload
    async def one(self, type_: type[T], sql: str, /, *params: Any) -> T | None: ...
    async def one(self, *args: Any) -> Any:
        """The first row as a dict (or as ``type_``: a dataclass, msgspec Struct or TypedDict), or ``None``.

        Raises ``InvalidError`` with SQLite's message for bad SQL or a statement that writes; ``LimitError``
        when the statement with its parameters is over the frame limit (``frame_body_bytes``, 16 MiB encoded:
        nothing is sent), or its result over ``sql_result_bytes``; ``TimeoutError_`` (it ran past
        ``statement_timeout``, 30 s, and was stopped); ``UnavailableError`` (the file system failed the read);
        ``ClosedError`` (the store is closed). A cancel stops the read where it runs (it holds nothing).
        """
        if args and type(args[0]) is str:
            if self._tx:
                self._check()
            transport = self._transport
            rows: Any
            if transport.local:
                # in this process: straight to the engine; a read that fits the inline budget is answered at
                # once, with nothing to await. Past a turn's budget of calls, the loop turns first (trial HQ, HR:
                # a loop of reads with no other await, or of reads that failed, held the loop and the store's
                # own socket for as long as it read)
                if transport.turn_spent():
                    await pass_turn()
                    transport.turn_spent()
                engine_db = None if self._tx else transport.sql_database(self.name)
                try:
                    if engine_db is not None:
                        values = check_params(self.name, args[0], args[1:])
                        # what a socket would carry (a Query is encoded as this array): past the frame limit,
                        # the same LimitError as over a socket
                        transport.check_size("sql.query", (self.name, args[0], values, "one", 0), self.name)
                        rows = engine_db.read_now(args[0], values, "one")
                        if rows is None:
                            rows = await transport.track_read(engine_db.read_later(args[0], values, "one"))
                    else:
                        request = Query(self.name, args[0], list(args[1:]), "one", self._tx)
                        rows = transport.call_now("sql.query", request)
                        if type(rows) is not Rows:
                            rows = await rows
                except InvalidError as exc:
                    named = surrogate_named(exc, "sql.query", Query(self.name, args[0], list(args[1:]), "one"))
                    if named is None:
                        raise
                    raise named from None
            else:
                if self._store._dead is not None:
                    raise self._store._dead
                rows = await transport.call(
                    "sql.query",
                    Query(self.name, args[0], check_params(self.name, args[0], args[1:]), "one", self._tx),
                    Rows,
                    retry=self._retry,
                )
            found = rows.rows
            return dict(zip(rows.columns, found[0])) if found else None  # noqa: B905 (a keyword: +0.2 µs a row)
        type_, sql, params = _split(self.name, "one", args)
        rows = await self._query(sql, check_values(self.name, sql, params), "one")
        out = _convert(self.name, rows, type_)
        return out[0] if out else None

    @overload
    async def all(self, sql: str, /, *params: Any) -> list[dict[str, Any]]: ...
    @overload
    async def all(self, type_: type[T], sql: str, /, *params: Any) -> list[T]: ...
    async def all(self, *args: Any) -> Any:
        """Every row, as dicts (or as ``type_``). Results are limited to 64 MiB (``LimitError``); errors as
        :meth:`one`."""
        type_, sql, params = _split(self.name, "all", args)
        rows = await self._query(sql, check_values(self.name, sql, params), "all")
        return _convert(self.name, rows, type_)

    async def scalar(self, sql: str, /, *params: Any) -> Any:
        """The first column of the first row, or ``None`` when there is no row. Errors as :meth:`one`; a first
        argument that is not the SQL text (a type: ``scalar`` converts nothing) is an ``InvalidError``."""
        if type(sql) is not str:
            sql = _sql_text(self.name, "scalar", sql)
        found = (await self._query(sql, check_params(self.name, sql, params), "scalar")).rows
        return found[0][0] if found and found[0] else None


class Database(Queries):
    """A SQL database of the store (``DIR/sql/<name>.db``). Get one with ``await store.database(name)``."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self._key = (id(store), name)
        self._store = store
        self._transport = store.transport

    def __repr__(self) -> str:
        return f"<tinystore.Database {self.name} of {self.store!r}>"

    def _no_tx(self, what: str) -> None:
        if in_open_tx(self._key):
            raise InvalidError(
                f"database {self.name}: {what} inside a transaction of the same database would wait for itself; "
                "use the transaction's own calls (tx.exec, tx.one, ...)"
            )

    def _unwanted_tx(self, answer: bytes) -> None:
        """The answer to a ``sql.begin`` whose caller was cancelled: roll back the transaction it opened (else it
        would hold the writer until ``tx_idle``)."""
        self.store._undo_soon("sql.rollback", TxRef(decode(answer, int)))

    async def _open(self, migrations: list[Migration]) -> Opened:
        try:
            result: Opened = await self.store._call("sql.open", OpenDb(db=self.name, migrations=migrations), Opened)
        except LimitError as exc:
            sizes = [len(m.text.encode("utf-8", "surrogatepass")) for m in migrations]
            if exc.wanted is None or exc.wanted < sum(sizes) or not migrations:
                raise
            # the request over the frame limit: every open sends all the migrations (the store checks those applied
            # against their texts), said so, with what to do (trial CZ: "sql.open: the request is 20971830 bytes
            # encoded")
            largest = max(range(len(migrations)), key=sizes.__getitem__)
            raise LimitError(
                f"database {self.name}: its {len(migrations)} migrations hold {sum(sizes)} bytes of text in all; "
                f"with them, the request to open it is {exc.wanted} bytes, over the {exc.limit} one request carries "
                f"(frame_body_bytes): every open of the database sends them all. The largest is "
                f"{migrations[largest].name!r} ({sizes[largest]} bytes): load bulk data with db.exec rather than in "
                "a migration, or raise the store's Limits.frame_body_bytes",
                limit=exc.limit,
                wanted=exc.wanted,
            ) from None
        return result

    async def exec(self, sql: str, /, *params: Any) -> Done:
        """Run one statement that may write; it is committed (on disk, with ``durability="full"``) before
        this returns. Returns ``Done``: ``changes``, ``last_insert_rowid``, ``rows`` (from ``returning``).
        ``params``: the values of ``sql``'s ``?`` placeholders in order, or one dict of the values of its named
        placeholders (``:id``, ``@id``, ``$id``) by name, as Python's ``sqlite3`` binds them; so for every call.

        Raises ``InvalidError`` (SQLite's message; a value SQLite cannot hold), ``LimitError`` (the statement
        with its parameters is over the frame limit, ``frame_body_bytes``, 16 MiB encoded: nothing is sent, in
        every mode), ``ConflictError`` (a constraint), ``OutcomeUnknownError`` (the answer was lost: it may have
        committed), ``PermissionDeniedError`` (a statement that writes to one of the store's own databases,
        ``tinystore-…``), ``TimeoutError_`` (it ran past ``statement_timeout``, 30 s: stopped, nothing kept),
        ``UnavailableError`` (the disk is full or failed: nothing kept). Concurrent ``exec`` calls share commits
        (group commit). A cancel after sending leaves the write to happen.
        """
        if type(sql) is not str:
            sql = _sql_text(self.name, "exec", sql)
        if self._key in _active.get():
            self._no_tx("exec")
        transport = self._transport
        if transport.local:
            request = Exec(self.name, sql, list(params))
            try:
                done: Done = await transport.call_now("sql.exec", request)
            except InvalidError as exc:
                named = surrogate_named(exc, "sql.exec", request)
                if named is None:
                    raise
                raise named from None
            if done.rows:  # the engine's rows are tuples: lists, as a socket gives them (only with returning)
                done.rows = [[*r] for r in done.rows]
            return done
        if self.store._dead is not None:
            raise self.store._dead
        done = await transport.call(
            "sql.exec", Exec(self.name, sql, check_params(self.name, sql, params)), Done, write=True
        )
        return done

    @overload
    async def tx(self, fn: Callable[[SqlTx], Awaitable[Awaitable[R]]], *, read_only: bool = False) -> R: ...
    @overload
    async def tx(self, fn: Callable[[SqlTx], Awaitable[R]], *, read_only: bool = False) -> R: ...

    # (the first: an async fn that returns an awaitable, `return tx.exec(...)`, gets what that gives, as at run time;
    # trial FR: the checker said the result was still to be awaited, and awaiting it failed)
    async def tx(self, fn: Callable[[SqlTx], Awaitable[Any]], *, read_only: bool = False) -> Any:
        """Run ``fn(tx)`` in a transaction and return what it returns.

        The transaction takes the writer at its start (``BEGIN IMMEDIATE``), so read-then-write never fails
        with "database is locked"; with ``read_only=True`` it runs on a reader's snapshot instead. It commits
        when ``fn`` returns and rolls back when ``fn`` raises or is cancelled (the error or the cancel goes
        on), when it stays idle past ``tx_idle`` or runs past ``tx_max`` (``TimeoutError_``), or when the
        connection drops or the server stops under it (``UnavailableError``, from the call under way or the next;
        ``ClosedError`` for a statement a stopping server interrupted). A commit whose answer was lost raises
        ``OutcomeUnknownError``.
        A cancel that comes while the commit is under way (``fn`` has returned) leaves the transaction committed
        whole or not at all, and the caller cannot tell which from the ``CancelledError``; the commit may land
        a moment after the cancel.
        Calling ``db.exec`` or a ``db.tx`` that writes on the same database inside a transaction that writes
        raises ``InvalidError`` (it would wait for the writer its own transaction holds); a read-only
        transaction holds no writer, and anything may be called inside it or around it. So does a task started
        inside ``fn`` (a subscription's handler, a worker) while ``fn`` runs; once ``fn`` has returned or raised,
        such a task writes as any other. On one of
        the store's own databases (``tinystore-…``) only ``read_only=True`` is allowed, else
        ``PermissionDeniedError``. ``LimitError``: more read-only transactions open at once than
        ``read_transactions`` allows.
        """
        if not callable(fn):
            raise InvalidError(
                f"database {self.name}: tx takes fn, a function it calls with the transaction (fn(tx)); "
                f"{_short(fn)} is not callable"
            )
        if type(read_only) is not bool:
            raise InvalidError(
                f"database {self.name}: tx: read_only is True or False, not {a_or_an(type(read_only).__name__)}"
            )
        if not read_only:
            self._no_tx("tx")
        tx_id: int = await self.store._call("sql.begin", Begin(self.name, read_only), int, undo=self._unwanted_tx)
        tx = SqlTx(self, tx_id, read_only)
        self.store._open_txs.add(tx)
        if self.store._abandoning:
            # begun once the close ended this SDK's workers and transactions (its begin waited for the writer that
            # one of them held: trial ID); not before, while the workers' handlers still have their grace
            tx._abandon()
        mark = _TxMark()
        active = _active.get()
        token = _active.set(active if read_only else {**active, self._key: mark})
        try:
            try:
                result: Any = fn(tx)
            except TypeError as exc:
                tb = exc.__traceback__
                if tb is not None and tb.tb_next is None:  # raised by the call itself, not inside fn: its arguments
                    name = getattr(fn, "__qualname__", None) or _short(fn)
                    raise InvalidError(
                        f"database {self.name}: tx calls fn with the transaction (fn(tx)), and {name} cannot be "
                        f"called so: {exc}"
                    ) from exc
                raise
            if inspect.isawaitable(result):
                result = await result
                if inspect.isawaitable(result):
                    # an async fn that returned one (`return tx.exec(...)` without await): awaited too, inside the
                    # transaction, as whatever a callback returns that is awaitable is (spec/API.md; trial DZ)
                    result = await result
            elif inspect.isgenerator(result) or inspect.isasyncgen(result):
                # its body never ran: committed, it would have done nothing (trial CZ)
                name = getattr(fn, "__qualname__", None) or _short(fn)
                if inspect.isgenerator(result):
                    result.close()
                else:
                    await result.aclose()
                raise InvalidError(
                    f"database {self.name}: tx: {name} is a generator function (it holds a yield): calling it ran "
                    "none of its body; give a function (async or not) that does the work and returns"
                )
            never, running = tx._unfinished()
            if never or running:
                told = []
                for whats, how in (
                    (never, "never awaited ({}), so never run"),
                    (running, "still under way as fn returned ({}: a task or a gather of it not awaited to its end)"),
                ):
                    if whats:
                        calls = ", ".join(dict.fromkeys(whats))
                        told.append(
                            f"{len(whats)} call{'s' if len(whats) > 1 else ''} made with the transaction "
                            + how.format(calls)
                        )
                raise InvalidError(
                    f"database {self.name}: tx: {'; and '.join(told)}: the transaction is rolled back, nothing of it "
                    "committed (await each call made with it, and each task made of one, before fn returns; a gather "
                    "that raised leaves the others running: gather(..., return_exceptions=True) or a TaskGroup "
                    "waits for all)"
                )
        except BaseException:
            mark.open = False
            _active.reset(token)
            tx._unfinished()  # (closed or cancelled: the error or the cancel is what the caller hears)
            await tx._rollback()
            raise
        mark.open = False
        _active.reset(token)
        await tx._commit()
        return result


def _seen(fut: asyncio.Future[Any]) -> None:
    """Take the outcome of ``fut`` (so that asyncio logs no exception of it as never retrieved)."""
    if not fut.cancelled():
        fut.exception()


def _made_of(fut: asyncio.Future[Any]) -> list[asyncio.Future[Any]]:
    """The futures that ``asyncio.gather`` and ``asyncio.shield`` made of ``fut``, and those made of them in turn,
    as far as CPython shows them: inside the done callbacks those functions give what they wrap (their closures).
    Where it does not show them, fewer (each is only told its outcome was taken)."""
    found: list[asyncio.Future[Any]] = []
    todo = [fut]
    while todo and len(found) < _MADE_OF_MAX:
        current = todo.pop()
        try:
            callbacks = list(getattr(current, "_callbacks", None) or ())
        except (TypeError, AttributeError):
            continue
        for entry in callbacks:
            callback = entry[0] if isinstance(entry, tuple) else entry
            if getattr(callback, "__qualname__", "") not in _WRAPPERS:
                continue
            for cell in getattr(callback, "__closure__", None) or ():
                try:
                    outer = cell.cell_contents
                except ValueError:  # (an empty cell)
                    continue
                if isinstance(outer, asyncio.Future) and outer is not current and outer not in found:
                    found.append(outer)
                    todo.append(outer)
    return found


_WRAPPERS = frozenset({"gather.<locals>._done_callback", "shield.<locals>._inner_done_callback"})
"""The done callbacks by which ``asyncio.gather`` and ``asyncio.shield`` follow what they wrap."""
_MADE_OF_MAX = 64


class SqlTx(Queries):
    """An open transaction, handed to the function given to :meth:`Database.tx`.

    Its calls see its own writes. ``with_(channel)`` / ``with_(queue)`` bind a channel or a queue to it:
    what they publish or add happens only when the transaction commits.
    """

    def __init__(self, db: Database, tx_id: int, read_only: bool) -> None:
        self.db = db
        self.name = db.name
        self.id = tx_id
        self.read_only = read_only
        self.ended = False
        self._dropped: str | None = None  # why it ended, when its connection dropped (see _check)
        self._closed_why: str | None = None  # why it ended, when the store closed with it open (see _abandon)
        self.on_commit: list[Callable[[], Any]] = []
        self._store = db.store
        self._transport = db._transport
        self._tx = tx_id
        self._retry = False
        # the connection it began on (its reconnects so far): on another, its id means nothing
        self._connection = getattr(self._transport, "reconnects", 0)
        self._writes: list[tuple[Coroutine[Any, Any, Any], str]] = []  # see _watch
        self._prune_at = 64

    def __repr__(self) -> str:
        kind = "read-only " if self.read_only else ""
        return f"<tinystore.SqlTx {kind}transaction {self.id} of database {self.name}{' ended' if self.ended else ''}>"

    def exec(self, sql: str, /, *params: Any) -> Coroutine[Any, Any, Done]:
        """Run a statement inside the transaction (a coroutine: await it). Errors as :meth:`Database.exec`; a
        failed statement leaves the transaction usable (SQL-06). One never awaited fails the transaction (see
        :meth:`Database.tx`)."""
        return self._watch(self._exec(sql, *params), "tx.exec")

    async def _exec(self, sql: str, /, *params: Any) -> Done:
        if type(sql) is not str:
            sql = _sql_text(self.name, "tx.exec", sql)
        self._check()
        if self._store._dead is not None:
            raise self._store._dead
        done: Done = await self._transport.call(
            "sql.exec", Exec(self.name, sql, check_params(self.name, sql, params), self.id), Done, retry=False
        )
        if done.rows and self._transport.local:  # the engine's tuples as lists, as over a socket
            done.rows = [[*r] for r in done.rows]
        return done

    @overload
    def with_(self, thing: Channel[T]) -> TxChannel[T]: ...
    @overload
    def with_(self, thing: Queue[T]) -> TxQueue[T]: ...
    def with_(self, thing: Any) -> Any:
        """``thing`` (a channel or a queue) bound to this transaction: what it publishes or adds is kept only if
        the transaction commits. Raises ``InvalidError`` for anything else, or one of another store."""
        bind = getattr(thing, "_bind_tx", None)
        if bind is None:
            # (trial BU: tx.with_("events") said only that a str cannot take part)
            name = repr(thing) if isinstance(thing, str) and len(thing) <= 64 else "name"
            raise InvalidError(
                f"tx.with_: {a_or_an(type(thing).__name__)} cannot take part in a transaction: give it the Queue or "
                f"Channel object (store.queue({name}) or store.channel({name}))"
            )
        return bind(self)

    def _watch(self, coro: Coroutine[Any, Any, R], what: str) -> Coroutine[Any, Any, R]:
        """Keep ``coro``, a write of this transaction (``what``: how it was called), so that the commit can tell
        one that was never awaited (trial DO: a ``tx.with_(queue).add(...)`` without ``await`` never ran, and the
        transaction committed the rows without their job, with only Python's warning). The kept ones that ran
        are dropped once the list doubled since the last look (trial DP: looked at every 64 calls, thousands made
        before a ``gather`` cost quadratic time): O(1) amortized a call."""
        writes = self._writes
        if len(writes) >= self._prune_at:
            writes[:] = [(c, w) for c, w in writes if inspect.getcoroutinestate(c) != inspect.CORO_CLOSED]
            self._prune_at = max(64, 2 * len(writes))
        writes.append((coro, what))
        return coro

    def _unfinished(self) -> tuple[list[str], list[str]]:
        """The writes of :meth:`_watch` that have not finished: those never awaited, then those still under way
        (a task made of one, as ``create_task`` or ``gather`` makes, not awaited to its end: trial DS, a
        ``create_task(tx.with_(queue).add(...))`` waiting on the queue's first use was passed over, the rows
        committed, and the add then failed on the ended transaction, only logged). A task made of one is
        cancelled, and the outcome of the gathers and shields made of it is taken (:func:`_made_of`; trial DU:
        a gather logged a ``CancelledError`` never retrieved); one never started that no task drives is closed, so
        Python warns of none of them (trial DP: a coroutine closed under its task failed it with "cannot reuse
        already awaited coroutine"). A task that awaits one deeper down (a helper of the application's, perhaps a
        long-lived one that fn only handed the write to: trial DU) is its owner's: left to run, its write ends as
        the rolled-back transaction's calls do."""
        never: list[str] = []
        running: list[str] = []
        pending: dict[int, Coroutine[Any, Any, Any]] = {}
        for coro, what in self._writes:
            state = inspect.getcoroutinestate(coro)
            if state == inspect.CORO_CREATED:
                never.append(what)
            elif state != inspect.CORO_CLOSED:
                running.append(what)
            else:
                continue
            pending[id(coro)] = coro
        self._writes.clear()
        self._prune_at = 64
        if pending:
            driven: set[int] = set()
            for task in asyncio.all_tasks():
                key = id(task.get_coro())
                if key in pending:
                    # the futures made of it (a gather, a shield, those of them in turn) end with its cancel: their
                    # outcome is taken (trials DU, DV, DW: logged as never retrieved), and the other tasks they
                    # gather go on (trial DW: cancelling a gather cancelled a task of the application's in it)
                    for outer in _made_of(task):
                        outer.add_done_callback(_seen)
                    task.cancel()
                    driven.add(key)
            for key, coro in pending.items():
                if key not in driven and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                    coro.close()
        return never, running

    def _check(self) -> None:
        if self.ended:
            if self._dropped is not None:  # (trial DV: told as a call made after fn returned)
                raise UnavailableError(self._dropped)
            if self._closed_why is not None:
                raise ClosedError(self._closed_why)
            # (trial DU: a task that fn started and did not await made its write after fn returned)
            raise ClosedError(
                f"database {self.name}: transaction {self.id} has ended: a call made with it after its fn returned "
                "(from a task fn started and did not await?) is not run"
            )
        if getattr(self._transport, "reconnects", 0) != self._connection:
            self._end()
            self._dropped = (
                f"database {self.name}: the connection to the store dropped since transaction {self.id} began; "
                "it was rolled back with it (nothing of it was committed)"
            )
            raise UnavailableError(self._dropped)

    def _end(self) -> None:
        self.ended = True
        self._store._open_txs.discard(self)

    def _abandon(self) -> None:
        """End it, as the store closes with it open: it can no longer commit (a closing store takes no new call),
        and it held the database's writer, the writes the close waits for queued behind it until ``tx_idle`` (trial
        IB: an embedded or sidecar store's close took 5 s, 10 with a longer ``tx_idle``); rolled back now (the
        rollback awaited by the close), its later calls and its commit raise ``ClosedError``."""
        if self.ended:
            return
        self._end()
        self._closed_why = (
            f"database {self.name}: the store was closed while transaction {self.id} was open: it was rolled back "
            "(nothing of it was committed)"
        )
        self._store._call_at_close("sql.rollback", TxRef(self.id))

    async def _commit(self) -> None:
        self._check()
        self._end()
        try:
            await self.db.store._call("sql.commit", TxRef(self.id), Any, write=True, retry=False)
        except asyncio.CancelledError:
            # a commit the server had not begun when the cancel came is never run: end the transaction now
            # rather than at tx_idle (a rollback after a commit that ran changes nothing)
            self.db.store._undo_soon("sql.rollback", TxRef(self.id))
            raise
        except LostError:
            # a job's handler past its attempt's lease: the commit was not sent (see attempt_guard), and the
            # rollback is, at once (trial IR: the writer stayed held until tx_idle, other code's writes behind it)
            self.db.store._undo_soon("sql.rollback", TxRef(self.id))
            raise
        except TinystoreError as exc:
            if not exc.message.startswith("sql.commit: "):
                raise
            # (trial ES: the connection's own errors named the transaction, not its database; a commit's request
            # carries only the transaction's id)
            raise type(exc)(f"database {self.name}: {exc.message}", **exc.extra) from None
        for hook in self.on_commit:
            r = hook()
            if inspect.isawaitable(r):
                await r

    async def _rollback(self) -> None:
        if self.ended:
            return
        self._end()
        try:
            await asyncio.shield(self.db.store._call("sql.rollback", TxRef(self.id), Any, retry=False))
        except Exception:
            pass  # the server rolls back on its own when the connection is gone or the tx timed out


__all__ = ["Database", "SqlTx", "check_name"]
