"""sqlite3's exceptions as TinyStore errors that name the database and say what was wrong (:func:`sql_error`)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import (
    ClosedError,
    ConflictError,
    CorruptError,
    InvalidError,
    PermissionDeniedError,
    TimeoutError_,
    TinystoreError,
    UnavailableError,
)
from .descriptors import open_files_limit
from .sql_guard import DENIED_MESSAGES, TX_WHY, denial
from .sql_text import INT_MAX, NAME_OR_DOLLAR


def rolled_back_by(db: str, tx_id: int, err: TinystoreError, this: bool = False, which: str = "") -> TinystoreError:
    """The error of a statement that made SQLite roll back its whole transaction (``this``), or of what the
    transaction is asked for after it: the same kind as the statement's. ``which``: ``"migration"`` for a
    migration's transaction, ``"own"`` for one the store began for a call; their numbers are the store's own, never
    seen by the client (trial EG, EH)."""
    why = err.message.removeprefix(f"database {db}: ")
    names = {"migration": "the migration's transaction", "own": "the transaction the store ran it in"}
    wholes = {"migration": "the migration's whole transaction", "own": "the whole transaction the store ran it in"}
    which, whole = names.get(which, f"transaction {tx_id}"), wholes.get(which, f"the whole transaction {tx_id}")
    if this:
        msg = f"database {db}: {why}; this rolled back {whole}, which has ended"
    else:
        msg = f"database {db}: {which} was rolled back by a statement that failed ({why})"
    kind = (
        type(err)
        if type(err) in (ConflictError, TimeoutError_, InvalidError, UnavailableError, ClosedError)
        else ConflictError
    )
    # (the statement's extra goes with it: a constraint's sqlite_code, which docs/sql.md promises: trial CZ)
    return kind(msg, **err.extra)


def migration_error(db: str, migration: str, exc: TinystoreError) -> TinystoreError:
    """A migration that failed: ``exc`` (from :func:`sql_error`) with the migration's name; an ``InvalidError``,
    a ``ClosedError`` when the store stopped as it ran, a ``CorruptError`` when the file is damaged (trial CE:
    said ``InvalidError``, as if the SQL were at fault), or an ``UnavailableError`` when the file system refused it
    (a full disk, an I/O error, no file descriptor left: trial CN; worth trying again once mended, where an
    ``InvalidError`` says to mend the SQL)."""
    why = exc.message.removeprefix(f"database {db}: ")
    if why == "cannot VACUUM from within a transaction":
        # (trial IS: SQLite's word alone, where every other statement refused in a migration says what to do)
        why = (
            "VACUUM cannot run in a migration, which runs in a transaction with the migration's other statements: "
            'run it on its own once the migrations are applied (db.exec("vacuum"))'
        )
    if isinstance(exc, ClosedError):  # (the store stopped as it ran: trial EA, said InvalidError, "mend your SQL")
        return ClosedError(f"database {db}: migration {migration}: {why}")
    if isinstance(exc, CorruptError):
        return CorruptError(f"database {db}: migration {migration}: {why}")
    if isinstance(exc, UnavailableError):
        return UnavailableError(f"database {db}: migration {migration}: {why}")
    return InvalidError(f"database {db}: migration {migration}: {why}")


def check_migration_order(db: str, known: Iterable[str], migrations: Sequence[tuple[str, str]]) -> None:
    """Raise ``ConflictError`` when a migration of ``migrations`` not in ``known`` (the names applied) sorts before
    the last one applied: migrations apply in name order (SQL-05), and one applied after a later name would run
    out of that order (the merge of two branches, each with a new migration). Refused before anything applies,
    as Flyway refuses one "resolved but not applied" unless told ``outOfOrder``."""
    applied = set(known)
    if not applied:
        return
    last = max(applied)
    late = sorted(name for name, _ in migrations if name not in applied and name < last)
    if late:
        raise ConflictError(
            f"database {db}: migration {late[0]} is new but sorts before {last}, which is applied: migrations "
            f"apply in name order, so it would run out of order; give it a name that sorts after {last}"
        )


def check_migration_renames(db: str, known: dict[str, str], migrations: Sequence[tuple[str, str]]) -> None:
    """Raise ``ConflictError`` when a migration of ``migrations`` not in ``known`` (name → text applied) has the text
    of an applied one that is not among ``migrations``: the applied one renamed (trial FV: it ran again under its
    new name, its rows twice). Texts are compared as SQLite reads them (see :func:`_words`: trial FW, renamed with a
    newline added, it ran again; trial FX, with its header comment edited). Refused before anything applies. Two
    files of one text both given (a fix run twice on purpose) are not refused."""
    given = {name for name, _ in migrations}
    new = sorted((name, text) for name, text in migrations if name not in known)
    if not new or given.issuperset(known):
        return  # (the texts are read only when one may be a rename: trial GA, at each open they took seconds)
    gone_texts = [(name, text) for name, text in known.items() if name not in given]
    gone = {_words(text): name for name, text in gone_texts}
    gone.pop("", None)  # (nothing to run twice)
    for name, text in new:
        old = gone.get(_words(text))
        if old is not None:
            raise ConflictError(
                f"database {db}: migration {name} is new but has the text of {old}, which is applied and not among "
                f"the migrations given: was {old} renamed? An applied migration keeps its name (name it back to "
                f"{old}); a new one must differ from it"
            )


WINDOW = 64 << 10
"""The characters of a migration's text :func:`_words` scans at a time (some 20 ms of the interpreter's lock)."""


def _words(text: str, window: int = WINDOW) -> str:
    """``text`` as SQLite reads it, for comparing migrations: its tokens one space apart, with comments, blanks
    (SQLite's: space, tab, line ends, form feed), a leading byte order mark and trailing ``;`` left out, ``\r\n``
    made ``\n`` and ASCII letters outside quotes made lower case (SQLite's keywords and identifiers are not
    case-sensitive); what is quoted (``'...'``, ``"..."``, `````...`````, ``[...]``) kept as it is but for its line
    ends, made ``\n`` (as :func:`same_migration` does) (trial FX: a rename with its header comment edited ran again;
    ``'a  b'`` and ``'a b'``, different data, were taken for one text). A lone ``\r`` outside quotes is a blank and
    does not end a ``--`` comment, as SQLite reads it (trial GL: taken for a line end, a renamed migration with
    ``-- note\rmore`` added ran again). A blob ``x'41'`` and a number ``0x10`` or ``1_000`` are one token each
    (trial GL: ``x '41'``, a name and a text, and ``0 x10``, 0 named x10, were taken for them). A plain name quoted
    (``"Tags"``, ``[tags]``, ```tags```) is the name (trial GP: a rename with its names quoted ran again).

    Regular expressions do the scanning, over ``window`` characters at a time, cut at a blank (trial GA: a loop over
    the characters took 2 s over a migration of 6 MB; trial GC: one call over all of it held the interpreter's lock,
    and so the event loop, 0.3 s a MB; trial GG: a text over 256 KiB was then compared with its blanks alone taken
    out, and one renamed with a comment added ran again)."""
    text = text.replace("\r\n", "\n").removeprefix("\ufeff")
    out: list[str] = []
    tokens, search = _TOKEN.findall, _QUOTED_OR_COMMENT.search
    pos, end, stop = 0, len(text), 0
    while pos < end:
        if pos >= stop:  # (a window serves every quoted part and comment in it: trial GK, one for each was quadratic)
            stop = _window_end(text, pos, window)
        found = search(text, pos, stop)
        while found is not None and found.end() == stop < end:
            # a quoted part or a comment that may go on past the window: in a wider one
            stop = _window_end(text, pos, 2 * (stop - pos), stop)
            found = search(text, pos, stop)
        if found is None:
            out += tokens(text[pos:stop].translate(_FOLD))
            pos = stop
            continue
        start = found.start()
        out += tokens(text[pos:start].translate(_FOLD))
        quoted = found.group(1)
        if quoted is not None:  # (None: a comment)
            quoted = quoted.replace("\r", "\n")
            if quoted[0] == "'" and out and out[-1] == "x" and text[start - 1] in "xX":
                out[-1] += quoted.translate(_FOLD)  # a blob: x'41' (its hex digits in either case)
            elif quoted[-1] == _CLOSE.get(quoted[0]) and _PLAIN_NAME.fullmatch(quoted, 1, len(quoted) - 1):
                out.append(quoted[1:-1].translate(_FOLD))  # "Tags", [tags], `tags`: the name tags (trial GP)
            else:
                out.append(quoted)
        pos = found.end()
    while out and out[-1] == ";":
        out.pop()
    first = 0
    while first < len(out) and out[first] == ";":
        first += 1
    return " ".join(out[first:])


def _window_end(text: str, pos: int, size: int, beyond: int = -1) -> int:
    """Where a window of ``text`` from ``pos`` ends, past ``beyond`` (and ``pos``): at the end of the text, else at
    its last blank within ``size`` characters (no token, ``--`` or ``/*`` runs across a blank), else a wider
    window's."""
    end = len(text)
    low = max(pos, beyond) + 1
    while pos + size < end:
        stop = pos + size
        cut = max(
            text.rfind(" ", low, stop),
            text.rfind("\n", low, stop),
            text.rfind("\t", low, stop),
            text.rfind("\f", low, stop),
            text.rfind("\r", low, stop),
        )
        if cut >= low:
            return cut
        size *= 2
    return end


_QUOTED_OR_COMMENT = re.compile(
    r"""('[^']*+(?:''[^']*+)*+'?|"[^"]*+(?:""[^"]*+)*+"?|`[^`]*+(?:``[^`]*+)*+`?|\[[^\]]*+\]?)"""
    r"|--[^\n]*+|/\*.*?(?:\*/|\Z)",
    re.DOTALL,
)
_TOKEN = re.compile(
    rf"(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?{NAME_OR_DOLLAR}*+"
    rf"|{NAME_OR_DOLLAR}++|[^ \t\n\f\r]"
)
"""A number with what a name may hold glued to it (``1.e5`` one token: trial GG, ``1. e5``, 1.0 named e5, was taken
for it; ``0x10``, ``1_000``: trial GL), a name or a keyword (SQLite: any character past ASCII may be in a name; a
no-break space too), or one other character; SQLite's blanks part them."""
_CLOSE = {'"': '"', "[": "]", "`": "`"}  # (a name's quotes, and what ends each)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*+")
"""A name that reads the same quoted or not (a keyword quoted does not: unquoted, a text of it fails to run)."""
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # (SQLite folds ASCII alone)


def sql_error(db: str, exc: BaseException, statement_timeout: float | None = None) -> TinystoreError:
    """Map a sqlite3 exception to a TinyStore error that keeps SQLite's message (``statement_timeout``: the
    limit a statement that was interrupted ran past, for its message)."""
    if isinstance(exc, TinystoreError):
        return exc
    if isinstance(exc, UnicodeEncodeError):
        text = exc.object if isinstance(exc.object, str) else ""
        return InvalidError(
            f"database {db}: the text {text[:40]!r} (a parameter or the statement) is not valid Unicode: it holds a "
            "lone surrogate, which UTF-8 cannot store"
        )
    msg = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and (
        msg in DENIED_MESSAGES
        or msg.startswith("not authorized")
        or (msg.startswith("access to ") and "prohibited" in msg)
    ):
        why = getattr(denial, "why", None)
        denial.why = None
        if getattr(denial, "permission", False):
            denial.permission = False
            return PermissionDeniedError(f"database {db}: {why}")
        if why is None:
            why = (
                f"{TX_WHY}; ATTACH, DETACH, VACUUM INTO and load_extension are refused, and so is setting "
                "PRAGMA query_only, journal_mode, synchronous or locking_mode (the store's durability and its "
                "readers stand on them)"
            )
        return InvalidError(f"database {db}: not allowed here: {why}")
    if isinstance(exc, sqlite3.IntegrityError):
        return ConflictError(f"database {db}: {msg}", sqlite_code=error_name(exc))
    if isinstance(exc, OverflowError):
        return InvalidError(f"database {db}: {msg}")
    if interrupted(exc):
        limit = "" if statement_timeout is None else f" ({statement_timeout:g}s)"
        return TimeoutError_(
            f"database {db}: the statement ran past its time limit, Limits.statement_timeout{limit}, and was stopped"
        )
    if isinstance(exc, sqlite3.ProgrammingError) and msg.startswith("You can only execute one statement"):
        return InvalidError(
            f"database {db}: the SQL text holds more than one statement (or an empty one after it: ';;'), and a "
            "call runs one; run several in one transaction with db.tx (a tx.exec each), or put schema changes in a "
            "migration"
        )
    name = error_name(exc)
    # (plain SQLITE_READONLY is a write on a reader's connection, below; its extended codes are the file's)
    if name.startswith(("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY_")):
        return storage_error(db, name, msg)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED_SHAREDCACHE")) or (not name and msg == "database is locked"):
        # the store's own connections never hold each other off a write for long (one writer; readers in WAL):
        # another process has the file open and holds its lock (trial CF: an old application still running
        # beside the store; the write waited a minute, then said InvalidError)
        return UnavailableError(
            f"database {db}: {msg} ({name or 'SQLITE_BUSY'}): another process holds the database file's lock (the "
            "store waited a minute for it). Only the store's process may open the files of DIR/sql/: stop the "
            "other one, and reach the database through the store"
        )
    if isinstance(exc, sqlite3.OperationalError) and "readonly" in msg:
        return InvalidError(f"database {db}: {msg} (this call reads; a statement that writes goes through exec)")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or (not name and msg in _CORRUPT_MESSAGES):
        # by SQLite's code, not the words: "malformed JSON" (json()) and "malformed MATCH expression" (full-text
        # search) are a statement's SQLITE_ERROR, about its input, not the file (trial CC)
        return CorruptError(f"database {db}: {msg}")
    if isinstance(exc, sqlite3.Error | ValueError):
        return InvalidError(f"database {db}: {msg}")
    return TinystoreError(f"database {db}: {type(exc).__name__}: {msg}")


_CORRUPT_MESSAGES = frozenset({"database disk image is malformed", "file is not a database"})

# extended result codes newer than the names the sqlite3 module knows (it says "unknown"):
# https://sqlite.org/rescode.html
_NEWER_CODES = {
    2835: "SQLITE_CONSTRAINT_PINNED",
    3091: "SQLITE_CONSTRAINT_DATATYPE",
    8202: "SQLITE_IOERR_DATA",
    8458: "SQLITE_IOERR_CORRUPTFS",
    1550: "SQLITE_CANTOPEN_SYMLINK",
}


def error_name(exc: BaseException) -> str:
    """SQLite's name of the (extended) result code of ``exc``, such as ``SQLITE_CONSTRAINT_UNIQUE``; ``""`` for an
    error that has none (raised by the sqlite3 module itself)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name in ("", "unknown"):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            return _NEWER_CODES.get(code, name)
    return name


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's answer to ``sqlite3_interrupt`` (or a progress handler that said stop): its code
    is SQLITE_INTERRUPT, whatever its message. VACUUM interrupted while it attaches its scratch database says
    "unable to open database: " (SQLite's ATTACH reports any failure so), and a read interrupted while it reads a
    large value may say "string or blob too big": both were taken for what they say (CI: a VACUUM interrupted by a
    stop was answered InvalidError "unable to open database", not ClosedError)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    return str(exc) == "interrupted" or error_name(exc) == "SQLITE_INTERRUPT"


def autoincrement_spent(path: Path) -> str | None:
    """The AUTOINCREMENT table of the database at ``path`` whose rowid has reached the largest SQLite allows (then
    an insert gets SQLITE_FULL, as a full disk does), if one has; None otherwise, or when that cannot be read."""
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=1)
        try:
            row = conn.execute("select name from sqlite_sequence where seq >= ? limit 1", [INT_MAX]).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None  # (no AUTOINCREMENT table, or the disk refuses even this)
    return None if row is None else str(row[0])


def storage_error(db: str, name: str, msg: str) -> UnavailableError:
    """What the file system refused (the disk is full, an I/O error, a file that cannot be opened or
    written): ``UnavailableError``, which the caller may try again later, never ``InvalidError`` (its SQL is
    not at fault). Nothing the statement wrote is kept."""
    if name == "SQLITE_FULL":
        why = "the disk is full: free some space (writes go on then; deleting rows needs room too)"
    elif name.startswith("SQLITE_CANTOPEN"):
        why = (
            "a file of the database cannot be opened: out of file descriptors (this process may open "
            f"{open_files_limit()} files: raise `ulimit -n`), or the store's directory was moved or made unwritable"
        )
    elif name.startswith("SQLITE_READONLY"):
        why = "a file of the database cannot be written (a read-only file system, or its permissions)"
    else:
        why = "the file system failed a read or write (a full or failing disk, or the directory was removed)"
    return UnavailableError(f"database {db}: {msg} ({name}): {why}")
