"""Wire bodies of the SQL engine's methods."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Value = None | int | float | str | bytes | bool


class Migration(msgspec.Struct, array_like=True):
    name: str
    text: str


class OpenDb(msgspec.Struct, kw_only=True):
    """``sql.open``: open (create) database ``db`` and apply the migrations not applied yet."""

    db: str
    migrations: list[Migration] = []


class Opened(msgspec.Struct, kw_only=True):
    db: str
    applied: list[str]
    path: str


PARAMS_MAX = 250_000
"""Parameters of one statement: SQLite's own bound as Debian builds it (``SQLITE_MAX_VARIABLE_NUMBER``), refused
past it as the body is read (trial DJ: 15 million were each checked on the server's loop, 1.1 s, before SQLite
refused their count)."""
Params = Annotated[list[Any], msgspec.Meta(max_length=PARAMS_MAX)]


class Exec(msgspec.Struct, array_like=True):
    """``sql.exec``: one statement that may write. ``tx``: the transaction it runs in (0: its own)."""

    db: str
    sql: str
    params: Params
    tx: int = 0


class Query(msgspec.Struct, array_like=True):
    """``sql.query``: a read on a reader (or inside transaction ``tx``). ``mode``: "all", "one" or "scalar"."""

    db: str
    sql: str
    params: Params
    mode: str = "all"
    tx: int = 0


class Done(msgspec.Struct, array_like=True):
    """What a write did: rows changed, the last rowid, and what a ``returning`` clause gave.

    ``rows`` is a list of lists (one a row, its values in the order of ``columns``) in every mode: an embedded
    store gives the same as a socket does.
    """

    changes: int
    last_insert_rowid: int
    columns: list[str]
    rows: list[list[Any]]


class Rows(msgspec.Struct, array_like=True):
    columns: list[str]
    rows: list[list[Any]]


class Begin(msgspec.Struct, array_like=True):
    db: str
    read_only: bool = False


class TxRef(msgspec.Struct, array_like=True):
    tx: int
