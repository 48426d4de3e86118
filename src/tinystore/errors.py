"""The errors of TinyStore: one root, each with a stable ``code`` that travels on the wire.

Every message names the thing it is about, e.g. ``lock summaries: key "7": held for all of the wait``.
"""

from __future__ import annotations

from typing import Any


class TinystoreError(Exception):
    """The root of every error TinyStore raises. ``code`` is stable and travels on the wire."""

    code = "internal"

    def __init__(self, message: str = "", **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.code, self.message, self.extra))


class InvalidError(TinystoreError):
    """The call was wrong: a bad name, a value of the wrong type, a bad option."""

    code = "invalid"


class LimitError(TinystoreError):
    """A value or a count went past a limit; ``limit`` is the bound and ``wanted`` what was asked."""

    code = "limit"

    def __init__(self, message: str = "", limit: int | None = None, wanted: int | None = None, **extra: Any):
        super().__init__(message, limit=limit, wanted=wanted, **extra)
        self.limit = limit
        self.wanted = wanted


class InUseError(TinystoreError):
    """Something is held by another: a directory owned by another process, a key held for all of a wait."""

    code = "in_use"


class ConflictError(TinystoreError):
    """The call conflicts with the state it found (an applied migration whose text changed, a constraint)."""

    code = "conflict"


class LostError(TinystoreError):
    """A lease (or a job attempt) ran out or was taken by another: what it guarded is no longer yours."""

    code = "lost"


class ClosedError(TinystoreError):
    """The store, connection, transaction or subscription was closed."""

    code = "closed"


class OutcomeUnknownError(TinystoreError):
    """A write was sent but its answer was lost: it may or may not have taken effect."""

    code = "outcome_unknown"


class UnauthenticatedError(TinystoreError):
    """The server refused the connection: no token, or a wrong one."""

    code = "unauthenticated"


class PermissionDeniedError(TinystoreError):
    """The token's capability does not allow this call."""

    code = "permission_denied"


class UnavailableError(TinystoreError):
    """The store cannot be reached now (it is starting, stopping, or gone)."""

    code = "unavailable"


class CorruptError(TinystoreError):
    """A file failed SQLite's checks or the store's own."""

    code = "corrupt"


class PermanentError(TinystoreError):
    """Raised by a job handler: this job cannot succeed later, so it ends ``dead`` at once, not retried.

    ``reason`` is a str, kept as the job's error (none: the job's error says the handler gave no reason); any
    other type raises ``InvalidError`` instead, which in a handler is a failed attempt like any raise."""

    code = "permanent"

    def __init__(self, reason: str | None = None, **extra: Any) -> None:
        if reason is not None and not isinstance(reason, str):
            shown = repr(reason)
            raise InvalidError(
                f"PermanentError: reason {shown if len(shown) <= 60 else shown[:59] + '…'} is not a str "
                "(say why the job cannot succeed)"
            )
        super().__init__(reason or "", **extra)


class ProtocolError(TinystoreError):
    """A frame broke the wire protocol; the connection that sent it is closed with this reason."""

    code = "protocol"


class TimeoutError_(TinystoreError):
    """A statement ran past ``Limits.statement_timeout``, or a transaction stayed idle past ``tx_idle`` or ran
    past ``tx_max``, and was stopped (rolled back). Its message names the limit. (Beyond API.md's list: a
    subclass of ``TinystoreError``, so code catching that catches this too. Not a subclass of the built-in
    ``TimeoutError``, which is an ``OSError`` and what ``asyncio.timeout`` raises: ``except TimeoutError`` does not
    catch it.)"""

    code = "timeout"


ERRORS: dict[str, type[TinystoreError]] = {
    cls.code: cls
    for cls in (
        TinystoreError,
        InvalidError,
        LimitError,
        InUseError,
        ConflictError,
        LostError,
        ClosedError,
        OutcomeUnknownError,
        UnauthenticatedError,
        PermissionDeniedError,
        UnavailableError,
        CorruptError,
        PermanentError,
        ProtocolError,
        TimeoutError_,
    )
}


def _rebuild(code: str, message: str, extra: dict[str, Any]) -> TinystoreError:
    return error_from(code, message, extra)


def error_from(code: str, message: str, extra: dict[str, Any] | None = None) -> TinystoreError:
    """Build the error of ``code`` (an unknown code gives a plain ``TinystoreError``)."""
    cls = ERRORS.get(code, TinystoreError)
    extra = dict(extra or {})
    if cls is LimitError:
        return LimitError(message, limit=extra.pop("limit", None), wanted=extra.pop("wanted", None), **extra)
    err = cls(message, **extra)
    if cls is TinystoreError and code != "internal":
        err.code = code
    return err
