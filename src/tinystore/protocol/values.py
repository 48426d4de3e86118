"""Checks of plain values (what MessagePack and JSON carry) shared by the engines' protocols: whether a value
would come back from JSON as it went in (jobs' values and results; channels' messages, which subscribers such as
the command line and browsers read as JSON)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["INT_MAX", "INT_MIN", "json_problem", "valid_text"]


INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1
"""The integers a job's JSON may hold: what 64 bits carry (MessagePack's int64 and uint64), so a value, result,
progress or step result comes back as it went in, over every way of reaching the store."""


def valid_text(text: str) -> bool:
    """``True`` for text that encodes as UTF-8: no lone surrogate (which no client can send, and SQLite, JSON
    and MessagePack cannot hold)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def json_problem(value: Any, keys: bool = True) -> str | None:
    """Why ``value`` (plain data: what ``msgspec.to_builtins`` makes) would not come back from JSON as it is, or
    ``None`` when it would: a float that is NaN or infinite (JSON has none), an int past 64 bits, and, when
    ``keys``, a dict key that is not a str (JSON keys are text: ``{1: "a"}`` comes back as ``{"1": "a"}``);
    without ``keys``, a key that is a NaN or an infinity all the same. The text names where:
    ``at $.items[3]``."""
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
                return f"the integer {v} does not fit in 64 bits{at_path(where)}"
        elif t is dict:
            for k, item in v.items():
                if type(k) is not str:
                    if keys:
                        return f"the key {k!r} is not a str (JSON keys are text){at_path(where)}"
                    if type(k) is float and not math.isfinite(k):
                        return f"the key {k!r} is not a JSON number{at_path(where)}"
                stack.append((item, (where, k)))
        elif t is list or t is tuple:
            stack.extend((item, (where, i)) for i, item in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{v!r} is not a JSON number{at_path(where)}"
        elif isinstance(v, int) and not isinstance(v, bool) and not INT_MIN <= v <= INT_MAX:
            return f"the integer {v} does not fit in 64 bits{at_path(where)}"
    return None


def at_path(where: Any) -> str:
    """Where a value lies in a JSON document, for an error message: `` (at $.x[2])`` for ``where`` =
    ``((None, "x"), 2)`` (nested ``(parent, key)`` pairs); ``""`` at the top."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}" if isinstance(key, str) else f"[{key!r}]")
    return f" (at ${''.join(reversed(parts))})" if parts else ""
