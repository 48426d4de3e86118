"""What the SQL engine reads in a statement's text before SQLite does: the parameters (values that SQLite can
hold, positional, or named in one dict; a named placeholder given positional values is refused), where the first
keyword starts, and the kinds of statement the engine treats apart (schema changes, ``VACUUM``, inserts, ``PRAGMA
defer_foreign_keys``, ``INITIALLY DEFERRED`` constraints); migrations' names checked and their scripts split into
statements. Pure functions: no I/O, no threads."""

from __future__ import annotations

import functools
import math
import re
import sqlite3
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from ..errors import (
    InvalidError,
)
from ..names import a_or_an
from ..protocol.sql import PARAMS_MAX
from ..protocol.values import shown
from .sql_guard import client_text

INT_MIN = -(1 << 63)
INT_MAX = (1 << 63) - 1


_PLAIN = frozenset({str, bytes, type(None)})


SqlParams = list[Any] | dict[str, Any]
"""A statement's parameters once checked: values for its ``?`` placeholders in order, or values by name for its
named ones (``:name``, ``@name``, ``$name``), as Python's ``sqlite3`` binds them."""


ParamsIn = Sequence[Any] | Mapping[str, Any]
"""A statement's parameters as given: values in order, or one mapping of values by name (see :func:`check_params`)."""


def check_params(db: str, sql: str, params: ParamsIn) -> SqlParams:
    """Return ``params`` as SQLite values for ``sql``: a list, for its ``?`` placeholders in order; or, when
    ``params`` is one mapping (``(dict,)``, as ``db.one(sql, {"id": 7})`` gives it) or a dict (as a socket brings
    it), a dict of values by name for its named placeholders (``:id``, ``@id``, ``$id``; the names without the
    sigil, as Python's ``sqlite3`` takes them). ``InvalidError`` for a value SQLite cannot hold, a name that is no
    text, or a named placeholder in ``sql`` given positional values (SQLite would bind them by number, silently).

    A list whose values are all fine already is returned as it is (not copied). More than :data:`PARAMS_MAX`
    parameters: ``InvalidError``, as SQLite words it (a server refuses them as it reads the call; trial DK: its
    refusal named neither the database nor the parameters)."""
    if type(params) is dict:
        return _check_named(db, params)
    params = cast(Sequence[Any], params)
    if len(params) > PARAMS_MAX:
        raise InvalidError(
            f"database {db}: too many SQL variables ({len(params):,} parameters; at most {PARAMS_MAX:,})"
        )
    named = named_placeholder(sql)
    if named is not None:
        if len(params) == 1 and isinstance(params[0], Mapping):
            return _check_named(db, params[0], sql)
        if any(isinstance(p, Mapping) for p in params):  # (trial IC: told to give a dict, which it had)
            raise InvalidError(
                f"database {db}: the statement has the named placeholder {named}: the dict of its values by name is "
                f"the only parameter after the SQL ({len(params)} were given)"
            )
        raise InvalidError(
            f"database {db}: the statement has the named placeholder {named}: give its values by name in one dict "
            f"after the SQL (db.exec(sql, {{{named[1:]!r}: value}})), or use ? placeholders, their values in order "
            "after the SQL"
        )
    for v in params:
        t = type(v)
        if t is int:
            if not INT_MIN <= v <= INT_MAX:
                break
        elif t is float:
            if v != v:  # NaN
                break
        elif t not in _PLAIN:
            break
    else:
        return params if type(params) is list else list(params)
    if len(params) == 1 and isinstance(params[0], Mapping):
        # (a statement without named placeholders given values by name, as Python's sqlite3 takes it: SQLite says
        # what is wrong, if anything, "Binding 1 has no name" for a ? placeholder)
        return _check_named(db, params[0])
    return _check_params(db, params)


def name_class(also: str = "", *, negated: bool = False) -> str:
    """A regex character class of what SQLite takes into a name (tokenize.c: letters, digits, ``_`` and every
    character past ASCII) and the ASCII characters of ``also``; ``negated``: of every other character.

    It is written by its ASCII characters alone (``[^...]``): a class that names the range ``\\x80-\\U0010ffff``
    takes ``re`` some 6 ms to compile (13 ms ignoring case), which each process paid at import, five times."""
    inside = set(string.ascii_letters + string.digits + "_" + also)
    out = [c for c in range(128) if chr(c) not in inside]
    spans: list[list[int]] = []
    for c in out:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    body = "".join(f"\\x{a:02x}" if a == b else f"\\x{a:02x}-\\x{b:02x}" for a, b in spans)
    return f"[{body}]" if negated else f"[^{body}]"


_NAME_START = name_class()
NAME_OR_DOLLAR = name_class("$")
_NOTHING_ELSE = name_class("'\"`[-/:@$#", negated=True)  # (no name, quote, comment, sigil: a run of these is plain)
# what a statement holds outside its placeholders, eaten without backtracking (possessive): strings, quoted
# names, comments (a quote or comment left open runs to the end), names and numbers (with the "$" SQLite allows
# inside a name), and any other run of characters that starts none of these
_NOT_A_PLACEHOLDER = re.compile(
    r"(?:'[^']*+(?:'|$)|\"[^\"]*+(?:\"|$)|`[^`]*+(?:`|$)|\[[^\]]*+(?:\]|$)|--[^\n]*+|/\*(?:[^*]|\*(?!/))*+(?:\*/|$)"
    rf"|{_NAME_START}{NAME_OR_DOLLAR}*+|{_NOTHING_ELSE}++|[-/]|[:@$#]:*+(?!{NAME_OR_DOLLAR}))*+"
)
# where the loop above stops: a sigil (or a run of ':') before a name character, one placeholder or two (see
# _named_placeholders); then the rest of the placeholder: what SQLite's tokenizer takes into a variable
# (tokenize.c, TK_VARIABLE): identifier characters ("$" among them: "@$", "$$" are names too) and "::" pairs, then,
# after one of them, a "(...)" suffix (TCL's) up to a ")" with no blank before it (trial IM: "$a(x)" is one
# placeholder, "a(x)"). Each run of ':' is read once, by possessive patterns: 2 MB of ':' is a linear scan
_SIGIL_RUN = re.compile(r"([@$#]?)(:*+)")
_PLACEHOLDER_REST = re.compile(rf"(?:{NAME_OR_DOLLAR}|::)*+(?:\([^) \t\n\v\f\r]*+\))?")
CACHED_SQL = 4096
"""Statements up to this many characters have their scan kept (the usual ones, sent again and again)."""


def _cached_for_short_texts(size: int) -> Callable[[Callable[[str], bool]], Callable[[str], bool]]:
    """An LRU cache of ``size`` answers for statements up to :data:`CACHED_SQL` characters (the usual ones,
    sent again and again); a longer text is judged each time, not kept (a client's large texts would stay in
    the server's memory)."""

    def wrap(fn: Callable[[str], bool]) -> Callable[[str], bool]:
        cached = functools.lru_cache(maxsize=size)(fn)

        @functools.wraps(fn)
        def judge(sql: str) -> bool:
            return cached(sql) if len(sql) <= CACHED_SQL else fn(sql)

        judge.cache = cached  # type: ignore[attr-defined]
        return judge

    return wrap


def named_placeholder(sql: str) -> str | None:
    """The first named placeholder (``:a``, ``@a``, ``$a``, ``#a``) of ``sql`` outside its strings, quoted
    names and comments, or ``None``. SQLite would bind positional values to them by number, silently."""
    if ":" not in sql and "@" not in sql and "$" not in sql and "#" not in sql:
        return None
    if len(sql) <= CACHED_SQL:
        return _named_placeholder_cached(sql)
    return _named_placeholder(sql)


@functools.lru_cache(maxsize=1024)
def _named_placeholder_cached(sql: str) -> str | None:
    return _named_placeholder(sql)


def _named_placeholder(sql: str) -> str | None:
    return next(_named_placeholders(sql), None)


def _named_placeholders(sql: str) -> Iterator[str]:
    """The named placeholders of ``sql`` outside its strings, quoted names and comments, in order."""
    pos, n = 0, len(sql)
    while True:
        m = _NOT_A_PLACEHOLDER.match(sql, pos)
        pos = m.end() if m is not None else pos
        if pos >= n:
            return
        run = _SIGIL_RUN.match(sql, pos)
        assert run is not None  # (it matches anywhere)
        lead, colons = run.group(1), len(run.group(2))
        if run.end() >= n or run.end() == pos:
            pos += 1  # (not reached: a sigil on its own is eaten above; SQLite's to judge)
            continue
        # SQLite reads a sigil's "::" pairs from the sigil on: a ':' run of even length before a name (or one of
        # odd length after '@', '$', '#') leaves its last ':' alone, the sigil of the placeholder (the rest is a
        # token SQLite refuses): "::::x" is ":x", ":::x" and "@::x" are whole
        start = pos if (colons % 2 == 1 if not lead else colons % 2 == 0) else run.end() - 1
        rest = _PLACEHOLDER_REST.match(sql, run.end())
        assert rest is not None  # (it matches anywhere)
        yield sql[start : rest.end()]
        pos = max(rest.end(), pos + 1)


def _check_named(db: str, params: Mapping[Any, Any], sql: str = "") -> dict[str, Any]:
    """:func:`check_params` of values by name: a new dict (``sqlite3`` binds a dict only), each name text and each
    value as :func:`_check_params` takes it. A mapping other than a plain dict is also asked (``params[name]``)
    for each name of ``sql``'s placeholders it does not list, as Python's ``sqlite3`` asks it (trial IE: a
    ``defaultdict``'s default, or a ``__missing__``'s, was not found)."""
    if type(params) is not dict and sql:
        asked = dict(params)
        for placeholder in _named_placeholders(sql):
            name = placeholder[1:]
            if name not in asked:
                try:
                    asked[name] = params[name]
                except (KeyError, LookupError):
                    pass  # (SQLite says which it misses)
        params = asked
    if len(params) > PARAMS_MAX:
        raise InvalidError(
            f"database {db}: too many SQL variables ({len(params):,} parameters; at most {PARAMS_MAX:,})"
        )
    for name in params:
        if type(name) is not str:
            raise InvalidError(
                f"database {db}: parameter name {shown(name)}: {a_or_an(type(name).__name__)}; names are text, "
                "as the placeholder :name has the name 'name'"
            )
    names = list(params)
    values = _check_params(db, [params[n] for n in names], names)
    return dict(zip(names, values, strict=True))


def _check_params(db: str, params: Sequence[Any], names: list[str] | None = None) -> list[Any]:
    """:func:`check_params`' slow path, for a list with a value not of the plain types: subclasses of ``str``,
    ``int``, ``float`` and ``bytes`` (an enum's member, ``bool``) become their base type's value, as a socket can
    carry them; a value out of range or of another type raises ``InvalidError``, naming the parameter by its
    number, or by its name from ``names``."""
    out = list(params)
    for i, v in enumerate(out):
        t = type(v)
        if v is None or t is str or t is bytes:
            continue
        if t is not int and t is not float:
            # the base type's own value, taken without calling what a subclass may override (__str__, __int__,
            # __float__, __bytes__): True is 1, an IntEnum member its int, a StrEnum member its text
            if isinstance(v, str):
                out[i] = str.__str__(v)
                continue
            if isinstance(v, int):
                v = out[i] = int.__index__(v)
            elif isinstance(v, float):
                v = out[i] = float.__float__(v)
            elif isinstance(v, bytes | bytearray | memoryview):
                try:
                    out[i] = bytes.__bytes__(v) if isinstance(v, bytes) else bytes(memoryview(v))
                except ValueError as exc:  # a released memoryview
                    raise InvalidError(f"database {db}: parameter {_which(i, names)}: {exc}") from None
                continue
            else:
                hint = (
                    " (the parameters come as arguments of their own: db.one(sql, a, b), or db.one(sql, *values))"
                    if isinstance(v, tuple | list)
                    else " (values by name come in one dict, the only parameter, for a statement whose placeholders "
                    "are named: db.one('select * from t where id = :id', {'id': 7}))"
                    if isinstance(v, Mapping)
                    else ""
                )
                raise InvalidError(
                    f"database {db}: parameter {_which(i, names)}: {a_or_an(type(v).__name__)} is not a SQL value "
                    f"(use None, int, float, str, bytes or bool){hint}"
                )
        if type(v) is int:
            if not INT_MIN <= v <= INT_MAX:
                raise InvalidError(f"database {db}: parameter {_which(i, names)}: {shown(v)} does not fit in 64 bits")
        elif math.isnan(v):
            raise InvalidError(f"database {db}: parameter {_which(i, names)}: NaN cannot be stored")
    return out


def _which(i: int, names: list[str] | None) -> str:
    """How an error names parameter ``i``: by its number from 1, or as the placeholder of its name."""
    return str(i + 1) if names is None else f":{names[i]}"


def _word(head: str, word: str) -> str | None:
    """``head`` after its first keyword when that is ``word`` (and blanks and comments after it), else None."""
    n = len(word)
    if head[:n].lower() == word and (len(head) == n or not (head[n].isalnum() or head[n] == "_")):
        return _skip_comments(head[n:])
    return None


@_cached_for_short_texts(256)
def defers_foreign_keys(sql: str) -> bool:
    """Whether ``sql`` is a ``PRAGMA defer_foreign_keys`` (set or read: in an exec both are refused), also under
    ``EXPLAIN`` (SQLite sets a pragma's flag when it prepares the statement, explained or not)."""
    if "defer_foreign_keys" not in sql.lower():
        return False
    head = _skip_comments(sql)
    explained = _word(head, "explain")
    if explained is not None:
        head = explained
        query = _word(head, "query")
        if query is not None:
            head = _word(query, "plan") or ""
    return _word(head, "pragma") is not None


_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_FK_NAME = r"(?:foreign_keys|\"foreign_keys\"|`foreign_keys`|\[foreign_keys\])"
_SETS_FOREIGN_KEYS = re.compile(
    rf"\s*pragma\s+(?:(?:main|temp|\"main\"|\"temp\")\s*\.\s*)?{_FK_NAME}\s*"
    r"(?:=\s*[\w'\"]+|\(\s*[\w'\"]+\s*\))[\s;]*",
    re.IGNORECASE,
)


def sets_foreign_keys(sql: str) -> bool:
    """Whether ``sql`` is, whole, a ``PRAGMA foreign_keys = ...`` (comments anywhere): in a migration, where
    SQLite's procedure for the schema changes ALTER TABLE cannot make (https://sqlite.org/lang_altertable.html
    #otheralter) turns them off and on around its transaction, the store does that itself (see
    ``SqlDatabase._migrate``). A text that holds more (a statement after it with no ``;`` between) is not one:
    passed over, it took that statement with it (trial CE)."""
    return _SETS_FOREIGN_KEYS.fullmatch(_COMMENTS.sub(" ", sql)) is not None


# strings, quoted names ("a", `a`, [a]) and comments: what a keyword inside is not one (a name with a quote in it
# would open a "string" that swallows the rest)
_SQL_NOISE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`(?:[^`]|``)*`|\[[^\]]*\]|--[^\n]*|/\*.*?(?:\*/|\Z)", re.S)
_INITIALLY_DEFERRED = re.compile(r"\binitially\s+deferred\b", re.I)


def has_deferred_constraint(schema: Sequence[str]) -> bool:
    """Whether one of the ``CREATE`` texts of ``schema`` declares a constraint ``INITIALLY DEFERRED`` (one that
    SQLite checks only at COMMIT). Comments and string literals do not count."""
    return any(_INITIALLY_DEFERRED.search(_SQL_NOISE.sub(" ", text)) for text in schema)


_NAME = r"(?:[a-z_][a-z0-9_$]*|\"(?:[^\"]|\"\")*\"|'(?:[^']|'')*'|`(?:[^`]|``)*`|\[[^\]]*\])"
_CHECKPOINT = re.compile(
    rf"pragma\s*(?:{_NAME}\s*\.\s*)?(?:wal_checkpoint|\"wal_checkpoint\"|'wal_checkpoint'|`wal_checkpoint`|"
    r"\[wal_checkpoint\])"
    r"(?![a-z0-9_$])",
    re.IGNORECASE,
)
"""``PRAGMA [schema.]wal_checkpoint``, in any of SQLite's quotes, once the comments are blanks (trial CF left
``pragma/**/wal_checkpoint`` running inside a transaction)."""


def is_vacuum_itself(sql: str) -> bool:
    """Whether ``sql`` is a ``VACUUM`` (not a ``PRAGMA wal_checkpoint``; see :func:`is_vacuum`)."""
    head = _skip_comments(sql)
    return head[:6].lower() == "vacuum" and (len(head) == 6 or not (head[6].isalnum() or head[6] == "_"))


@_cached_for_short_texts(256)
def is_vacuum(sql: str) -> bool:
    """Whether ``sql`` is a ``VACUUM`` or a ``PRAGMA wal_checkpoint``: the writer runs it alone, outside a
    transaction (SQLite runs neither inside one: a checkpoint there fails as "database table is locked")."""
    head = _skip_comments(sql)
    if head[:6].lower() == "vacuum" and (len(head) == 6 or not (head[6].isalnum() or head[6] == "_")):
        return True
    return head[:6].lower() == "pragma" and _CHECKPOINT.match(_COMMENTS.sub(" ", head)) is not None


MIGRATION_NAME_MAX = 255
"""The longest migration name (a file name's bound on most file systems)."""
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def check_migrations(db: str, migrations: Sequence[tuple[str, str]]) -> None:
    """Refuse, with ``InvalidError`` naming the database and the migration, a name that is empty, over
    :data:`MIGRATION_NAME_MAX` characters, holds a control character or is given twice, a name or text that
    is not valid Unicode (a lone surrogate, which UTF-8 cannot store), and a text with a null character."""
    seen: set[str] = set()
    for name, text in migrations:
        shown = repr(name) if len(name) <= 40 else repr(name[:37]) + "..."
        if not name or len(name) > MIGRATION_NAME_MAX or _CONTROL.search(name) is not None:
            has = f" (this one has {len(name)})" if len(name) > MIGRATION_NAME_MAX else ""
            raise InvalidError(
                f"database {db}: migration {shown}: a migration's name is 1 to {MIGRATION_NAME_MAX} characters, "
                f"with no control characters{has}"
            )
        if name in seen:
            raise InvalidError(f"database {db}: migration {shown} is given twice")
        seen.add(name)
        for what, value in (("name", name), ("text", text)):
            try:
                value.encode()
            except UnicodeEncodeError as exc:
                raise InvalidError(
                    f"database {db}: migration {shown}: its {what} is not valid Unicode ({exc.reason} at character "
                    f"{exc.start}): UTF-8 cannot store it"
                ) from None
        if "\x00" in text:
            # (as an exec's: SQLite reads SQL text only up to it; it raised a bare ValueError, trial CR)
            raise InvalidError(
                f"database {db}: migration {shown}: its text contains a null character (at character "
                f"{text.index(chr(0))}); write it in SQL as char(0) or x'00'"
            )


def same_migration(applied: str, given: str) -> bool:
    """Whether ``given`` is the text of the migration applied as ``applied``: the same, or the same but for its line
    endings (``\r\n``, ``\r`` or ``\n``): a folder's files were read with their line endings made ``\n`` before
    this version, which reads their bytes as they are; a store upgraded with a folder of ``\r\n`` (trial CT) or
    ``\r`` (trial CV) files must still open. (So a change of line endings alone, in a string literal too, is no
    change.)"""
    return applied == given or line_ends_as_lf(applied) == line_ends_as_lf(given)


def line_ends_as_lf(text: str) -> str:
    """``text`` with its line endings made ``\n``, as Python's universal newlines read them (``\r\n``, ``\r``)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


_SCHEMA_WORD = re.compile(r"(?:create|drop|alter|analyze|reindex|vacuum)\b", re.IGNORECASE)


@_cached_for_short_texts(512)
def changes_schema(sql: str) -> bool:
    """Whether ``sql`` is a ``CREATE``, ``DROP`` or ``ALTER`` statement (what a migration is for), or an
    ``ANALYZE``, ``REINDEX`` or ``VACUUM`` (which make or rebuild the database's own tables and indexes). (Whether a
    client may run one is SQLite's authorizer's to judge as it prepares the statement: see
    ``sql_guard.restricted_sql``.)"""
    return _SCHEMA_WORD.match(_skip_comments(sql)) is not None


def holds_no_statement(sql: str) -> bool:
    """Whether ``sql`` holds no statement: only blanks, comments and semicolons (SQLite runs nothing, and says
    nothing). Asked only of a statement that gave no columns and changed nothing."""
    return not _skip_comments(sql)


def no_statement(db: str, sql: str) -> InvalidError:
    sql = client_text(sql)
    shown = repr(sql) if len(sql) <= 40 else repr(sql[:37]) + "..."
    return InvalidError(f"database {db}: no statement: the SQL text {shown} holds only blanks, comments or semicolons")


_LEAD = re.compile(r"(?:[\s\ufeff]++|;|--[^\n]*+\n?|/\*(?:[^*]|\*(?!/))*+(?:\*/)?)*+")
"""Blanks, comments and semicolons (empty statements, which SQLite skips too) before a statement's first
keyword; a comment left open runs to the end. A byte order mark (U+FEFF) is a blank to SQLite, anywhere (trial HB:
one before ``drop table`` hid the word from the admin check)."""


def _skip_comments(sql: str) -> str:
    """``sql`` from its first keyword: leading blanks, comments and semicolons skipped (one regex: linear
    in the text, however many comments it starts with)."""
    m = _LEAD.match(sql)
    return sql[m.end() :] if m is not None else sql


_INSERT_WORD = re.compile(r"\b(?:insert|replace)\b", re.IGNORECASE)


@_cached_for_short_texts(512)
def is_insert(sql: str) -> bool:
    """Whether ``sql`` is an INSERT or REPLACE (also after a WITH): the statements whose ``last_insert_rowid``
    means something. SQLite's ``last_insert_rowid()`` belongs to the connection, and the writer's is shared by
    every client: after any other statement it names somebody else's row."""
    head = _skip_comments(sql)[:7].lower()
    if head.startswith(("insert", "replace")):
        return True
    return head.startswith("with") and _INSERT_WORD.search(sql) is not None


_PLAIN_INSERT = re.compile(
    # SQLite's blanks only (space, tab, newline, form feed, return): a character past ASCII is part of a name
    # there, where Python's \s would take U+00A0 for a blank (trial CO: "insert into u\u00a0(...)" writes to table
    # "u\u00a0", not u)
    r"(?:insert(?:[ \t\n\f\r]++or[ \t\n\f\r]++(?:abort|fail|ignore|replace|rollback))?|replace)[ \t\n\f\r]++"
    r'into[ \t\n\f\r]++(?:([A-Za-z_][A-Za-z0-9_$]*+)|"((?:[^"]|"")++)")[ \t\n\f\r]*+'
    rf"(?:\(|(?:values|select|default)(?!{NAME_OR_DOLLAR}))",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=512)
def _insert_target(sql: str) -> str | None:
    if "conflict" in sql.lower():
        # an UPSERT (ON CONFLICT ... DO UPDATE changes a row and adds none): the word anywhere in the text, so that
        # no comment between its words hides it
        return None
    m = _PLAIN_INSERT.match(_skip_comments(sql))
    if m is None:
        return None
    name = m[1] if m[1] is not None else m[2].replace('""', '"')
    return name.lower() if name.isascii() else None


def insert_target(sql: str) -> str | None:
    """The table a plain ``INSERT`` (or ``REPLACE``) adds rows to, its name in lower case, when every row the
    statement changes is one it adds there: no ``WITH`` before it, no schema name, no UPSERT (nor the word
    "conflict" anywhere), a name in ASCII (SQLite folds only ASCII letters' case) that is bare or double-quoted, no
    comment inside its head. ``None`` for any other statement: what a caller then does must hold for them all."""
    return _insert_target(sql) if len(sql) <= CACHED_SQL else None


_WRITE_HEADS = ("insert", "replace", "update", "delete", "create", "drop", "alter", "begin", "commit", "end", "rollb")


@_cached_for_short_texts(512)
def may_return_rows(sql: str) -> bool:
    """Whether a statement run with ``exec`` may answer with rows (a ``RETURNING``, a ``SELECT``, a ``PRAGMA``
    ...): errs on the side of yes. A plain INSERT, UPDATE or DELETE answers with two numbers only."""
    head = _skip_comments(sql)[:7].lower()
    return not head.startswith(_WRITE_HEADS) or "returning" in sql.lower()


@_cached_for_short_texts(512)
def names_last_rowid(sql: str) -> bool:
    """Whether ``sql`` calls SQL's ``last_insert_rowid()`` (or says the word anywhere): then the writer's value is
    set to what the client's own connection would hold first (:meth:`SqlDatabase._exec`)."""
    return "last_insert_rowid" in sql.lower()


def split_sql(text: str) -> list[str]:
    """Split a migration script into statements (``sqlite3.complete_statement`` decides where one ends, so
    a ``;`` inside a string, a comment or a trigger body does not)."""
    out: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch == ";":
            chunk = text[start : i + 1]
            if sqlite3.complete_statement(chunk):
                if chunk.strip().strip(";").strip():
                    out.append(chunk)
                start = i + 1
    rest = text[start:]
    if rest.strip():
        out.append(rest)
    return out
