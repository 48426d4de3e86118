"""Bodies of the locks engine: what it returns and pushes, and the wire messages of its methods.

Two layers:

- :class:`Grant` is what :meth:`tinystore.engines.locks.LocksEngine.acquire` returns in-process: the fence
  as a Python ``int`` (128 bits) and times as float seconds since the Unix epoch. MessagePack cannot carry a
  128-bit int, so a ``Grant`` is never encoded as is: :meth:`Grant.to_wire` gives a :class:`Granted`.
- The wire bodies follow the protocol's rules: times in integer milliseconds (since the Unix epoch for
  instants), the fence as a decimal string (``Granted.fence``), "never" as ``None``.

Methods (request body → reply body):

- ``locks.acquire``: :class:`Acquire` → :class:`Granted`, or :class:`NotGranted` for a try that found the key
  held. A hold whose wait ran out is an ``in_use`` error.
- ``locks.renew``: :class:`Renew` → :class:`Renewed`; a ``lost`` error when the lease is gone.
- ``locks.release``: :class:`Release` → :class:`Released`.
- ``locks.release_many``: :class:`ReleaseMany` → a list of bools, one per lease in order (``released``).
- ``locks.acquire_many``: :class:`AcquireMany` → a list of :class:`AcquireOutcome`, one per item in order:
  granted, held (a try), an error, or ``queued``: the item is in the key's line from that moment and its
  outcome comes later as a ``locks.settled`` push (an :class:`AcquireOutcome` with the item's ticket).
- ``locks.abandon``: :class:`Abandon` → ``None``: items whose caller gave up without hearing their outcome:
  a queued one leaves its line, a granted one's lease is let go.
- push ``locks.settled``: :class:`AcquireOutcome` of a queued item (granted, or an error such as ``in_use``).

The SDK sends the acquires and releases of one loop turn in one ``*_many`` call when others are in flight,
so that many callers cost one frame each way rather than one per caller.
- push ``locks.lost``: :class:`Lost`, to the peer that last renewed (or acquired) a lease that ran out.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

ACQUIRE = "locks.acquire"
RENEW = "locks.renew"
RELEASE = "locks.release"
RELEASE_MANY = "locks.release_many"
ACQUIRE_MANY = "locks.acquire_many"
ABANDON = "locks.abandon"
SETTLED = "locks.settled"
"""The method name of the push that settles a queued item of ``locks.acquire_many``."""
LOST = "locks.lost"
"""The method name of the push a holder gets when its lease ends without its release."""

EXPIRED = "expired"
"""``Lost.reason``: no renewal came within the ttl (LOCK-05)."""
MAX_HOLD = "max_hold"
"""``Lost.reason``: the lease reached ``max_hold`` from its grant (LOCK-06)."""


def to_ms(when: float | None) -> int | None:
    """Seconds (float, may be ``inf``) → integer ms, rounded down; ``None`` or ``inf`` → ``None``."""
    if when is None or math.isinf(when):
        return None
    return math.floor(when * 1000)


def from_ms(ms: int | None) -> float:
    """Integer milliseconds → float seconds; ``None`` (never) → ``inf``."""
    return math.inf if ms is None else ms / 1000


class Grant(msgspec.Struct, kw_only=True, frozen=True):
    """A lease the locks engine gave (in-process; see :meth:`to_wire` for the wire form).

    - ``lease``: the lease id, an int in 1 .. 2**63-1, random and unique within a server run (and not
      guessable), so an id from before a restart is unknown to the new run. Renew and release name it.
    - ``fence``: ``epoch << 64 | counter``, 128 bits; larger than every fence given before (LOCK-02).
    - ``expires_at``: seconds since the Unix epoch when the lease runs out unless renewed; ``inf`` for a lease
      of the store's own process (``peer.local``) without ``max_hold``.
    - ``max_hold_at``: seconds since the Unix epoch past which no renewal keeps it, or ``None``.
    - ``ttl``: seconds a renewal extends it by (a non-local holder renews every ``ttl / 3``).
    """

    lease: int
    fence: int
    expires_at: float
    max_hold_at: float | None
    ttl: float

    def to_wire(self) -> Granted:
        """This grant as the reply body of ``locks.acquire``."""
        return Granted(
            lease=self.lease,
            fence=str(self.fence),
            expires_at_ms=to_ms(self.expires_at),
            max_hold_at_ms=to_ms(self.max_hold_at),
            ttl_ms=round(self.ttl * 1000),
        )


class Acquire(msgspec.Struct, kw_only=True):
    """``locks.acquire``: a lease on ``key`` of ``lock``.

    ``limit``: 1 for a lock, the number of permits for a semaphore. ``ttl_ms``: the lease's ttl.
    ``max_hold_ms``: no lease lasts longer than this from its grant (``None``: no bound). ``wait_ms``:
    ``None`` for a try (answered at once with :class:`NotGranted` when held); else wait in line at most
    this long, then an ``in_use`` error (0: now or never).
    """

    lock: str
    key: str
    ttl_ms: int
    limit: int = 1
    max_hold_ms: int | None = None
    wait_ms: int | None = None


class Granted(msgspec.Struct, kw_only=True):
    """Reply of ``locks.acquire``: the lease as in :class:`Grant`, times in ms, the fence as decimal text."""

    lease: int
    fence: str
    expires_at_ms: int | None
    max_hold_at_ms: int | None
    ttl_ms: int

    def to_grant(self) -> Grant:
        """Back to a :class:`Grant` (fence as int, times as float seconds, never as ``inf``)."""
        return Grant(
            lease=self.lease,
            fence=int(self.fence),
            expires_at=from_ms(self.expires_at_ms),
            max_hold_at=None if self.max_hold_at_ms is None else self.max_hold_at_ms / 1000,
            ttl=self.ttl_ms / 1000,
        )


class NotGranted(msgspec.Struct, kw_only=True):
    """Reply of a try (``wait_ms`` ``None``) that found the key held by ``limit`` live leases."""

    held: bool = True


class Renew(msgspec.Struct, kw_only=True):
    """``locks.renew``: extend lease ``lease`` by its ttl from now. Any connection may renew by id."""

    lease: int


class Renewed(msgspec.Struct, kw_only=True):
    """Reply of ``locks.renew``: the new deadline in ms since the Unix epoch (``None``: never by ttl)."""

    expires_at_ms: int | None


class Release(msgspec.Struct, kw_only=True):
    """``locks.release``: let go of lease ``lease``. Any connection may release by id."""

    lease: int


class Released(msgspec.Struct, kw_only=True):
    """Reply of ``locks.release``: ``released`` is false when the lease was gone (ran out, or unknown)."""

    released: bool


ACQUIRE_MANY_MAX = 1_000
"""Items of one ``locks.acquire_many`` (the SDK sends at most this many a call): refused past it as the body is
read (trial DI: 250,000 in one frame kept the server's loop, and every other client, waiting near 3 s)."""
RELEASE_MANY_MAX = 10_000
"""Leases of one ``locks.release_many``, tickets of one ``locks.abandon`` (the SDK sends at most this many a call;
trial DI: 15 million released in one frame kept the loop 1.6 s)."""


class ReleaseMany(msgspec.Struct, kw_only=True):
    """``locks.release_many``: let go of each lease of ``leases`` in order, as :class:`Release` does; at most
    :data:`RELEASE_MANY_MAX`."""

    leases: Annotated[list[int], msgspec.Meta(max_length=RELEASE_MANY_MAX)]


class AcquireMany(msgspec.Struct, kw_only=True):
    """``locks.acquire_many``: the :class:`Acquire` items in order, each with a ticket the client chose (unique
    on its connection) that names it in the reply, in ``locks.settled`` and in ``locks.abandon``; at most
    :data:`ACQUIRE_MANY_MAX`."""

    items: Annotated[list[Acquire], msgspec.Meta(max_length=ACQUIRE_MANY_MAX)]
    tickets: Annotated[list[int], msgspec.Meta(max_length=ACQUIRE_MANY_MAX)]


class AcquireOutcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What became of one acquire. Exactly one of: a grant (``lease`` set, the fields of :class:`Granted`),
    ``held`` (a try that found the key held), ``queued`` (in line; settled later by a push), or an error
    (``code`` and ``message`` as in an error frame). The SDK also reads :class:`Granted` and
    :class:`NotGranted` replies with it."""

    ticket: int = 0
    lease: int = 0
    fence: str = ""
    expires_at_ms: int | None = None
    max_hold_at_ms: int | None = None
    ttl_ms: int = 0
    held: bool = False
    queued: bool = False
    code: str = ""
    message: str = ""
    waited_ms: float = -1.0  # (-1: not said, by a server of an earlier version)

    @classmethod
    def of(cls, grant: Grant, ticket: int, waited: float = 0.0) -> AcquireOutcome:
        """The outcome of a grant; ``waited``: seconds it waited in line at the store, from the store reading
        the ask to the grant (the SDK's lease starts no later than its ask's sending plus that: a grant pushed
        late, its ttl already running at the store, is not taken for a fresh one)."""
        return cls(
            ticket=ticket,
            lease=grant.lease,
            fence=str(grant.fence),
            expires_at_ms=to_ms(grant.expires_at),
            max_hold_at_ms=to_ms(grant.max_hold_at),
            ttl_ms=round(grant.ttl * 1000),
            waited_ms=round(waited * 1000, 3),
        )


class Abandon(msgspec.Struct, kw_only=True):
    """``locks.abandon``: the items of these tickets, whose outcome the client never heard: a queued one leaves
    its line; a granted one's lease is let go (by its id: nothing if it was let go already). Unknown tickets:
    nothing. At most :data:`RELEASE_MANY_MAX`."""

    tickets: Annotated[list[int], msgspec.Meta(max_length=RELEASE_MANY_MAX)]


class Lost(msgspec.Struct, kw_only=True):
    """Push ``locks.lost``: lease ``lease`` on ``key`` of ``lock`` ended without a release.

    ``reason`` is :data:`EXPIRED` or :data:`MAX_HOLD` (read unknown reasons as lost all the same).
    ``at_ms``: when it ended, ms since the Unix epoch. ``message``: the text of the ``LostError`` to raise,
    e.g. ``lock summaries: key "7": the lease ran out at 2030-01-01T00:00:10.000+00:00``.
    """

    lease: int
    reason: str
    lock: str = ""
    key: str = ""
    at_ms: int = 0
    message: str = ""
