"""Names of databases, channels, locks and queues: ``[a-z0-9][a-z0-9_-]{0,63}``."""

from __future__ import annotations

import re

from .errors import InvalidError

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def check_name(kind: str, name: object) -> str:
    """Return ``name`` when it matches the pattern; raise ``InvalidError`` naming ``kind`` otherwise."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise InvalidError(
            f"{kind} name {name!r}: names are 1 to 64 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def key_text(kind: str, name: str, key: object) -> str:
    """A lock or branch key as text: ``7`` and ``"7"`` are one key. Raises ``InvalidError`` for other types."""
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise InvalidError(f"{kind} {name}: key {key!r}: a key is a str or an int, not {type(key).__name__}")
    text = str(key)
    if not text or len(text) > 256:
        raise InvalidError(f"{kind} {name}: key {text[:40]!r}: a key is 1 to 256 characters")
    return text
