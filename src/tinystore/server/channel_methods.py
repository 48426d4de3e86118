"""Channel methods: ``channels.publish``, ``channels.publish_many``, ``channels.subscribe``, ``channels.grant``,
``channels.grant_many``, ``channels.unsubscribe``; deliveries go out as ``channels.deliver`` pushes (see
:mod:`tinystore.protocol.channels`).

The engine (:class:`~tinystore.engines.channels.ChannelsEngine`) is created here as ``core.channels``. A
session's subscriptions end when the session closes (its connection went away, or the embedded store closed),
so a subscriber that vanishes holds nothing in the store; while a connection's client does not read (the
listener says its session is full), its deliveries wait in the engine as positions, not as bytes (CHAN-08). A
publish that names a SQL transaction of the same session (``Publish.tx``) is checked at once and handed to the
engine only after that transaction commits, in the order published; a rollback (or a transaction that times
out or loses its connection) drops it (CHAN-03).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from ..engines.channels import Branch, ChannelsEngine
from ..engines.sql import SqlTx
from ..errors import ClosedError, InvalidError, LimitError
from ..protocol.channels import (
    FLOAT32,
    FLOAT64,
    GRANT,
    GRANT_MANY,
    PUBLISH,
    PUBLISH_MANY,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Grant,
    GrantMany,
    Publish,
    Published,
    PublishMany,
    Subscribe,
    Subscribed,
    Unsubscribe,
    non_finite,
    non_finite_error,
)
from ..protocol.jobs import check_client_publish

if TYPE_CHECKING:
    from .core import Core, Session

log = logging.getLogger("tinystore.channels")


class _Committed:
    """Messages of committed transactions, not yet published: they go to the engine on a later loop turn than
    their commit's, so the commit's answer is written before the deliveries its messages cause (nobody hears a
    message before its transaction's commit returned), or at once before any other publish, so that they keep
    their place: a publish made once ``db.tx`` returned comes after the transaction's own (CHAN-01; trial Z: an
    embedded store's caller resumed and published before that later turn, and its message got the lower seq).
    Each transaction's messages are published all or nothing, in the order of the commits."""

    __slots__ = ("batches", "engine", "handle")

    def __init__(self, engine: ChannelsEngine) -> None:
        self.engine = engine
        self.batches: list[list[tuple[str, Branch, bytes]]] = []
        self.handle: asyncio.Handle | None = None

    def add(self, items: list[tuple[str, Branch, bytes]]) -> None:
        self.batches.append(items)
        if self.handle is None:
            self.handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Publish what is waiting, now (a no-op when nothing is)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        batches, self.batches = self.batches, []
        for items in batches:
            try:
                self.engine.publish_many(items)
            except ClosedError:
                return  # the store stopped between the commit and now
            except Exception:
                log.exception("channels: publishing the messages of a committed transaction failed")


#: what a message held for an open transaction costs besides its payload and its channel's name, in bytes
TX_MESSAGE_COST = 64


class _TxPublishes:
    """The messages one SQL transaction published, handed to :class:`_Committed` after its commit (an
    after_commit hook), or dropped when it ends otherwise (an on_end hook). Until then the engine counts them
    (``reserve``) within ``channel_total_bytes`` (CHAN-08: held without bound, one
    transaction's made the server grow by a gigabyte in seconds, trial BB)."""

    __slots__ = ("committed", "items", "nbytes")

    def __init__(self, committed: _Committed) -> None:
        self.committed = committed
        self.items: list[tuple[str, Branch, bytes]] = []
        self.nbytes = 0

    def add(self, channel: str, branch: Branch, payload: bytes, limit: int) -> None:
        """Hold one message until the commit. Raises ``LimitError`` when the messages held for open transactions
        would pass ``limit`` bytes (nothing is kept then)."""
        cost = len(payload) + len(channel) + TX_MESSAGE_COST
        engine = self.committed.engine
        held = engine.reserved
        if held + cost > limit:
            raise LimitError(
                f"channel {channel}: the messages that open transactions published, held until they commit, would "
                f"take more than channel_total_bytes ({limit} bytes; {held} held now, of which {self.nbytes} by this "
                "transaction): commit sooner, or publish after the commit",
                limit=limit,
                wanted=held + cost,
            )
        self.items.append((channel, branch, payload))
        self.nbytes += cost
        engine.reserve(cost)  # (the logs make room: all of channels within the bound)

    def __call__(self) -> None:
        if self.items:
            items, self.items = self.items, []
            self.release()
            self.committed.add(items)

    def ended(self, tx: SqlTx) -> None:
        """The transaction ended: what it published is dropped unless it committed (then ``__call__`` publishes it,
        maybe after this)."""
        if not tx.committed:
            self.release()

    def release(self) -> None:
        """Give the room of the messages held back (they were published, or the transaction ended without)."""
        self.committed.engine.release(self.nbytes)
        self.nbytes = 0
        self.items = []


_SHAPE = msgspec.msgpack.Decoder(msgspec.Raw)  # walks a MessagePack value without building it (about 0.2 µs)


def check_finite(p: Publish) -> None:
    """Refuse a payload that is not one whole MessagePack value (a client speaking the protocol by hand: every
    subscriber would get a decode error instead of the message), or that holds a NaN or an infinity, as SQL
    and jobs refuse them: JSON has none. ``InvalidError`` naming the channel and the branch. Cheap for a
    payload without a float marker (no decoding)."""
    payload = p.payload
    try:
        _SHAPE.decode(payload)
    except msgspec.DecodeError as exc:
        raise InvalidError(
            f"channel {p.channel}: branch {list(p.branch)!r}: the payload is not one MessagePack value ({exc})"
        ) from None
    if FLOAT64 in payload or FLOAT32 in payload:
        problem = non_finite(payload)
        if problem is not None:
            raise InvalidError(non_finite_error(p.channel, p.branch, problem))


def install(core: Core) -> None:
    from .core import Method

    engine = ChannelsEngine(core.clock, core.limits, core.epoch)
    core.channels = engine  # type: ignore[attr-defined]
    core.engines["channels"] = engine
    sql = core.sql
    committed = _Committed(engine)
    total_bytes = core.limits.channel_total_bytes

    def publish(session: Session, req: Publish) -> Published | None:
        """Raises ``InvalidError`` (a bad name or branch, a value holding a NaN or an infinity, the channel
        ``tinystore-jobs``, a read-only transaction), ``LimitError`` (over ``channel_message_bytes``; in a
        transaction, the messages open transactions hold past ``channel_total_bytes``),
        ``ClosedError`` (the transaction is not open)."""
        check_client_publish(req.channel)  # tinystore-jobs is the store's own: job events cannot be spoofed
        if not session.local:  # the SDK checked the values of this process already
            check_finite(req)
        branch = tuple(req.branch)
        if not req.tx:
            if committed.batches:
                committed.flush()
            return engine.publish(req.channel, branch, req.payload)
        tx = sql.transactions.get(req.tx)
        if tx is None or req.tx not in session.transactions or tx.done:
            raise sql.not_open(req.tx, f"channel {req.channel}: ")
        if tx.read_only:
            raise InvalidError(f"channel {req.channel}: a read-only transaction cannot publish")
        # check now (name, branch, size) so the error surfaces at publish; nothing is kept when it raises
        engine.check(req.channel, branch, req.payload)
        hook = next((h for h in tx.after_commit if isinstance(h, _TxPublishes)), None)
        if hook is None:
            hook = _TxPublishes(committed)
            tx.after_commit.append(hook)
            tx.on_end.append(partial(hook.ended, tx))
        hook.add(req.channel, branch, req.payload, total_bytes)
        return None

    def publish_many(session: Session, req: PublishMany) -> list[Published]:
        """All or nothing: errors as :func:`publish`, and none is published when one item is refused."""
        for p in req.items:
            check_client_publish(p.channel)
            if not session.local:
                check_finite(p)
        if committed.batches:
            committed.flush()
        return engine.publish_many([(p.channel, tuple(p.branch), p.payload) for p in req.items])

    def subscribe(session: Session, req: Subscribe) -> Subscribed:
        after: str | Mapping[Branch, str] | None = req.after
        if req.after_branches or (req.resume and req.recursive):
            mapping = {tuple(a.branch): a.id for a in req.after_branches}
            if req.after is not None:
                mapping[tuple(req.branch)] = req.after
            after = mapping
        return engine.subscribe(
            session,
            req.channel,
            tuple(req.branch),
            recursive=req.recursive,
            after=after,
            credit=req.credit,
            since=req.since,
        )

    def grant(session: Session, req: Grant) -> None:
        engine.grant(session, req.sub, req.n)

    def grant_many(session: Session, req: GrantMany) -> None:
        engine.grant_many(session, [(g.sub, g.n) for g in req.items])

    def unsubscribe(session: Session, req: Unsubscribe) -> bool:
        return engine.unsubscribe(session, req.sub)

    async def stop() -> None:
        committed.flush()
        engine.close()

    core.session_close_hooks.append(engine.drop_peer)
    core.session_full_hooks.append(engine.peer_full)

    def status() -> dict[str, object]:
        """The engine's counts, and ``tx_bytes``: what open transactions published, held until they end."""
        return {**engine.status(), "tx_bytes": engine.reserved}

    core.status_hooks["channels"] = status
    core.stop_hooks.append(stop)
    core.register(Method(PUBLISH, Publish, publish, write=True))
    core.register(Method(PUBLISH_MANY, PublishMany, publish_many, write=True))
    core.register(Method(SUBSCRIBE, Subscribe, subscribe))
    core.register(Method(GRANT, Grant, grant))
    core.register(Method(GRANT_MANY, GrantMany, grant_many))
    core.register(Method(UNSUBSCRIBE, Unsubscribe, unsubscribe))
