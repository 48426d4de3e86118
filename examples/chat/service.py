"""The chat of the seeds, on one store: chats and messages in SQL, events on a channel, replies and
summaries as jobs, one summary writer per chat under a lock with a fence.

Posting a message saves it, tells the chat's open tabs, and adds the reply job, in one transaction. The
reply worker asks the model, streams its tokens to the tabs as ``token`` events, then saves the reply and
publishes ``{"kind": "message", "id": ...}`` in one transaction (the seed's ``save``). Past a hundred
messages, a summary job writes the chat's summary under ``store.lock("summaries", ttl="30s")`` with the
seed's fenced update.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import unicodedata
from pathlib import Path
from typing import Any

import tinystore

from .model import Model, OfflineModel, Turn

log = logging.getLogger("chat")

MIGRATIONS = Path(__file__).parent / "migrations"
MAX_TEXT = 4000
"""Characters a message may have."""
MAX_TITLE = 200
"""Characters a chat's title may have."""
SUMMARY_AFTER = 100
"""A chat past this many messages gets a summary (again every SUMMARY_EVERY messages)."""
SUMMARY_EVERY = 20
HISTORY = 40
"""Messages of a chat the model sees (the summary stands for the older ones)."""
REPLY_ATTEMPTS = 5
"""Attempts of a reply job: after the last one fails, the tabs are told the model gave up (``gave_up``)."""
BLANK_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf"})
"""Unicode categories of the characters that show nothing: spaces, line and paragraph separators, controls, and
format characters (zero-width space, joiners, BOM, soft hyphen, direction marks); ``str.strip`` keeps the format
characters (trial EB: a message of zero-width spaces was saved, an empty bubble)."""
FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Letters and symbols that show nothing: the Hangul fillers and the blank Braille pattern (trial ED: a message
"\u3164" was saved, and so was one of "\u2800")."""


def _blank(char: str) -> bool:
    return char in FILLERS or unicodedata.category(char) in BLANK_CATEGORIES


def has_text(text: str) -> bool:
    """Whether ``text`` shows something: a character that is not blank (of :data:`BLANK_CATEGORIES`, or one of the
    :data:`FILLERS`). The page (``static/app.js``, ``isBlank``) has the same notion, so that it sends no message the
    server would refuse (trial ED)."""
    return not all(map(_blank, text))


_CONTROLS = frozenset(chr(c) for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F))
"""The control characters a text may not hold (tab, line feed and carriage return it may)."""


def check_text(text: str, what: str) -> None:
    """Raise ``BadInput`` (400) when ``text`` (``what``: "a message's text", "a chat's title") holds a lone
    surrogate, which no database keeps as UTF-8, or a control character other than a tab or a line break (trial HI:
    a NUL was kept and shown; a title's surrogate was refused with the database's words)."""
    if text.isascii():
        if text.isprintable() or not _CONTROLS.intersection(text):
            return
    else:
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate ("\ud83d" in the JSON)
            raise BadInput(f"{what} must be valid Unicode (it has a lone surrogate)") from None
        if not _CONTROLS.intersection(text):
            return
    bad = next(c for c in text if c in _CONTROLS)
    raise BadInput(f"{what} may not hold the control character U+{ord(bad):04X} (tabs and line breaks it may)")


@dataclasses.dataclass
class ChatEvent:
    """What the chat's channel carries, one branch per chat (``events.under(chat_id)``).

    ``kind``: ``"message"`` (message ``id`` was saved: read it), ``"start"`` (an attempt starts streaming the
    reply to message ``id``: what an earlier attempt streamed goes), ``"token"`` (a piece ``text`` of the reply
    to message ``id``, as the model streams it), ``"done"`` (the reply to message ``id`` is complete),
    ``"failed"`` (the model failed answering message ``id``, ``text`` says why; the job retries),
    ``"gave_up"`` (the model could not answer message ``id``, ``text`` says why, and nothing retries: kept in
    ``reply_failures``), ``"summary"`` (chat ``id``'s summary changed).

    A ``"token"`` also says where its text goes: ``at``, the length of the reply before it in UTF-16 code units
    (JavaScript's ``string.length``: an emoji is two, not one as in Python; trial AP); and every
    :data:`SO_FAR_EVERY` tokens (every one at first), ``so_far``, those characters themselves. A tab that joins
    while a reply streams (opened, reloaded, or hearing the stream of another tab) starts from the first
    ``so_far`` it hears instead of the middle of a sentence, and a token heard twice (a replay after a
    reconnect) is told by its ``at``.
    """

    kind: str
    id: int
    text: str = ""
    at: int | None = None
    so_far: str | None = None


def _utf16_length(text: str) -> int:
    """``text.length`` in JavaScript: UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


SO_FAR_ALWAYS = 512
SO_FAR_EVERY = 16
SO_FAR_MAX = 16_384
"""How often a token event carries the whole reply before it (``ChatEvent.so_far``): every token while the reply
is under :data:`SO_FAR_ALWAYS` characters (a joining tab shows it at once), then every 16th (a joining tab waits
about half a second, and a long reply of n tokens sends some n²/32 tokens' worth, not n²/2), and never past
:data:`SO_FAR_MAX` characters: a channel's message is 64 KiB at most (trial BO: a reply of 70,000 characters
failed at its publish, five attempts, and was never saved), and a tab that joins a reply that long shows "…"
until it is saved."""
TOKEN_MAX = 4_096
"""A token longer than this (characters) goes out in pieces of this size, each its own event."""


@dataclasses.dataclass
class Ask:
    """The reply job: answer message ``message_id`` of chat ``chat_id``."""

    chat_id: int
    message_id: int


@dataclasses.dataclass
class Summarize:
    """The summary job of chat ``chat_id``."""

    chat_id: int


class NotFound(Exception):
    pass


class BadInput(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Chat:
    """The chat's data and work on a store. ``await chat.open()`` before anything else."""

    def __init__(self, store: tinystore.Store, model: Model | None = None, *, summary_after: int = SUMMARY_AFTER):
        self.store = store
        self.model: Model = model or OfflineModel()
        self.summary_after = summary_after
        self.workers: list[tinystore.Worker] = []
        self.watcher: asyncio.Task[None] | None = None

    async def open(self) -> Chat:
        store = self.store
        self.db = await store.database("chat", migrations=MIGRATIONS)
        self.events = store.channel("chat-events", ChatEvent)
        self.summaries = store.lock("summaries", ttl="30s")
        self.replies = store.queue(
            "replies",
            Ask,
            database=self.db,
            attempts=REPLY_ATTEMPTS,
            backoff=("2s", "60s"),
            timeout="2m",
            expected="1m",
        )
        self.summary_jobs = store.queue(
            "summaries", Summarize, database=self.db, attempts=3, backoff=("5s", "2m"), timeout="5m"
        )
        return self

    # ------------------------------------------------------------------------------------ workers

    def start_workers(self, replies: int = 4, summaries: int = 2) -> None:
        """Run the reply and summary jobs in this process until :meth:`stop_workers` (or the store closes), and
        tell the tabs of every reply job that ends dead (:meth:`watch_dead_replies`)."""
        self.workers = [self.replies.work(self.reply, concurrency=replies)]
        self.workers.append(self.summary_jobs.work(self.summarize, concurrency=summaries))
        self.watcher = asyncio.create_task(self.watch_dead_replies(), name="chat: dead replies")

    async def stop_workers(self) -> None:
        for w in self.workers:
            await w.stop("5s")
        self.workers = []
        if self.watcher is not None:
            self.watcher.cancel()
            try:
                await self.watcher
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("the watcher of dead replies failed")
            self.watcher = None

    async def watch_dead_replies(self) -> None:
        """Record and tell each reply job that ended dead, until cancelled or the store closes.

        A handler's last attempt that raises tells the tabs itself (:meth:`reply`); this covers the ends it
        cannot: a last attempt cancelled at the queue's ``timeout``, or whose worker was lost (its lease ran
        out). It hears the queue's job events (``tinystore-jobs``, under ``replies``), and goes through the
        dead reply jobs when it starts and after missed events (those that died while nobody listened).
        Recording twice is harmless: a failure already kept, or a reply saved, is left as it is.
        """
        jobs = self.store.channel("tinystore-jobs", tinystore.JobEvent)
        missed = asyncio.Event()
        async with jobs.under("replies").each(recursive=True, on_missed=lambda _: missed.set()) as it:
            await self.sweep_dead_replies()
            async for m in it:
                try:
                    if missed.is_set():
                        missed.clear()
                        await self.sweep_dead_replies()
                    elif m.value.kind == "state" and m.value.state == "dead":
                        job = await self.replies.get(m.value.job_id)
                        if job is not None and job.state == "dead":
                            await self.gave_up(job.value, job.error or "the reply failed")
                except tinystore.TinystoreError as exc:  # the store closing, a full disk: the next event tries again
                    log.warning("could not record dead reply job %s: %s", m.value.job_id, exc)

    async def sweep_dead_replies(self) -> int:
        """:meth:`gave_up` for every dead reply job not yet told; returns how many it told."""
        told, after = 0, None
        while True:
            page = await self.replies.list(state="dead", limit=500, after=after)
            for job in page.jobs:
                told += await self.gave_up(job.value, job.error or "the reply failed")
            if page.next is None:
                return told
            after = page.next

    async def gave_up(self, ask: Ask, reason: str) -> bool:
        """Keep why message ``ask.message_id`` got no reply and tell its chat's tabs (``gave_up``), in one
        transaction; False (and nothing done) when it has a reply or a failure kept already."""
        events, message_id, reason = self.events, ask.message_id, reason[:200]

        async def record(tx: tinystore.SqlTx) -> bool:
            if await tx.scalar("select id from messages where reply_to = ?", message_id) is not None:
                return False
            done = await tx.exec(
                "insert into reply_failures (message_id, reason, at) values (?, ?, ?) on conflict do nothing",
                message_id, reason, time.time_ns() // 1_000_000,
            )  # fmt: skip
            if not done.changes:
                return False
            await tx.with_(events).under(ask.chat_id).publish(ChatEvent(kind="gave_up", id=message_id, text=reason))
            return True

        return await self.db.tx(record)

    # ------------------------------------------------------------------------------------ reads

    async def list_chats(self) -> list[dict[str, Any]]:
        return await self.db.all("select id, title, created_at from chats order by id desc limit 200")

    async def get_chat(self, chat_id: int) -> dict[str, Any]:
        if not 0 < chat_id < 2**63:  # SQLite's rowids: a larger id names no chat (and is no SQL value)
            raise NotFound(f"chat {chat_id} does not exist")
        row = await self.db.one(
            "select id, title, summary, created_at, (select count(*) from messages where chat_id = chats.id)"
            " as messages from chats where id = ?",
            chat_id,
        )
        if row is None:
            raise NotFound(f"chat {chat_id} does not exist")
        return row

    async def messages(self, chat_id: int, after: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        """The messages after ``after``, in order; ``failed``: why the model could not answer it (else None)."""
        return await self.db.all(
            "select m.id, m.chat_id, m.role, m.text, m.created_at, m.reply_to, f.reason as failed"
            " from messages m left join reply_failures f on f.message_id = m.id"
            " where m.chat_id = ? and m.id > ? order by m.id limit ?",
            chat_id,
            after,
            limit,
        )

    async def history(self, chat_id: int, upto: int | None = None) -> list[Turn]:
        """The turns the model sees: the chat's summary (when it has one), then its last messages."""
        rows = await self.db.all(
            "select role, text from (select id, role, text from messages where chat_id = ? and id <= ?"
            " order by id desc limit ?) order by id",
            chat_id,
            upto if upto is not None else 2**62,
            HISTORY,
        )
        turns = [Turn(r["role"], r["text"]) for r in rows]
        summary = await self.db.scalar("select summary from chats where id = ?", chat_id)
        if summary:
            turns.insert(0, Turn("system", f"Summary of the conversation so far: {summary}"))
        return turns

    # ------------------------------------------------------------------------------------ writes

    async def create_chat(self, title: str) -> dict[str, Any]:
        """Make a chat; a title that shows nothing (see :func:`has_text`) gets the default one, as an empty one
        always did (trial ED: a title "\u200b" made an invisible link in the sidebar)."""
        title = title.strip()
        check_text(title, "a chat's title")
        if len(title) > MAX_TITLE:
            raise BadInput(f"a chat's title has at most {MAX_TITLE} characters, this one has {len(title)}", 413)
        title = title if has_text(title) else "New chat"
        done = await self.db.exec(
            "insert into chats (title, created_at) values (?, ?) returning id, title, created_at",
            title,
            time.time_ns() // 1_000_000,
        )
        row = dict(zip(done.columns, done.rows[0], strict=True))
        return row

    async def post(self, chat_id: int, text: str) -> dict[str, Any]:
        """Save a user's message, tell the tabs, and add the reply job: one transaction."""
        message, _ = await self.post_once(chat_id, text, None)
        return message

    async def post_once(self, chat_id: int, text: str, key: str | None) -> tuple[dict[str, Any], bool]:
        """:meth:`post`, once for idempotency key ``key`` in the chat (the page's ``Idempotency-Key``, after the IETF
        draft "The Idempotency-Key HTTP Header Field"): a message the chat already has with that key is returned as
        it is, and nothing is added. Returns the message and whether it was added now. Raises ``BadInput`` (409)
        for a key the chat used for another text."""
        if not isinstance(text, str) or not has_text(text):
            raise BadInput("a message needs some text")
        if len(text) > MAX_TEXT:
            raise BadInput(f"a message has at most {MAX_TEXT} characters, this one has {len(text)}", 413)
        check_text(text, "a message's text")
        if not 0 < chat_id < 2**63:
            raise NotFound(f"chat {chat_id} does not exist")
        events, replies = self.events, self.replies

        async def post(tx: tinystore.SqlTx) -> tuple[dict[str, Any], bool]:
            if await tx.scalar("select id from chats where id = ?", chat_id) is None:
                raise NotFound(f"chat {chat_id} does not exist")
            if key is not None:
                saved = await tx.one(
                    "select id, chat_id, role, text, created_at, reply_to from messages"
                    " where chat_id = ? and idempotency_key = ?",
                    chat_id,
                    key,
                )
                if saved is not None:
                    if saved["text"] != text:
                        raise BadInput("this Idempotency-Key was sent with another message's text", 409)
                    return saved, False
            done = await tx.exec(
                "insert into messages (chat_id, role, text, created_at, idempotency_key) values (?, 'user', ?, ?, ?)"
                " returning id, chat_id, role, text, created_at, reply_to",
                chat_id,
                text,
                time.time_ns() // 1_000_000,
                key,
            )
            message = dict(zip(done.columns, done.rows[0], strict=True))
            await tx.with_(events).under(chat_id).publish(ChatEvent(kind="message", id=message["id"]))
            # one tenant a chat: a chat that posts a hundred messages does not keep the others' replies waiting
            await tx.with_(replies).add(
                Ask(chat_id=chat_id, message_id=message["id"]), key=f"reply/{message['id']}", tenant=f"chat-{chat_id}"
            )
            return message, True

        return await self.db.tx(post)

    # ------------------------------------------------------------------------------------ jobs

    async def reply(self, ask: Ask, run: tinystore.Run) -> dict[str, Any]:
        """The reply job: stream the model's answer to the tabs, then save it and tell them (the seed's save)."""
        db, events, model = self.db, self.events, self.model
        chat_id, message_id = ask.chat_id, ask.message_id
        row = await db.one(
            "select (select id from messages where reply_to = ?1) as saved,"
            " exists (select 1 from reply_failures where message_id = ?1) as failed",
            message_id,
        )
        assert row is not None
        if row["saved"] is not None:  # an earlier attempt saved it: jobs run at least once
            return {"reply": row["saved"]}
        if row["failed"]:  # the job was retried after it gave up: the message waits for its reply again
            await db.exec("delete from reply_failures where message_id = ?", message_id)
        branch = events.under(chat_id)
        pieces: list[str] = []
        # (an attempt after one that streamed part of the reply, then died or timed out: the tabs start over)
        await branch.publish(ChatEvent(kind="start", id=message_id))
        try:
            at = 0
            async for streamed in model.stream(await self.history(chat_id, upto=message_id)):
                for start in range(0, max(len(streamed), 1), TOKEN_MAX):
                    token = streamed[start : start + TOKEN_MAX]
                    share = at < SO_FAR_ALWAYS or len(pieces) % SO_FAR_EVERY == 0
                    so_far = "".join(pieces) if share and at <= SO_FAR_MAX else None
                    pieces.append(token)
                    await branch.publish(ChatEvent(kind="token", id=message_id, text=token, at=at, so_far=so_far))
                    at += _utf16_length(token)
                run.set_progress({"tokens": len(pieces)})
        except Exception as exc:
            # a TinyStore error is the store's (a publish whose connection dropped), not the model's (trial EB: the
            # log blamed the model for the store's dropped connection); but a PermanentError is the model adapter's
            # way to say a 4xx will not fix itself (a wrong key)
            store_error = isinstance(exc, tinystore.TinystoreError) and not isinstance(exc, tinystore.PermanentError)
            if store_error:
                log.warning(
                    "chat %s: could not reach the store while answering message %s: %r", chat_id, message_id, exc
                )
            else:
                log.warning("chat %s: the model failed answering message %s: %r", chat_id, message_id, exc)
            reason = str(exc)[:200]
            last = isinstance(exc, tinystore.PermanentError) or (run is not None and run.attempt >= REPLY_ATTEMPTS)
            if not last:
                await branch.publish(ChatEvent(kind="failed", id=message_id, text=reason))
                raise

            async def give_up(tx: tinystore.SqlTx) -> None:
                await tx.exec(
                    "insert into reply_failures (message_id, reason, at) values (?, ?, ?)"
                    " on conflict (message_id) do update set reason = excluded.reason, at = excluded.at",
                    message_id, reason, time.time_ns() // 1_000_000,
                )  # fmt: skip
                await tx.with_(events).under(chat_id).publish(ChatEvent(kind="gave_up", id=message_id, text=reason))

            await db.tx(give_up)
            raise
        answer = "".join(pieces).strip() or "(no answer)"
        await branch.publish(ChatEvent(kind="done", id=message_id))

        async def save(tx: tinystore.SqlTx) -> None:
            reply = await tx.exec(
                "insert into messages (chat_id, role, text, created_at, reply_to) values (?, 'assistant', ?, ?, ?)",
                chat_id, answer, time.time_ns() // 1_000_000, message_id,
            )  # fmt: skip
            await tx.exec("delete from reply_failures where message_id = ?", message_id)
            await tx.with_(events).under(chat_id).publish(ChatEvent(kind="message", id=reply.last_insert_rowid))

        await db.tx(save)

        count = await db.scalar("select count(*) from messages where chat_id = ?", chat_id)
        if count > self.summary_after:
            window = (count - self.summary_after - 1) // SUMMARY_EVERY
            await self.summary_jobs.add(Summarize(chat_id), key=f"summary/{chat_id}/{window}")
        return {"tokens": len(pieces)}

    async def summarize(self, job: Summarize, run: tinystore.Run) -> None:
        """The summary job: one writer per chat at a time (the lock), a late one harmless (the fence)."""
        chat_id = job.chat_id
        summaries, model, db, history = self.summaries, self.model, self.db, self.history

        # the seed's code, as written ("One summary per chat at a time")
        async with summaries.try_hold(chat_id) as lease:
            if lease is None:
                return  # another worker is writing this chat's summary
            summary = await model.summarize(await history(chat_id))
            fence = f"{lease.fence:040d}"
            await db.exec(
                "update chats set summary = ?, summary_fence = ? where id = ? and summary_fence < ?",
                summary, fence, chat_id, fence,
            )  # fmt: skip

        await self.events.under(chat_id).publish(ChatEvent(kind="summary", id=chat_id))
