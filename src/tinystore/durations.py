"""Durations: a ``timedelta``, a number of seconds, or text such as ``"30s"``, ``"1m30s"``, ``"250ms"``, ``"2h"``.

Text is one or more parts, each a number of ASCII digits (``"1.5"``, never an exponent such as ``"1e3"``) and
a unit: ``ms``, ``s``, ``m``, ``h``, ``d``; parts are combined largest unit first, each unit once (``"1h30m"``,
``"1m30s"``). A bare number in text (``"30"``, ``"1.5"``) is that many seconds. Spaces are ignored; a leading
``-`` makes the duration negative (refused as a negative number is).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import InvalidError
from .protocol.values import shown

Duration = timedelta | int | float | str

MAX_SECONDS = 100 * 365 * 86400.0
"""The longest duration taken: 100 years (36500d). ``None`` is "for ever" where an API allows it."""
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_ORDER = {unit: i for i, unit in enumerate(_UNITS)}  # largest first
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"  # ASCII digits only: \d would take any script's digits ("٣")
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
_TEXT = re.compile(rf"(-?)(?:({_NUMBER})|((?:{_NUMBER}(?:ms|s|m|h|d))+))")


def seconds(value: Duration, what: str = "duration") -> float:
    """Return ``value`` in seconds (a float).

    ``value``: a ``timedelta``, an int or float of seconds, or text as the module describes (``"250ms"``,
    ``"30s"``, ``"1m30s"``, ``"2h"``, ``"7d"``, or a bare ``"30"`` or ``"1.5"`` for seconds). Raises
    ``InvalidError`` naming ``what`` for text that does not read as a duration (an unknown unit, an exponent
    such as ``"1e3"``, digits other than ASCII ``0``-``9``, units out of order or repeated), a negative or
    non-finite number, one over :data:`MAX_SECONDS`, or a value of another type.
    """
    if isinstance(value, bool):
        raise InvalidError(f"{what}: expected a duration, got a bool")
    if isinstance(value, timedelta):
        out = value.total_seconds()
    elif isinstance(value, int | float):
        try:
            out = float(value)
        except OverflowError:  # an int past a float's range (trial GI: it went out as Python's OverflowError)
            if value < 0:
                raise InvalidError(f"{what}: a duration must be finite and not negative, got {shown(value)}") from None
            raise InvalidError(f"{what}: a duration is at most 100 years (36500d), got {shown(value)}") from None
    elif isinstance(value, str):
        out = _text_seconds(value, what)
    else:
        raise InvalidError(f"{what}: expected a duration (timedelta, seconds, or text), got {type(value).__name__}")
    out += 0.0  # (-0.0 is 0: never shown as "-0s")
    if not math.isfinite(out) or out < 0:
        raise InvalidError(f"{what}: a duration must be finite and not negative, got {shown(value)}")
    if out > MAX_SECONDS:
        # (36500d1s: not "36500d", trial CK.) Past 1e12 s, the value as given (a timedelta in whole days): no
        # exponent of the store's making, which would not read back as a duration (trial DB)
        if out < 1e12:
            got = format_beyond(out, MAX_SECONDS)
        elif isinstance(value, timedelta):
            got = f"about {round(out / 86400)}d"
        else:
            got = shown(value)  # (an int of 61 digits and more by its size)
        raise InvalidError(f"{what}: a duration is at most 100 years (36500d), got {got}")
    return out


def _text_seconds(value: str, what: str) -> float:
    """``value``, text, in seconds (negative for a leading ``-``); ``InvalidError`` when it does not read."""
    text = value.strip().replace(" ", "")
    if not text:
        raise InvalidError(f"{what}: empty duration")
    match = _TEXT.fullmatch(text)
    if match is None:
        raise _unreadable(value, what)
    sign, number, parts = match.groups()
    if number is not None:
        out = float(number)
    else:
        out = 0.0
        last = -1
        for part in _PART.finditer(parts):
            unit = _ORDER[part.group(2)]
            if unit <= last:
                raise _unreadable(value, what, ": give each unit once, largest first")
            last = unit
            out += float(part.group(1)) * _UNITS[part.group(2)]
    if math.isinf(out):  # so many digits that the float overflowed
        raise InvalidError(f"{what}: a duration is at most 100 years (36500d), got {value[:40]!r}...")
    return -out if sign and out else out


def _unreadable(value: str, what: str, why: str = "") -> InvalidError:
    shown = repr(value) if len(value) <= 60 else repr(value[:60]) + "..."
    if not why and any(ch.isdigit() and not "0" <= ch <= "9" for ch in value):
        why = ": its digits must be ASCII 0-9"
    return InvalidError(f'{what}: cannot read {shown} as a duration{why} (use "250ms", "30s", "1m30s", "2h", "7d")')


def optional_seconds(value: Duration | None, what: str = "duration") -> float | None:
    """Like :func:`seconds`, but ``None`` stays ``None``."""
    return None if value is None else seconds(value, what)


def format_beyond(value: float, bound: float) -> str:
    """:func:`format_seconds` of ``value``, a value refused for passing ``bound``: written ``just over`` (or
    ``just under``) the bound when, to the microsecond, it would read as the bound itself (trial DD: "at most 100
    years (36500d), got 36500d")."""
    text = format_seconds(value)
    if value != bound and text == format_seconds(bound):
        return ("just over " if value > bound else "just under ") + text
    return text


def format_seconds(value: float) -> str:
    """Text for a number of seconds, as ``seconds`` reads it back (``"1m30s"``, ``"250ms"``)."""
    if value > 0:
        # to the microsecond, the finest a timedelta holds (3599.9999999 is "1h", not "59m60s"), but never 0 when
        # it is not (trial DB)
        value = max(round(value, 6), 0.000001)
    if value < 1 and value != 0 and abs(value * 1000 - round(value * 1000)) < 1e-6:
        return f"{round(value * 1000)}ms"
    out = ""
    rest = value
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            n = int(rest // size)
            out += f"{n}{unit}"
            rest -= n * size
    if rest or not out:
        # in decimals, never an exponent, which ``seconds`` does not read (trial DA: "36500d9.53674e-07s"); to the
        # microsecond, the finest a timedelta holds
        out += f"{rest:.6f}".rstrip("0").rstrip(".") + "s"
    return out
