"""Durations: a ``timedelta``, a number of seconds, or text such as ``"30s"``, ``"1m30s"``, ``"250ms"``, ``"2h"``.

Units: ``ms``, ``s``, ``m``, ``h``, ``d``; parts may be combined largest first (``"1h30m"``).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import InvalidError

Duration = timedelta | int | float | str

MAX_SECONDS = 100 * 365 * 86400.0
"""The longest duration taken: 100 years (36500d). ``None`` is "for ever" where an API allows it."""
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def seconds(value: Duration, what: str = "duration") -> float:
    """Return ``value`` in seconds (a float).

    Raises ``InvalidError`` naming ``what`` for text that does not parse, a negative or non-finite number, one
    over :data:`MAX_SECONDS`, or a value of another type.
    """
    if isinstance(value, bool):
        raise InvalidError(f"{what}: expected a duration, got a bool")
    if isinstance(value, timedelta):
        out = value.total_seconds()
    elif isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise InvalidError(f"{what}: empty duration")
        pos = 0
        out = 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            out += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            try:
                out = float(text)
            except ValueError:
                # "-1s" reads as a negative duration (refused below as -1 is), not as text that does not parse
                rest = _text_seconds(text[1:]) if text.startswith("-") else None
                if rest is None:
                    raise InvalidError(
                        f'{what}: cannot read {value!r} as a duration (use "250ms", "30s", "1m30s", "2h", "7d")'
                    ) from None
                out = -rest if rest else 0.0
    else:
        raise InvalidError(f"{what}: expected a duration (timedelta, seconds, or text), got {type(value).__name__}")
    if not math.isfinite(out) or out < 0:
        raise InvalidError(f"{what}: a duration must be finite and not negative, got {value!r}")
    if out > MAX_SECONDS:
        raise InvalidError(f"{what}: a duration is at most 100 years (36500d), got {out:.6g}s")
    return out


def _text_seconds(text: str) -> float | None:
    """``text`` (with no sign) in seconds, or ``None`` when it does not read as a duration."""
    try:
        return seconds(text)
    except InvalidError:
        return None


def optional_seconds(value: Duration | None, what: str = "duration") -> float | None:
    """Like :func:`seconds`, but ``None`` stays ``None``."""
    return None if value is None else seconds(value, what)


def format_seconds(value: float) -> str:
    """Text for a number of seconds, as ``seconds`` reads it back (``"1m30s"``, ``"250ms"``)."""
    if value < 1 and value != 0:
        return f"{round(value * 1000)}ms"
    out = ""
    rest = value
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            n = int(rest // size)
            out += f"{n}{unit}"
            rest -= n * size
    if rest or not out:
        out += f"{rest:g}s"
    return out
