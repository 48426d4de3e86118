"""Checks of plain values (what MessagePack and JSON carry) shared by the engines' protocols: whether a value
would come back from JSON as it went in (jobs' values and results; channels' messages, which subscribers such as
the command line and browsers read as JSON)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["INT_MAX", "INT_MIN", "json_problem", "key_changed", "plain_int", "shown", "valid_text"]


INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1
"""The integers a job's JSON may hold: what 64 bits carry (MessagePack's int64 and uint64), so a value, result,
progress or step result comes back as it went in, over every way of reaching the store."""


BIG = 10**60
"""Ints from this size on (in absolute value) are shown by their size in error messages (see :func:`shown`)."""


def shown(value: object) -> str:
    """``value`` as an error message shows it: a str's ``repr`` cut to 40 characters (``…`` after it); an int of
    61 digits or more as its size, ``an int of 1329 bits`` (trial GK: 10**400 filled a message with its 401
    digits; trial GL: past 4,300 digits Python refuses to write an int, and a ``ValueError`` came out instead of
    the error it was part of); any other value's ``repr`` cut to 60."""
    if isinstance(value, str):
        return repr(value[:40]) + ("…" if len(value) > 40 else "")
    if isinstance(value, int) and not isinstance(value, bool) and not -BIG < value < BIG:
        return f"{'a negative' if value < 0 else 'an'} int of {int(value).bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the error it is part of
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:59] + "…"


def plain_int(value: Any) -> Any:
    """``value`` as a plain ``int`` when it is of a subclass of int (an ``IntEnum``, say; not a bool), else as it
    is (for the checks to name): what goes on the wire and to the engines is a plain int in every mode (trial GP:
    an ``IntEnum`` limit was refused embedded, an int subclass did not encode, raising ``TypeError``)."""
    if isinstance(value, int) and type(value) is not int and not isinstance(value, bool):
        return int(value)
    return value


def valid_text(text: str) -> bool:
    """``True`` for text that encodes as UTF-8: no lone surrogate (which no client can send, and SQLite, JSON
    and MessagePack cannot hold)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def json_problem(value: Any, keys: bool = True, loose: list[Any] | None = None) -> str | None:
    """Why ``value`` (plain data: what ``msgspec.to_builtins`` makes) would not come back from JSON as it is, or
    ``None`` when it would: a float that is NaN or infinite (JSON has none), an int past 64 bits, and, when
    ``keys``, a dict key that is not a str (JSON keys are text: ``{1: "a"}`` comes back as ``{"1": "a"}``);
    without ``keys``, a key that is a NaN or an infinity all the same, and each key that is not a str is appended to
    ``loose`` (when given) for the caller to look at. The text names where: ``at $.items[3]``."""
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        v, where = stack.pop()
        t = type(v)
        if t is str or t is bool or v is None:
            continue
        if t is float:
            if not math.isfinite(v):
                return f"{v!r} is not a JSON number{at_path(where)}"
        elif t is int:
            if not INT_MIN <= v <= INT_MAX:
                return f"{_integer(v)} does not fit in 64 bits{at_path(where)}"
        elif t is dict:
            for k, item in v.items():
                if type(k) is not str:
                    if keys:
                        return f"the key {k!r} is not a str (JSON keys are text){at_path(where)}"
                    if type(k) is float and not math.isfinite(k):
                        return f"the key {k!r} is not a JSON number{at_path(where)}"
                    if loose is not None:
                        loose.append(k)
                stack.append((item, (where, k)))
        elif t is list or t is tuple:
            stack.extend((item, (where, i)) for i, item in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{v!r} is not a JSON number{at_path(where)}"
        elif isinstance(v, int) and not isinstance(v, bool) and not INT_MIN <= v <= INT_MAX:
            return f"{_integer(v)} does not fit in 64 bits{at_path(where)}"
    return None


def key_changed(sent: Any, back: Any, where: Any = None) -> str | None:
    """Where plain data ``back`` (a value read back through a type) holds other dict keys than ``sent`` (the value
    as it was written): ``the key 1 comes back as '1' (at $.x)``, or ``None`` when every dict's keys are the same.
    Only dicts and lists are compared (a type may read back other shapes of the same data: a set, a tuple)."""
    stack: list[tuple[Any, Any, Any]] = [(sent, back, where)]
    while stack:
        a, b, where = stack.pop()
        if type(a) is dict and type(b) is dict:
            for k, item in a.items():
                if k not in b:
                    found = next((kb for kb in b if kb not in a and str(kb) == str(k)), None)
                    then = f"comes back as {found!r}" if found is not None else "does not come back"
                    return f"the key {shown(k)} {then}{at_path(where)}"
                stack.append((item, b[k], (where, k)))
        elif type(a) in (list, tuple) and type(b) in (list, tuple) and len(a) == len(b):
            stack.extend((x, y, (where, i)) for i, (x, y) in enumerate(zip(a, b, strict=True)))
    return None


def _integer(v: int) -> str:
    return f"the integer {v}" if -BIG < v < BIG else shown(v)


def at_path(where: Any) -> str:
    """Where a value lies in a JSON document, for an error message: `` (at $.x[2])`` for ``where`` =
    ``((None, "x"), 2)`` (nested ``(parent, key)`` pairs); ``""`` at the top."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}" if isinstance(key, str) else f"[{key!r}]")
    return f" (at ${''.join(reversed(parts))})" if parts else ""
