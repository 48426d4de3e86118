"""Wire bodies of the SQL engine's methods."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..names import NAME

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
Params = (
    Annotated[list[Any], msgspec.Meta(max_length=PARAMS_MAX)]
    | Annotated[dict[str, Any], msgspec.Meta(max_length=PARAMS_MAX)]
)
"""A statement's parameters: values in order for its ``?`` placeholders, or values by name for its named ones."""


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


class _Head(msgspec.Struct, array_like=True):
    """The first fields of an :class:`Exec` or a :class:`Query` (what follows is skipped, not read)."""

    db: str
    sql: str
    params: msgspec.Raw


def too_many_params(body: bytes) -> str | None:
    """For the body of an ``sql.exec`` or ``sql.query`` that was refused as it was read: the message saying its
    statement has more than :data:`PARAMS_MAX` parameters, naming the database as the SDK's own check does (trial
    DS: msgspec's "Expected `array` of length <= 250000 - at `$[2]`" named neither); ``None`` when that is not
    what is wrong with it."""
    try:
        head = msgspec.msgpack.decode(body, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # (trial DU: nested deep)
        return None
    if not NAME.fullmatch(head.db):
        return None  # (no name to repeat: a megabyte of one, control characters; trial DU)
    raw = bytes(memoryview(head.params)[:5])
    if not raw:
        return None
    if raw[0] in (0xDC, 0xDE) and len(raw) >= 3:  # (an array, or a map: values by name)
        count = int.from_bytes(raw[1:3], "big")
    elif raw[0] in (0xDD, 0xDF) and len(raw) >= 5:
        count = int.from_bytes(raw[1:5], "big")
    else:
        return None  # (a fixarray or fixmap holds at most 15)
    if count <= PARAMS_MAX:
        return None
    return f"database {head.db}: too many SQL variables ({count:,} parameters; at most {PARAMS_MAX:,})"


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
