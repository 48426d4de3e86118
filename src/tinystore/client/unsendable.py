"""The errors for a request's values that cannot be carried: naming the database and the parameter, or the
statement (a socket's client finds them as it encodes; embedded, SQLite's binding finds a text that is not UTF-8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidError
from ..protocol.messages import encode
from ..protocol.values import valid_text


def surrogate_named(exc: InvalidError, method: str, request: Any) -> InvalidError | None:
    """For the engine's refusal of a text that is not UTF-8 (SQLite's binding does not say which text it was):
    the error naming the parameter or the statement, as a socket's client names it (trial GH); ``None`` for any
    other error, or when no text of the request is at fault."""
    if "lone surrogate" not in exc.message or not isinstance(getattr(request, "params", None), (list, dict)):
        return None
    named = unsendable(method, request, exc)
    return None if named.message.startswith(f"{method}:") else named


def unsendable(method: str, request: Any, exc: BaseException) -> InvalidError:
    """The error for a request that does not encode: naming the database and the parameter, or the statement,
    when it is a SQL statement's (a str with a lone surrogate is not UTF-8, so no client can send it)."""
    params = getattr(request, "params", None)
    db = getattr(request, "db", None)
    if isinstance(params, list) and len(params) == 1 and isinstance(params[0], Mapping):
        params = params[0]  # (named parameters, as the SDK takes them: one mapping)
    if isinstance(params, Mapping) and db:
        # named parameters (trial IE: "parameter 1: dict cannot be sent", or no parameter named at all)
        for k, v in params.items():
            if isinstance(k, str) and not valid_text(k):
                return InvalidError(
                    f"database {db}: the parameter name {k[:40]!r} is not valid Unicode (a lone surrogate): it cannot "
                    "be sent as UTF-8"
                )
            try:
                encode(v)
            except (TypeError, ValueError, OverflowError) as bad:
                return InvalidError(f"database {db}: parameter :{k}: {_why_unsendable(v, bad)}")
    if isinstance(params, list) and db:
        for i, v in enumerate(params):
            try:
                encode(v)
            except (TypeError, ValueError, OverflowError) as bad:
                return InvalidError(f"database {db}: parameter {i + 1}: {_why_unsendable(v, bad)}")
    sql = getattr(request, "sql", None)
    if isinstance(sql, str) and db and not valid_text(sql):
        return InvalidError(
            f"database {db}: the statement {sql[:60]!r} is not valid Unicode (a lone surrogate): it cannot be sent "
            "as UTF-8"
        )
    return InvalidError(f"{method}: a value cannot be sent: {exc}")


def _why_unsendable(value: Any, exc: BaseException) -> str:
    if isinstance(value, str) and not valid_text(value):
        return f"the text {value[:40]!r} is not valid Unicode (a lone surrogate): it cannot be stored as UTF-8"
    return f"{type(value).__name__} cannot be sent: {exc}"
