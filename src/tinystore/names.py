"""Names of databases, channels, locks and queues: ``[a-z0-9][a-z0-9_-]{0,63}``.

Database names starting with ``tinystore-`` are the store's own (``tinystore-jobs`` holds the job queues): a
client may read them but not write to them (:func:`check_db_writable`).
"""

from __future__ import annotations

import re
import typing
from typing import Any

from .errors import InvalidError, PermissionDeniedError
from .protocol.values import shown

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")

RESERVED_DB_PREFIX = "tinystore-"
"""Databases whose names start with this are the store's own (``tinystore-jobs``)."""


def check_name(kind: str, name: object) -> str:
    """Return ``name`` when it matches the pattern; raise ``InvalidError`` naming ``kind`` otherwise."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise InvalidError(
            f"{kind} name {shown(name) if not isinstance(name, str) else repr(name)}: names are 1 to 64 characters "
            "of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def reserved_db_error(name: str, what: str) -> PermissionDeniedError:
    """The error for a client's write to the store's own database ``name``; ``what`` says what was refused
    ("migrations are refused")."""
    jobs = "; jobs go through the jobs API (store.queue(...), `tinystore jobs`)" if name == "tinystore-jobs" else ""
    return PermissionDeniedError(
        f"database {name} is the store's own: clients may read it but not write to it; {what}{jobs}. "
        f"Database names starting with {RESERVED_DB_PREFIX!r} are kept for the store"
    )


def check_db_writable(name: str, what: str) -> None:
    """Raise ``PermissionDeniedError`` (see :func:`reserved_db_error`) when ``name`` is one of the store's own
    databases; do nothing otherwise."""
    if name.startswith(RESERVED_DB_PREFIX):
        raise reserved_db_error(name, what)


_AN_LETTERS = frozenset("AEFHILMNORSX")  # letters whose names begin with a vowel sound ("an HTTP...", "an SQL...")


def a_or_an(word: str) -> str:
    """``word`` with its indefinite article, for messages: ``"an int"``, ``"a dict"``, ``"a UUID"``,
    ``"an HTTPError"``."""
    if len(word) > 1 and word[:2].isupper():  # an acronym: read letter by letter
        return f"{'an' if word[0] in _AN_LETTERS else 'a'} {word}"
    low = word.lower()
    if low.startswith(("uu", "uni", "use", "usu", "uti", "eu", "one")):
        return f"a {word}"
    return f"{'an' if low[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {word}"


def type_name(t: Any) -> str:
    """How messages name the type ``t``: its name (``Ingest``, ``int``), or what it is written as when it has
    arguments (``dict[int, str]``, ``list[Ingest]``, ``int | None``: not "dict", whose values would fit it)."""
    if typing.get_origin(t) is not None or not hasattr(t, "__name__"):
        # (dict[Mark, int], not dict[__main__.Mark, int]: trial GE; what is quoted, a Literal's text, kept: trial GF)
        parts = _QUOTED.split(repr(t))
        return "".join(p if i % 2 else _QUALIFIER.sub("", p) for i, p in enumerate(parts))
    return str(t.__name__)


def not_a_type(t: Any, exc: BaseException) -> str:
    """Why ``t``, given as a type, cannot carry values (``exc``: what msgspec said of it): ``type 'str' is not a
    type but a str: give the type itself ...`` for a value that is not a type at all (a name written as text, an
    instance), else msgspec's word."""
    advice = "use a dataclass, a msgspec Struct, a TypedDict or a JSON type (str, int, dict[str, int], ...)"
    if not isinstance(t, type) and typing.get_origin(t) is None and not hasattr(t, "__supertype__"):
        return f"type {shown(t)} is not a type but {a_or_an(type(t).__name__)}: give the type itself; {advice}"
    return f"type {type_name(t)} cannot be carried: {exc}; {advice}"


_QUOTED = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_QUALIFIER = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")
"""The modules a name is written with (``typing.``, ``__main__.``, ``datetime.``)."""


def key_text(kind: str, name: str, key: object, word: str = "key") -> str:
    """A lock's key or a channel's branch part (``word``: "key" or "branch part") as text: ``7`` and ``"7"`` are
    one key. Raises ``InvalidError`` for other types and for one empty or over 256 characters."""
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise InvalidError(f"{kind} {name}: {word} {key!r}: a {word} is a str or an int, not {type(key).__name__}")
    if isinstance(key, int) and not -(10**256) < key < 10**256:  # (past 4,300 digits Python refuses to write it)
        raise InvalidError(f"{kind} {name}: {word} {shown(key)}: a {word} is 1 to 256 characters")
    text = str(key)
    if not text or len(text) > 256:
        got = f" (this one has {len(text)})" if text else ""
        raise InvalidError(f"{kind} {name}: {word} {text[:40]!r}: a {word} is 1 to 256 characters{got}")
    if not text.isascii():
        check_unicode(f"{kind} {name}: {word}", text)
    return text


def check_unicode(what: str, text: str) -> None:
    """Refuse text that is not Unicode as UTF-8 can carry (a lone surrogate, such as ``"\\ud800"``, from a bad
    decode): no connection could send it, so it is refused in every mode, with ``InvalidError`` naming ``what``."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidError(
            f"{what} {text[:40]!r}: not valid Unicode text ({exc.reason} at character {exc.start})"
        ) from None
