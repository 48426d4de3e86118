"""The guard on the SQLite connections that a database's clients share (its writer, its readers).

SQLite's authorizer (:func:`statement_authorizer`) refuses, when a client's statement is prepared: transaction control
(the engine's), ``ATTACH``/``DETACH``, TEMP objects, pragmas that change the shared connection or what durability
stands on, writes to the store's own tables (:data:`OWN_PREFIX`), and, on the event loop's inline connection, functions
whose cost a progress handler cannot cut. The engine's own statements (:func:`own_sql`, :func:`ctl`) carry a mark
random in each process, so that a client's statement of the same words never finds them prepared, with the engine's
rights, in sqlite3's statement cache.
"""

from __future__ import annotations

import itertools
import re
import secrets
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidError


class GuardedConnection(sqlite3.Connection):
    """A connection whose statements may not control transactions (``BEGIN``, ``COMMIT``, ``ROLLBACK``,
    ``END``, ``SAVEPOINT``, ``RELEASE``): the engine does, and a client's ``COMMIT`` in the middle of a group
    commit, or a ``BEGIN`` left open on a reader, would break what it promises. SQLite's authorizer refuses
    them when a statement is prepared, unless :func:`ctl` runs it (the engine's own)."""

    internal = False
    big = 0  # characters of long statements (over CACHED_SQL) run here: sqlite3 keeps them prepared (see _recycle)
    writer = False  # a reader's statements write nothing (query_only): the store's own tables need no guard there
    resets_rowid = False  # a writer's: see _ROWID_RESET
    control = False  # one of the engine's own transaction statements runs (never stopped by the progress handler)
    restricted = False  # a statement of a client without the admin capability runs (see RESTRICTED_MARK)


_TX_ACTIONS = frozenset({sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT})
DENIED_MESSAGES = frozenset({"not authorized", "authorization denied"})
denial = threading.local()  # why the authorizer refused the statement last prepared on this thread
TX_WHY = (
    "BEGIN, COMMIT, ROLLBACK, SAVEPOINT and RELEASE are run by the store (each exec is a transaction of its own; "
    "db.tx runs several statements in one)"
)


def _deny(why: str, permission: bool = False) -> int:
    denial.why = why
    denial.permission = permission  # (the client's capability, not the statement, is what is wrong)
    return sqlite3.SQLITE_DENY


OFF_LOOP = frozenset({"like", "glob", "instr", "replace", "trim", "ltrim", "rtrim", "printf", "format", "match"})
"""Functions a read on the event loop may not call (the inline connection refuses them; the read then runs on a
reader thread): ``like``, ``glob``, ``instr``, ``replace`` and the ``trim`` functions work in time that grows with
the product of their arguments' sizes, in one SQLite step that the progress handler cannot cut (seconds, on
texts under 1 MiB); ``printf``/``format`` give NULL, not an error, past a connection's length limit; ``match``
(full-text search) works in its own table's code. A view that calls one counts too (SQLite asks about the
view's functions when it prepares a statement that reads the view)."""
_OFF_LOOP_PRAGMAS = frozenset({"wal_checkpoint", "integrity_check", "quick_check", "foreign_key_check", "optimize"})
"""Pragmas that may work or wait long (a checkpoint waits for the writer): off the loop, as :data:`OFF_LOOP`."""
_HIDDEN_TABLES = frozenset({"sqlite_stmt", "sqlite_dbpage"})
"""Virtual tables no client may read: the prepared statements of a connection (their texts: other clients' SQL,
and the marks that keep the engines' cached statements apart), and the raw pages of the file."""
WRITER_ONLY = "writes: it runs alone on the writer"
"""What the refusal of a statement that only the writer runs (VACUUM, a WAL checkpoint) on a reader says."""
MOVE_OFF_LOOP = "(run it on a reader thread)"
"""The ``why`` of a refusal on the inline connection: :meth:`SqlDatabase.read_now` moves the read, silently."""


RESTRICTED_WHY = (
    "CREATE, DROP and ALTER (and ANALYZE, REINDEX, VACUUM, writes to the planner's statistics sqlite_stat1 .. "
    "sqlite_stat9, the PRAGMAs optimize and incremental_vacuum, their table functions too, and auto_vacuum, page_size, "
    "user_version or application_id set) need the admin capability (change the schema with a migration); this "
    "connection's token is not an admin token"
)
"""What the refusal of a schema change to a client without the admin capability says (see :func:`restricted_sql`)."""
_SCHEMA_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_CREATE_VTABLE,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_DROP_VTABLE,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_REINDEX,
        sqlite3.SQLITE_ANALYZE,
    }
)
_STATISTICS = re.compile(r"sqlite_stat[0-9]\Z", re.IGNORECASE)
_PRAGMAS_ALWAYS = frozenset({"optimize", "incremental_vacuum"})  # (ANALYZE, a part of a VACUUM)
_PRAGMAS_WHEN_SET = frozenset({"auto_vacuum", "page_size", "user_version", "application_id"})  # (migrations' own)


def _restricted_denies(action: int, arg1: str | None, arg2: str | None) -> bool:
    """Whether a client without the admin capability may not have ``action`` (SQLite's authorizer codes) in its
    statement: what changes the schema or the file's shape, whatever the words that asked for it (a table function
    ``pragma_optimize`` asks for PRAGMA optimize; ``EXPLAIN`` of a PRAGMA asks as the PRAGMA does)."""
    if action in _SCHEMA_ACTIONS:
        return True
    if action == sqlite3.SQLITE_ATTACH:
        # VACUUM, whose scratch database has no name (any other ATTACH is refused to all clients, and says so:
        # trial HH, a data token's was told it needed the admin capability)
        return arg1 == ""
    if action == sqlite3.SQLITE_PRAGMA and arg1 is not None:
        name = arg1.lower()
        return name in _PRAGMAS_ALWAYS or (name in _PRAGMAS_WHEN_SET and arg2 is not None)
    if action in _WRITES and arg1 is not None:
        return _STATISTICS.match(arg1) is not None
    return False


RESTRICTED_MARK = f"/* ts data {secrets.token_hex(8)} */ "
"""Starts the texts of the statements of a client without the admin capability (:func:`restricted_sql`)."""


def restricted_sql(sql: str) -> str:
    """``sql`` as the statement of a client without the admin capability: SQLite's authorizer refuses it every
    schema change (:data:`RESTRICTED_WHY`) as it is prepared and runs (see :func:`restrict`). The mark (random in
    each process, a comment that leads, so that no error or column name shows it) keeps it apart in sqlite3's
    statement cache, which is keyed by the text: the same words that an admin's client had prepared, allowed, are
    never found there for it."""
    return RESTRICTED_MARK + sql


def is_restricted(sql: str) -> bool:
    """Whether ``sql`` is a restricted client's (:func:`restricted_sql`), :data:`DEFERRING_TAG` before it or not."""
    return sql.startswith(RESTRICTED_MARK) or (
        sql.startswith(DEFERRING_TAG) and sql.startswith(RESTRICTED_MARK, len(DEFERRING_TAG))
    )


def client_text(sql: str) -> str:
    """``sql`` as its client sent it (without the store's marks), for a message."""
    if sql.startswith(DEFERRING_TAG):
        sql = sql[len(DEFERRING_TAG) :]
    return sql[len(RESTRICTED_MARK) :] if sql.startswith(RESTRICTED_MARK) else sql


def restrict(conn: sqlite3.Connection, sql: str) -> bool:
    """Give ``conn`` the restricted rights when ``sql`` is a restricted client's (:func:`restricted_sql`); returns
    whether it did, and then the caller must :func:`unrestrict` once the statement is over: not when it was
    prepared, but after its last row was read, as SQLite prepares and authorizes statements while one runs too (a
    table function ``pragma_optimize`` prepares its PRAGMA and then an ANALYZE as it makes its row: trial HF, at
    the second row of a statement, after the flag was off). Every client statement of every connection runs so."""
    if sql.startswith(RESTRICTED_MARK) or (sql.startswith(DEFERRING_TAG) and is_restricted(sql)):
        c: Any = conn
        c.restricted = True
        return True
    return False


def unrestrict(conn: sqlite3.Connection) -> None:
    c: Any = conn
    c.restricted = False


def statement_authorizer(
    conn: GuardedConnection, inline: bool = False
) -> Callable[[int, str | None, str | None, str | None, str | None], int]:
    ref = weakref.ref(conn)

    def internal() -> bool:
        c = ref()
        return c is not None and c.internal

    def restricted() -> bool:
        c = ref()
        return c is not None and c.restricted

    def writer() -> bool:
        c = ref()
        return c is not None and c.writer

    def authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if restricted() and _restricted_denies(action, arg1, arg2):
            # (before the engine's rights: a restricted client's VACUUM runs with them, for its scratch database)
            return _deny(RESTRICTED_WHY, permission=True)
        if action == sqlite3.SQLITE_READ and arg1 is not None and arg1.lower() in _HIDDEN_TABLES and not internal():
            return _deny(
                f"{arg1.lower()} is refused (it shows the statements the store has prepared, other clients' "
                "among them, or the file's raw pages)"
            )
        if action == sqlite3.SQLITE_PRAGMA and arg1 is not None and arg1.lower() == "wal_checkpoint" and not internal():
            # on a reader's connection, a TRUNCATE or RESTART checkpoint waits (its busy timeout, a minute) for
            # every open snapshot while it holds the writer's lock: every write of the database waited, and
            # neither the statement's time limit nor a cancel stopped it (trial CC). On the writer, only the
            # engine's runs one (db.exec's, alone, outside any transaction): inside one, SQLite refuses it as
            # "database table is locked" (trial CH: in db.tx, or spelled so that db.exec did not know it)
            return _deny(
                f"PRAGMA wal_checkpoint {WRITER_ONLY} (db.exec outside any transaction; `tinystore sql --write`)"
            )
        if (
            action == sqlite3.SQLITE_PRAGMA
            and arg1 is not None
            and arg1.lower() == "optimize"
            and not writer()
            and not internal()
        ):
            # a reader's connection cannot write the statistics that PRAGMA optimize makes, and SQLite then says
            # nothing: it answered no row, as it does when it worked (`tinystore sql DIR "pragma optimize"` without
            # --write, or db.query, did nothing without a word)
            return _deny(f"PRAGMA optimize {WRITER_ONLY} (db.exec; `tinystore sql --write`)")
        if inline and action == sqlite3.SQLITE_PRAGMA and arg1 is not None and arg1.lower() in _OFF_LOOP_PRAGMAS:
            return _deny(MOVE_OFF_LOOP)
        if action == sqlite3.SQLITE_ATTACH or action == sqlite3.SQLITE_DETACH:
            if action == sqlite3.SQLITE_ATTACH and arg1 == "":
                # VACUUM (its scratch database has no file name): the engine's own, run alone on the writer
                if internal():
                    return sqlite3.SQLITE_OK
                return _deny(f"VACUUM {WRITER_ONLY} (db.exec outside any transaction; `tinystore sql --write`)")
            # a database is one file of the store: ATTACH (and VACUUM INTO) would let a client write files
            # anywhere the server can, and ATTACH would stay attached on a connection other clients share
            return _deny(
                "ATTACH, DETACH and VACUUM INTO are refused (each database is one file of the store; they would "
                "reach files elsewhere)"
            )
        if action in _TX_ACTIONS:
            if not internal():
                return _deny(TX_WHY)
        elif action == sqlite3.SQLITE_PRAGMA and arg2 is not None and arg1 is not None and not internal():
            name = arg1.lower()
            if db == "temp":
                # (trial HQ: `pragma temp.user_version = 3` was taken, on the writer's connection)
                return _deny(
                    f"setting PRAGMA temp.{name} is refused (the TEMP schema is the connection's, which every "
                    "client of the store shares)"
                )
            if name == "schema_version":
                return _deny(
                    "setting PRAGMA schema_version is refused (SQLite's own count of schema changes: a wrong value "
                    "leaves the store's other connections on a stale schema, and SQLite warns it can corrupt)"
                )
            if name in _KEPT:
                # readers are read-only by query_only: a client that turned it off could write through a read (and
                # through a read of the store's own databases); turned on, it would stop the writer for everyone.
                # journal_mode, synchronous and locking_mode are what durability and readers in parallel stand on.
                return _deny(f"setting PRAGMA {name} is refused (the store's durability and its readers stand on it)")
            if name in _SHARED:
                return _deny(
                    f"setting PRAGMA {name} is refused (it would change the connection that every client of the "
                    "store shares)"
                )
        elif (
            action in _TEMP_OBJECTS
            or (db == "temp" and action in _WRITES and arg1 not in _TEMP_SCHEMA)
            # a new row of the TEMP schema is a TEMP object made, whatever the words (``create trigger temp.x on
            # t`` is a CREATE_TRIGGER of main's table t, then this insert); SQLite's own rewrites only update it
            or (db == "temp" and action == sqlite3.SQLITE_INSERT and arg1 is not None and arg1.lower() in _SCHEMAS)
            or (action == sqlite3.SQLITE_ALTER_TABLE and arg1 == "temp")
        ):
            if not internal():
                return _deny(
                    "TEMP tables, views, triggers and indexes are refused (they would stay on a connection that "
                    "every client of the store shares, and a TEMP trigger would fire on their writes): use a table "
                    "of the database"
                )
        elif action == sqlite3.SQLITE_FUNCTION and arg2 is not None:
            name = arg2.lower()
            if inline and name in OFF_LOOP:
                return _deny(MOVE_OFF_LOOP)
            if name == "load_extension":
                return _deny("load_extension is refused (an extension would run its code inside the store's process)")
            if name == "fts3_tokenizer":
                return _deny("fts3_tokenizer is refused (it hands out addresses inside the store's process)")
        if action in _OWN_TABLE_ACTIONS:
            table = arg2 if action in _OWN_TABLE_IN_ARG2 else arg1
            other = arg1 if action in _OWN_TABLE_IN_ARG2 and action != sqlite3.SQLITE_ALTER_TABLE else None
            own = next((n for n in (table, other) if n is not None and n.lower().startswith(OWN_PREFIX)), None)
            if own is not None and not internal() and writer():
                return _deny(
                    f"{own} belongs to the store (names starting with {OWN_PREFIX} are its own: the record of "
                    "migrations, the jobs): a client may read such a table, not write, create, alter or drop one, "
                    "nor put an index or trigger on it"
                )
        return sqlite3.SQLITE_OK

    return authorize


# pragmas a client may read but not set (the store sets them)
_KEPT = frozenset({"query_only", "journal_mode", "synchronous", "locking_mode"})
# pragmas that set a state of the connection, which the clients of a database share (its writer, its readers)
_SHARED = frozenset(
    {
        "analysis_limit",
        "automatic_index",
        "busy_timeout",
        "cache_size",
        "cache_spill",
        "case_sensitive_like",
        "cell_size_check",
        "count_changes",
        "checkpoint_fullfsync",
        "data_store_directory",
        "default_cache_size",
        "empty_result_callbacks",
        "foreign_keys",
        "full_column_names",
        "fullfsync",
        "hard_heap_limit",
        "ignore_check_constraints",
        "journal_size_limit",
        "legacy_alter_table",
        "legacy_file_format",
        "max_page_count",
        "mmap_size",
        "parser_trace",
        "read_uncommitted",
        "recursive_triggers",
        "reverse_unordered_selects",
        "secure_delete",
        "short_column_names",
        "soft_heap_limit",
        "temp_store",
        "temp_store_directory",
        "threads",
        "trusted_schema",
        "vdbe_addoptrace",
        "vdbe_debug",
        "vdbe_listing",
        "vdbe_trace",
        "wal_autocheckpoint",
        "writable_schema",
    }
)
# TEMP objects: a client's would stay on a connection that all clients share; the engine's own (the writer's
# _tinystore_rowid) must stay as the engine made it, or every later insert of every client would fail
_TEMP_OBJECTS = frozenset(
    {
        sqlite3.SQLITE_CREATE_TEMP_INDEX,
        sqlite3.SQLITE_CREATE_TEMP_TABLE,
        sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
        sqlite3.SQLITE_CREATE_TEMP_VIEW,
        sqlite3.SQLITE_DROP_TEMP_INDEX,
        sqlite3.SQLITE_DROP_TEMP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_TRIGGER,
        sqlite3.SQLITE_DROP_TEMP_VIEW,
    }
)
_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})
# the TEMP schema: SQLite rewrites it itself in ALTER TABLE ... RENAME and DROP COLUMN (the writer has a TEMP
# table), and refuses a client's own write to it (it needs writable_schema, which is refused)
_TEMP_SCHEMA = frozenset({"sqlite_temp_master", "sqlite_temp_schema"})
_SCHEMAS = frozenset({"sqlite_master", "sqlite_schema", *_TEMP_SCHEMA})
OWN_PREFIX = "_tinystore"
"""Tables, indexes and triggers named so are the store's (``_tinystore_migrations``, the jobs tables of a database
that holds queues): clients read them, only the engines' own statements (:func:`own_sql`) write them."""
# what makes, changes or drops a table, an index or a trigger, or writes rows: the name is arg1, or for those in
# _OWN_TABLE_IN_ARG2 the table is arg2 (arg1: the index or trigger; for ALTER TABLE, the database)
_OWN_TABLE_ACTIONS = frozenset(
    {
        *_WRITES,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_CREATE_VTABLE,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_DROP_VTABLE,
        sqlite3.SQLITE_ALTER_TABLE,
    }
)
_OWN_TABLE_IN_ARG2 = frozenset(
    {
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_ALTER_TABLE,
    }
)
_CTL_TAG = " --ts " + secrets.token_hex(8)
"""Ends the texts of the engine's own statements (:func:`ctl`)."""

# the writer's own TEMP table: a REPLACE of its row 0 before each insert sets the connection's last insert rowid
# to 0, so that an insert that adds no rowid row (an upsert's DO UPDATE, a WITHOUT ROWID table) gives 0, not the
# rowid of the last row another client inserted
# (``_CTL_TAG`` on it too: a client's statement of the same words must not find it prepared, see ctl)
_ROWID_RESET = "replace into temp._tinystore_rowid (rowid) values (0)" + _CTL_TAG
# in a transaction, the same REPLACE sets it to the rowid of the transaction's last insert instead (then that row
# goes): SQL's last_insert_rowid() sees what it would on a connection of the client's own (see SqlDatabase._exec)
_ROWID_SET = "replace into temp._tinystore_rowid (rowid) values (?)" + _CTL_TAG
_ROWID_DROP = "delete from temp._tinystore_rowid where rowid = ?" + _CTL_TAG


_OWN_MARK = f"/* ts {secrets.token_hex(8)} */ "
"""Starts the texts of the engines' own statements (:func:`own_sql`)."""


def own_sql(sql: str) -> str:
    """``sql`` as an engine's own statement's text. Its rights (to write the store's tables, :data:`OWN_PREFIX`)
    come with the call (``own=True``), never from a text; the text differs from any a client can send (a
    random mark, in each process), so that a client's statement of the same words is not found prepared, with the
    engine's rights, in sqlite3's statement cache. The mark leads: SQLite keeps a CREATE's text in the schema
    from its first keyword, so no client can read it there."""
    return _OWN_MARK + sql


def as_engine(
    conn: sqlite3.Connection,
    sql: str,
    params: Sequence[Any] | dict[str, Any] = (),
) -> sqlite3.Cursor:
    """Run ``sql`` (already :func:`own_sql`'s text) on ``conn`` with the engine's rights."""
    c: Any = conn
    c.internal = True
    try:
        return conn.execute(sql, params)
    finally:
        c.internal = False


def own_execute(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
    return as_engine(conn, own_sql(sql), params)


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back what ``conn`` has open, if anything; a rollback that fails (the transaction is gone) is no news."""
    if conn.in_transaction:
        try:
            ctl(conn, "rollback")
        except sqlite3.Error:
            pass


def ctl(conn: sqlite3.Connection, sql: str) -> None:
    """Run one of the engine's own transaction statements on ``conn``, ``sql`` with :data:`_CTL_TAG` added.

    SQLite's authorizer runs when a statement is prepared, and sqlite3 keeps prepared statements by their text:
    a client's statement of the very same text would run the one prepared (and allowed) for the engine. The
    tag, random in each process, is a text no client can know."""
    c: Any = conn
    c.internal = c.control = True
    try:
        conn.execute(sql + _CTL_TAG)
    finally:
        c.internal = c.control = False


def rowid_tables(conn: sqlite3.Connection) -> frozenset[str]:
    """The names (in lower case) of the ordinary rowid tables of the main database on ``conn``: a row an INSERT
    adds to one sets the connection's last insert rowid. As SQLite itself tells (``pragma table_list``, SQLite
    3.37: its ``wr`` column; not from the text, which may hold a comment inside WITHOUT ROWID: trial CO): not a
    ``WITHOUT ROWID`` table, not a virtual or shadow table, not a view; not a name the TEMP schema also has (the
    one an unqualified name finds); only names in ASCII. None at all on an older SQLite."""
    try:
        listed = own_execute(conn, "select schema, name, type, wr from pragma_table_list").fetchall()
    except sqlite3.Error:
        return frozenset()
    temp = {name.lower() for schema, name, _, _ in listed if schema == "temp"}
    return frozenset(
        low
        for schema, name, kind, wr in listed
        if schema == "main" and kind == "table" and not wr and name.isascii() and (low := name.lower()) not in temp
    )


def set_rowid(conn: sqlite3.Connection, rowid: int) -> None:
    """Set the writer's last insert rowid (SQL's ``last_insert_rowid()``) to ``rowid``, through its TEMP table."""
    c: Any = conn
    c.internal = True  # a client may not write the engine's TEMP table (authorizer)
    try:
        if rowid:
            conn.execute(_ROWID_SET, (rowid,))
            conn.execute(_ROWID_DROP, (rowid,))
        else:
            conn.execute(_ROWID_RESET)
    finally:
        c.internal = False


DEFERRING_TAG = f"/* ts deferring {secrets.token_hex(8)} */ "
"""Starts the texts a transaction runs after its ``PRAGMA defer_foreign_keys`` (first, so that no error or column
name shows it, as an ending could for a text that ends inside a quote or a comment): SQLite (3.40) prepares a statement
without its ``ON DELETE``/``ON UPDATE RESTRICT`` while the pragma is on, and the writer's statement cache (keyed by
the text) would hand that statement to other clients after the transaction."""


# what a client's schema change may not make: an object named as the store's own (ALTER TABLE ... RENAME TO gives
# the authorizer the old name only), a foreign key to one of the store's tables (REFERENCES reaches no authorizer;
# a row of the client's pointing at a job would stop the engine's deletes of ended jobs: trial BB)
_OWN_OBJECTS = own_sql(
    "select type || ' ' || name from sqlite_schema where name like '\\_tinystore%' escape '\\' "
    "union all select 'reference ' || m.name || ' ' || f.\"table\" from sqlite_schema m "
    "join pragma_foreign_key_list(m.name) f where m.type = 'table' and f.\"table\" like '\\_tinystore%' escape '\\' "
    # a client's trigger whose text names a table of the store (it may read one, not write it: see _check_trigger)
    "union all select 'naming ' || name || char(31) || tbl_name from sqlite_schema where type = 'trigger' "
    "and sql like '%\\_tinystore%' escape '\\' and name not like '\\_tinystore%' escape '\\'"
)


_OWN_WORD = re.compile(OWN_PREFIX, re.IGNORECASE)


def names_own(sql: str) -> bool:
    """Whether ``sql``'s text holds the store's prefix, in any case (quoted or not, in a comment or a string too):
    a statement can name an object, or a foreign key's table, only by writing its name, so one whose text does not
    is not checked with :func:`own_objects`, which reads every table's foreign keys (before and after each of 2,000
    CREATE TABLEs, a migration took 12 s instead of 0.2: trial BD). SQLite folds only ASCII letters' case; ``re``
    folds more (a Kelvin sign for a k), which only checks more."""
    return _OWN_WORD.search(sql) is not None


def own_objects(conn: sqlite3.Connection) -> frozenset[str]:
    """The store's tables, indexes and triggers of the database on ``conn``, and the foreign keys that point at
    them: what :func:`check_own_objects` compares around a client's schema change."""
    return frozenset(r[0] for r in as_engine(conn, _OWN_OBJECTS))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_CHECKS = itertools.count()
"""Numbers the texts :func:`_check_trigger` prepares, so that none is found in sqlite3's statement cache."""
_NOT_FIRING = "because it is a view"
"""What SQLite says of a statement a view takes no trigger for (``cannot modify v because it is a view``): of the
trigger's own view, and no other (trial II: one its body writes, which stopped the preparing before the write of
``_tinystore_jobs`` after it was judged)."""


def _check_trigger(db: str, conn: sqlite3.Connection, trigger: str, table: str) -> None:
    """Raise ``InvalidError`` when the client's new ``trigger`` of ``table``, whose text names a table of the store,
    writes one. SQLite looks into a trigger's body only when a statement that fires it is prepared (its authorizer
    is asked then, of the trigger's statements): a trigger that wrote ``_tinystore_jobs`` was made, and every later
    write of its table refused (trial IF). The statements that could fire it (an insert, an update of every column,
    one of the rowid by each of its names, a delete) are prepared here, not run (``EXPLAIN``), as the client: the
    authorizer judges its body, and the triggers it fires in turn, as it would when they fire. Each text is new
    (numbered): a statement sqlite3 kept prepared is not prepared again, nor its triggers judged (trial IG). One that
    cannot be prepared for another reason than a view's (a table its body names that does not exist yet,
    ``_tinystore_jobs`` before the first queue of the database, trial IG) cannot be judged: refused too."""
    columns = [
        _quote(str(r[1])) for r in conn.execute(f"select * from pragma_table_xinfo({_quote_text(table)})") if r[6] == 0
    ]
    firing = [f"insert into {_quote(table)} default values", f"delete from {_quote(table)}"]
    if columns:
        firing.append(f"update {_quote(table)} set " + ", ".join(f"{c} = {c}" for c in columns))
    # (an "update of rowid" trigger fires when an update sets rowid by that name, SQLite comparing the names as
    # written: trial IK. A table without a rowid, or a view, has none to set: "no such column" is passed over, of
    # each name alone: trial IM, a table without a rowid whose column was named rowid had no oid)
    aliases = {f"update {_quote(table)} set {name} = {name}": name for name in ("rowid", "oid", "_rowid_")}
    firing += aliases
    for sql in firing:
        denial.why = None
        try:
            conn.execute(f"explain {sql} -- check {next(_CHECKS)}").close()
        except sqlite3.DatabaseError as exc:
            why = getattr(denial, "why", None)
            denial.why = None
            if why is not None and str(exc) in DENIED_MESSAGES:
                raise InvalidError(
                    f"database {db}: trigger {trigger} of {table} is refused: its statements would be refused as it "
                    f"fires: {why}"
                ) from None
            if str(exc) != f"cannot modify {table} {_NOT_FIRING}" and str(exc) != f"no such column: {aliases.get(sql)}":
                raise InvalidError(
                    f"database {db}: trigger {trigger} of {table} is refused: its text holds the name of the "
                    f"store's tables ({OWN_PREFIX}..., which a trigger may read but never write), and whether it "
                    f"writes one cannot be judged now ({exc}): make what it names first"
                ) from None


def _quote_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def check_own_objects(db: str, before: frozenset[str], conn: sqlite3.Connection) -> None:
    """Raise ``InvalidError`` when the client's statement just run on ``conn`` made an object named as the
    store's, a foreign key to one of its tables, or a trigger that writes one (``before``: :func:`own_objects`
    before it). The caller undoes the statement (its savepoint, or its transaction)."""
    made = sorted(own_objects(conn) - before)
    for item in made:
        kind, _, rest = item.partition(" ")
        if kind == "naming":
            trigger, _, table = rest.partition("\x1f")
            _check_trigger(db, conn, trigger, table)
    made = [item for item in made if not item.startswith("naming ")]
    if not made:
        return
    kind, _, rest = made[0].partition(" ")
    if kind == "reference":
        table, _, own = rest.partition(" ")
        raise InvalidError(
            f"database {db}: table {table} would have a foreign key to {own}, which belongs to the store (names "
            f"starting with {OWN_PREFIX} are its own): its rows would stop the store's own deletes (ended jobs); "
            "keep the id in a column without REFERENCES"
        )
    raise InvalidError(
        f"database {db}: {rest} belongs to the store (names starting with {OWN_PREFIX} are its own: the record of "
        "migrations, the jobs): a client may not make a table, index or trigger of that name, nor rename one to it"
    )
